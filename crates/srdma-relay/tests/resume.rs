//! Resuming transfers (`resume = true` on a `file:` sink), every node its own process on
//! loopback addresses, as in `loopback.rs`: this binary re-executes itself as a node (the
//! ignored test `relay_node_process`).
//!
//! Each test uses its own 127.0.5x.0/24 addresses, so the tests can run in parallel.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use srdma_relay::config::Config;
use srdma_relay::report::Report;
use srdma_relay::resume::{self, PartialState};
use srdma_relay::source::gen_fill;

mod common;
use common::{
    Scratch, assert_all_ok, lines_of, node, node_command, progress_bytes, report, run,
    wait_progress,
};

const CHUNK: u64 = 64 << 10;
const SLOTS: u64 = 4;
const RING: u64 = CHUNK * SLOTS;

fn header(extra: &str) -> String {
    format!("[transfer]\nchunk_size = {CHUNK}\nslots = {SLOTS}\ntimeout_ms = 3000\n{extra}\n")
}

fn gen_bytes(len: u64, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len as usize];
    gen_fill(seed, 0, &mut v);
    v
}

/// The sink's output, its part file and its state file do not exist / are as expected.
fn assert_clean(out: &Path) {
    assert!(!resume::part_path(out).exists(), "the part file remains");
    assert!(!resume::state_path(out).exists(), "the state file remains");
}

/// Writes a resume state for sink `sink` of `cfg` (an object of `len` bytes) holding chunks
/// 0..=`held` (the start and `held` data chunks), with `part` as the part file's bytes.
fn craft_state(cfg: &Config, sink: &str, out: &Path, len: u64, held: u64, part: &[u8]) {
    let fp = resume::fingerprint(cfg, cfg.node(sink).unwrap());
    let mut st = PartialState::new(fp, CHUNK, len);
    for k in 0..=held {
        st.set(k);
    }
    st.save(&resume::state_path(out)).unwrap();
    std::fs::write(resume::part_path(out), part).unwrap();
}

/// A transfer whose sink is killed (SIGKILL) half-way, then run again with the same
/// configuration: the sink resumes from its bitmap, the source sends only what is missing
/// (at most two rings and a half: the source frames up to its own ring ahead of what it
/// posted, it posts up to the sink's ring ahead of the sink's credits, and the sink's saved
/// state lags what it wrote by up to half a ring, the chunks between two saves),
/// and the committed object is the source's.
#[test]
fn a_killed_sink_resumes_from_its_bitmap() {
    let d = Scratch::new("kill");
    let out = d.path("out.bin");
    let total: u64 = 16 << 20;
    let text = header("")
        + &node(
            "A",
            "127.0.51.1",
            "source",
            None,
            &format!("source = \"gen:{total}:9\""),
        )
        + &node(
            "C",
            "127.0.51.3",
            "sink",
            Some("A"),
            &format!(
                "sink = \"file:{}\"\nresume = true\nthrottle = \"16MiB/s\"\nstages = [\"verify\"]",
                out.display()
            ),
        );
    let (p, cfg) = d.config(&text);

    // Run 1: kill C once it wrote a quarter of the object.
    let spawn = |name: &str| -> Child {
        node_command(&p, name)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (mut c, mut a) = (spawn("C"), spawn("A"));
    let c_out = BufReader::new(c.stdout.take().unwrap());
    let start = Instant::now();
    for line in c_out.lines().map_while(Result::ok) {
        let bytes = serde_json::from_str::<serde_json::Value>(&line)
            .ok()
            .filter(|v| v["event"] == "progress")
            .and_then(|v| v["bytes"].as_u64());
        if bytes.is_some_and(|b| b >= total / 4) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "C made no progress"
        );
    }
    c.kill().unwrap(); // SIGKILL: nothing of C's own cleanup runs
    let _ = c.wait();
    let a_status = a.wait().unwrap();
    let a_out = std::io::read_to_string(a.stdout.take().unwrap()).unwrap();
    assert_eq!(a_status.code(), Some(1), "A should fail when C dies");
    let a1: Report = a_out
        .lines()
        .filter(|l| l.contains("\"report\""))
        .find_map(|l| serde_json::from_str(l).ok())
        .expect("A printed no report");
    assert!(!out.exists(), "nothing may be committed yet");
    let st = PartialState::load(&resume::state_path(&out))
        .unwrap()
        .expect("C left no resume state");
    let held = st.first_missing();
    assert!(held > 1, "the state holds no data chunk: {held}");
    assert!(
        a1.bytes < total && a1.bytes >= total / 4,
        "run 1 sent {} bytes",
        a1.bytes
    );

    // Run 2: the same configuration.
    let r = run(&p, &cfg);
    assert_all_ok(&r);
    let a2 = report(&r, "A");
    let c2 = report(&r, "C");
    assert_eq!(a2.resumed_from_chunk, Some(held), "{a2:?}");
    assert_eq!(c2.resumed_from_chunk, Some(held), "{c2:?}");
    assert_eq!(a2.sinks["C"].resumed_from, Some(held));
    // Exactly the chunks from `held` on were sent.
    assert_eq!(a2.bytes, total - (held - 1) * CHUNK, "{a2:?}");
    let sent_again = a1.bytes + a2.bytes - total;
    eprintln!(
        "run 1 sent {} bytes, run 2 resumed at chunk {held} and sent {} bytes: {sent_again} \
         bytes sent again ({} per the sink), ring {RING}",
        a1.bytes, a2.bytes, c2.bytes_sent_again
    );
    assert!(
        sent_again <= 2 * RING + RING / 2,
        "{sent_again} bytes sent again, more than two rings and a half ({RING} bytes each)"
    );
    assert!(c2.bytes_sent_again <= sent_again, "{c2:?}");
    assert_eq!(a2.bytes_sent_again, c2.bytes_sent_again);
    assert!(
        std::fs::read(&out).unwrap() == gen_bytes(total, 9),
        "the committed object differs from the source's"
    );
    assert_eq!(a2.digest, c2.digest);
    assert_clean(&out);
}

/// A state saying chunks 0..=k are held, with the right bytes in the part file (and, past the
/// bitmap, three more chunks an earlier run wrote but did not record): the transfer through a
/// relay starts at chunk k+1, the source sends exactly the rest, the sink counts the three
/// chunks as sent again and commits the source's object. The start is not a multiple of the
/// ring size, so every ring begins mid-way.
#[test]
fn a_saved_state_resumes_through_a_relay() {
    for (i, forward) in ["send", "write-imm"].into_iter().enumerate() {
        let d = Scratch::new(&format!("relay{i}"));
        let out = d.path("out.bin");
        let total: u64 = 8 << 20;
        let text = header(&format!("forward = \"{forward}\""))
            + &node(
                "A",
                &format!("127.0.52.{}", 10 * i + 1),
                "source",
                None,
                &format!("source = \"gen:{total}:4\""),
            )
            + &node(
                "B",
                &format!("127.0.52.{}", 10 * i + 2),
                "relay",
                Some("A"),
                "stages = [\"verify\"]",
            )
            + &node(
                "C",
                &format!("127.0.52.{}", 10 * i + 3),
                "sink",
                Some("B"),
                &format!("sink = \"file:{}\"\nresume = true", out.display()),
            );
        let (p, cfg) = d.config(&text);
        let want = gen_bytes(total, 4);
        let held = 37; // data chunks 1..=37
        let mut part = want[..((held + 3) * CHUNK) as usize].to_vec();
        part.resize(total as usize, 0);
        craft_state(&cfg, "C", &out, total, held, &part);
        let r = run(&p, &cfg);
        assert_all_ok(&r);
        for n in ["A", "B", "C"] {
            assert_eq!(
                report(&r, n).resumed_from_chunk,
                Some(held + 1),
                "{n} ({forward}): {:?}",
                report(&r, n)
            );
        }
        let a = report(&r, "A");
        assert_eq!(a.bytes, total - held * CHUNK, "{forward}: {a:?}");
        assert_eq!(report(&r, "C").bytes_sent_again, 3 * CHUNK, "{forward}");
        assert_eq!(a.bytes_sent_again, 3 * CHUNK, "{forward}");
        assert_eq!(report(&r, "B").bytes_sent_again, 3 * CHUNK, "{forward}");
        assert!(
            std::fs::read(&out).unwrap() == want,
            "{forward}: copies differ"
        );
        assert_eq!(a.digest, report(&r, "C").digest);
        assert_clean(&out);
    }
}

/// A damaged state file and a foreign one (another transfer's) are detected, discarded with a
/// message, and the transfer from chunk 0 commits the source's object.
#[test]
fn a_damaged_or_foreign_state_is_discarded() {
    let d = Scratch::new("bad");
    let out = d.path("out.bin");
    let total: u64 = 4 << 20;
    let cfg_text = |size: u64| {
        header("")
            + &node(
                "A",
                "127.0.53.1",
                "source",
                None,
                &format!("source = \"gen:{size}:2\""),
            )
            + &node(
                "C",
                "127.0.53.3",
                "sink",
                Some("A"),
                &format!("sink = \"file:{}\"\nresume = true", out.display()),
            )
    };
    let want = gen_bytes(total, 2);
    // A foreign configuration: another object size.
    let (_, foreign) = d.config(&cfg_text(total + CHUNK));
    let (p, cfg) = d.config(&cfg_text(total));
    for case in ["damaged", "foreign"] {
        let _ = std::fs::remove_file(&out);
        let mut part = want[..(10 * CHUNK) as usize].to_vec();
        part.resize(total as usize, 0);
        if case == "damaged" {
            craft_state(&cfg, "C", &out, total, 10, &part);
            let sp = resume::state_path(&out);
            let mut b = std::fs::read(&sp).unwrap();
            b[52] ^= 0x04; // a bit of the bitmap
            std::fs::write(&sp, b).unwrap();
        } else {
            craft_state(&foreign, "C", &out, total, 10, &part);
        }
        let r = run(&p, &cfg);
        assert_all_ok(&r);
        let c = report(&r, "C");
        let note = c.resume_note.as_deref().unwrap_or("");
        let why = if case == "damaged" {
            "checksum mismatch"
        } else {
            "another transfer"
        };
        assert!(
            note.contains("discarded the resume state") && note.contains(why),
            "{case}: {c:?}"
        );
        assert!(r["C"].stderr.contains(why), "{case}: {}", r["C"].stderr);
        assert_eq!(c.resumed_from_chunk, None, "{case}");
        assert_eq!(
            report(&r, "A").bytes,
            total,
            "{case}: not sent from chunk 0"
        );
        assert!(
            std::fs::read(&out).unwrap() == want,
            "{case}: copies differ"
        );
        assert_clean(&out);
    }
}

/// A state that checks out but whose part file holds other bytes: the sink resumes, digests
/// the whole file at the end, finds the mismatch, commits nothing and discards the state; the
/// next run starts from chunk 0 and commits.
#[test]
fn a_resumed_object_is_verified_whole() {
    let d = Scratch::new("whole");
    let out = d.path("out.bin");
    let total: u64 = 4 << 20;
    let text = header("")
        + &node(
            "A",
            "127.0.54.1",
            "source",
            None,
            &format!("source = \"gen:{total}:6\""),
        )
        + &node(
            "C",
            "127.0.54.3",
            "sink",
            Some("A"),
            &format!("sink = \"file:{}\"\nresume = true", out.display()),
        );
    let (p, cfg) = d.config(&text);
    let want = gen_bytes(total, 6);
    let mut part = want[..(20 * CHUNK) as usize].to_vec();
    part[12345] ^= 1; // one wrong bit in a chunk the state claims
    part.resize(total as usize, 0);
    craft_state(&cfg, "C", &out, total, 20, &part);
    let r = run(&p, &cfg);
    for n in ["A", "C"] {
        assert_eq!(r[n].code, Some(1), "{n}: {}", r[n].stderr);
    }
    let a = report(&r, "A");
    let err = a.error.as_deref().unwrap_or("");
    assert!(
        err.contains("digest mismatch at sink C") && err.contains("discarded"),
        "{a:?}"
    );
    assert!(!a.sinks["C"].committed);
    assert!(!out.exists(), "a wrong object was committed");
    assert_clean(&out);
    // Again: from chunk 0 this time.
    let r = run(&p, &cfg);
    assert_all_ok(&r);
    assert_eq!(report(&r, "C").resumed_from_chunk, None);
    assert_eq!(report(&r, "A").bytes, total);
    assert!(std::fs::read(&out).unwrap() == want, "copies differ");
    assert_clean(&out);
}

/// Whether `rx` shows a progress line with at least `bytes` within `limit`.
fn reaches(rx: &Receiver<String>, bytes: u64, limit: Duration) -> bool {
    let start = Instant::now();
    while let Ok(line) = rx.recv_timeout(limit.saturating_sub(start.elapsed())) {
        if progress_bytes(&line).is_some_and(|b| b >= bytes) {
            return true;
        }
    }
    false
}

fn final_report(rx: &Receiver<String>) -> Report {
    rx.iter()
        .filter(|l| l.contains("\"report\""))
        .find_map(|l| serde_json::from_str(&l).ok())
        .expect("no report")
}

fn wait_exit(c: &mut Child, who: &str, limit: Duration) -> Option<i32> {
    let t = Instant::now();
    loop {
        if let Some(st) = c.try_wait().unwrap() {
            return st.code();
        }
        if t.elapsed() > limit {
            let _ = c.kill();
            panic!("{who} still runs after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The sink is killed (SIGKILL) and started again while the source keeps running: the source
/// waits for it, resends from the first chunk its bitmap lacks (at most two rings again), and
/// the transfer commits the source's object.
#[test]
fn a_sink_restarted_while_the_source_runs_catches_up() {
    let d = Scratch::new("rejoin");
    let out = d.path("out.bin");
    let total: u64 = 16 << 20;
    let text = header("")
        + &node(
            "A",
            "127.0.55.1",
            "source",
            None,
            &format!("source = \"gen:{total}:8\""),
        )
        + &node(
            "C",
            "127.0.55.3",
            "sink",
            Some("A"),
            &format!(
                "sink = \"file:{}\"\nresume = true\nthrottle = \"16MiB/s\"",
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
    let mut c1 = spawn("C");
    let mut a = spawn("A");
    let c1_lines = lines_of(&mut c1);
    let a_lines = lines_of(&mut a);
    wait_progress(&c1_lines, total / 4, &mut Vec::new());
    c1.kill().unwrap();
    let _ = c1.wait();
    let held = PartialState::load(&resume::state_path(&out))
        .unwrap()
        .expect("C left no resume state")
        .first_missing();
    let mut c2 = spawn("C");
    let c2_lines = lines_of(&mut c2);
    assert_eq!(
        wait_exit(&mut c2, "C", Duration::from_secs(30)),
        Some(0),
        "{}",
        std::io::read_to_string(c2.stderr.take().unwrap()).unwrap()
    );
    let a_code = wait_exit(&mut a, "A", Duration::from_secs(30));
    let a_err = std::io::read_to_string(a.stderr.take().unwrap()).unwrap();
    assert_eq!(a_code, Some(0), "{a_err}");
    let ar = final_report(&a_lines);
    let cr = final_report(&c2_lines);
    assert!(ar.ok && cr.ok, "{ar:?} {cr:?}");
    assert!(a_err.contains("lost C"), "{a_err}");
    assert_eq!(ar.resumed_from_chunk, Some(held), "{ar:?}");
    assert_eq!(cr.resumed_from_chunk, Some(held), "{cr:?}");
    assert!(held > 1);
    eprintln!(
        "C restarted: resumed at chunk {held}, the source sent {} bytes in all for {total}, \
         {} bytes sent again (ring {RING})",
        ar.bytes, ar.bytes_sent_again
    );
    // The source counts what it sent twice; it is all it sent beyond the object.
    assert_eq!(ar.bytes - total, ar.bytes_sent_again, "{ar:?}");
    assert!(ar.bytes_sent_again <= 2 * RING, "{ar:?}");
    assert!(ar.sinks["C"].committed);
    assert!(
        std::fs::read(&out).unwrap() == gen_bytes(total, 8),
        "the committed object differs from the source's"
    );
    assert_clean(&out);
}

/// The sink is killed and not started again: the source waits `timeout_ms` and then fails,
/// naming the sink; the sink's partial object and state stay for a later run.
#[test]
fn a_sink_that_does_not_come_back_fails_the_transfer() {
    let d = Scratch::new("gone");
    let out = d.path("out.bin");
    let text = "[transfer]\nchunk_size = 65536\nslots = 4\ntimeout_ms = 1000\n".to_string()
        + &node("A", "127.0.56.1", "source", None, "source = \"gen:16MiB\"")
        + &node(
            "C",
            "127.0.56.3",
            "sink",
            Some("A"),
            &format!(
                "sink = \"file:{}\"\nresume = true\nthrottle = \"16MiB/s\"",
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
    let mut c = spawn("C");
    let mut a = spawn("A");
    let c_lines = lines_of(&mut c);
    let a_lines = lines_of(&mut a);
    wait_progress(&c_lines, 2 << 20, &mut Vec::new());
    c.kill().unwrap();
    let killed = Instant::now();
    let _ = c.wait();
    assert_eq!(wait_exit(&mut a, "A", Duration::from_secs(20)), Some(1));
    assert!(killed.elapsed() >= Duration::from_millis(900));
    let ar = final_report(&a_lines);
    assert!(!ar.ok);
    assert_eq!(ar.failed_hop.as_deref(), Some("C"), "{ar:?}");
    assert!(
        ar.error
            .as_deref()
            .unwrap_or("")
            .contains("did not come back"),
        "{ar:?}"
    );
    assert!(!out.exists());
    assert!(resume::state_path(&out).exists() && resume::part_path(&out).exists());
}

/// Two sinks under the source with different saved states: the run starts at the smaller
/// first missing chunk, the sink that holds more counts the chunks it received again (and
/// does not rewrite them), and both commit the source's object. Without any state at one
/// sink, the run starts from chunk 0 and the other sink still continues its partial file.
#[test]
fn two_sinks_start_at_the_smaller_resume_point() {
    let d = Scratch::new("two");
    let total: u64 = 4 << 20;
    let (oc, od) = (d.path("c.bin"), d.path("d.bin"));
    let text = header("")
        + &node(
            "A",
            "127.0.57.1",
            "source",
            None,
            &format!("source = \"gen:{total}:3\""),
        )
        + &node(
            "C",
            "127.0.57.3",
            "sink",
            Some("A"),
            &format!("sink = \"file:{}\"\nresume = true", oc.display()),
        )
        + &node(
            "D",
            "127.0.57.4",
            "sink",
            Some("A"),
            &format!("sink = \"file:{}\"\nresume = true", od.display()),
        );
    let (p, cfg) = d.config(&text);
    let want = gen_bytes(total, 3);
    let part = |held: u64| {
        let mut v = want[..(held * CHUNK) as usize].to_vec();
        v.resize(total as usize, 0);
        v
    };
    // C holds data chunks 1..=30, D 1..=10: the run starts at chunk 11.
    craft_state(&cfg, "C", &oc, total, 30, &part(30));
    craft_state(&cfg, "D", &od, total, 10, &part(10));
    let r = run(&p, &cfg);
    assert_all_ok(&r);
    let a = report(&r, "A");
    assert_eq!(a.resumed_from_chunk, Some(11), "{a:?}");
    assert_eq!(a.bytes, total - 10 * CHUNK);
    assert_eq!(report(&r, "C").bytes_sent_again, 20 * CHUNK);
    assert_eq!(report(&r, "D").bytes_sent_again, 0);
    assert_eq!(a.sinks["C"].bytes_sent_again, 20 * CHUNK);
    assert_eq!(a.bytes_sent_again, 20 * CHUNK);
    for o in [&oc, &od] {
        assert!(std::fs::read(o).unwrap() == want, "{o:?} differs");
        assert_clean(o);
    }
    // Only C holds something: everything is sent, C continues its file.
    std::fs::remove_file(&oc).unwrap();
    std::fs::remove_file(&od).unwrap();
    craft_state(&cfg, "C", &oc, total, 30, &part(30));
    let r = run(&p, &cfg);
    assert_all_ok(&r);
    let a = report(&r, "A");
    assert_eq!(a.bytes, total);
    assert_eq!(report(&r, "C").resumed_from_chunk, Some(0));
    assert_eq!(report(&r, "C").bytes_sent_again, 30 * CHUNK);
    for o in [&oc, &od] {
        assert!(std::fs::read(o).unwrap() == want, "{o:?} differs");
        assert_clean(o);
    }
}

/// Measures what keeping the resume state costs: the same transfer to a file sink without and
/// with `resume = true`, twice each, alternating. Run it by hand on a release build:
/// `cargo test --release -p srdma-relay --test resume resume_overhead -- --ignored --nocapture`
/// (`SRDMA_RESUME_BENCH_SIZE` sets the size, default 256MiB).
#[test]
#[ignore = "a measurement, not a check"]
fn resume_overhead() {
    let size = std::env::var("SRDMA_RESUME_BENCH_SIZE").unwrap_or_else(|_| "256MiB".into());
    let d = Scratch::new("bench");
    let out = d.path("out.bin");
    for round in 0..2 {
        for resume in [false, true] {
            let _ = std::fs::remove_file(&out);
            let text = "[transfer]\ntimeout_ms = 10000\n".to_string()
                + &node(
                    "A",
                    "127.0.58.1",
                    "source",
                    None,
                    &format!("source = \"gen:{size}\""),
                )
                + &node(
                    "C",
                    "127.0.58.3",
                    "sink",
                    Some("A"),
                    &format!("sink = \"file:{}\"\nresume = {resume}", out.display()),
                );
            let (p, cfg) = d.config(&text);
            let t = Instant::now();
            let r = run(&p, &cfg);
            let wall = t.elapsed().as_secs_f64();
            assert_all_ok(&r);
            let c = report(&r, "C");
            eprintln!(
                "round {round} resume={resume}: {size} in {:.3} s at the sink, {:.0} MiB/s, \
                 {wall:.2} s wall",
                c.seconds,
                c.throughput_mbps * 1e6 / 8.0 / 1_048_576.0
            );
        }
    }
}

/// The source is killed mid-transfer: the sink notices, saves its bitmap, keeps the partial
/// object (saying so), and the rerun of the whole configuration resumes where it stopped.
#[test]
fn a_killed_source_leaves_a_resumable_sink() {
    let d = Scratch::new("srckill");
    let out = d.path("out.bin");
    let total: u64 = 16 << 20;
    let text = header("")
        + &node(
            "A",
            "127.0.59.1",
            "source",
            None,
            &format!("source = \"gen:{total}:12\""),
        )
        + &node(
            "C",
            "127.0.59.3",
            "sink",
            Some("A"),
            &format!(
                "sink = \"file:{}\"\nresume = true\nthrottle = \"16MiB/s\"",
                out.display()
            ),
        );
    let (p, cfg) = d.config(&text);
    let spawn = |name: &str| -> Child {
        node_command(&p, name)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut c = spawn("C");
    let mut a = spawn("A");
    let c_lines = lines_of(&mut c);
    wait_progress(&c_lines, total / 4, &mut Vec::new());
    a.kill().unwrap();
    let _ = a.wait();
    assert_eq!(wait_exit(&mut c, "C", Duration::from_secs(20)), Some(1));
    let c_err = std::io::read_to_string(c.stderr.take().unwrap()).unwrap();
    assert!(c_err.contains("kept the partial object"), "{c_err}");
    let cr = final_report(&c_lines);
    assert!(!cr.ok);
    let held = PartialState::load(&resume::state_path(&out))
        .unwrap()
        .expect("C left no resume state")
        .first_missing();
    // Saved at the end: every chunk C received is in the bitmap (chunk 0 is the start).
    assert_eq!(held, cr.chunks, "{cr:?}");
    let r = run(&p, &cfg);
    assert_all_ok(&r);
    let a2 = report(&r, "A");
    assert_eq!(a2.resumed_from_chunk, Some(held));
    assert_eq!(a2.bytes, total - (held - 1) * CHUNK);
    assert_eq!(report(&r, "C").bytes_sent_again, 0);
    assert!(
        std::fs::read(&out).unwrap() == gen_bytes(total, 12),
        "copies differ"
    );
    assert_clean(&out);
}

/// As above, through a relay: the sink at the end of a chain is killed and started again
/// while the source and the relay keep running; the relay sets its rings up again, the source
/// resends from the first chunk the sink lacks (at most a ring per hop plus the chunks since
/// the sink's last saved state: three rings), and the transfer commits the source's object.
#[test]
fn a_sink_below_a_relay_restarted_while_the_rest_runs_catches_up() {
    for (i, forward) in ["send", "write-imm"].into_iter().enumerate() {
        let d = Scratch::new(&format!("rejoin2-{i}"));
        let out = d.path("out.bin");
        let total: u64 = 16 << 20;
        let text = header(&format!("forward = \"{forward}\""))
            + &node(
                "A",
                &format!("127.0.60.{}", 10 * i + 1),
                "source",
                None,
                &format!("source = \"gen:{total}:10\""),
            )
            + &node(
                "B",
                &format!("127.0.60.{}", 10 * i + 2),
                "relay",
                Some("A"),
                "stages = [\"verify\"]",
            )
            + &node(
                "C",
                &format!("127.0.60.{}", 10 * i + 3),
                "sink",
                Some("B"),
                &format!(
                    "sink = \"file:{}\"\nresume = true\nthrottle = \"16MiB/s\"",
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
        let mut c1 = spawn("C");
        let mut b = spawn("B");
        let mut a = spawn("A");
        let c1_lines = lines_of(&mut c1);
        let a_lines = lines_of(&mut a);
        let b_lines = lines_of(&mut b);
        wait_progress(&c1_lines, total / 4, &mut Vec::new());
        c1.kill().unwrap();
        let _ = c1.wait();
        let held = PartialState::load(&resume::state_path(&out))
            .unwrap()
            .expect("C left no resume state")
            .first_missing();
        let mut c2 = spawn("C");
        let c2_lines = lines_of(&mut c2);
        let limit = Duration::from_secs(30);
        let c_code = wait_exit(&mut c2, "C", limit);
        let c_err = std::io::read_to_string(c2.stderr.take().unwrap()).unwrap();
        assert_eq!(c_code, Some(0), "{c_err}");
        let b_code = wait_exit(&mut b, "B", limit);
        let b_err = std::io::read_to_string(b.stderr.take().unwrap()).unwrap();
        assert_eq!(b_code, Some(0), "{b_err}");
        let a_code = wait_exit(&mut a, "A", limit);
        let a_err = std::io::read_to_string(a.stderr.take().unwrap()).unwrap();
        assert_eq!(a_code, Some(0), "{a_err}");
        assert!(b_err.contains("forwarding again from chunk"), "{b_err}");
        let (ar, br, cr) = (
            final_report(&a_lines),
            final_report(&b_lines),
            final_report(&c2_lines),
        );
        for (n, r) in [("A", &ar), ("B", &br), ("C", &cr)] {
            assert!(r.ok, "{n}: {r:?}");
            assert_eq!(r.resumed_from_chunk, Some(held), "{n}: {r:?}");
        }
        eprintln!(
            "{forward}: C restarted below B: resumed at chunk {held}, the source sent {} bytes in all for \
             {total}, {} bytes sent again (ring {RING})",
            ar.bytes, ar.bytes_sent_again
        );
        assert_eq!(ar.bytes - total, ar.bytes_sent_again, "{ar:?}");
        assert!(ar.bytes_sent_again <= 3 * RING, "{ar:?}");
        assert!(
            std::fs::read(&out).unwrap() == gen_bytes(total, 10),
            "the committed object differs from the source's"
        );
        assert_clean(&out);
    }
}

/// In a chain whose sink may come back, with healing off, a killed relay is still a failure:
/// the source names it (after no more than `timeout_ms`), and the sink keeps its partial
/// object for a rerun.
#[test]
fn a_killed_relay_in_a_resumable_chain_still_fails_the_run() {
    let d = Scratch::new("relaykill");
    let out = d.path("out.bin");
    let text = "[transfer]\nchunk_size = 65536\nslots = 4\ntimeout_ms = 1500\nheal = false\n"
        .to_string()
        + &node("A", "127.0.61.1", "source", None, "source = \"gen:16MiB\"")
        + &node("B", "127.0.61.2", "relay", Some("A"), "")
        + &node(
            "C",
            "127.0.61.3",
            "sink",
            Some("B"),
            &format!(
                "sink = \"file:{}\"\nresume = true\nthrottle = \"16MiB/s\"",
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
    let mut c = spawn("C");
    let mut b = spawn("B");
    let mut a = spawn("A");
    let c_lines = lines_of(&mut c);
    let a_lines = lines_of(&mut a);
    wait_progress(&c_lines, 2 << 20, &mut Vec::new());
    b.kill().unwrap();
    let _ = b.wait();
    let limit = Duration::from_secs(20);
    assert_eq!(wait_exit(&mut a, "A", limit), Some(1));
    assert_eq!(wait_exit(&mut c, "C", limit), Some(1));
    let ar = final_report(&a_lines);
    assert_eq!(ar.failed_hop.as_deref(), Some("B"), "{ar:?}");
    assert!(!ar.sinks["C"].committed);
    let cr = final_report(&c_lines);
    assert_eq!(cr.failed_hop.as_deref(), Some("B"), "{cr:?}");
    assert!(!out.exists());
    assert!(resume::state_path(&out).exists(), "C kept no state");
}

/// The same with healing on (the default): the sink re-attaches to the source, and the
/// object it commits is the source's.
#[test]
fn a_killed_relay_in_a_resumable_chain_is_healed_around() {
    let d = Scratch::new("relayheal");
    let out = d.path("out.bin");
    let total: u64 = 16 << 20;
    let text = "[transfer]\nchunk_size = 65536\nslots = 4\ntimeout_ms = 1500\n".to_string()
        + &node(
            "A",
            "127.0.61.11",
            "source",
            None,
            &format!("source = \"gen:{total}:13\""),
        )
        + &node("B", "127.0.61.12", "relay", Some("A"), "")
        + &node(
            "C",
            "127.0.61.13",
            "sink",
            Some("B"),
            &format!(
                "sink = \"file:{}\"\nresume = true\nthrottle = \"16MiB/s\"",
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
    let mut c = spawn("C");
    let mut b = spawn("B");
    let mut a = spawn("A");
    let c_lines = lines_of(&mut c);
    let a_lines = lines_of(&mut a);
    wait_progress(&c_lines, 2 << 20, &mut Vec::new());
    b.kill().unwrap();
    let _ = b.wait();
    let limit = Duration::from_secs(30);
    let a_code = wait_exit(&mut a, "A", limit);
    let a_err = std::io::read_to_string(a.stderr.take().unwrap()).unwrap();
    assert_eq!(a_code, Some(0), "{a_err}");
    assert_eq!(wait_exit(&mut c, "C", limit), Some(0));
    let ar = final_report(&a_lines);
    assert!(ar.ok && ar.sinks["C"].committed, "{ar:?}");
    assert_eq!(ar.healed.len(), 1, "{ar:?}");
    assert_eq!(ar.healed[0].nodes, ["B"], "{ar:?}");
    let cr = final_report(&c_lines);
    assert!(cr.ok, "{cr:?}");
    assert_eq!(cr.bytes, total, "{cr:?}");
    assert!(
        std::fs::read(&out).unwrap() == gen_bytes(total, 13),
        "the committed object differs from the source's"
    );
    assert_clean(&out);
}

/// In a tree (A → B → C, D), sink D is killed and started again while the rest waits: the
/// tree is set up again from the first chunk either sink lacks; D resumes from its bitmap,
/// receives again at most two rings of what it held, and both sinks commit the source's
/// object. Then, in the same run, relay B is killed and the sinks re-attach to A.
#[test]
fn a_sink_restarted_in_a_tree_catches_up() {
    let d = Scratch::new("rejoin-tree");
    let (out_c, out_d) = (d.path("out-c.bin"), d.path("out-d.bin"));
    let total: u64 = 16 << 20;
    let sink = |out: &Path| {
        format!(
            "sink = \"file:{}\"\nresume = true\nthrottle = \"8MiB/s\"",
            out.display()
        )
    };
    let text = header("")
        + &node(
            "A",
            "127.0.62.1",
            "source",
            None,
            &format!("source = \"gen:{total}:14\""),
        )
        + &node(
            "B",
            "127.0.62.2",
            "relay",
            Some("A"),
            "stages = [\"verify\"]",
        )
        + &node("C", "127.0.62.3", "sink", Some("B"), &sink(&out_c))
        + &node("D", "127.0.62.4", "sink", Some("B"), &sink(&out_d));
    let (p, _cfg) = d.config(&text);
    let spawn = |name: &str| -> Child {
        node_command(&p, name)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut d1 = spawn("D");
    let mut c = spawn("C");
    let mut b = spawn("B");
    let mut a = spawn("A");
    let d1_lines = lines_of(&mut d1);
    let a_lines = lines_of(&mut a);
    let c_lines = lines_of(&mut c);
    wait_progress(&d1_lines, total / 4, &mut Vec::new());
    d1.kill().unwrap();
    let _ = d1.wait();
    let held = PartialState::load(&resume::state_path(&out_d))
        .unwrap()
        .expect("D left no resume state")
        .first_missing();
    let mut d2 = spawn("D");
    let d2_lines = lines_of(&mut d2);
    if !reaches(&d2_lines, total / 4, Duration::from_secs(20)) {
        let mut all = String::new();
        for (n, ch) in [("A", &mut a), ("B", &mut b), ("C", &mut c), ("D", &mut d2)] {
            let _ = ch.kill();
            let _ = ch.wait();
            let err = std::io::read_to_string(ch.stderr.take().unwrap()).unwrap();
            all += &format!("--- {n}:\n{err}");
        }
        panic!("the restarted D did not get to {} bytes\n{all}", total / 4);
    }
    b.kill().unwrap();
    let _ = b.wait();
    let limit = Duration::from_secs(40);
    for (n, ch) in [("D", &mut d2), ("C", &mut c), ("A", &mut a)] {
        let code = wait_exit(ch, n, limit);
        let err = std::io::read_to_string(ch.stderr.take().unwrap()).unwrap();
        assert_eq!(code, Some(0), "{n}: {err}");
    }
    let (ar, cr, dr) = (
        final_report(&a_lines),
        final_report(&c_lines),
        final_report(&d2_lines),
    );
    for (n, r) in [("A", &ar), ("C", &cr), ("D", &dr)] {
        assert!(r.ok, "{n}: {r:?}");
        assert_eq!(r.healed.len(), 2, "{n}: {r:?}");
        assert_eq!(r.healed[0].rejoined, ["D"], "{n}: {r:?}");
        assert!(r.healed[0].nodes.is_empty(), "{n}: {r:?}");
        assert_eq!(r.healed[1].nodes, ["B"], "{n}: {r:?}");
        assert!(
            r.sinks["C"].committed && r.sinks["D"].committed,
            "{n}: {r:?}"
        );
    }
    assert!(ar.healed[0].from_chunk <= held, "{ar:?}");
    eprintln!(
        "D restarted in a tree: held 0..{held}, the transfer went on at chunk {}; D received {} \
         bytes again, C {} (ring {RING}); then B died: {:?}",
        ar.healed[0].from_chunk, dr.bytes_sent_again, cr.bytes_sent_again, ar.healed[1]
    );
    assert!(dr.bytes_sent_again <= 2 * RING, "{dr:?}");
    assert!(cr.bytes_sent_again <= 2 * RING, "{cr:?}");
    for out in [&out_c, &out_d] {
        assert!(
            std::fs::read(out).unwrap() == gen_bytes(total, 14),
            "{} differs from the source's object",
            out.display()
        );
        assert_clean(out);
    }
}
