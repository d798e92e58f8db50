//! CQ sizes: up to `max_cqe`, which is large enough for libfabric's RDM endpoint.

use srdma::{Device, DeviceConfig};

#[test]
fn a_cq_holds_up_to_max_cqe_entries() {
    let mut c = DeviceConfig::new("127.0.0.1".parse().unwrap());
    c.port = 0;
    let dev = Device::open(c).unwrap();
    let max = dev.query().max_cqe as usize;
    // libfabric 1.17's ofi_rxm over verbs: (128 receives + 128 sends) × universe size 256.
    assert!(max >= 65_536, "max_cqe {max}");
    assert_eq!(dev.create_cq(65_536, None).unwrap().capacity(), 65_536);
    assert_eq!(dev.create_cq(max, None).unwrap().capacity(), max);
    assert!(dev.create_cq(max + 1, None).is_err());
    assert!(dev.create_cq(0, None).is_err());
}
