//! The receive-side ICRC policy for IPv4 (see [`crate::DeviceCounters::rx_icrc_ident_solved`]).

use srdma_wire::Encap;

/// True when some IPv4 Identification makes the packet's ICRC verify.
pub(crate) fn verify_unknown_ident(encap: &Encap, packet: &[u8]) -> bool {
    let _ = (encap, packet);
    false
}
