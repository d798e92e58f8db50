#!/usr/bin/env bash
# MPI_Bcast of 1 GiB (64 MiB calls, data checked on every rank) on one host, Open MPI 4.1,
# and between two ranks an 8 B ping-pong and a 64 MiB send/recv stream (mpi_p2p.c):
# over UCX on srdma (`--mca pml ucx`, UCX_TLS=rc_verbs,ud_verbs,self, UCX's defaults
# otherwise, one srdma device: 127.0.0.1 in a namespace of its own) beside Open MPI's own
# shared memory (ob1 + vader) and TCP (ob1 + tcp), in the same run, RUNS times each,
# alternating; the stream also beside `ucx_perftest -t ucp_put_bw -s 64MiB` through srdma.
# Prints medians (and ranges) and the ratios; the summary replaces the block
# between `<!-- mpi.sh:begin -->` and `<!-- mpi.sh:end -->` of benchmarks/README.md.
#
# Knobs: SRDMA_BIN (its directory must hold libibverbs.so), RANKS ("2 3"), RUNS (5),
# TOTAL_MIB (1024), CHUNK_MIB (64). Root (a network namespace); installs Open MPI and UCX.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/benchmarks/readme_block.sh"
README=$ROOT/benchmarks/README.md
RES=$ROOT/benchmarks/results/mpi
mkdir -p "$RES"
[ "$(id -u)" = 0 ] || { echo "mpi.sh: run as root" >&2; exit 1; }
need=()
command -v mpicc >/dev/null || need+=(openmpi-bin libopenmpi-dev)
command -v ucx_info >/dev/null || need+=(ucx-utils)
if [ ${#need[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null 2>&1
fi
if [ -n "${SRDMA_BIN:-}" ]; then
    S=$SRDMA_BIN
else
    (cd "$ROOT" && cargo build --release -q -p srdma-cli -p srdma-verbs) || exit 1
    S=$ROOT/target/release/srdma
fi
PROG=$(mktemp -d /tmp/srdma-mpi.XXXXXX)/mpi_bcast
mpicc -O2 -o "$PROG" "$ROOT/benchmarks/mpi_bcast.c" || exit 1
P2P=$(dirname "$PROG")/mpi_p2p
mpicc -O2 -o "$P2P" "$ROOT/benchmarks/mpi_p2p.c" || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ARGS="${TOTAL_MIB:-1024} ${CHUNK_MIB:-64}"

# run MODE NP PROG ARGS...: the program's output under MODE.
run() {
    local mode=$1 np=$2
    shift 2
    case $mode in
    vader) timeout 300 mpirun --oversubscribe -np "$np" --mca pml ob1 --mca btl self,vader "$@" 2>&1 ;;
    tcp) timeout 300 mpirun --oversubscribe -np "$np" --mca pml ob1 --mca btl self,tcp "$@" 2>&1 ;;
    srdma) timeout 300 unshare -n sh -c "ip link set lo up; UCX_TLS=rc_verbs,ud_verbs,self \
        '$S' exec --device 127.0.0.1 mpirun --oversubscribe -np $np --mca pml ucx --mca osc ucx \
        -x UCX_TLS -x LD_LIBRARY_PATH $*" 2>&1 ;;
    esac
}

# one MODE NP: prints MiB/s of the broadcast (or 0 when the run failed or a rank saw wrong
# data).
one() {
    local out
    out=$(run "$1" "$2" "$PROG" $ARGS)
    echo "$out" >>"$RES/$1-$2.txt"
    echo "$out" | awk '/^bcast .* 0 bad$/{print $(NF-3); found=1} END{if (!found) print 0}'
}

# p2p MODE: prints "half-RTT-us MiB/s" of mpi_p2p (0 0 when it failed).
p2p() {
    local out
    out=$(run "$1" 2 "$P2P")
    echo "$out" >>"$RES/p2p-$1.txt"
    echo "$out" | awk '/^pingpong/{l=$(NF-1)} /^sendrecv .* 0 bad$/{b=$(NF-3)} END{print (l ? l : 0), (b ? b : 0)}'
}

# put_bw: ucx_perftest ucp_put_bw of 64 MiB through srdma (MiB/s, UCX's MB are MiB).
put_bw() {
    timeout 120 unshare -n sh -c "ip link set lo up; export UCX_TLS=rc_verbs,ud_verbs,self; \
        '$S' exec --device 127.0.0.1 ucx_perftest -t ucp_put_bw -s 67108864 -n 32 >/dev/null 2>&1 & \
        sleep 1.5; '$S' exec --device 127.0.0.1 ucx_perftest 127.0.0.1 -t ucp_put_bw \
        -s 67108864 -n 32 2>&1; wait" | tee -a "$RES/put_bw.txt" | awk '/^Final:/{print $(NF-2)}'
}

OUT=()
say() { OUT+=("$*"); echo "$*"; }
START=$(date -u '+%Y-%m-%d %H:%M UTC')
COMMIT=$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)
say "| ranks | srdma (UCX) MiB/s | vader MiB/s | TCP MiB/s | srdma / vader | srdma / TCP |"
say "|---|---|---|---|---|---|"
for np in ${RANKS:-2 3}; do
    rm -f "$RES"/*-"$np".txt
    declare -A v=([srdma]="" [vader]="" [tcp]="")
    for r in $(seq "${RUNS:-5}"); do
        for mode in srdma vader tcp; do
            v[$mode]+="$(one "$mode" "$np") "
        done
    done
    row=$(python3 - "$np" "${v[srdma]}" "${v[vader]}" "${v[tcp]}" <<'PY'
import statistics, sys
np, *cols = sys.argv[1:]
cols = [[float(x) for x in c.split()] for c in cols]
med = [statistics.median(c) for c in cols]
cell = lambda c, m: f"{m:.0f} ({min(c):.0f}–{max(c):.0f})"
r = lambda a, b: f"{a / b:.2f}×" if b > 0 else "-"
print(f"| {np} | {cell(cols[0], med[0])} | {cell(cols[1], med[1])} | {cell(cols[2], med[2])} | {r(med[0], med[1])} | {r(med[0], med[2])} |")
PY
)
    say "$row"
done
say ""
say "| 2 ranks | srdma (UCX) | vader | TCP | srdma / vader | srdma / TCP |"
say "|---|---|---|---|---|---|"
rm -f "$RES"/p2p-*.txt "$RES/put_bw.txt"
declare -A lat=([srdma]="" [vader]="" [tcp]="") bw=([srdma]="" [vader]="" [tcp]="")
putbw=""
for r in $(seq "${RUNS:-5}"); do
    for mode in srdma vader tcp; do
        read -r l b < <(p2p "$mode")
        lat[$mode]+="$l "
        bw[$mode]+="$b "
    done
    putbw+="$(put_bw) "
done
python3 - "${lat[srdma]}" "${lat[vader]}" "${lat[tcp]}" "${bw[srdma]}" "${bw[vader]}" "${bw[tcp]}" "$putbw" <<'PY' | while read -r row; do say "$row"; done
import statistics, sys
c = [[float(x) for x in a.split()] for a in sys.argv[1:]]
m = [statistics.median(x) for x in c]
cell = lambda x, v, f: f"{v:{f}} ({min(x):{f}}–{max(x):{f}})"
r = lambda a, b: f"{a / b:.2f}×" if b > 0 else "-"
print(f"| 8 B ping-pong, half round trip (µs) | {cell(c[0], m[0], '.2f')} | {cell(c[1], m[1], '.2f')} | {cell(c[2], m[2], '.2f')} | {r(m[0], m[1])} | {r(m[0], m[2])} |")
print(f"| 64 MiB send/recv (MiB/s) | {cell(c[3], m[3], '.0f')} | {cell(c[4], m[4], '.0f')} | {cell(c[5], m[5], '.0f')} | {r(m[3], m[4])} | {r(m[3], m[5])} |")
print(f"| ucx_perftest ucp_put_bw 64 MiB on srdma (MiB/s) | {cell(c[6], m[6], '.0f')} | | | send/recv / put_bw: {r(m[3], m[6])} | |")
PY

BLOCK=$(
    echo "<!-- mpi.sh:begin -->"
    echo "Run of $START on $COMMIT ($(nproc) CPUs; \`benchmarks/mpi.sh\`: MPI_Bcast of ${TOTAL_MIB:-1024} MiB in ${CHUNK_MIB:-64} MiB calls, data checked; medians of ${RUNS:-5} runs, range in brackets; raw outputs in benchmarks/results/mpi/)."
    echo
    printf '%s\n' "${OUT[@]}"
    echo "<!-- mpi.sh:end -->"
)
printf '%s\n' "$BLOCK" >"$RES/block.md"
readme_block mpi.sh "$RES/block.md" "$README"
