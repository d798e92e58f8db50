#!/usr/bin/env bash
# Unmodified socket programs on srdma's rsockets (`srdma exec --rsockets`) against the same
# programs on kernel TCP, alternating in the same minutes: Debian's sockperf (ping-pong
# latency), iperf3 (one stream's throughput) and redis-benchmark against redis-server
# (GET and SET requests per second, 50 clients). Prints each run's figures, then the
# medians and the ratios rsockets / TCP (latency: TCP / rsockets is the speed-up; the
# table gives rsockets / TCP for latency, lower is better).
#
# Usage: benchmarks/rsockets.sh [ROUNDS]       (root: makes network namespaces)
#   NET=host (default): both programs in one fresh network namespace, on 127.0.0.1;
#   NET=veth: two namespaces joined by veth (MTU=1500 by default), 10.197.0.1 <-> .2.
#   SECS=3 (seconds per sockperf / iperf3 run), REQS=100000 (redis-benchmark -n).
#   SRDMA=path/to/srdma (default: target/release/srdma, built with the drop-in library and
#   libsrdma_rspreload.so beside it).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
ROUNDS=${1:-3}
NET=${NET:-host}
MTU=${MTU:-1500}
SECS=${SECS:-3}
REQS=${REQS:-100000}
SRDMA=${SRDMA:-$ROOT/target/release/srdma}
if [ -z "${SKIP_BUILD:-}" ] && [ "$SRDMA" = "$ROOT/target/release/srdma" ]; then
    (cd "$ROOT" && cargo build --release -q -p srdma-cli -p srdma-verbs -p srdma-rspreload)
fi
for t in sockperf iperf3 redis-server redis-benchmark redis-cli; do
    command -v $t >/dev/null || { echo "needs $t (apt-get install sockperf iperf3 redis-server redis-tools)" >&2; exit 2; }
done

NA=srdma-rsb-a NB=srdma-rsb-b
cleanup() {
    ip netns del $NA 2>/dev/null || true
    ip netns del $NB 2>/dev/null || true
}
trap 'kill $(jobs -p) 2>/dev/null || true; cleanup' EXIT
cleanup
ip netns add $NA
ip -n $NA link set lo up
if [ "$NET" = veth ]; then
    ip netns add $NB
    ip -n $NB link set lo up
    ip link add va netns $NA mtu "$MTU" type veth peer name vb netns $NB mtu "$MTU"
    ip -n $NA addr add 10.197.0.1/24 dev va
    ip -n $NB addr add 10.197.0.2/24 dev vb
    ip -n $NA link set va up
    ip -n $NB link set vb up
    SRV=(ip netns exec $NA) CLI=(ip netns exec $NB) ADDR=10.197.0.1
    sleep 1
else
    SRV=(ip netns exec $NA) CLI=(ip netns exec $NA) ADDR=127.0.0.1
fi
PORT=$((24000 + RANDOM % 1000))
OUT=$(mktemp -d)

# The command prefix of mode $1: rs runs the program under `srdma exec --rsockets`.
pre() {
    if [ "$1" = rs ]; then P=(env SRDMA_RS_REPORT="$OUT/report" "$SRDMA" exec --rsockets); else P=(); fi
}

# Waits (10 s at most) until something listens on TCP port $1 in the server's namespace.
wait_listen() {
    for _ in $(seq 200); do
        [ -n "$("${SRV[@]}" ss -Hltn "sport = :$1" 2>/dev/null)" ] && return 0
        sleep 0.05
    done
    echo "nothing listens on $1" >&2
    return 1
}

# Stops server $1 (its process group: srdma exec may have a child).
stop() {
    kill "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}

# Each run gets its own port ($2; the runs are subshells, so the caller counts).
sockperf_run() {
    local mode=$1 PORT=$2
    pre $mode
    "${SRV[@]}" "${P[@]}" sockperf sr --tcp -i $ADDR -p $PORT >/dev/null 2>&1 &
    local s=$!
    wait_listen $PORT
    "${CLI[@]}" "${P[@]}" sockperf pp --tcp -i $ADDR -p $PORT -t $SECS >"$OUT/sockperf" 2>&1 || true
    sed -n 's/.*avg-latency=\([0-9.]*\).*/\1/p' "$OUT/sockperf" | head -1
    sed -n 's/.*percentile 50.000 = *\([0-9.]*\).*/\1/p' "$OUT/sockperf" | head -1 >"$OUT/p50"
    grep -q avg-latency "$OUT/sockperf" || { echo "sockperf $mode failed:" >&2; tail -5 "$OUT/sockperf" >&2; }
    stop $s
}

iperf_run() {
    local mode=$1 PORT=$2
    pre $mode
    "${SRV[@]}" "${P[@]}" iperf3 -s -1 -p $PORT >/dev/null 2>&1 &
    local s=$!
    wait_listen $PORT
    "${CLI[@]}" "${P[@]}" iperf3 -c $ADDR -p $PORT -t $SECS -J 2>/dev/null |
        python3 -c "import json,sys; d=json.load(sys.stdin); print(round(d['end']['sum_received']['bits_per_second']/1e9, 2))"
    stop $s
}

redis_run() {
    local mode=$1 PORT=$2
    pre $mode
    "${SRV[@]}" "${P[@]}" redis-server --port $PORT --save '' --appendonly no --protected-mode no --bind $ADDR >/dev/null 2>&1 &
    local s=$!
    wait_listen $PORT
    "${CLI[@]}" "${P[@]}" redis-benchmark -h $ADDR -p $PORT -t get,set -n $REQS --csv 2>/dev/null |
        python3 -c "
import csv, sys
r = {row[0]: row[1] for row in csv.reader(sys.stdin) if len(row) > 1}
print(r.get('SET', '0'), r.get('GET', '0'))"
    "${CLI[@]}" redis-cli -h $ADDR -p $PORT shutdown nosave >/dev/null 2>&1 || true
    stop $s
}

echo "srdma: $SRDMA; NET=$NET${NET:+ }$([ "$NET" = veth ] && echo "MTU=$MTU"); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A R
for i in $(seq "$ROUNDS"); do
    for mode in tcp rs; do
        PORT=$((PORT + 3))
        R[lat_$mode]+=" $(sockperf_run $mode $PORT)"
        R[p50_$mode]+=" $(cat "$OUT/p50")"
        R[bw_$mode]+=" $(iperf_run $mode $((PORT + 1)))"
        read -r set get < <(redis_run $mode $((PORT + 2)))
        R[set_$mode]+=" $set"
        R[get_$mode]+=" $get"
        echo "round $i $mode: sockperf ${R[lat_$mode]##* } us (median ${R[p50_$mode]##* }), iperf3 ${R[bw_$mode]##* } Gbit/s, redis SET $set GET $get req/s"
    done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "${R[lat_tcp]}" "${R[lat_rs]}" "${R[p50_tcp]}" "${R[p50_rs]}" "${R[bw_tcp]}" "${R[bw_rs]}" "${R[set_tcp]}" "${R[set_rs]}" "${R[get_tcp]}" "${R[get_rs]}" <<'EOF'
import statistics, sys
v = [[float(x) for x in a.split()] for a in sys.argv[1:]]
names = [("sockperf ping-pong latency (us)", "rsockets/TCP, lower is better"),
         ("sockperf median latency (us)", "rsockets/TCP, lower is better"),
         ("iperf3 one stream (Gbit/s)", "rsockets/TCP"),
         ("redis-benchmark SET (req/s)", "rsockets/TCP"),
         ("redis-benchmark GET (req/s)", "rsockets/TCP")]
print(f"{'':34} {'TCP median [range]':>24} {'rsockets median [range]':>26} {'ratio':>7}")
for i, (n, note) in enumerate(names):
    t, r = v[2 * i], v[2 * i + 1]
    mt, mr = statistics.median(t), statistics.median(r)
    ratio = mr / mt if mt else float('nan')
    rng = lambda a: f"{statistics.median(a):.2f} [{min(a):.2f}-{max(a):.2f}]"
    print(f"{n:34} {rng(t):>24} {rng(r):>26} {ratio:>7.2f}  ({note})")
EOF
echo "rsockets reports (every process, the kernel sockets they fell back to: to_kernel):"
grep -c "fallbacks=0" "$OUT/report" | sed 's/^/  processes with no fallback: /'
grep -v "fallbacks=0" "$OUT/report" | grep -v "connected=0 accepted=0" | sed 's/^/  /' || true
rm -rf "$OUT"
