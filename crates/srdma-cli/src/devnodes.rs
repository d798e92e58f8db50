//! `/dev/infiniband/uverbsN` nodes for the program `srdma exec` runs.
//!
//! Some verbs users look for the kernel's device node before they use a device: UCX opens an
//! IB device only if `/dev/infiniband/<ibv_device.dev_name>` is a character device the process
//! may read and write (`uct_ib_device_is_accessible`). srdma has no kernel driver, so unless
//! such nodes exist, `srdma exec` gives the program a private view of `/dev`:
//!
//! - it enters a new mount namespace (`unshare(CLONE_NEWNS)`; without the privilege for that,
//!   a new user namespace as well, mapping the caller's own uid and gid, where the kernel
//!   allows unprivileged user namespaces), with mount events kept from the host (`MS_SLAVE`);
//! - it mounts a tmpfs over `/dev` (over `/dev/infiniband` when that exists), bind-mounts every
//!   entry of the original directory back into it, and adds `infiniband/uverbs0..` as files
//!   with `/dev/null` bind-mounted on them (a character device anyone may read and write;
//!   `mknod` is not allowed in a user namespace). The library never opens them.
//!
//! The view of `/dev` is fixed at start: nodes that appear later at its top level (a device
//! plugged in meanwhile) stay hidden from the program; the contents of its subdirectories
//! (`/dev/shm`, `/dev/pts`, ...) are the host's own.
//!
//! Nothing changes outside the program's namespace. When a step fails the view is rolled back,
//! a note goes to stderr, and the program runs without the nodes. `SRDMA_DEV_NODES=0` skips
//! all of this.
//!
//! Where namespaces are not allowed (a container without the privilege or the seccomp
//! permission), root can make the nodes once for all programs: `srdma setup-dev` creates
//! `/dev/infiniband/uverbsN` as nodes of `/dev/null`'s device (1:3, mode 0666) where none
//! exist, and `srdma setup-dev --remove` removes the ones it made.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
use std::path::{Path, PathBuf};

/// Nodes made when fewer devices are configured: a program may be handed a longer
/// `SRDMA_DEVICES` later (`mpirun -x`), and spare nodes are harmless.
const MIN_NODES: usize = 8;

/// How many `uverbsN` nodes the program may look for: one per device it can see.
pub(crate) fn node_count(device_arg: Option<&str>) -> usize {
    let listed = device_arg
        .map(str::to_string)
        .or_else(|| std::env::var("SRDMA_DEVICES").ok())
        .filter(|v| !v.trim().is_empty())
        .or_else(|| {
            let path =
                std::env::var("SRDMA_CONFIG").unwrap_or_else(|_| "/etc/srdma/devices.conf".into());
            std::fs::read_to_string(path).ok()
        })
        .map(|t| {
            t.lines()
                .map(|l| l.split('#').next().unwrap_or(""))
                .flat_map(|l| l.split(|c: char| c == ',' || c.is_whitespace()))
                .filter(|e| !e.is_empty())
                .count()
        })
        .unwrap_or(0);
    let local = srdma::netdev::local_devices().map_or(0, |d| d.len());
    listed.max(local).max(MIN_NODES)
}

/// Whether `path` is a character device this process may read and write (UCX's test).
fn accessible_chardev(path: &Path) -> bool {
    let Ok(m) = std::fs::metadata(path) else {
        return false;
    };
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    m.file_type().is_char_device()
        && unsafe { libc::access(c.as_ptr(), libc::R_OK | libc::W_OK) } == 0
}

/// Makes `/dev/infiniband/uverbs0..count` visible to this process and the program it will
/// exec (see the module documentation). Must run while the process has one thread.
/// `Ok(false)`: nothing was needed (the nodes exist) or it was switched off.
pub(crate) fn provide(count: usize) -> Result<bool, String> {
    if std::env::var_os("SRDMA_DEV_NODES").is_some_and(|v| v == "0") {
        return Ok(false);
    }
    let ib = Path::new("/dev/infiniband");
    if (0..count).all(|i| accessible_chardev(&ib.join(format!("uverbs{i}")))) {
        return Ok(false);
    }
    private_mounts()?;
    // The node bound on every uverbsN, reached through this descriptor once /dev is covered.
    let null = File::open("/dev/null").map_err(|e| format!("/dev/null: {e}"))?;
    let null_path = PathBuf::from(format!("/proc/self/fd/{}", null.as_raw_fd()));
    let (target, sub) = if ib.is_dir() {
        (ib.to_path_buf(), None)
    } else {
        (PathBuf::from("/dev"), Some(OsStr::new("infiniband")))
    };
    cover(&target, "mode=755,size=1m", |target| {
        let dir = match sub {
            Some(s) => {
                let d = target.join(s);
                mkdir(&d)?;
                d
            }
            None => target.to_path_buf(),
        };
        for i in 0..count {
            let node = dir.join(format!("uverbs{i}"));
            if node.symlink_metadata().is_ok() {
                continue; // A real node of the same name, bound back.
            }
            File::create(&node)
                .map(drop)
                .and_then(|()| {
                    mount(
                        Some(null_path.as_os_str()),
                        &node,
                        None,
                        libc::MS_BIND,
                        None,
                    )
                })
                .map_err(|e| format!("cannot make {}: {e}", node.display()))?;
        }
        Ok(())
    })?;
    Ok(true)
}

/// Creates directory `d` (mode 0755).
pub(crate) fn mkdir(d: &Path) -> Result<(), String> {
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(d)
        .map_err(|e| format!("cannot create {}: {e}", d.display()))
}

/// Enters a private mount namespace for this process and the program it will exec (once;
/// later calls do nothing), with mount events kept from the host. Must run while the
/// process has one thread.
pub(crate) fn private_mounts() -> Result<(), String> {
    use std::sync::atomic::{AtomicBool, Ordering};
    static DONE: AtomicBool = AtomicBool::new(false);
    if DONE.load(Ordering::Relaxed) {
        return Ok(());
    }
    enter_namespace()?;
    // Keep what is mounted below from reaching the host (a shared `/` would carry it there),
    // while still seeing the host's later mounts.
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_SLAVE,
        None,
    )
    .map_err(|e| format!("cannot make the mounts private: {e}"))?;
    DONE.store(true, Ordering::Relaxed);
    Ok(())
}

/// Covers the directory `target` with a tmpfs (mount options `opts`) holding its original
/// entries (directories and files bound back, symbolic links copied), then lets `populate`
/// add to it. Inside [`private_mounts`] only. When a step fails, the original directory is
/// put back in view: the program must not see a half-made one.
pub(crate) fn cover(
    target: &Path,
    opts: &str,
    populate: impl FnOnce(&Path) -> Result<(), String>,
) -> Result<(), String> {
    let entries = std::fs::read_dir(target)
        .and_then(|it| {
            it.map(|e| {
                let e = e?;
                Ok((e.file_name(), e.file_type()?))
            })
            .collect::<io::Result<Vec<_>>>()
        })
        .map_err(|e| format!("cannot list {}: {e}", target.display()))?;
    let old = File::open(target).map_err(|e| format!("{}: {e}", target.display()))?;
    let old_dir = PathBuf::from(format!("/proc/self/fd/{}", old.as_raw_fd()));
    mount(
        Some(OsStr::new("tmpfs")),
        target,
        Some("tmpfs"),
        libc::MS_NOSUID,
        Some(opts),
    )
    .map_err(|e| format!("cannot mount a tmpfs on {}: {e}", target.display()))?;
    let filled = bind_back(target, &old_dir, &entries).and_then(|()| populate(target));
    if let Err(e) = filled {
        let c = CString::new(target.as_os_str().as_bytes()).unwrap_or_default();
        // SAFETY: `c` is a NUL-terminated path; detaching our own tmpfs has no other effect.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        return Err(e);
    }
    Ok(())
}

/// Puts the original `entries` (read through `old_dir`) into the fresh tmpfs at `target`.
fn bind_back(
    target: &Path,
    old_dir: &Path,
    entries: &[(OsString, std::fs::FileType)],
) -> Result<(), String> {
    let mut dirs = std::fs::DirBuilder::new();
    dirs.mode(0o755);
    for (name, ty) in entries {
        let dst = target.join(name);
        let src = old_dir.join(name);
        let r = if ty.is_symlink() {
            std::fs::read_link(&src).and_then(|l| std::os::unix::fs::symlink(l, &dst))
        } else {
            if ty.is_dir() {
                dirs.create(&dst)
            } else {
                File::create(&dst).map(drop)
            }
            .and_then(|()| {
                mount(
                    Some(src.as_os_str()),
                    &dst,
                    None,
                    libc::MS_BIND | libc::MS_REC,
                    None,
                )
            })
        };
        r.map_err(|e| {
            format!(
                "cannot bind {} into the new view: {e}",
                target.join(name).display()
            )
        })?;
    }
    Ok(())
}

/// Enters a new mount namespace, inside a new user namespace when that is the only way.
fn enter_namespace() -> Result<(), String> {
    // SAFETY: unshare has no memory-safety preconditions; the process is single-threaded.
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } == 0 {
        return Ok(());
    }
    let direct = io::Error::last_os_error();
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    // SAFETY: as above; CLONE_NEWUSER needs a single-threaded caller, which this is.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) } != 0 {
        let e = io::Error::last_os_error();
        return Err(format!(
            "cannot enter a private mount namespace ({direct}) nor a user namespace ({e}; \
             unprivileged user namespaces may be disabled, e.g. kernel.unprivileged_userns_clone \
             or a container's seccomp profile)"
        ));
    }
    let write = |f: &str, s: String| {
        std::fs::write(f, s).map_err(|e| format!("cannot write {f} in the new user namespace: {e}"))
    };
    write("/proc/self/setgroups", "deny".into())?;
    write("/proc/self/uid_map", format!("{uid} {uid} 1\n"))?;
    write("/proc/self/gid_map", format!("{gid} {gid} 1\n"))?;
    Ok(())
}

/// mount(2).
fn mount(
    src: Option<&OsStr>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let c = |b: &[u8]| CString::new(b).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput));
    let src = src.map(|s| c(s.as_bytes())).transpose()?;
    let target = c(target.as_os_str().as_bytes())?;
    let fstype = fstype.map(|s| c(s.as_bytes())).transpose()?;
    let data = data.map(|s| c(s.as_bytes())).transpose()?;
    let p = |o: &Option<CString>| o.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: every pointer is NULL or a NUL-terminated string alive for the call.
    let r = unsafe {
        libc::mount(
            p(&src),
            target.as_ptr(),
            p(&fstype),
            flags,
            p(&data).cast::<libc::c_void>(),
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Options of `srdma setup-dev`.
#[derive(Debug, clap::Args)]
pub struct SetupArgs {
    /// How many nodes (default: one per device srdma sees, at least 8).
    #[arg(long)]
    pub count: Option<usize>,
    /// Remove the nodes `setup-dev` made (character devices 1:3 named uverbsN) instead.
    #[arg(long)]
    pub remove: bool,
}

/// The device number of `/dev/null` (1:3), the node behind every uverbsN we make.
fn null_rdev() -> libc::dev_t {
    libc::makedev(1, 3)
}

/// Runs `srdma setup-dev`: makes (or removes) persistent nodes in `/dev/infiniband`.
pub fn setup(args: &SetupArgs, out: &mut impl std::io::Write) -> anyhow::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let ib = Path::new("/dev/infiniband");
    let count = args.count.unwrap_or_else(|| node_count(None));
    let is_ours = |p: &Path| {
        std::fs::symlink_metadata(p)
            .is_ok_and(|m| m.file_type().is_char_device() && m.rdev() == null_rdev())
    };
    if args.remove {
        let Ok(dir) = std::fs::read_dir(ib) else {
            return Ok(true);
        };
        for e in dir.flatten() {
            let p = e.path();
            if e.file_name().to_string_lossy().starts_with("uverbs") && is_ours(&p) {
                std::fs::remove_file(&p)
                    .map_err(|e| anyhow::anyhow!("cannot remove {}: {e}", p.display()))?;
                writeln!(out, "removed {}", p.display())?;
            }
        }
        // Only if empty: a real driver's nodes stay.
        let _ = std::fs::remove_dir(ib);
        return Ok(true);
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(ib)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", ib.display()))?;
    for i in 0..count {
        let node = ib.join(format!("uverbs{i}"));
        if node.symlink_metadata().is_ok() {
            writeln!(out, "{} exists, left as it is", node.display())?;
            continue;
        }
        let c = CString::new(node.as_os_str().as_bytes())?;
        // SAFETY: `c` is a NUL-terminated path alive for the call.
        if unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, null_rdev()) } != 0 {
            let e = io::Error::last_os_error();
            anyhow::bail!("cannot make {} (as root?): {e}", node.display());
        }
        // mknod's mode is masked by the umask: set it as meant.
        std::fs::set_permissions(&node, std::os::unix::fs::PermissionsExt::from_mode(0o666))?;
        writeln!(
            out,
            "made {} (character device 1:3, as /dev/null)",
            node.display()
        )?;
    }
    Ok(true)
}
