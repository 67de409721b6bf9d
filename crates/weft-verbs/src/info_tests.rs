//! Tests of `info` and its modules.
#![allow(clippy::unwrap_used)]

use super::diagnose::{memlock_message, parse_cap_ipc_lock, parse_memlock};
use super::probe::port_ips;
use crate::sys::{Gid, GidEntry, LinkLayer};
use std::net::IpAddr;

fn entry(ip: &str, index: u32, roce_v2: bool) -> GidEntry {
    GidEntry {
        gid: Gid::from_ip(ip.parse().unwrap()),
        index,
        port: 1,
        roce_v2,
        ndev_ifindex: 7,
    }
}

#[test]
fn ips_from_gids() {
    let gids = [
        entry("fe80::1", 0, false),
        entry("fe80::1", 1, true),
        entry("2001:db8::5", 2, true),
        entry("10.0.0.1", 3, false),
        entry("10.0.0.1", 4, true),
    ];
    let ips = port_ips(LinkLayer::Ethernet, &gids);
    let want: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap(), "2001:db8::5".parse().unwrap()];
    assert_eq!(ips, want);
    // Link-local only when nothing else; none on InfiniBand.
    let ll = port_ips(LinkLayer::Ethernet, &gids[..2]);
    assert_eq!(ll, vec!["fe80::1".parse::<IpAddr>().unwrap()]);
    assert!(port_ips(LinkLayer::InfiniBand, &gids).is_empty());
}

#[test]
fn memlock_parsing() {
    let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                  Max locked memory         8388608              8388608              bytes\n";
    assert_eq!(parse_memlock(limits), Some(Some(8 << 20)));
    let unl = "Max locked memory         unlimited            unlimited            bytes\n";
    assert_eq!(parse_memlock(unl), Some(None));
    assert_eq!(parse_memlock("nothing"), None);
    let w = memlock_message(Some(8 << 20), false).unwrap();
    assert!(w.contains("8 MiB") && w.contains("ulimit -l") && w.contains("memlock=-1"));
    assert!(memlock_message(Some(8 << 20), true)
        .unwrap()
        .contains("CAP_IPC_LOCK"));
    assert_eq!(memlock_message(Some(64 << 20), false), None);
    assert_eq!(memlock_message(None, false), None);
    assert!(parse_cap_ipc_lock(b"CapEff:\t000001fffeffffff\n"));
    assert!(!parse_cap_ipc_lock(b"CapEff:\t0000000000000000\n"));
    assert!(!parse_cap_ipc_lock(b"CapPrm:\t000001fffeffffff\n"));
}

/// The command name in `Name:` may be any bytes (the file name the
/// process ran): one that is not UTF-8 leaves `CapEff:` readable.
#[test]
fn cap_ipc_lock_beside_a_name_that_is_not_utf8() {
    let status = b"Name:\tsl\xffep) x\nUmask:\t0022\nState:\tR (running)\n\
                   CapInh:\t0000000000000000\nCapPrm:\t0000000000004000\n\
                   CapEff:\t0000000000004000\nCapBnd:\t000001ffffffffff\n";
    assert!(parse_cap_ipc_lock(status));
    let without = b"Name:\t\xff\xfe\nCapEff:\t0000000000000000\n";
    assert!(!parse_cap_ipc_lock(without));
}
