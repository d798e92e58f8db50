# Shared by benchmarks/relay.sh, relay_loss.sh and schedules.sh (sourced, not run): network
# namespaces for relay chains, and a chain's configuration. The caller defines `addr N`
# (host N's address) and sets PREFIX, WIRE, NHOSTS, MTU, SIZE, CHUNK, SLOTS and FORWARD.

# A bridge in namespace $WIRE and hosts $PREFIX-0 .. $PREFIX-(NHOSTS-1), each with eth0 (a
# veth of MTU $MTU on the bridge) at `addr N`/24.
relay_lab_up() {
    local i ns
    ip netns add "$WIRE"
    ip -n "$WIRE" link add br0 type bridge
    ip -n "$WIRE" link set br0 mtu "$MTU" up
    for ((i = 0; i < NHOSTS; i++)); do
        ns="$PREFIX-$i"
        ip netns add "$ns"
        ip -n "$ns" link add eth0 mtu "$MTU" type veth peer name "p$i" mtu "$MTU" netns "$WIRE"
        ip -n "$ns" addr add "$(addr "$i")/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        ip -n "$WIRE" link set "p$i" master br0 up
    done
}

# Writes the config of a chain of $1 hops to $2: n0 (source, gen:$SIZE) -> n1 ... -> n$1
# (sink, discard); every relay and the sink verify.
relay_chain_config() {
    local hops=$1 file=$2 i
    {
        printf '[transfer]\nchunk_size = "%s"\nslots = %s\nforward = "%s"\n' "$CHUNK" "$SLOTS" "$FORWARD"
        printf '\n[[node]]\nname = "n0"\naddr = "%s"\nrole = "source"\nsource = "gen:%s"\n' "$(addr 0)" "$SIZE"
        for ((i = 1; i < hops; i++)); do
            printf '\n[[node]]\nname = "n%d"\naddr = "%s"\nrole = "relay"\nparent = "n%d"\nstages = ["verify"]\n' \
                "$i" "$(addr "$i")" $((i - 1))
        done
        printf '\n[[node]]\nname = "n%d"\naddr = "%s"\nrole = "sink"\nparent = "n%d"\nsink = "discard"\nstages = ["verify"]\n' \
            "$hops" "$(addr "$hops")" $((hops - 1))
    } >"$file"
}
