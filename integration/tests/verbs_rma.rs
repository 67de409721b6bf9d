//! RMA over the verbs provider on a real RDMA device (soft-RoCE in the VM
//! of `integration/run-rxe`): memory regions from the domain, RDMA write
//! and read between an RDM client on rxe2 and a server's region on rxe1,
//! and over a MSG connection, where a write with remote CQ data completes
//! the target's next posted receive. Bad keys and addresses end in error
//! completions, and the peer stays reachable afterwards.
//!
//! Outside the VM every test prints why it is skipped; inside it a missing
//! device is a failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bytes::{Bytes, BytesMut};
use weft::{
    BindFlags, Caps, CompletionQueue, ConnRequest, CqAttr, Domain, Endpoint, EpType, EqEventKind,
    Error, EventQueue, FiAddr, Info, Mode, MrAccess, MrMode, OpFlags, RmaMsg, RmaOp, WaitMode,
    FI_ADDR_UNSPEC,
};
use weft_integration::{next_cq, next_eq, payload, verbs_offer_with, within, Node};

const SERVER_DEV: &str = "rxe1";
const CLIENT_DEV: &str = "rxe2";

/// The RMA-capable offer of `dev`: the hints ask for RMA and accept its
/// registration mode.
fn rma_offer(dev: &str, ep_type: EpType) -> Option<Info> {
    verbs_offer_with(dev, ep_type, |h| {
        h.caps = Caps::MSG | Caps::TAGGED.intersection(caps_of(ep_type)) | Caps::RMA;
        h.domain_attr.mr_mode = MrMode::PROV_KEY | MrMode::VIRT_ADDR | MrMode::LOCAL;
        // MSG writedata completes a posted receive at the target.
        h.mode = Mode::RX_CQ_DATA;
    })
}

fn caps_of(ep_type: EpType) -> Caps {
    match ep_type {
        EpType::Rdm => Caps::TAGGED,
        _ => Caps::empty(),
    }
}

/// Server (rxe1, owns the regions) and client (rxe2), and the client's
/// handle of the server.
fn rdm_pair() -> Option<(Node, Node, FiAddr)> {
    let s = Node::open(&rma_offer(SERVER_DEV, EpType::Rdm)?, WaitMode::Interrupt);
    let c = Node::open(&rma_offer(CLIENT_DEV, EpType::Rdm)?, WaitMode::Interrupt);
    let to_s = c.handle_of(&s);
    Some((s, c, to_s))
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[test]
fn offers_rma_only_to_apps_that_accept_its_mr_mode() {
    let Some(info) = rma_offer(SERVER_DEV, EpType::Rdm) else {
        return;
    };
    // RMA without READ or WRITE stands for both (fi_getinfo(3)).
    assert!(info.caps.contains(Caps::RMA));
    assert_eq!(
        info.domain_attr.mr_mode,
        MrMode::PROV_KEY | MrMode::VIRT_ADDR
    );
    // Default hints (mr_mode 0): no RMA, and nothing asked.
    let plain = weft_integration::verbs_offer(SERVER_DEV, EpType::Rdm).unwrap();
    assert!(!plain.caps.intersects(Caps::RMA));
    assert_eq!(plain.domain_attr.mr_mode, MrMode::empty());
    // MSG keeps FI_RX_CQ_DATA for apps that accept it (their writedata
    // takes a posted receive) and drops it for the others, whose
    // writedata is then NoSys.
    let msg = rma_offer(SERVER_DEV, EpType::Msg).unwrap();
    assert!(msg.mode.contains(Mode::RX_CQ_DATA));
    let msg = weft_integration::verbs_offer(SERVER_DEV, EpType::Msg).unwrap();
    assert!(!msg.mode.contains(Mode::RX_CQ_DATA));
    assert!(!msg.rx_attr.mode.contains(Mode::RX_CQ_DATA));
    assert!(info.mode.is_empty(), "RDM has no such mode");
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_write_then_read_back_every_size() {
    let Some((s, c, to_s)) = rdm_pair() else {
        return;
    };
    const LEN: usize = 8 << 20;
    let mr = s
        .domain
        .mr_alloc(LEN, MrAccess::REMOTE_READ | MrAccess::REMOTE_WRITE)
        .unwrap();
    assert_eq!(mr.len(), LEN);
    assert_eq!(mr.to_vec().unwrap(), vec![0u8; LEN], "regions start zeroed");
    // Inline (small), registered, and multi-megabyte writes, at offsets.
    let mut off = 0usize;
    for (i, len) in [1usize, 64, 100, 4096, 65537, 1 << 20, 4 << 20]
        .into_iter()
        .enumerate()
    {
        let data = payload(len, i as u8 + 1);
        let e = within(
            "rma write",
            c.ep.write(to_s, data.clone(), mr.addr() + off as u64, mr.key()),
        )
        .await
        .unwrap();
        assert_eq!(e.len, len);
        assert!(
            e.flags.contains(OpFlags::RMA | OpFlags::WRITE),
            "{:?}",
            e.flags
        );
        // The target sees the bytes...
        let mut got = vec![0u8; len];
        mr.read_at(off, &mut got).unwrap();
        assert_eq!(got, data, "write of {len} at {off}");
        // ...and the initiator reads them back.
        let e = within(
            "rma read",
            c.ep.read(
                to_s,
                BytesMut::zeroed(len),
                mr.addr() + off as u64,
                mr.key(),
            ),
        )
        .await
        .unwrap();
        assert!(e.flags.contains(OpFlags::RMA | OpFlags::READ));
        assert_eq!(e.len, len);
        assert_eq!(&e.into_bytes()[..], &data[..], "read of {len} at {off}");
        off += len;
    }
    // The byte after the last write is untouched.
    let mut one = [0xffu8; 1];
    mr.read_at(off, &mut one).unwrap();
    assert_eq!(one, [0]);
    // The target's own writes are what a reader sees.
    mr.write_at(LEN - 3, b"end").unwrap();
    let e =
        c.ep.read(
            to_s,
            BytesMut::zeroed(3),
            mr.addr() + (LEN - 3) as u64,
            mr.key(),
        )
        .await
        .unwrap();
    assert_eq!(&e.into_bytes()[..], b"end");
    // Nothing showed up on the target's CQ: RMA is one-sided.
    weft_integration::assert_cq_quiet(&s.cq, "target CQ after RMA").await;
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_posted_rma_reports_to_the_cq_and_counters() {
    let Some((s, c, to_s)) = rdm_pair() else {
        return;
    };
    let mr = s
        .domain
        .mr_alloc(4096, MrAccess::REMOTE_READ | MrAccess::REMOTE_WRITE)
        .unwrap();
    // Gathered write: two buffers land back to back.
    c.ep.post_rmamsg(
        RmaMsg {
            dest: to_s,
            op: RmaOp::Write {
                iov: vec![
                    Bytes::from_static(b"hello, "),
                    Bytes::from_static(b"region"),
                ],
                data: None,
            },
            addr: mr.addr() + 10,
            key: mr.key(),
            context: 77,
        },
        OpFlags::empty(),
    )
    .unwrap();
    let e = within("write completion", next_cq(&c.cq)).await.unwrap();
    assert_eq!((e.context, e.len), (77, 13));
    let mut got = [0u8; 13];
    mr.read_at(10, &mut got).unwrap();
    assert_eq!(&got, b"hello, region");
    // Scattered read into two buffers.
    c.ep.post_rmamsg(
        RmaMsg {
            dest: to_s,
            op: RmaOp::Read {
                bufs: vec![BytesMut::zeroed(5), BytesMut::zeroed(8)],
            },
            addr: mr.addr() + 10,
            key: mr.key(),
            context: 78,
        },
        OpFlags::empty(),
    )
    .unwrap();
    let e = within("read completion", next_cq(&c.cq)).await.unwrap();
    assert_eq!(e.context, 78);
    assert_eq!(&e.bufs[0][..], b"hello");
    assert_eq!(&e.bufs[1][..], b", region");
    // A write with remote CQ data: the target's receive CQ reports it,
    // after the bytes are in place, with the data and the source.
    let to_c = s.handle_of(&c);
    for (i, len) in [3usize, 3000, 200_000].into_iter().enumerate() {
        let data = payload(len, 9 + i as u8);
        let cq_data = 0xDA7A_0000_0000_0000 | i as u64;
        c.ep.post_writedata(
            to_s,
            data.clone(),
            cq_data,
            mr.addr() + 100,
            mr.key(),
            90 + i as u64,
        )
        // The region is 4 KiB: the last one is out of range, and must
        // fail at the target, not here.
        .unwrap_or_else(|e| panic!("post_writedata of {len}: {e}"));
        let e = within("writedata completion", next_cq(&c.cq)).await;
        if 100 + len > 4096 {
            let e = e.expect_err("writedata past the end of the region");
            assert_eq!((e.err, e.context), (Error::Access, 92));
            weft_integration::assert_cq_quiet(&s.cq, "target CQ after a failed writedata").await;
            continue;
        }
        assert_eq!(e.unwrap().context, 90 + i as u64);
        let t = within("target completion", next_cq(&s.cq)).await.unwrap();
        assert_eq!(
            t.flags,
            OpFlags::RMA | OpFlags::REMOTE_WRITE | OpFlags::REMOTE_CQ_DATA
        );
        assert_eq!((t.len, t.data, t.src), (len, cq_data, to_c));
        let mut got = vec![0u8; len];
        mr.read_at(100, &mut got).unwrap();
        assert_eq!(got, data);
    }
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_bad_keys_and_ranges_fail_and_the_peer_stays_usable() {
    let Some((s, c, to_s)) = rdm_pair() else {
        return;
    };
    let mr = s
        .domain
        .mr_alloc(4096, MrAccess::REMOTE_READ | MrAccess::REMOTE_WRITE)
        .unwrap();
    let ro = s.domain.mr_alloc(4096, MrAccess::REMOTE_READ).unwrap();
    let good = |what: &'static str| {
        let c = &c;
        let mr = &mr;
        async move {
            let e = within(
                what,
                c.ep.write(to_s, Bytes::from_static(b"ok"), mr.addr(), mr.key()),
            )
            .await;
            assert!(e.is_ok(), "{what}: {e:?}");
        }
    };
    good("first write").await;
    let cases: Vec<(&str, u64, u64)> = vec![
        ("wrong key", mr.addr(), u64::from(mr.key() as u32 ^ 0x5a5a)),
        ("past the end", mr.addr() + 4095, mr.key()),
        ("below the start", mr.addr() - 8, mr.key()),
        ("read-only region", ro.addr(), ro.key()),
        ("key wider than 32 bits", mr.addr(), mr.key() | 1 << 40),
    ];
    for (what, addr, key) in cases {
        let e = within(what, c.ep.write(to_s, Bytes::from_static(b"12"), addr, key))
            .await
            .expect_err(what);
        assert_eq!(e.err, Error::Access, "{what}");
        assert!(e.flags.contains(OpFlags::RMA | OpFlags::WRITE), "{what}");
        // The connection that carried the error is replaced: the next
        // operation to the same peer works.
        good(what).await;
    }
    // A failed read hands its buffer back.
    let e = within(
        "bad read",
        c.ep.read(to_s, BytesMut::zeroed(16), mr.addr() + 4090, mr.key()),
    )
    .await
    .expect_err("read past the end");
    assert_eq!(e.err, Error::Access);
    assert_eq!(e.bufs.iter().map(|b| b.len()).sum::<usize>(), 16);
    // Reading needs REMOTE_READ at the target.
    let wo = s.domain.mr_alloc(64, MrAccess::REMOTE_WRITE).unwrap();
    let e = within(
        "read of a write-only region",
        c.ep.read(to_s, BytesMut::zeroed(8), wo.addr(), wo.key()),
    )
    .await
    .expect_err("read without REMOTE_READ");
    assert_eq!(e.err, Error::Access);
    good("after the write-only read").await;
    // None of the failed writes touched the target's memory.
    let mut want = vec![0u8; 4096];
    want[..2].copy_from_slice(b"ok");
    assert_eq!(mr.to_vec().unwrap(), want, "only the good writes landed");
    assert_eq!(
        ro.to_vec().unwrap(),
        vec![0u8; 4096],
        "read-only region untouched"
    );
    // A closed region's key stops working at once; its copies fail.
    let key = mr.key();
    let addr = mr.addr();
    mr.close().expect("close");
    assert_eq!(mr.read_at(0, &mut [0u8; 1]), Err(Error::Canceled));
    let e = within(
        "revoked key",
        c.ep.write(to_s, Bytes::from_static(b"no"), addr, key),
    )
    .await
    .expect_err("write with a revoked key");
    assert_eq!(e.err, Error::Access);
    // Messages still flow between the two.
    let (got, sent) = within("message after errors", async {
        tokio::join!(
            s.ep.trecv(BytesMut::zeroed(8), FI_ADDR_UNSPEC, 5, 0),
            c.ep.tsend(to_s, Bytes::from_static(b"still up"), 5)
        )
    })
    .await;
    sent.unwrap();
    assert_eq!(&got.unwrap().into_bytes()[..], b"still up");
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn region_arguments_are_checked() {
    let Some(info) = rma_offer(SERVER_DEV, EpType::Rdm) else {
        return;
    };
    let fabric = weft::Fabric::open(&info).unwrap();
    let domain = fabric.domain(&info).unwrap();
    assert_eq!(
        domain.mr_alloc(0, MrAccess::REMOTE_READ).err(),
        Some(Error::Inval)
    );
    assert_eq!(
        domain.mr_alloc(8, MrAccess::empty()).err(),
        Some(Error::Inval)
    );
    let mr = domain.mr_alloc(8, MrAccess::REMOTE_WRITE).unwrap();
    assert_eq!(mr.write_at(7, b"ab"), Err(Error::Inval));
    assert_eq!(mr.read_at(usize::MAX, &mut [0u8; 2]), Err(Error::Inval));
    mr.write_at(6, b"ab").unwrap();
    assert_eq!(&mr.to_vec().unwrap()[6..], b"ab");
    assert_ne!(mr.addr(), 0);
}

/// A MSG connection, rxe2 -> rxe1, with RMA: the server's domain, both
/// endpoints with their EQs and CQs, and the listener (kept alive).
struct MsgPair {
    sd: Domain,
    cep: Endpoint,
    sep: Endpoint,
    ccq: CompletionQueue,
    scq: CompletionQueue,
    ceq: EventQueue,
    seq: EventQueue,
    _pep: weft::PassiveEndpoint,
}

async fn msg_pair() -> Option<MsgPair> {
    let (si, ci) = (
        rma_offer(SERVER_DEV, EpType::Msg)?,
        rma_offer(CLIENT_DEV, EpType::Msg)?,
    );
    let (sf, cf) = (
        weft::Fabric::open(&si).unwrap(),
        weft::Fabric::open(&ci).unwrap(),
    );
    let (sd, cd) = (sf.domain(&si).unwrap(), cf.domain(&ci).unwrap());
    let pep = sf.passive_endpoint(&si, None).unwrap();
    let peq = sf.eq(16).unwrap();
    pep.bind_eq(&peq).unwrap();
    pep.listen().unwrap();
    let mk = |d: &Domain, f: &weft::Fabric, info: &Info, req: Option<&ConnRequest>| {
        let ep = match req {
            Some(r) => d.accept_endpoint(info, r).unwrap(),
            None => d.endpoint(info).unwrap(),
        };
        let eq = f.eq(16).unwrap();
        let cq = d
            .cq(CqAttr {
                wait: WaitMode::Interrupt,
                ..CqAttr::default()
            })
            .unwrap();
        ep.bind_eq(&eq).unwrap();
        ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
            .unwrap();
        ep.enable().unwrap();
        (ep, eq, cq)
    };
    let (cep, ceq, ccq) = mk(&cd, &cf, &ci, None);
    let addr = pep.local_addr().unwrap();
    let c2 = cep.clone();
    let conn = tokio::spawn(async move { c2.connect(addr, Vec::new()).await });
    let ev = within("connreq", next_eq(&peq)).await.unwrap();
    assert_eq!(ev.kind, EqEventKind::ConnReq);
    let req = ConnRequest::from_event(&ev).unwrap();
    let (sep, seq, scq) = mk(&sd, &sf, &si, Some(&req));
    within("accept", sep.accept(Vec::new())).await.unwrap();
    within("connect", conn).await.unwrap().unwrap();
    for q in [&ceq, &seq] {
        let ev = within("connected", next_eq(q)).await.unwrap();
        assert_eq!(ev.kind, EqEventKind::Connected);
    }
    let _ = cd;
    Some(MsgPair {
        sd,
        cep,
        sep,
        ccq,
        scq,
        ceq,
        seq,
        _pep: pep,
    })
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_write_read_and_a_bad_key_is_a_critical_error() {
    // Bound whole: a field left out of a pattern would be dropped here,
    // and with the server's endpoint the connection.
    let Some(p) = msg_pair().await else {
        return;
    };
    let (cep, ceq, seq) = (&p.cep, &p.ceq, &p.seq);
    let mr =
        p.sd.mr_alloc(1 << 20, MrAccess::REMOTE_READ | MrAccess::REMOTE_WRITE)
            .unwrap();
    for (i, len) in [8usize, 4096, 1 << 20].into_iter().enumerate() {
        let data = payload(len, 40 + i as u8);
        within(
            "msg write",
            cep.write(FI_ADDR_UNSPEC, data.clone(), mr.addr(), mr.key()),
        )
        .await
        .unwrap();
        let e = within(
            "msg read",
            cep.read(FI_ADDR_UNSPEC, BytesMut::zeroed(len), mr.addr(), mr.key()),
        )
        .await
        .unwrap();
        assert_eq!(&e.into_bytes()[..], &data[..]);
    }
    // A wrong key is a critical error on a MSG endpoint: the operation
    // fails with Access, the endpoint is disabled for good, its pending
    // receive is flushed and its EQ has the error; the peer sees an
    // orderly end (the disconnect).
    cep.post_recv(BytesMut::zeroed(8), 77).unwrap();
    let e = within(
        "bad key",
        cep.write(
            FI_ADDR_UNSPEC,
            Bytes::from_static(b"x"),
            mr.addr(),
            u64::from(mr.key() as u32 ^ 1),
        ),
    )
    .await
    .expect_err("wrong key");
    assert_eq!(e.err, Error::Access);
    let flushed = within("flushed receive", next_cq(&p.ccq))
        .await
        .unwrap_err();
    assert_eq!((flushed.context, flushed.err), (77, Error::Canceled));
    match ceq.next_timeout(weft_integration::TIMEOUT).await {
        Ok(Err(e)) => assert_eq!(e.err, Error::Access),
        other => panic!("client: {other:?} instead of the error"),
    }
    assert!(!cep.is_enabled());
    assert_eq!(
        cep.post_send(FI_ADDR_UNSPEC, Bytes::from_static(b"x"), 1)
            .unwrap_err(),
        Error::OpBadState
    );
    assert_eq!(cep.enable().unwrap_err(), Error::NoSys);
    match seq.next_timeout(weft_integration::TIMEOUT).await {
        Ok(Ok(ev)) => assert_eq!(ev.kind, EqEventKind::Shutdown, "server"),
        other => panic!("server: {other:?} instead of shutdown"),
    }
    assert!(ceq.next_timeout(weft_integration::QUIET).await.is_err());
}

/// The flags of `fi_writedata`'s target completion, on MSG as on RDM.
const REMOTE_WRITE_DATA: OpFlags = OpFlags::RMA
    .union(OpFlags::REMOTE_WRITE)
    .union(OpFlags::REMOTE_CQ_DATA);

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_writedata_completes_the_targets_next_receive() {
    let Some(p) = msg_pair().await else {
        return;
    };
    let mr =
        p.sd.mr_alloc(1 << 20, MrAccess::REMOTE_READ | MrAccess::REMOTE_WRITE)
            .unwrap();
    // Inline, slot-sized and registered writes, each consuming one posted
    // receive: a bounce-slot one (small), a registered one (large) and an
    // empty one.
    let cases = [(5usize, 64usize), (4096, 1 << 16), (1 << 20, 0)];
    for (i, &(len, cap)) in cases.iter().enumerate() {
        let ctx = 100 + i as u64;
        p.sep.post_recv(BytesMut::zeroed(cap), ctx).unwrap();
        let data = payload(len, 70 + i as u8);
        let cq_data = 0xC0DE_0000 | i as u64;
        p.cep
            .post_writedata(
                FI_ADDR_UNSPEC,
                data.clone(),
                cq_data,
                mr.addr(),
                mr.key(),
                200 + i as u64,
            )
            .unwrap();
        let e = within("writedata completion", next_cq(&p.ccq))
            .await
            .unwrap();
        assert_eq!(e.context, 200 + i as u64);
        assert!(e.flags.contains(OpFlags::RMA | OpFlags::WRITE), "{e:?}");
        let t = within("target completion", next_cq(&p.scq)).await.unwrap();
        assert_eq!(t.context, ctx, "the posted receive it consumed");
        assert_eq!(t.flags, REMOTE_WRITE_DATA, "len {len}");
        assert_eq!((t.len, t.data), (len, cq_data));
        // The receive's buffer is handed back untouched: nothing landed
        // in it.
        assert_eq!(t.bufs.iter().map(|b| b.len()).sum::<usize>(), 0);
        // The bytes are in place once the target hears of the write.
        let mut got = vec![0u8; len];
        mr.read_at(0, &mut got).unwrap();
        assert_eq!(got, data, "write of {len}");
    }
    // The awaited receive form reports it the same way.
    let (r, w) = within("awaited", async {
        tokio::join!(
            p.sep.recv(BytesMut::zeroed(16)),
            p.cep.writedata(
                FI_ADDR_UNSPEC,
                Bytes::from_static(b"awaited"),
                u64::from(u32::MAX),
                mr.addr() + 10,
                mr.key()
            )
        )
    })
    .await;
    w.unwrap();
    let r = r.unwrap();
    assert_eq!(
        (r.flags, r.len, r.data),
        (REMOTE_WRITE_DATA, 7, 0xFFFF_FFFF)
    );
    // Remote CQ data is the 32-bit immediate: a 33-bit value is refused
    // before anything is posted, for writes and for sends.
    assert_eq!(
        p.cep.post_writedata(
            FI_ADDR_UNSPEC,
            Bytes::from_static(b"d"),
            1 << 32,
            mr.addr(),
            mr.key(),
            1
        ),
        Err(Error::Inval)
    );
    assert_eq!(
        p.cep
            .post_senddata(FI_ADDR_UNSPEC, Bytes::from_static(b"d"), 1 << 32, 2),
        Err(Error::Inval)
    );
    let e = p
        .cep
        .writedata(
            FI_ADDR_UNSPEC,
            Bytes::from_static(b"d"),
            u64::MAX,
            mr.addr(),
            mr.key(),
        )
        .await
        .expect_err("64-bit data");
    assert_eq!(e.err, Error::Inval);
    weft_integration::assert_cq_quiet(&p.scq, "target CQ after refused posts").await;
    weft_integration::assert_cq_quiet(&p.ccq, "initiator CQ after refused posts").await;
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_sends_and_writedatas_interleaved_arrive_in_order() {
    let Some(p) = msg_pair().await else {
        return;
    };
    let mr =
        p.sd.mr_alloc(1 << 16, MrAccess::REMOTE_WRITE | MrAccess::REMOTE_READ)
            .unwrap();
    const N: u64 = 40;
    for i in 0..N {
        p.sep.post_recv(BytesMut::zeroed(256), 1000 + i).unwrap();
    }
    // Everything posted back to back; even ones are messages (every
    // fourth with CQ data of its own), odd ones writes of 1 KiB into a
    // slot of the region.
    for i in 0..N {
        let body = payload(if i % 4 == 2 { 200 } else { 1024 }, i as u8);
        let r = if i % 2 == 1 {
            p.cep
                .post_writedata(FI_ADDR_UNSPEC, body, i, mr.addr() + 1024 * i, mr.key(), i)
        } else if i % 4 == 2 {
            p.cep.post_senddata(FI_ADDR_UNSPEC, body, 0x5E00 | i, i)
        } else {
            p.cep.post_send(FI_ADDR_UNSPEC, payload(100, i as u8), i)
        };
        r.unwrap_or_else(|e| panic!("post {i}: {e}"));
    }
    for i in 0..N {
        let t = within("target completion", next_cq(&p.scq))
            .await
            .unwrap_or_else(|e| panic!("target completion {i}: {e:?}"));
        assert_eq!(t.context, 1000 + i, "receives complete in posting order");
        match i % 4 {
            1 | 3 => {
                assert_eq!((t.flags, t.len, t.data), (REMOTE_WRITE_DATA, 1024, i));
                let mut got = vec![0u8; 1024];
                mr.read_at(1024 * i as usize, &mut got).unwrap();
                assert_eq!(&got[..], &payload(1024, i as u8)[..], "write {i}");
            }
            2 => {
                assert_eq!(
                    t.flags,
                    OpFlags::RECV | OpFlags::MSG | OpFlags::REMOTE_CQ_DATA
                );
                assert_eq!(t.data, 0x5E00 | i);
                assert_eq!(&t.into_bytes()[..], &payload(200, i as u8)[..]);
            }
            _ => {
                assert_eq!(t.flags, OpFlags::RECV | OpFlags::MSG, "message {i}");
                assert_eq!(&t.into_bytes()[..], &payload(100, i as u8)[..]);
            }
        }
    }
    let mut done = Vec::new();
    for _ in 0..N {
        done.push(within("initiator", next_cq(&p.ccq)).await.unwrap().context);
    }
    done.sort_unstable();
    assert_eq!(done, (0..N).collect::<Vec<u64>>());
}

/// Both endpoint types with `FI_ATOMIC` (rxe has 64-bit atomics).
fn atomic_offer(dev: &str, ep_type: EpType) -> Option<Info> {
    verbs_offer_with(dev, ep_type, |h| {
        h.caps = Caps::MSG | Caps::RMA | Caps::ATOMIC;
        h.domain_attr.mr_mode = MrMode::PROV_KEY | MrMode::VIRT_ADDR;
    })
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_atomics_fetch_add_and_compare_swap() {
    let (Some(si), Some(ci)) = (
        atomic_offer(SERVER_DEV, EpType::Rdm),
        atomic_offer(CLIENT_DEV, EpType::Rdm),
    ) else {
        return;
    };
    assert!(si.caps.contains(Caps::ATOMIC));
    let (s, c) = (
        Node::open(&si, WaitMode::Interrupt),
        Node::open(&ci, WaitMode::Interrupt),
    );
    let to_s = c.handle_of(&s);
    let mr = s
        .domain
        .mr_alloc(64, MrAccess::REMOTE_READ | MrAccess::REMOTE_WRITE)
        .unwrap();
    let at = |i: u64| mr.addr() + 8 * i;
    mr.write_at(8, &40u64.to_ne_bytes()).unwrap();
    // Fetch-add returns the value before; the region holds the sum.
    let old = within("fetch_add", c.ep.fetch_add(to_s, at(1), mr.key(), 2))
        .await
        .unwrap();
    assert_eq!(old, 40);
    let mut v = [0u8; 8];
    mr.read_at(8, &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 42);
    // Wrapping.
    let old =
        c.ep.fetch_add(to_s, at(1), mr.key(), u64::MAX)
            .await
            .unwrap();
    assert_eq!(old, 42);
    mr.read_at(8, &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 41);
    // Compare-swap: swaps only on a match, returns the value before.
    let old =
        c.ep.compare_swap(to_s, at(1), mr.key(), 7, 99)
            .await
            .unwrap();
    assert_eq!(old, 41, "no match: unchanged");
    mr.read_at(8, &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 41);
    let old =
        c.ep.compare_swap(to_s, at(1), mr.key(), 41, 99)
            .await
            .unwrap();
    assert_eq!(old, 41);
    mr.read_at(8, &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 99);
    // 100 concurrent increments from two endpoints lose none.
    let c2 = Node::open(&ci, WaitMode::Interrupt);
    let to_s2 = c2.handle_of(&s);
    let key = mr.key();
    let incs = (0..50).map(|_| c.ep.fetch_add(to_s, at(2), key, 1));
    let incs2 = (0..50).map(|_| c2.ep.fetch_add(to_s2, at(2), key, 1));
    let all = within("concurrent increments", async {
        futures::future::join_all(incs.chain(incs2)).await
    })
    .await;
    let mut olds: Vec<u64> = all.into_iter().map(|r| r.unwrap()).collect();
    olds.sort_unstable();
    assert_eq!(
        olds,
        (0..100).collect::<Vec<u64>>(),
        "each increment saw a distinct value"
    );
    mr.read_at(16, &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 100);
    // Misaligned targets are refused before anything is posted; a bad
    // key fails at the target.
    let e =
        c.ep.fetch_add(to_s, at(1) + 4, mr.key(), 1)
            .await
            .unwrap_err();
    assert_eq!(e.err, Error::Inval);
    let e = within(
        "bad key",
        c.ep.fetch_add(to_s, at(1), u64::from(mr.key() as u32 ^ 3), 1),
    )
    .await
    .unwrap_err();
    assert_eq!(e.err, Error::Access);
    assert!(e.flags.contains(OpFlags::ATOMIC));
    // Without FI_ATOMIC in the endpoint's caps: NoSys.
    let plain = Node::open(
        &rma_offer(CLIENT_DEV, EpType::Rdm).unwrap(),
        WaitMode::Interrupt,
    );
    let to_s3 = plain.handle_of(&s);
    let e = plain
        .ep
        .fetch_add(to_s3, at(1), mr.key(), 1)
        .await
        .unwrap_err();
    assert_eq!(e.err, Error::NoSys);
}
