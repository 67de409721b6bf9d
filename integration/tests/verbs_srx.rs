//! Shared receive contexts on verbs MSG endpoints (an `ibv_srq` under
//! `fi_srx_context`; RDM's, a software matcher, are the conformance
//! suite's and `srx_peers.rs`'s), on soft-RoCE in the VM of `integration/run-rxe`: a
//! server on rxe1 accepts several clients from rxe2 onto endpoints bound
//! to one context; receives posted on the context are taken by whichever
//! connection a message arrives on, and complete on that endpoint's CQ.
//!
//! Outside the VM every test prints why it is skipped; inside it a missing
//! device is a failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::pin::pin;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::poll;
use weft::{
    BindFlags, CompletionQueue, ConnRequest, CqAttr, CqItem, Domain, Endpoint, EpType, EqEventKind,
    Error, EventQueue, Fabric, Info, OpFlags, SharedRxContext, WaitMode, SHARED_CONTEXT,
};
use weft_integration::{next_cq, next_eq, payload, verbs_offer, within, within_for};

/// One side's objects.
struct Side {
    fabric: Fabric,
    domain: Domain,
    info: Info,
}

fn side(dev: &str) -> Option<Side> {
    let info = verbs_offer(dev, EpType::Msg)?;
    let fabric = Fabric::open(&info).unwrap();
    let domain = fabric.domain(&info).unwrap();
    Some(Side {
        fabric,
        domain,
        info,
    })
}

/// An accepted endpoint with its own CQ and EQ, and its client.
struct Conn {
    sep: Endpoint,
    scq: CompletionQueue,
    seq: EventQueue,
    cep: Endpoint,
    _ceq: EventQueue,
}

fn cq(d: &Domain) -> CompletionQueue {
    d.cq(CqAttr {
        wait: WaitMode::Interrupt,
        ..CqAttr::default()
    })
    .unwrap()
}

/// `n` clients connected to a server whose accepted endpoints take their
/// receives from `srx`.
async fn serve(
    s: &Side,
    c: &Side,
    srx: &SharedRxContext,
    n: usize,
) -> (Vec<Conn>, weft::PassiveEndpoint) {
    let pep = s.fabric.passive_endpoint(&s.info, None).unwrap();
    let peq = s.fabric.eq(16).unwrap();
    pep.bind_eq(&peq).unwrap();
    pep.listen().unwrap();
    let addr = pep.local_addr().unwrap();
    let mut conns = Vec::new();
    for _ in 0..n {
        let cep = c.domain.endpoint(&c.info).unwrap();
        let ceq = c.fabric.eq(16).unwrap();
        let ccq = cq(&c.domain);
        cep.bind_eq(&ceq).unwrap();
        cep.bind_cq(&ccq, BindFlags::TRANSMIT | BindFlags::RECV)
            .unwrap();
        cep.enable().unwrap();
        let c2 = cep.clone();
        let a = addr.clone();
        let connecting = tokio::spawn(async move { c2.connect(a, Vec::new()).await });
        let ev = within("connreq", next_eq(&peq)).await.unwrap();
        assert_eq!(ev.kind, EqEventKind::ConnReq);
        let req = ConnRequest::from_event(&ev).unwrap();
        let sep = s.domain.accept_endpoint(&s.info, &req).unwrap();
        let seq = s.fabric.eq(16).unwrap();
        let scq = cq(&s.domain);
        sep.bind_eq(&seq).unwrap();
        sep.bind_cq(&scq, BindFlags::TRANSMIT | BindFlags::RECV)
            .unwrap();
        sep.bind_srx(srx).unwrap();
        sep.enable().unwrap();
        within("accept", sep.accept(Vec::new())).await.unwrap();
        within("connect", connecting).await.unwrap().unwrap();
        for q in [&ceq, &seq] {
            assert_eq!(
                within("connected", next_eq(q)).await.unwrap().kind,
                EqEventKind::Connected
            );
        }
        conns.push(Conn {
            sep,
            scq,
            seq,
            cep,
            _ceq: ceq,
        });
    }
    (conns, pep)
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_from_every_connection_take_the_shared_receives() {
    let (Some(s), Some(c)) = (side("rxe1"), side("rxe2")) else {
        return;
    };
    assert!(s.info.domain_attr.max_ep_srx_ctx > 0);
    let srx = s.domain.srx_context(0).unwrap();
    let (conns, _pep) = serve(&s, &c, &srx, 3).await;
    // Receives for every message of every client, posted once, on the
    // context; small ones land in bounce slots, 64 KiB ones in place.
    const PER: usize = 6;
    for i in 0..conns.len() * PER {
        srx.post_recv(BytesMut::zeroed(64 << 10), 1000 + i as u64)
            .unwrap();
    }
    let left = srx.rx_size_left().unwrap();
    assert_eq!(left, s.info.rx_attr.size - conns.len() * PER);
    let mut sent = HashMap::new();
    for (k, conn) in conns.iter().enumerate() {
        for j in 0..PER {
            let len = if j % 2 == 0 { 100 + j } else { 64 << 10 };
            let data = payload(len, (k * PER + j) as u8);
            within("send", conn.cep.send(0, data.clone()))
                .await
                .unwrap();
            sent.entry(k).or_insert_with(Vec::new).push(data);
        }
    }
    // Each endpoint's CQ reports exactly its own client's messages, in
    // order, each in one of the context's receives.
    let mut contexts = Vec::new();
    for (k, conn) in conns.iter().enumerate() {
        for want in &sent[&k] {
            let CqItem::Ok(e) = within("srx completion", next_cq(&conn.scq)).await else {
                panic!("error completion");
            };
            assert!(e.flags.contains(OpFlags::RECV | OpFlags::MSG));
            assert_eq!(e.len, want.len());
            contexts.push(e.context);
            assert_eq!(&e.into_bytes()[..], &want[..], "client {k}");
        }
    }
    contexts.sort_unstable();
    let want: Vec<u64> = (0..conns.len() * PER).map(|i| 1000 + i as u64).collect();
    assert_eq!(contexts, want, "every receive used once");
    assert_eq!(srx.rx_size_left().unwrap(), s.info.rx_attr.size);
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awaited_receives_and_endpoint_posts_use_the_context() {
    let (Some(s), Some(c)) = (side("rxe1"), side("rxe2")) else {
        return;
    };
    let srx = s.domain.srx_context(64).unwrap();
    let (conns, _pep) = serve(&s, &c, &srx, 2).await;
    // An awaited receive on the context takes a message from either.
    let r = tokio::spawn({
        let srx = srx.clone();
        async move { srx.recv(BytesMut::zeroed(32)).await }
    });
    conns[1]
        .cep
        .send(0, Bytes::from_static(b"to the context"))
        .await
        .unwrap();
    let e = within("srx recv", r).await.unwrap().unwrap();
    assert_eq!(&e.into_bytes()[..], b"to the context");
    // A receive posted on a bound endpoint goes to the context too: the
    // other connection's message takes it, on that endpoint's CQ.
    conns[0].sep.post_recv(BytesMut::zeroed(32), 77).unwrap();
    conns[1]
        .cep
        .send(0, Bytes::from_static(b"via ep 0's post"))
        .await
        .unwrap();
    let CqItem::Ok(e) = within("cq of ep 1", next_cq(&conns[1].scq)).await else {
        panic!("error completion");
    };
    assert_eq!(e.context, 77);
    assert_eq!(&e.into_bytes()[..], b"via ep 0's post");
    // A connection that ends leaves the context's receives to the others.
    srx.post_recv(BytesMut::zeroed(32), 88).unwrap();
    conns[0].cep.shutdown().unwrap();
    let ev = within("the server sees the end", next_eq(&conns[0].seq))
        .await
        .unwrap();
    assert_eq!(ev.kind, EqEventKind::Shutdown);
    conns[1]
        .cep
        .send(0, Bytes::from_static(b"still there"))
        .await
        .unwrap();
    let CqItem::Ok(e) = within("after a shutdown", next_cq(&conns[1].scq)).await else {
        panic!("error completion");
    };
    assert_eq!((e.context, &e.bufs[0][..]), (88, &b"still there"[..]));
    // Truncation is reported on the receiving endpoint's CQ, last: it
    // ends that connection.
    srx.post_recv(BytesMut::zeroed(4), 99).unwrap();
    // The receiving QP fails the message (a length error is fatal to an
    // RC connection), so the sender may see a remote error.
    let sent = conns[1].cep.send(0, Bytes::from_static(b"too long")).await;
    assert!(
        matches!(
            sent.as_ref().map_err(|e| e.err),
            Ok(_) | Err(Error::RemoteIo)
        ),
        "{sent:?}"
    );
    let CqItem::Err(e) = within("trunc", next_cq(&conns[1].scq)).await else {
        panic!("a 4-byte receive took 8 bytes");
    };
    assert_eq!((e.context, e.err), (99, Error::Trunc));
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_rules_and_close() {
    let (Some(s), Some(c)) = (side("rxe1"), side("rxe2")) else {
        return;
    };
    let srx = s.domain.srx_context(16).unwrap();
    // getinfo: MSG and RDM offers take a shared context, DGRAM does not.
    let shared = |ep_type| {
        let mut h = Info::default();
        h.fabric_attr.prov_name = Some("verbs".into());
        h.domain_attr.name = Some("rxe1".into());
        h.ep_attr.ep_type = ep_type;
        h.ep_attr.rx_ctx_cnt = SHARED_CONTEXT;
        weft::getinfo(Some(&h)).map(|v| v[0].ep_attr.rx_ctx_cnt)
    };
    assert_eq!(shared(EpType::Msg), Ok(SHARED_CONTEXT));
    assert_eq!(shared(EpType::Rdm), Ok(SHARED_CONTEXT));
    assert_eq!(shared(EpType::Dgram), Err(Error::NoData));
    // An RDM domain opens RDM contexts; an MSG domain's is another
    // domain's to its endpoints.
    let rdm = verbs_offer("rxe1", EpType::Rdm).unwrap();
    let rdm_fabric = Fabric::open(&rdm).unwrap();
    let rdm_domain = rdm_fabric.domain(&rdm).unwrap();
    rdm_domain.srx_context(0).unwrap().close().unwrap();
    assert_eq!(
        rdm_domain
            .endpoint(&rdm)
            .unwrap()
            .bind_srx(&srx)
            .unwrap_err(),
        Error::Domain
    );
    // Another domain's context, a second context, after enable.
    let ep = s.domain.endpoint(&s.info).unwrap();
    assert_eq!(
        ep.bind_srx(&c.domain.srx_context(0).unwrap()).unwrap_err(),
        Error::Domain
    );
    ep.bind_srx(&srx).unwrap();
    assert_eq!(ep.bind_srx(&srx).unwrap_err(), Error::Inval);
    // Inline progress cannot serve a shared context.
    ep.set_wait_mode(WaitMode::Inline).unwrap();
    let eq = s.fabric.eq(4).unwrap();
    let q = cq(&s.domain);
    ep.bind_eq(&eq).unwrap();
    ep.bind_cq(&q, BindFlags::TRANSMIT | BindFlags::RECV)
        .unwrap();
    assert_eq!(ep.enable().unwrap_err(), Error::Inval);
    // Busy while bound; pending receives end with Canceled at close,
    // their buffers handed back.
    assert_eq!(srx.close().unwrap_err(), Error::Busy);
    // Posted by its first poll.
    let mut pending = pin!(srx.recv(BytesMut::zeroed(1 << 20)));
    assert!(poll!(pending.as_mut()).is_pending());
    srx.post_recv(BytesMut::zeroed(16), 5).unwrap();
    ep.close().unwrap();
    srx.close().unwrap();
    let e = within("canceled", pending).await.unwrap_err();
    assert_eq!(e.err, Error::Canceled);
    assert_eq!(e.bufs.iter().map(|b| b.len()).sum::<usize>(), 1 << 20);
    assert_eq!(
        srx.post_recv(BytesMut::zeroed(4), 6).unwrap_err(),
        Error::OpBadState
    );
    assert_eq!(
        s.domain
            .endpoint(&s.info)
            .unwrap()
            .bind_srx(&srx)
            .unwrap_err(),
        Error::OpBadState
    );
    // Bad receives on the context.
    let srx = s.domain.srx_context(1).unwrap();
    srx.post_recv(BytesMut::zeroed(4), 1).unwrap();
    assert_eq!(
        srx.post_recv(BytesMut::zeroed(4), 2).unwrap_err(),
        Error::Again
    );
    // Posted on the context's queue: it can be withdrawn.
    srx.cancel(1).unwrap();
    let tagged = weft::RecvMsg {
        bufs: vec![BytesMut::zeroed(4)],
        tagged: true,
        ..weft::RecvMsg::default()
    };
    let (e, bufs) = srx.post_recvmsg(tagged, OpFlags::empty()).unwrap_err();
    assert_eq!((e, bufs.len()), (Error::NoSys, 1));
}

/// A message that takes one of the context's receives just as its
/// endpoint closes reaches that receive: the close hands what its CQ
/// still holds for the context over before it stops polling. The test
/// runs on a current-thread runtime and blocks its one thread while the
/// message lands, so the endpoint's CQ driver cannot have polled it.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test]
async fn a_message_taken_as_its_endpoint_closes_reaches_the_context() {
    let (Some(s), Some(c)) = (side("rxe1"), side("rxe2")) else {
        return;
    };
    let srx = s.domain.srx_context(0).unwrap();
    let (conns, _pep) = serve(&s, &c, &srx, 2).await;
    srx.post_recv(BytesMut::zeroed(32), 7).unwrap();
    let mut send = pin!(conns[0].cep.send(0, Bytes::from_static(b"as it closed")));
    let _ = poll!(send.as_mut());
    // The device takes the message meanwhile; nothing on this thread runs.
    std::thread::sleep(std::time::Duration::from_millis(500));
    conns[0].sep.close().unwrap();
    let CqItem::Ok(e) = within("the context's receive", next_cq(&conns[0].scq)).await else {
        panic!("error completion");
    };
    assert_eq!((e.context, &e.bufs[0][..]), (7, &b"as it closed"[..]));
    within("the send", send).await.unwrap();
    assert_eq!(srx.rx_size_left().unwrap(), s.info.rx_attr.size);
    // The other connection goes on with the context.
    srx.post_recv(BytesMut::zeroed(32), 8).unwrap();
    conns[1]
        .cep
        .send(0, Bytes::from_static(b"the other one"))
        .await
        .unwrap();
    let CqItem::Ok(e) = within("after the close", next_cq(&conns[1].scq)).await else {
        panic!("error completion");
    };
    assert_eq!((e.context, &e.bufs[0][..]), (8, &b"the other one"[..]));
}

/// A shared receive its queue pair was filling when its endpoint closed
/// is flushed by the device after the close, onto the closed endpoint's
/// CQ, where the close's last poll finds it: it ends `Canceled` there,
/// at once rather than when the context closes, and the receives posted
/// after it stay on the shared queue in their order. A large message is
/// in flight when the server endpoint closes: the same message is timed
/// over the other connection first, and the close comes part of that
/// time after the send. The close can miss the message (it landed
/// first, or had not started): each such attempt is undone with fresh
/// endpoints and the delay moved (a binary search between "too early"
/// and "too late"), up to `ATTEMPTS` times; never hitting the message
/// fails the test, which would otherwise pass having shown nothing.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_flushed_mid_message_by_a_close_ends_canceled_at_once() {
    const SMALL: usize = 1000;
    const ATTEMPTS: u64 = 6;
    let long = Duration::from_secs(60);
    let (Some(s), Some(c)) = (side("rxe1"), side("rxe2")) else {
        return;
    };
    let srx = s.domain.srx_context(0).unwrap();
    // As large as the endpoints take, up to 32 MiB.
    let max = c.info.ep_attr.max_msg_size.min(s.info.ep_attr.max_msg_size);
    let big_len = max.min(32 << 20);
    assert!(big_len >= 1 << 20, "max_msg_size {max}");
    let big = payload(big_len, 1);
    // The delay from the send to the close, as a fraction of the time
    // the message takes: between `lo` (the close came before it) and
    // `hi` (it landed first).
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    let mut tried = Vec::new();
    for attempt in 0..ATTEMPTS {
        let base = 1000 * (attempt + 1);
        let (conns, _pep) = serve(&s, &c, &srx, 2).await;
        srx.post_recv(BytesMut::zeroed(big_len), base + 1).unwrap();
        let t0 = std::time::Instant::now();
        within_for(long, "the timed send", conns[1].cep.send(0, big.clone()))
            .await
            .unwrap();
        let took = t0.elapsed();
        let CqItem::Ok(e) = within_for(long, "the timed receive", next_cq(&conns[1].scq)).await
        else {
            panic!("error completion");
        };
        assert_eq!((e.context, e.len), (base + 1, big_len));
        // The oldest receive takes the large message; two small ones after.
        let (r10, r11, r12) = (base + 10, base + 11, base + 12);
        srx.post_recv(BytesMut::zeroed(big_len), r10).unwrap();
        srx.post_recv(BytesMut::zeroed(SMALL), r11).unwrap();
        srx.post_recv(BytesMut::zeroed(SMALL), r12).unwrap();
        let at = (lo + hi) / 2.0;
        let delay = took.mul_f64(at);
        let cep0 = conns[0].cep.clone();
        let sending = tokio::spawn({
            let big = big.clone();
            async move { cep0.send(0, big).await }
        });
        tokio::time::sleep(delay).await;
        conns[0].sep.close().unwrap();
        // Past the close's wait for the device (half a second): whatever
        // it reports on the closed endpoint's CQ is there by now.
        let closed = conns[0].scq.next_timeout(Duration::from_secs(2)).await;
        // The small messages the receives left on the device take, in
        // post order, from the other connection.
        let expect: &[u64] = match &closed {
            None => &[r10, r11, r12],
            Some(CqItem::Ok(e)) => {
                assert_eq!((e.context, e.len), (r10, big_len));
                &[r11, r12]
            }
            Some(CqItem::Err(e)) => {
                assert_eq!((e.context, e.err), (r10, Error::Canceled), "{e:?}");
                &[r11, r12]
            }
        };
        for (i, &want) in expect.iter().enumerate() {
            let msg = payload(SMALL, i as u8);
            within("a send after the close", conns[1].cep.send(0, msg.clone()))
                .await
                .unwrap();
            let CqItem::Ok(e) = within("its receive", next_cq(&conns[1].scq)).await else {
                panic!("error completion");
            };
            assert_eq!(
                e.context, want,
                "attempt {attempt}: receives out of post order"
            );
            assert_eq!(&e.bufs[0][..SMALL], &msg[..]);
        }
        // Every receive accounted for, nothing else reported.
        assert_eq!(srx.rx_size_left().unwrap(), s.info.rx_attr.size);
        for q in [&conns[0].scq, &conns[1].scq] {
            if let Some(it) = q.next_timeout(Duration::from_millis(10)).await {
                panic!("attempt {attempt}: a completion too many: {it:?}");
            }
        }
        sending.abort();
        match closed {
            Some(CqItem::Err(_)) => {
                eprintln!(
                    "attempt {attempt}: closed {delay:?} into a send of {big_len} bytes that \
                     takes {took:?}: the flushed receive ended Canceled"
                );
                return;
            }
            Some(CqItem::Ok(_)) => {
                tried.push(format!("{delay:?} of {took:?}: landed first"));
                hi = at;
            }
            None => {
                tried.push(format!("{delay:?} of {took:?}: not reached"));
                lo = at;
            }
        }
    }
    panic!(
        "the close never came while the message was landing, so the flush was never \
         provoked (the timing never hit): {tried:?}"
    );
}
