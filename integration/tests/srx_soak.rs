//! Nothing silently lost through a shared receive context on shm (RDM),
//! verbs (RDM, in the VM of `integration/run-rxe`) and udp (DGRAM): two peers each send numbered messages to their own
//! endpoint bound to the context, while the receiver awaits each
//! receive on the context under a random timeout of 0–200 µs and drops
//! the receive's future when the time is up. A dropped future withdraws
//! its receive from the context, or gives the message that reached it
//! back to the head of the held ones (through the endpoint it arrived
//! at), so each peer's messages arrive exactly once and in order.
//!
//! shm and verbs lose nothing: every message must arrive. udp may in principle
//! lose a datagram even on loopback (a full socket buffer): the senders
//! stay within a window of the receiver, and what is checked is that
//! every datagram delivered is delivered once and in its sender's order,
//! that hardly any is missing, and that nothing is left over.
//!
//! Each soak runs on a current-thread runtime (the thread that drops a
//! future is the one that hands completions over) and on a multi-thread
//! one (a completion can reach a future just before another thread drops
//! it). Loopback only; bounded counts and time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use weft::{CqEntry, SharedRxContext, SHARED_CONTEXT};
use weft_integration::srx::srx_rdm_ep;
use weft_integration::{
    assert_cq_quiet, under_timeout, within, Harness, Provider, RdmEp, Rng, SoakWindow, Until, QUIET,
};

/// Bytes per message.
const MSG_LEN: usize = 64;
/// Peers, each sending to its own bound endpoint.
const PEERS: usize = 2;
/// Messages per peer.
const PER_PEER: u64 = 2_000;
/// How long a soak may go without a message before its end is declared
/// (udp) or it is failed as hung (shm, verbs): longer in the VM of
/// `integration/run-rxe`, whose full emulation makes connecting slow.
fn stall() -> Duration {
    if std::env::var_os("RXE_VM").is_some() {
        Duration::from_secs(10)
    } else {
        Duration::from_secs(2)
    }
}

/// Peer `k`'s message `i`: both numbers, then bytes that depend on them.
fn numbered(k: usize, i: u64) -> Bytes {
    let mut v = i.to_le_bytes().to_vec();
    v.push(k as u8);
    v.extend((9..MSG_LEN).map(|j| (j as u8).wrapping_mul(7) ^ i as u8 ^ k as u8));
    v.into()
}

/// The peer and number of a received message, checking every byte.
fn number(e: CqEntry) -> (usize, u64) {
    let b = e.into_bytes();
    assert_eq!(b.len(), MSG_LEN, "length of a received message");
    let i = u64::from_le_bytes(b[..8].try_into().unwrap());
    let k = b[8] as usize;
    assert!(k < PEERS, "peer {k}");
    assert_eq!(
        &b[..],
        &numbered(k, i)[..],
        "bytes of peer {k}'s message {i}"
    );
    (k, i)
}

/// The context, its bound endpoints and the peers, of `name`.
struct Rig {
    srx: SharedRxContext,
    servers: Vec<RdmEp>,
    _h: Harness,
}

fn rig(name: &'static str) -> (Rig, Vec<(RdmEp, weft::FiAddr)>) {
    let p = Provider::named(name);
    let info = p
        .try_info_with(p.connless_type(), |h| h.ep_attr.rx_ctx_cnt = SHARED_CONTEXT)
        .unwrap_or_else(|| panic!("{name} offers shared receive contexts"));
    let h = Harness::with_info(&p, info);
    let srx = h.domain.srx_context(0).unwrap();
    let av = h.av();
    let servers: Vec<RdmEp> = (0..PEERS)
        .map(|_| srx_rdm_ep(&h, &av, &h.cq(), &srx, None))
        .collect();
    let peers = servers
        .iter()
        .map(|s| {
            let c = h.rdm_ep();
            let to = c.insert(s);
            (c, to)
        })
        .collect();
    (
        Rig {
            srx,
            servers,
            _h: h,
        },
        peers,
    )
}

/// What a soak saw: each peer's numbers in arrival order, what each peer
/// sent, and how many receives were withdrawn by their timeout.
struct Soak {
    got: Vec<Vec<u64>>,
    sent: Vec<u64>,
    withdrawn: u64,
    took: Duration,
}

/// Runs the soak on `name` with the senders at most `window` messages
/// ahead of the receiver. `lossy`: the end is a quiet spell after the
/// senders finished (or stalled on a window that lost datagrams), not
/// the last message.
async fn soak(name: &'static str, window: usize, lossy: bool) -> (Rig, Soak) {
    let (r, peers) = rig(name);
    let mut rng = Rng::seeded("WEFT_CANCEL_SEED");
    let mut window = SoakWindow::new(window);
    let sent: Arc<Vec<AtomicU64>> = Arc::new((0..PEERS).map(|_| AtomicU64::new(0)).collect());
    let senders: Vec<_> = peers
        .into_iter()
        .enumerate()
        .map(|(k, (c, to))| {
            let (permits, sent) = (window.permits.clone(), sent.clone());
            let mut gaps = Rng(rng.0.rotate_left(17 + k as u32) | 1);
            tokio::spawn(async move {
                for i in 0..PER_PEER {
                    permits.acquire().await.unwrap().forget();
                    Until(Instant::now() + Duration::from_micros(gaps.below(101))).await;
                    c.ep.send(to, numbered(k, i))
                        .await
                        .unwrap_or_else(|e| panic!("peer {k}: send of {i}: {e:?}"));
                    sent[k].store(i + 1, Ordering::Release);
                }
                c
            })
        })
        .collect();
    let total = PEERS as u64 * PER_PEER;
    let start = Instant::now();
    let mut got = vec![Vec::new(); PEERS];
    let mut n = 0u64;
    let mut withdrawn = 0;
    let mut progress = Instant::now();
    while n < total {
        if progress.elapsed() > stall() {
            if lossy {
                break;
            }
            panic!(
                "stalled: {n} of {total} after {withdrawn} withdrawn receives; context {:?}",
                r.srx.stats()
            );
        }
        let buf = BytesMut::zeroed(MSG_LEN);
        match under_timeout(r.srx.recv(buf), rng.below(201)).await {
            Some(Ok(e)) => {
                let (k, i) = number(e);
                got[k].push(i);
                n += 1;
                progress = Instant::now();
                window.delivered();
            }
            Some(Err(e)) => panic!("receive {n} failed: {e:?}"),
            None => {
                withdrawn += 1;
                window.withdrawn();
            }
        }
    }
    window.withdrawn();
    for s in senders {
        if lossy && !s.is_finished() {
            // Stalled on a window that lost datagrams: what it sent counts.
            s.abort();
            continue;
        }
        within("a sender", s).await.unwrap();
    }
    let sent = sent.iter().map(|s| s.load(Ordering::Acquire)).collect();
    let s = Soak {
        got,
        sent,
        withdrawn,
        took: start.elapsed(),
    };
    (r, s)
}

/// Each peer's messages arrived once and in order, all of them unless
/// `lossy` (then nearly all), and enough receives were withdrawn for the
/// soak to mean something.
fn check(what: &str, s: &Soak, lossy: bool) {
    let delivered: u64 = s.got.iter().map(|g| g.len() as u64).sum();
    let sent: u64 = s.sent.iter().sum();
    eprintln!(
        "{what}: {sent} sent, {delivered} delivered, {} receives withdrawn by their timeout, {:.2?}",
        s.withdrawn, s.took
    );
    for (k, g) in s.got.iter().enumerate() {
        assert!(
            g.windows(2).all(|p| p[0] < p[1]),
            "{what}: peer {k}'s messages repeated or out of order"
        );
        assert!(
            g.last().is_none_or(|&l| l < s.sent[k]),
            "{what}: peer {k}: a message that was never sent"
        );
        if !lossy {
            assert_eq!(
                g,
                &(0..PER_PEER).collect::<Vec<_>>(),
                "{what}: peer {k}: every message once"
            );
        }
    }
    // Loopback loses a datagram only when a socket buffer overflows,
    // which the window keeps from happening: a loss here is worth a look.
    assert!(
        delivered * 100 >= sent * 99,
        "{what}: {} of {sent} lost",
        sent - delivered
    );
    assert!(
        s.withdrawn >= delivered / 50,
        "{what}: only {} receives timed out; the soak withdrew too few to mean anything",
        s.withdrawn
    );
}

/// Nothing left over: a last receive gets nothing, every receive credit
/// is back, nothing is held, and no receive completed on an endpoint's
/// CQ behind its future's back.
async fn nothing_left(what: &str, r: &Rig) {
    let left = tokio::time::timeout(QUIET, r.srx.recv(BytesMut::zeroed(MSG_LEN))).await;
    assert!(left.is_err(), "{what}: left over after the soak: {left:?}");
    assert_eq!(
        r.srx.rx_size_left().unwrap(),
        r.srx.attr().size,
        "{what}: every withdrawn receive gave its credit back"
    );
    assert_eq!(r.srx.stats().unexpected_bytes, 0, "{what}: nothing held");
    for s in &r.servers {
        assert_cq_quiet(&s.cq, "an endpoint's CQ after the soak").await;
    }
}

/// A short window: both deliver within microseconds on loopback, so
/// senders far ahead would leave a message waiting for every receive and
/// few receives would time out.
const WINDOW: usize = 4;

async fn shm_soak() {
    let (r, s) = soak("shm", WINDOW, false).await;
    check("shm RDM shared context", &s, false);
    nothing_left("shm RDM shared context", &r).await;
}

async fn udp_soak() {
    let (r, s) = soak("udp", WINDOW, true).await;
    check("udp DGRAM shared context", &s, true);
    nothing_left("udp DGRAM shared context", &r).await;
}

#[tokio::test]
async fn shm_srx_dropped_receives_lose_nothing() {
    shm_soak().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shm_srx_dropped_receives_lose_nothing_multi_thread() {
    shm_soak().await;
}

async fn verbs_soak() {
    let (r, s) = soak("verbs", WINDOW, false).await;
    check("verbs RDM shared context", &s, false);
    nothing_left("verbs RDM shared context", &r).await;
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test]
async fn verbs_srx_dropped_receives_lose_nothing() {
    verbs_soak().await;
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verbs_srx_dropped_receives_lose_nothing_multi_thread() {
    verbs_soak().await;
}

#[tokio::test]
async fn udp_srx_dropped_receives_lose_nothing() {
    udp_soak().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_srx_dropped_receives_lose_nothing_multi_thread() {
    udp_soak().await;
}
