#!/usr/bin/env bash
# Long READs by kernel rxe from a reader slower than srdma (README, "READ responses toward a
# slower reader"): Debian's ib_read_bw on rxe in a TCG guest of the lab (interop/lab) reads
# SIZE-byte messages, ITERS of them, from
#
#   1. rxe in a second guest (the baseline: a responder as slow as the reader), and
#   2. srdma on the host (`srdma exec ib_read_bw`, the drop-in),
#
# in the same run, RUNS times, alternating. Each row: the reader's average MB/s, the seconds
# the whole guest command took, and rxe's completer_retry_err on the reader (its
# retransmission timer fired: responses were lost). Every perftest side uses -u 18 (a 1.07 s
# QP timeout, as the interop scenarios do: a TCG guest starved of the CPU otherwise fires
# its timer spuriously).
#
# Usage: sudo benchmarks/read_rxe.sh [SIZE] [ITERS]     (default 4194304 10; RUNS=3)
#        SRDMA_BIN=PATH  use this srdma binary (its directory must hold libibverbs.so)
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LAB=$ROOT/interop/lab
SIZE=${1:-4194304}
ITERS=${2:-10}
OUT=${READ_RXE_OUT:-$LAB/cache/read_rxe}   # the guests' outputs (not kept in git)
mkdir -p "$OUT"
[ "$(id -u)" = 0 ] || { echo "read_rxe.sh: run as root (network namespace, taps)" >&2; exit 1; }
"$LAB/setup.sh" > "$OUT/setup.log" 2>&1 || { tail -20 "$OUT/setup.log"; exit 1; }
command -v ib_read_bw >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq perftest >/dev/null
if [ -n "${SRDMA_BIN:-}" ]; then
    S=$SRDMA_BIN
else
    (cd "$ROOT" && cargo build --release -q -p srdma-cli -p srdma-verbs) || exit 1
    S=$ROOT/target/release/srdma
fi
PT="ib_read_bw -u 18 -x 1 -s $SIZE -n $ITERS"
# The reader's guest command: counters before and after, the time it took.
reader() { # SERVER
    echo "rxe-counters > /lab/cnt-before; t0=\$(date +%s.%N); retry 80 0.5 $PT -d rxe0 $1; rc=\$?; \
t1=\$(date +%s.%N); rxe-counters-diff /lab/cnt-before > /lab/cnt-diff; \
echo \"SECONDS \$(echo \"\$t1 \$t0\" | awk '{printf \"%.1f\", \$1 - \$2}')\"; exit \$rc"
}
row() { # NAME DIR
    local bw secs retries
    bw=$(awk -v s="$SIZE" '$1 == s {print $4}' "$2/out-$3.txt" | tail -n1)
    secs=$(sed -n 's/^SECONDS //p' "$2/out-$3.txt")
    retries=$(sed -n 's/^completer_retry_err: .*(+\([0-9]*\))$/\1/p' "$2/cnt-diff")
    echo "| $1 | ${bw:-failed} | ${secs:-n/a} | ${retries:-0} |"
}
echo "Long READs by rxe ($PT), $(date -u '+%Y-%m-%d %H:%M UTC'), $(cd "$ROOT" && git rev-parse --short HEAD)"
echo
echo "| responder | MB/s (average) | seconds | reader's completer_retry_err |"
echo "|---|---|---|---|"
for r in $(seq 1 "${RUNS:-3}"); do
    d=$OUT/rxe-$r
    "$LAB/run.sh" -q -n 2 -o "$d" -t 240 -a "$(reader 10.77.0.3)" -b "$PT -d rxe0" >"$d.log" 2>&1
    row "rxe (guest B)" "$d" A
    d=$OUT/srdma-$r
    "$LAB/run.sh" -q -o "$d" -t 240 -a "$(reader 10.77.0.1)" -H "$S exec --device 10.77.0.1 $PT" \
        >"$d.log" 2>&1
    row "srdma (host)" "$d" A
done
