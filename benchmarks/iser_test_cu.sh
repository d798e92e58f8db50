#!/usr/bin/env bash
# libiscsi's SCSI conformance suite (Debian's iscsi-test-cu) against one tgtd, over iSCSI/TCP
# and over iSER on srdma, and a table of every test's outcome side by side.
#
#   benchmarks/iser_test_cu.sh [OUT.tsv] [SUITE-PATTERN]   (root; tgt and libiscsi-bin installed)
#
# tgtd runs on srdma through `srdma exec` (on 127.0.0.1) with a target per transport, inside a
# network namespace of its own; the iSER initiator runs on srdma on the same address, the TCP
# initiator without srdma. Each suite runs in a process of its own: libiscsi's iSER transport
# crashes in some tests (its reconnect after a task management reset, hand-made PDUs), which
# would take the rest of a run with it. After a crash tgtd is started afresh, since the crashed
# initiator's session (and any reservation it held) stays on the target: no one tells it, where
# a kernel provider's close of the dead process's rdma_cm ids would have sent a DREQ.
# Outcomes: pass, fail, skip (the test printed [SKIPPED]), crash (the initiator was killed by
# a signal during the test, or before it ran: "crash-" then), hang (a suite ran past 300 s),
# none (the suite ended without a verdict for the test).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/iser-test-cu.tsv}
pattern=${2:-}
if [ -z "${SRDMA_IN_NETNS:-}" ]; then
    exec env SRDMA_IN_NETNS=1 unshare -n "$0" "$out" "$pattern"
fi
ip link set lo up
cargo build --release -q -p srdma-cli -p srdma-verbs
S=$PWD/target/release/srdma
work=$(mktemp -d /tmp/srdma-iser-cu.XXXXXX)
C=$((1000 + $$ % 30000))   # tgtd's control port (below 32768): its socket is a path, seen by every namespace
INI=iqn.2026-01.org.srdma:cu1
INI2=iqn.2026-01.org.srdma:cu2
truncate -s 64M "$work/iscsi.img" "$work/iser.img"
mkdir -p /var/run/tgtd
tgtd=
start_tgtd() {
    [ -n "$tgtd" ] && { kill -9 $tgtd 2>/dev/null; wait $tgtd 2>/dev/null || true; }
    truncate -s 0 "$work/iscsi.img" "$work/iser.img"
    truncate -s 64M "$work/iscsi.img" "$work/iser.img"
    "$S" exec --device 127.0.0.1 tgtd -f -C $C > "$work/tgtd.log" 2>&1 &
    tgtd=$!
    for _ in $(seq 100); do tgtadm -C $C --op show --mode target >/dev/null 2>&1 && break; sleep 0.1; done
    local tid=0
    for lld in iscsi iser; do
        tid=$((tid + 1))
        tgtadm -C $C --lld $lld --op new --mode target --tid $tid -T iqn.2026-01.org.srdma:$lld
        tgtadm -C $C --lld $lld --op new --mode logicalunit --tid $tid --lun 1 -b "$work/$lld.img"
        tgtadm -C $C --lld $lld --op bind --mode target --tid $tid -I ALL
        # tgt 1.0.85's iSER login requires an initiator-name rule (its TCP login does not;
        # fixed upstream after 1.0.85, commit b73c64d "allow undefined initiator name ACL").
        for i in $INI $INI2; do tgtadm -C $C --lld $lld --op bind --mode target --tid $tid -Q $i; done
    done
}
trap 'kill -9 $tgtd 2>/dev/null; wait $tgtd 2>/dev/null; rm -rf "$work"' EXIT
start_tgtd
# Outcomes of one suite's run, "TEST OUTCOME" per line: $1 = output of `iscsi-test-cu -v`,
# $2 = exit status, $3 = the suite's tests (in the order iscsi-test-cu lists them).
outcomes() {
    awk -v rc="$2" -v tests="$3" '
        BEGIN { n = split(tests, t, " ") }
        /^Suite: / { suite = $2 }
        /^  Test: / { name = "ALL." suite "." $2; cur = name; skip[cur] = 0 }
        /\[SKIPPED\]/ && cur != "" { skip[cur] = 1 }
        /passed$/ && cur != "" { r[cur] = skip[cur] ? "skip" : "pass"; cur = "" }
        /FAILED$/ && cur != "" { r[cur] = "fail"; cur = "" }
        END {
            for (i = 1; i <= n; i++) {
                o = r[t[i]]
                if (o == "" && rc < 124) o = "none"
                if (o == "") o = (t[i] == cur) ? (rc == 124 ? "hang" : "crash") : (rc == 124 ? "hang-" : "crash-")
                print t[i], o
            }
        }' "$1"
}
all=$(iscsi-test-cu --list | awk -F. 'NF == 3')
suites=$(echo "$all" | awk -F. '{print $1 "." $2}' | uniq | grep -E "${pattern:-.}")
printf 'test\ttcp\tiser\n' > "$out"
for s in $suites; do
    tests=$(echo "$all" | grep -F "$s." | tr '\n' ' ')
    set +e
    timeout 300 iscsi-test-cu -d -v -i $INI -I $INI2 -t "$s" \
        "iscsi://127.0.0.1/iqn.2026-01.org.srdma:iscsi/1" > "$work/tcp.out" 2>&1
    rt=$?
    timeout 300 "$S" exec --device 127.0.0.1 iscsi-test-cu -d -v -i $INI -I $INI2 -t "$s" \
        "iser://127.0.0.1/iqn.2026-01.org.srdma:iser/1" > "$work/iser.out" 2>&1
    ri=$?
    set -e
    join <(outcomes "$work/tcp.out" $rt "$tests" | awk '{print NR, $0}' | sort -k2,2) \
         <(outcomes "$work/iser.out" $ri "$tests" | sort -k1,1) -1 2 -2 1 |
        sort -k2,2n | awk '{ printf "%s\t%s\t%s\n", $1, $3, $4 }' | tee -a "$out"
    # A crashed or hung initiator leaves its session behind: start over.
    if [ $rt -ge 124 ] || [ $ri -ge 124 ]; then start_tgtd; fi
done
echo
awk -F'\t' 'NR > 1 { n[$2 " over TCP"]++; m[$3 " over iSER"]++; if ($2 != $3) d++ }
    END { for (k in n) print n[k], k; for (k in m) print m[k], k; print d + 0, "tests differ" }' "$out" | sort -k2
