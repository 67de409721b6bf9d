//! Memory regions and RMA on the tcp provider: what getinfo offers, MSG
//! connections, regions over several buffers and sub-regions, reads
//! answered in pieces under a small budget, and raw peers forging RMA
//! frames (wrong keys, huge lengths, truncated frames, reads nobody
//! reads): the endpoint stays up, memory outside a region is never
//! touched, and a refused request leaves the connection usable.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWriteExt;
use weft::{
    BindFlags, Caps, CompletionQueue, ConnLimits, Endpoint, EpType, EqEventKind, Error, FiAddr,
    MemoryRegion, MrAccess, MrAttr, MrMode, OpFlags,
};
use weft_core::wire::rma::{ReadReq, Target, READ_CHUNK};
use weft_core::wire::{FrameKind, Header, FLAG_ACK_REQ, FLAG_CQ_DATA, HEADER_LEN};
use weft_integration::identity::{expect_closed, raw_hello, read_frame};
use weft_integration::{next_cq, next_eq, payload, within, Harness, Provider, RdmEp};

const RW: MrAccess = MrAccess::REMOTE_READ.union(MrAccess::REMOTE_WRITE);

fn tcp() -> Provider {
    Provider::named("tcp")
}

fn region(h: &Harness, len: usize, access: MrAccess, key: u64) -> MemoryRegion {
    h.domain
        .mr_regattr(MrAttr::alloc(len, access).requested_key(key))
        .unwrap()
}

#[tokio::test]
async fn default_hints_get_rma_on_both_types() {
    for t in [EpType::Rdm, EpType::Msg] {
        let i = tcp().info(t);
        let rma = Caps::RMA | Caps::READ | Caps::WRITE | Caps::REMOTE_READ | Caps::REMOTE_WRITE;
        assert!(i.caps.contains(rma), "{t:?}: {:?}", i.caps);
        assert!(i
            .tx_attr
            .caps
            .contains(Caps::RMA | Caps::READ | Caps::WRITE));
        assert!(!i
            .tx_attr
            .caps
            .intersects(Caps::REMOTE_READ | Caps::REMOTE_WRITE));
        assert!(i
            .rx_attr
            .caps
            .contains(Caps::RMA | Caps::REMOTE_READ | Caps::REMOTE_WRITE));
        assert!(!i.rx_attr.caps.intersects(Caps::READ | Caps::WRITE));
        assert!(i.caps.contains(Caps::ATOMIC), "atomics (tcp_atomic.rs)");
        assert!(i.tx_attr.caps.contains(Caps::ATOMIC));
        assert_eq!(i.domain_attr.mr_mode, MrMode::empty());
        assert_eq!(i.domain_attr.mr_key_size, 8);
        assert_eq!(i.domain_attr.mr_iov_limit, 8);
        assert_eq!(i.tx_attr.rma_iov_limit, 1);
        assert!(i.mode.is_empty(), "no FI_RX_CQ_DATA");
    }
}

/// A region over several application buffers and a sub-region with
/// its own key and rights, written and read by a peer across the
/// buffers' boundaries; nothing outside the sub-region moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_reach_regions_over_several_buffers_and_sub_regions() {
    let h = Harness::rdm(&tcp());
    let (a, _b, to_b, _) = h.rdm_pair();
    let bufs: Vec<BytesMut> = (0..4)
        .map(|i| BytesMut::from(&[0xa0 + i; 100][..]))
        .collect();
    let base = h
        .domain
        .mr_regattr(MrAttr::iov(bufs, RW).requested_key(10))
        .unwrap();
    let sub = h
        .domain
        .mr_regattr(MrAttr::sub(&base, 150, 200, MrAccess::REMOTE_WRITE).requested_key(11))
        .unwrap();
    let before = base.to_vec().unwrap();
    let data = payload(200, 3);
    a.ep.write(to_b, data.clone(), sub.addr(), sub.key())
        .await
        .unwrap();
    let after = base.to_vec().unwrap();
    assert_eq!(&after[150..350], &data[..]);
    assert_eq!(&after[..150], &before[..150], "before the sub-region");
    assert_eq!(&after[350..], &before[350..], "after the sub-region");
    // The sub-region has no remote read; its base does.
    let e = a.ep.read(to_b, BytesMut::zeroed(4), sub.addr(), sub.key());
    assert_eq!(e.await.unwrap_err().err, Error::Access);
    let e =
        a.ep.write(to_b, Bytes::from_static(b"xx"), sub.addr() + 199, sub.key());
    assert_eq!(e.await.unwrap_err().err, Error::Access, "one byte past");
    assert_eq!(base.to_vec().unwrap(), after, "refused: nothing moved");
    let r =
        a.ep.read(to_b, BytesMut::zeroed(400), base.addr(), base.key());
    assert_eq!(&r.await.unwrap().into_bytes()[..], &after[..]);
    // The buffers come back with what the peer wrote.
    sub.close().unwrap();
    let back = base.take_buffers().unwrap();
    assert_eq!(back.len(), 4);
    assert_eq!(&back[1][50..], &data[..50]);
}

/// A read far larger than one answer piece, served while the target's
/// budget holds only about one piece at a time: the answer parks and
/// resumes as the pieces go out, and arrives whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_reads_are_answered_in_pieces_under_a_small_budget() {
    let h = Harness::rdm(&tcp());
    let b = {
        let (av, cq) = (h.av(), h.cq());
        let ep = h.domain.endpoint(&h.info).unwrap();
        ep.set_conn_limits(ConnLimits::default().with_peer_buffered(READ_CHUNK / 2))
            .unwrap();
        ep.bind_av(&av).unwrap();
        ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
            .unwrap();
        ep.enable().unwrap();
        RdmEp { ep, av, cq }
    };
    let a = h.rdm_ep();
    let to_b = a.insert(&b);
    b.insert(&a);
    const LEN: usize = 5 * READ_CHUNK + 12_345;
    let mr = region(&h, LEN, RW, 5);
    let data = payload(LEN, 7);
    mr.write_at(0, &data).unwrap();
    let bufs = vec![BytesMut::zeroed(LEN / 3), BytesMut::zeroed(LEN - LEN / 3)];
    let op = weft::RmaOp::Read { bufs };
    let msg = weft::RmaMsg {
        dest: to_b,
        op,
        addr: mr.addr(),
        key: mr.key(),
        context: 0,
    };
    let e = within("large read", a.ep.rmamsg(msg, OpFlags::empty()))
        .await
        .unwrap();
    assert_eq!(e.len, LEN);
    assert_eq!(&e.into_bytes()[..], &data[..]);
    // The target gives a piece's charge back once its write finishes,
    // which can be just after the initiator has read the last piece.
    let held = weft_integration::settled_unexpected_bytes(&b.ep).await;
    assert_eq!(held, 0, "every piece's charge given back");
}

struct MsgPair {
    client: (Endpoint, CompletionQueue),
    server: (Endpoint, CompletionQueue),
    _keep: (weft::PassiveEndpoint, weft::EventQueue, weft::EventQueue),
}

async fn msg_pair(h: &Harness) -> MsgPair {
    let pep = h.fabric.passive_endpoint(&h.info, None).unwrap();
    let leq = h.eq();
    pep.bind_eq(&leq).unwrap();
    pep.listen().unwrap();
    let addr = pep.local_addr().unwrap();
    let open = |req: Option<&weft::ConnRequest>| {
        let ep = match req {
            Some(r) => h.domain.accept_endpoint(&h.info, r).unwrap(),
            None => h.endpoint(),
        };
        let (eq, cq) = (h.eq(), h.cq());
        ep.bind_eq(&eq).unwrap();
        ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
            .unwrap();
        ep.enable().unwrap();
        (ep, eq, cq)
    };
    let (c, ceq, ccq) = open(None);
    let c2 = c.clone();
    let connecting = tokio::spawn(async move { c2.connect(addr, Vec::new()).await });
    let ev = next_eq(&leq).await.unwrap();
    assert_eq!(ev.kind, EqEventKind::ConnReq);
    let req = weft::ConnRequest::from_event(&ev).unwrap();
    let (s, _seq, scq) = open(Some(&req));
    within("accept", s.accept(Vec::new())).await.unwrap();
    within("connect", connecting).await.unwrap().unwrap();
    MsgPair {
        client: (c, ccq),
        server: (s, scq),
        _keep: (pep, leq, ceq),
    }
}

/// MSG: write, read and writedata (reported at the target without a
/// posted receive); a refused request fails with `Access` and the same
/// connection then carries a message, a good write and atomics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_rma_and_a_refusal_keep_the_connection() {
    let h = Harness::msg(&tcp());
    let p = msg_pair(&h).await;
    let (c, _ccq) = &p.client;
    let (s, scq) = &p.server;
    let mr = region(&h, 4096, RW, 77);
    let none = FiAddr::default();
    c.write(none, Bytes::from_static(b"msg write"), 100, mr.key())
        .await
        .unwrap();
    let r = c
        .read(none, BytesMut::zeroed(9), 100, mr.key())
        .await
        .unwrap();
    assert_eq!(&r.into_bytes()[..], b"msg write");
    c.writedata(none, Bytes::from_static(b"wd"), 42, 0, mr.key())
        .await
        .unwrap();
    let t = within("target entry", next_cq(scq)).await.unwrap();
    assert!(t
        .flags
        .contains(OpFlags::REMOTE_WRITE | OpFlags::REMOTE_CQ_DATA));
    assert_eq!((t.data, t.len), (42, 2));
    let before = mr.to_vec().unwrap();
    let e = c
        .write(none, Bytes::from_static(b"bad"), 0, mr.key() + 1)
        .await
        .unwrap_err();
    assert_eq!(e.err, Error::Access);
    let e = c
        .read(none, BytesMut::zeroed(2), 4095, mr.key())
        .await
        .unwrap_err();
    assert_eq!(e.err, Error::Access);
    assert_eq!(mr.to_vec().unwrap(), before);
    // Same connection: a message, then RMA again.
    let (got, sent) = tokio::join!(
        s.recv(BytesMut::zeroed(16)),
        c.send(none, Bytes::from_static(b"still here"))
    );
    sent.unwrap();
    assert_eq!(&got.unwrap().into_bytes()[..], b"still here");
    c.write(none, Bytes::from_static(b"ok"), 0, mr.key())
        .await
        .unwrap();
    // Atomics on the same connection, a refused one included.
    mr.write_at(64, &40u64.to_ne_bytes()).unwrap();
    assert_eq!(c.fetch_add(none, 64, mr.key(), 2).await.unwrap(), 40);
    assert_eq!(c.compare_swap(none, 64, mr.key(), 42, 7).await.unwrap(), 42);
    let e = c.fetch_add(none, 64, mr.key() + 1, 1).await.unwrap_err();
    assert_eq!(e.err, Error::Access);
    let mut now = [0u8; 8];
    mr.read_at(64, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 7);
    assert_eq!(s.stats().unwrap().conns, 1, "the one connection stayed");
}

// ---- Raw peers forging RMA frames ----

fn write_frame(seq: u64, t: Target, data: &[u8], flags: u16) -> Vec<u8> {
    let mut h = Header::new(FrameKind::RmaWrite);
    h.flags = flags;
    h.seq = seq;
    h.data = 9;
    h.len = (16 + data.len()) as u64;
    let mut v = h.encode().to_vec();
    v.extend_from_slice(&t.encode());
    v.extend_from_slice(data);
    v
}

fn read_req(seq: u64, t: Target, len: u64) -> Vec<u8> {
    let mut h = Header::new(FrameKind::RmaReadReq);
    h.seq = seq;
    h.len = 24;
    let mut v = h.encode().to_vec();
    v.extend_from_slice(&ReadReq { target: t, len }.encode());
    v
}

/// The victim still serves a well-behaved peer: a message and RMA.
async fn alive(victim: &RdmEp, good: &RdmEp, mr: &MemoryRegion, n: u8) {
    let to_v = good.insert(victim);
    let (got, sent) = tokio::join!(
        victim.ep.recv(BytesMut::zeroed(8)),
        good.ep.send(to_v, Bytes::from(vec![n; 4]))
    );
    sent.unwrap();
    assert_eq!(&got.unwrap().into_bytes()[..], &[n; 4]);
    let r = good.ep.read(to_v, BytesMut::zeroed(4), 0, mr.key());
    within("good read", r).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_rma_frames_never_reach_outside_a_region() {
    let h = Harness::rdm(&tcp());
    let victim = h.rdm_ep();
    let good = h.rdm_ep();
    let va = weft::decode_sockaddr(&victim.addr()).unwrap();
    // The target region sits inside a larger one whose other bytes must
    // never change.
    let outer = region(&h, 8192, MrAccess::REMOTE_READ, 1);
    outer.write_at(0, &[0x5a; 8192]).unwrap();
    let inner = h
        .domain
        .mr_regattr(MrAttr::sub(&outer, 4096, 1024, RW).requested_key(2))
        .unwrap();
    let pristine = outer.to_vec().unwrap();
    let (mut s, _id) = raw_hello(va).await;
    // Refused writes, each answered with FI_EACCES on the same stream.
    let bad = [
        (Target { addr: 0, key: 99 }, 8usize),
        (Target { addr: 1020, key: 2 }, 8),
        (
            Target {
                addr: u64::MAX - 3,
                key: 2,
            },
            8,
        ),
        (
            Target {
                addr: 1,
                key: u64::MAX,
            },
            8,
        ),
        (Target { addr: 0, key: 1 }, 8),
    ];
    for (i, (t, n)) in bad.into_iter().enumerate() {
        let seq = i as u64 + 1;
        s.write_all(&write_frame(
            seq,
            t,
            &vec![0xff; n],
            FLAG_ACK_REQ | FLAG_CQ_DATA,
        ))
        .await
        .unwrap();
        let (ack, _) = read_frame(&mut s).await;
        assert_eq!(
            (ack.kind, ack.seq, ack.data),
            (Some(FrameKind::Ack), seq, 13)
        );
    }
    assert_eq!(outer.to_vec().unwrap(), pristine, "nothing written");
    // Refused reads: one error answer each, no bytes.
    for (i, (t, n)) in [
        (Target { addr: 1000, key: 2 }, 25u64),
        (Target { addr: 0, key: 7 }, 1),
        (Target { addr: 0, key: 2 }, u64::MAX),
        (Target { addr: 0, key: 2 }, (1 << 30) + 1),
    ]
    .into_iter()
    .enumerate()
    {
        s.write_all(&read_req(100 + i as u64, t, n)).await.unwrap();
        let (r, p) = read_frame(&mut s).await;
        assert_eq!(
            (r.kind, r.seq, r.len),
            (Some(FrameKind::RmaReadResp), 100 + i as u64, 0)
        );
        assert!(
            r.data == 13 || r.data == 90,
            "EACCES or EMSGSIZE: {}",
            r.data
        );
        assert!(p.is_empty());
    }
    // A good write on the same stream lands, with its remote CQ data.
    s.write_all(&write_frame(
        50,
        Target { addr: 1016, key: 2 },
        b"12345678",
        FLAG_ACK_REQ | FLAG_CQ_DATA,
    ))
    .await
    .unwrap();
    let (ack, _) = read_frame(&mut s).await;
    assert_eq!((ack.seq, ack.data), (50, 0));
    let t = within("target entry", next_cq(&victim.cq)).await.unwrap();
    assert_eq!((t.data, t.len), (9, 8));
    let mut want = pristine.clone();
    want[4096 + 1016..4096 + 1024].copy_from_slice(b"12345678");
    assert_eq!(outer.to_vec().unwrap(), want);
    // And a good read answers with the bytes.
    s.write_all(&read_req(51, Target { addr: 1016, key: 2 }, 8))
        .await
        .unwrap();
    let (r, p) = read_frame(&mut s).await;
    assert_eq!((r.seq, r.data, r.tag), (51, 0, 0));
    assert_eq!(&p[..], b"12345678");
    drop(s);
    alive(&victim, &good, &inner, 1).await;

    // Malformed RMA frames end only their connection.
    let attacks: Vec<Vec<u8>> = vec![
        // A write longer than max_msg_size plus its target.
        {
            let mut h = Header::new(FrameKind::RmaWrite);
            h.len = (1 << 30) + 17;
            h.encode().to_vec()
        },
        // A write too short to hold its target.
        {
            let mut h = Header::new(FrameKind::RmaWrite);
            h.len = 15;
            let mut v = h.encode().to_vec();
            v.extend_from_slice(&[0; 15]);
            v
        },
        // A read request of the wrong size.
        {
            let mut h = Header::new(FrameKind::RmaReadReq);
            h.len = 23;
            let mut v = h.encode().to_vec();
            v.extend_from_slice(&[0; 23]);
            v
        },
        // An answer to a read nobody asked for.
        {
            let mut h = Header::new(FrameKind::RmaReadResp);
            h.seq = 12345;
            h.len = 4;
            let mut v = h.encode().to_vec();
            v.extend_from_slice(b"evil");
            v
        },
        // A flag read requests do not take.
        {
            let mut v = read_req(1, Target { addr: 0, key: 2 }, 4);
            v[4] = 1;
            v
        },
    ];
    for (i, a) in attacks.into_iter().enumerate() {
        let (mut s, _id) = raw_hello(va).await;
        s.write_all(&a).await.unwrap();
        expect_closed(s).await;
        alive(&victim, &good, &inner, 10 + i as u8).await;
    }
    // A write cut off part-way: whatever arrived may have landed inside
    // the region, nothing outside it, and the endpoint goes on.
    let (mut s, _id) = raw_hello(va).await;
    let full = write_frame(1, Target { addr: 0, key: 2 }, &[0x11; 1024], FLAG_ACK_REQ);
    s.write_all(&full[..HEADER_LEN + 16 + 300]).await.unwrap();
    drop(s);
    alive(&victim, &good, &inner, 30).await;
    let now = outer.to_vec().unwrap();
    assert_eq!(&now[..4096], &pristine[..4096]);
    assert_eq!(&now[5120..], &pristine[5120..]);
    assert_eq!(outer.to_vec().unwrap(), now);
}

/// A peer that asks for reads without ever reading its socket: the
/// target stops reading it once the answers it holds fill that peer's
/// share of the budget, holds no more than that, and goes on serving
/// others.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn endless_read_requests_are_bounded_by_the_budget() {
    let h = Harness::rdm(&tcp());
    let share = 2 * READ_CHUNK;
    let victim = {
        let (av, cq) = (h.av(), h.cq());
        let ep = h.domain.endpoint(&h.info).unwrap();
        ep.set_conn_limits(ConnLimits::default().with_peer_buffered(share))
            .unwrap();
        ep.bind_av(&av).unwrap();
        ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
            .unwrap();
        ep.enable().unwrap();
        RdmEp { ep, av, cq }
    };
    let good = h.rdm_ep();
    let mr = region(&h, 8 << 20, RW, 3);
    let va = weft::decode_sockaddr(&victim.addr()).unwrap();
    let (mut s, _id) = raw_hello(va).await;
    // 64 requests of 8 MiB each: 512 MiB if the target answered them all
    // into memory.
    let mut reqs = Vec::new();
    for i in 0..64 {
        reqs.extend_from_slice(&read_req(i + 1, Target { addr: 0, key: 3 }, 8 << 20));
    }
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), s.write_all(&reqs)).await;
    // Until the target has parked that peer's reader (a fixed pause was
    // too short under the rxe VM's emulation), never holding more than
    // the share on the way.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let st = loop {
        let st = victim.ep.stats().unwrap();
        assert!(
            st.unexpected_bytes <= share,
            "held {} bytes for one peer, share {share}",
            st.unexpected_bytes
        );
        if st.parked == 1 || std::time::Instant::now() > deadline {
            break st;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(st.parked, 1, "the reader stopped for that peer");
    alive(&victim, &good, &mr, 1).await;
    drop(s);
}
