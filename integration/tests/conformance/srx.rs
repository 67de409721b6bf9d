//! Shared receive contexts (`fi_srx_context`, fi_endpoint(3)): endpoints
//! bound at creation (`rx_ctx_cnt = FI_SHARED_CONTEXT`) take their
//! receives from the context; a message arriving at any of them fills the
//! oldest receive of the context that accepts it (tagged or not, directed
//! by source, peek/claim/discard, cancel) and completes on that endpoint's
//! receive CQ. Providers whose offers have no shared contexts
//! (`max_ep_srx_ctx` 0) must refuse them; that is what their instances
//! check. Shared transmit contexts are in `stx.rs`.

use std::collections::HashMap;
use std::pin::pin;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::poll;
use weft::{
    BindFlags, Caps, CompletionQueue, CqItem, EpType, EqEventKind, Error, FiAddr, Info, OpFlags,
    RecvMsg, RxAttr, SharedRxContext, WaitMode, FI_ADDR_UNSPEC, SHARED_CONTEXT,
};
use weft_integration::srx::{accept_onto_srx, srx_rdm_ep};
use weft_integration::{
    assert_cq_quiet, next_cq, next_eq, payload, within, Harness, Provider, RdmEp,
};

/// The offer of `ep_type` whose endpoints take a shared context, if any.
fn shared_offer(p: &Provider, ep_type: EpType) -> Option<Info> {
    p.try_info_with(ep_type, |h| h.ep_attr.rx_ctx_cnt = SHARED_CONTEXT)
}

/// RDM endpoints on one shared context (one AV, a CQ each) and a client
/// per server endpoint.
pub(super) struct Rig {
    pub(super) srx: SharedRxContext,
    pub(super) servers: Vec<RdmEp>,
    pub(super) clients: Vec<RdmEp>,
    /// `to[i]`: server `i` in client `i`'s AV.
    pub(super) to: Vec<FiAddr>,
    /// `from[i]`: client `i` in the servers' AV.
    pub(super) from: Vec<FiAddr>,
}

fn rig(h: &Harness, srx: SharedRxContext, n: usize) -> Rig {
    let av = h.av();
    let servers: Vec<RdmEp> = (0..n)
        .map(|_| srx_rdm_ep(h, &av, &h.cq(), &srx, None))
        .collect();
    let clients: Vec<RdmEp> = (0..n).map(|_| h.rdm_ep()).collect();
    let to = (0..n).map(|i| clients[i].insert(&servers[i])).collect();
    let from = (0..n).map(|i| servers[0].insert(&clients[i])).collect();
    Rig {
        srx,
        servers,
        clients,
        to,
        from,
    }
}

/// The harness and rig of `n` connectionless endpoints (RDM; udp's
/// DGRAM), or `None` after checking that a provider without shared
/// contexts refuses them.
pub(super) fn rdm_rig(p: &Provider, n: usize) -> Option<(Harness, Rig)> {
    let Some(info) = shared_offer(p, p.connless_type()) else {
        let h = Harness::connless(p);
        assert_eq!(h.info.domain_attr.max_ep_srx_ctx, 0);
        assert_eq!(h.domain.srx_context(0).unwrap_err(), Error::NoSys);
        return None;
    };
    assert_eq!(info.ep_attr.rx_ctx_cnt, SHARED_CONTEXT);
    assert!(info.domain_attr.max_ep_srx_ctx >= 1);
    let h = Harness::with_info(p, info);
    let srx = h.domain.srx_context(0).unwrap();
    let r = rig(&h, srx, n);
    Some((h, r))
}

/// A tagged receive from anyone.
fn tmsg(tag: u64, context: u64, bufs: Vec<BytesMut>) -> RecvMsg {
    RecvMsg {
        src: FI_ADDR_UNSPEC,
        bufs,
        tagged: true,
        tag,
        ignore: 0,
        context,
    }
}

/// Waits until the context holds at least `n` messages unexpected (each
/// is charged at least 512 bytes).
async fn buffered(srx: &SharedRxContext, n: usize) {
    within("messages buffered", async {
        while srx.stats().unexpected_bytes < n * 512 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
}

pub(super) async fn ok(cq: &CompletionQueue, what: &str) -> weft::CqEntry {
    match within(what, next_cq(cq)).await {
        CqItem::Ok(e) => e,
        CqItem::Err(e) => panic!("{what}: error completion {e:?}"),
    }
}

/// Messages from every client, to every bound endpoint, take the
/// context's receives in order; each completes on the CQ of the endpoint
/// it arrived at, and every receive is used once.
async fn messages_from_every_endpoint_take_the_shared_receives(p: Provider) {
    let Some((h, r)) = rdm_rig(&p, 3) else {
        return;
    };
    const PER: usize = 5;
    let n = r.servers.len();
    for i in 0..n * PER {
        r.srx
            .post_recv(BytesMut::zeroed(4096), 1000 + i as u64)
            .unwrap();
    }
    assert_eq!(r.srx.rx_size_left().unwrap(), h.info.rx_attr.size - n * PER);
    let mut sent = HashMap::new();
    for j in 0..PER {
        for (k, c) in r.clients.iter().enumerate() {
            let data = payload(10 + 300 * j, (k * PER + j) as u8);
            within("send", c.ep.send(r.to[k], data.clone()))
                .await
                .unwrap();
            sent.entry(k).or_insert_with(Vec::new).push(data);
        }
    }
    let mut contexts = Vec::new();
    for (k, s) in r.servers.iter().enumerate() {
        for want in &sent[&k] {
            let e = ok(&s.cq, "shared receive").await;
            assert!(e.flags.contains(OpFlags::RECV | OpFlags::MSG));
            contexts.push(e.context);
            assert_eq!(&e.into_bytes()[..], &want[..], "client {k}");
        }
        assert_cq_quiet(&s.cq, "nothing more at this endpoint").await;
    }
    contexts.sort_unstable();
    let want: Vec<u64> = (0..n * PER).map(|i| 1000 + i as u64).collect();
    assert_eq!(contexts, want, "every receive used once");
    assert_eq!(r.srx.rx_size_left().unwrap(), h.info.rx_attr.size);
}

/// Tagged receives on the context: tag rules, directed receives (by the
/// handle of the AV the bound endpoints share), peek, claim, discard, and
/// untagged traffic kept apart.
async fn tagged_directed_peek_claim_discard(p: Provider) {
    let Some((_h, r)) = rdm_rig(&p, 2) else {
        return;
    };
    let (a, b) = (&r.clients[0], &r.clients[1]);
    // Buffered first: unexpected at the context.
    a.ep.tsend(r.to[0], Bytes::from_static(b"a7"), 7)
        .await
        .unwrap();
    b.ep.tsend(r.to[1], Bytes::from_static(b"b7"), 7)
        .await
        .unwrap();
    b.ep.send(r.to[1], Bytes::from_static(b"b-untagged"))
        .await
        .unwrap();
    a.ep.tsend(r.to[0], Bytes::from_static(b"a9"), 9)
        .await
        .unwrap();
    buffered(&r.srx, 4).await;
    // A receive directed at b takes b's tag-7 message, though a's came
    // first.
    let directed = Caps::DIRECTED_RECV;
    let e = within(
        "directed",
        r.srx.trecv(BytesMut::zeroed(16), r.from[1], 7, 0),
    )
    .await
    .unwrap();
    if r.srx.attr().caps.contains(directed) {
        assert_eq!(&e.bufs[0][..], b"b7");
        assert_eq!(e.src, r.from[1]);
    }
    // Peek sees a tag-9 message without taking it; claim takes it.
    let peek = |tag| tmsg(tag, 55, Vec::new());
    let e = within("peek", r.srx.recvmsg(peek(9), OpFlags::PEEK))
        .await
        .unwrap();
    assert_eq!((e.len, e.tag), (2, 9));
    // Claims name their message by context: the posted forms. A's
    // messages report on server 0's CQ.
    r.srx
        .post_recvmsg(tmsg(9, 31, Vec::new()), OpFlags::PEEK | OpFlags::CLAIM)
        .unwrap();
    let e = ok(&r.servers[0].cq, "peek|claim").await;
    assert_eq!((e.context, e.tag, e.len), (31, 9, 2));
    // Claimed: another peek no longer sees it.
    let e = within("peek again", r.srx.recvmsg(peek(9), OpFlags::PEEK))
        .await
        .unwrap_err();
    assert_eq!(e.err, Error::NoMsg);
    r.srx
        .post_recvmsg(tmsg(9, 31, vec![BytesMut::zeroed(8)]), OpFlags::CLAIM)
        .unwrap();
    let e = ok(&r.servers[0].cq, "claim").await;
    assert_eq!((e.context, &e.bufs[0][..]), (31, &b"a9"[..]));
    let e = within(
        "peek|discard",
        r.srx.recvmsg(peek(7), OpFlags::PEEK | OpFlags::DISCARD),
    )
    .await
    .unwrap();
    assert_eq!(e.tag, 7);
    let e = within("nothing tagged left", r.srx.recvmsg(peek(7), OpFlags::PEEK))
        .await
        .unwrap_err();
    assert_eq!(e.err, Error::NoMsg);
    // The untagged message waited for an untagged receive, on server 1's
    // CQ when posted.
    r.srx.post_recv(BytesMut::zeroed(32), 66).unwrap();
    let e = ok(&r.servers[1].cq, "untagged").await;
    assert_eq!((e.context, &e.bufs[0][..]), (66, &b"b-untagged"[..]));
    // A posted peek that finds nothing reports NoMsg on a bound
    // endpoint's CQ.
    r.srx
        .post_recvmsg(tmsg(7, 77, Vec::new()), OpFlags::PEEK)
        .unwrap();
    let CqItem::Err(e) = within("posted peek", next_cq(&r.servers[0].cq)).await else {
        panic!("a peek of nothing succeeded");
    };
    assert_eq!((e.context, e.err), (77, Error::NoMsg));
    // Bad receives on the context.
    let (e, _) = r
        .srx
        .post_recvmsg(RecvMsg::untagged(BytesMut::zeroed(4), 1), OpFlags::PEEK)
        .unwrap_err();
    assert_eq!(e, Error::BadFlags);
    // A multi-receive smaller than the context's minimum (16 KiB).
    let (e, _) = r
        .srx
        .post_recvmsg(
            RecvMsg::untagged(BytesMut::zeroed(4), 1),
            OpFlags::MULTI_RECV,
        )
        .unwrap_err();
    assert_eq!(e, Error::MsgSize);
}

/// Cancel, close, and futures dropped at random: no message is lost or
/// delivered twice, and order per sender holds.
async fn cancel_and_dropped_futures_lose_nothing(p: Provider) {
    let Some((h, r)) = rdm_rig(&p, 2) else {
        return;
    };
    // A posted receive withdrawn reports Canceled, with its buffer, on a
    // bound endpoint's CQ.
    r.srx.post_recv(BytesMut::zeroed(64), 5).unwrap();
    r.srx.cancel(5).unwrap();
    assert_eq!(r.srx.cancel(5).unwrap_err(), Error::NoEnt);
    let CqItem::Err(e) = within("canceled", next_cq(&r.servers[0].cq)).await else {
        panic!("cancel completed a receive");
    };
    assert_eq!(
        (e.context, e.err, e.bufs[0].len()),
        (5, Error::Canceled, 64)
    );
    assert_eq!(r.srx.rx_size_left().unwrap(), h.info.rx_attr.size);
    // Receives awaited under short timeouts while two senders stream.
    const N: u32 = 600;
    let senders: Vec<_> = (0..2)
        .map(|k| {
            let c = r.clients[k].ep.clone();
            let to = r.to[k];
            tokio::spawn(async move {
                for i in 0..N {
                    let mut b = Vec::from(i.to_le_bytes());
                    b.push(k as u8);
                    c.send(to, Bytes::from(b)).await.unwrap();
                }
            })
        })
        .collect();
    let mut next = [0u32; 2];
    let mut got = 0;
    let mut round = 0u64;
    while got < 2 * N {
        round += 1;
        let wait = Duration::from_micros(round * 7919 % 300);
        let recv = r.srx.recv(BytesMut::zeroed(8));
        let Ok(res) = tokio::time::timeout(wait, recv).await else {
            continue;
        };
        let e = res.unwrap();
        let b = e.into_bytes();
        let i = u32::from_le_bytes(b[..4].try_into().unwrap());
        let k = b[4] as usize;
        assert_eq!(i, next[k], "sender {k}: each message once, in order");
        next[k] += 1;
        got += 1;
    }
    for s in senders {
        within("senders", s).await.unwrap();
    }
    assert_eq!(next, [N, N]);
    let left = r.srx.recv(BytesMut::zeroed(8));
    assert!(tokio::time::timeout(Duration::from_millis(50), left)
        .await
        .is_err());
    assert_eq!(r.srx.stats().unexpected_bytes, 0);
}

/// getinfo, binding rules and close.
async fn binding_rules_and_close(p: Provider) {
    let Some((h, r)) = rdm_rig(&p, 1) else {
        return;
    };
    let srx = &r.srx;
    // Another domain's context, a second context, after enable.
    let ep = h.endpoint();
    assert_eq!(
        ep.bind_srx(&h.other_domain().srx_context(0).unwrap())
            .unwrap_err(),
        Error::Domain
    );
    ep.bind_srx(srx).unwrap();
    assert_eq!(ep.bind_srx(srx).unwrap_err(), Error::Inval);
    // Inline progress cannot serve a shared context.
    ep.set_wait_mode(WaitMode::Inline).unwrap();
    ep.bind_av(&h.av()).unwrap();
    ep.bind_cq(&h.cq(), BindFlags::TRANSMIT | BindFlags::RECV)
        .unwrap();
    assert_eq!(ep.enable().unwrap_err(), Error::Inval);
    assert_eq!(
        r.servers[0].ep.bind_srx(srx).unwrap_err(),
        Error::OpBadState
    );
    // Posted pool receives are the endpoint's own, as the awaited ones
    // are: refused on an endpoint bound to a shared context.
    let pool = h.domain.buffer_pool(1, 64).unwrap();
    let (e, back) = r.servers[0]
        .ep
        .post_recv_pooled(pool.try_get().unwrap(), 9)
        .unwrap_err();
    assert_eq!(e, Error::OpNotSupp);
    assert!(back.is_some(), "the buffer comes back");
    // Attributes: the domain's where 0; caps beyond the domain's refused.
    let small = h
        .domain
        .srx_context_attr(&RxAttr {
            size: 4,
            total_buffered_recv: 1 << 16,
            ..RxAttr::default()
        })
        .unwrap();
    assert_eq!(small.attr().size, 4);
    assert_eq!(small.attr().total_buffered_recv, 1 << 16);
    assert_eq!(small.attr().iov_limit, h.info.rx_attr.iov_limit);
    assert_eq!(
        h.domain
            .srx_context_attr(&RxAttr {
                caps: Caps::RMA,
                ..RxAttr::default()
            })
            .unwrap_err(),
        Error::Inval
    );
    for i in 0..4 {
        small.post_recv(BytesMut::zeroed(4), i).unwrap();
    }
    assert_eq!(
        small.post_recv(BytesMut::zeroed(4), 9).unwrap_err(),
        Error::Again
    );
    // Busy while bound; pending receives end with Canceled at close,
    // their buffers handed back.
    assert_eq!(srx.close().unwrap_err(), Error::Busy);
    let mut pending = pin!(srx.recv(BytesMut::zeroed(1 << 20)));
    assert!(poll!(pending.as_mut()).is_pending());
    ep.close().unwrap();
    r.servers[0].ep.close().unwrap();
    srx.close().unwrap();
    let e = within("canceled", pending).await.unwrap_err();
    assert_eq!(e.err, Error::Canceled);
    assert_eq!(e.bufs.iter().map(|b| b.len()).sum::<usize>(), 1 << 20);
    assert_eq!(
        srx.post_recv(BytesMut::zeroed(4), 6).unwrap_err(),
        Error::OpBadState
    );
    assert_eq!(h.endpoint().bind_srx(srx).unwrap_err(), Error::OpBadState);
}

/// The unexpected budget is the context's, whatever the number of bound
/// endpoints: peers flooding several endpoints hold at most
/// `total_buffered_recv` between them, and lose nothing.
async fn the_budget_is_the_contexts(p: Provider) {
    let Some(info) = shared_offer(&p, EpType::Rdm) else {
        return;
    };
    let h = Harness::with_info(&p, info);
    const LIMIT: usize = 64 << 10;
    let srx = h
        .domain
        .srx_context_attr(&RxAttr {
            total_buffered_recv: LIMIT,
            ..RxAttr::default()
        })
        .unwrap();
    let r = rig(&h, srx, 4);
    const PER: usize = 16;
    const LEN: usize = 8 << 10;
    // 4 x 16 x 8 KiB = 512 KiB sent at a 64 KiB budget.
    let senders: Vec<_> = (0..4)
        .map(|k| {
            let c = r.clients[k].ep.clone();
            let to = r.to[k];
            tokio::spawn(async move {
                for j in 0..PER {
                    c.send(to, payload(LEN, (k * PER + j) as u8)).await.unwrap();
                }
            })
        })
        .collect();
    // Let the flood fill what it may: it takes its time on a loaded
    // machine (the emulated VM), so the test waits for the budget to be
    // reached, never past it.
    within("the flood reaches the budget", async {
        loop {
            let st = r.srx.stats();
            let held = st.unexpected_bytes;
            assert!(held <= LIMIT, "held {held} of {LIMIT}");
            if held > 0 && st.parked > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let mut next = [0usize; 4];
    for _ in 0..4 * PER {
        let e = within("drain", r.srx.recv(BytesMut::zeroed(LEN)))
            .await
            .unwrap();
        assert!(r.srx.stats().unexpected_bytes <= LIMIT);
        let b = e.into_bytes();
        // Only senders with messages left: a finished sender's next seed
        // would be the following sender's first.
        let seed = (0..4)
            .filter(|&k| next[k] < PER)
            .map(|k| (k, k * PER + next[k]))
            .find(|&(_, s)| b[..] == payload(LEN, s as u8)[..])
            .map(|(k, _)| k)
            .expect("the next message of some sender, in order");
        next[seed] += 1;
    }
    assert_eq!(next, [PER; 4]);
    for s in senders {
        within("senders", s).await.unwrap();
    }
}

/// udp: the budget is the context's too, and what does not fit it is
/// dropped and counted by the endpoint it reached (a datagram provider
/// has no sender to hold back); what was held arrives once, in each
/// sender's order.
async fn udp_budget_is_the_contexts(p: Provider) {
    let info = shared_offer(&p, p.connless_type()).expect("udp shares receive contexts");
    let h = Harness::with_info(&p, info);
    const LIMIT: usize = 64 << 10;
    let srx = h
        .domain
        .srx_context_attr(&RxAttr {
            total_buffered_recv: LIMIT,
            ..RxAttr::default()
        })
        .unwrap();
    let r = rig(&h, srx, 4);
    const PER: usize = 16;
    const LEN: usize = 8 << 10;
    // 4 x 16 x 8 KiB = 512 KiB at a 64 KiB budget.
    for j in 0..PER {
        for k in 0..4 {
            r.clients[k]
                .ep
                .send(r.to[k], payload(LEN, (k * PER + j) as u8))
                .await
                .unwrap();
        }
    }
    let dropped = || -> u64 {
        r.servers
            .iter()
            .map(|s| s.ep.stats().unwrap().rx_dropped)
            .sum()
    };
    let charge = LEN + weft::UNEXPECTED_OVERHEAD;
    // Read once held and dropped stop changing (a full socket buffer
    // could lose a datagram uncounted, so no total is waited for).
    within("the flood is read", async {
        let mut last = (usize::MAX, u64::MAX);
        loop {
            let now = (r.srx.stats().unexpected_bytes, dropped());
            if now == last {
                break;
            }
            last = now;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let held = r.srx.stats().unexpected_bytes;
    assert!(held > 0 && held <= LIMIT, "held {held} of {LIMIT}");
    assert!(dropped() > 0, "past the budget, datagrams are dropped");
    for s in &r.servers {
        assert_eq!(
            s.ep.stats().unwrap().unexpected_bytes,
            0,
            "the context holds them"
        );
    }
    let mut next = [0usize; 4];
    for _ in 0..held / charge {
        let e = within("drain", r.srx.recv(BytesMut::zeroed(LEN)))
            .await
            .unwrap();
        let b = e.into_bytes();
        let (k, j) = (0..4)
            .flat_map(|k| (next[k]..PER).map(move |j| (k, j)))
            .find(|&(k, j)| b[..] == payload(LEN, (k * PER + j) as u8)[..])
            .expect("a later message of some sender");
        next[k] = j + 1;
    }
    assert_eq!(r.srx.stats().unexpected_bytes, 0);
    let left = tokio::time::timeout(Duration::from_millis(50), r.srx.recv(BytesMut::zeroed(8)));
    assert!(left.await.is_err(), "nothing more");
}

/// MSG: accepted endpoints on one context; a connection that ends leaves
/// the context's receives to the others; truncation reports on the
/// receiving endpoint's CQ.
async fn msg_endpoints_share_a_context(p: Provider) {
    let Some(info) = shared_offer(&p, EpType::Msg) else {
        return;
    };
    let h = Harness::with_info(&p, info);
    let srx = h.domain.srx_context(64).unwrap();
    let (conns, _pep) = accept_onto_srx(&h, &srx, 3, None).await;
    for i in 0..6u64 {
        srx.post_recv(BytesMut::zeroed(256), 100 + i).unwrap();
    }
    for (k, c) in conns.iter().enumerate() {
        for j in 0..2u8 {
            c.client
                .send(0, payload(50 + j as usize, (10 * k) as u8 + j))
                .await
                .unwrap();
        }
    }
    let mut contexts = Vec::new();
    for (k, c) in conns.iter().enumerate() {
        for j in 0..2u8 {
            let e = ok(&c.cq, "msg srx").await;
            contexts.push(e.context);
            assert_eq!(
                e.into_bytes(),
                payload(50 + j as usize, (10 * k) as u8 + j),
                "connection {k}"
            );
        }
    }
    contexts.sort_unstable();
    assert_eq!(contexts, (100..106).collect::<Vec<_>>());
    // A receive posted through a bound endpoint is the context's.
    conns[0].ep.post_recv(BytesMut::zeroed(32), 7).unwrap();
    conns[2]
        .client
        .send(0, Bytes::from_static(b"via 0"))
        .await
        .unwrap();
    let e = ok(&conns[2].cq, "posted through endpoint 0").await;
    assert_eq!((e.context, &e.bufs[0][..]), (7, &b"via 0"[..]));
    // One connection ends; the context's receives stay for the others.
    srx.post_recv(BytesMut::zeroed(32), 8).unwrap();
    conns[0].client.shutdown().unwrap();
    let ev = within("shutdown", next_eq(&conns[0].eq)).await.unwrap();
    assert_eq!(ev.kind, EqEventKind::Shutdown);
    conns[1]
        .client
        .send(0, Bytes::from_static(b"still"))
        .await
        .unwrap();
    let e = ok(&conns[1].cq, "after a shutdown").await;
    assert_eq!((e.context, &e.bufs[0][..]), (8, &b"still"[..]));
    // Truncated: the error is on the receiving endpoint's CQ.
    // (verbs: a length error ends the connection, so the sender may see
    // a remote error.)
    srx.post_recv(BytesMut::zeroed(4), 9).unwrap();
    let sent = conns[2]
        .client
        .send(0, Bytes::from_static(b"too long"))
        .await;
    assert!(
        matches!(
            sent.as_ref().map_err(|e| e.err),
            Ok(_) | Err(Error::RemoteIo)
        ),
        "{sent:?}"
    );
    let CqItem::Err(e) = within("trunc", next_cq(&conns[2].cq)).await else {
        panic!("a 4-byte receive took 8 bytes");
    };
    assert_eq!((e.context, e.err), (9, Error::Trunc));
}

provider_tests! {
    messages_from_every_endpoint_take_the_shared_receives,
    tagged_directed_peek_claim_discard,
    cancel_and_dropped_futures_lose_nothing,
    binding_rules_and_close,
    the_budget_is_the_contexts,
    msg_endpoints_share_a_context,
}

shm_tests! {
    messages_from_every_endpoint_take_the_shared_receives,
    tagged_directed_peek_claim_discard,
    cancel_and_dropped_futures_lose_nothing,
    binding_rules_and_close,
    the_budget_is_the_contexts,
}

// udp loses what does not fit its budget or its socket buffer, so the
// tests that stream without bound or flood past the budget are not its:
// `srx_soak` runs the cancel-safety soak with loss accounted for.
udp_tests! {
    messages_from_every_endpoint_take_the_shared_receives,
    tagged_directed_peek_claim_discard,
    binding_rules_and_close,
    udp_budget_is_the_contexts,
}
