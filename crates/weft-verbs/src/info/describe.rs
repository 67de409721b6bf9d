//! The human summary of every device and port (`weft info -p verbs -v`).

use std::fmt::Write as _;
use std::net::IpAddr;

use crate::sys::{AtomicCap, LinkLayer, PortState};

use super::diagnose::{memlock_warning, no_device_reason};
use super::probe::{discover_cached, DeviceReport};

pub(super) fn state_str(s: PortState) -> String {
    match s {
        PortState::Nop => "NOP".into(),
        PortState::Down => "DOWN".into(),
        PortState::Init => "INIT".into(),
        PortState::Armed => "ARMED".into(),
        PortState::Active => "ACTIVE".into(),
        PortState::ActiveDefer => "ACTIVE_DEFER".into(),
        PortState::Unknown(v) => format!("unknown state {v}"),
    }
}

pub(super) fn link_layer_str(l: LinkLayer) -> &'static str {
    match l {
        LinkLayer::InfiniBand => "InfiniBand",
        LinkLayer::Ethernet => "Ethernet",
        LinkLayer::Unspecified => "unspecified",
    }
}

fn atomic_str(a: AtomicCap) -> &'static str {
    match a {
        AtomicCap::None => "none",
        AtomicCap::Hca => "HCA (between QPs of this device)",
        AtomicCap::Glob => "global",
    }
}

/// A human summary of every device and port, for `weft info -p verbs -v`:
/// state, link layer, MTU, addresses, the limits offers are built from,
/// and the reason there is nothing to offer (if so) and a memlock warning.
pub fn describe() -> String {
    let mut out = String::new();
    match discover_cached() {
        Err(e) => {
            let _ = writeln!(out, "verbs: cannot list RDMA devices: {e}");
        }
        Ok(reports) => {
            let _ = writeln!(out, "verbs: {} RDMA port(s)", reports.len());
            for r in reports {
                describe_port(&mut out, r);
            }
        }
    }
    if let Some(reason) = no_device_reason() {
        let _ = writeln!(out, "verbs: nothing offered: {reason}");
    } else if let Some(w) = memlock_warning() {
        let _ = writeln!(out, "verbs: warning: {w}");
    }
    out
}

fn describe_port(out: &mut String, r: &DeviceReport) {
    let (a, p) = (&r.attr, &r.port_attr);
    let ips = if r.ips.is_empty() {
        "(none)".to_owned()
    } else {
        r.ips
            .iter()
            .map(IpAddr::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        out,
        "{} port {}: {}, link layer {}, MTU {} (max {}), fabric {}{}",
        r.name,
        r.port,
        state_str(r.state),
        link_layer_str(r.link_layer),
        p.active_mtu.bytes(),
        p.max_mtu.bytes(),
        r.fabric_name(),
        if r.is_active() { "" } else { " (not offered)" }
    );
    let _ = writeln!(out, "    addresses: {ips}");
    let _ = writeln!(
        out,
        "    fw {}, node guid {:016x}, vendor {:#x}/{:#x}",
        a.fw_ver, a.node_guid, a.vendor_id, a.vendor_part_id
    );
    let _ = writeln!(
        out,
        "    max_qp {}, max_qp_wr {}, max_sge {}, max_cq {}, max_cqe {}, max_srq {}",
        a.max_qp, a.max_qp_wr, a.max_sge, a.max_cq, a.max_cqe, a.max_srq
    );
    let _ = writeln!(
        out,
        "    max_mr {}, max_mr_size {:#x}, max_msg_sz {}, max inline {}, atomics {}",
        a.max_mr,
        a.max_mr_size,
        p.max_msg_sz,
        r.max_inline,
        atomic_str(a.atomic_cap)
    );
}
