#!/usr/bin/env bash
# The drop-in libibverbs against the Rust API, and the cost of sharing one address:
#
#   1. Debian's ib_write_bw on srdma (`srdma exec`) against `srdma perf write-bw` (the same
#      engine through the Rust API), 64 KiB and 1 MiB messages;
#   2. Debian's ib_send_lat, 8 B, against `srdma perf send-lat`;
#   3. `srdma perf write-bw` 64 KiB with both processes on one address (UDP 4791 shared
#      through the port keeper, packets steered by QPN) against two addresses.
#
# Loopback only: server 127.204.0.1, client 127.204.0.2 (or 127.204.0.1 for the shared
# case). Each pair of figures is measured back to back in this run; RUNS repetitions each
# (default 3), the median kept; bandwidth runs last DURATION seconds (default 3). Writes benchmarks/results/dropin.md and prints it.
# Needs: root or not; perftest (apt-get install perftest), python3; builds srdma --release.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RES=$ROOT/benchmarks/results
RUNS=${RUNS:-3}
DUR=${DURATION:-3}
ITERS_LAT=${ITERS_LAT:-20000}
mkdir -p "$RES"
command -v ib_write_bw >/dev/null || { echo "dropin.sh: install perftest" >&2; exit 1; }
(cd "$ROOT" && cargo build --release -q -p srdma-cli -p srdma-verbs)
S=$ROOT/target/release/srdma
A=127.204.0.1
B=127.204.0.2
PORT=18900

next_port() { PORT=$((PORT + 1)); }

# perftest BW average (MB/s = 2^20 B/s) of the client's table.
perftest_bw() { # size
    next_port
    $S exec --device $A ib_write_bw -x 1 -s "$1" -D "$DUR" -p $PORT >/dev/null 2>&1 &
    sleep 0.4
    $S exec --device $B ib_write_bw -x 1 -s "$1" -D "$DUR" -p $PORT $A 2>/dev/null |
        awk -v s="$1" '$1 == s && NF >= 5 { print $4 }'
    wait
}

# perftest t_typical (median, usec) of ib_send_lat.
perftest_lat() { # size iters
    next_port
    $S exec --device $A ib_send_lat -x 1 -s "$1" -n "$2" -p $PORT >/dev/null 2>&1 &
    sleep 0.4
    $S exec --device $B ib_send_lat -x 1 -s "$1" -n "$2" -p $PORT $A 2>/dev/null |
        awk -v s="$1" '$1 == s && NF >= 8 { print $5 }'
    wait
}

json_field() { python3 -c "import json,sys; print(round(json.load(sys.stdin)['results'][0]['$1'], 2))"; }

# srdma perf write-bw (the Rust API), MiB/s; server and client addresses as given.
srdma_bw() { # size server client
    next_port
    $S perf write-bw -s "$1" -D "$DUR" -p $PORT --bind "$2" >/dev/null 2>&1 &
    sleep 0.4
    $S perf write-bw -s "$1" -D "$DUR" -p $PORT --bind "$3" "$2" --json 2>/dev/null |
        json_field bw_avg_mib_s
    wait
}

srdma_lat() { # size iters
    next_port
    $S perf send-lat -s "$1" -n "$2" -p $PORT --bind $A >/dev/null 2>&1 &
    sleep 0.4
    $S perf send-lat -s "$1" -n "$2" -p $PORT --bind $B $A --json 2>/dev/null |
        json_field t_typical_us
    wait
}

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
ratio() { python3 -c "print(f'{float($1) / float($2):.2f}')"; }

rows=()
for size in 65536 1048576; do
    d=(); r=()
    for _ in $(seq "$RUNS"); do
        d+=("$(perftest_bw $size)")
        r+=("$(srdma_bw $size $A $B)")
    done
    dm=$(printf '%s\n' "${d[@]}" | median)
    rm_=$(printf '%s\n' "${r[@]}" | median)
    rows+=("| ib_write_bw $size B (MB/s) | $dm | srdma perf write-bw: $rm_ | $(ratio "$dm" "$rm_")× | ≥ 0.9× |")
done
d=(); r=()
for _ in $(seq "$RUNS"); do
    d+=("$(perftest_lat 8 $ITERS_LAT)")
    r+=("$(srdma_lat 8 $ITERS_LAT)")
done
dm=$(printf '%s\n' "${d[@]}" | median)
rm_=$(printf '%s\n' "${r[@]}" | median)
rows+=("| ib_send_lat 8 B, typical (µs) | $dm | srdma perf send-lat: $rm_ | $(ratio "$dm" "$rm_")× | ≤ 1.1× |")
s=(); t=()
for _ in $(seq "$RUNS"); do
    s+=("$(srdma_bw 65536 $A $A)")
    t+=("$(srdma_bw 65536 $A $B)")
done
sm=$(printf '%s\n' "${s[@]}" | median)
tm=$(printf '%s\n' "${t[@]}" | median)
rows+=("| write-bw 64 KiB, one shared address (MiB/s) | $sm | two addresses: $tm | $(ratio "$sm" "$tm")× | ≥ 0.9× |")

{
    echo "Drop-in libibverbs on loopback, $(date -u +%Y-%m-%d), $(nproc) cores, medians of $RUNS runs ($0):"
    echo
    echo "| measurement | drop-in / shared | baseline (same run) | ratio | target |"
    echo "| --- | --- | --- | --- | --- |"
    printf '%s\n' "${rows[@]}"
} | tee "$RES/dropin.md"
