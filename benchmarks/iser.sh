#!/usr/bin/env bash
# iSCSI reads over iSER on srdma beside iSCSI over TCP, same target, same run: Debian's tgtd
# (package tgt) under `srdma exec` serving two LUNs on tmpfs, one per transport, and Debian's
# libiscsi `iscsi-perf` (libiscsi-bin) reading them: over TCP without srdma (the kernel's
# loopback or veth), over iSER under `srdma exec`. Rounds alternate TCP and iSER so both see
# the same machine; IOPS and MB/s are `iscsi-perf`'s own averages over each run.
#
#   benchmarks/iser.sh [SECONDS] [ROUNDS]    (root; tgt, libiscsi-bin and iproute2 installed)
#
# Two layouts: both ends on one host (127.0.0.1, one shared srdma address; srdma's devices
# then talk through shared memory), and target and initiator in two network namespaces joined
# by a veth pair (srdma over UDP). Two request sizes: 4 KiB (IOPS) and 128 KiB (MB/s), 32
# requests in flight (iscsi-perf's default). Prints one line per run and the medians.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-8}
rounds=${2:-3}
cargo build --release -q -p srdma-cli -p srdma-verbs
S=$PWD/target/release/srdma
INI=iqn.2026-01.org.srdma:perf
C=$((1000 + $$ % 30000))   # tgtd's control port (below 32768); its socket is a path
work=$(mktemp -d /dev/shm/srdma-iser-bench.XXXXXX)
ns=srdma-iser-$$
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    ip netns del ${ns}-t 2>/dev/null || true
    ip netns del ${ns}-i 2>/dev/null || true
    ip netns del ${ns}-h 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
mkdir -p /var/run/tgtd
for lld in iscsi iser; do
    dd if=/dev/urandom of="$work/$lld.img" bs=1M count=256 status=none
done

# Namespaces: -h (one host: lo only), -t and -i (target and initiator, veth 10.99.0.1/.2).
ip netns add ${ns}-h
ip -n ${ns}-h link set lo up
ip netns add ${ns}-t
ip netns add ${ns}-i
ip -n ${ns}-t link add eth0 type veth peer name eth0 netns ${ns}-i
ip -n ${ns}-t addr add 10.99.0.1/24 dev eth0
ip -n ${ns}-i addr add 10.99.0.2/24 dev eth0
for n in t i; do
    ip -n ${ns}-$n link set eth0 up
    ip -n ${ns}-$n link set lo up
done

# start_target NS DEVICE CTL: tgtd in NS on srdma device DEVICE, targets tid 1 (TCP) and 2 (iSER).
start_target() {
    ip netns exec "$1" "$S" exec --device "$2" tgtd -f -C "$3" > "$work/tgtd-$3.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do tgtadm -C "$3" --op show --mode target >/dev/null 2>&1 && break; sleep 0.1; done
    local tid=0
    for lld in iscsi iser; do
        tid=$((tid + 1))
        tgtadm -C "$3" --lld $lld --op new --mode target --tid $tid -T iqn.2026-01.org.srdma:$lld
        tgtadm -C "$3" --lld $lld --op new --mode logicalunit --tid $tid --lun 1 -b "$work/$lld.img"
        tgtadm -C "$3" --lld $lld --op bind --mode target --tid $tid -I ALL
        # tgt 1.0.85's iSER login needs an initiator-name rule (see tests/storage.rs).
        tgtadm -C "$3" --lld $lld --op bind --mode target --tid $tid -Q $INI
    done
}

# perf NS DEVICE URL BLOCKS: "IOPS MB/s" of iscsi-perf reading BLOCKS 512-byte blocks per
# request for $secs seconds (under srdma exec on DEVICE unless DEVICE is -).
perf() {
    local wrap=()
    [ "$2" != - ] && wrap=("$S" exec --device "$2")
    ip netns exec "$1" "${wrap[@]}" iscsi-perf -i $INI -b "$4" "$3" > "$work/perf.out" 2>&1 &
    local p=$!
    sleep "$secs"
    kill -INT $p 2>/dev/null || true
    wait $p || true
    # The average since the start in iscsi-perf's last report (one a second; on SIGINT it
    # prints "finished." and no other). SRDMA_BENCH_KEEP=FILE keeps every output there.
    if [ -n "${SRDMA_BENCH_KEEP:-}" ]; then cat "$work/perf.out" >> "$SRDMA_BENCH_KEEP"; fi
    tr '\r' '\n' < "$work/perf.out" | grep -o 'iops average [0-9]* ([0-9]* MB/s)' |
        sed -n 's/iops average \([0-9]*\) (\([0-9]*\) MB\/s)/\1 \2/p' | tail -1
}

results=$work/results
: > "$results"
run_layout() { # NAME TARGET-NS TARGET-DEV INI-NS INI-DEV ADDR
    local name=$1 tns=$2 tdev=$3 ins=$4 idev=$5 addr=$6
    C=$((C + 1))
    start_target "$tns" "$tdev" $C
    for r in $(seq "$rounds"); do
        for b in 8 256; do
            local t i
            t=$(perf "$ins" - "iscsi://$addr/iqn.2026-01.org.srdma:iscsi/1" $b)
            i=$(perf "$ins" "$idev" "iser://$addr/iqn.2026-01.org.srdma:iser/1" $b)
            printf '%s round %d, %3d KiB: TCP %s IOPS %s MB/s, iSER %s IOPS %s MB/s\n' \
                "$name" "$r" $((b / 2)) ${t:-0 0} ${i:-0 0}
            echo "$name $((b / 2)) ${t:-0 0} ${i:-0 0}" >> "$results"
        done
    done
    kill -9 "${pids[-1]}" 2>/dev/null || true
}
run_layout one-host ${ns}-h 127.0.0.1 ${ns}-h 127.0.0.1 127.0.0.1
run_layout namespaces ${ns}-t 10.99.0.1 ${ns}-i 10.99.0.2 10.99.0.1

echo
echo "medians over $rounds rounds of $secs s (IOPS, MB/s; ratio iSER/TCP):"
for layout in one-host namespaces; do
    for kib in 4 128; do
        awk -v l=$layout -v k=$kib '$1 == l && $2 == k' "$results" | sort -n -k3 > "$work/sel"
        med() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
        ti=$(awk '{print $3}' "$work/sel" | med); tm=$(awk '{print $4}' "$work/sel" | med)
        ii=$(awk '{print $5}' "$work/sel" | med); im=$(awk '{print $6}' "$work/sel" | med)
        printf '%-10s %3d KiB: TCP %7d IOPS %5d MB/s | iSER %7d IOPS %5d MB/s | %.2fx\n' \
            $layout $kib "$ti" "$tm" "$ii" "$im" "$(awk -v a="$ii" -v b="$ti" 'BEGIN { print b ? a / b : 0 }')"
    done
done
