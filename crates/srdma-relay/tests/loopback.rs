//! Whole transfers on loopback addresses, every node its own process: this test binary
//! re-executes itself as a node (the ignored test `relay_node_process`, told which node by
//! environment variables), as `srdma relay node` would run it.
//!
//! Each test uses its own 127.0.4x.0/24 addresses, so they can run in parallel with each other
//! and with the demo (127.0.30.x). Sizes are small (8–24 MiB): the engine is a debug build here.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use srdma_relay::report::Report;

mod common;
use common::{
    Scratch, TinyFs, assert_all_ok, lines_of, node, node_command, report, run, signal,
    wait_progress,
};

fn header(extra: &str) -> String {
    format!("[transfer]\nchunk_size = \"256KiB\"\nslots = 4\ntimeout_ms = 3000\n{extra}\n")
}

#[test]
fn three_hop_chain_delivers_an_identical_file() {
    let d = Scratch::new("chain");
    let src = d.random_file("in.bin", 16 << 20, 7);
    let out = d.path("out.bin");
    let text = header("")
        + &node(
            "A",
            "127.0.41.1",
            "source",
            None,
            &format!("source = \"file:{}\"", src.display()),
        )
        + &node(
            "B",
            "127.0.41.2",
            "relay",
            Some("A"),
            "stages = [\"verify\"]",
        )
        + &node(
            "C",
            "127.0.41.3",
            "relay",
            Some("B"),
            "stages = [\"verify\"]",
        )
        + &node(
            "D",
            "127.0.41.4",
            "sink",
            Some("C"),
            &format!("sink = \"file:{}\"\nstages = [\"verify\"]", out.display()),
        );
    let (p, cfg) = d.config(&text);
    let r = run(&p, &cfg);
    assert_all_ok(&r);
    assert!(
        std::fs::read(&src).unwrap() == std::fs::read(&out).unwrap(),
        "the copies differ"
    );
    let a = report(&r, "A");
    assert_eq!(a.bytes, 16 << 20);
    assert_eq!(a.digest, report(&r, "D").digest);
    assert_eq!(a.sinks["D"].bytes, 16 << 20);
    assert!(a.sinks["D"].committed);
    for relay in ["B", "C"] {
        let rep = report(&r, relay);
        assert_eq!(rep.copied_bytes, 0, "{relay} copied chunk data");
        assert!(rep.forwarded_bytes >= 16 << 20, "{relay}: {rep:?}");
    }
    assert!(
        d.leftovers("out.bin.").is_empty(),
        "{:?}",
        d.leftovers("out.bin.")
    );
}

#[test]
fn fan_out_tree_delivers_to_every_sink() {
    // A -> B (relay and sink) -> D, E; A -> C (sink): fan-out 2 at the source and at a relay.
    let d = Scratch::new("tree");
    let src = d.random_file("in.bin", 8 << 20, 11);
    let sink = |n: &str| {
        format!(
            "sink = \"file:{}\"\nstages = [\"verify\"]",
            d.path(&format!("{n}.bin")).display()
        )
    };
    let text = header("")
        + &node(
            "A",
            "127.0.42.1",
            "source",
            None,
            &format!("source = \"{}\"", src.display()),
        )
        + &node("B", "127.0.42.2", "relay+sink", Some("A"), &sink("B"))
        + &node("C", "127.0.42.3", "sink", Some("A"), &sink("C"))
        + &node("D", "127.0.42.4", "sink", Some("B"), &sink("D"))
        + &node("E", "127.0.42.5", "sink", Some("B"), &sink("E"));
    let (p, cfg) = d.config(&text);
    let r = run(&p, &cfg);
    assert_all_ok(&r);
    let want = std::fs::read(&src).unwrap();
    for s in ["B", "C", "D", "E"] {
        let got = std::fs::read(d.path(&format!("{s}.bin"))).unwrap();
        assert!(got == want, "sink {s}'s copy differs");
        assert!(report(&r, "A").sinks[s].committed);
    }
    // B forwarded every chunk twice, from the same slot, and wrote it to its own sink.
    let b = report(&r, "B");
    assert!(b.forwarded_bytes >= 2 * (8 << 20), "{b:?}");
    // Only the object name is copied out (a relay+sink opens the file with it).
    assert!(
        b.copied_bytes <= 4096 && b.copied_bytes * 100 <= b.forwarded_bytes,
        "{b:?}"
    );
}

#[test]
fn write_imm_forwarding_delivers_too() {
    let d = Scratch::new("wimm");
    let out = d.path("out.bin");
    let text = header("forward = \"write-imm\"\ncheck = \"xxh3\"")
        + &node("A", "127.0.43.1", "source", None, "source = \"gen:8MiB:3\"")
        + &node(
            "B",
            "127.0.43.2",
            "relay",
            Some("A"),
            "stages = [\"verify\"]",
        )
        + &node(
            "C",
            "127.0.43.3",
            "sink",
            Some("B"),
            &format!("sink = \"file:{}\"", out.display()),
        );
    let (p, cfg) = d.config(&text);
    let r = run(&p, &cfg);
    assert_all_ok(&r);
    let got = std::fs::read(&out).unwrap();
    let mut want = vec![0u8; 8 << 20];
    srdma_relay::source::gen_fill(3, 0, &mut want);
    assert!(got == want, "the copy differs from the generated data");
}

#[test]
fn a_throttled_sink_slows_the_source() {
    let d = Scratch::new("slow");
    let (bytes, rate) = (24u64 << 20, 12u64 << 20);
    let text = "[transfer]\nchunk_size = \"128KiB\"\nslots = 4\ntimeout_ms = 3000\n".to_string()
        + &node(
            "A",
            "127.0.44.1",
            "source",
            None,
            &format!("source = \"gen:{bytes}\""),
        )
        + &node("B", "127.0.44.2", "relay", Some("A"), "")
        + &node(
            "C",
            "127.0.44.3",
            "sink",
            Some("B"),
            "sink = \"discard\"\nthrottle = \"12MiB/s\"",
        );
    let (p, cfg) = d.config(&text);
    let r = run(&p, &cfg);
    assert_all_ok(&r);
    let a = report(&r, "A");
    let floor = bytes as f64 / rate as f64 * 0.8;
    assert!(
        a.seconds >= floor,
        "the source took {:.2} s for {bytes} bytes, a sink at {rate} B/s needs at least {floor:.2} s",
        a.seconds
    );
    assert!(report(&r, "C").seconds >= floor);
}

#[test]
fn a_flipped_bit_is_caught_at_the_next_hop() {
    let d = Scratch::new("flip");
    let out = d.path("out.bin");
    let text = header("")
        + &node("A", "127.0.45.1", "source", None, "source = \"gen:8MiB\"")
        + &node(
            "B",
            "127.0.45.2",
            "relay",
            Some("A"),
            "stages = [\"verify\"]\nflip_bit_at_seq = 5",
        )
        + &node(
            "C",
            "127.0.45.3",
            "sink",
            Some("B"),
            &format!("sink = \"file:{}\"\nstages = [\"verify\"]", out.display()),
        );
    let (p, cfg) = d.config(&text);
    let r = run(&p, &cfg);
    for n in ["A", "C"] {
        assert_eq!(r[n].code, Some(1), "{n}: {}", r[n].stderr);
    }
    let c = report(&r, "C");
    assert!(!c.ok);
    let err = c.error.as_deref().unwrap_or("");
    assert!(
        err.contains("chunk 5") && err.contains("caught at C"),
        "{err}"
    );
    let a = report(&r, "A");
    assert!(!a.ok);
    assert!(
        a.error.as_deref().unwrap_or("").contains("chunk 5"),
        "{a:?}"
    );
    assert!(!a.sinks["C"].committed);
    assert!(r["A"].stderr.contains("chunk 5"), "{}", r["A"].stderr);
    assert!(!out.exists(), "a corrupt object was committed");
    assert!(
        d.leftovers("out.bin").is_empty(),
        "{:?}",
        d.leftovers("out.bin")
    );
}

#[test]
fn a_killed_relay_is_reported_by_the_source_and_downstream() {
    let d = Scratch::new("kill");
    let out = d.path("out.bin");
    // Healing off: the failure ends the transfer (see `relays_that_die_or_freeze_are_healed_around`).
    let text = "[transfer]\nchunk_size = \"256KiB\"\nslots = 4\ntimeout_ms = 2000\nheal = false\n"
        .to_string()
        + &node("A", "127.0.46.1", "source", None, "source = \"gen:64MiB\"")
        + &node(
            "B",
            "127.0.46.2",
            "relay",
            Some("A"),
            "stages = [\"verify\"]",
        )
        + &node(
            "C",
            "127.0.46.3",
            "sink",
            Some("B"),
            &format!("sink = \"file:{}\"\nthrottle = \"8MiB/s\"", out.display()),
        );
    let (p, _cfg) = d.config(&text);
    let spawn = |name: &str| -> Child {
        node_command(&p, name)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (mut c, mut b, mut a) = (spawn("C"), spawn("B"), spawn("A"));
    // Wait until C reports progress, then kill B.
    let c_out = BufReader::new(c.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in c_out.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let start = Instant::now();
    let mut c_lines = Vec::new();
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("C printed no progress within 20 s");
        let progressed = line.contains("\"progress\"")
            && serde_json::from_str::<serde_json::Value>(&line)
                .ok()
                .and_then(|v| v["bytes"].as_u64())
                .is_some_and(|b| b >= 2 << 20);
        c_lines.push(line);
        if progressed {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20));
    }
    b.kill().unwrap();
    let killed = Instant::now();
    let _ = b.wait();
    let wait = |ch: &mut Child, who: &str| {
        loop {
            if let Some(st) = ch.try_wait().unwrap() {
                return st.code();
            }
            if killed.elapsed() > Duration::from_secs(15) {
                let _ = ch.kill();
                panic!("{who} still runs 15 s after the relay was killed");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    assert_eq!(wait(&mut a, "A"), Some(1));
    assert_eq!(wait(&mut c, "C"), Some(1));
    reader.join().unwrap();
    c_lines.extend(rx.try_iter());
    let a_out = std::io::read_to_string(a.stdout.take().unwrap()).unwrap();
    let a_err = std::io::read_to_string(a.stderr.take().unwrap()).unwrap();
    let c_err = std::io::read_to_string(c.stderr.take().unwrap()).unwrap();
    let last_report = |lines: &mut dyn Iterator<Item = &str>| -> Report {
        lines
            .filter(|l| l.contains("\"report\""))
            .filter_map(|l| serde_json::from_str(l).ok())
            .last()
            .expect("no report")
    };
    let ar = last_report(&mut a_out.lines());
    let cr = last_report(&mut c_lines.iter().map(String::as_str));
    for (who, rep, err) in [("A", &ar, &a_err), ("C", &cr, &c_err)] {
        assert!(!rep.ok, "{who}: {rep:?}");
        assert_eq!(rep.failed_hop.as_deref(), Some("B"), "{who}: {rep:?}");
        assert!(err.contains("failed hop: B"), "{who} said: {err}");
        assert!(err.contains("sink C:"), "{who} said: {err}");
        let sink = rep
            .sinks
            .get("C")
            .unwrap_or_else(|| panic!("{who}: {rep:?}"));
        assert!(!sink.committed);
        assert!(
            sink.bytes >= 2 << 20 && sink.bytes < 64 << 20,
            "{who}: {sink:?}"
        );
    }
    assert!(!out.exists(), "an incomplete object was committed");
    assert!(
        d.leftovers("out.bin").is_empty(),
        "{:?}",
        d.leftovers("out.bin")
    );
}

/// A → B → C → D → E (three relays): B is killed (SIGKILL) and later D frozen (SIGSTOP)
/// mid-transfer. The transfer heals around both: E re-attaches to C, then C to A; E commits
/// a byte-identical file; every survivor exits 0 and reports both heals; what was sent again
/// is bounded by the rings in flight.
#[test]
fn relays_that_die_or_freeze_are_healed_around() {
    let d = Scratch::new("heal");
    let size = 24usize << 20;
    let src = d.random_file("in.bin", size, 11);
    let out = d.path("out.bin");
    let relay = "stages = [\"verify\"]";
    let text = "[transfer]\nchunk_size = \"256KiB\"\nslots = 4\ntimeout_ms = 1500\n".to_string()
        + &node(
            "A",
            "127.0.48.1",
            "source",
            None,
            &format!("source = \"file:{}\"", src.display()),
        )
        + &node("B", "127.0.48.2", "relay", Some("A"), relay)
        + &node("C", "127.0.48.3", "relay", Some("B"), relay)
        + &node("D", "127.0.48.4", "relay", Some("C"), relay)
        + &node(
            "E",
            "127.0.48.5",
            "sink",
            Some("D"),
            &format!(
                "sink = \"file:{}\"\nthrottle = \"4MiB/s\"\nstages = [\"verify\"]",
                out.display()
            ),
        );
    let (p, _cfg) = d.config(&text);
    let spawn = |name: &str| -> Child {
        node_command(&p, name)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut procs: BTreeMap<&str, Child> = BTreeMap::new();
    for n in ["E", "D", "C", "B", "A"] {
        procs.insert(n, spawn(n));
    }
    let e_rx = lines_of(procs.get_mut("E").unwrap());
    let mut e_lines = Vec::new();
    wait_progress(&e_rx, 4 << 20, &mut e_lines);
    signal(&procs["B"], libc::SIGKILL);
    wait_progress(&e_rx, 10 << 20, &mut e_lines);
    signal(&procs["D"], libc::SIGSTOP);
    let stopped = Instant::now();
    let mut codes = BTreeMap::new();
    for n in ["A", "C", "E"] {
        let ch = procs.get_mut(n).unwrap();
        let code = loop {
            if let Some(st) = ch.try_wait().unwrap() {
                break st.code();
            }
            if stopped.elapsed() > Duration::from_secs(40) {
                for c in procs.values_mut() {
                    let _ = c.kill();
                }
                panic!("{n} still runs 40 s after D was frozen");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        codes.insert(n, code);
    }
    for n in ["B", "D"] {
        let ch = procs.get_mut(n).unwrap();
        let _ = ch.kill();
        let _ = ch.wait();
    }
    let text_of = |c: &mut Child, err: bool| {
        if err {
            std::io::read_to_string(c.stderr.take().unwrap()).unwrap()
        } else {
            std::io::read_to_string(c.stdout.take().unwrap()).unwrap()
        }
    };
    let last_report = |lines: &mut dyn Iterator<Item = &str>| -> Option<Report> {
        lines
            .filter(|l| l.contains("\"report\""))
            .filter_map(|l| serde_json::from_str(l).ok())
            .last()
    };
    e_lines.extend(e_rx.iter());
    let mut reports = BTreeMap::new();
    let mut errs = String::new();
    for n in ["A", "C"] {
        let ch = procs.get_mut(n).unwrap();
        let o = text_of(ch, false);
        errs += &format!("--- {n}: {}\n", text_of(ch, true));
        reports.insert(n, last_report(&mut o.lines()));
    }
    errs += &format!("--- E: {}\n", text_of(procs.get_mut("E").unwrap(), true));
    reports.insert("E", last_report(&mut e_lines.iter().map(String::as_str)));
    for (n, code) in &codes {
        assert_eq!(*code, Some(0), "{n} failed\n{errs}");
    }
    assert!(
        std::fs::read(&src).unwrap() == std::fs::read(&out).unwrap(),
        "E's copy differs\n{errs}"
    );
    let ring = 4 * (256 << 10) as u64;
    for (n, r) in &reports {
        let r = r
            .as_ref()
            .unwrap_or_else(|| panic!("{n} printed no report\n{errs}"));
        assert!(r.ok, "{n}: {r:?}\n{errs}");
        let healed: Vec<&str> = r
            .healed
            .iter()
            .flat_map(|h| h.nodes.iter().map(String::as_str))
            .collect();
        assert_eq!(healed, ["B", "D"], "{n}: {r:?}");
        for h in &r.healed {
            // At most what the four hops' rings hold was in flight past the slowest sink.
            assert!(h.resent_chunks <= 4 * 4, "{n}: {h:?}");
        }
        assert!(r.sinks["E"].committed, "{n}: {r:?}");
        assert_eq!(r.sinks["E"].bytes, size as u64, "{n}: {r:?}");
    }
    let e = reports["E"].as_ref().unwrap();
    assert_eq!(e.bytes, size as u64, "{e:?}");
    // E was the only sink, so the slowest: nothing reached it twice.
    assert!(e.bytes_sent_again <= ring, "{e:?}");
    assert!(
        d.leftovers("out.bin.").is_empty(),
        "{:?}",
        d.leftovers("out.bin.")
    );
}

#[test]
fn an_unreachable_hop_is_named() {
    let d = Scratch::new("unreach");
    let text = "[transfer]\ntimeout_ms = 800\n".to_string()
        + &node("A", "127.0.47.1", "source", None, "source = \"gen:1MiB\"")
        + &node("B", "127.0.47.2", "sink", Some("A"), "sink = \"discard\"");
    let (p, _) = d.config(&text);
    let t = Instant::now();
    let out = node_command(&p, "A").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot reach B") && err.contains("127.0.47.2"),
        "{err}"
    );
    assert!(err.contains("failed hop: B"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_bad_config_exits_2_naming_the_field() {
    let d = Scratch::new("badcfg");
    let p = d.path("bad.toml");
    let text = "[transfer]\nslots = 0\n".to_string()
        + &node("A", "127.0.48.1", "source", None, "source = \"gen:1MiB\"")
        + &node("B", "127.0.48.2", "sink", Some("A"), "sink = \"discard\"");
    std::fs::write(&p, text).unwrap();
    let out = node_command(&p, "A").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("bad.toml") && err.contains("`slots`"), "{err}");

    let text = "[transfer]\n".to_string()
        + &node("A", "127.0.48.1", "source", None, "source = \"gen:1MiB\"")
        + &node("B", "127.0.48.2", "sink", Some("Z"), "sink = \"discard\"");
    std::fs::write(&p, text).unwrap();
    let out = node_command(&p, "B").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("\"B\"") && err.contains("`parent`"), "{err}");
}

#[test]
fn a_full_disk_at_a_sink_is_reported_by_the_source() {
    let d = Scratch::new("full");
    let Some(fs) = TinyFs::mount(d.path("tiny"), "1m") else {
        eprintln!("skipping: cannot mount a tmpfs here (not root?)");
        return;
    };
    let out = fs.dir().join("out.bin");
    let text = header("")
        + &node("A", "127.0.49.1", "source", None, "source = \"gen:8MiB\"")
        + &node("B", "127.0.49.2", "relay", Some("A"), "")
        + &node(
            "C",
            "127.0.49.3",
            "sink",
            Some("B"),
            &format!("sink = \"file:{}\"", out.display()),
        );
    let (p, cfg) = d.config(&text);
    let r = run(&p, &cfg);
    for n in ["A", "C"] {
        assert_eq!(r[n].code, Some(1), "{n}: {}", r[n].stderr);
    }
    let a = report(&r, "A");
    assert!(
        a.error
            .as_deref()
            .unwrap_or("")
            .contains("disk full at sink C"),
        "{a:?}"
    );
    assert_eq!(a.failed_hop.as_deref(), Some("C"));
    assert!(!a.sinks["C"].committed);
    assert!(r["A"].stderr.contains("disk full"), "{}", r["A"].stderr);
    let left: Vec<_> = std::fs::read_dir(fs.dir()).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

/// `topology = "binomial"`: a source and five sinks (a cube of four and two twins); every sink
/// commits the file, and the sinks, not the source, carry most of the sending: the source
/// sends every chunk once.
#[test]
fn a_binomial_pipeline_delivers_to_every_sink() {
    let d = Scratch::new("binomial");
    let size = 12usize << 20;
    let src = d.random_file("in.bin", size, 21);
    let mut text = "[transfer]\nchunk_size = \"256KiB\"\nslots = 4\ntimeout_ms = 3000\ntopology = \"binomial\"\n"
        .to_string()
        + &node(
            "A",
            "127.0.63.1",
            "source",
            None,
            &format!("source = \"file:{}\"", src.display()),
        );
    let sinks = ["B", "C", "D", "E", "F"];
    for (i, n) in sinks.iter().enumerate() {
        let out = d.path(&format!("out-{n}.bin"));
        text += &node(
            n,
            &format!("127.0.63.{}", i + 2),
            "sink",
            None,
            &format!("sink = \"file:{}\"\nstages = [\"verify\"]", out.display()),
        );
    }
    let (p, cfg) = d.config(&text);
    let r = run(&p, &cfg);
    assert_all_ok(&r);
    let input = std::fs::read(&src).unwrap();
    let a = report(&r, "A");
    // The source sends each chunk once: its header and payload, no more.
    let chunk_bytes = 256 << 10;
    assert!(
        a.forwarded_bytes < size as u64 + (size as u64 / chunk_bytes + 4) * 256,
        "{a:?}"
    );
    let mut forwarded = 0;
    for n in sinks {
        assert!(
            std::fs::read(d.path(&format!("out-{n}.bin"))).unwrap() == input,
            "{n}'s copy differs"
        );
        let rep = report(&r, n);
        assert_eq!(rep.digest, a.digest, "{n}");
        assert_eq!(rep.bytes, size as u64, "{n}");
        assert!(a.sinks[n].committed);
        forwarded += rep.forwarded_bytes;
    }
    // Five receivers: the sinks sent the other four copies between them.
    assert!(
        forwarded >= 4 * size as u64,
        "the sinks forwarded {forwarded}"
    );
}

/// A sink of a binomial pipeline killed mid-transfer ends the run (no healing there): the
/// source names it and says what reached every sink.
#[test]
fn a_sink_killed_in_a_binomial_pipeline_is_reported() {
    let d = Scratch::new("binomial-kill");
    let mut text = "[transfer]\nchunk_size = \"256KiB\"\nslots = 4\ntimeout_ms = 2000\ntopology = \"binomial\"\n"
        .to_string()
        + &node("A", "127.0.64.1", "source", None, "source = \"gen:64MiB\"");
    for (i, n) in ["B", "C", "D"].iter().enumerate() {
        text += &node(
            n,
            &format!("127.0.64.{}", i + 2),
            "sink",
            None,
            "sink = \"discard\"\nthrottle = \"8MiB/s\"",
        );
    }
    let (p, _cfg) = d.config(&text);
    let spawn = |name: &str| -> Child {
        node_command(&p, name)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut procs: BTreeMap<&str, Child> = BTreeMap::new();
    for n in ["D", "C", "B", "A"] {
        procs.insert(n, spawn(n));
    }
    let c_rx = lines_of(procs.get_mut("C").unwrap());
    let mut seen = Vec::new();
    wait_progress(&c_rx, 2 << 20, &mut seen);
    signal(&procs["C"], libc::SIGKILL);
    let killed = Instant::now();
    for n in ["A", "B", "D"] {
        let ch = procs.get_mut(n).unwrap();
        let code = loop {
            if let Some(st) = ch.try_wait().unwrap() {
                break st.code();
            }
            assert!(
                killed.elapsed() < Duration::from_secs(20),
                "{n} still runs 20 s after C was killed"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(code, Some(1), "{n}");
    }
    let _ = procs.get_mut("C").unwrap().wait();
    let a = procs.get_mut("A").unwrap();
    let out = std::io::read_to_string(a.stdout.take().unwrap()).unwrap();
    let err = std::io::read_to_string(a.stderr.take().unwrap()).unwrap();
    let rep: Report = out
        .lines()
        .filter(|l| l.contains("\"report\""))
        .find_map(|l| serde_json::from_str(l).ok())
        .expect("A printed no report");
    assert!(!rep.ok);
    assert_eq!(rep.failed_hop.as_deref(), Some("C"), "{rep:?}\n{err}");
    assert!(err.contains("failed hop: C"), "{err}");
    for n in ["B", "C", "D"] {
        assert!(!rep.sinks[n].committed, "{rep:?}");
        assert!(rep.sinks[n].bytes < 64 << 20, "{rep:?}");
    }
}

/// A bit flipped in a binomial pipeline (the `flip_bit_at_seq` knob at sink C) is caught by
/// C's checks before C writes it: C fails naming itself and the partner the chunk came from,
/// and its object is not committed.
#[test]
fn a_flipped_bit_in_a_binomial_pipeline_is_caught() {
    let d = Scratch::new("binomial-flip");
    let mut text = "[transfer]\nchunk_size = \"256KiB\"\nslots = 4\ntimeout_ms = 3000\ntopology = \"binomial\"\n"
        .to_string()
        + &node("A", "127.0.65.1", "source", None, "source = \"gen:8MiB\"");
    for (i, n) in ["B", "C", "D"].iter().enumerate() {
        let out = d.path(&format!("out-{n}.bin"));
        let flip = if *n == "C" {
            "\nflip_bit_at_seq = 5"
        } else {
            ""
        };
        text += &node(
            n,
            &format!("127.0.65.{}", i + 2),
            "sink",
            None,
            &format!(
                "sink = \"file:{}\"\nstages = [\"verify\"]{flip}",
                out.display()
            ),
        );
    }
    let (p, cfg) = d.config(&text);
    let r = run(&p, &cfg);
    let c = report(&r, "C");
    assert!(!c.ok, "{c:?}");
    let err = c.error.as_deref().unwrap_or_default();
    assert!(
        err.contains("chunk 5 corrupt, caught at C (received from "),
        "{err}"
    );
    assert!(!err.contains("from ?"), "{err}");
    assert!(
        !d.path("out-C.bin").exists(),
        "C committed a corrupt object"
    );
    let a = report(&r, "A");
    assert!(!a.ok);
    assert_eq!(a.failed_hop.as_deref(), Some("C"), "{a:?}");
    assert!(!a.sinks["C"].committed, "{a:?}");
}
