#!/usr/bin/env bash
# MPI_Bcast of 1 GiB (64 MiB calls, data checked on every rank) on one host, Open MPI 4.1:
# over UCX on srdma (`--mca pml ucx`, UCX_TLS=rc_verbs,ud_verbs,self, UCX's defaults
# otherwise, one srdma device: 127.0.0.1 in a namespace of its own) beside Open MPI's own
# shared memory (ob1 + vader) and TCP (ob1 + tcp), in the same run, RUNS times each,
# alternating. Prints medians (and ranges) and the ratios; the summary replaces the block
# between `<!-- mpi.sh:begin -->` and `<!-- mpi.sh:end -->` of benchmarks/README.md.
#
# Knobs: SRDMA_BIN (its directory must hold libibverbs.so), RANKS ("2 3"), RUNS (5),
# TOTAL_MIB (1024), CHUNK_MIB (64). Root (a network namespace); installs Open MPI and UCX.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
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
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ARGS="${TOTAL_MIB:-1024} ${CHUNK_MIB:-64}"

# one MODE NP: prints MiB/s (or 0 when the run failed or a rank saw wrong data).
one() {
    local mode=$1 np=$2 out
    case $mode in
    vader) out=$(timeout 300 mpirun --oversubscribe -np "$np" --mca pml ob1 --mca btl self,vader "$PROG" $ARGS 2>&1) ;;
    tcp) out=$(timeout 300 mpirun --oversubscribe -np "$np" --mca pml ob1 --mca btl self,tcp "$PROG" $ARGS 2>&1) ;;
    srdma) out=$(timeout 300 unshare -n sh -c "ip link set lo up; UCX_TLS=rc_verbs,ud_verbs,self \
        '$S' exec --device 127.0.0.1 mpirun --oversubscribe -np $np --mca pml ucx --mca osc ucx \
        -x UCX_TLS -x LD_LIBRARY_PATH '$PROG' $ARGS" 2>&1) ;;
    esac
    echo "$out" >>"$RES/$mode-$np.txt"
    echo "$out" | awk '/^bcast .* 0 bad$/{print $(NF-3); found=1} END{if (!found) print 0}'
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
BLOCK=$(
    echo "<!-- mpi.sh:begin -->"
    echo "Run of $START on $COMMIT ($(nproc) CPUs; \`benchmarks/mpi.sh\`: MPI_Bcast of ${TOTAL_MIB:-1024} MiB in ${CHUNK_MIB:-64} MiB calls, data checked; medians of ${RUNS:-5} runs, range in brackets; raw outputs in benchmarks/results/mpi/)."
    echo
    printf '%s\n' "${OUT[@]}"
    echo "<!-- mpi.sh:end -->"
)
if grep -q "<!-- mpi.sh:begin -->" "$README"; then
    python3 - "$README" "$BLOCK" <<'PY'
import sys
p, block = sys.argv[1], sys.argv[2]
s = open(p).read()
a = s.index("<!-- mpi.sh:begin -->")
b = s.index("<!-- mpi.sh:end -->") + len("<!-- mpi.sh:end -->")
open(p, "w").write(s[:a] + block + s[b:])
PY
else
    printf '\n%s\n' "$BLOCK" >>"$README"
fi
