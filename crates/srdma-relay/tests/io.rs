//! The data-handling half of srdma-relay end to end, without a network: sources framed into
//! ring slots, stages run in place hop by hop, chunks reassembled into sinks.

use srdma_relay::chunk::{CheckAlg, ChunkHeader, HEADER_LEN, flags};
use srdma_relay::digest::ObjectDigest;
use srdma_relay::sink::{self, Assembler, DeliverError, Delivered, DirSink, Sink, WriterSink};
use srdma_relay::source::{self, Framer, ObjectInfo, Source, gen_fill};
use srdma_relay::stage::{self, Chunk, Stage, StageError};
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex};

mod common;
use common::{Scratch, TinyFs};

/// Every file below `root`, as (relative name, contents), sorted.
fn tree(root: &Path) -> Vec<(String, Vec<u8>)> {
    fn walk(dir: &Path, prefix: &str, out: &mut Vec<(String, Vec<u8>)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            let rel = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                walk(&e.path(), &rel, out);
            } else {
                out.push((rel, std::fs::read(e.path()).unwrap()));
            }
        }
    }
    let mut v = Vec::new();
    walk(root, "", &mut v);
    v.sort();
    v
}

fn text(n: usize, salt: u8) -> Vec<u8> {
    (0..n)
        .map(|i| b"lorem ipsum dolor sit amet, consectetur "[i % 40].wrapping_add(salt))
        .collect()
}

/// One ring slot: header + payload area, like the registered memory a relay owns.
struct Slot {
    mem: Vec<u8>,
}

impl Slot {
    fn new(capacity: usize) -> Slot {
        Slot {
            mem: vec![0u8; HEADER_LEN + capacity],
        }
    }
}

/// Runs a whole transfer: `framer` fills a slot, then each hop (a list of stages) decodes the
/// header, runs its stages in place, re-encodes the header; the bytes are "sent" to the next
/// hop's slot (a copy standing in for RDMA WRITE), optionally corrupted on the way by
/// `tamper(hop, seq, slot bytes)`; finally the assembler delivers into the sink.
fn transfer(
    mut framer: Framer,
    capacity: usize,
    hops: &mut [Vec<Box<dyn Stage>>],
    asm: &mut Assembler,
    mut tamper: impl FnMut(usize, u64, &mut [u8]),
) -> Result<Vec<Delivered>, String> {
    let mut src = Slot::new(capacity);
    let mut dst = Slot::new(capacity);
    let mut events = Vec::new();
    loop {
        let (hbuf, payload) = src.mem.split_at_mut(HEADER_LEN);
        let Some(h) = framer.next_chunk(payload).map_err(|e| e.to_string())? else {
            break;
        };
        h.encode(hbuf).unwrap();
        let wire = HEADER_LEN + h.payload_len as usize;
        dst.mem[..wire].copy_from_slice(&src.mem[..wire]);
        for (i, stages) in hops.iter_mut().enumerate() {
            tamper(i, h.seq, &mut dst.mem[..wire.max(HEADER_LEN)]);
            let (hbuf, payload) = dst.mem.split_at_mut(HEADER_LEN);
            let mut hh = match ChunkHeader::decode(hbuf) {
                Ok(hh) => hh,
                Err(e) => {
                    asm.abort(); // the transfer is torn down: nothing partial may stay
                    return Err(format!("hop {i}: {e}"));
                }
            };
            for st in stages.iter_mut() {
                st.process(Chunk {
                    header: &mut hh,
                    buf: payload,
                })
                .map_err(|e| {
                    asm.abort();
                    format!("hop {i} {}: {e}", st.name())
                })?;
            }
            hh.encode(hbuf).unwrap();
        }
        let (hbuf, payload) = dst.mem.split_at(HEADER_LEN);
        let hh = ChunkHeader::decode(hbuf).map_err(|e| format!("sink: {e}"))?;
        events.push(asm.accept(&hh, payload).map_err(|e| format!("sink: {e}"))?);
    }
    Ok(events)
}

fn stages(specs: &[&str]) -> Vec<Box<dyn Stage>> {
    specs.iter().map(|s| stage::build(s).unwrap()).collect()
}

fn make_source_tree(root: &Path) -> Vec<(String, Vec<u8>)> {
    let files: Vec<(&str, Vec<u8>)> = vec![
        ("a.txt", text(100_000, 0)),
        ("empty", Vec::new()),
        ("sub/deeper/b.bin", {
            let mut v = vec![0u8; 70_001];
            gen_fill(7, 0, &mut v);
            v
        }),
        ("sub/c.txt", text(16_384, 3)), // exactly 4 chunks of 4 KiB
        ("z", b"x".to_vec()),
    ];
    for (name, data) in &files {
        let p = root.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }
    let mut v: Vec<_> = files.into_iter().map(|(n, d)| (n.to_owned(), d)).collect();
    v.sort();
    v
}

/// (name, length, digest) of each file: comparable without dumping megabytes on failure.
fn summary(files: &[(String, Vec<u8>)]) -> Vec<(String, usize, String)> {
    files
        .iter()
        .map(|(n, d)| {
            (
                n.clone(),
                d.len(),
                srdma_relay::digest::hex(&ObjectDigest::of(d)),
            )
        })
        .collect()
}

#[test]
fn dir_round_trip_through_every_stage() {
    let from = Scratch::new("io-from");
    let to = Scratch::new("io-to");
    let expect = make_source_tree(from.dir());
    let chunk = 4096;
    let specs: Vec<String> = ["verify", "compress:3", "exec:cat", "decompress"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let cap = stage::capacity_for(chunk, &specs);
    let mut hops = vec![
        stages(&["verify", "compress:3"]),
        stages(&["verify", "exec:cat"]),
        stages(&["verify"]),
        stages(&["decompress", "verify"]),
    ];
    let framer = Framer::new(
        source::open(&format!("dir:{}", from.dir().display())).unwrap(),
        chunk,
        CheckAlg::Crc32c,
    )
    .unwrap();
    let mut asm = Assembler::new(sink::open(&format!("dir:{}", to.dir().display())).unwrap());
    let events = transfer(framer, cap, &mut hops, &mut asm, |_, _, _| {}).unwrap();
    assert!(asm.finished());
    assert_eq!(asm.objects(), expect.len() as u64);
    let committed: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Delivered::Committed { name, len, digest } => {
                Some((name.clone(), *len, digest.clone()))
            }
            _ => None,
        })
        .collect();
    let want: Vec<_> = expect
        .iter()
        .map(|(n, d)| {
            (
                n.clone(),
                d.len() as u64,
                srdma_relay::digest::hex(&ObjectDigest::of(d)),
            )
        })
        .collect();
    assert_eq!(committed, want);
    assert_eq!(summary(&tree(to.dir())), summary(&expect));
    // Text compressed: the compress stage copied back fewer bytes than it saw.
    let copied: u64 = hops[0][1].copied_bytes();
    assert!(copied > 0 && copied < 200_000, "compress copied {copied}");
    assert_eq!(events.last(), Some(&Delivered::EndOfTransfer));
}

/// A sink recording writes into shared memory, so the test can look after the assembler owns it.
struct Shared(Arc<Mutex<Vec<u8>>>);

impl io::Write for Shared {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn gen_round_trip_to_a_stream() {
    for alg in [CheckAlg::None, CheckAlg::Crc32c, CheckAlg::Xxh3] {
        let out = Arc::new(Mutex::new(Vec::new()));
        let mut asm = Assembler::new(Box::new(WriterSink::new(Shared(out.clone()))));
        let framer = Framer::new(source::open("gen:1000003:99").unwrap(), 65536, alg).unwrap();
        let mut hops = vec![stages(&["verify", "compress"]), stages(&["verify"])];
        // Compressed chunks reach the sink: the assembler decompresses them.
        transfer(
            framer,
            stage::capacity_for(65536, &[]),
            &mut hops,
            &mut asm,
            |_, _, _| {},
        )
        .unwrap();
        let mut want = vec![0u8; 1_000_003];
        gen_fill(99, 0, &mut want);
        assert!(*out.lock().unwrap() == want, "{alg:?}");
        assert_eq!(asm.bytes(), 1_000_003);
    }
}

#[test]
fn flipped_bit_caught_by_the_next_verify() {
    let to = Scratch::new("io-flip");
    let framer = Framer::new(source::open("gen:300000:5").unwrap(), 65536, CheckAlg::Xxh3).unwrap();
    let mut hops = vec![stages(&["verify"]), stages(&["verify"])];
    let mut asm = Assembler::new(Box::new(DirSink::new(to.dir().to_owned()).unwrap()));
    // Flip a payload bit of chunk 3 on its way into hop 1.
    let err = transfer(framer, 65536, &mut hops, &mut asm, |hop, seq, b| {
        if hop == 1 && seq == 3 {
            b[HEADER_LEN + 777] ^= 0x20;
        }
    })
    .unwrap_err();
    assert!(err.starts_with("hop 1 verify"), "{err}");
    assert!(err.contains("chunk 3"), "{err}");
    assert!(err.contains("checksum mismatch"), "{err}");
    // The aborted object left nothing behind.
    assert_eq!(summary(&tree(to.dir())), vec![]);

    // A flipped header bit is caught by decode.
    let framer = Framer::new(source::open("gen:300000:5").unwrap(), 65536, CheckAlg::Xxh3).unwrap();
    let mut asm = Assembler::new(Box::new(DirSink::new(to.dir().to_owned()).unwrap()));
    let err = transfer(framer, 65536, &mut hops, &mut asm, |hop, seq, b| {
        if hop == 0 && seq == 2 {
            b[33] ^= 1; // offset field
        }
    })
    .unwrap_err();
    assert!(err.contains("header corrupted"), "{err}");
    assert_eq!(summary(&tree(to.dir())), vec![]);
}

#[test]
fn without_checksums_the_object_digest_still_catches_corruption() {
    let to = Scratch::new("io-digest");
    let framer = Framer::new(source::open("gen:200000:8").unwrap(), 65536, CheckAlg::None).unwrap();
    let mut hops = vec![stages(&["verify"])];
    let mut asm = Assembler::new(Box::new(DirSink::new(to.dir().to_owned()).unwrap()));
    let err = transfer(framer, 65536, &mut hops, &mut asm, |_, seq, b| {
        if seq == 2 {
            b[HEADER_LEN + 5] ^= 1;
        }
    })
    .unwrap_err();
    assert!(err.contains("digest mismatch"), "{err}");
    assert_eq!(
        summary(&tree(to.dir())),
        vec![],
        "nothing committed, no part file left"
    );
}

#[test]
fn assembler_rejects_gaps_and_reordering() {
    // Frame a small transfer, then deliver it with one chunk missing.
    let mut framer =
        Framer::new(source::open("gen:20000:1").unwrap(), 4096, CheckAlg::Crc32c).unwrap();
    let mut chunks = Vec::new();
    let mut buf = vec![0u8; 8192];
    while let Some(h) = framer.next_chunk(&mut buf).unwrap() {
        chunks.push((h, buf[..h.payload_len as usize].to_vec()));
    }
    // START, 5 data chunks, END, END_OF_TRANSFER.
    assert_eq!(chunks.len(), 8);
    assert!(chunks[0].0.has(flags::OBJECT_START));
    assert!(chunks[6].0.has(flags::OBJECT_END));
    assert!(chunks[7].0.has(flags::END_OF_TRANSFER));
    let mut asm = Assembler::new(Box::new(sink::DiscardSink::default()));
    asm.accept(&chunks[0].0, &chunks[0].1).unwrap();
    asm.accept(&chunks[1].0, &chunks[1].1).unwrap();
    match asm.accept(&chunks[3].0, &chunks[3].1) {
        Err(DeliverError::Sequence(m)) => assert!(m.contains("expected 2"), "{m}"),
        other => panic!("{other:?}"),
    }
    // A whole delivery in order works.
    let mut asm = Assembler::new(Box::new(sink::DiscardSink::default()));
    for (h, p) in &chunks {
        asm.accept(h, p).unwrap();
    }
    assert!(asm.finished());
    assert_eq!(asm.sink().bytes_written(), 20_000);
    assert!(matches!(
        asm.accept(&chunks[7].0, &chunks[7].1),
        Err(DeliverError::Sequence(_))
    ));
}

#[test]
fn file_sink_is_atomic() {
    let d = Scratch::new("io-atomic");
    let dest = d.dir().join("out.bin");
    let mut s = sink::open(&format!("file:{}", dest.display())).unwrap();
    let info = ObjectInfo {
        name: "whatever".into(),
        len: Some(10),
    };
    s.begin(&info).unwrap();
    s.write(5, b"world").unwrap();
    s.write(0, b"hello").unwrap();
    assert!(!dest.exists(), "final name visible before commit");
    let part = sink::part_path(&dest);
    assert!(part.exists());
    s.commit().unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), b"helloworld");
    assert!(!part.exists());
    assert_eq!(s.bytes_written(), 10);
    // A file sink takes one object only.
    assert!(s.begin(&info).is_err());

    // Abort leaves nothing; neither does dropping a sink mid-object.
    let dest2 = d.dir().join("aborted.bin");
    let mut s = sink::open(&format!("file:{}", dest2.display())).unwrap();
    s.begin(&info).unwrap();
    s.write(0, b"hello").unwrap();
    s.abort();
    let dest3 = d.dir().join("dropped.bin");
    let mut s3 = sink::open(&format!("file:{}", dest3.display())).unwrap();
    s3.begin(&info).unwrap();
    s3.write(0, b"hello").unwrap();
    drop(s3);
    let names: Vec<_> = tree(d.dir()).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, vec!["out.bin".to_string()]);

    // Writes beyond the announced length are refused.
    let mut s = sink::open(&format!("file:{}", dest2.display())).unwrap();
    s.begin(&info).unwrap();
    assert_eq!(
        s.write(6, b"12345").unwrap_err().kind(),
        io::ErrorKind::InvalidData
    );
    s.abort();
}

#[test]
fn dir_sink_never_writes_outside_its_directory() {
    let outer = Scratch::new("io-outer");
    let root = outer.dir().join("root");
    let mut s = DirSink::new(root.clone()).unwrap();
    // A symlink inside the root pointing out of it.
    std::os::unix::fs::symlink(outer.dir(), root.join("escape")).unwrap();
    std::fs::write(root.join("plainfile"), b"").unwrap();
    for bad in [
        "../x",
        "a/../../x",
        "/etc/x",
        "a\0b",
        "",
        "a//b",
        "./x",
        "a/.",
        "a/",
        "..",
        "escape/x",
        "plainfile/x",
    ] {
        let info = ObjectInfo {
            name: bad.into(),
            len: Some(1),
        };
        let e = s.begin(&info).expect_err(bad);
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}: {e}");
    }
    // Only what was there before: nothing new inside or next to the root.
    let mut names: Vec<_> = std::fs::read_dir(outer.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, vec!["root"]);
    let mut inside: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    inside.sort();
    assert_eq!(inside, vec!["escape", "plainfile"]);
    // A good nested name works, dot-files and odd characters included.
    for good in ["x/y/.hidden", "sp ace\\back"] {
        s.begin(&ObjectInfo {
            name: good.into(),
            len: Some(2),
        })
        .unwrap();
        s.write(0, b"ok").unwrap();
        s.commit().unwrap();
        assert_eq!(std::fs::read(root.join(good)).unwrap(), b"ok");
    }
}

#[test]
fn stream_sink_requires_offset_order() {
    let mut s = WriterSink::new(Vec::new());
    s.begin(&ObjectInfo {
        name: "a".into(),
        len: None,
    })
    .unwrap();
    s.write(0, b"abc").unwrap();
    let e = s.write(10, b"xyz").unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    assert!(e.to_string().contains("out of order"), "{e}");
    s.write(3, b"def").unwrap();
    s.commit().unwrap();
    // A second object starts at offset 0 again.
    s.begin(&ObjectInfo {
        name: "b".into(),
        len: None,
    })
    .unwrap();
    s.write(0, b"!").unwrap();
    s.commit().unwrap();
    assert_eq!(s.bytes_written(), 7);
    assert_eq!(s.into_inner(), b"abcdef!");
}

#[test]
fn sink_specs() {
    for bad in ["", "files:/tmp/x", "nowhere"] {
        assert!(sink::open(bad).is_err(), "{bad:?}");
    }
    let mut d = sink::open("discard").unwrap();
    d.begin(&ObjectInfo {
        name: "x".into(),
        len: None,
    })
    .unwrap();
    d.write(0, &[0; 1000]).unwrap();
    d.write(99, &[0; 24]).unwrap();
    d.commit().unwrap();
    assert_eq!(d.bytes_written(), 1024);
    let dir = Scratch::new("io-specs");
    // file: on a directory is refused.
    assert!(sink::open(&format!("file:{}", dir.dir().display())).is_err());
}

#[test]
fn sources_from_paths() {
    let d = Scratch::new("io-sources");
    let expect = make_source_tree(d.dir());
    // A symlink is skipped, not followed.
    std::os::unix::fs::symlink("/etc/hostname", d.dir().join("link")).unwrap();
    for spec in [
        format!("dir:{}", d.dir().display()),
        d.dir().display().to_string(),
    ] {
        let mut s = source::open(&spec).unwrap();
        let mut got = Vec::new();
        let mut buf = vec![0u8; 3000];
        while let Some(info) = s.next_object().unwrap() {
            let mut data = Vec::new();
            loop {
                let n = s.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                data.extend_from_slice(&buf[..n]);
            }
            assert_eq!(info.len, Some(data.len() as u64));
            got.push((info.name, data));
        }
        assert_eq!(summary(&got), summary(&expect));
    }
    let f = d.dir().join("a.txt");
    for spec in [format!("file:{}", f.display()), f.display().to_string()] {
        let mut s = source::open(&spec).unwrap();
        let info = s.next_object().unwrap().unwrap();
        assert_eq!(info.name, "a.txt");
        assert_eq!(info.len, Some(100_000));
        let mut buf = vec![0u8; 200_000];
        assert_eq!(s.read(&mut buf).unwrap(), 100_000);
        assert!(buf[..100_000] == expect[0].1[..]);
        assert_eq!(s.read(&mut buf).unwrap(), 0);
        assert!(s.next_object().unwrap().is_none());
    }
    assert!(source::open(&format!("file:{}", d.dir().display())).is_err());
    assert!(source::open(&format!("dir:{}", f.display())).is_err());
}

#[test]
fn file_that_shrinks_while_read_is_an_error() {
    let d = Scratch::new("io-shrink");
    let f = d.dir().join("f");
    std::fs::write(&f, vec![1u8; 10_000]).unwrap();
    let mut s = source::open(&format!("file:{}", f.display())).unwrap();
    s.next_object().unwrap().unwrap();
    std::fs::write(&f, vec![1u8; 100]).unwrap();
    let mut buf = vec![0u8; 4096];
    let e = s.read(&mut buf).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
}

#[test]
fn full_disk_is_reported_and_cleaned_up() {
    let d = Scratch::new("io-tmpfs");
    let Some(fs) = TinyFs::mount(d.path("fs"), "64k") else {
        eprintln!("skipping: cannot mount a tmpfs here");
        return;
    };
    let root = fs.dir().join("sink");
    let big = 1u64 << 20;
    // Known length: the space reservation at begin already fails.
    let mut s = DirSink::new(root.clone()).unwrap();
    let e = s
        .begin(&ObjectInfo {
            name: "big".into(),
            len: Some(big),
        })
        .unwrap_err();
    assert!(sink::is_storage_full(&e), "{e:?}");
    assert_eq!(e.kind(), io::ErrorKind::StorageFull);
    assert!(e.to_string().contains("big.srdma-part-"), "{e}");
    assert_eq!(summary(&tree(&root)), vec![]);
    // Unknown length (stdin): the error comes from a write, through the assembler.
    let mut asm = Assembler::new(Box::new(DirSink::new(root.clone()).unwrap()));
    let mut framer = Framer::new(
        Box::new(UnknownLen(source::open("gen:1MiB").unwrap())),
        65536,
        CheckAlg::Crc32c,
    )
    .unwrap();
    let mut buf = vec![0u8; 65536];
    let err = loop {
        let h = framer
            .next_chunk(&mut buf)
            .unwrap()
            .expect("disk fills first");
        if let Err(e) = asm.accept(&h, &buf) {
            break e;
        }
    };
    assert!(err.storage_full(), "{err}");
    assert!(
        err.to_string().contains("No space left") || err.to_string().contains("storage full"),
        "{err}"
    );
    assert_eq!(
        summary(&tree(&root)),
        vec![],
        "the partial object was removed"
    );
}

/// Hides a source's object lengths (like stdin).
struct UnknownLen(Box<dyn Source>);

impl Source for UnknownLen {
    fn next_object(&mut self) -> io::Result<Option<ObjectInfo>> {
        Ok(self.0.next_object()?.map(|i| ObjectInfo { len: None, ..i }))
    }
    fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        self.0.read(dst)
    }
}

#[test]
fn stage_errors_are_typed() {
    // A stage fed a chunk whose payload_len overruns the slot reports Corrupt, not a panic.
    let mut h = ChunkHeader::data(1, 0, 0, 10, 10, CheckAlg::Crc32c);
    h.seal(&[0u8; 10]);
    let mut small = [0u8; 4];
    for spec in ["verify", "compress", "exec:cat"] {
        let mut st = stage::build(spec).unwrap();
        assert!(
            matches!(
                st.process(Chunk {
                    header: &mut h,
                    buf: &mut small
                }),
                Err(StageError::Corrupt { seq: 1, .. })
            ),
            "{spec}"
        );
    }
}

/// Throughput of the hot paths, printed (run it optimised:
/// `cargo test --release -p srdma-relay --test io -- --ignored --nocapture throughput`).
#[test]
#[ignore = "measurement, not a check; run with --release --ignored --nocapture"]
fn throughput() {
    use std::time::Instant;
    let chunk = 4 << 20;
    let total: u64 = 1 << 30;
    let rounds = total / chunk as u64;
    let gbps = |bytes: u64, t: std::time::Duration| bytes as f64 / t.as_secs_f64() / 1e9;
    let mut buf = vec![0u8; stage::capacity_for(chunk, &["compress".into()])];

    let mut src = source::open("gen:1GiB:7").unwrap();
    src.next_object().unwrap();
    let t = Instant::now();
    let mut n = 0u64;
    loop {
        let r = src.read(&mut buf[..chunk]).unwrap();
        if r == 0 {
            break;
        }
        n += r as u64;
    }
    println!(
        "gen source      {:6.2} GB/s ({n} bytes)",
        gbps(n, t.elapsed())
    );

    for (alg, name) in [(CheckAlg::Crc32c, "crc32c"), (CheckAlg::Xxh3, "xxh3")] {
        let mut h = ChunkHeader::data(0, 0, 0, chunk as u32, u64::MAX, alg);
        h.seal(&buf[..chunk]);
        let mut v = stage::build("verify").unwrap();
        let t = Instant::now();
        for _ in 0..rounds {
            v.process(Chunk {
                header: &mut h,
                buf: &mut buf,
            })
            .unwrap();
        }
        println!("verify {name:<8} {:6.2} GB/s", gbps(total, t.elapsed()));
        let t = Instant::now();
        for _ in 0..rounds {
            h.seal(&buf[..chunk]);
        }
        println!("seal   {name:<8} {:6.2} GB/s", gbps(total, t.elapsed()));
    }

    let t = Instant::now();
    let mut d = ObjectDigest::new();
    for _ in 0..rounds {
        d.update(&buf[..chunk]);
    }
    std::hint::black_box(d.finish());
    println!("object digest   {:6.2} GB/s", gbps(total, t.elapsed()));

    // zstd on text-like data (compressible) over 256 MiB.
    let text = text(chunk, 0);
    let mut c = stage::build("compress").unwrap();
    let mut dz = stage::build("decompress").unwrap();
    let (mut tc, mut td) = (std::time::Duration::ZERO, std::time::Duration::ZERO);
    let mut packed = 0u64;
    for _ in 0..64 {
        buf[..chunk].copy_from_slice(&text);
        let mut h = ChunkHeader::data(0, 0, 0, chunk as u32, u64::MAX, CheckAlg::Crc32c);
        h.seal(&buf[..chunk]);
        let t = Instant::now();
        c.process(Chunk {
            header: &mut h,
            buf: &mut buf,
        })
        .unwrap();
        tc += t.elapsed();
        packed += u64::from(h.payload_len);
        let t = Instant::now();
        dz.process(Chunk {
            header: &mut h,
            buf: &mut buf,
        })
        .unwrap();
        td += t.elapsed();
    }
    let raw = 64 * chunk as u64;
    println!(
        "compress (text) {:6.2} GB/s, ratio {:.1}x, copied {:.2}% of input",
        gbps(raw, tc),
        raw as f64 / packed as f64,
        100.0 * c.copied_bytes() as f64 / raw as f64
    );
    println!("decompress      {:6.2} GB/s", gbps(raw, td));

    // zstd on incompressible data: the attempt costs time, the chunk stays raw.
    let mut c = stage::build("compress").unwrap();
    let t = Instant::now();
    for i in 0..32u64 {
        gen_fill(i, 0, &mut buf[..chunk]);
        let mut h = ChunkHeader::data(0, 0, 0, chunk as u32, u64::MAX, CheckAlg::Crc32c);
        h.seal(&buf[..chunk]);
        c.process(Chunk {
            header: &mut h,
            buf: &mut buf,
        })
        .unwrap();
        assert!(!h.has(flags::COMPRESSED));
    }
    println!(
        "compress (rand) {:6.2} GB/s incl. gen+seal, copied {} bytes",
        gbps(32 * chunk as u64, t.elapsed()),
        c.copied_bytes()
    );

    // exec: a process per chunk.
    let mut e = stage::build("exec:cat").unwrap();
    let t = Instant::now();
    for _ in 0..16 {
        let mut h = ChunkHeader::data(0, 0, 0, chunk as u32, u64::MAX, CheckAlg::Crc32c);
        h.seal(&buf[..chunk]);
        e.process(Chunk {
            header: &mut h,
            buf: &mut buf,
        })
        .unwrap();
    }
    let el = t.elapsed();
    println!(
        "exec:cat        {:6.2} GB/s ({:.2} ms per 4 MiB chunk)",
        gbps(16 * chunk as u64, el),
        el.as_secs_f64() * 1000.0 / 16.0
    );
}

/// Stages and the assembler fed arbitrary (even inconsistent) headers and payloads return
/// errors, never panic, and never report success on a payload that does not verify.
#[test]
fn arbitrary_chunks_never_panic() {
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut compressed = vec![0u8; 4096];
    let mut h0 = ChunkHeader::data(0, 0, 0, 3000, u64::MAX, CheckAlg::Crc32c);
    compressed[..3000].copy_from_slice(&text(3000, 1));
    h0.seal(&compressed[..3000]);
    stage::build("compress")
        .unwrap()
        .process(Chunk {
            header: &mut h0,
            buf: &mut compressed,
        })
        .unwrap();
    assert!(h0.has(flags::COMPRESSED));
    let mut stages: Vec<Box<dyn Stage>> = ["verify", "compress", "decompress"]
        .iter()
        .map(|s| stage::build(s).unwrap())
        .collect();
    for i in 0..20_000u32 {
        let cap = (rnd() % 5000) as usize;
        let mut buf: Vec<u8> = (0..cap).map(|_| rnd() as u8).collect();
        // Some cases start from a real compressed payload, possibly damaged.
        if i % 3 == 0 && cap >= h0.payload_len as usize {
            let n = h0.payload_len as usize;
            buf[..n].copy_from_slice(&compressed[..n]);
            if i % 2 == 0 && n > 0 {
                let at = (rnd() as usize) % n;
                buf[at] ^= 1 << (rnd() % 8);
            }
        }
        let r = rnd();
        let alg = [CheckAlg::None, CheckAlg::Crc32c, CheckAlg::Xxh3][(r % 3) as usize];
        let mut h = ChunkHeader {
            seq: rnd() % 4,
            object: (rnd() % 2) as u32,
            flags: (rnd() % 16) as u16,
            check_alg: alg,
            offset: rnd() % 10_000,
            payload_len: (rnd() % 6000) as u32,
            raw_len: if i % 3 == 0 {
                h0.raw_len
            } else {
                (rnd() % 6000) as u32
            },
            checksum: 0,
            object_len: if rnd() % 2 == 0 {
                u64::MAX
            } else {
                rnd() % 20_000
            },
        };
        if i % 3 == 0 {
            h.flags = flags::COMPRESSED;
            h.payload_len = h0.payload_len;
        }
        // Mostly sealed correctly over what is there, sometimes not.
        let plen = (h.payload_len as usize).min(buf.len());
        if rnd() % 4 != 0 {
            h.checksum = alg.checksum(&buf[..plen]);
        }
        for st in stages.iter_mut() {
            let before = h;
            if st
                .process(Chunk {
                    header: &mut h,
                    buf: &mut buf,
                })
                .is_ok()
                && h != before
            {
                // A stage that changed the chunk must have sealed it properly.
                h.verify(&buf).unwrap();
            }
        }
        let mut asm = Assembler::new(Box::new(sink::DiscardSink::default()));
        let _ = asm.accept(&h, &buf);
    }
}
