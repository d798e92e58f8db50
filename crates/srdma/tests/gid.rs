//! `Gid::ip`: which address a destination GID reaches.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use srdma::{DeviceConfig, Gid, ROCEV2_PORT};

fn gid(s: &str) -> Gid {
    Gid(s.parse::<Ipv6Addr>().unwrap().octets())
}

#[test]
fn ipv4_mapped_and_plain_ipv6_gids() {
    assert_eq!(
        gid("::ffff:192.0.2.7").ip(),
        IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7))
    );
    assert_eq!(gid("fd00::2").ip(), "fd00::2".parse::<IpAddr>().unwrap());
}

/// GID 0 of an IPv4 device on the RoCEv2 port (what libfabric's dgram endpoint names
/// itself by) reaches the device's address, as rxe's link-local GID 0 reaches its interface.
#[test]
fn the_link_local_gid_of_an_ipv4_device_reaches_its_address() {
    for ip in ["127.0.0.1", "192.0.2.2", "10.255.0.254"] {
        let addr: IpAddr = ip.parse().unwrap();
        let gids = DeviceConfig::new(addr).gids_on(ROCEV2_PORT);
        assert_eq!(gids[0].0[..2], [0xfe, 0x80], "{}", gids[0]);
        assert_eq!(gids[0].ip(), addr, "{}", gids[0]);
        assert_eq!(gids[1].ip(), addr, "{}", gids[1]);
    }
    assert_eq!(
        gid("fe80::27f:ff:fe00:1b7").srdma_link_local_ipv4(),
        Some(Ipv4Addr::LOCALHOST)
    );
}

/// Other link-local GIDs stay IPv6 (unreachable from an IPv4 device, EINVAL at post time):
/// rxe's from a MAC, srdma's of a device on another UDP port, other prefixes.
#[test]
fn other_link_local_gids_are_not_taken_for_ipv4() {
    for g in [
        "fe80::5054:ff:fe12:3456",
        "fe80::27f:ff:fe00:101",
        "fe80::27f:1fe:fe00:1b7",
        "fe80:1::27f:ff:fe00:1b7",
        "fe81::27f:ff:fe00:1b7",
        "fe80::7f:ff:fe00:1b7",
    ] {
        let v6: Ipv6Addr = g.parse().unwrap();
        assert_eq!(gid(g).ip(), IpAddr::V6(v6), "{g}");
        assert_eq!(gid(g).srdma_link_local_ipv4(), None, "{g}");
    }
    let other_port = DeviceConfig::new("127.0.0.1".parse().unwrap()).gids_on(5000);
    assert!(other_port[0].ip().is_ipv6(), "{}", other_port[0]);
}
