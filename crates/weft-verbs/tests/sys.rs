//! Tests of the libibverbs/librdmacm wrappers on real (soft-RoCE) devices.
//!
//! They are built only with the `rdma` feature, and a missing device
//! fails them, saying why: they never pass without running. Run them in
//! the rxe VM:
//!
//! ```text
//! WEFT_RXE_CARGO_ARGS="-p weft-verbs" integration/run-rxe
//! ```
//!
//! Devices: rxe0 on lo (127.0.0.1, loopback QPs), rxe1 10.66.0.1 (rdma_cm
//! server), rxe2 10.66.0.2 (rdma_cm client); GID index 1.
#![cfg(feature = "rdma")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use weft_core::Error;
use weft_verbs::sys::{
    find_gid_for_ip, list_devices, poll_readable, AccessFlags, AddressHandle, AhAttr, AtomicCap,
    BytesMr, BytesMutMr, CmEvent, CmEventKind, CmId, CompChannel, ConnParam, Context, Cq,
    EventChannel, Gid, LinkLayer, OwnedMr, Payload, PortSpace, PortState, ProtectionDomain, QpCaps,
    QpInitAttr, QpState, QpType, QueuePair, RcConnectParams, RecvRequest, SendFlags, SendOp,
    SendRequest, Srq, UdDest, WcFlags, WcOpcode, WcStatus, WorkCompletion, RNR_TIMER,
};

#[path = "sys/cm.rs"]
mod cm;
#[path = "sys/mw.rs"]
mod mw;
#[path = "sys/qp.rs"]
mod qp;
#[path = "sys/wake.rs"]
mod wake;

const TIMEOUT: Duration = Duration::from_secs(20);

fn in_vm() -> bool {
    std::env::var("RXE_VM").as_deref() == Ok("1")
}

/// Opens `name`, or explains the skip (and fails inside the VM).
fn open_or_skip(name: &str) -> Option<Arc<Context>> {
    match Context::open(name) {
        Ok(ctx) => Some(ctx),
        Err(e) if in_vm() => panic!("RXE_VM=1 but RDMA device {name} cannot be opened: {e}"),
        Err(e) => panic!(
            "no RDMA device {name} ({e}): run these tests in the rxe VM (integration/run-rxe)"
        ),
    }
}

fn env_u8(name: &str, default: u8) -> u8 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn env_ip(names: &[&str], default: Ipv4Addr) -> IpAddr {
    names
        .iter()
        .find_map(|n| std::env::var(n).ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(IpAddr::V4(default))
}

fn lo_gid_index() -> u8 {
    env_u8("RXE_LO_GID", 1)
}

/// Polls `cq` until `n` completions arrived.
fn wait_cq(cq: &Cq, n: usize) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + TIMEOUT;
    let mut out = Vec::new();
    while out.len() < n {
        let want = n - out.len();
        if cq.poll(&mut out, want).unwrap() == 0 {
            assert!(
                Instant::now() < deadline,
                "timed out: {} of {n} completions: {out:?}",
                out.len()
            );
            thread::sleep(Duration::from_millis(1));
        }
    }
    out
}

fn wait_one(cq: &Cq) -> WorkCompletion {
    wait_cq(cq, 1)[0]
}

fn assert_ok(wc: &WorkCompletion, wr_id: u64, opcode: WcOpcode) {
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    assert_eq!(wc.to_error(), None);
    assert_eq!(wc.wr_id, wr_id, "{wc:?}");
    assert_eq!(wc.opcode, opcode, "{wc:?}");
}

/// Posts a receive on `b` and a send of `data` to it from `a`.
fn recv_then_send(p: &Pair, buf: &OwnedMr, recv_id: u64, send_id: u64, data: &[u8]) {
    p.b.post_recv(&RecvRequest {
        wr_id: recv_id,
        sges: &[buf.sge(0, 64).unwrap()],
    })
    .unwrap();
    p.a.post_send(&SendRequest::new(
        send_id,
        SendOp::Send,
        Payload::Inline(data),
    ))
    .unwrap();
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

const ALL_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE;

fn all_access() -> AccessFlags {
    ALL_ACCESS | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC
}

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    }
}

/// Two RC QPs on one device, connected to each other by hand.
struct Pair {
    pd: Arc<ProtectionDomain>,
    cq_a: Arc<Cq>,
    cq_b: Arc<Cq>,
    a: Arc<QueuePair>,
    b: Arc<QueuePair>,
}

fn rc_pair(ctx: &Arc<Context>, channel: Option<&Arc<CompChannel>>, srq_b: bool) -> Pair {
    let pd = ProtectionDomain::new(ctx).unwrap();
    let cq_a = Cq::new(ctx, 256, channel).unwrap();
    let cq_b = Cq::new(ctx, 256, channel).unwrap();
    let init = |cq: &Arc<Cq>, srq: Option<Arc<Srq>>| QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: Arc::clone(cq),
        recv_cq: Arc::clone(cq),
        srq,
        caps: caps(),
        sq_sig_all: false,
    };
    let srq = srq_b.then(|| Srq::new(&pd, 64, 4).unwrap());
    let a = QueuePair::new(&pd, &init(&cq_a, None)).unwrap();
    let b = QueuePair::new(&pd, &init(&cq_b, srq)).unwrap();
    assert_eq!(a.state().unwrap(), QpState::Reset);
    let gidx = lo_gid_index();
    let gid = ctx.query_gid(1, u32::from(gidx)).unwrap();
    let mtu = ctx.query_port(1).unwrap().active_mtu;
    let pa = RcConnectParams::roce(1, gidx, mtu, gid, b.qp_num(), 200, 100);
    let pb = RcConnectParams::roce(1, gidx, mtu, gid, a.qp_num(), 100, 200);
    a.connect_rc(&pa).unwrap();
    b.connect_rc(&pb).unwrap();
    assert_eq!(a.state().unwrap(), QpState::Rts);
    assert_eq!(b.state().unwrap(), QpState::Rts);
    Pair {
        pd,
        cq_a,
        cq_b,
        a,
        b,
    }
}

#[test]
fn device_query_rxe0() {
    let Some(ctx) = open_or_skip("rxe0") else {
        return;
    };
    let devs = list_devices().unwrap();
    assert!(devs.iter().any(|d| d.name == "rxe0"), "{devs:?}");
    let attr = ctx.query_device().unwrap();
    assert!(
        attr.max_qp > 0 && attr.max_qp_wr > 0 && attr.max_sge > 0,
        "{attr:?}"
    );
    assert!(attr.max_cq > 0 && attr.max_cqe > 0 && attr.max_mr > 0 && attr.max_pd > 0);
    assert!(attr.max_mr_size > 0 && attr.page_size_cap != 0);
    assert!(attr.phys_port_cnt >= 1);
    let port = ctx.query_port(1).unwrap();
    assert_eq!(port.state, PortState::Active, "{port:?}");
    assert_eq!(port.link_layer, LinkLayer::Ethernet);
    assert!(port.gid_tbl_len > 1 && port.max_msg_sz > 0);
    let gid = ctx.query_gid(1, u32::from(lo_gid_index())).unwrap();
    assert_eq!(gid, Gid::from(Ipv4Addr::LOCALHOST));
    assert_eq!(gid.to_ip(), Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    assert!(ctx.query_gid(1, 100_000).is_err());
    assert_eq!(Context::open("no-such-device").unwrap_err(), Error::NoDev);

    let loc = find_gid_for_ip(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
    assert_eq!(loc.device, "rxe0");
    assert_eq!((loc.port, loc.gid_index), (1, u32::from(lo_gid_index())));
    assert!(loc.roce_v2);
    let a_ip = env_ip(
        &["WEFT_RXE_SERVER_IP", "RXE_A_IP"],
        Ipv4Addr::new(10, 66, 0, 1),
    );
    if let Ok(loc) = find_gid_for_ip(a_ip) {
        assert_eq!(loc.device, "rxe1", "{loc:?}");
    }
    assert_eq!(
        find_gid_for_ip(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 77))).unwrap_err(),
        Error::AddrNotAvail
    );

    let inline = ctx.probe_max_inline_data().unwrap();
    assert!(inline >= 64, "max inline {inline}");
    eprintln!(
        "rxe0: max_inline_data={inline} max_cqe={} atomic_cap={:?} max_qp_wr={} max_sge={} \
         max_sge_rd={} max_mr_size={:#x} max_qp={} max_cq={} max_mr={} max_pd={} \
         max_qp_rd_atom={} max_qp_init_rd_atom={} max_srq={} max_srq_wr={} \
         page_size_cap={:#x} phys_port_cnt={} port: {:?} mtu={:?} max_msg_sz={} gid_tbl_len={}",
        attr.max_cqe,
        attr.atomic_cap,
        attr.max_qp_wr,
        attr.max_sge,
        attr.max_sge_rd,
        attr.max_mr_size,
        attr.max_qp,
        attr.max_cq,
        attr.max_mr,
        attr.max_pd,
        attr.max_qp_rd_atom,
        attr.max_qp_init_rd_atom,
        attr.max_srq,
        attr.max_srq_wr,
        attr.page_size_cap,
        attr.phys_port_cnt,
        port.state,
        port.active_mtu,
        port.max_msg_sz,
        port.gid_tbl_len,
    );
}

#[test]
fn register_and_deregister() {
    let Some(ctx) = open_or_skip("rxe0") else {
        return;
    };
    let pd = ProtectionDomain::new(&ctx).unwrap();

    let mut mr = OwnedMr::new(&pd, 8192, all_access()).unwrap();
    assert_eq!(mr.len(), 8192);
    assert_eq!(mr.addr() % 4096, 0, "page aligned");
    let mut zero = [1u8; 16];
    mr.read_at(8192 - 16, &mut zero).unwrap();
    assert_eq!(zero, [0; 16], "zeroed");
    mr.write_at(100, b"registered").unwrap();
    let mut back = [0u8; 10];
    mr.read_at(100, &mut back).unwrap();
    assert_eq!(&back, b"registered");
    mr.write_u64_at(8, 0x0102_0304_0506_0708).unwrap();
    assert_eq!(mr.read_u64_at(8).unwrap(), 0x0102_0304_0506_0708);
    assert_eq!(mr.read_at(8190, &mut back).unwrap_err(), Error::Inval);
    assert_eq!(mr.write_at(usize::MAX, b"x").unwrap_err(), Error::Inval);
    let sge = mr.sge(4096, 100).unwrap();
    assert_eq!(
        (sge.addr(), sge.len(), sge.lkey()),
        (mr.addr() + 4096, 100, mr.lkey())
    );
    assert_eq!(sge.slice(90, 10).unwrap().addr(), mr.addr() + 4186);
    assert!(sge.slice(90, 11).is_err());
    assert!(mr.sge(8000, 193).is_err());
    drop(mr);

    assert_eq!(
        OwnedMr::new(&pd, 0, AccessFlags::LOCAL_WRITE).unwrap_err(),
        Error::Inval
    );
    // Remote write without local write is refused by the device.
    assert_eq!(
        OwnedMr::new(&pd, 4096, AccessFlags::REMOTE_WRITE).unwrap_err(),
        Error::Inval
    );

    let data = Bytes::from(pattern(5000, 3));
    let ptr = data.as_ptr();
    let smr = BytesMr::new(&pd, data.clone(), AccessFlags::REMOTE_READ).unwrap();
    assert_eq!(smr.len(), 5000);
    assert_eq!(smr.addr(), ptr as u64);
    assert_eq!(smr.sge().unwrap().len(), 5000);
    assert_eq!(smr.bytes(), &data);
    let back = smr.into_inner().unwrap();
    assert_eq!(back.as_ptr(), ptr);
    assert_eq!(
        BytesMr::new(&pd, data.clone(), AccessFlags::LOCAL_WRITE).unwrap_err(),
        Error::Inval,
        "Bytes are never device-writable"
    );
    assert_eq!(
        BytesMr::new(&pd, Bytes::new(), AccessFlags::NONE).unwrap_err(),
        Error::Inval
    );

    let rmr = BytesMutMr::new(&pd, BytesMut::zeroed(3000), AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(rmr.len(), 3000);
    assert_eq!(rmr.sge_range(1000, 2000).unwrap().len(), 2000);
    assert!(rmr.sge_range(1001, 2000).is_err());
    let buf = rmr.into_inner().unwrap();
    assert_eq!(buf.len(), 3000);

    // Many registrations and deregistrations.
    for i in 0..200 {
        let mr = OwnedMr::new(&pd, 4096 * (1 + i % 4), all_access()).unwrap();
        assert_ne!(mr.lkey(), 0);
    }
}

#[test]
fn wc_status_mapping() {
    assert_eq!(WcStatus::Success.to_error(), None);
    assert_eq!(WcStatus::from_raw(10), WcStatus::RemAccessErr);
    assert_eq!(WcStatus::RemAccessErr.to_error(), Some(Error::Access));
    assert_eq!(WcStatus::WrFlushErr.to_error(), Some(Error::Canceled));
    assert_eq!(WcStatus::RnrRetryExcErr.to_error(), Some(Error::NoRx));
    assert_eq!(WcStatus::RetryExcErr.to_error(), Some(Error::TimedOut));
    assert_eq!(WcStatus::LocLenErr.to_error(), Some(Error::Trunc));
    assert_eq!(WcStatus::from_raw(999), WcStatus::Unknown(999));
    for v in 0..=23 {
        assert_eq!(WcStatus::from_raw(v).to_raw(), v);
        assert_eq!(WcStatus::from_raw(v).to_error().is_none(), v == 0);
    }
    let gid = Gid::from(Ipv4Addr::new(10, 66, 0, 1));
    assert_eq!(gid.to_string(), "0000:0000:0000:0000:0000:ffff:0a42:0001");
    assert_eq!(gid.to_ip(), Some(IpAddr::V4(Ipv4Addr::new(10, 66, 0, 1))));
    assert_eq!(Gid::default().to_ip(), None);
    assert_eq!(PortSpace::Tcp.max_connect_private_data(), 56);
    assert_eq!(PortSpace::Tcp.max_accept_private_data(), 196);
    assert_eq!(
        format!("{:?}", AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ),
        "AccessFlags(LOCAL_WRITE | REMOTE_READ)"
    );
}
