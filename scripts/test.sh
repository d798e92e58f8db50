#!/usr/bin/env bash
# The README's test command: installs what the test suite needs on a Debian machine that has
# only a Rust toolchain, then runs every test of the workspace.
#
# Needs: tshark (decode comparisons), iproute2 and nftables (network namespaces, loss), gcc,
# libibverbs-dev and librdmacm-dev (C programs and layouts against the real headers),
# ibverbs-utils, rdmacm-utils, perftest, ucx-utils, openmpi-bin with libopenmpi-dev, mpich
# with libmpich-dev, libfabric-bin and qperf (the Debian-built tools and middleware the
# drop-in libibverbs and librdmacm run), python3-pyverbs (rdma-core's own test suite,
# compared with kernel rxe's), tgt, libiscsi-bin and libiscsi-dev (iSCSI and iSER: tgtd and
# libiscsi's initiator), redis-server, redis-tools, iperf3 and sockperf (socket programs on
# rsockets, `srdma exec --rsockets`). Installing needs root; without root, what is missing is
# named and the tests that need it skip or fail with that name (SRDMA_SKIP_NETNS=1 and
# SRDMA_SKIP_TSHARK=1 skip those on purpose).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v tshark >/dev/null || need+=(tshark)
command -v ip >/dev/null || need+=(iproute2)
command -v nft >/dev/null || need+=(nftables)
command -v gcc >/dev/null || need+=(gcc libc6-dev)
[ -f /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
[ -f /usr/include/rdma/rdma_cma.h ] || need+=(librdmacm-dev)
command -v ibv_rc_pingpong >/dev/null || need+=(ibverbs-utils)
command -v ib_write_bw >/dev/null || need+=(perftest)
command -v rping >/dev/null || need+=(rdmacm-utils)
[ -e /usr/share/doc/rdma-core/tests ] || need+=(python3-pyverbs)
command -v ucx_perftest >/dev/null || need+=(ucx-utils)
command -v mpicc >/dev/null || need+=(openmpi-bin libopenmpi-dev)
{ command -v mpiexec.mpich && [ -e /usr/lib/x86_64-linux-gnu/libmpich.so ]; } >/dev/null || need+=(mpich libmpich-dev)
command -v fi_pingpong >/dev/null || need+=(libfabric-bin)
command -v qperf >/dev/null || need+=(qperf)
[ -x /usr/sbin/tgtd ] || need+=(tgt)
command -v iscsi-test-cu >/dev/null || need+=(libiscsi-bin)
[ -f /usr/include/iscsi/iscsi.h ] || need+=(libiscsi-dev)
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-benchmark >/dev/null || need+=(redis-tools)
command -v iperf3 >/dev/null || need+=(iperf3)
command -v sockperf >/dev/null || need+=(sockperf)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing: ${need[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        # tshark asks whether non-root users may capture; answer no without a prompt.
        echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
        apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    else
        echo "warning: missing ${need[*]} (install them as root with apt-get)" >&2
    fi
fi

# The drop-in libibverbs.so.1 the verbs tests load into Debian's tools, and the rsockets
# preload library beside it.
cargo build --locked -q -p srdma-verbs -p srdma-rspreload
cargo test --workspace --locked "$@"
# Between srdma devices of this host the run above goes through shared memory (the default);
# the engine's own tests, the relay, the pingpong and rping tools, and Debian's tools and
# rdma_cm programs once more over UDP.
SRDMA_SHM=0 cargo test --locked -p srdma -p srdma-relay "$@"
SRDMA_SHM=0 cargo test --locked -p srdma-cli --test pingpong --test rping "$@"
SRDMA_SHM=0 cargo test --locked -p srdma-verbs --test tools --test rdmacm "$@"
