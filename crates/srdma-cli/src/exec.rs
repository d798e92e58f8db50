//! `srdma exec PROGRAM [ARGS...]`: runs an unmodified verbs program on srdma.
//!
//! It puts srdma's drop-in `libibverbs.so.1` and `librdmacm.so.1` (one file, crate
//! `srdma-verbs`) first on the loader's
//! path and replaces itself with the program. The library is found as `$SRDMA_LIB` (the file
//! or its directory), else next to this executable (`libibverbs.so`, where cargo builds it),
//! else in `../lib/srdma/` beside it (an installed layout). `--device` sets `SRDMA_DEVICES`,
//! the devices the program sees (see the srdma-verbs crate). Unless they exist, the program
//! also gets `/dev/infiniband/uverbsN` nodes in a private mount namespace (see
//! [`crate::devnodes`]; `SRDMA_DEV_NODES=0` skips that), and in the same namespace
//! kernel-like `/sys/class/infiniband` entries for srdma's devices (see [`crate::sysfs`];
//! `SRDMA_SYSFS=0` skips those).
//!
//! With `--rsockets` the program's TCP sockets run on srdma's rsockets: `srdma exec` adds
//! `libsrdma_rspreload.so` (crate srdma-rspreload, found as `$SRDMA_RSPRELOAD`, else beside
//! the drop-in library) to `LD_PRELOAD` and names the drop-in library in
//! `SRDMA_RSPRELOAD_LIB`, where the preload library finds the sockets (srdma-verbs'
//! `preload` module says what it covers).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use crate::{UsageError, devnodes, sysfs};

/// Options of `srdma exec`.
#[derive(Debug, clap::Args)]
#[command(trailing_var_arg = true)]
pub struct Args {
    /// The devices the program sees, as `[NAME=]ADDRESS[:PORT]`, comma-separated (sets
    /// SRDMA_DEVICES; default: one per local interface address, loopback ones only when no
    /// other interface has one).
    #[arg(long, value_name = "LIST")]
    pub device: Option<String>,
    /// Put the program's TCP sockets on rsockets over srdma (preloads
    /// libsrdma_rspreload.so): unmodified socket programs (redis, iperf3, sockperf) talk
    /// RDMA to each other, and the kernel's TCP to every other peer.
    #[arg(long)]
    pub rsockets: bool,
    /// The program and its arguments.
    #[arg(
        required = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM [ARGS]..."
    )]
    pub command: Vec<OsString>,
}

/// The drop-in library file, if it can be found.
pub(crate) fn find_library() -> Option<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(v) = std::env::var_os("SRDMA_LIB").filter(|v| !v.is_empty()) {
        let p = PathBuf::from(v);
        if p.is_dir() {
            candidates.push(p.join("libibverbs.so.1"));
            candidates.push(p.join("libibverbs.so"));
        } else {
            candidates.push(p);
        }
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        candidates.push(dir.join("libibverbs.so"));
        // `cargo test` runs binaries from target/<profile>/deps' parent, so this is the same.
        candidates.push(dir.join("../libibverbs.so"));
        candidates.push(dir.join("../lib/srdma/libibverbs.so.1"));
    }
    candidates.into_iter().find(|p| p.is_file())
}

/// The rsockets preload library: `$SRDMA_RSPRELOAD`, else `libsrdma_rspreload.so` beside
/// the drop-in library `lib` (where cargo builds both) or in its directory.
pub(crate) fn find_preload(lib: &Path) -> Option<PathBuf> {
    if let Some(v) = std::env::var_os("SRDMA_RSPRELOAD").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(v)).filter(|p| p.is_file());
    }
    let mut candidates = Vec::new();
    for l in [lib.to_path_buf(), lib.canonicalize().unwrap_or_default()] {
        if let Some(d) = l.parent() {
            candidates.push(d.join("libsrdma_rspreload.so"));
        }
    }
    candidates.into_iter().find(|p| p.is_file())
}

/// The names the drop-in library serves: libibverbs and librdmacm are one file, loaded once.
const NAMES: [&str; 2] = ["libibverbs.so.1", "librdmacm.so.1"];

/// A directory where `libibverbs.so.1` and `librdmacm.so.1` (the SONAMEs the loader looks
/// for) link to `lib`.
pub(crate) fn library_dir(lib: &Path) -> anyhow::Result<PathBuf> {
    let lib = lib.canonicalize()?;
    if let Some(d) = lib.parent() {
        if NAMES
            .iter()
            .all(|n| d.join(n).canonicalize().ok().as_deref() == Some(lib.as_path()))
        {
            return Ok(d.to_path_buf());
        }
    }
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    // One directory per library: two builds (two checkouts, debug and release) run side by
    // side without re-pointing each other's links.
    let tag = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        lib.hash(&mut h);
        h.finish()
    };
    let dir = std::env::temp_dir()
        .join(format!("srdma-{uid}"))
        .join(format!("lib-{tag:016x}"));
    std::fs::create_dir_all(&dir)?;
    for name in NAMES {
        let link = dir.join(name);
        if std::fs::read_link(&link).ok().as_deref() != Some(lib.as_path()) {
            // Replace atomically: other processes may be starting through the same link.
            let tmp = dir.join(format!(".{name}.{}", std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(&lib, &tmp)?;
            std::fs::rename(&tmp, &link)?;
        }
    }
    Ok(dir)
}

/// Runs `srdma exec`: only returns on failure.
pub fn run(args: &Args) -> anyhow::Result<bool> {
    let Some(lib) = find_library() else {
        return Err(UsageError(
            "srdma exec: the drop-in libibverbs.so.1 is not built: run \
             `cargo build --release -p srdma-verbs` (it lands beside the srdma binary), or \
             set SRDMA_LIB to its path"
                .into(),
        )
        .into());
    };
    let dir = library_dir(&lib)?;
    let mut path = OsString::from(dir.as_os_str());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
        path.push(":");
        path.push(old);
    }
    let mut cmd = std::process::Command::new(&args.command[0]);
    cmd.args(&args.command[1..]).env("LD_LIBRARY_PATH", path);
    if args.rsockets {
        let Some(pre) = find_preload(&lib) else {
            return Err(UsageError(
                "srdma exec --rsockets: libsrdma_rspreload.so is not built: run \
                 `cargo build --release -p srdma-rspreload` (it lands beside the drop-in \
                 library), or set SRDMA_RSPRELOAD to its path"
                    .into(),
            )
            .into());
        };
        let pre = pre.canonicalize()?;
        let mut list = OsString::from(pre.as_os_str());
        if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
            list.push(":");
            list.push(old);
        }
        cmd.env("LD_PRELOAD", list)
            .env("SRDMA_RSPRELOAD_LIB", lib.canonicalize()?);
    }
    if let Some(d) = &args.device {
        cmd.env("SRDMA_DEVICES", d);
    }
    let count = devnodes::node_count(args.device.as_deref());
    if let Err(e) = devnodes::provide(count) {
        eprintln!(
            "srdma exec: note: no /dev/infiniband/uverbsN nodes for the program: {e}. \
             Programs that look for them (UCX) will not use srdma's devices; \
             `srdma setup-dev` (as root) makes them for good."
        );
    }
    let list = args
        .device
        .clone()
        .or_else(|| std::env::var("SRDMA_DEVICES").ok());
    let devices = srdma::netdev::device_list(list.as_deref(), true);
    if let Err(e) = sysfs::provide(&devices) {
        eprintln!(
            "srdma exec: note: no /sys/class/infiniband entries for the program: {e}. \
             Programs that look there for a device's network interface (pyverbs' rdma_cm \
             tests) will not find it."
        );
    }
    let err = cmd.exec();
    Err(UsageError(format!(
        "srdma exec: cannot run {}: {err}",
        args.command[0].to_string_lossy()
    ))
    .into())
}
