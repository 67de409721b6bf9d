//! Scalable endpoints (`fi_scalable_ep`, fi_endpoint(3); `fi_rx_addr`,
//! fi_av(3)): one address, transmit and receive contexts that are
//! endpoints of their own, each completing on its own CQ. A message sent
//! to `rx_addr(peer, i)` lands in receive context `i` only, reporting its
//! sender (`FI_SOURCE`); one for a context the peer does not have is
//! dropped and counted there, and the connection carries on. Providers
//! whose offers allow one context (`max_ep_*_ctx` 1) refuse them.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use weft::{
    AvAttr, BindFlags, Caps, CompletionQueue, Endpoint, EpType, Error, FiAddr, Info,
    ScalableEndpoint,
};
use weft::{MrAccess, MrAttr};
use weft_integration::{
    assert_cq_quiet, next_cq, next_eq, payload, within, Harness, Provider, Rng,
};

pub(super) const CTXS: usize = 4;
/// Receive-context bits of every AV here: enough for [`CTXS`].
pub(super) const BITS: u32 = 2;

/// The offer for a scalable endpoint with `CTXS` contexts each way, or
/// `None` (after checking the refusal) where the provider has none.
pub(super) fn scalable_info(p: &Provider) -> Option<Info> {
    let info = p.try_info_with(EpType::Rdm, |h| {
        h.caps = Caps::MSG | Caps::TAGGED | Caps::SOURCE | Caps::NAMED_RX_CTX;
        h.ep_attr.tx_ctx_cnt = CTXS;
        h.ep_attr.rx_ctx_cnt = CTXS;
    });
    if info.is_none() {
        let h = Harness::new(p, p.connless_type());
        let d = &h.info.domain_attr;
        assert!(d.max_ep_tx_ctx <= 1 || d.max_ep_rx_ctx <= 1, "{d:?}");
        let mut asked = h.info.clone();
        asked.ep_attr.tx_ctx_cnt = CTXS;
        asked.ep_attr.rx_ctx_cnt = CTXS;
        assert_eq!(
            h.domain.scalable_endpoint(&asked).unwrap_err(),
            Error::NoSys
        );
    }
    info
}

/// A scalable endpoint of `h`, enabled, with an AV of [`BITS`].
pub(super) fn sep(h: &Harness) -> (ScalableEndpoint, weft::AddressVector) {
    let s = h.domain.scalable_endpoint(&h.info).unwrap();
    let av = h.av_with(AvAttr {
        rx_ctx_bits: BITS,
        ..AvAttr::default()
    });
    s.bind_av(&av).unwrap();
    s.enable().unwrap();
    (s, av)
}

/// Context `i` (`tx`: transmit) of `s`, enabled on a CQ of its own.
pub(super) fn ctx(
    h: &Harness,
    s: &ScalableEndpoint,
    tx: bool,
    i: usize,
) -> (Endpoint, CompletionQueue) {
    let cq = h.cq();
    let (c, flags) = if tx {
        (s.tx_context(i).unwrap(), BindFlags::TRANSMIT)
    } else {
        (s.rx_context(i).unwrap(), BindFlags::RECV)
    };
    c.bind_cq(&cq, flags).unwrap();
    c.enable().unwrap();
    (c, cq)
}

/// `peer`'s address in `av`.
pub(super) fn insert(av: &weft::AddressVector, peer: &ScalableEndpoint) -> FiAddr {
    av.insert_sync(&[peer.local_addr().unwrap()], Default::default())
        .unwrap()
        .fi_addrs[0]
}

/// Counts beyond the offer, out-of-range indices, a second open of an
/// index, a context enabled before its endpoint, closing an endpoint with
/// open contexts: each its documented error, nothing else disturbed.
async fn bad_input_is_refused(p: Provider) {
    let Some(info) = scalable_info(&p) else {
        return;
    };
    let h = Harness::with_info(&p, info.clone());
    let max = h.info.domain_attr.max_ep_rx_ctx;
    assert!(max >= CTXS);
    let over = p.try_info_with(EpType::Rdm, |h| h.ep_attr.rx_ctx_cnt = max + 1);
    assert!(
        over.is_none(),
        "getinfo matched more receive contexts than offered"
    );
    let mut asked = info.clone();
    asked.ep_attr.tx_ctx_cnt = h.info.domain_attr.max_ep_tx_ctx + 1;
    assert_eq!(
        h.domain.scalable_endpoint(&asked).unwrap_err(),
        Error::Inval
    );

    let s = h.domain.scalable_endpoint(&info).unwrap();
    assert_eq!(s.tx_context(CTXS).unwrap_err(), Error::Inval);
    assert_eq!(s.rx_context(CTXS).unwrap_err(), Error::Inval);
    // Before the scalable endpoint is enabled a context cannot be.
    let early = s.rx_context(0).unwrap();
    early.bind_cq(&h.cq(), BindFlags::RECV).unwrap();
    assert_eq!(early.enable().unwrap_err(), Error::OpBadState);
    assert_eq!(s.rx_context(0).unwrap_err(), Error::Busy);
    assert_eq!(s.close().unwrap_err(), Error::Busy, "a context is open");
    early.close().unwrap();
    // An index opens once, closed or not.
    assert_eq!(s.rx_context(0).unwrap_err(), Error::Busy);
    let av = h.av_with(AvAttr {
        rx_ctx_bits: BITS,
        ..AvAttr::default()
    });
    s.bind_av(&av).unwrap();
    assert_eq!(s.bind_av(&av).unwrap_err(), Error::Inval);
    s.enable().unwrap();
    let (tx, _cq) = ctx(&h, &s, true, 1);
    assert_eq!(s.tx_context(1).unwrap_err(), Error::Busy);
    // Its queue is its own, of the offer's size.
    assert_eq!(tx.tx_size_left().unwrap(), h.info.tx_attr.size);
    // A context binds one CQ per direction, like any endpoint, and
    // nothing once enabled.
    let twice = s.tx_context(3).unwrap();
    twice.bind_cq(&h.cq(), BindFlags::TRANSMIT).unwrap();
    let e = twice.bind_cq(&h.cq(), BindFlags::TRANSMIT).unwrap_err();
    assert_eq!(e, Error::Inval);
    twice.enable().unwrap();
    let e = twice.bind_cq(&h.cq(), BindFlags::RECV).unwrap_err();
    assert_eq!(e, Error::OpBadState);
    twice.close().unwrap();
    // A context needs its direction's queue; the other direction is not
    // its own.
    let bare = s.rx_context(2).unwrap();
    assert_eq!(bare.enable().unwrap_err(), Error::NoCq);
    // Its queues are its own: a shared receive context has no place.
    bare.bind_cq(&h.cq(), BindFlags::RECV).unwrap();
    bare.bind_srx(&h.domain.srx_context(0).unwrap()).unwrap();
    assert_eq!(bare.enable().unwrap_err(), Error::Inval);
    assert_eq!(bare.bind_av(&av).unwrap_err(), Error::Inval);
    let e = tx.post_recv(BytesMut::zeroed(8), 1).unwrap_err();
    assert_eq!(e, Error::OpNotSupp);
    drop(bare);
    tx.close().unwrap();
    s.close().unwrap();
}

/// A destination handle whose `fi_rx_addr` bits name a receive context
/// beyond any endpoint's maximum (an AV with more `rx_ctx_bits` than the
/// contexts need) is `Inval` at the post, and nothing is sent; the next
/// send, to a context that exists, arrives.
async fn context_beyond_the_maximum_is_inval(p: Provider) {
    let Some(info) = scalable_info(&p) else {
        return;
    };
    let h = Harness::with_info(&p, info);
    let max = h.info.domain_attr.max_ep_rx_ctx;
    let bits = usize::BITS - max.leading_zeros();
    let (server, _) = sep(&h);
    let (rx, rx_cq) = ctx(&h, &server, false, 1);
    let client = h.domain.scalable_endpoint(&h.info).unwrap();
    let wide = h.av_with(AvAttr {
        rx_ctx_bits: bits,
        ..AvAttr::default()
    });
    client.bind_av(&wide).unwrap();
    client.enable().unwrap();
    let (tx, tx_cq) = ctx(&h, &client, true, 0);
    let peer = insert(&wide, &server);
    let beyond = weft::rx_addr(peer, max as u32, bits);
    assert_ne!(
        beyond,
        weft::rx_addr(peer, 0, bits),
        "{bits} bits hold {max}"
    );
    let e = tx
        .post_send(beyond, Bytes::from_static(b"far"), 1)
        .unwrap_err();
    assert_eq!(e, Error::Inval);
    assert_eq!(
        tx.tx_size_left().unwrap(),
        h.info.tx_attr.size,
        "no credit kept"
    );
    let (got, sent) = within("a send to context 1", async {
        tokio::join!(
            rx.recv(BytesMut::zeroed(8)),
            tx.send(weft::rx_addr(peer, 1, bits), Bytes::from_static(b"near"))
        )
    })
    .await;
    sent.unwrap();
    assert_eq!(&got.unwrap().into_bytes()[..], b"near");
    assert_cq_quiet(&tx_cq, "the refused send").await;
    assert_cq_quiet(&rx_cq, "context 1").await;
    assert_eq!(server.stats().unwrap().rx_bad_ctx, 0);
}

/// Every transmit context sends to every receive context, untagged and
/// tagged: each message lands in the context it names only, with its
/// sender's address; each send completes on its own context's CQ.
async fn messages_land_in_the_named_context(p: Provider) {
    let Some(info) = scalable_info(&p) else {
        return;
    };
    let h = Harness::with_info(&p, info);
    let (server, server_av) = sep(&h);
    let (client, client_av) = sep(&h);
    let rx: Vec<_> = (0..CTXS).map(|i| ctx(&h, &server, false, i)).collect();
    let tx: Vec<_> = (0..CTXS).map(|i| ctx(&h, &client, true, i)).collect();
    let to_server = insert(&client_av, &server);
    let from_client = insert(&server_av, &client);
    // Posted receives: CTXS untagged and CTXS tagged in each context, the
    // context value naming the context.
    for (i, (c, _)) in rx.iter().enumerate() {
        for k in 0..CTXS as u64 {
            c.post_recv(BytesMut::zeroed(16), i as u64 * 100 + k)
                .unwrap();
            c.post_trecv(BytesMut::zeroed(16), weft::FI_ADDR_UNSPEC, 7, 0, 50 + k)
                .unwrap();
        }
    }
    for (j, (c, _)) in tx.iter().enumerate() {
        for i in 0..CTXS {
            let dest = weft::rx_addr(to_server, i as u32, BITS);
            let body = Bytes::from(vec![i as u8, j as u8]);
            c.post_send(dest, body.clone(), (j * 10 + i) as u64)
                .unwrap();
            c.post_tsend(dest, body, 7, (j * 10 + i) as u64 + 1000)
                .unwrap();
        }
    }
    for (j, (_, cq)) in tx.iter().enumerate() {
        let mut ctxs = Vec::new();
        for _ in 0..2 * CTXS {
            ctxs.push(next_cq(cq).await.unwrap().context);
        }
        ctxs.sort_unstable();
        let mut want: Vec<u64> = (0..CTXS)
            .flat_map(|i| [(j * 10 + i) as u64, (j * 10 + i) as u64 + 1000])
            .collect();
        want.sort_unstable();
        assert_eq!(ctxs, want, "transmit context {j}'s completions");
        assert_cq_quiet(cq, "transmit CQ").await;
    }
    for (i, (_, cq)) in rx.iter().enumerate() {
        let mut senders = Vec::new();
        for _ in 0..2 * CTXS {
            let e = next_cq(cq).await.unwrap();
            let got = &e.bufs[0][..e.len];
            assert_eq!(
                got[0] as usize, i,
                "a message for context {} in {i}",
                got[0]
            );
            assert_eq!(e.src, from_client, "FI_SOURCE");
            let tagged = e.flags.contains(weft::OpFlags::TAGGED);
            assert_eq!(tagged, e.context >= 50 && e.context < 100);
            senders.push((got[1], tagged));
        }
        senders.sort_unstable();
        let want: Vec<_> = (0..CTXS as u8)
            .flat_map(|j| [(j, false), (j, true)])
            .collect();
        assert_eq!(senders, want, "receive context {i}");
        assert_cq_quiet(cq, "receive CQ").await;
    }
    assert_eq!(server.stats().unwrap().rx_bad_ctx, 0);
}

/// A message for a receive context the peer does not have is dropped
/// there, counted and reported on its EQ (a delivery-complete send fails
/// with `AddrNotAvail`); the connection carries the next message on to a
/// context that exists.
async fn unknown_context_is_dropped_and_reported(p: Provider) {
    let Some(info) = scalable_info(&p) else {
        return;
    };
    let h = Harness::with_info(&p, info.clone());
    let mut two = info.clone();
    two.ep_attr.rx_ctx_cnt = 2;
    let server = h.domain.scalable_endpoint(&two).unwrap();
    let eq = h.eq();
    server.bind_eq(&eq).unwrap();
    server
        .bind_av(&h.av_with(AvAttr {
            rx_ctx_bits: BITS,
            ..AvAttr::default()
        }))
        .unwrap();
    server.enable().unwrap();
    let (rx1, rx1_cq) = ctx(&h, &server, false, 1);
    let (client, client_av) = sep(&h);
    let (tx, _tx_cq) = ctx(&h, &client, true, 0);
    let to_server = insert(&client_av, &server);
    // Context 3 does not exist, context 0 is not enabled.
    for i in [3, 0] {
        tx.send(
            weft::rx_addr(to_server, i, BITS),
            Bytes::from_static(b"lost"),
        )
        .await
        .unwrap();
    }
    // A delivery-complete sender learns that nothing took it.
    let msg = weft::SendMsg {
        dest: weft::rx_addr(to_server, 3, BITS),
        iov: vec![Bytes::from_static(b"told")],
        ..weft::SendMsg::default()
    };
    let e = within("a delivery-complete send to a missing context", async {
        tx.sendmsg(msg, weft::OpFlags::DELIVERY_COMPLETE).await
    })
    .await
    .unwrap_err();
    assert_eq!(e.err, Error::AddrNotAvail);
    let recv = rx1.recv(BytesMut::zeroed(8));
    let send = tx.send(
        weft::rx_addr(to_server, 1, BITS),
        Bytes::from_static(b"kept"),
    );
    let (got, sent) = within("the message after the dropped ones", async {
        tokio::join!(recv, send)
    })
    .await;
    sent.unwrap();
    assert_eq!(&got.unwrap().into_bytes()[..], b"kept");
    assert_eq!(server.stats().unwrap().rx_bad_ctx, 3);
    for _ in 0..3 {
        let e = next_eq(&eq).await.unwrap_err();
        assert_eq!(e.err, Error::AddrNotAvail);
        assert_eq!(
            e.peer_addr,
            Some(client.local_addr().unwrap()),
            "names the sender"
        );
    }
    assert_cq_quiet(&rx1_cq, "context 1").await;
}

/// Without `FI_NAMED_RX_CTX` on the receiving endpoint nothing can
/// address its receive contexts: a message naming context 1 goes to
/// receive context 0 (fi_endpoint(3): naming a context is the
/// capability's job).
async fn unnamed_contexts_take_context_0(p: Provider) {
    let Some(info) = scalable_info(&p) else {
        return;
    };
    let h = Harness::with_info(&p, info.clone());
    let mut unnamed = info;
    unnamed.caps.remove(Caps::NAMED_RX_CTX);
    let server = h.domain.scalable_endpoint(&unnamed).unwrap();
    server
        .bind_av(&h.av_with(AvAttr {
            rx_ctx_bits: BITS,
            ..AvAttr::default()
        }))
        .unwrap();
    server.enable().unwrap();
    let (rx0, _) = ctx(&h, &server, false, 0);
    let (_rx1, rx1_cq) = ctx(&h, &server, false, 1);
    let (client, client_av) = sep(&h);
    let (tx, _) = ctx(&h, &client, true, 0);
    let dest = weft::rx_addr(insert(&client_av, &server), 1, BITS);
    let (got, sent) = within("a message naming context 1", async {
        tokio::join!(
            rx0.recv(BytesMut::zeroed(8)),
            tx.send(dest, Bytes::from_static(b"to 1"))
        )
    })
    .await;
    sent.unwrap();
    assert_eq!(&got.unwrap().into_bytes()[..], b"to 1");
    assert_cq_quiet(&rx1_cq, "context 1").await;
    assert_eq!(server.stats().unwrap().rx_bad_ctx, 0);
}

/// Awaits `fut` for at most `wait`, spinning on the clock (Tokio's timers
/// tick in milliseconds; the race of interest is microseconds wide), and
/// drops it unfinished when the time is up.
async fn within_spin<F: Future>(fut: F, wait: Duration) -> Option<F::Output> {
    let mut fut = pin!(fut);
    let start = Instant::now();
    poll_fn(|cx| match fut.as_mut().poll(cx) {
        Poll::Ready(r) => Poll::Ready(Some(r)),
        Poll::Pending if start.elapsed() >= wait => Poll::Ready(None),
        Poll::Pending => {
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await
}

/// Receives awaited on a receive context under random timeouts (0–200
/// µs), their futures dropped when the time is up, while one sender sends
/// numbered messages to that context a random 0–100 µs apart: each
/// arrives exactly once, in order, and nothing is left over.
async fn dropped_futures_lose_nothing(p: Provider) {
    const MSGS: u64 = 2_000;
    // Runs here drop 600-1,000 futures a round; a loaded machine may
    // find most messages in before their futures time out, so rounds go
    // on (numbering on) until a tenth of a round's messages was dropped.
    const ROUNDS: u64 = 5;
    let Some(info) = scalable_info(&p) else {
        return;
    };
    let h = Harness::with_info(&p, info);
    let (server, _) = sep(&h);
    let (client, client_av) = sep(&h);
    let (rx, _rx_cq) = ctx(&h, &server, false, 2);
    let (tx, _tx_cq) = ctx(&h, &client, true, 3);
    let dest = weft::rx_addr(insert(&client_av, &server), 2, BITS);
    let mut rng = Rng::seeded("WEFT_SCALABLE_SEED");
    let mut next = 0u64;
    let mut dropped = 0u64;
    let mut rounds = 0;
    while rounds < ROUNDS && dropped <= MSGS / 10 {
        let sender = {
            let tx = tx.clone();
            let first = rounds * MSGS;
            tokio::spawn(async move {
                let mut rng = Rng::seeded("WEFT_SCALABLE_SEED");
                for i in first..first + MSGS {
                    tx.send(dest, Bytes::copy_from_slice(&i.to_le_bytes()))
                        .await
                        .unwrap();
                    let gap = Duration::from_micros(rng.below(100));
                    let start = Instant::now();
                    while start.elapsed() < gap {
                        tokio::task::yield_now().await;
                    }
                }
            })
        };
        rounds += 1;
        let deadline = Instant::now() + Duration::from_secs(60);
        while next < rounds * MSGS {
            assert!(Instant::now() < deadline, "stuck at {next}");
            let wait = Duration::from_micros(rng.below(200));
            match within_spin(rx.recv(BytesMut::zeroed(8)), wait).await {
                Some(r) => {
                    let b = r.unwrap().into_bytes();
                    let n = u64::from_le_bytes(b[..8].try_into().unwrap());
                    assert_eq!(n, next, "lost or reordered");
                    next += 1;
                }
                None => dropped += 1,
            }
        }
        sender.await.unwrap();
    }
    assert!(
        dropped > MSGS / 10,
        "{dropped} futures dropped in {rounds} rounds: the soak tested little"
    );
    let left = within_spin(rx.recv(BytesMut::zeroed(8)), Duration::from_millis(200)).await;
    assert!(left.is_none(), "a message left over: {left:?}");
}

/// RMA and atomics from a transmit context: a write, a read back and
/// fetch-adds on a peer's region over the scalable endpoint's
/// connections, each resolving its own future; the posted form completes
/// on that context's CQ alone; a wrong key is `Access`, and the context
/// carries on. The peer is a plain endpoint of another domain, then
/// another scalable endpoint.
async fn rma_and_atomics_from_a_transmit_context(p: Provider) {
    let Some(info) = p.try_info_with(EpType::Rdm, |h| {
        h.caps = Caps::MSG | Caps::TAGGED | Caps::NAMED_RX_CTX | Caps::RMA | Caps::ATOMIC;
        h.domain_attr.mr_mode =
            weft::MrMode::PROV_KEY | weft::MrMode::VIRT_ADDR | weft::MrMode::LOCAL;
        h.ep_attr.tx_ctx_cnt = CTXS;
        h.ep_attr.rx_ctx_cnt = CTXS;
    }) else {
        assert!(
            scalable_info(&p).is_none(),
            "scalable endpoints offered, but not with RMA and atomics"
        );
        return;
    };
    let h = Harness::with_info(&p, info);
    let (s, av) = sep(&h);
    let (_other, other_cq) = ctx(&h, &s, true, 0);
    let (tx, cq) = ctx(&h, &s, true, 2);
    let t = Harness::with_info(&p, p.rma_info(EpType::Rdm));
    let plain = t.rdm_ep();
    let (peer_sep, _peer_av) = sep(&h);
    const LEN: usize = 1 << 20;
    let rw = MrAccess::REMOTE_READ | MrAccess::REMOTE_WRITE;
    let targets = [
        (
            "a plain endpoint",
            &t.domain,
            plain.ep.local_addr().unwrap(),
        ),
        (
            "a scalable endpoint",
            &h.domain,
            peer_sep.local_addr().unwrap(),
        ),
    ];
    for (i, (name, domain, addr)) in targets.into_iter().enumerate() {
        let mr = domain
            .mr_regattr(MrAttr::alloc(LEN, rw).requested_key(40 + i as u64))
            .unwrap();
        let dest = av
            .insert_sync(&[addr], Default::default())
            .unwrap()
            .fi_addrs[0];
        let data = payload(300_000, i as u8 + 3);
        let e = within(
            "write",
            tx.write(dest, data.clone(), mr.addr() + 64, mr.key()),
        )
        .await
        .unwrap_or_else(|e| panic!("{name}: write {e:?}"));
        assert_eq!(e.len, data.len(), "{name}");
        let mut got = vec![0u8; data.len()];
        mr.read_at(64, &mut got).unwrap();
        assert_eq!(got, data, "{name}: the write's bytes");
        let e = within(
            "read",
            tx.read(dest, BytesMut::zeroed(data.len()), mr.addr() + 64, mr.key()),
        )
        .await
        .unwrap_or_else(|e| panic!("{name}: read {e:?}"));
        assert_eq!(&e.into_bytes()[..], &data[..], "{name}: read back");
        let at = mr.addr() + (LEN - 8) as u64;
        for k in 0..3u64 {
            let old = within("fetch-add", tx.fetch_add(dest, at, mr.key(), 5))
                .await
                .unwrap_or_else(|e| panic!("{name}: fetch-add {e:?}"));
            assert_eq!(old, 5 * k, "{name}: fetch-add {k}");
        }
        tx.post_write(dest, Bytes::from_static(b"posted"), mr.addr(), mr.key(), 77)
            .unwrap();
        let e = next_cq(&cq).await.unwrap();
        assert_eq!(e.context, 77, "{name}: the posted write's completion");
        let mut head = [0u8; 6];
        mr.read_at(0, &mut head).unwrap();
        assert_eq!(&head, b"posted", "{name}");
        let refused = within(
            "bad key",
            tx.write(dest, data.clone(), mr.addr(), mr.key() + 1000),
        )
        .await
        .unwrap_err();
        assert_eq!(refused.err, Error::Access, "{name}: a key the peer lacks");
    }
    assert_cq_quiet(&other_cq, "another transmit context's CQ").await;
    assert_cq_quiet(&cq, "the context's CQ after its futures").await;
}

provider_tests! {
    bad_input_is_refused,
    context_beyond_the_maximum_is_inval,
    rma_and_atomics_from_a_transmit_context,
    messages_land_in_the_named_context,
    unknown_context_is_dropped_and_reported,
    unnamed_contexts_take_context_0,
    dropped_futures_lose_nothing,
}

// udp and shm offer one context each way: the refusal is what is checked.
udp_tests! {
    bad_input_is_refused,
}

shm_tests! {
    bad_input_is_refused,
}
