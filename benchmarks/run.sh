#!/usr/bin/env bash
# srdma perf against kernel sockets and UCX: the issue-5 benchmark, in one script.
#
# On a fresh Debian machine (root, apt-get working) it installs what it compares against
# (jq to read the results, iproute2, ucx-utils for ucx_perftest; a Rust toolchain through
# rustup if cargo is missing), builds srdma --release, then runs `srdma perf` and its
# kernel-socket baselines side by side (two processes each time) and ucx_perftest with
# UCX_TLS=tcp:
#
#   1. over loopback (127.203.0.1 <-> 127.203.0.2, path MTU 4096), twice: with the
#      shared-memory driver (the default between srdma processes of one host) and with
#      SRDMA_SHM=0 (UDP), then the two side by side with a memcpy baseline
#      (benchmarks/memcpy.c, built with gcc);
#   2. between two network namespaces joined by a veth pair, at MTU 1500 (path MTU 1024)
#      and MTU 9000 (path MTU 4096); the namespaces are created here and removed on exit.
#
# Every comparison is a ratio of two figures measured a few seconds apart in the same run.
# Raw outputs go to benchmarks/results/ (one JSON per srdma client, the server's tables, the
# ucx_perftest outputs); the summary replaces the block between `<!-- run.sh:begin -->` and
# `<!-- run.sh:end -->` of benchmarks/README.md (appended if the markers are missing).
# benchmarks/relay.sh, if present and executable, runs last; its benchmarks/results/relay.md
# is included in the block.
#
# Knobs (environment): DURATION seconds per measurement (2), CARGO_TARGET_DIR, SRDMA_BIN (use
# this binary instead of building), SKIP_NETNS=1, SKIP_UCX=1, SKIP_RELAY=1.
# Exit status: 0 when every run completed (targets met or not: the table says), 1 otherwise.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/benchmarks/readme_block.sh"
RES=$ROOT/benchmarks/results
README=$ROOT/benchmarks/README.md
DUR=${DURATION:-2}
NS_A=srdma-bench-a
NS_B=srdma-bench-b
PORT_BASE=18600
mkdir -p "$RES"

log() { echo "== $*" >&2; }
FAILURES=0
NOTES=()
PIDS=()

if [ "$(id -u)" != 0 ]; then
    echo "run.sh: run as root (it installs packages and creates network namespaces)" >&2
    exit 1
fi

cleanup() {
    for p in "${PIDS[@]:-}"; do
        [ -n "$p" ] && kill "$p" 2>/dev/null
    done
    ip netns del "$NS_A" 2>/dev/null
    ip netns del "$NS_B" 2>/dev/null
    return 0
}
trap cleanup EXIT INT TERM

# ---------------------------------------------------------------------------- installing
apt_updated=0
apt_install() {
    if [ $apt_updated = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null 2>&1 || true
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null 2>&1
}
command -v jq >/dev/null || apt_install jq || { echo "run.sh: jq is needed" >&2; exit 1; }
command -v ip >/dev/null || apt_install iproute2
command -v lscpu >/dev/null || apt_install util-linux
command -v gcc >/dev/null || apt_install gcc libc6-dev
HAVE_UCX=0
if [ "${SKIP_UCX:-0}" = 1 ]; then
    NOTES+=("UCX comparison skipped (SKIP_UCX=1).")
elif command -v ucx_perftest >/dev/null; then
    HAVE_UCX=1
elif apt-cache show ucx-utils >/dev/null 2>&1; then
    if apt_install ucx-utils && command -v ucx_perftest >/dev/null; then
        HAVE_UCX=1
    else
        NOTES+=("ucx-utils is in the apt sources but could not be installed: no UCX comparison.")
    fi
else
    NOTES+=("No ucx-utils package in this machine's apt sources: no UCX comparison.")
fi
[ $HAVE_UCX = 0 ] && log "${NOTES[-1]}"
UCX_VERSION=n/a
if [ $HAVE_UCX = 1 ]; then
    UCX_VERSION=$(dpkg-query -W -f '${Version}' ucx-utils 2>/dev/null || ucx_info -v 2>/dev/null | head -1)
fi

# ---------------------------------------------------------------------------- building
if [ -n "${SRDMA_BIN:-}" ]; then
    SRDMA=$SRDMA_BIN
else
    if ! command -v cargo >/dev/null; then
        [ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
    fi
    if ! command -v cargo >/dev/null; then
        log "installing a Rust toolchain with rustup"
        apt_install curl ca-certificates gcc libc6-dev
        curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal >/dev/null 2>&1
        . "$HOME/.cargo/env"
    fi
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
    log "building srdma --release"
    (cd "$ROOT" && cargo build --release -q -p srdma-cli) || { echo "run.sh: build failed" >&2; exit 1; }
    SRDMA=$CARGO_TARGET_DIR/release/srdma
fi
RUSTC=$(rustc --version 2>/dev/null || echo unknown)

# ---------------------------------------------------------------------------- running
NEXT_PORT=$PORT_BASE
# in_ns NS CMD...: runs CMD in namespace NS ("" = this one).
in_ns() {
    local ns=$1
    shift
    if [ -n "$ns" ]; then ip netns exec "$ns" "$@"; else "$@"; fi
}

# srdma_pair NAME NS_SERVER IP_SERVER NS_CLIENT IP_CLIENT TEST ARGS...: runs one test,
# leaves $RES/NAME.json (client, JSON) and $RES/NAME.server.txt (server tables). $PAIR_ENV
# (VAR=VALUE words) goes into both processes' environment.
srdma_pair() {
    local name=$1 nss=$2 ips=$3 nsc=$4 ipc=$5 test=$6
    shift 6
    local port=$NEXT_PORT
    NEXT_PORT=$((NEXT_PORT + 1))
    log "$name: srdma perf $test $*"
    in_ns "$nss" env ${PAIR_ENV:-} timeout 120 "$SRDMA" perf "$test" --bind "$ips" -p "$port" "$@" \
        >"$RES/$name.server.txt" 2>&1 &
    local spid=$!
    PIDS+=("$spid")
    for _ in $(seq 100); do
        grep -q "Waiting for client" "$RES/$name.server.txt" 2>/dev/null && break
        sleep 0.1
    done
    if ! in_ns "$nsc" env ${PAIR_ENV:-} timeout 120 "$SRDMA" perf "$test" "$ips" --bind "$ipc" -p "$port" "$@" --json \
        >"$RES/$name.json" 2>"$RES/$name.client.err"; then
        log "$name FAILED: $(tail -1 "$RES/$name.client.err")"
        FAILURES=$((FAILURES + 1))
        rm -f "$RES/$name.json"
        sleep 1
        kill "$spid" 2>/dev/null
    fi
    wait "$spid" || true
    [ -s "$RES/$name.client.err" ] || rm -f "$RES/$name.client.err"
}

# ucx_pair NAME NS_SERVER IP_SERVER NS_CLIENT TEST SIZE ITERS: leaves $RES/NAME.ucx.txt and
# prints "median_latency_us bandwidth_MBps msgrate" from its final line.
ucx_pair() {
    local name=$1 nss=$2 ips=$3 nsc=$4 test=$5 size=$6 iters=$7
    local port=$NEXT_PORT
    NEXT_PORT=$((NEXT_PORT + 1))
    log "$name: ucx_perftest -t $test -s $size -n $iters"
    UCX_TLS=tcp in_ns "$nss" timeout 120 ucx_perftest -p "$port" >"$RES/$name.ucx-server.txt" 2>&1 &
    local spid=$!
    PIDS+=("$spid")
    sleep 0.5
    UCX_TLS=tcp in_ns "$nsc" timeout 120 ucx_perftest "$ips" -p "$port" -t "$test" -s "$size" \
        -n "$iters" -w $((iters / 10 + 1)) -f >"$RES/$name.ucx.txt" 2>&1 || {
        log "$name FAILED: $(tail -1 "$RES/$name.ucx.txt")"
        FAILURES=$((FAILURES + 1))
    }
    wait "$spid" || true
}

# The final figures line of a ucx_perftest -f output: iterations, latency 50%ile / average /
# overall (usec), bandwidth average / overall (MB/s), message rate average / overall.
ucx_final() { awk 'NF == 8 && $1 ~ /^[0-9]+$/ { l = $0 } END { print l }' "$RES/$1.ucx.txt"; }

jget() { [ -f "$RES/$1.json" ] && jq -r "$2 // empty" "$RES/$1.json" 2>/dev/null; }
fmt() { [ -n "$1" ] && printf "%.${2:-2}f" "$1" || echo "n/a"; }
met() { # met RATIO OP LIMIT
    [ -z "$1" ] && { echo "**FAILED**"; return; }
    if awk -v r="$1" -v l="$3" -v op="$2" 'BEGIN { exit !((op == ">=") ? r >= l : r <= l) }'; then
        echo "MET"
    else
        echo "**NOT MET**"
    fi
}
ratio() { [ -n "$1" ] && [ -n "$2" ] && awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3f", a / b }'; }

TABLES=""
COMMANDS=""

# setup NAME NS_SERVER IP_SERVER NS_CLIENT IP_CLIENT MTU_ARG TITLE BW_MIN RATE_MIN [CPU_MAX]:
# every run of one setup, then its table. The targets are issue 12's for that setup: WRITE
# bandwidth ≥ BW_MIN× one TCP stream, 64 B message rate ≥ RATE_MIN× the UDP blast and, with
# CPU_MAX, CPU s/GB of each side ≤ CPU_MAX× TCP's same side.
setup() {
    local tag=$1 nss=$2 ips=$3 nsc=$4 ipc=$5 mtu=$6 title=$7 bwmin=$8 ratemin=$9 cpumax=${10:-}
    local D=(-D "$DUR" -m "$mtu")
    srdma_pair "$tag-write-bw-65536" "$nss" "$ips" "$nsc" "$ipc" write-bw -s 65536 "${D[@]}" --baseline tcp
    srdma_pair "$tag-write-bw-1048576" "$nss" "$ips" "$nsc" "$ipc" write-bw -s 1048576 "${D[@]}" --baseline tcp
    srdma_pair "$tag-write-bw-64" "$nss" "$ips" "$nsc" "$ipc" write-bw -s 64 "${D[@]}" --baseline udp
    srdma_pair "$tag-send-lat-8" "$nss" "$ips" "$nsc" "$ipc" send-lat -s 8 "${D[@]}" --baseline udp
    srdma_pair "$tag-send-lat-8-e" "$nss" "$ips" "$nsc" "$ipc" send-lat -s 8 -e "${D[@]}" --baseline udp
    srdma_pair "$tag-write-lat-8" "$nss" "$ips" "$nsc" "$ipc" write-lat -s 8 "${D[@]}" --baseline udp
    srdma_pair "$tag-write-lat-8-e" "$nss" "$ips" "$nsc" "$ipc" write-lat -s 8 -e "${D[@]}" --baseline udp
    if [ $HAVE_UCX = 1 ]; then
        srdma_pair "$tag-write-bw-8" "$nss" "$ips" "$nsc" "$ipc" write-bw -s 8 "${D[@]}"
        srdma_pair "$tag-write-lat-65536" "$nss" "$ips" "$nsc" "$ipc" write-lat -s 65536 "${D[@]}"
        srdma_pair "$tag-write-lat-1048576" "$nss" "$ips" "$nsc" "$ipc" write-lat -s 1048576 "${D[@]}"
        ucx_pair "$tag-ucp_put_bw-8" "$nss" "$ips" "$nsc" ucp_put_bw 8 200000
        ucx_pair "$tag-ucp_put_bw-65536" "$nss" "$ips" "$nsc" ucp_put_bw 65536 10000
        ucx_pair "$tag-ucp_put_bw-1048576" "$nss" "$ips" "$nsc" ucp_put_bw 1048576 1000
        ucx_pair "$tag-ucp_put_lat-8" "$nss" "$ips" "$nsc" ucp_put_lat 8 20000
        ucx_pair "$tag-ucp_put_lat-65536" "$nss" "$ips" "$nsc" ucp_put_lat 65536 3000
        ucx_pair "$tag-ucp_put_lat-1048576" "$nss" "$ips" "$nsc" ucp_put_lat 1048576 300
    fi

    local t="### $title"$'\n\n'
    t+="| target | srdma | baseline | ratio | met? | CPU s/GB srdma (client / server) | CPU s/GB baseline (client / server) |"$'\n'
    t+="|---|---:|---:|---:|---|---|---|"$'\n'
    local n r s b
    for size in 65536 1048576; do
        n=$tag-write-bw-$size
        r=$(jget "$n" '.ratios[0].bw')
        s=$(jget "$n" '.results[0].bw_avg_mib_s')
        b=$(jget "$n" '.baseline.results[0].bw_avg_mib_s')
        local cl sv bcl bsv
        cl=$(jget "$n" '.results[0].cpu_s_per_gb_local')
        sv=$(jget "$n" '.results[0].cpu_s_per_gb_remote')
        bcl=$(jget "$n" '.baseline.results[0].cpu_s_per_gb_local')
        bsv=$(jget "$n" '.baseline.results[0].cpu_s_per_gb_remote')
        t+="| RC WRITE BW $((size / 1024)) KiB, 1 QP ≥ ${bwmin}× one TCP stream | $(fmt "$s" 0) MiB/s | $(fmt "$b" 0) MiB/s | $(fmt "$r" 3)× | $(met "$r" ">=" "$bwmin") "
        t+="| $(fmt "$cl" 3) / $(fmt "$sv" 3) | $(fmt "$bcl" 3) / $(fmt "$bsv" 3) |"$'\n'
        if [ -n "$cpumax" ]; then
            # The worse side's ratio decides.
            local rc rs rw
            rc=$(ratio "$cl" "$bcl")
            rs=$(ratio "$sv" "$bsv")
            rw=$(awk -v a="$rc" -v b="$rs" 'BEGIN { if (a != "" && b != "") print (a > b ? a : b) }')
            t+="| RC WRITE $((size / 1024)) KiB, CPU s/GB of each side ≤ ${cpumax}× TCP's | client $(fmt "$rc" 2)× | server $(fmt "$rs" 2)× | $(fmt "$rw" 3)× | $(met "$rw" "<=" "$cpumax") | | |"$'\n'
        fi
    done
    n=$tag-write-bw-64
    r=$(jget "$n" '.ratios[0].msg_rate')
    s=$(jget "$n" '.results[0].msg_rate_mpps')
    b=$(jget "$n" '.baseline.results[0].msg_rate_mpps')
    t+="| RC WRITE 64 B message rate ≥ ${ratemin}× UDP sendmmsg blast | $(fmt "$s" 3) Mpps | $(fmt "$b" 3) Mpps received (of $(fmt "$(jget "$n" '.baseline.results[0].sent')" 0) sent) | $(fmt "$r" 3)× | $(met "$r" ">=" "$ratemin") "
    t+="| $(fmt "$(jget "$n" '.results[0].cpu_s_per_gb_local')" 1) / $(fmt "$(jget "$n" '.results[0].cpu_s_per_gb_remote')" 1) "
    t+="| $(fmt "$(jget "$n" '.baseline.results[0].cpu_s_per_gb_local')" 1) / $(fmt "$(jget "$n" '.baseline.results[0].cpu_s_per_gb_remote')" 1) |"$'\n'
    local op mode
    for op in send write; do
        for mode in "" -e; do
            n=$tag-$op-lat-8$mode
            r=$(jget "$n" '.ratios[0].t_typical')
            s=$(jget "$n" '.results[0].t_typical_us')
            b=$(jget "$n" '.baseline.results[0].t_typical_us')
            # LAT_MAX (issue 28's same-host 0.7×) is for busy polling; with events both
            # sides pay a wake-up per message, and the target stays 1.3×.
            local how="busy-poll vs busy-poll" lmax=${LAT_MAX:-1.3}
            [ -n "$mode" ] && how="-e events vs blocking recv" lmax=1.3
            t+="| RC ${op^^} latency 8 B, half RTT ($how) ≤ ${lmax}× UDP ping-pong | $(fmt "$s") µs | $(fmt "$b") µs | $(fmt "$r" 3)× | $(met "$r" "<=" "$lmax") | | |"$'\n'
        done
    done
    if [ $HAVE_UCX = 1 ]; then
        local size u f
        for size in 8 65536 1048576; do
            f=$(ucx_final "$tag-ucp_put_bw-$size")
            u=$(echo "$f" | awk '{ print $6 }')
            s=$(jget "$tag-write-bw-$size" '.results[0].bw_avg_mib_s')
            r=$(ratio "$s" "$u")
            t+="| srdma write-bw ≥ 1.0× ucp_put_bw (UCX_TLS=tcp), $size B | $(fmt "$s" 1) MiB/s | $(fmt "$u" 1) MB/s | $(fmt "$r" 3)× | $(met "$r" ">=" 1.0) | | |"$'\n'
        done
        for size in 8 65536 1048576; do
            f=$(ucx_final "$tag-ucp_put_lat-$size")
            u=$(echo "$f" | awk '{ print $2 }')
            s=$(jget "$tag-write-lat-$size" '.results[0].t_typical_us')
            r=$(ratio "$s" "$u")
            t+="| srdma write-lat ≤ 1.0× ucp_put_lat (UCX_TLS=tcp, medians), $size B | $(fmt "$s") µs | $(fmt "$u") µs | $(fmt "$r" 3)× | $(met "$r" "<=" 1.0) | | |"$'\n'
        done
    fi
    TABLES+="$t"$'\n'
}

log "loopback, shared memory (the default between srdma processes of one host)"
# Issue 28's targets: 1 MiB WRITE ≥ 2× one TCP stream, 64 B rate ≥ 5× the UDP blast, 8 B
# busy half round trips ≤ 0.7× a UDP ping-pong.
LAT_MAX=0.7 setup lo "" 127.203.0.1 "" 127.203.0.2 4096 \
    "Same host, shared memory: two processes, 127.203.0.1 ↔ 127.203.0.2 (path MTU 4096)" 2.0 5.0
log "loopback over UDP (SRDMA_SHM=0)"
PAIR_ENV=SRDMA_SHM=0 setup lo-udp "" 127.203.0.1 "" 127.203.0.2 4096 \
    "Same host over UDP (SRDMA_SHM=0): two processes, 127.203.0.1 ↔ 127.203.0.2 (path MTU 4096)" 1.0 1.0

# Single-threaded memcpy, the same sizes, the same duration.
MEMCPY=""
if gcc -O2 -o "$RES/memcpy" "$ROOT/benchmarks/memcpy.c" 2>"$RES/memcpy.err"; then
    MEMCPY_1M=$("$RES/memcpy" 1048576 "$DUR")
    MEMCPY_64K=$("$RES/memcpy" 65536 "$DUR")
    MEMCPY=1
else
    NOTES+=("benchmarks/memcpy.c did not build (gcc): no memcpy baseline.")
fi
shm_table() {
    local t="### Same host: shared memory against UDP and memcpy (issue 28)"$'\n\n'
    t+="Both tables above, side by side: \`lo\` is the default (same-host peers meet through shared"$'\n'
    t+="memory), \`lo-udp\` the same runs with \`SRDMA_SHM=0\`; memcpy is \`benchmarks/memcpy.c\`,"$'\n'
    t+="one thread copying messages of the size between two 64 MiB buffers."$'\n\n'
    t+="| figure | shared memory | UDP driver | memcpy | ratio | target | met? |"$'\n'
    t+="|---|---:|---:|---:|---:|---|---|"$'\n'
    local s u r m size
    for size in 65536 1048576; do
        s=$(jget "lo-write-bw-$size" '.results[0].bw_avg_mib_s')
        u=$(jget "lo-udp-write-bw-$size" '.results[0].bw_avg_mib_s')
        t+="| WRITE BW $((size / 1024)) KiB, shm / UDP driver | $(fmt "$s" 0) MiB/s | $(fmt "$u" 0) MiB/s | | $(fmt "$(ratio "$s" "$u")" 2)× | | |"$'\n'
    done
    s=$(jget lo-write-bw-1048576 '.results[0].bw_avg_mib_s')
    m=${MEMCPY_1M:-}
    r=$(ratio "$s" "$m")
    t+="| WRITE BW 1 MiB, shm / memcpy 1 MiB | $(fmt "$s" 0) MiB/s | | $(fmt "$m" 0) MiB/s | $(fmt "$r" 3)× | ≥ 0.5× | $(met "$r" ">=" 0.5) |"$'\n'
    s=$(jget lo-write-bw-65536 '.results[0].bw_avg_mib_s')
    m=${MEMCPY_64K:-}
    t+="| WRITE BW 64 KiB, shm / memcpy 64 KiB | $(fmt "$s" 0) MiB/s | | $(fmt "$m" 0) MiB/s | $(fmt "$(ratio "$s" "$m")" 3)× | | |"$'\n'
    local side q sc uc
    for side in local remote; do
        q=client
        [ $side = remote ] && q=server
        sc=$(jget lo-write-bw-1048576 ".results[0].cpu_s_per_gb_$side")
        uc=$(jget lo-udp-write-bw-1048576 ".results[0].cpu_s_per_gb_$side")
        r=$(ratio "$sc" "$uc")
        t+="| CPU s/GB at 1 MiB, $q, shm / UDP driver | $(fmt "$sc" 3) | $(fmt "$uc" 3) | | $(fmt "$r" 3)× | ≤ 0.5× | $(met "$r" "<=" 0.5) |"$'\n'
    done
    s=$(jget lo-write-bw-64 '.results[0].msg_rate_mpps')
    u=$(jget lo-udp-write-bw-64 '.results[0].msg_rate_mpps')
    t+="| WRITE 64 B message rate, shm / UDP driver | $(fmt "$s" 3) Mpps | $(fmt "$u" 3) Mpps | | $(fmt "$(ratio "$s" "$u")" 2)× | | |"$'\n'
    local op mode n
    for op in send write; do
        for mode in "" -e; do
            n=$op-lat-8$mode
            s=$(jget "lo-$n" '.results[0].t_typical_us')
            u=$(jget "lo-udp-$n" '.results[0].t_typical_us')
            t+="| ${op^^} 8 B half RTT${mode:+ (events)}, shm / UDP driver | $(fmt "$s") µs | $(fmt "$u") µs | | $(fmt "$(ratio "$s" "$u")" 3)× | | |"$'\n'
        done
    done
    TABLES+="$t"$'\n'
}
shm_table

make_netns() { # make_netns MTU
    ip netns del "$NS_A" 2>/dev/null
    ip netns del "$NS_B" 2>/dev/null
    ip netns add "$NS_A" && ip netns add "$NS_B" &&
        ip link add veth-a netns "$NS_A" type veth peer name veth-b netns "$NS_B" &&
        ip -n "$NS_A" addr add 10.203.0.1/24 dev veth-a &&
        ip -n "$NS_B" addr add 10.203.0.2/24 dev veth-b &&
        ip -n "$NS_A" link set veth-a mtu "$1" up &&
        ip -n "$NS_B" link set veth-b mtu "$1" up &&
        ip -n "$NS_A" link set lo up && ip -n "$NS_B" link set lo up
}
if [ "${SKIP_NETNS:-0}" = 1 ]; then
    NOTES+=("Namespaces skipped (SKIP_NETNS=1).")
else
    for mtu in 1500 9000; do
        if make_netns "$mtu"; then
            # Issue 12: MTU 1500 ≥ 0.9× TCP (its path MTU of 1024 carries 1024 B per packet
            # against TCP's 1448) with CPU s/GB ≤ 2× TCP's; MTU 9000 ≥ 1.0×.
            path=1024 bwmin=0.9 cpumax=2.0
            [ "$mtu" = 9000 ] && path=4096 bwmin=1.0 cpumax=
            log "veth MTU $mtu"
            setup "veth$mtu" "$NS_A" 10.203.0.1 "$NS_B" 10.203.0.2 "$path" \
                "Two network namespaces, veth MTU $mtu (10.203.0.1 ↔ 10.203.0.2, path MTU $path)" \
                "$bwmin" 2.0 $cpumax
        else
            NOTES+=("Could not create network namespaces with MTU $mtu: no veth results.")
            FAILURES=$((FAILURES + 1))
        fi
        ip netns del "$NS_A" 2>/dev/null
        ip netns del "$NS_B" 2>/dev/null
    done
fi

RELAY=""
if [ "${SKIP_RELAY:-0}" != 1 ] && [ -x "$ROOT/benchmarks/relay.sh" ]; then
    log "benchmarks/relay.sh"
    SRDMA_BIN=$SRDMA "$ROOT/benchmarks/relay.sh" >"$RES/relay.log" 2>&1
    rc=$?
    if [ -f "$RES/relay.md" ]; then
        RELAY=$(cat "$RES/relay.md")
    else
        RELAY="benchmarks/relay.sh exited with status $rc and wrote no benchmarks/results/relay.md (log: benchmarks/results/relay.log)."
    fi
fi

# ---------------------------------------------------------------------------- README block
CPU_MODEL=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
CORES=$(nproc)
KERNEL=$(uname -r)
{
    echo "<!-- run.sh:begin -->"
    echo "## srdma perf against kernel sockets and UCX"
    echo
    echo "Written by \`benchmarks/run.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'); raw outputs in"
    echo "\`benchmarks/results/\` (one JSON per srdma client run, the servers' tables, ucx_perftest's output)."
    echo
    echo "| | |"
    echo "|---|---|"
    echo "| CPU | \`$CPU_MODEL\` |"
    echo "| Cores | $CORES |"
    echo "| Kernel | \`$KERNEL\` |"
    echo "| Rust | \`$RUSTC\` |"
    echo "| UCX | $UCX_VERSION |"
    echo
    echo "Each measurement runs ${DUR} s (\`-D $DUR\`); the kernel baseline runs right after the srdma"
    echo "test between the same two addresses, by the same two processes. Bandwidth is the average"
    echo "from the first post to the last completion, in MiB/s; latency is the median (perftest's"
    echo "t_typical) of half the round trip. CPU s/GB: CPU seconds (user + system, every thread,"
    echo "from getrusage) per 10^9 bytes moved, for the client and the server process."
    echo
    echo "Commands (server first, then the client; in the namespaces each under \`ip netns exec\`):"
    echo
    echo '```sh'
    echo "srdma perf write-bw --bind A -D $DUR -m MTU -s 65536 --baseline tcp      # and -s 1048576"
    echo "srdma perf write-bw A --bind B -D $DUR -m MTU -s 65536 --baseline tcp --json"
    echo "srdma perf write-bw ... -s 64 --baseline udp                   # message rate vs a sendmmsg blast"
    echo "srdma perf send-lat ... -s 8 --baseline udp                    # busy-poll both sides; -e: events vs blocking"
    echo "srdma perf write-lat ... -s 8 --baseline udp                   # likewise"
    echo "srdma perf write-bw ... -s 8;  srdma perf write-lat ... -s 65536 / -s 1048576   # for UCX"
    echo "UCX_TLS=tcp ucx_perftest -p PORT;  UCX_TLS=tcp ucx_perftest A -p PORT -t ucp_put_bw -s SIZE -n N -f"
    echo '```'
    echo
    echo "How to read the tables:"
    echo
    echo "- Ratios are srdma / baseline: above 1 srdma is faster for bandwidth and message rate,"
    echo "  below 1 it is faster for latency. MET / NOT MET applies the issue's threshold to the ratio."
    echo "- Both ends, their srdma progress threads and the kernel's network processing share the"
    echo "  machine's cores (2 here). Busy-poll tests spin on both sides; every spinning loop, the"
    echo "  kernel baselines' included, yields the CPU after 64 idle turns so that the threads that"
    echo "  do the work can run. Figures from a machine with other jobs running move by 2x between"
    echo "  runs; the ratios move less."
    echo "- The UDP blast counts what the receiver got (\`recvmmsg\`) over the time from its first to"
    echo "  its last datagram; the sender's surplus was dropped by the kernel. srdma's rate is what was"
    echo "  written and acknowledged."
    echo "- The TCP baseline writes message-size buffers into one stream; on loopback and veth the"
    echo "  kernel moves them in up-to-64 KiB segments (GSO/GRO). srdma sends one datagram per"
    echo "  path-MTU packet and computes the ICRC of each in software."
    echo "- ucx_perftest prints MB/s with UCX's UCS_MBYTE (2^20 bytes), the unit of srdma's MiB/s;"
    echo "  its latency column is the median of one-way (half round trip) times, as srdma's t_typical."
    echo
    for n in "${NOTES[@]:-}"; do [ -n "$n" ] && echo "- $n"; done
    [ "${#NOTES[@]}" -gt 0 ] && echo
    printf "%s" "$TABLES"
    if [ "$FAILURES" -gt 0 ]; then
        echo "$FAILURES run(s) failed; their rows say FAILED or n/a (errors in \`benchmarks/results/*.client.err\`)."
        echo
    fi
    if [ -n "$RELAY" ]; then
        echo "### srdma-relay (benchmarks/relay.sh)"
        echo
        echo "$RELAY"
        echo
    fi
    echo "<!-- run.sh:end -->"
} >"$RES/run-block.md"

readme_block run.sh "$RES/run-block.md" "$README"
log "wrote the run.sh block of $README"
cat "$RES/run-block.md"
[ "$FAILURES" = 0 ]
