#!/usr/bin/env bash
# Alternating runs of two srdma binaries (A, B, A, B, …) of one `srdma perf` test, for
# before/after figures on this noisy VM: each run's client JSON gives a line with the
# figures that test reports, and `--baseline tcp|udp` in the arguments adds the kernel
# baseline of the same run.
#
# Usage: benchmarks/ab.sh A B RUNS PERF_ARGS...
#   e.g. benchmarks/ab.sh old/srdma new/srdma 4 write-bw -s 1048576 -D 3 --baseline tcp
# NET=veth MTU=1500 (default): two network namespaces joined by veth (root);
# NET=lo: loopback, 127.203.0.1 <-> 127.203.0.2.
set -euo pipefail
[ $# -ge 4 ] || { sed -n '2,10p' "$0"; exit 2; }
A=$1 B=$2 RUNS=$3
shift 3
NET=${NET:-veth}
MTU=${MTU:-1500}
if [ "$NET" = veth ]; then
    NA=srdma-ab-a NB=srdma-ab-b
    cleanup() { ip netns del $NA 2>/dev/null || true; ip netns del $NB 2>/dev/null || true; }
    trap cleanup EXIT
    cleanup
    ip netns add $NA
    ip netns add $NB
    ip link add va netns $NA mtu "$MTU" type veth peer name vb netns $NB mtu "$MTU"
    ip -n $NA addr add 10.196.0.1/24 dev va
    ip -n $NB addr add 10.196.0.2/24 dev vb
    for ns in $NA $NB; do ip -n $ns link set lo up; done
    ip -n $NA link set va up
    ip -n $NB link set vb up
    CLI=(ip netns exec $NA) SRV=(ip netns exec $NB) CA=10.196.0.1 SA=10.196.0.2
else
    CLI=() SRV=() CA=127.203.0.2 SA=127.203.0.1
fi
PORT=$((23000 + RANDOM % 1000))
ARGS=("$@")

# One run of binary $2 (labelled $1): the server with the same arguments (perf checks that
# they match), the client's figures on one line.
run() {
    PORT=$((PORT + 1))
    "${SRV[@]}" "$2" perf "${ARGS[@]}" -p $PORT --bind $SA >/dev/null 2>&1 &
    sleep 0.5
    "${CLI[@]}" "$2" perf "${ARGS[@]}" -p $PORT --bind $CA --json $SA 2>/dev/null |
        LABEL=$1 python3 -c "
import json, os, sys
d = json.load(sys.stdin)
keys = ('bw_avg_mib_s', 'msg_rate_mpps', 't_typical_us', 'cpu_s_per_gb_local', 'cpu_s_per_gb_remote')
def fmt(r): return ' '.join(f'{k}={round(r[k], 3)}' for k in keys if r.get(k) is not None)
line = os.environ['LABEL'] + ' ' + fmt(d['results'][0])
b = (d.get('baseline') or {}).get('results') or []
if b: line += ' | baseline ' + fmt(b[0])
print(line)"
    wait
}

for _ in $(seq "$RUNS"); do
    run A "$A"
    run B "$B"
done
