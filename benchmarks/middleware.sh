#!/usr/bin/env bash
# Middleware on srdma against srdma's own tool, in one run on this host (issue 27's speed
# checks):
#
#   1. ucx_perftest -t ucp_put_bw, 1 MiB, over rc_verbs (UCX on the drop-in libibverbs)
#      against srdma perf write-bw, 1 MiB: target >= 0.9x;
#   2. ucx_perftest -t tag_lat, 8 B, against srdma perf send-lat, 8 B (busy-poll both):
#      target <= 1.2x;
#   3. an MPI ping-pong of 8 B (benchmarks/mpi_pingpong.c) over Open MPI's UCX PML on srdma
#      against the same program over Open MPI's TCP BTL (recorded, no target).
#
# Server on 127.204.0.1, client on 127.204.0.2 (SRDMA_DEVICES gives each side its device; the
# MPI ranks share 127.204.0.1). UCX runs with its defaults but for UCX_TLS=rc_verbs,ud_verbs.
# Raw outputs go to benchmarks/results/middleware/; the table is printed and written to
# benchmarks/results/middleware/summary.md.
#
# Needs (Debian): ucx-utils, openmpi-bin, libopenmpi-dev, jq. Knobs: DURATION (seconds per
# srdma perf run, 3), SRDMA_BIN (an srdma binary whose drop-in library lies beside it).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RES=$ROOT/benchmarks/results/middleware
DUR=${DURATION:-3}
A=127.204.0.1
B=127.204.0.2
mkdir -p "$RES"
log() { echo "== $*" >&2; }

for t in ucx_perftest mpicc mpirun jq; do
    command -v $t >/dev/null || { echo "middleware.sh: $t is missing (apt-get install ucx-utils openmpi-bin libopenmpi-dev jq)" >&2; exit 1; }
done
if [ -n "${SRDMA_BIN:-}" ]; then
    SRDMA=$SRDMA_BIN
else
    (cd "$ROOT" && cargo build --release -q -p srdma-cli -p srdma-verbs) || exit 1
    SRDMA=${CARGO_TARGET_DIR:-$ROOT/target}/release/srdma
fi
export UCX_TLS=rc_verbs,ud_verbs
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
PIDS=()
trap 'for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null; done' EXIT

# srdma_perf NAME TEST ARGS...: server on A, client on B; leaves $RES/NAME.json.
srdma_perf() {
    local name=$1 test=$2 port=$((18700 + RANDOM % 200))
    shift 2
    log "srdma perf $test $*"
    "$SRDMA" perf "$test" --bind $A -p $port "$@" >"$RES/$name.server.txt" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 100); do grep -q "Waiting for client" "$RES/$name.server.txt" 2>/dev/null && break; sleep 0.1; done
    "$SRDMA" perf "$test" $A --bind $B -p $port "$@" --json >"$RES/$name.json" 2>"$RES/$name.err" ||
        log "$name FAILED: $(tail -1 "$RES/$name.err")"
    [ -s "$RES/$name.err" ] || rm -f "$RES/$name.err"
    wait "${PIDS[-1]}" 2>/dev/null
}

# ucx NAME ARGS...: ucx_perftest server on A, client on B through srdma exec; prints the final
# figures line (iterations, latency 50%ile/average/overall us, bandwidth average/overall MB/s,
# message rate average/overall).
ucx() {
    local name=$1 port=$((18900 + RANDOM % 200))
    shift
    log "ucx_perftest $*"
    SRDMA_DEVICES=$A "$SRDMA" exec ucx_perftest -p $port >"$RES/$name.server.txt" 2>&1 &
    PIDS+=($!)
    sleep 1
    SRDMA_DEVICES=$B "$SRDMA" exec ucx_perftest $A -p $port "$@" -f >"$RES/$name.txt" 2>&1 ||
        log "$name FAILED: $(tail -1 "$RES/$name.txt")"
    wait "${PIDS[-1]}" 2>/dev/null
    awk 'NF == 8 && $1 ~ /^[0-9]+$/ { l = $0 } END { print l }' "$RES/$name.txt"
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }

srdma_perf write-bw-1m write-bw -s 1048576 -D "$DUR"
srdma_bw=$(jq -r '.results[0].bw_avg_mib_s | floor' "$RES/write-bw-1m.json" 2>/dev/null)
ucx_bw=$(ucx put-bw-1m -t ucp_put_bw -s 1048576 -n 3000 -w 300 | awk '{ print $7 }')

srdma_perf send-lat-8 send-lat -s 8 -D "$DUR"
srdma_lat=$(jq -r '.results[0].t_typical_us * 1000 | round / 1000' "$RES/send-lat-8.json" 2>/dev/null)
ucx_lat=$(ucx tag-lat-8 -t tag_lat -s 8 -n 100000 -w 10000 | awk '{ print $2 }')

PROG=$(mktemp -d)/mpi_pingpong
mpicc -O2 -o "$PROG" "$ROOT/benchmarks/mpi_pingpong.c" || exit 1
log "mpirun over UCX on srdma"
SRDMA_DEVICES=$A "$SRDMA" exec mpirun --oversubscribe -np 2 --mca pml ucx --mca osc ucx \
    -x UCX_TLS=rc_verbs,ud_verbs,self -x LD_LIBRARY_PATH -x SRDMA_DEVICES \
    "$PROG" 8 20000 >"$RES/mpi-ucx.txt" 2>&1 || log "mpi over ucx FAILED"
log "mpirun over TCP"
mpirun --oversubscribe -np 2 --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo \
    "$PROG" 8 20000 >"$RES/mpi-tcp.txt" 2>&1 || log "mpi over tcp FAILED"
mpi_ucx=$(awk '/^pingpong/ { print $5 }' "$RES/mpi-ucx.txt")
mpi_tcp=$(awk '/^pingpong/ { print $5 }' "$RES/mpi-tcp.txt")

{
    echo "| comparison (127.204.0.1 <-> .2, $(date -u +%F)) | middleware | srdma / baseline | ratio | target |"
    echo "| --- | --- | --- | --- | --- |"
    echo "| ucp_put_bw 1 MiB over rc_verbs vs srdma perf write-bw 1 MiB | ${ucx_bw:-n/a} MB/s | ${srdma_bw:-n/a} MiB/s | $(ratio "${ucx_bw:-0}" "${srdma_bw:-0}") | >= 0.9 |"
    echo "| tag_lat 8 B (median) vs srdma perf send-lat 8 B (typical) | ${ucx_lat:-n/a} us | ${srdma_lat:-n/a} us | $(ratio "${ucx_lat:-0}" "${srdma_lat:-0}") | <= 1.2 |"
    echo "| MPI 8 B ping-pong (median half round trip): UCX on srdma vs Open MPI TCP BTL | ${mpi_ucx:-n/a} us | ${mpi_tcp:-n/a} us | $(ratio "${mpi_ucx:-0}" "${mpi_tcp:-0}") | recorded |"
} | tee "$RES/summary.md"
