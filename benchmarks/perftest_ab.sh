#!/usr/bin/env bash
# Alternating Debian perftest pairs on this host through two (or more) srdma builds, for
# before/after figures on a noisy VM: RUNS rounds of each build in turn, each a server
# (`srdma exec PROGRAM ARGS`) and a client to 127.0.0.1; one line per run with the build's
# directory and the client's result line — t_min, t_max, typical, average, 99 % and 99.9 %
# (µs) for a latency test, peak and average (MB/s) for a bandwidth test. Shared memory
# carries the pair unless SRDMA_SHM=0 (UDP) is in the environment.
#
# Usage: benchmarks/perftest_ab.sh RUNS "PROGRAM ARGS" SRDMA_BIN...
#   e.g. benchmarks/perftest_ab.sh 3 "ib_write_lat -s 4096 -n 20000" old/srdma new/srdma
set -u
[ $# -ge 3 ] || { sed -n '2,10p' "$0"; exit 2; }
RUNS=$1 CMD=$2
shift 2
read -r -a ARGS <<< "$CMD"
case ${ARGS[0]} in
    *_lat) FIELDS='"min="$3" max="$4" typical="$5" avg="$6" p99="$8" p99.9="$9' ;;
    *) FIELDS='"peak="$3" avg="$4' ;;
esac
for _ in $(seq "$RUNS"); do
    for bin in "$@"; do
        "$bin" exec "${ARGS[@]}" > /dev/null 2>&1 &
        sleep 0.7
        line=$(timeout 300 "$bin" exec "${ARGS[@]}" 127.0.0.1 2>&1 |
            awk "/#bytes/{getline; print $FIELDS}")
        wait
        echo "$(dirname "$bin") ${line:-failed}"
    done
done
