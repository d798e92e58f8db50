#!/usr/bin/env bash
# MPI over UCX on srdma beside the MPIs' own transports, one host, in the same run (RUNS times
# each, alternating), every result checked by the programs:
#
#   1. MPI_Bcast of 1 GiB in 64 MiB calls (mpi_bcast.c), 2 and 3 ranks, beside `srdma relay
#      demo` moving the same GiB (2 ranks: a 1-hop chain; 3 ranks: a tree, root to two
#      sinks);
#   2. MPI_Allreduce (sum of doubles) and MPI_Alltoall, 16 MiB per call, 256 MiB in all, and a
#      send/recv stream at every size from 8 B to 64 MiB (mpi_coll.c), 2 and 3 ranks;
#   3. between two ranks an 8 B ping-pong and a 64 MiB send/recv stream (mpi_p2p.c), beside
#      `ucx_perftest -t ucp_put_bw -s 64MiB` through srdma;
#   4. between two network namespaces joined by a veth (MTU 1500): Open MPI's MPI_Bcast of
#      1 GiB with 2 ranks (one per namespace) and 4 (two per namespace, mapped by node), over
#      UCX on srdma and over TCP (ob1 + tcp), beside `srdma relay node` moving the same GiB
#      from one namespace to the other (a 1-hop chain).
#
# Each for Open MPI 4.1 and MPICH 4.0 (Debian's: ch4:ucx), in three ways:
#   srdma  over UCX on srdma: UCX_TLS=rc_verbs,ud_verbs,self, UCX's defaults otherwise, one
#          srdma device (127.0.0.1 in a namespace of its own); Open MPI `--mca pml ucx --mca
#          osc ucx`; MPICH with MPIR_CVAR_NOLOCAL=1 (ranks of one host use the netmod, UCX,
#          not MPICH's own shared memory);
#   shm    the MPI's own shared memory: Open MPI ob1 + vader, MPICH's ch4 shared memory;
#   tcp    the MPI over TCP: Open MPI ob1 + tcp, MPICH over UCX's tcp transport
#          (MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp,self).
#
# Prints medians (and ranges) and the ratios; the summary replaces the block between
# `<!-- mpi.sh:begin -->` and `<!-- mpi.sh:end -->` of benchmarks/README.md; raw outputs in
# benchmarks/results/mpi/.
#
# Knobs: SRDMA_BIN (its directory must hold libibverbs.so), RANKS ("2 3"), RUNS (5),
# MPIS ("ompi mpich"), TOTAL_MIB (1024), CHUNK_MIB (64), SKIP_BCAST=1, SKIP_COLL=1,
# SKIP_P2P=1, SKIP_NETNS=1. Root (a network namespace); installs Open MPI, MPICH and UCX.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/benchmarks/readme_block.sh"
README=$ROOT/benchmarks/README.md
RES=$ROOT/benchmarks/results/mpi
mkdir -p "$RES"
rm -f "$RES"/*.txt "$RES/block.md"
[ "$(id -u)" = 0 ] || { echo "mpi.sh: run as root" >&2; exit 1; }
need=()
command -v mpicc >/dev/null || need+=(openmpi-bin libopenmpi-dev)
{ command -v mpiexec.mpich && [ -e /usr/lib/x86_64-linux-gnu/libmpich.so ]; } >/dev/null ||
    need+=(mpich libmpich-dev)
command -v ucx_info >/dev/null || need+=(ucx-utils)
command -v jq >/dev/null || need+=(jq)
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
DIR=$(mktemp -d /tmp/srdma-mpi.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
MPIS=${MPIS:-ompi mpich}
for prog in mpi_bcast mpi_coll mpi_p2p; do
    for m in $MPIS; do
        cc=mpicc
        [ "$m" = mpich ] && cc=mpicc.mpich
        $cc -O2 -o "$DIR/$prog.$m" "$ROOT/benchmarks/$prog.c" || exit 1
    done
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
UCX_SRDMA=rc_verbs,ud_verbs,self

# run MPI MODE NP PROG ARGS...: the output of $DIR/PROG.MPI on NP ranks under MODE.
run() {
    local mpi=$1 mode=$2 np=$3 prog=$DIR/$4.$1
    shift 4
    case $mpi.$mode in
    ompi.shm) mpirun --oversubscribe -np "$np" --mca pml ob1 --mca btl self,vader "$prog" "$@" ;;
    ompi.tcp) mpirun --oversubscribe -np "$np" --mca pml ob1 --mca btl self,tcp "$prog" "$@" ;;
    ompi.srdma) unshare -n sh -c "ip link set lo up; UCX_TLS=$UCX_SRDMA \
        '$S' exec --device 127.0.0.1 mpirun --oversubscribe -np $np --mca pml ucx --mca osc ucx \
        -x UCX_TLS -x LD_LIBRARY_PATH $prog $*" ;;
    mpich.shm) mpiexec.mpich -n "$np" "$prog" "$@" ;;
    mpich.tcp) MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp,self mpiexec.mpich -n "$np" "$prog" "$@" ;;
    mpich.srdma) unshare -n sh -c "ip link set lo up; UCX_TLS=$UCX_SRDMA \
        MPIR_CVAR_NOLOCAL=1 '$S' exec --device 127.0.0.1 mpiexec.mpich -n $np $prog $*" ;;
    esac 2>&1
}

# until_done MPI MODE NP PROG ARGS...: `run`, ended 2 s after the program printed its last
# line if it has not ended by then, and after 300 s in any case (MPICH over UCX's tcp
# transport with 3 ranks prints its checked result and never returns from MPI_Finalize).
until_done() {
    local f pid i
    f=$(mktemp "$DIR/out.XXXXXX")
    run "$@" >"$f" 2>&1 &
    pid=$!
    for i in $(seq 600); do
        kill -0 $pid 2>/dev/null || break
        if grep -q '^bcast .* bad$\|failures over\|^sendrecv 64 MiB' "$f"; then
            sleep 2
            break
        fi
        sleep 0.5
    done
    if kill -0 $pid 2>/dev/null; then
        echo "(ended by mpi.sh)"
        pkill -f "$DIR/mpi_" 2>/dev/null
        sleep 1
        pkill -9 -f "$DIR/mpi_" 2>/dev/null
    fi
    wait $pid 2>/dev/null
    cat "$f"
    rm -f "$f"
}

# VALUES holds one line per figure: "KEY MODE VALUE" (VALUE 0 when the run failed or a rank
# saw wrong data).
VALUES=$RES/values.txt
: >"$VALUES"
put() { echo "$1 $2 ${3:-0}" >>"$VALUES"; }

# relay NP: MiB/s of the slowest sink of `srdma relay demo` moving TOTAL_MIB to NP-1 sinks.
relay() {
    local topo=(--topology chain --hops 1)
    [ "$1" = 3 ] && topo=(--topology tree --fanout 2 --depth 1)
    timeout 120 unshare -n sh -c "ip link set lo up; '$S' relay demo ${topo[*]} \
        --size ${TOTAL_MIB:-1024}MiB --quiet" 2>&1 | tee -a "$RES/relay-$1.txt" |
        awk '/^sink .* verified/{v = $(NF-7); if (min == "" || v < min) min = v} /^relay: OK/{ok = 1}
             END{print (ok ? min : 0)}'
}

for r in $(seq "${RUNS:-5}"); do
    for np in ${RANKS:-2 3}; do
        for mpi in $MPIS; do
            for mode in srdma shm tcp; do
                if [ -z "${SKIP_BCAST:-}" ]; then
                    out=$(until_done $mpi $mode "$np" mpi_bcast "${TOTAL_MIB:-1024}" "${CHUNK_MIB:-64}")
                    echo "$out" >>"$RES/bcast-$mpi-$mode-$np.txt"
                    put "bcast/$mpi/$np" $mode "$(echo "$out" | awk '/^bcast .* 0 bad$/{print $(NF-3)}')"
                fi
                if [ -z "${SKIP_COLL:-}" ]; then
                    out=$(until_done $mpi $mode "$np" mpi_coll 64 16 256)
                    echo "$out" >>"$RES/coll-$mpi-$mode-$np.txt"
                    ok=$(echo "$out" | grep -c '^PASSED: 0 failures')
                    for op in allreduce alltoall; do
                        put "$op/$mpi/$np" $mode "$(echo "$out" | awk -v op=$op -v ok="$ok" '$1 == op && / 0 bad$/ && ok {print $(NF-3)}')"
                    done
                    if [ "$np" = 2 ]; then
                        echo "$out" | awk -v ok="$ok" '/^sendrecv .* 0 bad$/ && ok {print $2, $(NF-3)}' |
                            while read -r n v; do put "sweep/$mpi/$n" $mode "$v"; done
                    fi
                fi
            done
        done
        [ -z "${SKIP_BCAST:-}" ] && put "bcast/relay/$np" relay "$(relay "$np")"
    done
    if [ -z "${SKIP_P2P:-}" ]; then
        for mpi in $MPIS; do
            for mode in srdma shm tcp; do
                out=$(until_done $mpi $mode 2 mpi_p2p)
                echo "$out" >>"$RES/p2p-$mpi-$mode.txt"
                put "pingpong/$mpi" $mode "$(echo "$out" | awk '/^pingpong/{print $(NF-1)}')"
                put "stream/$mpi" $mode "$(echo "$out" | awk '/^sendrecv .* 0 bad$/{print $(NF-3)}')"
            done
        done
        # ucx_perftest ucp_put_bw of 64 MiB through srdma (MiB/s: UCX's MB are MiB).
        put put_bw srdma "$(timeout 120 unshare -n sh -c "ip link set lo up; export UCX_TLS=$UCX_SRDMA; \
            '$S' exec --device 127.0.0.1 ucx_perftest -t ucp_put_bw -s 67108864 -n 32 >/dev/null 2>&1 & \
            sleep 1.5; '$S' exec --device 127.0.0.1 ucx_perftest 127.0.0.1 -t ucp_put_bw \
            -s 67108864 -n 32 2>&1; wait" | tee -a "$RES/put_bw.txt" | awk '/^Final:/{print $(NF-2)}')"
    fi
done

# ------------------------------------------------------------ 4. between two namespaces
# Two "hosts" (namespaces NS-0 and NS-1, 10.95.0.1 and .2 on a veth); mpirun runs in the
# first and starts its daemons through an agent (plm_rsh_agent) that enters the namespace,
# under `srdma exec --device` of the host's address when SRDMA is set.
netns() {
    local ns=srdmampi$$ i r np mode out
    for i in 0 1; do ip netns add $ns-$i && ip -n $ns-$i link set lo up; done
    ip link add eth0 netns $ns-0 type veth peer name eth0 netns $ns-1
    for i in 0 1; do
        ip -n $ns-$i addr add 10.95.0.$((i + 1))/24 dev eth0
        ip -n $ns-$i link set eth0 up
    done
    # shellcheck disable=SC2016 # expanded by the agent
    printf '%s\n' '#!/bin/sh' 'host=$1; shift' \
        'addr=$(ip -n "$host" -4 -o addr show dev eth0 | sed -n "s/.* inet \([0-9.]*\).*/\1/p")' \
        'exec ip netns exec "$host" unshare --uts sh -c '\''hostname "$0" && exec "$@"'\'' "$host" \' \
        '    ${SRDMA:+"$SRDMA" exec --device "ucx=$addr"} sh -c "$*"' >"$DIR/agent"
    chmod +x "$DIR/agent"
    printf '%s slots=2\n' $ns-0 $ns-1 >"$DIR/hosts"
    printf '%s\n' '[transfer]' 'chunk_size = "1MiB"' '' '[[node]]' 'name = "a"' \
        'addr = "10.95.0.1"' 'role = "source"' "source = \"gen:${TOTAL_MIB:-1024}MiB\"" '' \
        '[[node]]' 'name = "b"' 'addr = "10.95.0.2"' 'role = "sink"' 'parent = "a"' \
        'sink = "discard"' >"$DIR/relay.toml"
    for r in $(seq "${RUNS:-5}"); do
        # 4 ranks mapped twice: by node (ranks 0 and 2 in one namespace, 1 and 3 in the
        # other: the broadcast's binomial tree crosses the veth twice) and by slot, mpirun's
        # default with two slots per host (0 and 1, then 2 and 3: it crosses once).
        for run in 2 4 4s; do
            local np=${run%s} map=node
            [ "$run" = 4s ] && map=slot
            for mode in srdma tcp; do
                local srdma="" mca=(--mca pml ob1 --mca btl self,tcp)
                if [ $mode = srdma ]; then
                    srdma=$S
                    mca=(--mca pml ucx --mca osc ucx -x UCX_TLS)
                fi
                # --bind-to none: each namespace's daemon numbers this machine's cores as
                # its own, and Open MPI's default binding put the first rank of every
                # "host" (and the threads it starts) on core 0 — both ranks of a 2-rank run
                # on one core, the other idle (srdma 180 MiB/s bound, 1136–1176 unbound).
                out=$(SRDMA=$srdma UCX_TLS=$UCX_SRDMA timeout 300 ip netns exec $ns-0 mpirun \
                    --hostfile "$DIR/hosts" -np $np --map-by $map --bind-to none \
                    --mca plm_rsh_agent "$DIR/agent" \
                    --mca oob_tcp_if_include eth0 --mca btl_tcp_if_include eth0 "${mca[@]}" \
                    "$DIR/mpi_bcast.ompi" "${TOTAL_MIB:-1024}" "${CHUNK_MIB:-64}" 2>&1)
                echo "$out" >>"$RES/netns-bcast-$mode-$run.txt"
                put "netns/$run" $mode "$(echo "$out" | awk '/^bcast .* 0 bad$/{print $(NF-3)}')"
            done
        done
        ip netns exec $ns-1 timeout 120 "$S" relay node --config "$DIR/relay.toml" --name b \
            --json >"$DIR/b.json" 2>>"$RES/netns-relay.txt" &
        sleep 0.5
        ip netns exec $ns-0 timeout 120 "$S" relay node --config "$DIR/relay.toml" --name a \
            >>"$RES/netns-relay.txt" 2>&1
        wait
        cat "$DIR/b.json" >>"$RES/netns-relay.txt"
        put netns/relay relay "$(jq -r 'select(.event == "report" and .ok) | .bytes / .seconds / 1048576' \
            "$DIR/b.json" 2>/dev/null | tail -1)"
    done
    for i in 0 1; do ip netns del $ns-$i; done
}
[ -z "${SKIP_NETNS:-}" ] && netns

START=$(date -u '+%Y-%m-%d %H:%M UTC')
COMMIT=$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)
{
    echo "<!-- mpi.sh:begin -->"
    echo "Run of $START on $COMMIT ($(nproc) CPUs; \`benchmarks/mpi.sh\`, RUNS=${RUNS:-5}: medians, range in brackets; every result checked; raw outputs in benchmarks/results/mpi/)."
    python3 - "$VALUES" "${TOTAL_MIB:-1024}" "${CHUNK_MIB:-64}" <<'PY'
import collections, statistics, sys
vals = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    key, mode, v = line.split()
    vals[key][mode].append(float(v))
total, chunk = sys.argv[2], sys.argv[3]
NAMES = {"ompi": "Open MPI", "mpich": "MPICH"}
SHM = {"ompi": "vader", "mpich": "ch4 shm"}

def med(key, mode):
    xs = vals.get(key, {}).get(mode)
    return statistics.median(xs) if xs else None

def cell(key, mode, fmt=".0f"):
    xs = vals.get(key, {}).get(mode)
    if not xs:
        return "-"
    return f"{statistics.median(xs):{fmt}} ({min(xs):{fmt}}–{max(xs):{fmt}})"

def ratio(a, b):
    return f"{a / b:.2f}×" if a and b else "-"

def table(title, keys, extra=None):
    """keys: (label, key) rows; srdma, shm and tcp columns and the two ratios."""
    rows = [(l, k) for l, k in keys if k in vals]
    if not rows:
        return
    print()
    print(title)
    print()
    head = "| | srdma (UCX) | own shared memory | TCP | srdma / shm | srdma / TCP |"
    if extra:
        head += f" {extra[0]} | srdma / {extra[1]} |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for label, key in rows:
        s, m, t = med(key, "srdma"), med(key, "shm"), med(key, "tcp")
        row = f"| {label} | {cell(key, 'srdma')} | {cell(key, 'shm')} | {cell(key, 'tcp')} | {ratio(s, m)} | {ratio(s, t)} |"
        if extra:
            ek, em = extra[2](key)
            row += f" {cell(ek, em)} | {ratio(s, med(ek, em))} |"
        print(row)

mpis = [m for m in ("ompi", "mpich") if any(k.endswith(f"/{m}") or f"/{m}/" in k for k in vals)]
ranks = sorted({k.split("/")[2] for k in vals if k.startswith("bcast/") and "/relay/" not in k})
table(f"MPI_Bcast of {total} MiB in {chunk} MiB calls, MiB/s (`srdma relay demo` moving the same bytes: 2 ranks a 1-hop chain, 3 a tree from the root to two sinks; its slowest sink)",
      [(f"{NAMES[m]}, {n} ranks", f"bcast/{m}/{n}") for m in mpis for n in ranks],
      ("srdma relay MiB/s", "relay", lambda k: (f"bcast/relay/{k.split('/')[2]}", "relay")))
coll_ranks = sorted({k.split("/")[2] for k in vals if k.startswith("allreduce/")})
table("MPI_Allreduce (sum of doubles) and MPI_Alltoall, 16 MiB per call, 256 MiB in all, MiB/s of the buffer",
      [(f"{NAMES[m]} {op}, {n} ranks", f"{op}/{m}/{n}") for m in mpis for op in ("allreduce", "alltoall") for n in coll_ranks])
sizes = sorted({int(k.split("/")[2]) for k in vals if k.startswith("sweep/")})
for m in mpis:
    table(f"{NAMES[m]}, send/recv stream between 2 ranks by message size (mpi_coll.c), MiB/s",
          [(f"{n} B" if n < 1024 else f"{n >> 10} KiB" if n < 1 << 20 else f"{n >> 20} MiB", f"sweep/{m}/{n}") for n in sizes])
if any(k.startswith("netns/") for k in vals):
    print()
    print(f"Between two network namespaces (veth, MTU 1500; RoCE path MTU 1024): Open MPI's MPI_Bcast of {total} MiB in {chunk} MiB calls, 2 ranks (one per namespace) and 4 (two per namespace, mapped by node: the tree crosses the veth twice; and by slot, mpirun's default: once), MiB/s, beside `srdma relay node` moving the same bytes from one namespace to the other.")
    print()
    print("| ranks | srdma (UCX) | TCP | srdma relay | srdma / TCP | srdma / relay |")
    print("|---|---|---|---|---|---|")
    for n, label in (("2", "2"), ("4", "4, by node"), ("4s", "4, by slot")):
        k = f"netns/{n}"
        if k not in vals:
            continue
        s, t, r = med(k, "srdma"), med(k, "tcp"), med("netns/relay", "relay")
        print(f"| {label} | {cell(k, 'srdma')} | {cell(k, 'tcp')} | {cell('netns/relay', 'relay')} | {ratio(s, t)} | {ratio(s, r)} |")
lat = [(f"{NAMES[m]}, 8 B ping-pong, half round trip (µs)", f"pingpong/{m}") for m in mpis]
if any(k in vals for _, k in lat):
    print()
    print("Between two ranks (mpi_p2p.c): an 8 B ping-pong and a 64 MiB send/recv stream; the stream beside `ucx_perftest -t ucp_put_bw -s 64MiB` through srdma.")
    print()
    print("| 2 ranks | srdma (UCX) | own shared memory | TCP | srdma / shm | srdma / TCP |")
    print("|---|---|---|---|---|---|")
    for m in mpis:
        for label, key, fmt in ((f"{NAMES[m]}, 8 B ping-pong, half round trip (µs)", f"pingpong/{m}", ".2f"),
                                (f"{NAMES[m]}, 64 MiB send/recv (MiB/s)", f"stream/{m}", ".0f")):
            s, sh, t = med(key, "srdma"), med(key, "shm"), med(key, "tcp")
            print(f"| {label} | {cell(key, 'srdma', fmt)} | {cell(key, 'shm', fmt)} | {cell(key, 'tcp', fmt)} | {ratio(s, sh)} | {ratio(s, t)} |")
    pb = med("put_bw", "srdma")
    print(f"| ucx_perftest ucp_put_bw 64 MiB on srdma (MiB/s) | {cell('put_bw', 'srdma')} | | | " +
          " ".join(f"{NAMES[m]} send/recv / put_bw: {ratio(med(f'stream/{m}', 'srdma'), pb)}" for m in mpis) + " | |")
PY
    echo "<!-- mpi.sh:end -->"
} >"$RES/block.md"
cat "$RES/block.md"
readme_block mpi.sh "$RES/block.md" "$README"
