//! The receive-side ICRC policy for IPv4 (see [`crate::DeviceCounters::rx_icrc_ident_solved`]).

use srdma_wire::Encap;

/// True when some IPv4 Identification makes the packet's ICRC verify: the ID a UDP socket
/// cannot see is solved for (the CRC is affine in its 16 bits), so a corrupted packet still
/// fails except with probability about 2^-16.
pub(crate) fn verify_unknown_ident(encap: &Encap, packet: &[u8]) -> bool {
    srdma_wire::icrc::verify_ipv4_unknown_ident(encap, packet).is_ok()
}
