//! Multi-receive soak: 10,000 messages of random sizes from two senders
//! (tcp; 3,000 on verbs RDM, in the rxe VM; 6,000 on shm, up to 40 KB, so
//! past the cross-memory attach threshold) through multi-receive
//! streams, some of them dropped or cancelled part-way; every message
//! arrives exactly once and in its sender's order. One buffer is posted
//! at a time: with one receive outstanding a dropped one's unread
//! messages keep their place exactly (docs/design.md, "Dropped
//! receives"). On verbs, sizes reach past the eager limit (4 KiB), so
//! large messages are read by RDMA while small ones after them are in
//! already.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use weft::{EpOpt, EpType};
use weft_integration::{within, Harness, Provider, Rng};

/// How much one soak sends.
#[derive(Clone, Copy)]
struct Load {
    /// Messages per sender.
    per_sender: u64,
    /// Largest message.
    max_msg: u64,
    /// Buffer size.
    buf: usize,
}

const TCP: Load = Load {
    per_sender: 5_000,
    max_msg: 4_000,
    buf: 32 * 1024,
};
/// Fewer, as the VM is slow; up to three times the eager limit.
const VERBS: Load = Load {
    per_sender: 1_500,
    max_msg: 12_000,
    buf: 64 * 1024,
};
/// shm: sizes past 16 KiB, read from the sender's memory where the
/// kernel permits it (else copied through the ring in several records),
/// while small ones follow.
const SHM: Load = Load {
    per_sender: 3_000,
    max_msg: 40_000,
    buf: 128 * 1024,
};
const MIN: usize = 4 * 1024;

/// Message `i` of sender `s`, `len` bytes (at least 16): sender, number,
/// then bytes that depend on both.
fn message(s: u64, i: u64, len: usize) -> Bytes {
    let mut v = s.to_le_bytes().to_vec();
    v.extend(i.to_le_bytes());
    v.extend((16..len).map(|k| (k as u8).wrapping_mul(29) ^ (i as u8) ^ (s as u8) << 4));
    v.into()
}

/// Sender and number of a received message, every byte checked.
fn id_of(b: &[u8]) -> (u64, u64) {
    let s = u64::from_le_bytes(b[..8].try_into().unwrap());
    let i = u64::from_le_bytes(b[8..16].try_into().unwrap());
    assert_eq!(b, &message(s, i, b.len())[..], "message {s}/{i} corrupted");
    (s, i)
}

async fn soak(p: Provider, load: Load) {
    if !p.usable() {
        return;
    }
    let Load {
        per_sender,
        max_msg,
        buf,
    } = load;
    let h = Harness::new(&p, EpType::Rdm);
    let b = h.rdm_ep();
    b.ep.setopt(EpOpt::MinMultiRecv, MIN).unwrap();
    let mut rng = Rng::seeded("WEFT_MULTI_SEED");
    let mut senders = Vec::new();
    for s in 0..2u64 {
        let a = h.rdm_ep();
        let dest = a.insert(&b);
        b.insert(&a);
        let sizes: Vec<usize> = (0..per_sender)
            .map(|_| 16 + rng.below(max_msg - 16) as usize)
            .collect();
        senders.push(tokio::spawn(async move {
            let ep = a.ep.clone();
            let sends = futures::stream::iter(sizes.into_iter().enumerate())
                .map(|(i, len)| ep.send(dest, message(s, i as u64, len)))
                .buffered(16);
            sends
                .for_each(|r| async move {
                    r.unwrap();
                })
                .await;
            a
        }));
    }
    let mut next = [0u64; 2];
    let total = 2 * per_sender;
    let mut got = 0;
    let (mut streams, mut dropped, mut cancelled) = (0, 0, 0);
    while got < total {
        let mut s = within("post", b.ep.recv_multi(BytesMut::zeroed(buf)))
            .await
            .unwrap();
        streams += 1;
        // Read some of it, all of it, or drop or cancel it part-way.
        let fate = rng.below(6);
        let stop_after = rng.below(12);
        let mut read = 0;
        loop {
            if got == total {
                break;
            }
            if fate == 0 && read == stop_after {
                dropped += 1;
                break;
            }
            if fate == 1 && read == stop_after {
                s.cancel().ok();
                cancelled += 1;
            }
            let Some(m) = within("stream", s.next()).await else {
                break;
            };
            let m = m.unwrap();
            assert!(!s.bytes(&m).is_empty(), "{m:?} has no bytes in {s:?}");
            let (sender, i) = id_of(s.bytes(&m));
            assert_eq!(i, next[sender as usize], "sender {sender}: out of order");
            next[sender as usize] += 1;
            got += 1;
            read += 1;
        }
        drop(s);
    }
    for t in senders {
        within("senders", t).await.unwrap();
    }
    assert_eq!(next, [per_sender, per_sender]);
    // Nothing left over: no message arrived twice.
    assert_eq!(b.ep.stats().unwrap().unexpected_bytes, 0);
    eprintln!("{streams} streams, {dropped} dropped, {cancelled} cancelled");
    assert!(dropped > 0 && cancelled > 0);
}

#[tokio::test(flavor = "current_thread")]
async fn ten_thousand_messages_exactly_once_in_order_current_thread() {
    soak(Provider::named("tcp"), TCP).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_messages_exactly_once_in_order_multi_thread() {
    soak(Provider::named("tcp"), TCP).await;
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "current_thread")]
async fn verbs_rdm_messages_exactly_once_in_order_current_thread() {
    soak(Provider::named("verbs"), VERBS).await;
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verbs_rdm_messages_exactly_once_in_order_multi_thread() {
    soak(Provider::named("verbs"), VERBS).await;
}

#[tokio::test(flavor = "current_thread")]
async fn shm_messages_exactly_once_in_order_current_thread() {
    soak(Provider::named("shm"), SHM).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shm_messages_exactly_once_in_order_multi_thread() {
    soak(Provider::named("shm"), SHM).await;
}
