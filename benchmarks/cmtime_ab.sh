#!/usr/bin/env bash
# Alternating runs of Debian's `cmtime` (rdma_cm connection set-up and tear-down) through two
# srdma binaries (A, B, A, B, …) on this host, for before/after figures on this noisy VM:
# one line per run with cmtime's connect and disconnect totals, the rejections and errors
# it printed, and how the server ended (143: killed by this script at the end, as it should;
# 139: it crashed).
#
# Usage: benchmarks/cmtime_ab.sh A B RUNS CONNECTIONS
#   e.g. benchmarks/cmtime_ab.sh old/srdma target/release/srdma 4 10000
# Each run has a network namespace of its own (only `lo`, 127.0.0.1). Root.
set -euo pipefail
[ $# -eq 4 ] || { sed -n '2,10p' "$0"; exit 2; }
A=$1 B=$2 RUNS=$3 N=$4
command -v cmtime >/dev/null || { echo "needs cmtime (apt-get install rdmacm-utils)" >&2; exit 2; }
NS=srdma-cmab-$$
OUT=$(mktemp -d)
cleanup() { ip netns del $NS 2>/dev/null || true; rm -rf "$OUT"; }
trap cleanup EXIT

# One run of binary $2 (labelled $1).
run() {
    ip netns del $NS 2>/dev/null || true
    ip netns add $NS
    ip -n $NS link set lo up
    ip netns exec $NS "$2" exec cmtime -b 127.0.0.1 -c "$N" >"$OUT/server" 2>&1 &
    local sp=$!
    sleep 1
    local rc=0
    timeout 300 ip netns exec $NS "$2" exec cmtime -s 127.0.0.1 -c "$N" >"$OUT/client" 2>&1 || rc=$?
    kill $sp 2>/dev/null || true
    local srv=0
    wait $sp 2>/dev/null || srv=$?
    local conn disc bad
    conn=$(awk '/^connect +:/{print $3}' "$OUT/client")
    disc=$(awk '/^disconnect +:/{print $3}' "$OUT/client")
    bad=$(grep -c 'REJECTED\|error' "$OUT/client" || true)
    echo "$1 connect=${conn:-n/a}ms disconnect=${disc:-n/a}ms rejected/errors=$bad client_rc=$rc server_rc=$srv"
}

for _ in $(seq "$RUNS"); do
    run A "$A"
    run B "$B"
done
