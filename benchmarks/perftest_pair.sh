#!/usr/bin/env bash
# perftest_pair.sh SRDMA_BIN PROGRAM ARGS...: one perftest pair through `srdma exec` on this
# host (server 127.0.13.1, client 127.0.13.2, GID index 1), over UDP unless SHM=1. Prints the
# client's exit status, its BW average (MB/s), the UDP receive-buffer drops of the run
# (`nstat`'s UdpRcvbufErrors) and perftest's failure status, if any. Used to compare two
# builds in alternation, e.g.:
#   for b in old new old new; do benchmarks/perftest_pair.sh $b/srdma ib_write_bw -b -q 64 -D 3; done
set -u
S=$1; shift
PORT=${PORT:-19953}
nstat -n >/dev/null
SRDMA_SHM=${SHM:-0} timeout 60 "$S" exec --device 127.0.13.1 "$@" -x 1 -p "$PORT" >/tmp/perftest_pair.s 2>&1 &
sleep 0.7
SRDMA_SHM=${SHM:-0} timeout 60 "$S" exec --device 127.0.13.2 "$@" -x 1 -p "$PORT" 127.0.13.1 >/tmp/perftest_pair.c 2>&1
c=$?
wait
echo "rc=$c bw=$(grep -E '^ [0-9]' /tmp/perftest_pair.c | tail -1 | awk '{print $4}') drops=$(nstat | awk '/UdpRcvbufErrors/{print $2}') $(grep -o 'Failed status [0-9]*' /tmp/perftest_pair.c | head -1)"
