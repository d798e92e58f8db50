#!/usr/bin/env bash
# srdma-relay schedules to many receivers (issue 13): a chain, a binary tree and the binomial
# pipeline from one source to SINKS sinks (8), one network namespace per node, every host's
# eth0 limited by tbf to RATE, against the α–β prediction of each.
#
#   chain     source -> s1 -> s2 -> ... -> sN (every sink but the last also forwards)
#   tree      binary heap: node i's parent is (i-1)/2 (inner sinks forward to two children)
#   binomial  topology = "binomial" (crates/srdma-relay/src/schedule.rs)
#
# Completion time: the last sink's last chunk minus the source's first chunk (the reports'
# `last_chunk_at` / `first_chunk_at`; all namespaces share one clock), so connection setup is
# not counted. Prediction, with k chunks of c bytes (the small chunks that start and end the
# object are not counted), link rate B (less RoCEv2's 58 header bytes per 1024-byte packet)
# and a per-chunk step cost α:
#
#   chain     (k + N - 1) · (α + c/B)        N sinks; one send per chunk per node
#   tree      (2k + L - 1) · (α + c/B)       L levels; an inner node sends every chunk twice
#   binomial  (k + D - 1) · (α + c/B)        D the most links a chunk crosses (d + 1 in a cube
#                                            of 2^d, one more per twin on the way)
#
# The rate must be the bound, not the two cores: SINKS+1 processes all send at RATE at once,
# so the default is 80mbit (10 MB/s each, about 90 MB/s through the lab).
#
# Writes benchmarks/results/schedules.md (or $OUT). Needs root, ip, tc, jq and python3.
# Exit status: 0 done, 1 a failure, 77 skipped (cannot make namespaces here).
#
# Knobs: SINKS (8), SIZES ("2MiB 4MiB 16MiB 64MiB"), CHUNK (1MiB), SLOTS (16: the binomial
# pipeline keeps chunks from several partners in flight; 8 slots cost it about 10 %), RATE (80mbit),
# ALPHA_MS (0.3: per-chunk step cost), PASSES (2), MTU (1500), BURST (32kb: tbf's bucket;
# a bucket of several chunks would let the first chunks through every hop at once and hide
# the fill time the schedules differ in), OUT, SRDMA_BIN.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SINKS=${SINKS:-8}
SIZES=${SIZES:-2MiB 4MiB 16MiB 64MiB}
CHUNK=${CHUNK:-1MiB}
SLOTS=${SLOTS:-16}
RATE=${RATE:-80mbit}
ALPHA_MS=${ALPHA_MS:-0.3}
PASSES=${PASSES:-2}
MTU=${MTU:-1500}
BURST=${BURST:-32kb}
OUT=${OUT:-$ROOT/benchmarks/results/schedules.md}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
RUN_LIMIT=${RUN_LIMIT:-300}

skip() { echo "schedules.sh: SKIPPED: $*" >&2; exit 77; }
die() { echo "schedules.sh: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || skip "not root (network namespaces need CAP_NET_ADMIN)"
[ "${SRDMA_SKIP_NETNS:-}" = 1 ] && skip "SRDMA_SKIP_NETNS=1"
for t in ip tc jq python3; do command -v "$t" >/dev/null || skip "\`$t\` not installed"; done

if [ -n "${SRDMA_BIN:-}" ]; then
    BIN=$SRDMA_BIN
else
    echo "schedules.sh: building the release binary" >&2
    (cd "$ROOT" && CARGO_TARGET_DIR=$TARGET_DIR cargo build --release -q -p srdma-cli) || die "build failed"
    BIN=$TARGET_DIR/release/srdma
fi
[ -x "$BIN" ] || die "no binary at $BIN"

NHOSTS=$((SINKS + 1))
PREFIX="srs$$"
WIRE="$PREFIX-w"
WORK=$(mktemp -d /tmp/srdma-schedules.XXXXXX)
PIDS=()

cleanup() {
    local p
    for p in "${PIDS[@]}"; do pkill -9 -P "$p" 2>/dev/null || true; kill -9 "$p" 2>/dev/null || true; done
    for ((i = 0; i < NHOSTS; i++)); do ip netns del "$PREFIX-$i" 2>/dev/null || true; done
    ip netns del "$WIRE" 2>/dev/null || true
    if [ -n "${KEEP_WORK:-}" ]; then echo "schedules.sh: kept $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

addr() { echo "10.198.0.$(($1 + 1))"; }

. "$ROOT/benchmarks/relay_lab.sh"
relay_lab_up
for ((i = 0; i < NHOSTS; i++)); do
    ns="$PREFIX-$i"
    # The user-space wire: let the host cut srdma's GSO buffers (see srdma-netlab).
    ip -n "$ns" link set eth0 gso_max_segs 1 2>/dev/null || true
    tc -n "$ns" qdisc replace dev eth0 root tbf rate "$RATE" burst "$BURST" latency 50ms
done

# Writes the configuration of schedule $1 for SIZE $2 to $3.
write_config() {
    local kind=$1 size=$2 file=$3 i parent role kids
    {
        printf '[transfer]\nchunk_size = "%s"\nslots = %s\ntimeout_ms = 10000\n' "$CHUNK" "$SLOTS"
        if [ "$kind" = binomial ]; then printf 'topology = "binomial"\n'; fi
        printf '\n[[node]]\nname = "n0"\naddr = "%s"\nrole = "source"\nsource = "gen:%s"\n' "$(addr 0)" "$size"
        for ((i = 1; i <= SINKS; i++)); do
            case $kind in
                chain) parent=$((i - 1)); kids=$((i < SINKS ? 1 : 0)) ;;
                tree) parent=$(((i - 1) / 2)); kids=$((2 * i + 1 <= SINKS ? 1 : 0)) ;;
                binomial) parent=""; kids=0 ;;
            esac
            role=sink
            if [ "$kids" = 1 ]; then role="relay+sink"; fi
            printf '\n[[node]]\nname = "n%d"\naddr = "%s"\nrole = "%s"\nsink = "discard"\nstages = ["verify"]\n' \
                "$i" "$(addr "$i")" "$role"
            if [ -n "$parent" ]; then printf 'parent = "n%d"\n' "$parent"; fi
        done
    } >"$file"
}

# Runs one configuration; prints "seconds" (completion time) or "failed".
run_one() {
    local dir=$1 i p status=ok
    PIDS=()
    for ((i = SINKS; i >= 0; i--)); do
        ip netns exec "$PREFIX-$i" timeout -s KILL "$RUN_LIMIT" "$BIN" relay node \
            --config "$dir/relay.toml" --name "n$i" --json >"$dir/n$i.json" 2>"$dir/n$i.err" &
        PIDS+=($!)
    done
    for p in "${PIDS[@]}"; do wait "$p" || status=failed; done
    PIDS=()
    if [ "$status" != ok ]; then echo failed; return; fi
    local first last
    first=$(jq -r 'select(.event == "report") | .first_chunk_at' "$dir/n0.json" | tail -1)
    last=$(for ((i = 1; i <= SINKS; i++)); do
        jq -r 'select(.event == "report") | .last_chunk_at' "$dir/n$i.json" | tail -1
    done | sort -g | tail -1)
    awk -v a="$first" -v b="$last" 'BEGIN { printf "%.3f\n", b - a }'
}

RESULTS=$WORK/results.tsv
: >"$RESULTS"
for size in $SIZES; do
    for pass in $(seq 1 "$PASSES"); do
        for kind in chain tree binomial; do
            dir=$WORK/$kind-$size-$pass
            mkdir -p "$dir"
            write_config "$kind" "$size" "$dir/relay.toml"
            t=$(run_one "$dir")
            echo "schedules.sh: $size pass $pass $kind: $t s" >&2
            printf '%s\t%s\t%s\t%s\n' "$size" "$pass" "$kind" "$t" >>"$RESULTS"
        done
    done
done

mkdir -p "$(dirname "$OUT")"
python3 - "$RESULTS" "$SINKS" "$CHUNK" "$RATE" "$ALPHA_MS" "$SLOTS" "$PASSES" "$BURST" >"$OUT" <<'EOF'
import math, re, sys, collections
path, sinks, chunk, rate, alpha_ms, slots, passes, burst = sys.argv[1:]
sinks = int(sinks)

def size_of(s):
    m = re.fullmatch(r"(\d+)(KiB|MiB|GiB)?", s)
    return int(m.group(1)) << {None: 0, "KiB": 10, "MiB": 20, "GiB": 30}[m.group(2)]

def rate_of(s):
    m = re.fullmatch(r"(\d+)(kbit|mbit|gbit)", s)
    return int(m.group(1)) * {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[m.group(2)] / 8

c = size_of(chunk)
B = rate_of(rate) * 1024 / (1024 + 58)  # RoCEv2 over IPv4, path MTU 1024
alpha = float(alpha_ms) / 1e3
p = sinks + 1
d = int(math.log2(p))
twins = p - (1 << d)
levels = int(math.log2(p))  # the heap's deepest node
# The deepest any chunk travels in the binomial pipeline (crates/srdma-relay/src/schedule.rs).
depth = d + 1 + min(twins, d + 1)
step = alpha + c / B

def predict(kind, size):
    k = -(-size // c)
    return {
        "chain": (k + sinks - 1) * step,
        "tree": (2 * k + levels - 1) * step,
        "binomial": (k + depth - 1) * step,
    }[kind]

runs = collections.defaultdict(list)
order = []
for line in open(path):
    size, _, kind, t = line.split()
    if (size, kind) not in runs:
        order.append((size, kind))
    runs[(size, kind)].append(None if t == "failed" else float(t))

print(f"Schedules to {sinks} sinks, one namespace per node, every host's egress at {rate} "
      f"(tbf, burst {burst}), chunks of {chunk}, {slots} slots, {passes} passes; α = {alpha_ms} ms per chunk "
      f"step in the prediction. Completion time: the last sink's last chunk minus the source's "
      f"first chunk.\n")
print("| size | schedule | measured (s) | best | predicted (s) | best / predicted | vs chain |")
print("|---|---|---|---|---|---|---|")
best_chain = {}
for size, kind in order:
    ts = runs[(size, kind)]
    ok = [t for t in ts if t is not None]
    best = min(ok) if ok else None
    if kind == "chain":
        best_chain[size] = best
    pred = predict(kind, size_of(size))
    shown = ", ".join("failed" if t is None else f"{t:.3f}" for t in ts)
    ratio = f"{best / pred:.2f}" if best else "-"
    vs = f"{best / best_chain[size]:.2f}×" if best and best_chain.get(size) else "-"
    print(f"| {size} | {kind} | {shown} | {best if best is None else f'{best:.3f}'} | "
          f"{pred:.3f} | {ratio} | {vs} |")
EOF
cat "$OUT"
