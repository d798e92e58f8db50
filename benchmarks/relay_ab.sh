#!/usr/bin/env bash
# Alternating runs of two srdma binaries (A, B, A, B, …) of the relay's benchmarks, for
# before/after figures of a change to srdma-relay on this noisy VM (as benchmarks/ab.sh does
# for `srdma perf`):
#
# - `srdma relay demo` on loopback addresses, each run in a network namespace of its own:
#   the 2-hop chain (the demo's default), a 5-hop chain, a tree of fan-out 2 (depth 2: six
#   receivers) and a binomial pipeline to 8 sinks, SIZE (1GiB) each. A line per run: the
#   slowest sink's throughput (its report's bytes / seconds, MiB/s) and the whole transfer's
#   (bytes / first chunk at the source to last chunk at the last sink, MiB/s).
# - With RELAY_SH=1 also benchmarks/relay.sh (PASSES=1, its own namespaces, tbf rates as it
#   sets them), once per binary and run, alternating too: a line per run with the last sink's
#   MB/s of every row (link setting / hops).
#
# Then the median and range of every figure, per binary, as Markdown.
#
# Usage: benchmarks/relay_ab.sh A B RUNS
#   e.g. benchmarks/relay_ab.sh old/srdma new/srdma 5
# Knobs: SIZE (1GiB), CASES ("chain2 chain5 tree binomial8"; empty: no demo), RELAY_SH (0),
# RELAY_SIZE (256MiB) and RELAY_RATES ("200mbit 500mbit"): relay.sh's SIZE and RATES; it adds
# unlimited links itself; KEEP=DIR keeps its tables there. Needs root (unshare, network namespaces), jq and python3.
set -euo pipefail
[ $# -eq 3 ] || { sed -n '2,21p' "$0"; exit 2; }
A=$(realpath "$1") B=$(realpath "$2") RUNS=$3
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SIZE=${SIZE:-1GiB}
CASES=${CASES-"chain2 chain5 tree binomial8"}
RELAY_SH=${RELAY_SH:-0}
RELAY_SIZE=${RELAY_SIZE:-256MiB}
RELAY_RATES=${RELAY_RATES:-"200mbit 500mbit"}
WORK=$(mktemp -d /tmp/srdma-relay-ab.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
LINES=$WORK/lines

args_of() {
    case $1 in
        chain2) echo "" ;;
        chain5) echo "--hops 5" ;;
        tree) echo "--topology tree --fanout 2" ;;
        binomial8) echo "--topology binomial --sinks 8" ;;
        *) echo "relay_ab.sh: unknown case $1" >&2; exit 2 ;;
    esac
}

# One demo run of binary $2 (labelled $1), case $3: a line "LABEL CASE slowest total".
demo() {
    local out
    # shellcheck disable=SC2046
    out=$(unshare -n bash -c 'ip link set lo up; exec "$@"' _ "$2" relay demo --json --quiet \
        --size "$SIZE" $(args_of "$3") 2>/dev/null | grep '^{"event":"report"') || {
        echo "$1 $3 FAILED"
        return
    }
    jq -rs --arg l "$1" --arg c "$3" '
        (map(select(.role == "sink" or .role == "relay+sink"))) as $s
        | ($s | map(.bytes / .seconds / 1048576) | min) as $slow
        | (map(select(.role == "source"))[0].first_chunk_at) as $t0
        | ($s | map(.last_chunk_at) | max) as $t1
        | "\($l) \($c) \($slow * 10 | round / 10) \(($s[0].bytes / ($t1 - $t0) / 1048576) * 10 | round / 10)"
    ' <<<"$out"
}

# One relay.sh pass with binary $2 (labelled $1): a line "LABEL relay.sh/<links>/<hops> MB/s" per row.
relay_sh() {
    local out=$WORK/relay-$1-$RANDOM.md
    SRDMA_BIN=$2 PASSES=1 SIZE=$RELAY_SIZE RATES=$RELAY_RATES OUT=$out "$ROOT/benchmarks/relay.sh" >/dev/null 2>&1 || {
        echo "$1 relay.sh FAILED"
        return
    }
    if [ -n "${KEEP:-}" ]; then cp "$out" "$KEEP/"; fi
    awk -F'|' -v l="$1" '$2 ~ /^ *1 *$/ && $3 ~ /[0-9]/ {
        gsub(/ /, "", $3); gsub(/^ +| +$/, "", $4); gsub(/ /, "", $5); gsub(/ /, "_", $4)
        printf "%s relay.sh/%s/%shop %s -\n", l, $4, $3, $5
    }' "$out"
}

: >"$LINES"
for _ in $(seq "$RUNS"); do
    for c in $CASES; do
        demo A "$A" "$c" | tee -a "$LINES"
        demo B "$B" "$c" | tee -a "$LINES"
    done
    if [ "$RELAY_SH" = 1 ]; then
        relay_sh A "$A" | tee -a "$LINES"
        relay_sh B "$B" | tee -a "$LINES"
    fi
done

echo
echo "A = \`$A\`, B = \`$B\`; $RUNS alternating runs each; load average $(cut -d' ' -f1-3 /proc/loadavg) at the end."
echo
python3 - "$LINES" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) < 3 or f[2] == "FAILED":
        runs.setdefault((f[1], f[0]), {}).setdefault("failed", []).append(1)
        continue
    for i, v in enumerate(f[2:]):
        if v != "-":
            runs.setdefault((f[1], f[0]), {}).setdefault(i, []).append(float(v))
cases = sorted({c for c, _ in runs}, key=lambda c: (c.startswith("relay.sh"), c))
def cell(vals):
    if not vals:
        return ""
    return f"{statistics.median(vals):.1f} ({min(vals):.1f}–{max(vals):.1f})"
print("| case | A: slowest sink | B: slowest sink | B / A | A: whole transfer | B: whole transfer | B / A | failed A, B |")
print("|---|---:|---:|---:|---:|---:|---:|---|")
for c in cases:
    a, b = runs.get((c, "A"), {}), runs.get((c, "B"), {})
    ratio = lambda k: (f"{statistics.median(b[k]) / statistics.median(a[k]):.2f}"
                       if a.get(k) and b.get(k) else "")
    print(f"| {c} | {cell(a.get(0))} | {cell(b.get(0))} | {ratio(0)} | {cell(a.get(1))} | "
          f"{cell(b.get(1))} | {ratio(1)} | {len(a.get('failed', []))}, {len(b.get('failed', []))} |")
EOF
