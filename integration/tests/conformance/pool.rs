//! Registered buffer pools (`Domain::buffer_pool`, `fi_mr_desc`
//! semantics): buffers handed out and back as owned values, bounded, of
//! one domain only, and usable for sends, receives and RMA on every
//! provider (registered once on verbs, plain memory on tcp and udp). The
//! message tests run on each provider's connectionless type (RDM; DGRAM
//! for udp).

use std::time::Duration;

use bytes::BytesMut;
use weft::{BufferPool, EpType, Error, MrAccess, MrAttr, PoolBuf};
use weft_integration::{payload, within, Harness, Provider};

const RW: MrAccess = MrAccess::REMOTE_READ.union(MrAccess::REMOTE_WRITE);

/// Waits (bounded) until every buffer of `pool` is back (none lost, none
/// lent to a posted receive).
pub(super) async fn all_back(pool: &BufferPool, what: &str) {
    within(what, async {
        loop {
            let s = pool.stats();
            if s.free == s.count {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let s = pool.stats();
    assert_eq!((s.lost, s.lent), (0, 0), "{what}");
}

pub(super) fn filled(pool: &BufferPool, len: usize, seed: u8) -> PoolBuf {
    let mut b = pool.try_get().unwrap();
    b.set_len(len).unwrap();
    b.copy_from_slice(&payload(len, seed));
    b
}

/// Sizes around the inline, slot and rendezvous limits go out of pool
/// buffers and into pool buffers intact; the receive's buffer comes back
/// cut to the message, and every buffer is back in its pool afterwards.
async fn round_trip(p: Provider) {
    let h = Harness::connless(&p);
    let (a, b, to_b, _) = h.rdm_pair();
    let pool = h.domain.buffer_pool(4, 256 << 10).unwrap();
    assert_eq!(pool.buf_size(), 256 << 10);
    assert_eq!(pool.domain_fid(), h.domain.fid());
    let max = h.info.ep_attr.max_msg_size;
    for (i, len) in [1usize, 100, 4096, 5000, 65_536, 256 << 10]
        .into_iter()
        .filter(|&l| l <= max)
        .enumerate()
    {
        let out = filled(&pool, len, i as u8);
        assert_eq!(out.desc(), pool.desc());
        let rbuf = pool.try_get().unwrap();
        assert_eq!(rbuf.len(), 256 << 10, "handed out at full size");
        let (got, sent) = within("pool send and receive", async {
            tokio::join!(b.ep.recv_pooled(rbuf), a.ep.send_pooled(to_b, out))
        })
        .await;
        assert_eq!(sent.unwrap().len, len);
        let got = got.unwrap();
        assert_eq!(got.entry.len, len);
        assert!(got.entry.bufs.is_empty());
        assert!(got.buf[..] == payload(len, i as u8)[..], "size {len}");
        drop(got);
        all_back(&pool, "after a round trip").await;
    }
    // Messages that arrive before the pool receive is posted.
    for len in [100usize, 65_536].into_iter().filter(|&l| l <= max) {
        let rbuf = pool.try_get().unwrap();
        let late = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            b.ep.recv_pooled(rbuf).await
        };
        let (got, sent) = within("unexpected message into a pool buffer", async {
            tokio::join!(late, a.ep.send_pooled(to_b, filled(&pool, len, 7)))
        })
        .await;
        sent.unwrap();
        assert!(got.unwrap().buf[..] == payload(len, 7)[..], "late {len}");
        all_back(&pool, "after a late receive").await;
    }
    // A frozen buffer goes through the ordinary calls too.
    let frozen = filled(&pool, 3000, 9).freeze();
    let (got, sent) = tokio::join!(b.ep.recv(BytesMut::zeroed(4096)), a.ep.send(to_b, frozen));
    sent.unwrap();
    assert_eq!(&got.unwrap().into_bytes()[..], &payload(3000, 9)[..]);
    all_back(&pool, "after a frozen send").await;
}

/// The pool is bounded: `try_get` says `Again` when it is empty, `get`
/// waits for a buffer to come back, and a dropped buffer is handed out
/// again.
async fn bounded_and_returned_on_drop(p: Provider) {
    let h = Harness::connless(&p);
    let pool = h.domain.buffer_pool(3, 4096).unwrap();
    let mut held: Vec<PoolBuf> = (0..3).map(|_| pool.try_get().unwrap()).collect();
    assert_eq!(pool.try_get().unwrap_err(), Error::Again);
    assert_eq!(pool.stats().free, 0);
    let mut one = held.pop().unwrap();
    one[..4].copy_from_slice(b"kept");
    one.set_len(4).unwrap();
    assert_eq!(one.set_len(4097).unwrap_err(), Error::Inval);
    drop(one);
    let again = pool.try_get().unwrap();
    assert_eq!(again.len(), 4096);
    let waiter = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.get().await.map(|b| b.len()) })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiter.is_finished(), "get waits while the pool is empty");
    drop(again);
    let got = within("get after a return", waiter).await.unwrap();
    assert_eq!(got.unwrap(), 4096);
    drop(held);
    all_back(&pool, "all dropped").await;
}

/// A receive whose future is dropped before a message arrives is
/// withdrawn and its buffer comes back; one dropped after its message
/// arrived hands the message on to the next receive. Nothing is lost.
async fn dropped_futures_return_buffers(p: Provider) {
    let h = Harness::connless(&p);
    let (a, b, to_b, _) = h.rdm_pair();
    let pool = h.domain.buffer_pool(2, 8192).unwrap();
    // Nothing arrives: withdrawn.
    let r = tokio::time::timeout(
        Duration::from_millis(50),
        b.ep.recv_pooled(pool.try_get().unwrap()),
    )
    .await;
    assert!(r.is_err(), "no message was sent");
    all_back(&pool, "a withdrawn receive's buffer").await;
    // A message reaches the receive, whose future is then dropped.
    let mut fut = Box::pin(b.ep.recv_pooled(pool.try_get().unwrap()));
    assert!(futures::poll!(fut.as_mut()).is_pending());
    a.ep.send(to_b, payload(6000, 4)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(fut);
    all_back(&pool, "a receive dropped after its message").await;
    let got = within("the message handed on", b.ep.recv(BytesMut::zeroed(8192)))
        .await
        .unwrap();
    assert_eq!(&got.into_bytes()[..], &payload(6000, 4)[..]);
    // A send's future never polled: nothing sent, the buffer is back.
    drop(a.ep.send_pooled(to_b, filled(&pool, 7000, 5)));
    all_back(&pool, "an unpolled send").await;
    // One dropped once posted: the send finishes, then the buffer is back.
    let mut send = Box::pin(a.ep.send_pooled(to_b, filled(&pool, 7000, 5)));
    let _ = futures::poll!(send.as_mut());
    drop(send);
    let got = within(
        "a send whose future went",
        b.ep.recv(BytesMut::zeroed(8192)),
    )
    .await
    .unwrap();
    assert_eq!(&got.into_bytes()[..], &payload(7000, 5)[..]);
    all_back(&pool, "after the sends").await;
}

/// A buffer of another domain's pool means nothing here: `Inval`, and
/// the buffer goes back to its own pool.
async fn other_domains_buffers_are_refused(p: Provider) {
    let h = Harness::connless(&p);
    let (a, _b, to_b, _) = h.rdm_pair();
    let other = h.other_domain();
    let pool = other.buffer_pool(2, 4096).unwrap();
    let e = a.ep.send_pooled(to_b, pool.try_get().unwrap()).await;
    assert_eq!(e.unwrap_err().err, Error::Inval);
    let e = a.ep.recv_pooled(pool.try_get().unwrap()).await;
    assert_eq!(e.unwrap_err().err, Error::Inval);
    let e = a.ep.read_pooled(to_b, pool.try_get().unwrap(), 0, 1).await;
    assert_eq!(e.unwrap_err().err, Error::Inval);
    all_back(&pool, "refused buffers").await;
    assert_eq!(h.domain.buffer_pool(0, 8).unwrap_err(), Error::Inval);
    assert_eq!(h.domain.buffer_pool(8, 0).unwrap_err(), Error::Inval);
}

/// RMA writes from and reads into pool buffers, small and large.
async fn rma_from_pool_buffers(p: Provider) {
    let h = Harness::with_info(&p, p.rma_info(EpType::Rdm));
    let (a, _b, to_b, _) = h.rdm_pair_with(&h.info);
    let pool = h.domain.buffer_pool(2, 1 << 20).unwrap();
    let mr = h
        .domain
        .mr_regattr(MrAttr::alloc(2 << 20, RW).requested_key(31))
        .unwrap();
    for (i, len) in [64usize, 4096, 1 << 20].into_iter().enumerate() {
        let at = mr.addr() + (i as u64) * 4096;
        let e = within(
            "pool write",
            a.ep.write_pooled(to_b, filled(&pool, len, i as u8), at, mr.key()),
        )
        .await
        .unwrap();
        assert_eq!(e.len, len);
        let mut back = pool.try_get().unwrap();
        back.set_len(len).unwrap();
        let r = within("pool read", a.ep.read_pooled(to_b, back, at, mr.key()))
            .await
            .unwrap();
        assert_eq!(r.entry.len, len);
        assert!(r.buf[..] == payload(len, i as u8)[..], "read of {len}");
    }
    all_back(&pool, "after RMA").await;
}

// udp: the same on DGRAM endpoints (plain memory; no RMA).
udp_tests! {
    round_trip,
    bounded_and_returned_on_drop,
    dropped_futures_return_buffers,
    other_domains_buffers_are_refused,
}

provider_tests! {
    round_trip,
    bounded_and_returned_on_drop,
    dropped_futures_return_buffers,
    other_domains_buffers_are_refused,
    rma_from_pool_buffers,
}
