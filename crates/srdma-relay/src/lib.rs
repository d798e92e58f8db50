//! srdma-relay: distribute data from one source through chains and trees of relays to sinks,
//! over srdma's RDMA, processing it in place at every hop.
//!
//! ```text
//!   A (source)                      B (relay)                          C (sink)
//!   fill staging slot i%W            ring: W slots in one MR            ring: W slots
//!   (header + payload, sealed)
//!   WRITE_WITH_IMM(imm=i) ─────────▶ slot i%W   RECV_RDMA_WITH_IMM
//!                                   decode, stages in place (verify…)
//!                                   SEND_WITH_IMM(imm=i) ────────────▶ posted receive = slot i%W
//!                                   from the same slot, no copy        decode, stages, verify,
//!                                                                      digest, write to the sink
//!                                   ◀──────────────── credit i: 0-byte SEND_WITH_IMM(imm=i)
//!                                   forward completed + credit back
//!   credit i ◀────────────────────  0-byte SEND_WITH_IMM(imm=i)
//! ```
//!
//! One configuration file ([`config`]) describes the transfer and every node; each node runs
//! as its own process ([`node::run()`], `srdma relay node --config FILE --name NAME`).
//!
//! # Data path
//!
//! * **Rings.** Every node but the source registers one memory region of `slots` slots;
//!   a slot holds a 64-byte [`chunk::ChunkHeader`] and a payload area of
//!   [`config::Config::payload_capacity`] bytes (the largest any node's stages need, so a
//!   chunk fits every ring it passes). Before accepting its parent's connection a node posts
//!   one receive per slot, each scattering into its slot; the CM REP carries the ring
//!   descriptor as private data (`"SRR1"`, address, R_Key, length, slots, slot size; big
//!   endian). The parent's REQ carries the parent's name, and a node refuses any other caller.
//! * **Sending.** Chunk `seq` always travels into slot `seq % slots` with `imm = seq` (low 32
//!   bits). The source frames chunks in its own staging region (gen and file sources fill the
//!   slot directly; stdin is read into a buffer first and that copy is counted) and writes them
//!   with RDMA WRITE_WITH_IMM. Relays forward from the slot the chunk arrived in, to every
//!   child: SEND_WITH_IMM (`forward = "send"`, the data lands in the child's posted receive,
//!   which is its slot `seq % slots` because receives are reposted in sequence order) or
//!   WRITE_WITH_IMM into the child's slot (`forward = "write-imm"`). Both consume one posted
//!   receive at the child.
//! * **Credits.** One credit per slot and hop. A node returns the credit of chunk `seq` — a
//!   zero-byte SEND_WITH_IMM with `imm = seq` on the connection to its parent, into one of the
//!   `slots` empty receives the parent posted — only after its stages ran on the slot, every
//!   forward from that slot *completed* (RC-acknowledged by each child), any throttle delay
//!   passed, and the slot's receive was reposted. Credits are returned strictly in sequence
//!   order. A sender posts chunk `seq` to a child only while `seq < credits_received +
//!   slots`. Backpressure therefore propagates hop by hop to the source, and each hop's memory
//!   is the ring: `slots × slot size`, no queue grows anywhere.
//! * **Processing.** Stages ([`stage`]) run on the node's own thread, in place on the slot,
//!   while the node holds the device lock of [`srdma::Mr::with_bytes_mut`] (the only safe
//!   access to a region peers may write); the engine's progress thread waits meanwhile.
//!   `verify` checks the chunk's checksum; a relay never copies chunk bytes in user space
//!   (its report's `copied_bytes` counts what its stages copy, e.g. compression's scratch
//!   buffer). Sinks check the chunk checksum, the order of the data, and the object digest
//!   (xxh3-128 over the raw bytes) carried by the `OBJECT_END` chunk; an object is committed
//!   (renamed into place) only when it matches, otherwise aborted (no file remains).
//! * **Waiting.** While chunks move, a node keeps polling its completion queue (yielding the
//!   CPU between polls): every poll drives srdma's engine from the node's thread, with no
//!   hand-off to the engine's progress thread. After 2 ms without progress
//!   (`SRDMA_RELAY_SPIN_US` in the environment changes it) the node arms its CQ, which hands
//!   the device back to the progress thread, and sleeps on its completion channel. Sleeping
//!   at once costs a thread wake-up per chunk: the demo moved 704 MiB/s that way against
//!   960 MiB/s with the 2 ms spin (`SRDMA_RELAY_SPIN_US=0 srdma relay demo`, same machine,
//!   back to back).
//! * **Knobs.** `throttle = "10MiB/s"` holds each slot's credit until the node's byte budget
//!   allows it (a slow consumer; at the source: reads no faster); `flip_bit_at_seq = N` flips one payload bit of chunk N after
//!   the node's stages (so the next check catches it).
//!
//! # Schedules
//!
//! `topology = "tree"` (the default) sends chunks down the tree the `parent` fields draw; a
//! chain is the tree of fan-out one. With many receivers a chain takes `N − 1` chunk steps
//! to fill and a tree of fan-out `f` pays `f` times the bandwidth term (an inner node sends
//! every chunk `f` times). `topology = "binomial"` ([`schedule`]) is the binomial pipeline:
//! every sink also sends, each chunk crosses at most `log2 N + 1` links (plus one per
//! *twin* when the node count is not a power of two), and every node still sends about one
//! chunk per chunk step, so it fills in `log2 N` steps at a chain's bandwidth. Its data path
//! ([`node`]'s `mesh` module) keeps the rings and credits but takes chunks from several
//! partners out of order and releases them in order. Measured with `benchmarks/schedules.sh`
//! (8 sinks over 80 Mbit/s links): 0.79× the chain's completion time for a 2 MiB object,
//! 0.96× for 64 MiB, the binary tree 0.92–2.13×; see benchmarks/README.md. Healing and
//! restarting a sink alone are tree features.
//!
//! # Control and failure reports
//!
//! Every non-source node opens a TCP connection to the source's control port (the source's
//! address, `cm_port + 1`) and reports progress and its final state as JSON lines
//! ([`control`]). The source decides: a node whose control connection closes without a final
//! report died (the failed hop); a node that caught a fault itself (a corrupt chunk, a full
//! disk, a failing stage) names itself; nodes that only lost a neighbour blame that neighbour
//! but yield to a primary report. On the first failure the source sends `abort` to everyone,
//! waits (at most `timeout_ms`) for the reports of every node that connected, and sends the
//! `verdict` (failed hop, error, bytes and commit state of every sink), which every node
//! prints. Everything is bounded: connections are retried until `timeout_ms`, a hop that
//! delivers no chunk or returns no credit for `timeout_ms` is declared dead, and a broken
//! RDMA connection surfaces as an error completion or a CM disconnect.
//!
//! # Healing
//!
//! With `heal = true` (the default) a relay (`role = "relay"`, no sink of its own) that dies or
//! freezes does not end the transfer. The source learns of it on the control channel: a
//! killed process's connection closes at once; a frozen one stops the progress lines every
//! node sends every 200 ms, and is taken as dead after `timeout_ms` of silence (neighbours
//! that lose it meanwhile — an error completion, a CM disconnect, no chunk or credit for
//! `timeout_ms` — drop their connections and wait for the source, at most three times
//! `timeout_ms`). The source then
//!
//! 1. *excludes* the relay (it is told to stop, its later reports are ignored; a frozen
//!    process that wakes up exits),
//! 2. sends `halt` to every other node: each drops all its connections and answers `held`
//!    (a sink: the first chunk it lacks),
//! 3. sends `rewind` with the smallest such chunk and the spliced-out nodes: every node
//!    computes its new parent (the nearest live ancestor, [`config::Config::live_parent`])
//!    and children, accepts and connects again, and the source resends from that chunk.
//!
//! A chain therefore splices, a tree re-parents. Every node rewinds (one protocol for every
//! shape; the rings are small): chunks a sink already holds come again and are skipped (not
//! written, not digested twice), so each sink still commits only a complete object whose
//! digest matches. Nodes that die or freeze during a heal are spliced out in the same way.
//! Every report lists the heals (`healed`: the nodes, the time from the source learning of
//! the failure to the data moving again, the chunk the transfer continued at, the chunks the
//! source sent again) and each sink's `bytes_sent_again`. What cannot be healed around still
//! ends the run with the exact report described above: the source, a sink or a `relay+sink`
//! dying, a stdin source (it cannot be read again), a node failing on its own (a corrupt
//! chunk, a full disk), or a node that does not answer the source.
//!
//! # Resume
//!
//! A `file:` sink with `resume = true` ([`resume`]) writes to `<output>.srdma-part` and keeps
//! `<output>.srdma-partial` beside it: a checksummed bitmap of the chunks durably written
//! (data fsynced first, then the bitmap saved atomically, every half ring of chunks and
//! when the node fails). When the sink fails or is killed, both stay; run the same
//! configuration again (every node) and the sink loads the bitmap, tells the source the first
//! chunk it lacks (`resume` on the control channel), and the source starts the run at the
//! smallest such chunk over all sinks (`start`), announced to every node before any ring is
//! set up, so every ring, credit count and sequence check begins there. The source frames the
//! chunks before the start only to digest them; a resumed sink digests its whole part file
//! when `OBJECT_END` arrives and commits only on a match (otherwise it removes the part file
//! and the state: the next run starts from chunk 0). A damaged or foreign state (checksum,
//! version, fingerprint of source, chunk size and sink, object size, part file size) is
//! discarded with a message and the sink starts from chunk 0; a source whose object changed
//! under the same configuration (a `file:` source rewritten) is caught at the first chunk
//! (its size) or at the end (the digest): the run fails saying so, and the state is
//! discarded, so the next run starts from chunk 0. Reports carry
//! `resumed_from_chunk` and `bytes_sent_again` (bytes a sink received again that an earlier
//! run had already written; the source: the most of any sink, or what it resent itself).
//!
//! A resumable sink (`role = "sink"`, [`config::Config::rejoinable_sinks`]) may also be
//! restarted alone while the rest keeps running, in a chain or a tree: when its process dies
//! (control connection closed without a final report, RDMA connections lost), the source
//! halts every other node as for a heal (each drops its connections and says what it lacks),
//! waits up to `timeout_ms` for a new process of the sink to say where it resumes, tells it
//! where the run continues (`start`, with the heals so far), tells everyone else to set up
//! again from there (`rewind`), re-opens its source (framing the chunks before that point only
//! to digest them) and resends from the smallest chunk any sink lacks (not with a `stdin`
//! source, which cannot be read again). A relay that dies is healed around (above); a sink
//! without `resume`, or a `relay+sink`, that dies still aborts the run as described above.
//!
//! # Reports
//!
//! With `--json` a node prints `{"event":"progress","node":..,"bytes":..,"chunks":..}` about
//! every 200 ms and one final [`report::Report`] line (`"event":"report"`). `throughput_mbps`
//! is in megabits (10^6 bits) per second over the node's first to last chunk; chunk latency is
//! the time from posting a chunk to a child until that child's credit for it returns (at a
//! sink: from arrival to credit return); `retransmissions` is the device's
//! `completer_retry_err`; `copied_bytes` / `forwarded_bytes` give the zero-copy ratio.
//!
//! [`launch`] runs every node of a configuration as child processes (`srdma relay demo`).

pub mod chunk;
pub mod config;
pub mod control;
pub mod digest;
pub mod launch;
pub mod node;
pub mod report;
pub mod resume;
pub mod schedule;
pub mod sink;
pub mod source;
pub mod stage;
