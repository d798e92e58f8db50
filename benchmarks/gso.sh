#!/usr/bin/env bash
# RC WRITE bandwidth between two hosts (network namespaces joined by veth, MTU 1500: path MTU
# 1024) with UDP GSO off (SRDMA_GSO=never, one datagram per send) and on (SRDMA_GSO=always,
# what the default does), and
# one TCP stream between the same namespaces in the same run (`srdma perf --baseline tcp`).
# Root (namespaces). RUNS repetitions (default 2), DURATION seconds each (default 3).
# Prints a table and writes benchmarks/results/gso.md.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUNS=${RUNS:-2}
DUR=${DURATION:-3}
(cd "$ROOT" && cargo build --release -q -p srdma-cli)
S=$ROOT/target/release/srdma
A=srdma-gso-a
B=srdma-gso-b
cleanup() { ip netns del $A 2>/dev/null || true; ip netns del $B 2>/dev/null || true; }
trap cleanup EXIT
cleanup
ip netns add $A
ip netns add $B
ip link add va netns $A mtu 1500 type veth peer name vb netns $B mtu 1500
ip -n $A addr add 10.198.0.1/24 dev va
ip -n $B addr add 10.198.0.2/24 dev vb
for ns in $A $B; do ip -n $ns link set lo up; done
ip -n $A link set va up
ip -n $B link set vb up
PORT=19300

# One measurement: mode (never|always), size, extra client args; prints the client's JSON.
run() {
    PORT=$((PORT + 1))
    ip netns exec $B env SRDMA_GSO="$1" "$S" perf write-bw -s "$2" -D "$DUR" -p $PORT \
        --bind 10.198.0.2 ${3:-} >/dev/null 2>&1 &
    sleep 0.5
    ip netns exec $A env SRDMA_GSO="$1" "$S" perf write-bw -s "$2" -D "$DUR" -p $PORT \
        --bind 10.198.0.1 ${3:-} --json 10.198.0.2 2>/dev/null
    wait
}
field() { python3 -c "import json,sys; r=json.load(sys.stdin)['results']; print(' '.join(str(round(x['$1'], 2)) for x in r))"; }

rows=()
for size in 65536 1048576; do
    for _ in $(seq "$RUNS"); do
        off=$(run never $size | field bw_avg_mib_s)
        on_json=$(run always $size "--baseline tcp")
        on=$(echo "$on_json" | field bw_avg_mib_s)
        cpu=$(echo "$on_json" | field cpu_s_per_gb_local)
        tcp=$(echo "$on_json" | python3 -c "import json,sys; d=json.load(sys.stdin); b=d.get('baseline') or {}; r=(b.get('results') or [{}])[0]; print(round(r.get('bw_avg_mib_s', 0), 1))")
        rows+=("| $size | $off | $on | $cpu | $tcp |")
    done
done
{
    echo "RC WRITE between two namespaces over veth MTU 1500 (path MTU 1024), $(date -u +%Y-%m-%d), $(nproc) cores, $DUR s each ($0):"
    echo
    echo "| size | GSO off, SRDMA_GSO=never (MiB/s) | GSO on, the default (MiB/s) | CPU s/GB (on) | one TCP stream, same run (MiB/s) |"
    echo "| --- | --- | --- | --- | --- |"
    printf '%s\n' "${rows[@]}"
} | tee "$ROOT/benchmarks/results/gso.md"
