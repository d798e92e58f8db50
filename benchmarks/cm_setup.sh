#!/usr/bin/env bash
# rdma_cm connection setup time: `rping -C 1`, five connections, between two lab guests
# (interop/lab, qemu), once with kernel rxe on both and once with srdma's drop-in librdmacm
# on both (rxe unloaded in the guests). The handshake is timed on the bridge's capture:
# REQ -> REP (passive side), REP -> RTU (active side), REQ -> RTU; and as the client sees
# it, from rdma_connect to the ESTABLISHED event (benchmarks/cm_shim.c, LD_PRELOADed).
# Usage: benchmarks/cm_setup.sh   (root; builds the release library)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
LAB="$ROOT/interop/lab"
OUT="$LAB/cache/setup-time"
(cd "$ROOT" && cargo build --release -q -p srdma-verbs)
rm -rf "$OUT"; mkdir -p "$OUT/rxe" "$OUT/srdma/dl"
cc -shared -fPIC -o "$OUT/rxe/cm_shim.so" "$ROOT/benchmarks/cm_shim.c" -ldl
cp "$OUT/rxe/cm_shim.so" "$OUT/srdma/cm_shim.so"
for n in libibverbs.so.1 librdmacm.so.1; do cp "$ROOT/target/release/libibverbs.so" "$OUT/srdma/dl/$n"; done
SERVER='for i in 1 2 3 4 5; do rping -s -a $RXELAB_A -C 1 -v; done'
CLIENT='cp /lab/cm_shim.so /tmp/; for i in 1 2 3 4 5; do sleep 1; retry 40 0.2 env LD_PRELOAD=/tmp/cm_shim.so rping -c -a $RXELAB_A -C 1 -v; done'
SRDMA_ENV='rmmod rdma_rxe; export LD_LIBRARY_PATH=/lab/dl SRDMA_DEVICES=$RXELAB_IP TMPDIR=/tmp;'
cd "$LAB"
./run.sh -q -t 90 -o "$OUT/rxe" -w "$OUT/rxe.pcap" -a "$SERVER" -b "$CLIENT" > "$OUT/rxe.log" 2>&1
./run.sh -q -t 90 -o "$OUT/srdma" -w "$OUT/srdma.pcap" -e rxelab.rxe=0 \
  -a "$SRDMA_ENV $SERVER" -b "$SRDMA_ENV $CLIENT" > "$OUT/srdma.log" 2>&1
for s in rxe srdma; do
    echo "$s <-> $s:"
    python3 "$ROOT/benchmarks/cm_times.py" "$OUT/$s.pcap"
    python3 "$ROOT/benchmarks/cm_connect_times.py" "$OUT/$s/out-B.txt"
done
