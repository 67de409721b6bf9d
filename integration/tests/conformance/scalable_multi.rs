//! Multi-receive buffers on the receive contexts of a scalable endpoint:
//! each context is an endpoint of its own, so a buffer posted there packs
//! the messages named for that context only (eager and rendezvous
//! sizes), is released by its own `FI_OPT_MIN_MULTI_RECV`, and a dropped
//! stream's messages (those still being read included) go back to that
//! context's next receives, not to the scalable endpoint's other
//! contexts.

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use weft::{
    AddressVector, Caps, CompletionQueue, Endpoint, EpOpt, EpType, Error, FiAddr, Info, OpFlags,
    ScalableEndpoint, SendMsg,
};
use weft_integration::{assert_cq_quiet, next_cq, within, Harness, Provider};

use super::multi_recv::{number_of, numbered};
use super::scalable::{ctx, insert, scalable_info, sep, BITS, CTXS};

/// The offer for a scalable endpoint whose receive contexts take
/// multi-receive buffers, or `None` where the provider has no scalable
/// endpoints (checked by `scalable_info`); one with scalable endpoints
/// offers multi-receive on them.
fn multi_sep_info(p: &Provider) -> Option<Info> {
    let info = p.try_info_with(EpType::Rdm, |h| {
        h.caps = Caps::MSG | Caps::SOURCE | Caps::NAMED_RX_CTX | Caps::MULTI_RECV;
        h.ep_attr.tx_ctx_cnt = CTXS;
        h.ep_attr.rx_ctx_cnt = CTXS;
    });
    if info.is_none() {
        assert!(
            scalable_info(p).is_none(),
            "{}: scalable endpoints offered, but not with multi-receive",
            p.name
        );
    }
    info
}

/// A server and a client scalable endpoint of that offer, the server in
/// the client's AV.
struct Pair {
    h: Harness,
    server: ScalableEndpoint,
    client: ScalableEndpoint,
    peer: FiAddr,
    _avs: [AddressVector; 2],
}

impl Pair {
    fn open(p: &Provider) -> Option<Pair> {
        let h = Harness::with_info(p, multi_sep_info(p)?);
        let (server, server_av) = sep(&h);
        let (client, client_av) = sep(&h);
        let peer = insert(&client_av, &server);
        Some(Pair {
            h,
            server,
            client,
            peer,
            _avs: [server_av, client_av],
        })
    }

    /// The server's receive context `i`, enabled on a CQ of its own.
    fn rx(&self, i: usize) -> (Endpoint, CompletionQueue) {
        ctx(&self.h, &self.server, false, i)
    }

    /// The client's transmit context `i`, enabled on a CQ of its own.
    fn tx(&self, i: usize) -> (Endpoint, CompletionQueue) {
        ctx(&self.h, &self.client, true, i)
    }

    /// The server's receive context `i`, as the client names it.
    fn to(&self, i: u32) -> FiAddr {
        weft::rx_addr(self.peer, i, BITS)
    }
}

/// Posted buffers in two receive contexts, messages of eager and
/// rendezvous sizes named for each, interleaved: each buffer packs its
/// context's messages only, in order, and is released by its context's
/// minimum (the last completion carrying `FI_MULTI_RECV`, the credit
/// back); a message that does not fit releases the buffer without a
/// message and waits on its context, not in another's buffer.
async fn multi_recv_buffers_in_two_receive_contexts(p: Provider) {
    let Some(pair) = Pair::open(&p) else {
        return;
    };
    let (rx0, cq0) = pair.rx(0);
    let (rx1, cq1) = pair.rx(1);
    let (rx2, cq2) = pair.rx(2);
    let (tx, _tx_cq) = pair.tx(0);
    let (to1, to2) = (pair.to(1), pair.to(2));

    // What a receive context reports is what it takes.
    for rx in [&rx0, &rx1, &rx2] {
        let i = rx.info();
        assert!(i.caps.contains(Caps::MULTI_RECV));
        assert!(i.rx_attr.op_flags_supported.contains(OpFlags::MULTI_RECV));
        assert_eq!(rx.getopt(EpOpt::MinMultiRecv), Ok(16 * 1024));
    }
    // Each context has its own minimum.
    rx1.setopt(EpOpt::MinMultiRecv, 1024).unwrap();
    rx2.setopt(EpOpt::MinMultiRecv, 100).unwrap();
    assert_eq!(rx0.getopt(EpOpt::MinMultiRecv), Ok(16 * 1024));
    let (left1, left2) = (rx1.rx_size_left().unwrap(), rx2.rx_size_left().unwrap());
    // A context 0 receive that must stay untouched.
    rx0.post_recv(BytesMut::zeroed(64 << 10), 99).unwrap();

    // Context 1: 65,100 bytes of 65,536, three messages read by RDMA on
    // verbs; 436 left after the last, below 1,024. Context 2: 950 of
    // 1,000; 50 left after the last, below 100.
    let lens1 = [10_000usize, 100, 20_000, 5_000, 30_000];
    let lens2 = [300usize, 300, 300, 50];
    let at1 = rx1.post_recv_multi(BytesMut::zeroed(1 << 16), 11).unwrap();
    let at2 = rx2.post_recv_multi(BytesMut::zeroed(1000), 22).unwrap();
    for (k, &len1) in lens1.iter().enumerate() {
        let i = k as u64;
        within("send", tx.send(to1, numbered(i, len1)))
            .await
            .unwrap();
        if let Some(&len) = lens2.get(k) {
            within("send", tx.send(to2, numbered(100 + i, len)))
                .await
                .unwrap();
        }
    }
    for (cq, at, lens, first, context) in [
        (&cq1, &at1, &lens1[..], 0u64, 11u64),
        (&cq2, &at2, &lens2[..], 100, 22),
    ] {
        let mut offset = 0;
        for (k, &len) in lens.iter().enumerate() {
            let e = within("completion", next_cq(cq)).await.unwrap();
            assert_eq!((e.context, e.len), (context, len), "message {k}");
            assert_eq!(at.offset_of(&e), Some(offset), "packed: message {k}");
            assert!(e.flags.contains(OpFlags::RECV | OpFlags::MSG));
            let last = k + 1 == lens.len();
            assert_eq!(e.flags.contains(OpFlags::MULTI_RECV), last, "message {k}");
            assert_eq!(number_of(&e.bufs[0]), first + k as u64);
            offset += len;
        }
    }
    assert_eq!(rx1.rx_size_left().unwrap(), left1, "released");
    assert_eq!(rx2.rx_size_left().unwrap(), left2, "released");
    assert_cq_quiet(&cq1, "nothing after context 1's release").await;
    assert_cq_quiet(&cq2, "nothing after context 2's release").await;

    // No straddling: 600 + 600 into 1,000 on context 2.
    rx2.setopt(EpOpt::MinMultiRecv, 10).unwrap();
    let first = rx2.post_recv_multi(BytesMut::zeroed(1000), 23).unwrap();
    for i in [200, 201] {
        within("send", tx.send(to2, numbered(i, 600)))
            .await
            .unwrap();
    }
    let e = within("first", next_cq(&cq2)).await.unwrap();
    assert_eq!((e.context, e.len, first.offset_of(&e)), (23, 600, Some(0)));
    let r = within("release", next_cq(&cq2)).await.unwrap();
    assert_eq!((r.context, r.len, first.offset_of(&r)), (23, 0, Some(600)));
    assert!(r.flags.contains(OpFlags::RECV | OpFlags::MULTI_RECV));
    assert!(!r.flags.contains(OpFlags::MSG), "no message in it");
    assert_cq_quiet(&cq2, "the second message waits").await;
    // A buffer of context 1 with room does not take it.
    let other = rx1.post_recv_multi(BytesMut::zeroed(4096), 12).unwrap();
    assert_cq_quiet(&cq1, "context 1 takes nothing of context 2's").await;
    let second = rx2.post_recv_multi(BytesMut::zeroed(1000), 24).unwrap();
    let e = within("second", next_cq(&cq2)).await.unwrap();
    assert_eq!((e.context, e.len, second.offset_of(&e)), (24, 600, Some(0)));
    assert_eq!(number_of(&e.bufs[0]), 201);
    // And the other way round.
    within("send", tx.send(to1, numbered(300, 700)))
        .await
        .unwrap();
    let e = within("context 1", next_cq(&cq1)).await.unwrap();
    assert_eq!((e.context, e.len, other.offset_of(&e)), (12, 700, Some(0)));
    assert_eq!(number_of(&e.bufs[0]), 300);
    assert_cq_quiet(&cq2, "context 2 takes nothing of context 1's").await;

    assert_cq_quiet(&cq0, "context 0").await;
    assert_eq!(pair.server.stats().unwrap().rx_bad_ctx, 0);
}

/// Message `i` of `len` bytes (at least 8), cheap to make and check
/// at any size (a fill, compared whole): its number, then one byte that
/// depends on it.
fn filled(i: u64, len: usize) -> Bytes {
    let mut v = vec![(i as u8) ^ 0x5a; len.max(8)];
    v[..8].copy_from_slice(&i.to_le_bytes());
    v.into()
}

/// The number of a [`filled`] message, checking every byte of it.
fn filled_number(b: &[u8]) -> u64 {
    let i = u64::from_le_bytes(b[..8].try_into().unwrap());
    assert!(b == &filled(i, b.len())[..], "message {i} corrupted");
    i
}

/// The next message of `s` is message `i` of `len` bytes.
async fn next_is(s: &mut weft::MultiRecv, i: u64, len: usize) {
    let m = within("stream", s.next()).await.unwrap().unwrap();
    assert_eq!((filled_number(s.bytes(&m)), m.len), (i, len));
}

/// Streams on two receive contexts, one sender pipelining messages to
/// both: to context 1 small ones and ones of up to 8 MiB (read by RDMA
/// on verbs, long enough to be still arriving at the drop), every second
/// one delivery-complete (on verbs, pulled at once when it finds no
/// receive); to context 2 small and 9,000-byte ones. Context 1's stream
/// is dropped after its first message, at a point that moves by round:
/// its other messages, those still being read included, go to context
/// 1's next receives in the sender's order, while context 2's stream
/// yields all of its own and context 0's posted receives get nothing.
async fn dropped_streams_give_back_on_their_own_context(p: Provider) {
    const N: u64 = 6;
    // Context 2's numbers start here.
    const TWO: u64 = 1 << 20;
    let Some(pair) = Pair::open(&p) else {
        return;
    };
    // As large as the provider sends (rxe: 8 MiB), up to 8 MiB.
    let big = pair.h.info.ep_attr.max_msg_size.min(8 << 20);
    let (rx0, cq0) = pair.rx(0);
    let (rx1, _cq1) = pair.rx(1);
    let (rx2, _cq2) = pair.rx(2);
    let (tx, tx_cq) = pair.tx(3);
    let (to1, to2) = (pair.to(1), pair.to(2));
    for rx in [&rx1, &rx2] {
        rx.setopt(EpOpt::MinMultiRecv, 1024).unwrap();
    }
    // Would take a message sent to the wrong context.
    for c in 0..2 {
        rx0.post_recv(BytesMut::zeroed(big), 90 + c).unwrap();
    }
    let left1 = rx1.rx_size_left().unwrap();
    // The first of a round is small, the next large.
    let len1 = move |i: u64| if i % 3 == 1 { big } else { 100 };
    let len2 = |i: u64| if i % 2 == 1 { 9_000 } else { 100 };
    for round in 0..8u64 {
        let first = round * N;
        let mut s1 = within("post", rx1.recv_multi(BytesMut::zeroed(2 * big + 4096)))
            .await
            .unwrap();
        let mut s2 = within("post", rx2.recv_multi(BytesMut::zeroed(1 << 20)))
            .await
            .unwrap();
        // Posted by a task of its own while this one reads: sends of
        // large messages register them, which takes a while.
        let sender = {
            let tx = tx.clone();
            tokio::spawn(async move {
                for i in first..first + N {
                    let msg = SendMsg {
                        dest: to1,
                        iov: vec![filled(i, len1(i))],
                        context: i,
                        ..SendMsg::default()
                    };
                    let flags = if i % 2 == 1 {
                        OpFlags::COMPLETION | OpFlags::DELIVERY_COMPLETE
                    } else {
                        OpFlags::COMPLETION
                    };
                    tx.post_sendmsg(msg, flags).unwrap();
                    tx.post_send(to2, filled(TWO + i, len2(i)), TWO + i)
                        .unwrap();
                    tokio::task::yield_now().await;
                }
            })
        };
        next_is(&mut s1, first, len1(first)).await;
        // Dropped once context 2's stream has yielded none, two or five
        // of its own: its second and fifth follow a large message of
        // context 1 on the connection, which may still be being read.
        let before = [0u64, 2, 5][round as usize % 3];
        for i in first..first + before {
            next_is(&mut s2, TWO + i, len2(i)).await;
        }
        drop(s1);
        // Read side by side: the contexts share the connection, so one
        // context's messages waiting for receives may hold up the other's.
        let rest2 = async {
            for i in first + before..first + N {
                next_is(&mut s2, TWO + i, len2(i)).await;
            }
        };
        let back1 = async {
            for i in first + 1..first + N {
                let e = within("recv", rx1.recv(BytesMut::zeroed(big)))
                    .await
                    .unwrap();
                assert_eq!(
                    (filled_number(&e.bufs[0]), e.len),
                    (i, len1(i)),
                    "round {round}"
                );
            }
        };
        tokio::join!(rest2, back1);
        within("sender", sender).await.unwrap();
        s2.cancel().unwrap();
        assert!(within("end", s2.next()).await.is_none());
        assert!(s2.is_canceled());
        for _ in 0..2 * N {
            within("send", next_cq(&tx_cq)).await.unwrap();
        }
    }
    // Checked once every message is in: a part still being read at the
    // drop holds its buffer (and the credit) until it is whole.
    assert_eq!(rx1.rx_size_left().unwrap(), left1, "withdrawn");
    assert_cq_quiet(&cq0, "context 0 took another context's message").await;
    assert_eq!(pair.server.stats().unwrap().rx_bad_ctx, 0);
}

/// Cancel on a receive context releases its buffer with what it holds (a
/// `Canceled` error with `FI_MULTI_RECV` on that context's CQ; a stream
/// yields what it has and ends); closing a context mid-stream ends the
/// stream with what it had (no hang), its buffer back, while another
/// context's stream goes on.
async fn cancel_and_close_on_a_receive_context(p: Provider) {
    let Some(pair) = Pair::open(&p) else {
        return;
    };
    let (rx1, cq1) = pair.rx(1);
    let (rx2, cq2) = pair.rx(2);
    let (tx, _tx_cq) = pair.tx(0);
    let (to1, to2) = (pair.to(1), pair.to(2));
    rx1.setopt(EpOpt::MinMultiRecv, 64).unwrap();
    rx2.setopt(EpOpt::MinMultiRecv, 64).unwrap();
    let left = rx1.rx_size_left().unwrap();

    let at = rx1.post_recv_multi(BytesMut::zeroed(4096), 5).unwrap();
    for i in 0..2 {
        within("send", tx.send(to1, numbered(i, 200)))
            .await
            .unwrap();
    }
    for i in 0..2 {
        let e = within("completion", next_cq(&cq1)).await.unwrap();
        assert_eq!(number_of(&e.bufs[0]), i);
    }
    assert_eq!(rx2.cancel(5), Err(Error::NoEnt), "not context 2's");
    rx1.cancel(5).unwrap();
    let c = within("cancel", next_cq(&cq1)).await.unwrap_err();
    assert_eq!((c.context, c.err), (5, Error::Canceled));
    assert!(c.flags.contains(OpFlags::MULTI_RECV | OpFlags::RECV));
    assert_eq!((at.offset(&c.bufs[0]), c.bufs[0].len()), (Some(400), 3696));
    assert_eq!(rx1.rx_size_left().unwrap(), left, "released");
    assert_cq_quiet(&cq2, "context 2").await;

    // A stream with a small and a large message in it, cancelled.
    let buf = BytesMut::zeroed(1 << 16);
    let base = buf.as_ptr() as usize;
    let mut s = within("post", rx1.recv_multi(buf)).await.unwrap();
    within("send", tx.send(to1, numbered(2, 200)))
        .await
        .unwrap();
    within("send", tx.send(to1, numbered(3, 20_000)))
        .await
        .unwrap();
    let m = within("stream", s.next()).await.unwrap().unwrap();
    assert_eq!(number_of(s.bytes(&m)), 2);
    s.cancel().unwrap();
    let mut rest = Vec::new();
    while let Some(m) = within("stream", s.next()).await {
        let m = m.unwrap();
        rest.push((number_of(s.bytes(&m)), m.offset));
    }
    assert!(s.is_canceled());
    // The large one was in the buffer by the cancel, or waits for the
    // context's next receive.
    if rest.is_empty() {
        let e = within("recv", rx1.recv(BytesMut::zeroed(20_000)))
            .await
            .unwrap();
        assert_eq!(number_of(&e.bufs[0]), 3);
    } else {
        assert_eq!(rest, [(3, 200)]);
    }
    let whole = s.into_buffer().expect("ended");
    assert_eq!((whole.as_ptr() as usize, whole.len()), (base, 1 << 16));

    // Context 2 closed mid-stream, context 1 streaming too.
    let mut s1 = within("post", rx1.recv_multi(BytesMut::zeroed(1 << 16)))
        .await
        .unwrap();
    let mut s2 = within("post", rx2.recv_multi(BytesMut::zeroed(1 << 16)))
        .await
        .unwrap();
    within("send", tx.send(to2, numbered(10, 300)))
        .await
        .unwrap();
    let m = within("stream", s2.next()).await.unwrap().unwrap();
    assert_eq!(number_of(s2.bytes(&m)), 10);
    rx2.close().unwrap();
    let after = within("the closed context's stream", s2.next()).await;
    assert!(after.is_none(), "a message after the close: {after:?}");
    let whole = s2.into_buffer().expect("ended");
    assert_eq!(whole.len(), 1 << 16);
    assert_eq!(number_of(&whole[..300]), 10, "what it had is in it");
    assert_eq!(
        rx2.post_recv_multi(BytesMut::zeroed(4096), 1)
            .unwrap_err()
            .0,
        Error::OpBadState
    );
    for i in 20..22 {
        within("send", tx.send(to1, numbered(i, 5_000 * (i as usize - 19))))
            .await
            .unwrap();
    }
    for i in 20..22 {
        let m = within("context 1's stream", s1.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(number_of(s1.bytes(&m)), i);
    }
    drop(s1);
    assert_eq!(pair.server.stats().unwrap().rx_bad_ctx, 0);
}

provider_tests! {
    multi_recv_buffers_in_two_receive_contexts,
    dropped_streams_give_back_on_their_own_context,
    cancel_and_close_on_a_receive_context,
}
