#!/usr/bin/env bash
# srdma-relay under random loss: its connections (srdma's TCP CM) with selective repeat,
# agreed by ECE in the CM's REQ and REP, against the same chains with go-back-N
# (SRDMA_ECE=0, what the relay had before its CM carried ECE), beside one TCP stream moving
# the same bytes between the same namespaces, all in one run.
#
# Hosts: namespaces 10.198.0.1.. on a bridge (veth, MTU 1500, so RoCE runs at path MTU 1024
# as between two ordinary hosts). Loss: an nftables `numgen random` rule on every host's
# output drops LOSS % of the RoCEv2 datagrams (UDP 4791) — and of the TCP stream's segments
# for its row. Each chain is a source (`gen:SIZE`), HOPS-1 relays and a sink (`discard`);
# every relay and the sink verify the bytes. Modes alternate within a pass (SR, GBN, TCP),
# PASSES times.
#
# Writes benchmarks/results/relay_loss.md (or $OUT). Needs root, ip, nft, jq, python3.
# Exit status: 0 done (the table says how it went), 1 a failure, 77 skipped.
#
# Knobs: SIZE (256MiB), LOSSES ("0 0.1 1", percent), HOPS ("1 3"), PASSES (2), OUT,
# SRDMA_BIN (run this binary instead of building one), RUN_LIMIT (seconds per chain, 300).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=relay_lab.sh
. "$ROOT/benchmarks/relay_lab.sh"
SIZE=${SIZE:-256MiB}
LOSSES=${LOSSES:-"0 0.1 1"}
HOPS=${HOPS:-"1 3"}
PASSES=${PASSES:-2}
OUT=${OUT:-$ROOT/benchmarks/results/relay_loss.md}
RUN_LIMIT=${RUN_LIMIT:-300}
MTU=1500 CHUNK=1MiB SLOTS=8 FORWARD=send

skip() { echo "relay_loss.sh: SKIPPED: $*" >&2; exit 77; }
die() { echo "relay_loss.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || skip "not root (network namespaces need CAP_NET_ADMIN)"
for t in ip nft jq python3; do command -v "$t" >/dev/null || skip "\`$t\` not installed"; done

if [ -n "${SRDMA_BIN:-}" ]; then
    BIN=$SRDMA_BIN
else
    echo "relay_loss.sh: building the release binary" >&2
    (cd "$ROOT" && cargo build --release -q -p srdma-cli) || die "build failed"
    BIN=$ROOT/target/release/srdma
fi
[ -x "$BIN" ] || die "no binary at $BIN"
BYTES=$(python3 -c "
import re,sys
m=re.fullmatch(r'(\d+)(KiB|MiB|GiB)?', sys.argv[1]); k={'KiB':1<<10,'MiB':1<<20,'GiB':1<<30}.get(m.group(2),1)
print(int(m.group(1))*k)" "$SIZE") || die "SIZE $SIZE: a number with KiB, MiB or GiB"

max_hops=0
for h in $HOPS; do [ "$h" -gt "$max_hops" ] && max_hops=$h; done
NHOSTS=$((max_hops + 1))
PREFIX="srl$$"
WIRE="$PREFIX-w"
WORK=$(mktemp -d /tmp/srdma-relay-loss.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do pkill -9 -P "$p" 2>/dev/null || true; kill -9 "$p" 2>/dev/null || true; done
    for ((i = 0; i < NHOSTS; i++)); do ip netns del "$PREFIX-$i" 2>/dev/null || true; done
    ip netns del "$WIRE" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

addr() { echo "10.198.0.$(($1 + 1))"; }
relay_lab_up

# Drops $1 % of what every host sends to UDP 4791 and to the TCP stream's port.
set_loss() {
    local i per10k
    per10k=$(awk -v p="$1" 'BEGIN { printf "%d", p * 100 }')
    for ((i = 0; i < NHOSTS; i++)); do
        ip netns exec "$PREFIX-$i" nft delete table ip lossy 2>/dev/null || true
        [ "$per10k" -gt 0 ] || continue
        ip netns exec "$PREFIX-$i" nft add table ip lossy
        ip netns exec "$PREFIX-$i" nft add chain ip lossy out '{ type filter hook output priority 0; }'
        ip netns exec "$PREFIX-$i" nft add rule ip lossy out udp dport 4791 numgen random mod 10000 '<' "$per10k" drop
        ip netns exec "$PREFIX-$i" nft add rule ip lossy out tcp dport 5999 numgen random mod 10000 '<' "$per10k" drop
    done
}


# Runs a chain of $1 hops with SRDMA_ECE=$2 into $WORK/$3; prints the sink's MB/s and the
# nodes' retransmissions, or "FAILED".
run_chain() {
    local hops=$1 ece=$2 dir=$WORK/$3 i p ok=1
    mkdir -p "$dir"
    relay_chain_config "$hops" "$dir/relay.toml"
    PIDS=()
    for ((i = hops; i >= 0; i--)); do
        ip netns exec "$PREFIX-$i" env SRDMA_ECE="$ece" timeout -s KILL "$RUN_LIMIT" \
            "$BIN" relay node --config "$dir/relay.toml" --name "n$i" --json >"$dir/n$i.json" 2>"$dir/n$i.err" &
        PIDS+=($!)
    done
    for p in "${PIDS[@]}"; do wait "$p" || ok=0; done
    PIDS=()
    local rep retx=0
    rep=$(jq -c 'select(.event == "report")' "$dir/n$hops.json" 2>/dev/null | tail -1)
    if [ $ok = 0 ] || [ -z "$rep" ] || [ "$(jq -r .ok <<<"$rep")" != true ]; then
        echo "FAILED $(tail -c 200 "$dir/n$hops.err" | tr '\n|' '  ')"
        return
    fi
    for ((i = 0; i <= hops; i++)); do
        retx=$((retx + $(jq -c 'select(.event == "report")' "$dir/n$i.json" | tail -1 | jq -r '.retransmissions // 0')))
    done
    jq -r --arg r "$retx" '"\(.bytes / .seconds / 1e6 * 10 | floor / 10) \($r)"' <<<"$rep"
}

# One TCP stream of SIZE bytes from host 0 to host 1; prints MB/s.
run_tcp() {
    ip netns exec "$PREFIX-1" python3 -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 5999)); s.listen(1); c, _ = s.accept()
n = 0
while True:
    b = c.recv(1 << 20)
    if not b: break
    n += len(b)
print(n)' >"$WORK/tcp-recv" &
    local srv=$!
    sleep 0.3
    ip netns exec "$PREFIX-0" python3 -c '
import socket, sys, time
n = int(sys.argv[2]); buf = bytes(1 << 20)
s = socket.create_connection((sys.argv[1], 5999))
t = time.monotonic(); left = n
while left > 0:
    k = min(left, len(buf)); s.sendall(buf[:k]); left -= k
s.shutdown(socket.SHUT_WR); s.recv(1)
print("%.1f" % (n / (time.monotonic() - t) / 1e6))' "$(addr 1)" "$BYTES"
    wait "$srv"
}

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
ROWS=$WORK/rows
: >"$ROWS"
n=0
for ((pass = 1; pass <= PASSES; pass++)); do
    for loss in $LOSSES; do
        set_loss "$loss"
        tcp=$(run_tcp)
        for hops in $HOPS; do
            n=$((n + 1)); read -r sr sr_retx <<<"$(run_chain "$hops" 1 "sr-$n")"
            n=$((n + 1)); read -r gbn gbn_retx <<<"$(run_chain "$hops" 0 "gbn-$n")"
            row=$(awk -v p="$pass" -v l="$loss" -v h="$hops" -v s="$sr" -v g="$gbn" -v t="$tcp" \
                -v sx="$sr_retx" -v gx="$gbn_retx" 'BEGIN {
                r = (s + 0 > 0 && g + 0 > 0) ? sprintf("%.2f", s / g) : "-"
                st = (s + 0 > 0 && t + 0 > 0) ? sprintf("%.2f", s / t) : "-"
                gt = (g + 0 > 0 && t + 0 > 0) ? sprintf("%.2f", g / t) : "-"
                printf "| %s | %s %% | %s | %s | %s | %s | %s | %s | %s | %s / %s |\n", p, l, h, s, g, t, r, st, gt, sx, gx }')
            echo "$row" | tee -a "$ROWS" >&2
        done
    done
done
set_loss 0
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

mkdir -p "$(dirname "$OUT")"
{
    echo "**srdma-relay under random loss: selective repeat (ECE over the TCP CM) against go-back-N.**"
    echo
    echo "Written by \`benchmarks/relay_loss.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'), commit \`$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)\`;"
    echo "$(nproc) cores, load average $LOAD_BEFORE before, $LOAD_AFTER after."
    echo
    echo "Command: \`SIZE=$SIZE LOSSES=\"$LOSSES\" HOPS=\"$HOPS\" PASSES=$PASSES benchmarks/relay_loss.sh\`"
    echo
    echo "Namespaces on a bridge (veth, MTU 1500); every host drops the loss rate of what it"
    echo "sends (nftables \`numgen random\`). Last-sink MB/s (10^6 B/s) from the sink's report; SR:"
    echo "selective repeat, agreed in the relay's CM; GBN: the same with \`SRDMA_ECE=0\`; TCP: one"
    echo "stream of the same bytes from the first host to the second, same loss. Retransmissions:"
    echo "the nodes' completer_retry_err summed (go-back-N's retries; SR's resends of holes do"
    echo "not count there)."
    echo
    echo "| pass | loss | hops | SR MB/s | GBN MB/s | TCP MB/s | SR / GBN | SR / TCP | GBN / TCP | retransmissions SR / GBN |"
    echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    cat "$ROWS"
} >"$OUT"
echo "relay_loss.sh: wrote $OUT" >&2
cat "$OUT"
