#!/usr/bin/env bash
# redis_ns.sh SRDMA_BIN|tcp: redis-benchmark (GET and SET, REQS requests, default 50000)
# between two network namespaces joined by veth (MTU 1500), the server and the benchmark
# under `srdma exec --rsockets` (or on kernel TCP with `tcp`); prints redis-benchmark's CSV
# lines and what the server's side sent per request: UDP datagrams (/proc/net/snmp) and
# veth packets (one per skb, a GSO message counting once). Root (namespaces).
S=$1 REQS=${REQS:-50000}
NA=rdn13a NB=rdn13b
ip netns del $NA 2>/dev/null; ip netns del $NB 2>/dev/null
ip netns add $NA; ip netns add $NB
ip -n $NA link set lo up; ip -n $NB link set lo up
ip link add va netns $NA mtu 1500 type veth peer name vb netns $NB mtu 1500
ip -n $NA addr add 10.198.13.1/24 dev va; ip -n $NB addr add 10.198.13.2/24 dev vb
ip -n $NA link set va up; ip -n $NB link set vb up; sleep 1
if [ "$S" != tcp ]; then P=("$S" exec --rsockets); else P=(); fi
ip netns exec $NA "${P[@]}" redis-server --port 6399 --save '' --appendonly no --protected-mode no --bind 10.198.13.1 >/dev/null 2>&1 &
sleep 1.5
snap() { ip netns exec $NA cat /proc/net/snmp | awk '/^Udp:/{u++; if(u==2) o=$5} END{print o}'; }
txp() { ip -n $NA -s link show va | awk '/TX:/{getline; print $2}'; }
ua=$(snap); pa=$(txp)
ip netns exec $NB "${P[@]}" redis-benchmark -h 10.198.13.1 -p 6399 -t get,set -n "$REQS" --csv 2>/dev/null | tail -2 | tr '\n' ' '
ub=$(snap); pb=$(txp)
awk -v u=$((ub - ua)) -v p=$((pb - pa)) -v n=$((2 * REQS)) \
    'BEGIN { printf "| server: UDP datagrams/request %.2f, veth packets/request %.2f\n", u / n, p / n }'
ip netns exec $NB redis-cli -h 10.198.13.1 -p 6399 shutdown nosave >/dev/null 2>&1
sleep 0.5; pkill -f "redis-server.*6399"
ip netns del $NA; ip netns del $NB
