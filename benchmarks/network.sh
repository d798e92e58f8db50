#!/usr/bin/env bash
# srdma on a shared, lossy, crowded network (the network issue's checks), beside TCP in the
# same run:
#
#   1. loss: two namespaces on a veth (MTU 1500); an nftables `numgen random` rule drops a
#      share of the datagrams the sender's output sends (RoCEv2 and TCP alike; it sees GSO
#      super-packets, so one drop can take a burst). `srdma perf write-bw -s 1MiB` against
#      one TCP stream (`--baseline tcp`), with selective repeat (the default between srdma
#      peers: ECE agreed) and without it (SRDMA_ECE=0: go-back-N, as toward rxe); then on the
#      clean veth `srdma perf read-bw` of 1 MiB and 64 MiB (--mtu 1024) beside TCP, with the
#      reader's UDP receive-buffer drops.
#   2. incast: N sender namespaces and a receiver on a bridge whose port toward the receiver
#      is a RATE bottleneck: tbf alone (drop-tail), or tbf with ECN marking. N `srdma perf
#      write-bw -s 1MiB` pairs at once, then N TCP streams at once (tcp_incast.py). Sum,
#      Jain's index, the least flow, the bottleneck's queue (its tbf backlog, sampled every
#      50 ms while the load runs, as time at the rate: mean and largest), and an 8 B `srdma
#      perf send-lat -e` across the loaded bottleneck against the same unloaded, at the
#      default priority and at SCHED_FIFO (`chrt -f 1`: the figure of the network's queue
#      without the 2 cores' run queue). The srdma loaders and the ping-pong sleep on a
#      completion channel (`-e`), as TCP's block in the kernel: 16 processes busy-polling
#      their CQs on 2 cores measure the scheduler, not the queue (the ping-pong then waits
#      milliseconds for a core; see README). This machine's kernel has no RED (nor netem,
#      codel, pie: tbf and htb are its only qdiscs), so the marking is a phantom queue (HULL,
#      Alizadeh et al., NSDI 2012): an nftables rule on the bridge marks ECN-capable
#      datagrams CE once the port's traffic runs above 97 % of the rate for more than a
#      burst of 32 frames (`limit rate over ... burst 32 packets ip ecn set ce`), which keeps
#      the real queue short as a RED threshold would. The senders' veths segment UDP GSO
#      themselves in this variant (ethtool -K c0 tx-udp-segmentation off), so that the rule
#      sees frames.
#   3. many QPs: Debian's `ib_write_bw -q N -t 16 -s 65536 -n ITERS` through `srdma exec` on
#      127.0.0.1, 8 GiB in all (at least 32 messages per QP), over shared memory and over UDP
#      (SRDMA_SHM=0), against its 1-QP figure.
#   4. connections: Debian's `cmtime -c N` through `srdma exec` on 127.0.0.1.
#
# Raw outputs go to benchmarks/results/network/; the summary replaces the block between
# `<!-- network.sh:begin -->` and `<!-- network.sh:end -->` of benchmarks/README.md.
#
# Knobs: SRDMA_BIN (use this binary; its directory must hold libibverbs.so), DURATION (4 s per
# measurement), LOSSES ("0 1 10 100", per 10000), INCAST ("4 8 16"), RATE (1gbit), QPS
# ("1 256 1024 4096 10000"), QP_BYTES (8 GiB), CONNS ("1000 10000"), SKIP_LOSS=1,
# SKIP_INCAST=1, SKIP_QPS=1, SKIP_CM=1. Root (namespaces, tc, nft); installs what it needs with apt-get.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/benchmarks/readme_block.sh"
RES=$ROOT/benchmarks/results/network
README=$ROOT/benchmarks/README.md
DUR=${DURATION:-4}
RATE=${RATE:-1gbit}
# The bottleneck's rate in bytes per second.
RATE_BYTES=$(python3 -c "import re,sys; m=re.fullmatch(r'(\d+)([kmg]?)bit', sys.argv[1]); print(int(m[1]) * {'': 1, 'k': 10**3, 'm': 10**6, 'g': 10**9}[m[2]] // 8)" "$RATE" 2>/dev/null) ||
    { echo "RATE: a number and kbit, mbit, gbit or bit (e.g. 1gbit), not $RATE" >&2; exit 2; }
P=srdmanet$$
mkdir -p "$RES"
log() { echo "== $*" >&2; }
[ "$(id -u)" = 0 ] || { echo "network.sh: run as root" >&2; exit 1; }

need=()
command -v jq >/dev/null || need+=(jq)
command -v nft >/dev/null || need+=(nftables)
command -v ethtool >/dev/null || need+=(ethtool)
command -v tc >/dev/null || need+=(iproute2)
command -v ib_write_bw >/dev/null || need+=(perftest)
command -v cmtime >/dev/null || need+=(rdmacm-utils)
if [ ${#need[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null 2>&1
fi
if [ -n "${SRDMA_BIN:-}" ]; then
    S=$SRDMA_BIN
else
    log "building srdma and the drop-in library --release"
    (cd "$ROOT" && cargo build --release -q -p srdma-cli -p srdma-verbs) || exit 1
    S=$ROOT/target/release/srdma
fi

NSS=()
cleanup() {
    for n in "${NSS[@]:-}"; do [ -n "$n" ] && ip netns del "$n" 2>/dev/null; done
    return 0
}
trap cleanup EXIT INT TERM
ns_add() { ip netns add "$1" && NSS+=("$1") && ip -n "$1" link set lo up; }
OUT=()
say() { OUT+=("$*"); echo "$*" >&2; }
jn() { jq -r "$1" "$2" 2>/dev/null; }

# ------------------------------------------------------------------------------- 1. loss
loss() {
    local a=${P}la b=${P}lb
    ns_add $a; ns_add $b
    ip link add va netns $a type veth peer name vb netns $b
    ip -n $a addr add 10.79.0.1/24 dev va; ip -n $b addr add 10.79.0.2/24 dev vb
    ip -n $a link set va up; ip -n $b link set vb up
    say ""
    say "### Goodput under random loss (veth MTU 1500, \`srdma perf write-bw -s 1MiB -D $DUR --baseline tcp\`)"
    say ""
    say "| drops | srdma, selective repeat | srdma, go-back-N | one TCP stream | SR / TCP | GBN / TCP | SR retransmitted | SR timeouts |"
    say "|---|---|---|---|---|---|---|---|"
    for c in ${LOSSES:-0 1 10 100}; do
        ip netns exec $a nft flush ruleset
        if [ "$c" != 0 ]; then
            ip netns exec $a nft add table ip lossy
            ip netns exec $a nft add chain ip lossy out '{ type filter hook output priority 0; }'
            ip netns exec $a nft add rule ip lossy out ip daddr 10.79.0.2 numgen random mod 10000 '<' "$c" drop
        fi
        for mode in sr gbn; do
            local envs=""
            [ $mode = gbn ] && envs="SRDMA_ECE=0"
            ip netns exec $b env $envs "$S" perf write-bw --bind 10.79.0.2 -s 1048576 -D "$DUR" --baseline tcp \
                >"$RES/loss-$c-$mode.server.txt" 2>&1 &
            sleep 1
            timeout 120 ip netns exec $a env $envs "$S" perf write-bw --bind 10.79.0.1 -s 1048576 -D "$DUR" \
                --baseline tcp --json 10.79.0.2 >"$RES/loss-$c-$mode.json" 2>"$RES/loss-$c-$mode.err"
            wait
        done
        local f=$RES/loss-$c
        local sr gbn tcp
        sr=$(jn '.results[0].bw_avg_mib_s' $f-sr.json)
        gbn=$(jn '.results[0].bw_avg_mib_s' $f-gbn.json)
        tcp=$(jn '.baseline.results[0].bw_avg_mib_s' $f-sr.json)
        say "| $(awk "BEGIN{printf \"%.2f %%\", $c/100}") | $(printf '%.0f' "${sr:-0}") MiB/s | $(printf '%.0f' "${gbn:-0}") MiB/s | $(printf '%.0f' "${tcp:-0}") MiB/s | $(awk "BEGIN{printf \"%.2f\", ${sr:-0}/(${tcp:-0}+1e-9)}") | $(awk "BEGIN{printf \"%.2f\", ${gbn:-0}/(${tcp:-0}+1e-9)}") | $(jn '.qp_counters.retransmitted_pkts' $f-sr.json) | $(jn '.congestion[0].timeouts' $f-sr.json) |"
    done
    # Long READs on the clean link: a READ's responses are not flow-controlled; srdma sends
    # a long one as READ requests of a segment each (README, "Long READs in segments").
    ip netns exec $a nft flush ruleset
    say ""
    say "### Long READs (the same veth, no drops, \`srdma perf read-bw -s SIZE --mtu 1024 -D $DUR --baseline tcp\`)"
    say ""
    say "| READ size | srdma, selective repeat | srdma, go-back-N | one TCP stream | SR / TCP | GBN / TCP | reader's socket drops (SR, GBN) | SR timeouts |"
    say "|---|---|---|---|---|---|---|---|"
    local size mode f drops
    for size in 1048576 67108864; do
        f=$RES/read-$size
        drops=""
        for mode in sr gbn; do
            local envs=""
            [ $mode = gbn ] && envs="SRDMA_ECE=0"
            local d0 d1
            d0=$(ip netns exec $a awk '/^Udp:/{n++} n==2 && /^Udp:/{print $6; exit}' /proc/net/snmp)
            ip netns exec $b env $envs "$S" perf read-bw --bind 10.79.0.2 -s $size --mtu 1024 -D "$DUR" \
                --baseline tcp >"$f-$mode.server.txt" 2>&1 &
            sleep 1
            timeout 120 ip netns exec $a env $envs "$S" perf read-bw --bind 10.79.0.1 -s $size --mtu 1024 \
                -D "$DUR" --baseline tcp --json 10.79.0.2 >"$f-$mode.json" 2>"$f-$mode.err"
            wait
            d1=$(ip netns exec $a awk '/^Udp:/{n++} n==2 && /^Udp:/{print $6; exit}' /proc/net/snmp)
            drops+="$((d1 - d0)) "
        done
        sr=$(jn '.results[0].bw_avg_mib_s' $f-sr.json)
        gbn=$(jn '.results[0].bw_avg_mib_s' $f-gbn.json)
        tcp=$(jn '.baseline.results[0].bw_avg_mib_s' $f-sr.json)
        say "| $((size >> 20)) MiB | $(printf '%.0f' "${sr:-0}") MiB/s | $(printf '%.0f' "${gbn:-0}") MiB/s | $(printf '%.0f' "${tcp:-0}") MiB/s | $(awk "BEGIN{printf \"%.2f\", ${sr:-0}/(${tcp:-0}+1e-9)}") | $(awk "BEGIN{printf \"%.2f\", ${gbn:-0}/(${tcp:-0}+1e-9)}") | ${drops% } | $(jn '.congestion[0].timeouts' $f-sr.json) |"
    done
    ip netns del $a; ip netns del $b
}

# ------------------------------------------------------------------------------- 2. incast
# backlog SWITCH_NS FILE: appends the bottleneck's tbf backlog (bytes) every 50 ms until killed.
backlog() {
    while :; do
        tc -n "$1" -s qdisc show dev psv 2>/dev/null | sed -n 's/^ *backlog \([0-9]*\)b.*/\1/p' | head -1 >>"$2"
        sleep 0.05
    done
}

# incast N RED(0|1): prints one table row.
incast() {
    local n=$1 red=$2
    local sw=${P}sw sv=${P}sv
    ns_add $sw; ns_add $sv
    ip -n $sw link add br0 type bridge; ip -n $sw link set br0 up
    ip link add sv0 netns $sv type veth peer name psv netns $sw
    ip -n $sv addr add 10.78.0.100/24 dev sv0; ip -n $sv link set sv0 up
    ip -n $sw link set psv master br0 up
    tc -n $sw qdisc add dev psv root handle 1: tbf rate "$RATE" burst 64k latency 2ms
    if [ "$red" = 1 ]; then
        # The phantom queue: drained at 97 % of the rate in full-MTU RoCEv2 frames (1082 B
        # with the Ethernet header: a 1024 B payload, BTH, ICRC), marks CE past a burst of 32
        # of them. nft's byte-rate limit keeps a whole second of tokens, too much to mark
        # anything in a run; its packet-rate limit keeps the burst asked for, so the senders'
        # veths segment GSO super-packets themselves (the switch must see frames, not
        # 64 kB super-packets).
        local pps
        pps=$((RATE_BYTES * 97 / 100 / 1082))
        printf '%s\n' "table bridge aqm {" "  chain forward {" \
            "    type filter hook forward priority 0;" \
            "    oifname \"psv\" ip ecn != not-ect limit rate over $pps/second burst 32 packets ip ecn set ce" \
            "  }" "}" | ip netns exec $sw nft -f -
    fi
    for i in $(seq 0 "$n"); do
        ns_add ${P}c$i
        ip link add c0 netns ${P}c$i type veth peer name pc$i netns $sw
        ip -n ${P}c$i addr add 10.78.0.$((i + 1))/24 dev c0; ip -n ${P}c$i link set c0 up
        ip -n $sw link set pc$i master br0 up
        [ "$red" = 1 ] && ip netns exec ${P}c$i ethtool -K c0 tx-udp-segmentation off >/dev/null
    done
    local tag=incast-$n-$([ "$red" = 1 ] && echo red || echo tbf)
    # The 8 B ping-pong from c0 (the extra sender) to the receiver's host, unloaded first,
    # then across the loaded bottleneck: each end sleeps on its completion channel (-e), as
    # the loaders do; once at the default priority, once at SCHED_FIFO (chrt -f 1, both ends),
    # which takes the 2 cores' run queue out of the figure and leaves the network's.
    local lat0 lat1 lat0f lat1f
    probe() { # PORT OUT.json [PREFIX...]: one 1 s ping-pong, its server started here
        local port=$1 out=$2 spid
        shift 2
        ip netns exec $sv "$@" "$S" perf send-lat -e --bind 10.78.0.100 -p "$port" -s 8 -D 1 >/dev/null 2>&1 &
        spid=$!
        sleep 0.3
        timeout 60 ip netns exec ${P}c0 "$@" "$S" perf send-lat -e --bind 10.78.0.1 -p "$port" -s 8 -D 1 \
            --json 10.78.0.100 >"$out" 2>"${out%.json}.err"
        wait $spid
        jn '.results[0].t_typical_us' "$out"
    }
    lat0=$(probe 18498 "$RES/$tag-lat0.json")
    lat0f=$(probe 18499 "$RES/$tag-lat0f.json" chrt -f 1)
    # The srdma loaders run 2 s longer than DUR: the two loaded ping-pongs fit in their run.
    local ldur=$((DUR + 2))
    for i in $(seq 1 "$n"); do
        ip netns exec $sv "$S" perf write-bw --bind 10.78.0.100 -p $((18514 + i)) -s 1048576 -D "$ldur" \
            >"$RES/$tag-srv$i.txt" 2>&1 &
    done
    sleep 2
    local pids=()
    for i in $(seq 1 "$n"); do
        timeout $((4 * ldur + 60)) ip netns exec ${P}c$i "$S" perf write-bw -e --bind 10.78.0.$((i + 1)) \
            -p $((18514 + i)) -s 1048576 -D "$ldur" --json 10.78.0.100 >"$RES/$tag-cli$i.json" \
            2>"$RES/$tag-cli$i.err" &
        pids+=($!)
    done
    sleep 1
    rm -f "$RES/$tag-queue.txt" "$RES/$tag-tqueue.txt"
    backlog $sw "$RES/$tag-queue.txt" &
    local sampler=$!
    lat1=$(probe 18500 "$RES/$tag-lat1.json")
    lat1f=$(probe 18501 "$RES/$tag-lat1f.json" chrt -f 1)
    kill $sampler 2>/dev/null
    local fails=0
    for p in "${pids[@]}"; do wait "$p" || fails=$((fails + 1)); done
    wait
    local T=$ROOT/benchmarks/tcp_incast.py
    for i in $(seq 1 "$n"); do
        ip netns exec $sv python3 "$T" server 10.78.0.100 $((19514 + i)) "$DUR" >"$RES/$tag-tsrv$i.txt" &
    done
    sleep 1
    for i in $(seq 1 "$n"); do
        ip netns exec ${P}c$i python3 "$T" client 10.78.0.100 $((19514 + i)) "$DUR" >/dev/null &
    done
    sleep 2
    backlog $sw "$RES/$tag-tqueue.txt" &
    sampler=$!
    sleep $((DUR > 3 ? DUR - 2 : 1))
    kill $sampler 2>/dev/null
    wait
    python3 - "$RES" "$tag" "$n" "$fails" "${lat0:-0}" "${lat1:-0}" "$red" "$RATE_BYTES" "${lat0f:-0}" "${lat1f:-0}" <<'PY' >>"$RES/rows.txt"
import json, sys
res, tag, n, fails, red = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[7] == "1"
rate = int(sys.argv[8])
def num(x):
    try:
        return float(x)
    except ValueError:
        return 0.0
lat0, lat1, lat0f, lat1f = num(sys.argv[5]), num(sys.argv[6]), num(sys.argv[9]), num(sys.argv[10])
def queue(f):
    try:
        b = [int(x) for x in open(f"{res}/{f}").read().split()]
    except Exception:
        b = []
    if not b:
        return "n/a"
    us = lambda v: v / rate * 1e6
    return f"{us(sum(b) / len(b)):.0f} / {us(max(b)):.0f} µs"
s, cuts, rtos, cnps = [], 0, 0, 0
for i in range(1, n + 1):
    try:
        j = json.load(open(f"{res}/{tag}-cli{i}.json"))
        s.append(j["results"][0]["bw_avg_mib_s"])
        for c in j.get("congestion", []):
            cuts += c["loss_cuts"] + c["delay_cuts"]; rtos += c["timeouts"]; cnps += c["cnps"]
    except Exception:
        s.append(0.0)
t = []
for i in range(1, n + 1):
    try:
        t.append(float(open(f"{res}/{tag}-tsrv{i}.txt").read() or 0))
    except Exception:
        t.append(0.0)
jain = lambda x: (sum(x) ** 2) / (len(x) * sum(v * v for v in x)) if sum(x) > 0 else 0
def lat_pair(a, b):
    return f"{a:.1f} → {b:.1f} µs ({b / a:.2f}×)" if a > 0 and b > 0 else "n/a"
lat = f"{lat_pair(lat0, lat1)} | {lat_pair(lat0f, lat1f)}"
print(f"| {n}→1, {'ECN marking' if red else 'drop-tail'} | {sum(s):.0f} MiB/s | {jain(s):.3f} | {min(s):.0f} | {fails} | {cuts} / {rtos} / {cnps} | {queue(f'{tag}-queue.txt')} | {sum(t):.0f} MiB/s | {jain(t):.3f} | {queue(f'{tag}-tqueue.txt')} | {lat} |")
PY
    for i in $(seq 0 "$n"); do ip netns del ${P}c$i; done
    ip netns del $sv; ip netns del $sw
}

# ------------------------------------------------------------------------------- 3. QPs
# qps N SHM: prints "MB/s" of ib_write_bw -q N (or FAILED). Iterations, not -D: each QP
# moves QP_BYTES / N (at least 32 messages), so that with 10,000 QPs sharing the link fairly
# every QP finishes its signaled batches (with -D, none would within seconds, and perftest
# would report 0 iterations for a run that moved gigabytes).
qps() {
    local n=$1 shm=$2 ns=${P}q
    local iters=$(( ${QP_BYTES:-8589934592} / 65536 / n ))
    [ "$iters" -lt 32 ] && iters=32
    ns_add $ns
    ip netns exec $ns env SRDMA_SHM="$shm" "$S" exec ib_write_bw -q "$n" -t 16 -s 65536 -n "$iters" -F \
        >"$RES/qps-$n-$shm.server.txt" 2>&1 &
    sleep 2
    timeout 300 ip netns exec $ns env SRDMA_SHM="$shm" "$S" exec ib_write_bw -q "$n" -t 16 -s 65536 \
        -n "$iters" -F 127.0.0.1 >"$RES/qps-$n-$shm.txt" 2>&1
    local rc=$?
    wait
    ip netns del $ns
    # Each QP's addresses (three lines per QP per side) say nothing the summary needs.
    sed -i '/address: LID\|^ GID:/d' "$RES/qps-$n-$shm.txt" "$RES/qps-$n-$shm.server.txt"
    local bw
    bw=$(awk '/#bytes/{getline; print $4}' "$RES/qps-$n-$shm.txt")
    if [ $rc != 0 ] || [ -z "$bw" ]; then echo "FAILED"; else echo "$bw"; fi
}

# ------------------------------------------------------------------------------- 4. cmtime
cm() {
    local n=$1 ns=${P}cm
    ns_add $ns
    ip netns exec $ns "$S" exec cmtime -b 127.0.0.1 -c "$n" >"$RES/cm-$n.server.txt" 2>&1 &
    local sp=$!
    sleep 1
    timeout 600 ip netns exec $ns "$S" exec cmtime -s 127.0.0.1 -c "$n" >"$RES/cm-$n.txt" 2>&1
    local rc=$?
    kill $sp 2>/dev/null; wait $sp 2>/dev/null
    local srv_rc=$?
    ip netns del $ns
    local conn disc rej
    conn=$(awk '/^connect +:/{print $3}' "$RES/cm-$n.txt")
    disc=$(awk '/^disconnect +:/{print $3}' "$RES/cm-$n.txt")
    rej=$(grep -c "REJECTED\|error" "$RES/cm-$n.txt")
    local crash=no
    grep -qi "segmentation\|core dumped" "$RES/cm-$n.server.txt" && crash=yes
    [ "$srv_rc" = 139 ] && crash=yes
    say "| $n | ${conn:-n/a} ms | $(awk "BEGIN{if (\"${conn:-0}\"+0>0) printf \"%.0f\", $n/(${conn:-1}/1000); else print \"n/a\"}") /s | ${disc:-n/a} ms | $rej | $rc | $crash |"
}

START=$(date -u '+%Y-%m-%d %H:%M UTC')
COMMIT=$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ "${SKIP_LOSS:-0}" = 1 ] || loss
if [ "${SKIP_INCAST:-0}" != 1 ]; then
    : >"$RES/rows.txt"
    for n in ${INCAST:-4 8 16}; do
        for red in 0 1; do
            log "incast $n red=$red"
            incast "$n" "$red"
        done
    done
    say ""
    say "### Incast through a $RATE bottleneck (\`srdma perf write-bw -e -s 1MiB -D $((DUR + 2))\` per sender; TCP: one stream per sender for $DUR s; queue: the bottleneck's backlog as time at the rate; 8 B \`srdma perf send-lat -e\` typical, at the default priority and at SCHED_FIFO)"
    say ""
    say "| senders | srdma sum | Jain | least flow (MiB/s) | failed | cuts / timeouts / CNPs | queue, mean / largest | TCP sum | TCP Jain | TCP queue | 8 B send-lat unloaded → loaded | the same, SCHED_FIFO |"
    say "|---|---|---|---|---|---|---|---|---|---|---|---|"
    while read -r row; do say "$row"; done <"$RES/rows.txt"
fi
if [ "${SKIP_QPS:-0}" != 1 ]; then
    say ""
    say "### Many QPs (\`srdma exec ib_write_bw -q N -t 16 -s 65536 -n 8GiB/64KiB/N\` (≥ 32), 127.0.0.1)"
    say ""
    say "| QPs | shared memory (MB/s) | ratio to 1 QP | UDP (MB/s) | ratio to 1 QP |"
    say "|---|---|---|---|---|"
    base1=""; base0=""
    for n in ${QPS:-1 256 1024 4096 10000}; do
        log "ib_write_bw -q $n"
        a=$(qps "$n" 1); b=$(qps "$n" 0)
        [ -z "$base1" ] && base1=$a && base0=$b
        r1=$(awk "BEGIN{if (\"$a\"+0>0 && \"$base1\"+0>0) printf \"%.2f\", $a/$base1; else print \"-\"}")
        r0=$(awk "BEGIN{if (\"$b\"+0>0 && \"$base0\"+0>0) printf \"%.2f\", $b/$base0; else print \"-\"}")
        say "| $n | $a | $r1 | $b | $r0 |"
    done
fi
if [ "${SKIP_CM:-0}" != 1 ]; then
    say ""
    say "### rdma_cm connections (\`srdma exec cmtime -c N\`, 127.0.0.1)"
    say ""
    say "| connections | connect | rate | disconnect | rejected/errors | client exit | server crashed |"
    say "|---|---|---|---|---|---|---|"
    for n in ${CONNS:-1000 10000}; do
        log "cmtime -c $n"
        cm "$n"
    done
fi

BLOCK=$(
    echo "<!-- network.sh:begin -->"
    echo "Run of $START on $COMMIT ($(nproc) CPUs; \`benchmarks/network.sh\`, raw outputs in benchmarks/results/network/)."
    printf '%s\n' "${OUT[@]}"
    echo "<!-- network.sh:end -->"
)
printf '%s\n' "$BLOCK" >"$RES/block.md"
readme_block network.sh "$RES/block.md" "$README"
log "done"
