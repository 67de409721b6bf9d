//! Posted operations on pool buffers (`Endpoint::post_send_pooled`,
//! `post_recv_pooled` and the tagged forms): completions on the bound
//! CQ with the caller's context, a receive's buffer back in its
//! completion for `BufferPool::reclaim`, a cancelled receive's in its
//! error entry, and every buffer back in its pool afterwards. On each
//! provider's connectionless type (RDM; DGRAM for udp).

use std::time::Duration;

use weft::{BindFlags, CompletionQueue, CqEntry, Error, OpFlags, FI_ADDR_UNSPEC};
use weft_integration::{next_cq, payload, within, Harness, Provider};

use super::pool::{all_back, filled};

/// The next completion of `cq`, which must be a success with `ctx`.
async fn done(cq: &CompletionQueue, ctx: u64) -> CqEntry {
    let e = within("completion", next_cq(cq)).await.unwrap();
    assert_eq!(e.context, ctx);
    e
}

/// Messages go out of pool buffers and into them, posted, untagged and
/// tagged; each receive's buffer comes back out of its completion with
/// the message, and every buffer is back in the pool afterwards.
async fn posted_round_trip(p: Provider) {
    let h = Harness::connless(&p);
    let (a, b, to_b, to_a) = h.rdm_pair();
    let pool = h.domain.buffer_pool(4, 64 << 10).unwrap();
    let max = h.info.ep_attr.max_msg_size;
    let tagged = h.info.caps.contains(weft::Caps::TAGGED);
    for (i, len) in [1usize, 64, 4096, 5000, 64 << 10]
        .into_iter()
        .filter(|&l| l <= max)
        .enumerate()
    {
        b.ep.post_recv_pooled(pool.try_get().unwrap(), 10).unwrap();
        assert_eq!(pool.stats().lent, 1, "a posted receive's buffer is lent");
        a.ep.post_send_pooled(to_b, filled(&pool, len, i as u8), 11)
            .unwrap();
        assert_eq!(done(&a.cq, 11).await.len, len);
        let mut got = done(&b.cq, 10).await;
        assert_eq!(got.len, len);
        let buf = pool.reclaim(&mut got.bufs).expect("the buffer is in bufs");
        assert!(got.bufs.is_empty());
        assert_eq!(buf.len(), len, "cut to the message");
        assert!(buf[..] == payload(len, i as u8)[..], "size {len}");
        assert_eq!(pool.stats().lent, 0);
        // Echoed back: the very buffer goes out again.
        if tagged {
            a.ep.post_trecv_pooled(pool.try_get().unwrap(), FI_ADDR_UNSPEC, 5, 0, 12)
                .unwrap();
            b.ep.post_tsend_pooled(to_a, buf, 5, 13).unwrap();
            done(&b.cq, 13).await;
            let mut back = done(&a.cq, 12).await;
            assert_eq!(back.tag, 5);
            let back = pool.reclaim(&mut back.bufs).unwrap();
            assert!(back[..] == payload(len, i as u8)[..], "echo of {len}");
        }
        all_back(&pool, "after a round trip").await;
    }
}

/// A cancelled receive's error entry carries its buffer back; a buffer
/// of another domain's pool is refused with `Inval` and handed back,
/// the send's frozen; both go back to their pools.
async fn cancel_and_refusals(p: Provider) {
    let h = Harness::connless(&p);
    let (a, b, to_b, _) = h.rdm_pair();
    let pool = h.domain.buffer_pool(2, 4096).unwrap();
    b.ep.post_recv_pooled(pool.try_get().unwrap(), 21).unwrap();
    b.ep.cancel(21).unwrap();
    let mut e = within("cancelled receive", next_cq(&b.cq))
        .await
        .unwrap_err();
    assert_eq!((e.context, e.err), (21, Error::Canceled));
    let buf = pool
        .reclaim(&mut e.bufs)
        .expect("the error entry carries it");
    assert_eq!(buf.capacity(), 4096);
    drop(buf);
    all_back(&pool, "a cancelled receive's buffer").await;

    let other = h.other_domain().buffer_pool(1, 4096).unwrap();
    let (e, back) =
        b.ep.post_recv_pooled(other.try_get().unwrap(), 22)
            .unwrap_err();
    assert_eq!(e, Error::Inval);
    assert!(back.is_some(), "the buffer comes back");
    drop(back);
    let (e, frozen) =
        a.ep.post_send_pooled(to_b, other.try_get().unwrap(), 23)
            .unwrap_err();
    assert_eq!(e, Error::Inval);
    assert_eq!(frozen.len(), 4096);
    drop(frozen);
    all_back(&other, "refused buffers").await;
    assert!(
        pool.reclaim(&mut vec![bytes::BytesMut::zeroed(4096)])
            .is_none(),
        "only its own buffers enter a pool"
    );
}

/// Buffers lent to posted receives are out of the pool: `try_get` says
/// `Again` once all are lent, `get` waits, and a reclaimed buffer dropped
/// is handed out again.
async fn exhausted_by_posted_receives(p: Provider) {
    let h = Harness::connless(&p);
    let (a, b, to_b, _) = h.rdm_pair();
    let pool = h.domain.buffer_pool(2, 4096).unwrap();
    let spare = h.domain.buffer_pool(1, 4096).unwrap();
    b.ep.post_recv_pooled(pool.try_get().unwrap(), 31).unwrap();
    b.ep.post_recv_pooled(pool.try_get().unwrap(), 32).unwrap();
    let s = pool.stats();
    assert_eq!((s.free, s.lent), (0, 2));
    assert_eq!(pool.try_get().unwrap_err(), Error::Again);
    let waiter = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.get().await.map(|b| b.capacity()) })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !waiter.is_finished(),
        "get waits while every buffer is lent"
    );
    a.ep.post_send_pooled(to_b, filled(&spare, 100, 3), 33)
        .unwrap();
    done(&a.cq, 33).await;
    let mut got = done(&b.cq, 31).await;
    drop(pool.reclaim(&mut got.bufs).unwrap());
    assert_eq!(
        within("get after a reclaim", waiter).await.unwrap(),
        Ok(4096)
    );
    b.ep.cancel(32).unwrap();
    let mut e = within("cancelled", next_cq(&b.cq)).await.unwrap_err();
    drop(pool.reclaim(&mut e.bufs).unwrap());
    all_back(&pool, "all reclaimed").await;
    all_back(&spare, "the sent buffer").await;
}

/// `fi_close` discards a posted receive without a completion: its buffer
/// stays lent (never handed out again, never freed under the device),
/// and the pool goes on with the others. Cancelled first, it comes back.
async fn close_discards_posted_receive(p: Provider) {
    let h = Harness::connless(&p);
    let (_a, b, _, _) = h.rdm_pair();
    let pool = h.domain.buffer_pool(3, 4096).unwrap();
    b.ep.post_recv_pooled(pool.try_get().unwrap(), 41).unwrap();
    b.ep.post_recv_pooled(pool.try_get().unwrap(), 42).unwrap();
    b.ep.cancel(42).unwrap();
    let mut e = within("cancelled before the close", next_cq(&b.cq))
        .await
        .unwrap_err();
    drop(pool.reclaim(&mut e.bufs).unwrap());
    b.ep.close().unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let s = pool.stats();
    assert_eq!((s.free, s.lent, s.lost), (2, 1, 0));
    let two = (pool.try_get().unwrap(), pool.try_get().unwrap());
    assert_eq!(pool.try_get().unwrap_err(), Error::Again);
    drop(two);
    assert_eq!(pool.stats().free, 2);
}

/// A posted pool receive's buffer comes back only through its
/// completion: under selective completion it is reported all the same;
/// where it could not come back the post is refused and the buffer handed
/// back — default receive flags that make a multi-receive, a peek or a
/// claim (`BadFlags`),
/// no receive CQ, only a counter (`NoCq`).
async fn receives_whose_buffer_could_not_come_back(p: Provider) {
    let h = Harness::connless(&p);
    let pool = h.domain.buffer_pool(2, 4096).unwrap();
    let a = h.rdm_ep();
    let b = h.rdm_ep_with(&h.info, h.av(), BindFlags::SELECTIVE_COMPLETION);
    let b_in_a = a.insert(&b);
    b.insert(&a);
    b.ep.post_recv_pooled(pool.try_get().unwrap(), 51).unwrap();
    a.ep.post_send_pooled(b_in_a, filled(&pool, 100, 7), 52)
        .unwrap();
    done(&a.cq, 52).await;
    let mut got = done(&b.cq, 51).await;
    let buf = pool.reclaim(&mut got.bufs);
    assert!(buf.is_some(), "reported under selective completion");
    drop(buf);
    for flags in [
        OpFlags::MULTI_RECV,
        OpFlags::PEEK,
        OpFlags::PEEK | OpFlags::CLAIM,
    ] {
        if b.ep.set_op_flags(OpFlags::RECV, flags).is_ok() {
            let (e, back) =
                b.ep.post_recv_pooled(pool.try_get().unwrap(), 53)
                    .unwrap_err();
            assert_eq!(e, Error::BadFlags, "{flags:?}");
            assert!(back.is_some(), "the buffer comes back");
        }
    }
    b.ep.set_op_flags(OpFlags::RECV, OpFlags::empty()).unwrap();
    let cntr = h.domain.counter().unwrap();
    let c = h.domain.endpoint(&h.info).unwrap();
    c.bind_av(&h.av()).unwrap();
    c.bind_cq(&h.cq(), BindFlags::TRANSMIT).unwrap();
    c.bind_counter(&cntr, BindFlags::RECV).unwrap();
    c.enable().unwrap();
    let (e, back) = c.post_recv_pooled(pool.try_get().unwrap(), 54).unwrap_err();
    assert_eq!(e, Error::NoCq);
    assert!(back.is_some(), "the buffer comes back");
    drop(back);
    all_back(&pool, "refused receives").await;
}

udp_tests! {
    posted_round_trip,
    receives_whose_buffer_could_not_come_back,
    cancel_and_refusals,
    exhausted_by_posted_receives,
    close_discards_posted_receive,
}

shm_tests! {
    posted_round_trip,
    receives_whose_buffer_could_not_come_back,
    cancel_and_refusals,
    exhausted_by_posted_receives,
    close_discards_posted_receive,
}

provider_tests! {
    posted_round_trip,
    receives_whose_buffer_could_not_come_back,
    cancel_and_refusals,
    exhausted_by_posted_receives,
    close_discards_posted_receive,
}
