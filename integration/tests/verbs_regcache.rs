//! The verbs registration cache on a real device (soft-RoCE in the VM of
//! `integration/run-rxe`): sending the same `Bytes` again reuses its
//! registration, distinct buffers past the limits evict the oldest, and
//! buffers freed and reallocated (possibly at the same address) always
//! send their own bytes.
//!
//! Outside the VM every test prints why it is skipped; inside it a missing
//! device is a failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bytes::{Bytes, BytesMut};
use weft::{EpType, FiAddr, Info, MrAccess, WaitMode};
use weft_integration::{payload, verbs_offer, verbs_offer_with, within, Node};

const SERVER_DEV: &str = "rxe1";
const CLIENT_DEV: &str = "rxe2";

/// Opens a client domain with `FI_MR_CACHE_*` set to `vars` (read when
/// the domain opens), then puts the environment back.
fn client_with(info: &Info, vars: &[(&str, &str)]) -> Node {
    for (k, v) in vars {
        std::env::set_var(k, v);
    }
    let n = Node::open(info, WaitMode::Interrupt);
    for (k, _) in vars {
        std::env::remove_var(k);
    }
    n
}

/// An RDM server on rxe1 and a client on rxe2 opened with `vars` set
/// (its registration cache reads them), each knowing the other; and the
/// client's handle of the server.
fn rdm_pair(vars: &[(&str, &str)]) -> Option<(Node, Node, FiAddr)> {
    let (si, ci) = (
        verbs_offer(SERVER_DEV, EpType::Rdm)?,
        verbs_offer(CLIENT_DEV, EpType::Rdm)?,
    );
    let s = Node::open(&si, WaitMode::Interrupt);
    let c = client_with(&ci, vars);
    let to_s = c.handle_of(&s);
    s.handle_of(&c);
    Some((s, c, to_s))
}

/// The RDM offers of server and client with RMA.
fn rma_offers() -> Option<(Info, Info)> {
    let rma = |h: &mut Info| {
        h.caps = weft::Caps::MSG | weft::Caps::TAGGED | weft::Caps::RMA;
        h.domain_attr.mr_mode = weft::MrMode::PROV_KEY | weft::MrMode::VIRT_ADDR;
    };
    Some((
        verbs_offer_with(SERVER_DEV, EpType::Rdm, rma)?,
        verbs_offer_with(CLIENT_DEV, EpType::Rdm, rma)?,
    ))
}

async fn send_checked(c: &Node, s: &Node, to_s: FiAddr, buf: &Bytes) {
    let (got, sent) = within("send", async {
        tokio::join!(
            s.ep.recv(BytesMut::zeroed(buf.len())),
            c.ep.send(to_s, buf.clone())
        )
    })
    .await;
    sent.unwrap();
    let got = got.unwrap();
    assert_eq!(got.len, buf.len());
    assert!(got.bufs[0][..] == buf[..], "received bytes differ");
}

/// Rendezvous sends (256 KiB: past the source slots, below which a
/// buffer the cache does not hold is copied, not registered) of one
/// buffer register it once; with room for two entries, a third buffer
/// evicts the least recently used.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_sends_reuse_and_evict_registrations() {
    let Some((s, c, to_s)) = rdm_pair(&[("FI_MR_CACHE_MAX_COUNT", "2")]) else {
        return;
    };
    let [a, b, d] = [1u8, 2, 3].map(|k| payload(256 << 10, k));
    for _ in 0..3 {
        send_checked(&c, &s, to_s, &a).await;
    }
    let st = c.domain.mr_cache_stats().unwrap();
    assert_eq!((st.misses, st.hits, st.entries), (1, 2, 1), "{st:?}");
    send_checked(&c, &s, to_s, &b).await;
    send_checked(&c, &s, to_s, &a).await;
    send_checked(&c, &s, to_s, &d).await; // evicts b
    send_checked(&c, &s, to_s, &a).await;
    send_checked(&c, &s, to_s, &b).await; // registered again
    let st = c.domain.mr_cache_stats().unwrap();
    assert_eq!((st.misses, st.hits, st.evictions), (4, 4, 2), "{st:?}");
    assert_eq!((st.entries, st.bytes), (2, 512 << 10));
}

/// Buffers allocated, sent and dropped in a loop: evicted entries free
/// their memory, the allocator hands the same addresses out again with
/// new contents, and every send carries the new bytes.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freed_and_reallocated_buffers_send_their_own_bytes() {
    let Some((s, c, to_s)) = rdm_pair(&[("FI_MR_CACHE_MAX_COUNT", "1")]) else {
        return;
    };
    let mut addrs = std::collections::HashSet::new();
    let mut reused = 0;
    for k in 0..24u8 {
        let buf = Bytes::from(payload(256 << 10, k).to_vec());
        if !addrs.insert(buf.as_ptr() as usize) {
            reused += 1;
        }
        send_checked(&c, &s, to_s, &buf).await;
    }
    eprintln!("addresses seen again: {reused} of 24");
    let st = c.domain.mr_cache_stats().unwrap();
    assert_eq!((st.misses, st.entries), (24, 1), "{st:?}");
}

/// `FI_MR_CACHE_MONITOR=disabled` registers every time; RMA writes from
/// one buffer hit the cache like sends.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabled_cache_and_rma_writes() {
    let Some((si, ci)) = rma_offers() else {
        return;
    };
    let s = Node::open(&si, WaitMode::Interrupt);
    let off = client_with(&ci, &[("FI_MR_CACHE_MONITOR", "disabled")]);
    let on = Node::open(&ci, WaitMode::Interrupt);
    let mr = s
        .domain
        .mr_alloc(1 << 20, MrAccess::REMOTE_WRITE | MrAccess::REMOTE_READ)
        .unwrap();
    let data = payload(512 << 10, 7);
    for c in [&off, &on] {
        let to_s = c.handle_of(&s);
        for _ in 0..3 {
            within("write", c.ep.write(to_s, data.clone(), mr.addr(), mr.key()))
                .await
                .unwrap();
        }
        assert!(mr.to_vec().unwrap()[..data.len()] == data[..]);
    }
    let st = off.domain.mr_cache_stats().unwrap();
    assert_eq!((st.hits, st.entries), (0, 0), "{st:?}");
    let st = on.domain.mr_cache_stats().unwrap();
    assert_eq!((st.misses, st.hits), (1, 2), "{st:?}");
}

/// RMA writes from and reads into pool buffers (`Domain::buffer_pool`)
/// use the pool's registration: the registration cache sees no lookup,
/// small reads need no bounce slot, and the bytes arrive intact.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_rma_registers_nothing() {
    let Some((si, ci)) = rma_offers() else {
        return;
    };
    let s = Node::open(&si, WaitMode::Interrupt);
    let c = Node::open(&ci, WaitMode::Interrupt);
    let to_s = c.handle_of(&s);
    let mr = s
        .domain
        .mr_alloc(2 << 20, MrAccess::REMOTE_WRITE | MrAccess::REMOTE_READ)
        .unwrap();
    let pool = c.domain.buffer_pool(2, 1 << 20).unwrap();
    for (i, len) in [100usize, 4096, 1 << 20].into_iter().enumerate() {
        let mut b = pool.try_get().unwrap();
        b.set_len(len).unwrap();
        b.copy_from_slice(&payload(len, i as u8));
        within(
            "pool write",
            c.ep.write_pooled(to_s, b, mr.addr(), mr.key()),
        )
        .await
        .unwrap();
        let mut r = pool.try_get().unwrap();
        r.set_len(len).unwrap();
        let got = within("pool read", c.ep.read_pooled(to_s, r, mr.addr(), mr.key()))
            .await
            .unwrap();
        assert!(got.buf[..] == payload(len, i as u8)[..], "{len} bytes");
    }
    let st = c.domain.mr_cache_stats().unwrap();
    assert_eq!((st.hits, st.misses), (0, 0), "{st:?}");
}
