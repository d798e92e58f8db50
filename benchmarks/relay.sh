#!/usr/bin/env bash
# srdma-relay chain throughput over network namespaces (issue 6 benchmarks).
#
# Builds the release binary, creates its own namespaces (a bridge in a "wire" namespace and
# six hosts 10.199.0.1-6 with veth links, MTU 9000), and runs `srdma relay node` processes,
# one per host, as chains of 1, 3 and 5 hops (hop = link: a 3-hop chain is source, two
# relays, sink). Each pass runs every chain with every host's eth0 limited by tbf to the same
# rate, once per rate in RATES, then unlimited. The target: a 3-hop and a 5-hop chain deliver
# to the last sink at >= 0.9x the throughput of the 1-hop chain of the same pass and rate.
# Relays run a read-only "verify" stage; the user-space bytes they copy are counted from
# their JSON reports.
#
# Why 200mbit: the links must be the bottleneck, not the CPU. A 5-hop chain is six node
# processes on this 2-core machine, and every byte is sent and received five times; the
# unlimited 5-hop row shows what the cores can forward (about 35-40 MB/s when this was
# written), so the limit must sit below it: 200mbit is 25 MB/s. 500mbit (62.5 MB/s) is also
# run, to show where the CPU becomes the bound.
#
# Writes benchmarks/results/relay.md (or $OUT). Needs root, ip, tc and jq.
# Exit status: 0 done (whether or not the targets are met: the table says), 1 a failure,
# 77 skipped (cannot make namespaces here; the reason is printed).
#
# Knobs (environment): SIZE (256MiB), RATES ("200mbit 500mbit": one limited series per
# rate; RATE=X for just one), CHUNK (1MiB), SLOTS (8),
# FORWARD (send | write-imm), PASSES (2), HOPS ("1 3 5"), MTU (9000), OUT, CARGO_TARGET_DIR,
# SRDMA_BIN (run this binary instead of building one).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=relay_lab.sh
. "$ROOT/benchmarks/relay_lab.sh"
SIZE=${SIZE:-256MiB}
RATES=${RATES:-${RATE:-200mbit 500mbit}}
CHUNK=${CHUNK:-1MiB}
SLOTS=${SLOTS:-8}
FORWARD=${FORWARD:-send}
PASSES=${PASSES:-2}
HOPS=${HOPS:-"1 3 5"}
MTU=${MTU:-9000}
OUT=${OUT:-$ROOT/benchmarks/results/relay.md}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
RUN_LIMIT=${RUN_LIMIT:-300}   # seconds any one chain may take before it counts as failed

skip() { echo "relay.sh: SKIPPED: $*" >&2; exit 77; }
die() { echo "relay.sh: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || skip "not root (network namespaces need CAP_NET_ADMIN)"
[ "${SRDMA_SKIP_NETNS:-}" = 1 ] && skip "SRDMA_SKIP_NETNS=1"
for t in ip tc jq; do command -v "$t" >/dev/null || skip "\`$t\` not installed"; done

if [ -n "${SRDMA_BIN:-}" ]; then
    BIN=$SRDMA_BIN
    BIN_NOTE="\`$BIN\` (given as SRDMA_BIN, built $(date -u -r "$BIN" '+%Y-%m-%d %H:%M UTC' 2>/dev/null))"
else
    BIN_NOTE="built by relay.sh from the working tree (cargo build --release -p srdma-cli)"
    echo "relay.sh: building the release binary" >&2
    (cd "$ROOT" && CARGO_TARGET_DIR=$TARGET_DIR cargo build --release -q -p srdma-cli) || die "build failed"
    BIN=$TARGET_DIR/release/srdma
fi
[ -x "$BIN" ] || die "no binary at $BIN"

max_hops=0
for h in $HOPS; do if [ "$h" -gt "$max_hops" ]; then max_hops=$h; fi; done
NHOSTS=$((max_hops + 1))
PREFIX="srb$$"
WIRE="$PREFIX-w"
WORK=$(mktemp -d /tmp/srdma-relay-bench.XXXXXX)
PIDS=()

# Kills the node processes of the current run: bash (timing) -> timeout -> srdma.
kill_nodes() {
    local p t
    for p in "${PIDS[@]}"; do
        for t in $(pgrep -P "$p" 2>/dev/null); do
            pkill -9 -P "$t" 2>/dev/null || true
            kill -9 "$t" 2>/dev/null || true
        done
        kill -9 "$p" 2>/dev/null || true
    done
}

cleanup() {
    kill_nodes
    for ((i = 0; i < NHOSTS; i++)); do ip netns del "$PREFIX-$i" 2>/dev/null || true; done
    ip netns del "$WIRE" 2>/dev/null || true
    if [ -n "${KEEP_WORK:-}" ]; then echo "relay.sh: kept $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

addr() { echo "10.199.0.$(($1 + 1))"; }

relay_lab_up

# tbf on every host's eth0: each hop of a chain is one host sending to the next, so every
# link of the chain is limited to RATE. The burst must hold at least one jumbo frame and
# RATE/HZ; 512 kB does both up to 4 Gbit/s at HZ=1000. 50 ms of queue at RATE.
limit_all() {
    for ((i = 0; i < NHOSTS; i++)); do
        tc -n "$PREFIX-$i" qdisc replace dev eth0 root tbf rate "$1" burst 512kb latency 50ms
    done
}
unlimit_all() {
    for ((i = 0; i < NHOSTS; i++)); do
        tc -n "$PREFIX-$i" qdisc del dev eth0 root 2>/dev/null || true
    done
}

# Datagrams lost inside the lab so far, all hosts together: "TBF RCVBUF" (drops of the tbf
# queues, and UDP datagrams refused because a socket's receive buffer was full).
lab_drops() {
    local i tbf=0 rcv=0 d r
    for ((i = 0; i < NHOSTS; i++)); do
        d=$(tc -n "$PREFIX-$i" -s qdisc show dev eth0 | sed -n 's/.*dropped \([0-9]*\).*/\1/p' | head -1)
        r=$(ip netns exec "$PREFIX-$i" awk '/^Udp:/ { if (!h) { for (k = 1; k <= NF; k++) c[$k] = k; h = 1 } else print $c["RcvbufErrors"] }' /proc/net/snmp)
        tbf=$((tbf + ${d:-0}))
        rcv=$((rcv + ${r:-0}))
    done
    echo "$tbf $rcv"
}

# Runs a chain of $1 hops; results in $WORK/run-$2/. Sets STATUS to "ok" or "failed".
run_chain() {
    local hops=$1 dir=$WORK/run-$2 i
    mkdir -p "$dir"
    relay_chain_config "$hops" "$dir/relay.toml"
    PIDS=()
    # Leaves first, so every listener is up before its parent connects.
    for ((i = hops; i >= 0; i--)); do
        ip netns exec "$PREFIX-$i" bash -c \
            'TIMEFORMAT="%U %S"; { time timeout -s KILL "$5" "$1" relay node --config "$2" --name "$3" --json >"$4.json" 2>"$4.err"; } 2>"$4.cpu"' \
            _ "$BIN" "$dir/relay.toml" "n$i" "$dir/n$i" "$RUN_LIMIT" &
        PIDS+=($!)
    done
    local start=$EPOCHREALTIME p tbf0 rcv0 tbf1 rcv1
    read -r tbf0 rcv0 < <(lab_drops)
    STATUS=ok
    # `timeout` kills a node after RUN_LIMIT s, so a hung chain cannot stall the benchmark.
    for p in "${PIDS[@]}"; do wait "$p" || STATUS=failed; done
    PIDS=()
    read -r tbf1 rcv1 < <(lab_drops)
    echo "$((tbf1 - tbf0)) $((rcv1 - rcv0))" >"$dir/drops"
    awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f\n", b - a }' >"$dir/wall"
}

# The final report line of node $2 in run directory $1.
report() { jq -c 'select(.event == "report")' "$1/$2.json" 2>/dev/null | tail -1; }

# One result row: pass, hops, limit label, run dir, 1-hop throughput of the pass (or "").
# Sets THR to this run's last-sink throughput in MB/s.
row() {
    local pass=$1 hops=$2 label=$3 dir=$4 base=$5 status=$6 sink rep bytes secs ratio met
    local copied=0 fwd=0 cpu=0 wall i r c f u s copies
    sink="n$hops"
    rep=$(report "$dir" "$sink")
    THR=""
    if [ "$status" != ok ] || [ -z "$rep" ] || [ "$(jq -r .ok <<<"$rep")" != true ]; then
        local why
        why=$(tail -c 300 "$dir/$sink.err" 2>/dev/null | tr '\n|' '  ')
        printf '| %s | %s | %s | FAILED | | | | | %s |\n' "$pass" "$hops" "$label" "${why:-no report}"
        return
    fi
    bytes=$(jq -r .bytes <<<"$rep")
    secs=$(jq -r .seconds <<<"$rep")
    THR=$(awk -v b="$bytes" -v s="$secs" 'BEGIN { printf "%.1f", (s > 0 ? b / s / 1e6 : 0) }')
    for ((i = 1; i < hops; i++)); do
        r=$(report "$dir" "n$i")
        c=$(jq -r '.copied_bytes // 0' <<<"$r")
        f=$(jq -r '.forwarded_bytes // 0' <<<"$r")
        copied=$((copied + c))
        fwd=$((fwd + f))
    done
    for ((i = 0; i <= hops; i++)); do
        read -r u s <"$dir/n$i.cpu" || true
        cpu=$(awk -v a="$cpu" -v u="${u:-0}" -v s="${s:-0}" 'BEGIN { print a + u + s }')
    done
    wall=$(cat "$dir/wall")
    if [ "$hops" -eq 1 ]; then
        ratio="1.00"
        met="(baseline)"
        copies="(no relay)"
    else
        ratio=$(awk -v t="$THR" -v b="$base" 'BEGIN { printf "%.2f", (b > 0 ? t / b : 0) }')
        met=$(awk -v r="$ratio" 'BEGIN { print (r >= 0.9 ? "MET" : "NOT MET") }')
        copies=$(awk -v c="$copied" -v f="$fwd" \
            'BEGIN { if (f > 0) printf "%d / %d = %.4f %%", c, f, 100 * c / f; else printf "%d / 0", c }')
    fi
    local retx=0 tbfd rcvd
    for ((i = 0; i <= hops; i++)); do
        r=$(report "$dir" "n$i")
        retx=$((retx + $(jq -r '.retransmissions // 0' <<<"$r")))
    done
    read -r tbfd rcvd <"$dir/drops"
    printf '| %s | %s | %s | %s | %s | %s | %s | %.1f s (%.2f cores over %s s) | %s retransmissions; %s tbf drops, %s receive-buffer drops |\n' \
        "$pass" "$hops" "$label" "$THR" "$ratio" "$met" "$copies" "$cpu" \
        "$(awk -v c="$cpu" -v w="$wall" 'BEGIN { print (w > 0 ? c / w : 0) }')" "$wall" "$retx" "$tbfd" "$rcvd"
}

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
ROWS=$WORK/rows
: >"$ROWS"
n=0
for ((pass = 1; pass <= PASSES; pass++)); do
    for mode in $RATES unlimited; do
        if [ "$mode" != unlimited ]; then limit_all "$mode"; label="tbf $mode"; else unlimit_all; label="unlimited"; fi
        base=""
        for hops in $HOPS; do
            n=$((n + 1))
            echo "relay.sh: pass $pass, $label, $hops hop(s)" >&2
            run_chain "$hops" "$n"
            row "$pass" "$hops" "$label" "$WORK/run-$n" "$base" "$STATUS" >>"$ROWS"
            if [ "$hops" -eq 1 ]; then base=${THR:-0}; fi
            tail -1 "$ROWS" >&2
        done
    done
done
unlimit_all
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

mkdir -p "$(dirname "$OUT")"
{
    # No heading: benchmarks/run.sh embeds this file under its own.
    echo "**srdma-relay: chain throughput in network namespaces.**"
    echo
    echo "Written by \`benchmarks/relay.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'), commit \`$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)\`."
    echo
    echo "| | |"
    echo "|---|---|"
    echo "| CPU | $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores |"
    echo "| Load average | $LOAD_BEFORE before, $LOAD_AFTER after (1, 5, 15 min; other jobs share the machine) |"
    echo "| Kernel | \`$(uname -r)\` |"
    echo "| Rust | \`$(rustc --version 2>/dev/null)\`, release profile |"
    echo "| Binary | $BIN_NOTE |"
    echo "| Object | \`gen:$SIZE\` from the source, \`discard\` at the sink (after its verify stage) |"
    echo "| Transfer | chunk $CHUNK, $SLOTS slots per ring, forward = $FORWARD, relays run \`verify\` |"
    echo "| Links | veth + bridge, MTU $MTU; limited runs: tbf at each of $RATES on every host's eth0 |"
    echo
    echo "Command: \`SIZE=$SIZE RATES=\"$RATES\" CHUNK=$CHUNK SLOTS=$SLOTS FORWARD=$FORWARD PASSES=$PASSES benchmarks/relay.sh\`"
    echo
    echo "A hop is a link: the 1-hop chain is source -> sink, the 3-hop chain has two relays, the"
    echo "5-hop chain four. Last-sink throughput is the sink's report: bytes / seconds, in MB/s"
    echo "(10^6 B/s). The ratio is to the 1-hop chain of the same pass and link setting; the"
    echo "target (issue 6) is >= 0.9. Relay copies: user-space bytes copied / bytes forwarded,"
    echo "summed over the relays from their reports (target <= 1 %). CPU: user + system seconds"
    echo "of every node process together, and that divided by the wall time of the run. Notes:"
    echo "retransmissions summed over the nodes' reports; datagrams the tbf queues dropped and"
    echo "that UDP sockets refused with a full receive buffer, all hosts, during the run."
    echo
    echo "Why these rates: the links must be the bottleneck for the ratio to measure the relays."
    echo "A 5-hop chain is six node processes on $(nproc) cores, and every byte is sent and"
    echo "received five times; the unlimited 5-hop rows show what the cores can forward. A rate"
    echo "below that (200mbit = 25 MB/s) is link-bound; a rate above it measures the CPU."
    echo
    echo "Summary (every pass must reach 0.9× for MET; FAILED runs count as not met):"
    echo
    echo "| links | hops | × 1-hop, each pass | ≥ 0.9× |"
    echo "|---|---:|---|---|"
    awk -F'|' '{
        gsub(/^ +| +$/, "", $3); gsub(/^ +| +$/, "", $4); gsub(/^ +| +$/, "", $6)
        if ($3 == 1) next
        k = $4 " | " $3
        if (!(k in seen)) { seen[k] = 1; order[++n] = k; ok[k] = 1 }
        r[k] = r[k] (r[k] == "" ? "" : ", ") ($6 == "" ? "FAILED" : $6)
        if ($6 == "" || $6 + 0 < 0.9) ok[k] = 0
    } END {
        for (i = 1; i <= n; i++) { k = order[i]; printf "| %s | %s | %s |\n", k, r[k], (ok[k] ? "MET" : "NOT MET") }
    }' "$ROWS"
    echo
    echo "| pass | hops | links | last-sink MB/s | × 1-hop | ≥ 0.9× | relay copied / forwarded | CPU | notes |"
    echo "|---:|---:|---|---:|---:|---|---|---|---|"
    cat "$ROWS"
} >"$OUT"
echo "relay.sh: wrote $OUT" >&2
cat "$OUT"
