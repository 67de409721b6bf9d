//! Progress in the busy-poll and inline wait modes: exchanges of small and
//! large messages, and who delivers when nobody or only `cq.read` drives.

use bytes::{Bytes, BytesMut};
use weft::{FiAddr, WaitMode, FI_ADDR_UNSPEC};

use super::{addr_of, open, open_with, setup, to, Ep, T};

pub(super) async fn exchange(a: &Ep, b: &Ep, n: usize, len: usize, tag_base: u64) {
    let to_b = addr_of(a, b);
    let to_a = addr_of(b, a);
    let run = |src: &Ep, dst: &Ep, dest: FiAddr| {
        let s = src.ep.clone();
        let r = dst.ep.clone();
        async move {
            let send = async {
                for i in 0..n {
                    let mut p = vec![i as u8; len.max(8)];
                    p[..8].copy_from_slice(&(i as u64).to_le_bytes());
                    s.tsend(dest, Bytes::from(p), tag_base + i as u64)
                        .await
                        .unwrap();
                }
            };
            let recv = async {
                for i in 0..n {
                    let got = r
                        .trecv(BytesMut::zeroed(len.max(8)), FI_ADDR_UNSPEC, 0, u64::MAX)
                        .await
                        .unwrap();
                    assert_eq!(
                        got.tag,
                        tag_base + i as u64,
                        "lost, duplicated or reordered"
                    );
                    let b = got.into_bytes();
                    assert_eq!(u64::from_le_bytes(b[..8].try_into().unwrap()), i as u64);
                    assert!(b[8..].iter().all(|&x| x == i as u8));
                }
            };
            tokio::join!(send, recv);
        }
    };
    to(async { tokio::join!(run(a, b, to_b), run(b, a, to_a)) }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn busy_poll_endpoints_exchange_small_and_large() {
    let (domain, info) = setup();
    let a = open_with(&domain, &info, WaitMode::BusyPoll);
    let b = open_with(&domain, &info, WaitMode::BusyPoll);
    exchange(&a, &b, 500, 64, 0).await;
    // Large enough for the direct-read path.
    exchange(&a, &b, 8, 1 << 20, 1000).await;
    // Mixed: a busy-poll endpoint and an interrupt one.
    let c = open(&domain, &info);
    exchange(&a, &c, 200, 100, 2000).await;
    assert_eq!(a.ep.tx_size_left().unwrap(), info.tx_attr.size);
    assert_eq!(a.ep.rx_size_left().unwrap(), info.rx_attr.size);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inline_endpoints_exchange_small_and_large() {
    let (domain, info) = setup();
    let a = open_with(&domain, &info, WaitMode::Inline);
    let b = open_with(&domain, &info, WaitMode::Inline);
    exchange(&a, &b, 500, 64, 0).await;
    exchange(&a, &b, 8, 1 << 20, 1000).await;
    let c = open(&domain, &info);
    exchange(&a, &c, 200, 100, 2000).await;
    assert_eq!(a.ep.tx_size_left().unwrap(), info.tx_attr.size);
    assert_eq!(b.ep.rx_size_left().unwrap(), info.rx_attr.size);
}

/// Messages in a burst of [`connected_burst`].
const N: u64 = 100;

/// Two endpoints in `mode`, connected (set-up runs on the reactor), with
/// `n` 64-byte tagged receives posted on `b` (context = tag = i) and `n`
/// sends of byte `i` posted from `a`; nothing has been read yet.
async fn connected_burst(mode: WaitMode, n: u64) -> (Ep, Ep) {
    let (domain, info) = setup();
    let a = open_with(&domain, &info, mode);
    let b = open_with(&domain, &info, mode);
    exchange(&a, &b, 1, 64, 0).await;
    let to_b = addr_of(&a, &b);
    for i in 0..n {
        b.ep.post_trecv(BytesMut::zeroed(64), FI_ADDR_UNSPEC, i, 0, i)
            .unwrap();
    }
    for i in 0..n {
        a.ep.post_tsend(to_b, Bytes::from(vec![i as u8; 64]), i, 1000 + i)
            .unwrap();
    }
    (a, b)
}

/// Inline progress is manual progress: on a single-threaded runtime that
/// is never given back, the reactor cannot run, so only `cq.read` driving
/// the endpoint can deliver these messages.
#[test]
fn inline_cq_read_alone_makes_progress() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (a, b) = connected_burst(WaitMode::Inline, N).await;
        // From here on nothing awaits.
        let deadline = std::time::Instant::now() + T;
        let (mut sent, mut got) = (0u64, 0u64);
        while sent < N || got < N {
            assert!(
                std::time::Instant::now() < deadline,
                "no progress: sent {sent}, got {got}"
            );
            if let Ok(es) = a.cq.read(16) {
                sent += es.len() as u64;
            }
            if let Ok(es) = b.cq.read(16) {
                for e in es {
                    assert_eq!(e.context, got, "in order");
                    let buf = e.bufs.first().cloned().unwrap();
                    assert!(buf.iter().all(|&x| x == got as u8));
                    got += 1;
                }
            }
        }
    });
}

/// Busy-poll without a waiter: once the last waiter's hold has lapsed, the
/// endpoint's own thread delivers. The runtime's only thread is blocked in
/// `std::thread::sleep` and nothing reads the queue until every message is
/// in it, so neither the reactor nor a waiter can be the one that did it.
#[test]
fn busy_poll_thread_delivers_while_nobody_waits() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // Connecting uses waiters, which hold the endpoints for a while.
        let (_a, b) = connected_burst(WaitMode::BusyPoll, N).await;
        let deadline = std::time::Instant::now() + T;
        while b.cq.len() < N as usize {
            assert!(
                std::time::Instant::now() < deadline,
                "the busy-poll thread delivered {} of {N}",
                b.cq.len()
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let mut got = 0u64;
        while got < N {
            for e in b.cq.read(16).unwrap() {
                assert_eq!(e.context, got, "in order");
                assert!(e.bufs[0].iter().all(|&x| x == got as u8));
                got += 1;
            }
        }
        assert_eq!(b.cq.read(16).err(), Some(weft::Error::Again));
    });
}
