//! Device discovery and getinfo offers of the verbs provider.
//!
//! Without an RDMA device, the offers must be empty and
//! `no_device_reason()` must say why (printed); under `RXE_VM=1` (the rxe
//! VM) a missing device is a failure. Run them in the VM:
//!
//! ```text
//! cargo test -p weft-verbs --features rdma --no-run
//! integration/rxe/vm --rw $CARGO_TARGET_DIR -- '<test exe> --nocapture --test-threads=1'
//! ```
//!
//! Devices there: rxe0 on lo (127.0.0.1), rxe1 10.66.0.1, rxe2 10.66.0.2.
#![cfg(feature = "rdma")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, SocketAddr};

use weft_core::addr::decode_sockaddr;
use weft_core::attr::{AddrFormat, EpType, Info, Protocol};
use weft_core::flags::{Caps, Mode, MrMode, OpFlags};
use weft_core::getinfo::{format_info, getinfo};
use weft_core::Error;
use weft_verbs::info::{
    describe, discover, discover_cached, no_device_reason, offers, DeviceReport,
};
use weft_verbs::sys::{AtomicCap, Context, LinkLayer, PortState};

fn in_vm() -> bool {
    std::env::var("RXE_VM").as_deref() == Ok("1")
}

/// The offers, or `None` (after checking the no-device path) when this
/// host has no active RDMA port.
fn offers_or_skip() -> Option<Vec<Info>> {
    let offers = offers();
    let reason = no_device_reason();
    if offers.is_empty() {
        let reason = reason.expect("no offers, so no_device_reason() must say why");
        assert!(
            reason.contains("RDMA"),
            "the reason should name RDMA: {reason}"
        );
        if in_vm() {
            panic!("RXE_VM=1 but the verbs provider offers nothing: {reason}");
        }
        panic!("no RDMA device (run these tests in the rxe VM: integration/run-rxe): {reason}");
    }
    assert_eq!(reason, None, "offers exist, so there is no reason");
    Some(offers)
}

fn src(info: &Info) -> SocketAddr {
    decode_sockaddr(info.src_addr.as_deref().expect("src_addr")).unwrap()
}

fn offer_of<'a>(offers: &'a [Info], dev: &str) -> &'a Info {
    let mine: Vec<&Info> = offers
        .iter()
        .filter(|i| i.domain_attr.name.as_deref() == Some(dev))
        .filter(|i| i.ep_attr.ep_type == EpType::Msg)
        .collect();
    assert_eq!(mine.len(), 1, "one MSG offer for {dev}: {mine:#?}");
    mine[0]
}

fn report_of<'a>(reports: &'a [DeviceReport], dev: &str) -> &'a DeviceReport {
    reports
        .iter()
        .find(|r| r.name == dev && r.port == 1)
        .unwrap_or_else(|| panic!("no report for {dev} port 1"))
}

#[test]
fn no_device_means_no_offers_and_a_reason() {
    let offers = offers();
    let reason = no_device_reason();
    println!("describe():\n{}", describe());
    match &reason {
        Some(r) => println!("no_device_reason(): {r}"),
        None => println!("no_device_reason(): None ({} offers)", offers.len()),
    }
    assert_eq!(offers.is_empty(), reason.is_some());
    if in_vm() {
        assert!(!offers.is_empty(), "RXE_VM=1 but no offers: {reason:?}");
    }
    if let Some(r) = reason {
        // Without the kernel's RDMA core there is no sysfs class at all;
        // the message must say so and how to get a soft-RoCE device.
        if !std::path::Path::new("/sys/class/infiniband").exists() {
            assert!(r.contains("/sys/class/infiniband is missing"), "{r}");
            assert!(r.contains("modprobe rdma_rxe"), "{r}");
        }
    }
}

#[test]
fn cache_matches_fresh_discovery() {
    let Some(_) = offers_or_skip() else {
        return;
    };
    let cached = discover_cached().unwrap();
    let fresh = discover().unwrap();
    assert_eq!(cached.len(), fresh.len());
    for (c, f) in cached.iter().zip(&fresh) {
        assert_eq!((&c.name, c.port, &c.ips), (&f.name, f.port, &f.ips));
        assert_eq!(c.max_inline, f.max_inline);
    }
    // Cached: the same slice every time.
    assert!(std::ptr::eq(cached, discover_cached().unwrap()));
}

#[test]
fn rxe_offers() {
    let Some(offers) = offers_or_skip() else {
        return;
    };
    for o in &offers {
        print!("{}", format_info(o, true));
    }
    print!("{}", describe());

    // MSG, RDM and DGRAM (over UD: one packet of at most the MTU).
    let (dgram, offers): (Vec<Info>, Vec<Info>) = offers
        .iter()
        .cloned()
        .partition(|o| o.ep_attr.ep_type == EpType::Dgram);
    assert!(!dgram.is_empty());
    for d in &dgram {
        assert_eq!(d.ep_attr.protocol, Protocol::IbUd);
        assert!(d.ep_attr.max_msg_size <= 4096);
        assert!(d.tx_attr.inject_size <= d.ep_attr.max_msg_size);
        assert_eq!(d.domain_attr.cq_data_size, 4);
        assert!(!d.caps.intersects(Caps::TAGGED | Caps::RMA | Caps::ATOMIC));
    }
    // SOCK_STREAM: one beside each MSG offer, MSG's connection
    // management without data capabilities (data moves through the
    // stream).
    let (streams, offers): (Vec<Info>, Vec<Info>) = offers
        .iter()
        .cloned()
        .partition(|o| o.ep_attr.ep_type == EpType::SockStream);
    assert!(!streams.is_empty());
    for st in &streams {
        assert_eq!(st.ep_attr.protocol, Protocol::RdmaCmIbRc);
        assert_eq!(st.caps, Caps::LOCAL_COMM | Caps::REMOTE_COMM);
        assert!(st.tx_attr.caps.is_empty() && st.rx_attr.caps.is_empty());
        assert_eq!(st.domain_attr.max_ep_srx_ctx, 0);
        assert!(offers.iter().any(|o| o.ep_attr.ep_type == EpType::Msg
            && o.domain_attr.name == st.domain_attr.name
            && o.ep_attr.cm_data_size == st.ep_attr.cm_data_size));
    }
    let (msg, rdm): (Vec<Info>, Vec<Info>) = offers
        .iter()
        .cloned()
        .partition(|o| o.ep_attr.ep_type == EpType::Msg);
    assert!(rdm.iter().all(|o| o.ep_attr.ep_type == EpType::Rdm));

    let reports = discover_cached().unwrap();
    for o in &rdm {
        let dev = o.domain_attr.name.clone().unwrap();
        let r = report_of(reports, &dev);
        assert_eq!(o.ep_attr.protocol, Protocol::WeftRdmRc);
        assert_eq!(o.ep_attr.max_msg_size, r.port_attr.max_msg_sz as usize);
        assert_eq!(o.ep_attr.cm_data_size, 0);
        // Inline sends carry Weft's 48-byte header too.
        assert_eq!(
            o.tx_attr.inject_size,
            (r.max_inline as usize).min(256).saturating_sub(48)
        );
        assert_eq!(o.domain_attr.cq_data_size, 8, "CQ data rides in the header");
        assert!(o.caps.contains(
            Caps::MSG
                | Caps::TAGGED
                | Caps::SEND
                | Caps::RECV
                | Caps::REMOTE_CQ_DATA
                | Caps::SOURCE
                | Caps::DIRECTED_RECV
        ));
        assert!(o.caps.contains(Caps::RMA | Caps::READ | Caps::WRITE));
        // Multi-receive buffers: a receive-side cap and flag.
        assert!(o.caps.contains(Caps::MULTI_RECV));
        assert!(o.rx_attr.caps.contains(Caps::MULTI_RECV));
        assert!(!o.tx_attr.caps.contains(Caps::MULTI_RECV));
        assert!(o.rx_attr.op_flags_supported.contains(OpFlags::MULTI_RECV));
        // Atomics exactly when the device has them (rxe does).
        assert_eq!(
            o.caps.contains(Caps::ATOMIC),
            r.attr.atomic_cap != AtomicCap::None
        );
        assert_eq!(o.domain_attr.mr_mode, MrMode::PROV_KEY | MrMode::VIRT_ADDR);
        assert_eq!(src(o).port(), 0);
    }
    for o in &msg {
        let dev = o.domain_attr.name.clone().unwrap();
        let r = report_of(reports, &dev);
        assert_eq!(r.state, PortState::Active);
        assert_eq!(o.fabric_attr.prov_name.as_deref(), Some("verbs"));
        assert!(o.fabric_attr.name.as_deref().unwrap().starts_with("IB-0x"));
        assert_eq!(o.ep_attr.protocol, Protocol::RdmaCmIbRc);
        // No multi-receive on MSG (its receives are the device's).
        assert!(!o.caps.contains(Caps::MULTI_RECV));
        assert!(!o.rx_attr.op_flags_supported.contains(OpFlags::MULTI_RECV));
        assert!(o.ep_attr.max_msg_size > 0);
        assert_eq!(o.ep_attr.max_msg_size, r.port_attr.max_msg_sz as usize);
        assert_eq!(
            o.ep_attr.cm_data_size, 55,
            "56 bytes of private data less the length byte"
        );
        assert_eq!(o.ep_attr.msg_prefix_size, 0);
        assert_eq!(o.tx_attr.inject_size, r.max_inline as usize);
        assert!(o.tx_attr.size > 0 && o.tx_attr.size <= r.attr.max_qp_wr as usize);
        assert!(o.rx_attr.size > 0 && o.rx_attr.size <= r.attr.max_qp_wr as usize);
        assert!(o.tx_attr.iov_limit >= 1 && o.tx_attr.iov_limit <= r.attr.max_sge as usize);
        assert_eq!(o.rx_attr.iov_limit, r.attr.max_sge as usize);
        assert_eq!(o.rx_attr.total_buffered_recv, 0);
        // The provider registers the caller's local buffers itself; only
        // the RMA-target bits are asked.
        assert_eq!(o.domain_attr.mr_mode, MrMode::PROV_KEY | MrMode::VIRT_ADDR);
        assert_eq!(o.domain_attr.mr_key_size, 4);
        assert_eq!(o.domain_attr.cq_data_size, 4);
        assert_eq!(o.domain_attr.mr_cnt, r.attr.max_mr as usize);
        assert!(o.caps.contains(
            Caps::MSG
                | Caps::SEND
                | Caps::RECV
                | Caps::REMOTE_CQ_DATA
                | Caps::LOCAL_COMM
                | Caps::REMOTE_COMM
        ));
        assert!(o.caps.contains(Caps::RMA | Caps::READ | Caps::WRITE));
        assert!(!o.caps.intersects(Caps::TAGGED));
        assert_eq!(
            o.caps.contains(Caps::ATOMIC),
            r.attr.atomic_cap != AtomicCap::None
        );
        // Optional: getinfo drops it for hints that do not accept it.
        assert_eq!(o.mode, Mode::RX_CQ_DATA);
        assert_eq!(o.rx_attr.mode, Mode::RX_CQ_DATA);
        // The offer's source address is an address of the port.
        assert_eq!(src(o).ip(), r.ips[0]);
        assert_eq!(src(o).port(), 0);
        let want_format = if r.ips[0].is_ipv4() {
            AddrFormat::SockaddrIn
        } else {
            AddrFormat::SockaddrIn6
        };
        assert_eq!(o.addr_format, want_format);
    }
    // Every active port is offered once per endpoint type.
    let active = reports.iter().filter(|r| r.is_active()).count();
    assert_eq!((msg.len(), rdm.len()), (active, active));

    if !in_vm() {
        return;
    }
    for (dev, ip) in [
        ("rxe0", "127.0.0.1"),
        ("rxe1", "10.66.0.1"),
        ("rxe2", "10.66.0.2"),
    ] {
        let o = offer_of(&offers, dev);
        let r = report_of(reports, dev);
        assert_eq!(src(o).ip(), ip.parse::<IpAddr>().unwrap(), "{dev}");
        assert_eq!(o.addr_format, AddrFormat::SockaddrIn, "{dev}");
        assert_eq!(r.link_layer, LinkLayer::Ethernet, "{dev}");
        assert!(r.ips.contains(&ip.parse().unwrap()), "{dev}: {:?}", r.ips);
        // inject_size is what the device really accepts: probe it anew.
        let probed = Context::open(dev).unwrap().probe_max_inline_data().unwrap();
        assert_eq!(o.tx_attr.inject_size, probed as usize, "{dev}");
        assert_eq!(probed, 512, "rxe's max inline data");
        println!(
            "{dev}: fabric {} src {} inject {} tx {}x{} rx {}x{} max_msg {} ips {:?}",
            o.fabric_attr.name.as_deref().unwrap(),
            src(o),
            o.tx_attr.inject_size,
            o.tx_attr.size,
            o.tx_attr.iov_limit,
            o.rx_attr.size,
            o.rx_attr.iov_limit,
            o.ep_attr.max_msg_size,
            r.ips
        );
    }
}

#[test]
fn getinfo_selects_one_device() {
    let Some(offers) = offers_or_skip() else {
        return;
    };
    let Some(want) = offers.iter().find(|o| {
        o.domain_attr.name.as_deref() == Some("rxe1") && o.ep_attr.ep_type == EpType::Msg
    }) else {
        assert!(!in_vm(), "RXE_VM=1 but no rxe1 offer");
        eprintln!("skipped: no rxe1 device");
        return;
    };
    let mut hints = Info::default();
    hints.ep_attr.ep_type = EpType::Msg;
    hints.fabric_attr.prov_name = Some("verbs".into());
    hints.domain_attr.name = Some("rxe1".into());
    // Hints with mr_mode 0 (no registration support) match, without RMA:
    // the provider registers local buffers for the application, and only
    // RMA targets need the key and address bits.
    let got = getinfo(Some(&hints), &offers).unwrap();
    let mut no_rma = want.clone();
    // Hints without FI_RX_CQ_DATA get the offer without it (writes with
    // remote CQ data are then refused).
    no_rma.mode = Mode::empty();
    no_rma.rx_attr.mode = Mode::empty();
    let rma_like = Caps::RMA
        | Caps::ATOMIC
        | Caps::READ
        | Caps::WRITE
        | Caps::REMOTE_READ
        | Caps::REMOTE_WRITE;
    no_rma.caps -= rma_like;
    no_rma.tx_attr.caps -= rma_like;
    no_rma.rx_attr.caps -= rma_like;
    no_rma.domain_attr.caps -= rma_like;
    no_rma.domain_attr.mr_mode = MrMode::empty();
    assert_eq!(got, vec![no_rma]);
    // Asking for RMA without accepting its bits finds nothing.
    hints.caps = Caps::MSG | Caps::RMA;
    assert_eq!(getinfo(Some(&hints), &offers), Err(Error::NoData));
    hints.caps = Caps::empty();
    // Hints that support every mode get the whole offer.
    hints.domain_attr.mr_mode =
        MrMode::LOCAL | MrMode::VIRT_ADDR | MrMode::ALLOCATED | MrMode::PROV_KEY;
    hints.mode = Mode::RX_CQ_DATA;
    let got = getinfo(Some(&hints), &offers).unwrap();
    assert_eq!(got, vec![want.clone()]);

    // RDM and DGRAM have their own offers.
    hints.ep_attr.ep_type = EpType::Rdm;
    let got = getinfo(Some(&hints), &offers).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].ep_attr.protocol, Protocol::WeftRdmRc);
    hints.ep_attr.ep_type = EpType::Dgram;
    let got = getinfo(Some(&hints), &offers).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].ep_attr.protocol, Protocol::IbUd);
}
