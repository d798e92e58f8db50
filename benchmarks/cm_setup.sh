#!/usr/bin/env bash
# rdma_cm connection setup time: `rping -C 1`, nine connections (the first of each run pays
# for cold caches), between two lab guests (interop/lab, qemu), once with kernel rxe on both
# and once with srdma's drop-in librdmacm on both (rxe unloaded in the guests). The
# handshake is timed on the bridge's capture: REQ -> REP (passive side), REP -> RTU (active
# side), REQ -> RTU; and as the client sees it, from rdma_connect to the ESTABLISHED event
# (benchmarks/cm_shim.c, LD_PRELOADed; on the server it times rdma_accept).
#
# Each pair runs twice: with the guests' address-space randomization as booted, and with it
# off. qemu's TCG translates guest code per (physical page, virtual address), so a new
# process whose libraries land at new random addresses has every user-space instruction it
# runs translated again. That costs kernel rxe little (librdmacm and the rxe provider are
# thin; the kernel, at fixed addresses, does the work) and srdma much (its CM and engine run
# in the process): with randomization off, translations carry over from one rping to the
# next, as a real CPU's caches would not care. Both are reported.
# Usage: benchmarks/cm_setup.sh   (root; builds the release library)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
LAB="$ROOT/interop/lab"
OUT="$LAB/cache/setup-time"
(cd "$ROOT" && cargo build --release -q -p srdma-verbs)
rm -rf "$OUT"
for aslr in on off; do
    mkdir -p "$OUT/$aslr/rxe" "$OUT/$aslr/srdma/dl"
    cc -shared -fPIC -o "$OUT/$aslr/rxe/cm_shim.so" "$ROOT/benchmarks/cm_shim.c" -ldl
    cp "$OUT/$aslr/rxe/cm_shim.so" "$OUT/$aslr/srdma/cm_shim.so"
    for n in libibverbs.so.1 librdmacm.so.1; do
        cp "$ROOT/target/release/libibverbs.so" "$OUT/$aslr/srdma/dl/$n"
    done
done
PREP='cp /lab/cm_shim.so /tmp/;'
SERVER='for i in 1 2 3 4 5 6 7 8 9; do env LD_PRELOAD=/tmp/cm_shim.so rping -s -a $RXELAB_A -C 1 -v; done'
CLIENT='for i in 1 2 3 4 5 6 7 8 9; do sleep 1; retry 40 0.2 env LD_PRELOAD=/tmp/cm_shim.so rping -c -a $RXELAB_A -C 1 -v; done'
# The library from the guest's memory (tmpfs), as an installed one, not from the 9p share.
SRDMA_ENV='rmmod rdma_rxe; cp -r /lab/dl /tmp/dl; export LD_LIBRARY_PATH=/tmp/dl SRDMA_DEVICES=$RXELAB_IP TMPDIR=/tmp;'
cd "$LAB"
for aslr in on off; do
    P="$PREP"
    [ "$aslr" = off ] && P="echo 0 > /proc/sys/kernel/randomize_va_space; $PREP"
    O="$OUT/$aslr"
    ./run.sh -q -t 90 -o "$O/rxe" -w "$O/rxe.pcap" -a "$P $SERVER" -b "$P $CLIENT" > "$O/rxe.log" 2>&1
    ./run.sh -q -t 90 -o "$O/srdma" -w "$O/srdma.pcap" -e rxelab.rxe=0 \
        -a "$SRDMA_ENV $P $SERVER" -b "$SRDMA_ENV $P $CLIENT" > "$O/srdma.log" 2>&1
    for s in rxe srdma; do
        echo "$s <-> $s, address-space randomization $aslr:"
        python3 "$ROOT/benchmarks/cm_times.py" "$O/$s.pcap"
        python3 "$ROOT/benchmarks/cm_connect_times.py" "$O/$s/out-B.txt"
    done
done
