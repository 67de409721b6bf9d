//! The verbs provider on a real RDMA device (soft-RoCE inside the VM of
//! `integration/run-rxe`): MSG endpoints over RC queue pairs and rdma_cm,
//! a server on one device (rxe1, 10.66.0.1) and a client on another (rxe2,
//! 10.66.0.2), as on two hosts.
//!
//! Outside the VM, or in a build without the `verbs` feature, every test
//! prints why it is skipped and returns; inside the VM (`RXE_VM=1`) a
//! missing device is a failure, so nothing passes silently there.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use weft::{
    BindFlags, CompletionQueue, ConnRequest, CqAttr, Domain, Endpoint, EpType, EqEventKind, Error,
    EventQueue, Fabric, Info, PassiveEndpoint, SendMsg, WaitMode,
};
use weft_integration::rxe_net::Partition;
use weft_integration::{next_cq, next_eq, payload, verbs_offer, within};

const SERVER_DEV: &str = "rxe1";
const CLIENT_DEV: &str = "rxe2";

/// The verbs MSG offer of `dev` (see [`verbs_offer`]).
fn offer(dev: &str) -> Option<Info> {
    verbs_offer(dev, EpType::Msg)
}

struct Side {
    domain: Domain,
    info: Info,
    fabric: Fabric,
}

fn side(info: Info) -> Side {
    let fabric = Fabric::open(&info).unwrap();
    let domain = fabric.domain(&info).unwrap();
    Side {
        domain,
        info,
        fabric,
    }
}

fn ep(
    s: &Side,
    req: Option<&ConnRequest>,
    wait: WaitMode,
) -> (Endpoint, EventQueue, CompletionQueue) {
    let ep = match req {
        Some(r) => s.domain.accept_endpoint(&s.info, r).unwrap(),
        None => s.domain.endpoint(&s.info).unwrap(),
    };
    let eq = s.fabric.eq(64).unwrap();
    let cq = s
        .domain
        .cq(CqAttr {
            wait,
            ..CqAttr::default()
        })
        .unwrap();
    ep.bind_eq(&eq).unwrap();
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
        .unwrap();
    ep.set_wait_mode(wait).unwrap();
    ep.enable().unwrap();
    (ep, eq, cq)
}

fn listen(s: &Side) -> (PassiveEndpoint, EventQueue) {
    let pep = s.fabric.passive_endpoint(&s.info, None).unwrap();
    let eq = s.fabric.eq(64).unwrap();
    pep.bind_eq(&eq).unwrap();
    pep.listen().unwrap();
    (pep, eq)
}

struct Pair {
    client: (Endpoint, EventQueue, CompletionQueue),
    server: (Endpoint, EventQueue, CompletionQueue),
    _pep: PassiveEndpoint,
    /// The domains: the client's, the server's.
    domains: (Domain, Domain),
}

async fn connect(wait: WaitMode) -> Option<Pair> {
    connect_after(wait, |_| ()).await.map(|(p, ())| p)
}

/// [`connect`], with `before` run on the client's endpoint just before
/// it connects; what `before` returns comes back beside the pair.
async fn connect_after<T>(
    wait: WaitMode,
    before: impl FnOnce(&Endpoint) -> T,
) -> Option<(Pair, T)> {
    let (srv, cli) = (side(offer(SERVER_DEV)?), side(offer(CLIENT_DEV)?));
    let (pep, peq) = listen(&srv);
    let addr = pep.local_addr().unwrap();
    let client = ep(&cli, None, wait);
    let before = before(&client.0);
    let c = client.0.clone();
    let connecting = tokio::spawn(async move { c.connect(addr, b"hello server".to_vec()).await });
    let ev = within("connection request", next_eq(&peq)).await.unwrap();
    assert_eq!(ev.kind, EqEventKind::ConnReq);
    let req = ConnRequest::from_event(&ev).unwrap();
    assert_eq!(
        req.cm_data, b"hello server",
        "CM data arrives exactly, not padded"
    );
    let server = ep(&srv, Some(&req), wait);
    within("accept", server.0.accept(b"hello client".to_vec()))
        .await
        .unwrap();
    let got = within("connect", connecting).await.unwrap().unwrap();
    assert_eq!(got, b"hello client");
    for (e, q) in [(&client.0, &client.1), (&server.0, &server.1)] {
        let ev = within("connected event", next_eq(q)).await.unwrap();
        assert_eq!((ev.kind, ev.fid), (EqEventKind::Connected, e.fid()));
    }
    let pair = Pair {
        client,
        server,
        _pep: pep,
        domains: (cli.domain, srv.domain),
    };
    Some((pair, before))
}

/// Messages of every path (inline, registered, multi-megabyte, empty),
/// both ways, with remote CQ data, verified byte for byte.
async fn exchange(p: &Pair) {
    let (c, s) = (&p.client.0, &p.server.0);
    for (i, len) in [0usize, 1, 64, 512, 513, 4096, 65536, 1 << 20, 4 << 20]
        .into_iter()
        .enumerate()
    {
        for (from, to, dir) in [(c, s, 0u8), (s, c, 1u8)] {
            let data = payload(len, i as u8 ^ dir);
            let (got, sent) = within("exchange", async {
                tokio::join!(
                    to.recv(BytesMut::zeroed(len.max(1))),
                    from.sendmsg(
                        SendMsg {
                            dest: 0,
                            iov: vec![data.clone()],
                            data: Some(0xC0DE_0000 | len as u64),
                            ..SendMsg::default()
                        },
                        weft::OpFlags::empty()
                    )
                )
            })
            .await;
            sent.unwrap();
            let got = got.unwrap();
            assert_eq!(got.len, len, "length of a {len}-byte message");
            assert_eq!(got.data, 0xC0DE_0000 | len as u64, "remote CQ data");
            assert!(got.flags.contains(weft::OpFlags::REMOTE_CQ_DATA));
            assert_eq!(
                &got.into_bytes()[..],
                &data[..],
                "payload of a {len}-byte message"
            );
        }
    }
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_connect_exchange_and_shutdown_interrupt() {
    let Some(p) = connect(WaitMode::Interrupt).await else {
        return;
    };
    exchange(&p).await;
    // Many in flight at once, completions in order.
    let (c, s) = (&p.client.0, &p.server.0);
    for i in 0..200u64 {
        s.post_recv(BytesMut::zeroed(64), i).unwrap();
    }
    for i in 0..200u64 {
        c.post_send(0, Bytes::from(vec![i as u8; 64]), 1000 + i)
            .unwrap();
    }
    for i in 0..200u64 {
        let e = next_cq(&p.server.2).await.unwrap();
        assert_eq!(e.context, i, "receives complete in posting order");
        assert!(e.into_bytes().iter().all(|&b| b == i as u8));
    }
    let mut sends = 0;
    while sends < 200 {
        let e = next_cq(&p.client.2).await.unwrap();
        assert!(e.context >= 1000);
        sends += 1;
    }
    // A receive left posted is flushed when the peer shuts down.
    s.post_recv(BytesMut::zeroed(64), 77).unwrap();
    c.shutdown().unwrap();
    let ev = within("shutdown event", next_eq(&p.server.1))
        .await
        .unwrap();
    assert_eq!(ev.kind, EqEventKind::Shutdown);
    let flushed = within("flush", next_cq(&p.server.2)).await.unwrap_err();
    assert_eq!((flushed.context, flushed.err), (77, Error::Canceled));
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_exchange_busy_poll() {
    let Some(p) = connect(WaitMode::BusyPoll).await else {
        return;
    };
    exchange(&p).await;
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_exchange_inline() {
    let Some(p) = connect(WaitMode::Inline).await else {
        return;
    };
    exchange(&p).await;
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_reject_delivers_data_and_refuses() {
    let (Some(si), Some(ci)) = (offer(SERVER_DEV), offer(CLIENT_DEV)) else {
        return;
    };
    let (srv, cli) = (side(si), side(ci));
    let (pep, peq) = listen(&srv);
    let addr = pep.local_addr().unwrap();
    let (c, ceq, _ccq) = ep(&cli, None, WaitMode::Interrupt);
    let c2 = c.clone();
    let connecting = tokio::spawn(async move { c2.connect(addr, b"may I".to_vec()).await });
    let ev = within("request", next_eq(&peq)).await.unwrap();
    let req = ConnRequest::from_event(&ev).unwrap();
    pep.reject(&req, b"no".to_vec()).unwrap();
    let r = within("connect", connecting).await.unwrap();
    assert_eq!(r.unwrap_err(), Error::ConnRefused);
    let e = within("error event", next_eq(&ceq)).await.unwrap_err();
    assert_eq!(e.err, Error::ConnRefused);
    assert_eq!(e.err_data, b"no", "the reject's data reaches the connector");
    // A second reject of the same request is refused, not a crash.
    assert!(pep.reject(&req, Vec::new()).is_err());
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_bad_input_is_refused_cleanly() {
    let Some(p) = connect(WaitMode::Interrupt).await else {
        return;
    };
    let c = &p.client.0;
    // CM data over the limit, a second connect, oversized iov.
    let too_long = vec![0u8; 200];
    assert_eq!(
        c.connect(p._pep.local_addr().unwrap(), too_long)
            .await
            .unwrap_err(),
        Error::Inval
    );
    // A message larger than the receive buffer: the receive fails with an
    // error completion (RC cannot deliver part of a message).
    let s = &p.server.0;
    s.post_recv(BytesMut::zeroed(16), 5).unwrap();
    c.post_send(0, payload(4096, 1), 6).unwrap();
    let e = within("truncated receive", next_cq(&p.server.2))
        .await
        .unwrap_err();
    assert_eq!(e.context, 5);
    assert_eq!(e.err, Error::Trunc, "a too-long message is truncation");
    // RC cannot go on after it: the sender's side fails too, and the
    // endpoint reports it rather than hanging.
    let se = within("sender error", next_cq(&p.client.2))
        .await
        .unwrap_err();
    assert_eq!(se.context, 6);
}

/// The peer closes its endpoint with messages in flight: every receive
/// still posted here ends (with data, or flushed with `Canceled`), the EQ
/// reports the connection's end, and nothing hangs.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_peer_closing_mid_transfer_ends_everything() {
    let Some(p) = connect(WaitMode::Interrupt).await else {
        return;
    };
    let (c, s) = (&p.client.0, &p.server.0);
    for i in 0..8u64 {
        s.post_recv(BytesMut::zeroed(1 << 20), i).unwrap();
    }
    for i in 0..3u64 {
        c.post_send(0, payload(1 << 20, i as u8), 100 + i).unwrap();
    }
    c.close().unwrap();
    let ev = within("end of connection on the EQ", next_eq(&p.server.1)).await;
    match ev {
        Ok(e) => assert_eq!(e.kind, EqEventKind::Shutdown),
        Err(e) => assert!(
            matches!(e.err, Error::ConnAborted | Error::ConnReset),
            "{e:?}"
        ),
    }
    let (mut ok, mut flushed) = (0, 0);
    for _ in 0..8 {
        match within("every receive ends", next_cq(&p.server.2)).await {
            Ok(e) => {
                assert_eq!(e.len, 1 << 20);
                ok += 1;
            }
            Err(e) => {
                assert_eq!(e.err, Error::Canceled, "{e:?}");
                flushed += 1;
            }
        }
    }
    assert_eq!(ok + flushed, 8);
    assert!(ok <= 3, "no more data than was sent");
    // The surviving endpoint's QP is in the error state: a send either is
    // refused at once or completes with an error, never hangs.
    if s.post_send(0, payload(8, 0), 1).is_ok() {
        let e = within("send on a dead connection", next_cq(&p.server.2)).await;
        assert!(e.is_err(), "{e:?}");
    }
}

/// A receive posted before the connection exists can be cancelled, and so
/// can one already on the QP (it completes with `Canceled`); `NoEnt` is
/// only for a receive that already ended.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_cancel_reaches_receives_not_yet_on_the_qp() {
    let Some(ci) = offer(CLIENT_DEV) else { return };
    let cli = side(ci);
    let (c, _eq, cq) = ep(&cli, None, WaitMode::Interrupt);
    c.post_recv(BytesMut::zeroed(64), 5).unwrap();
    c.cancel(5).unwrap();
    let e = within("cancelled receive", next_cq(&cq)).await.unwrap_err();
    assert_eq!((e.context, e.err), (5, Error::Canceled));
    assert_eq!(c.cancel(5).unwrap_err(), Error::NoEnt);
    let Some(p) = connect(WaitMode::Interrupt).await else {
        return;
    };
    p.server.0.post_recv(BytesMut::zeroed(64), 9).unwrap();
    p.server.0.cancel(9).unwrap();
    let e = within("cancelled receive on the QP", next_cq(&p.server.2))
        .await
        .unwrap_err();
    assert_eq!((e.context, e.err), (9, Error::Canceled));
    assert_eq!(p.server.0.cancel(9).unwrap_err(), Error::NoEnt);
}

/// Receives posted before the connection, cancelled while the connection
/// is being built: each cancel finds its receive (waiting for the link,
/// or moved onto the new queue pair), never `NoEnt`, and each ends once,
/// `Canceled`. The canceller waits for the link to appear (the endpoint's
/// peer address comes from it) and cancels at once, the last-posted
/// receive first: before the move of the waiting receives onto the queue
/// pair shared the link's publication's hold of its lock, that receive
/// was in neither place `cancel` looked while the ones before it were
/// posted (a window of `N` posts), and its cancel failed `NoEnt`: run
/// against that provider in the rxe VM, the last two receives' cancels
/// failed so in the third of three rounds (the window is the
/// scheduler's to hit, hence five rounds).
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_cancel_during_the_connect_finds_every_early_receive() {
    const N: u64 = 128;
    for round in 0..5u64 {
        let early = connect_after(WaitMode::Interrupt, |c| {
            let n = N.min(c.rx_size_left().unwrap() as u64);
            assert!(n >= 16, "room for {n} receives only");
            for i in 0..n {
                c.post_recv(BytesMut::zeroed(64), 1000 + i).unwrap();
            }
            let c = c.clone();
            let canceller = std::thread::spawn(move || {
                let limit = Instant::now() + Duration::from_secs(60);
                // Looked for every 10 µs, spinning in between: a look
                // contends for the link's lock, and one that blocked on it
                // as the link was published would wake (a futex wake)
                // only after the move it is to race.
                while c.peer_addr().is_err() {
                    assert!(Instant::now() < limit, "no link within 60 s");
                    let t = Instant::now();
                    while t.elapsed() < Duration::from_micros(10) {
                        std::hint::spin_loop();
                    }
                }
                (0..n)
                    .rev()
                    .filter_map(|i| c.cancel(1000 + i).err().map(|e| (1000 + i, e)))
                    .collect::<Vec<_>>()
            });
            (n, canceller)
        })
        .await;
        let Some((p, (n, canceller))) = early else {
            return;
        };
        let (c, ccq) = (&p.client.0, &p.client.2);
        let (s, scq) = (&p.server.0, &p.server.2);
        let refused = canceller.join().unwrap();
        assert!(
            refused.is_empty(),
            "round {round}: cancels of receives that had not ended were refused: {refused:?}"
        );
        let mut ended = Vec::new();
        for _ in 0..n {
            let e = within("a cancelled early receive", next_cq(ccq))
                .await
                .unwrap_err();
            assert_eq!(e.err, Error::Canceled, "receive {}", e.context);
            ended.push(e.context);
        }
        ended.sort_unstable();
        assert_eq!(
            ended,
            (1000..1000 + n).collect::<Vec<_>>(),
            "each ends once"
        );
        assert!(c.rx_size_left().unwrap() as u64 >= n, "every credit back");
        // The connection works: the message lands in a withdrawn work
        // request (every early receive was on the queue pair when
        // cancelled) and reaches the receive posted now.
        c.post_recv(BytesMut::zeroed(64), 7).unwrap();
        s.post_send(0, payload(64, 3), 8).unwrap();
        assert_eq!(within("send", next_cq(scq)).await.unwrap().context, 8);
        let got = within("the message", next_cq(ccq)).await.unwrap();
        assert_eq!(got.context, 7);
        assert_eq!(&got.bufs[0][..64], &payload(64, 3)[..]);
    }
}

/// Pool buffers (`Domain::buffer_pool`) on MSG: messages of every path
/// (inline, below and above a bounce slot, 1 MiB) go out of and into
/// them intact, and the sender registers nothing: its registration cache
/// sees no lookup, where the same message from a plain `Bytes` does.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_pool_buffers_skip_registration() {
    let Some(p) = connect(WaitMode::Interrupt).await else {
        return;
    };
    let (c, s) = (&p.client.0, &p.server.0);
    let (cd, sd) = &p.domains;
    let (cpool, spool) = (
        cd.buffer_pool(4, 1 << 20).unwrap(),
        sd.buffer_pool(4, 1 << 20).unwrap(),
    );
    assert_ne!(cpool.desc(), 0, "a registered pool has a local key");
    let before = cd.mr_cache_stats().unwrap();
    for (i, len) in [1usize, 64, 600, 4096, 65_536, 1 << 20]
        .into_iter()
        .enumerate()
    {
        let mut out = cpool.try_get().unwrap();
        out.set_len(len).unwrap();
        out.copy_from_slice(&payload(len, i as u8));
        let (got, sent) = within("pool exchange", async {
            tokio::join!(
                s.recv_pooled(spool.try_get().unwrap()),
                c.send_pooled(0, out)
            )
        })
        .await;
        sent.unwrap();
        let got = got.unwrap();
        assert_eq!(got.entry.len, len);
        assert!(got.buf[..] == payload(len, i as u8)[..], "{len} bytes");
    }
    let after = cd.mr_cache_stats().unwrap();
    assert_eq!(
        (after.hits, after.misses),
        (before.hits, before.misses),
        "pool sends register nothing"
    );
    let plain = payload(1 << 20, 7);
    let (got, sent) = tokio::join!(s.recv(BytesMut::zeroed(1 << 20)), c.send(0, plain));
    sent.unwrap();
    got.unwrap();
    let plain_st = cd.mr_cache_stats().unwrap();
    assert_eq!(plain_st.misses, after.misses + 1, "a plain send registers");
    for pool in [&cpool, &spool] {
        within("buffers back", async {
            while pool.stats().free != 4 {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await;
    }
}

/// The posted forms on pool buffers (`post_send_pooled`,
/// `post_recv_pooled`) on MSG: messages of every path go out of and into
/// pool buffers with completions on the CQ, each receive's buffer comes
/// back out of its completion with the message, the sender registers
/// nothing, and a buffer of the peer's domain is `Inval`. A cancelled
/// receive's own buffer stays with the device (see below).
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_posted_pool_buffers() {
    let Some(p) = connect(WaitMode::Inline).await else {
        return;
    };
    let ((c, _, ccq), (s, _, scq)) = (&p.client, &p.server);
    let (cd, sd) = &p.domains;
    let (cpool, spool) = (
        cd.buffer_pool(4, 1 << 20).unwrap(),
        sd.buffer_pool(4, 1 << 20).unwrap(),
    );
    let before = cd.mr_cache_stats().unwrap();
    for (i, len) in [1usize, 64, 600, 4096, 65_536, 1 << 20]
        .into_iter()
        .enumerate()
    {
        s.post_recv_pooled(spool.try_get().unwrap(), 1).unwrap();
        let mut out = cpool.try_get().unwrap();
        out.set_len(len).unwrap();
        out.copy_from_slice(&payload(len, i as u8));
        c.post_send_pooled(0, out, 2).unwrap();
        let sent = within("send completion", next_cq(ccq)).await.unwrap();
        assert_eq!((sent.context, sent.len), (2, len));
        let mut got = within("receive completion", next_cq(scq)).await.unwrap();
        assert_eq!((got.context, got.len), (1, len));
        let buf = spool.reclaim(&mut got.bufs).unwrap();
        assert!(buf[..] == payload(len, i as u8)[..], "{len} bytes");
    }
    let after = cd.mr_cache_stats().unwrap();
    assert_eq!(
        (after.hits, after.misses),
        (before.hits, before.misses),
        "posted pool sends register nothing"
    );
    s.post_recv_pooled(spool.try_get().unwrap(), 3).unwrap();
    s.cancel(3).unwrap();
    let mut e = within("cancelled pool receive", next_cq(scq))
        .await
        .unwrap_err();
    assert_eq!((e.context, e.err), (3, Error::Canceled));
    // Its work request stays on the QP (verbs cannot take one back) and
    // keeps the pool buffer: the entry does not have it, and the pool
    // counts it as lent for good.
    assert!(spool.reclaim(&mut e.bufs).is_none());
    assert_eq!(spool.stats().lent, 1);
    let (err, back) = c.post_recv_pooled(spool.try_get().unwrap(), 4).unwrap_err();
    assert_eq!(err, Error::Inval, "the peer domain's buffer");
    drop(back);
    let (err, _) = c
        .post_send_pooled(0, spool.try_get().unwrap(), 5)
        .unwrap_err();
    assert_eq!(err, Error::Inval);
    for (pool, out) in [(&cpool, 0), (&spool, 1)] {
        within("buffers back", async {
            while pool.stats().free != 4 - out {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await;
        assert_eq!((pool.stats().lent, pool.stats().lost), (out, 0));
    }
}

/// A message that lands in a cancelled pool receive's work request (verbs
/// cannot take one back) goes to the next pool receive in the memory it
/// landed in: that receive's completion carries a pool buffer with the
/// message, reclaimable, and its own buffer stays on the queue pair for a
/// later message — one buffer lent in all, not two.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_pool_receive_after_a_cancelled_one() {
    let Some(p) = connect(WaitMode::Inline).await else {
        return;
    };
    let ((c, _, ccq), (s, _, scq)) = (&p.client, &p.server);
    let (cd, sd) = &p.domains;
    let (cpool, spool) = (
        cd.buffer_pool(2, 4096).unwrap(),
        sd.buffer_pool(3, 4096).unwrap(),
    );
    s.post_recv_pooled(spool.try_get().unwrap(), 1).unwrap();
    s.post_recv_pooled(spool.try_get().unwrap(), 2).unwrap();
    s.cancel(1).unwrap();
    let e = within("cancelled", next_cq(scq)).await.unwrap_err();
    assert_eq!((e.context, e.err), (1, Error::Canceled));
    let mut out = cpool.try_get().unwrap();
    out.set_len(100).unwrap();
    out.copy_from_slice(&payload(100, 9));
    c.post_send_pooled(0, out, 3).unwrap();
    within("send completion", next_cq(ccq)).await.unwrap();
    let mut got = within("receive completion", next_cq(scq)).await.unwrap();
    assert_eq!((got.context, got.len), (2, 100));
    let buf = spool
        .reclaim(&mut got.bufs)
        .expect("a pool buffer with the message");
    assert!(buf[..] == payload(100, 9)[..]);
    drop(buf);
    assert_eq!(spool.stats().lent, 1, "the second receive's, on the QP");
}

/// How long a test waits for a silent peer to be found: the probe's
/// wait (two ticks of 5 s at most) and seven local ACK timeouts of the
/// transport retries (about 24 s under the VM's emulation), with room.
const SILENT_BOUND: Duration = Duration::from_secs(90);

/// A peer that goes silent without a disconnect (as with a crashed host
/// or a cut link: here rxe2's packets to rxe1 are lost, so the servers
/// on rxe1 hear nothing more from their clients on rxe2) fails what
/// waits on it within a bounded time: a send once its transport
/// retries are spent, and a receive, which has nothing of its own on
/// the device, through the connection's liveness probe. Each on a
/// connection of its own, so neither ends the other's. Each endpoint's
/// EQ hears the error and nothing waits for ever. Before that, a live
/// peer that sends nothing for longer than the probe's wait keeps the
/// connection up (the probes are acknowledged).
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_silent_peer_fails_sends_and_receives() {
    let Some(rx) = connect(WaitMode::Interrupt).await else {
        return;
    };
    let tx = connect(WaitMode::Interrupt).await.unwrap();
    let s = &rx.server.0;
    s.post_recv(BytesMut::zeroed(64), 1).unwrap();
    let idle = rx.server.2.next_timeout(Duration::from_secs(12)).await;
    assert!(idle.is_none(), "a live, quiet peer: {idle:?}");
    rx.client.0.post_send(0, payload(64, 9), 2).unwrap();
    let got = within("receive after the quiet time", next_cq(&rx.server.2))
        .await
        .unwrap();
    assert_eq!((got.context, got.len), (1, 64));
    within("send after the quiet time", next_cq(&rx.client.2))
        .await
        .unwrap();

    s.post_recv(BytesMut::zeroed(64), 3).unwrap();
    let cut = Partition::rxe2_to_rxe1();
    let t = Instant::now();
    tx.server.0.post_send(0, payload(64, 7), 4).unwrap();
    let (received, sent, rx_ev, tx_ev, rx_peer, tx_peer) = tokio::join!(
        rx.server.2.next_timeout(SILENT_BOUND),
        tx.server.2.next_timeout(SILENT_BOUND),
        rx.server.1.next_timeout(SILENT_BOUND),
        tx.server.1.next_timeout(SILENT_BOUND),
        rx.client.1.next_timeout(SILENT_BOUND),
        tx.client.1.next_timeout(SILENT_BOUND),
    );
    eprintln!("silent peers found after {:?}", t.elapsed());
    drop(cut);
    let received = received
        .expect("a receive from a silent peer ends")
        .expect_err("a receive from a silent peer fails");
    assert_eq!(
        (received.context, received.err),
        (3, Error::Canceled),
        "{received:?}"
    );
    let sent = sent
        .expect("a send to a silent peer ends")
        .expect_err("a send to a silent peer fails");
    assert_eq!((sent.context, sent.err), (4, Error::TimedOut), "{sent:?}");
    for (who, ev) in [("receiver", rx_ev), ("sender", tx_ev)] {
        let e = ev
            .unwrap_or_else(|e| panic!("{who}: no event: {e}"))
            .expect_err("the connection's failure is an EQ error");
        assert_eq!(e.err, Error::TimedOut, "{who}: {e:?}");
    }
    // The clients, cut off, hear of it too (here rdma_cm tells them).
    for (who, ev) in [("receiver's peer", rx_peer), ("sender's peer", tx_peer)] {
        let ev = ev.unwrap_or_else(|e| panic!("{who}: no event: {e}"));
        assert!(ev.is_err(), "{who}: {ev:?}");
    }
    // The endpoints are disabled: nothing more is taken.
    assert_eq!(s.post_recv(BytesMut::zeroed(8), 5), Err(Error::OpBadState));
}
