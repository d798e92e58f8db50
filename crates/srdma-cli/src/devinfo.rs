//! `srdma devinfo`: rdma-core's `ibv_devinfo` for srdma devices, plus `--stats` (the hw
//! counters of the devices open right now, as `rdma statistic show`).
//!
//! srdma has no kernel devices: a device is a UDP socket on one local address. So the devices
//! listed are the ones rxe would create, one per address of every interface that is up, as
//! rxe binds to a netdev: `srdma_<ifname>` for an interface's first address (IPv4 before
//! IPv6), `srdma_<ifname>_<k>` for its k-th further one. IPv6 link-local addresses are left
//! out (a device cannot bind them without a scope). Each device's active MTU is what the engine
//! derives from the interface's MTU, as rxe does (1500-byte Ethernet: 1024; loopback: 4096).
//!
//! The attributes printed are those of a real device: each is opened on its address with a
//! free UDP port and queried (`query`, `query_port`, `gids`), in the layout of `ibv_devinfo`
//! (tabs included). The node GUID, and so the link-local GID, depends on the UDP port. Fields
//! `ibv_devinfo -v` prints that srdma has no counterpart for are printed as a real device
//! without the feature prints them: 0 (raw QPs, EE contexts, FMRs, ODP, TSO, RSS); objects
//! whose number srdma does not bound (CQs, PDs, SRQs, address handles) show 2147483647, the
//! largest value the field holds. `device_cap_flags` names what srdma does: P_Key and Q_Key
//! violation counters, a system image GUID, RNR NAKs, memory windows of type 1 and 2B.
//! `port_cap_flags`
//! is 0: srdma's connection manager speaks TCP, not IB CM MADs.
//!
//! Exit status: 0; 1 when `-d` names no device, `-i` no port, or a device cannot be opened;
//! 2 for bad arguments.

use std::io::Write;

use anyhow::Context;
use srdma::netdev::{LocalDev, local_devices};
use srdma::{Device, Mtu};

/// What `ibv_devinfo -v` prints for a count srdma does not bound (`INT_MAX`).
const UNLIMITED: u32 = i32::MAX as u32;

/// `IBV_DEVICE_BAD_PKEY_CNTR | IBV_DEVICE_BAD_QKEY_CNTR | IBV_DEVICE_SYS_IMAGE_GUID |
/// IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B`: what
/// srdma implements of `enum ibv_device_cap_flags`.
const DEVICE_CAP_FLAGS: u32 = (1 << 1) | (1 << 2) | (1 << 11) | (1 << 12) | (1 << 17) | (1 << 24);

/// `enum ibv_device_cap_flags` bit names, in `ibv_devinfo`'s order.
const CAP_FLAG_NAMES: [(u32, &str); 24] = [
    (1 << 0, "RESIZE_MAX_WR"),
    (1 << 1, "BAD_PKEY_CNTR"),
    (1 << 2, "BAD_QKEY_CNTR"),
    (1 << 3, "RAW_MULTI"),
    (1 << 4, "AUTO_PATH_MIG"),
    (1 << 5, "CHANGE_PHY_PORT"),
    (1 << 6, "UD_AV_PORT_ENFORCE"),
    (1 << 7, "CURR_QP_STATE_MOD"),
    (1 << 8, "SHUTDOWN_PORT"),
    (1 << 9, "INIT_TYPE"),
    (1 << 10, "PORT_ACTIVE_EVENT"),
    (1 << 11, "SYS_IMAGE_GUID"),
    (1 << 12, "RC_RNR_NAK_GEN"),
    (1 << 13, "SRQ_RESIZE"),
    (1 << 14, "N_NOTIFY_CQ"),
    (1 << 17, "MEM_WINDOW"),
    (1 << 18, "UD_IP_CSUM"),
    (1 << 20, "XRC"),
    (1 << 21, "MEM_MGT_EXTENSIONS"),
    (1 << 23, "MEM_WINDOW_TYPE_2A"),
    (1 << 24, "MEM_WINDOW_TYPE_2B"),
    (1 << 25, "RC_IP_CSUM"),
    (1 << 26, "RAW_IP_CSUM"),
    (1 << 29, "MANAGED_FLOW_STEERING"),
];

/// Options of `srdma devinfo`: ibv_devinfo's, plus `--stats`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Use device DEV (default: every device; `-l` lists them).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    pub ib_dev: Option<String>,
    /// Use port PORT of the device (default: all ports; srdma devices have one, 1).
    #[arg(short = 'i', long = "ib-port", value_name = "PORT", value_parser = parse_port)]
    pub ib_port: Option<u32>,
    /// Print only the device names.
    #[arg(short = 'l', long = "list", conflicts_with_all = ["verbose", "stats"])]
    pub list: bool,
    /// Print all the attributes of the device(s), with the GID table.
    #[arg(short = 'v', long = "verbose")]
    pub verbose: bool,
    /// Print the counters of the srdma devices open right now in any process on this host
    /// (as `rdma statistic show`); with -d, only those of that name.
    #[arg(long)]
    pub stats: bool,
}

/// A port number, at least 1 (`ibv_devinfo -i`).
fn parse_port(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(0) | Err(_) => Err("the port must be a number of at least 1".into()),
        Ok(n) => Ok(n),
    }
}

/// Runs `srdma devinfo`.
pub fn run(args: &Args, out: &mut impl Write) -> anyhow::Result<bool> {
    if args.stats {
        return print_stats(args, out);
    }
    let devices = local_devices().context("listing the network interfaces")?;
    if args.list {
        writeln!(
            out,
            "{} HCA{} found:",
            devices.len(),
            if devices.len() == 1 { "" } else { "s" }
        )?;
        for d in &devices {
            writeln!(out, "\t{}", d.name)?;
        }
        writeln!(out)?;
        return Ok(true);
    }
    let chosen: Vec<&LocalDev> = match &args.ib_dev {
        Some(name) => match devices.iter().find(|d| &d.name == name) {
            Some(d) => vec![d],
            None => {
                let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
                eprintln!(
                    "IB device '{name}' wasn't found (srdma devices here: {})",
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                );
                return Ok(false);
            }
        },
        None => devices.iter().collect(),
    };
    if chosen.is_empty() {
        eprintln!("No IB devices found (no network interface with an address is up)");
        return Ok(false);
    }
    let mut ok = true;
    for d in chosen {
        let dev = match Device::open(d.config(0)) {
            Ok(dev) => dev,
            Err(e) => {
                eprintln!("Failed to open device {} on {}: {e}", d.name, d.addr);
                ok = false;
                continue;
            }
        };
        ok &= print_device(&dev, args, out)?;
    }
    Ok(ok)
}

/// One device, as `print_hca_cap` prints it.
fn print_device(dev: &Device, args: &Args, out: &mut impl Write) -> anyhow::Result<bool> {
    let attr = dev.query();
    let limits = &dev.config().limits;
    if let Some(p) = args.ib_port {
        if p > u32::from(attr.phys_port_cnt) {
            eprintln!(
                "Invalid port requested for device {}: {p} (it has {} port{})",
                dev.config().name,
                attr.phys_port_cnt,
                if attr.phys_port_cnt == 1 { "" } else { "s" }
            );
            return Ok(false);
        }
    }
    writeln!(out, "hca_id:\t{}", dev.config().name)?;
    writeln!(out, "\ttransport:\t\t\tInfiniBand (0)")?;
    if !attr.fw_ver.is_empty() {
        writeln!(out, "\tfw_ver:\t\t\t\t{}", attr.fw_ver)?;
    }
    writeln!(out, "\tnode_guid:\t\t\t{}", guid_str(attr.node_guid))?;
    writeln!(out, "\tsys_image_guid:\t\t\t{}", guid_str(attr.node_guid))?;
    writeln!(out, "\tvendor_id:\t\t\t0x{:04x}", attr.vendor_id)?;
    writeln!(out, "\tvendor_part_id:\t\t\t0")?;
    writeln!(out, "\thw_ver:\t\t\t\t0x0")?;
    writeln!(out, "\tphys_port_cnt:\t\t\t{}", attr.phys_port_cnt)?;
    if args.verbose {
        let lines: Vec<(&str, String)> = vec![
            ("max_mr_size", format!("0x{:x}", attr.max_mr_size)),
            ("page_size_cap", format!("0x{:x}", attr.page_size_cap)),
            ("max_qp", attr.max_qp.to_string()),
            ("max_qp_wr", attr.max_qp_wr.to_string()),
        ];
        for (k, v) in &lines {
            field(out, 1, k, v)?;
        }
        field(
            out,
            1,
            "device_cap_flags",
            &format!("0x{DEVICE_CAP_FLAGS:08x}"),
        )?;
        for (bit, name) in CAP_FLAG_NAMES {
            if DEVICE_CAP_FLAGS & bit != 0 {
                writeln!(out, "\t\t\t\t\t{name}")?;
            }
        }
        let lines: Vec<(&str, String)> = vec![
            ("max_sge", attr.max_sge.to_string()),
            ("max_sge_rd", limits.max_sge_rd.to_string()),
            ("max_cq", UNLIMITED.to_string()),
            ("max_cqe", attr.max_cqe.to_string()),
            ("max_mr", attr.max_mr.to_string()),
            ("max_pd", UNLIMITED.to_string()),
            ("max_qp_rd_atom", attr.max_qp_rd_atom.to_string()),
            ("max_ee_rd_atom", "0".into()),
            (
                "max_res_rd_atom",
                attr.max_qp_rd_atom
                    .saturating_mul(attr.max_qp)
                    .min(UNLIMITED)
                    .to_string(),
            ),
            ("max_qp_init_rd_atom", attr.max_qp_init_rd_atom.to_string()),
            ("max_ee_init_rd_atom", "0".into()),
            (
                "atomic_cap",
                format!("{} ({})", atomic_cap_str(attr.atomic_cap), attr.atomic_cap),
            ),
            ("max_ee", "0".into()),
            ("max_rdd", "0".into()),
            ("max_mw", attr.max_mw.to_string()),
            ("max_raw_ipv6_qp", "0".into()),
            ("max_raw_ethy_qp", "0".into()),
            ("max_mcast_grp", attr.max_mcast_grp.to_string()),
            ("max_mcast_qp_attach", attr.max_mcast_qp_attach.to_string()),
            (
                "max_total_mcast_qp_attach",
                attr.max_total_mcast_qp_attach.to_string(),
            ),
            ("max_ah", UNLIMITED.to_string()),
            ("max_fmr", "0".into()),
            ("max_srq", UNLIMITED.to_string()),
            ("max_srq_wr", attr.max_srq_wr.to_string()),
            ("max_srq_sge", attr.max_srq_sge.to_string()),
            ("max_pkeys", limits.pkey_tbl_len.to_string()),
            ("local_ca_ack_delay", limits.local_ca_ack_delay.to_string()),
        ];
        for (k, v) in &lines {
            field(out, 1, k, v)?;
        }
        writeln!(out, "\tgeneral_odp_caps:")?;
        for t in ["rc", "uc", "ud", "xrc"] {
            writeln!(out, "\t{t}_odp_caps:\n\t\t\t\t\tNO SUPPORT")?;
        }
        writeln!(out, "\tcompletion_timestamp_mask not supported")?;
        writeln!(out, "\tcore clock not supported")?;
        field(
            out,
            1,
            "device_cap_flags_ex",
            &format!("0x{DEVICE_CAP_FLAGS:X}"),
        )?;
        writeln!(out, "\ttso_caps:\n\t\tmax_tso:\t\t\t0")?;
        writeln!(
            out,
            "\trss_caps:\n\t\tmax_rwq_indirection_tables:\t\t\t0\n\t\tmax_rwq_indirection_table_size:\t\t\t0\n\t\trx_hash_function:\t\t\t\t0x0\n\t\trx_hash_fields_mask:\t\t\t\t0x0"
        )?;
        field(out, 1, "max_wq_type_rq", "0")?;
        writeln!(
            out,
            "\tpacket_pacing_caps:\n\t\tqp_rate_limit_min:\t0kbps\n\t\tqp_rate_limit_max:\t0kbps"
        )?;
        writeln!(out, "\ttag matching not supported")?;
        field(
            out,
            1,
            "num_comp_vectors",
            &dev.config().comp_vectors().to_string(),
        )?;
    }
    for port in 1..=u32::from(attr.phys_port_cnt) {
        if args.ib_port.is_some_and(|p| p != port) {
            continue;
        }
        let pa = dev.query_port();
        writeln!(out, "\t\tport:\t{port}")?;
        let lines: Vec<(&str, String)> = vec![
            (
                "state",
                format!("{} ({})", port_state_str(pa.state), pa.state),
            ),
            ("max_mtu", mtu_str(pa.max_mtu)),
            ("active_mtu", mtu_str(pa.active_mtu)),
            ("sm_lid", "0".into()),
            ("port_lid", "0".into()),
            ("port_lmc", "0x00".into()),
            ("link_layer", pa.link_layer.into()),
        ];
        for (k, v) in &lines {
            field(out, 3, k, v)?;
        }
        if args.verbose {
            let lines: Vec<(&str, String)> = vec![
                ("max_msg_sz", format!("0x{:x}", pa.max_msg_sz)),
                ("port_cap_flags", "0x00000000".into()),
                ("port_cap_flags2", "0x0000".into()),
                ("max_vl_num", "1 (1)".into()),
                ("bad_pkey_cntr", format!("0x{:x}", pa.bad_pkey_cntr)),
                ("qkey_viol_cntr", format!("0x{:x}", pa.qkey_viol_cntr)),
                ("sm_sl", "0".into()),
                ("pkey_tbl_len", pa.pkey_tbl_len.to_string()),
                ("gid_tbl_len", pa.gid_tbl_len.to_string()),
                ("subnet_timeout", "0".into()),
                ("init_type_reply", "0".into()),
                ("active_width", "1X (1)".into()),
                ("active_speed", "2.5 Gbps (1)".into()),
                ("phys_state", "LINK_UP (5)".into()),
            ];
            for (k, v) in &lines {
                field(out, 3, k, v)?;
            }
            for (i, gid) in dev.gids().iter().enumerate() {
                // ibv_devinfo skips entries whose interface ID is zero (unused slots).
                if gid.0[8..].iter().all(|&b| b == 0) {
                    continue;
                }
                writeln!(out, "\t\t\tGID[{i:>3}]:\t\t{gid}, RoCE v2")?;
            }
        }
        writeln!(out)?;
    }
    Ok(true)
}

/// `"\t" * indent + key + ":" + tabs + value`, with the tabs of `ibv_devinfo`'s format strings.
fn field(out: &mut impl Write, indent: usize, key: &str, value: &str) -> std::io::Result<()> {
    writeln!(
        out,
        "{}{key}:{}{value}",
        "\t".repeat(indent),
        "\t".repeat(tab_count(indent, key))
    )
}

/// The tabs `ibv_devinfo` puts after `key:`: its values start at the first tab stop at or
/// past column 40 for device attributes (indent 1) and 48 for port attributes (indent 3),
/// with at least one tab.
fn tab_count(indent: usize, key: &str) -> usize {
    let col = 8 * indent + key.len() + 1;
    let target = if indent <= 1 { 40 } else { 48 };
    if col >= target {
        1
    } else {
        (target - col).div_ceil(8)
    }
}

/// `guid_str`: four groups of four hex digits.
fn guid_str(g: u64) -> String {
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        (g >> 48) & 0xffff,
        (g >> 32) & 0xffff,
        (g >> 16) & 0xffff,
        g & 0xffff
    )
}

/// `mtu_str` and the enum value: `"4096 (5)"`.
fn mtu_str(m: Mtu) -> String {
    format!("{} ({})", m.bytes(), m.as_u32())
}

fn port_state_str(s: u32) -> &'static str {
    match s {
        1 => "PORT_DOWN",
        2 => "PORT_INIT",
        3 => "PORT_ARMED",
        4 => "PORT_ACTIVE",
        _ => "invalid state",
    }
}

fn atomic_cap_str(c: u32) -> &'static str {
    match c {
        0 => "ATOMIC_NONE",
        1 => "ATOMIC_HCA",
        2 => "ATOMIC_GLOB",
        _ => "invalid atomic capability",
    }
}

/// `--stats`: one line per open device, `rdma statistic show`'s layout with the owning process
/// and bound address after the device.
fn print_stats(args: &Args, out: &mut impl Write) -> anyhow::Result<bool> {
    let live: Vec<_> = srdma::stats::live_devices()
        .into_iter()
        .filter(|d| args.ib_dev.as_ref().is_none_or(|n| *n == d.name))
        .collect();
    if live.is_empty() {
        match &args.ib_dev {
            Some(n) => {
                eprintln!("no srdma device named '{n}' is open on this host");
                return Ok(false);
            }
            None => eprintln!("no srdma device is open on this host"),
        }
    }
    for d in live {
        let mut line = format!("link {}/1 pid {} local {}", d.name, d.pid, d.local);
        for (k, v) in &d.counters {
            line.push_str(&format!(" {k} {v}"));
        }
        writeln!(out, "{line}")?;
        // The congestion control of the QPs with sends outstanding.
        for q in &d.qps {
            let rate = q.rate.map_or_else(
                || "unpaced".to_owned(),
                |r| format!("{:.1}MiB/s", r as f64 / f64::from(1 << 20)),
            );
            let srtt = q
                .srtt_us
                .map_or_else(|| "-".to_owned(), |t| format!("{t}us"));
            writeln!(
                out,
                "    qp {:#x} window {} rate {rate} srtt {srtt} timeouts {} cnps {} recovery {}",
                q.qpn,
                q.window_psns,
                q.timeouts,
                q.cnps,
                if q.selective_repeat {
                    "selective-repeat"
                } else {
                    "go-back-N"
                }
            )?;
        }
        if d.qps_more > 0 {
            writeln!(out, "    ({} more QPs with sends outstanding)", d.qps_more)?;
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tab counts of rdma-core's format strings (libibverbs/examples/devinfo.c).
    #[test]
    fn tabs_match_ibv_devinfo() {
        let dev = [
            ("transport", 3),
            ("fw_ver", 4),
            ("node_guid", 3),
            ("sys_image_guid", 3),
            ("vendor_id", 3),
            ("vendor_part_id", 3),
            ("hw_ver", 4),
            ("phys_port_cnt", 3),
            ("max_mr_size", 3),
            ("max_qp", 4),
            ("device_cap_flags", 2),
            ("max_res_rd_atom", 2),
            ("max_qp_init_rd_atom", 2),
            ("atomic_cap", 3),
            ("max_raw_ipv6_qp", 2),
            ("max_mcast_grp", 3),
            ("max_total_mcast_qp_attach", 1),
            ("local_ca_ack_delay", 2),
            ("num_comp_vectors", 2),
            ("max_wq_type_rq", 3),
        ];
        for (k, n) in dev {
            assert_eq!(tab_count(1, k), n, "{k}");
        }
        let port = [
            ("state", 3),
            ("max_mtu", 2),
            ("active_mtu", 2),
            ("sm_lid", 3),
            ("port_lid", 2),
            ("link_layer", 2),
            ("port_cap_flags", 2),
            ("port_cap_flags2", 1),
            ("init_type_reply", 1),
            ("subnet_timeout", 2),
            ("sm_sl", 3),
        ];
        for (k, n) in port {
            assert_eq!(tab_count(3, k), n, "{k}");
        }
    }

    #[test]
    fn guids_print_in_four_groups() {
        assert_eq!(guid_str(0x5054_00ff_fe77_0002), "5054:00ff:fe77:0002");
    }
}
