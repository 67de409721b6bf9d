//! The TCP provider against peers that do not follow the protocol, and
//! against well-behaved peers in the corners of the protocol (flow
//! control, simultaneous connects, busy-poll, transmit credits).
//!
//! Every attack is followed by a well-behaved exchange on the same
//! endpoint: a panic in a provider task would be swallowed by Tokio, so
//! "the endpoint still works" is the real check.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weft::{
    AddressVector, AvAttr, CompletionQueue, Domain, EpType, Error, FiAddr, Info, OpFlags, SendMsg,
    WaitMode, FI_ADDR_UNSPEC,
};
use weft_core::wire::{FrameKind, Header, FLAG_ACK_REQ, HEADER_LEN};
use weft_integration::identity::Identity;

const T: Duration = Duration::from_secs(10);

async fn to<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(T, f).await.expect("timed out")
}

struct Ep {
    ep: weft::Endpoint,
    av: AddressVector,
    cq: CompletionQueue,
}

fn setup() -> (Domain, Info) {
    let mut hints = Info::default();
    hints.ep_attr.ep_type = EpType::Rdm;
    hints.caps = weft::Caps::TAGGED | weft::Caps::MSG;
    let info = weft::getinfo(Some(&hints)).unwrap().remove(0);
    let fabric = weft::Fabric::open(&info).unwrap();
    let domain = fabric.domain(&info).unwrap();
    (domain, info)
}

fn open_with(domain: &Domain, info: &Info, wait: WaitMode) -> Ep {
    let av = domain.av(AvAttr::default()).unwrap();
    let (ep, cq) = weft_integration::enabled_endpoint(domain, info, &av, wait);
    Ep { ep, av, cq }
}

fn open(domain: &Domain, info: &Info) -> Ep {
    open_with(domain, info, WaitMode::Interrupt)
}

fn addr_of(from: &Ep, to: &Ep) -> FiAddr {
    from.av
        .insert_sync(&[to.ep.local_addr().unwrap()], Default::default())
        .unwrap()
        .fi_addrs[0]
}

fn sockaddr(ep: &Ep) -> SocketAddr {
    weft::decode_sockaddr(&ep.ep.local_addr().unwrap()).unwrap()
}

/// A well-behaved tagged exchange from `good` to `victim`.
async fn assert_alive(victim: &Ep, good: &Ep, tag: u64) {
    let dest = addr_of(good, victim);
    let payload = Bytes::from(format!("still alive {tag}"));
    let recv = victim
        .ep
        .trecv(BytesMut::zeroed(256), FI_ADDR_UNSPEC, tag, 0);
    let send = good.ep.tsend(dest, payload.clone(), tag);
    let (got, sent) = to(async { tokio::join!(recv, send) }).await;
    sent.unwrap();
    let got = got.unwrap();
    assert_eq!(got.tag, tag);
    assert_eq!(&got.into_bytes()[..], &payload[..]);
}

/// A raw connection that has done the RDM handshake, claiming to be the
/// endpoint listening at a fresh address of its own (which confirms the
/// claim when the victim asks).
async fn hello(victim: SocketAddr) -> (TcpStream, Identity) {
    let ident = Identity::new().await.unwrap();
    let (s, status) = hello_as(victim, &ident).await;
    assert_eq!(status, 0);
    (s, ident)
}

/// The handshake claiming identity `ident`; returns the HelloAck status.
async fn hello_as(victim: SocketAddr, ident: &Identity) -> (TcpStream, u64) {
    let mut s = to(TcpStream::connect(victim)).await.unwrap();
    let payload = ident.hello_to(victim);
    let mut h = Header::new(FrameKind::Hello);
    h.len = payload.len() as u64;
    to(s.write_all(&h.encode())).await.unwrap();
    to(s.write_all(&payload)).await.unwrap();
    let mut ack = [0u8; HEADER_LEN];
    to(s.read_exact(&mut ack)).await.unwrap();
    let ack = weft_core::wire::decode(&ack, 0).unwrap();
    assert_eq!(ack.kind, Some(FrameKind::HelloAck));
    (s, ack.data)
}

/// Waits for the victim to drop the connection (EOF or reset).
async fn expect_closed(mut s: TcpStream) {
    let mut b = [0u8; 64];
    loop {
        match to(s.read(&mut b)).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_input_closes_only_that_connection() {
    let (domain, info) = setup();
    let victim = open(&domain, &info);
    let good = open(&domain, &info);
    let va = sockaddr(&victim);
    let mut tag = 1;

    // Truncated header before any handshake, then close.
    let mut s = to(TcpStream::connect(va)).await.unwrap();
    to(s.write_all(&Header::new(FrameKind::Hello).encode()[..17]))
        .await
        .unwrap();
    drop(s);
    assert_alive(&victim, &good, tag).await;
    tag += 1;

    // Garbage instead of a handshake.
    let mut s = to(TcpStream::connect(va)).await.unwrap();
    let garbage: Vec<u8> = (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect();
    let _ = to(s.write_all(&garbage)).await;
    expect_closed(s).await;
    assert_alive(&victim, &good, tag).await;
    tag += 1;

    // Handshake, then a truncated header and close.
    let (mut s, _id) = hello(va).await;
    to(s.write_all(&Header::new(FrameKind::Tagged).encode()[..25]))
        .await
        .unwrap();
    drop(s);
    assert_alive(&victim, &good, tag).await;
    tag += 1;

    // Handshake, then garbage.
    let (mut s, _id) = hello(va).await;
    let _ = to(s.write_all(&garbage)).await;
    expect_closed(s).await;
    assert_alive(&victim, &good, tag).await;
    tag += 1;

    // Handshake, then a data frame far beyond max_msg_size.
    let (mut s, _id) = hello(va).await;
    let mut h = Header::new(FrameKind::Tagged);
    h.len = 1 << 31;
    h.seq = 1;
    to(s.write_all(&h.encode())).await.unwrap();
    expect_closed(s).await;
    assert_alive(&victim, &good, tag).await;
    tag += 1;

    // Handshake, then headers wrong in each field in turn.
    let corruptions: [(usize, u8); 5] = [
        (0, b'X'), // magic
        (2, 9),    // version
        (3, 0),    // kind
        (3, 200),  // kind
        (4, 0x80), // unknown flag
    ];
    for (at, v) in corruptions {
        let (mut s, _id) = hello(va).await;
        let mut b = Header::new(FrameKind::Tagged).encode();
        b[at] = v;
        to(s.write_all(&b)).await.unwrap();
        expect_closed(s).await;
        assert_alive(&victim, &good, tag).await;
        tag += 1;
    }

    // Flags on a control frame, a second Hello, a payload on an Ack, a
    // receive context (the reserved bytes outside messages) on an Ack.
    let mut bad_ack = Header::new(FrameKind::Ack);
    bad_ack.flags = FLAG_ACK_REQ;
    let mut long_ack = Header::new(FrameKind::Ack);
    long_ack.len = 8;
    let mut ctx_ack = Header::new(FrameKind::Ack);
    ctx_ack.rx_ctx = 1;
    for h in [bad_ack, Header::new(FrameKind::Hello), long_ack, ctx_ack] {
        let (mut s, _id) = hello(va).await;
        to(s.write_all(&h.encode())).await.unwrap();
        expect_closed(s).await;
        assert_alive(&victim, &good, tag).await;
        tag += 1;
    }

    // A message for a receive context the endpoint does not have (it is
    // not scalable) is dropped and counted; the connection carries on.
    let (mut s, _id) = hello(va).await;
    let mut h = Header::new(FrameKind::Tagged);
    h.rx_ctx = 7;
    h.len = 4;
    h.seq = 1;
    h.tag = tag;
    let mut frame = h.encode().to_vec();
    frame.extend_from_slice(b"lost");
    to(s.write_all(&frame)).await.unwrap();
    assert_alive(&victim, &good, tag).await;
    h.rx_ctx = 0;
    h.seq = 2;
    h.tag = tag + 1;
    let mut frame = h.encode().to_vec();
    frame.extend_from_slice(b"kept");
    let recv = victim
        .ep
        .trecv(BytesMut::zeroed(8), FI_ADDR_UNSPEC, tag + 1, 0);
    let (got, sent) = to(async { tokio::join!(recv, s.write_all(&frame)) }).await;
    sent.unwrap();
    assert_eq!(&got.unwrap().into_bytes()[..], b"kept", "same connection");
    // Read after the dropped one, on the same connection: it was counted.
    assert_eq!(victim.ep.stats().unwrap().rx_bad_ctx, 1);
    drop(s);
    tag += 2;

    // An Ack for a frame never sent is ignored, not fatal.
    let (mut s, _id) = hello(va).await;
    let mut ack = Header::new(FrameKind::Ack);
    ack.seq = 12345;
    to(s.write_all(&ack.encode())).await.unwrap();
    assert_alive(&victim, &good, tag).await;
    drop(s);
    tag += 1;
    assert_alive(&victim, &good, tag).await;

    assert_eq!(victim.ep.rx_size_left().unwrap(), info.rx_attr.size);
    assert_eq!(good.ep.tx_size_left().unwrap(), info.tx_attr.size);
}

/// A peer that dies mid-message: the receive the message matched is not
/// failed and not lost: it goes back to the head of the posted receives
/// (its credit still held) and takes the next message it accepts, here a
/// good peer's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn peer_dies_mid_message_gives_the_receive_back() {
    let (domain, info) = setup();
    let victim = open(&domain, &info);
    let good = open(&domain, &info);
    let va = sockaddr(&victim);

    const TAG: u64 = 0xdead;
    victim
        .ep
        .post_trecv(BytesMut::zeroed(2000), FI_ADDR_UNSPEC, TAG, 0, 77)
        .unwrap();
    assert_eq!(victim.ep.rx_size_left().unwrap(), info.rx_attr.size - 1);

    let (mut s, _id) = hello(va).await;
    let mut h = Header::new(FrameKind::Tagged);
    h.tag = TAG;
    h.len = 1000;
    h.seq = 1;
    let mut frame = h.encode().to_vec();
    frame.extend_from_slice(b"0123456789");
    to(s.write_all(&frame)).await.unwrap();
    // Seen closed by the victim once it answers our close with its own.
    to(s.shutdown()).await.unwrap();
    expect_closed(s).await;
    assert!(
        victim.cq.is_empty(),
        "the dead message must not complete the receive"
    );
    assert_eq!(victim.ep.rx_size_left().unwrap(), info.rx_attr.size - 1);

    let dest = addr_of(&good, &victim);
    to(good
        .ep
        .tsend(dest, Bytes::from_static(b"the real one"), TAG))
    .await
    .unwrap();
    let c = to(victim.cq.next_timeout(T))
        .await
        .expect("no completion")
        .expect("the reposted receive completes");
    assert_eq!(c.context, 77);
    assert_eq!(c.len, 12);
    assert_eq!(&c.bufs[0][..12], b"the real one");
    assert_eq!(victim.ep.rx_size_left().unwrap(), info.rx_attr.size);
}

/// The same death while the message is still unexpected: no receive is
/// consumed by it, and a receive posted later matches the next good one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn peer_dies_mid_unexpected_message_is_skipped() {
    let (domain, info) = setup();
    let victim = open(&domain, &info);
    let good = open(&domain, &info);
    let va = sockaddr(&victim);

    const TAG: u64 = 0xbeef;
    let (mut s, _id) = hello(va).await;
    let mut h = Header::new(FrameKind::Tagged);
    h.tag = TAG;
    h.len = 1000;
    h.seq = 1;
    let mut frame = h.encode().to_vec();
    frame.extend_from_slice(b"0123456789");
    to(s.write_all(&frame)).await.unwrap();
    // The victim's answer to the close is to close too: once we see that,
    // it has read everything we sent.
    to(s.shutdown()).await.unwrap();
    expect_closed(s).await;

    assert_alive(&victim, &good, TAG).await;
    assert_eq!(victim.ep.rx_size_left().unwrap(), info.rx_attr.size);
}

/// Messages beyond the unexpected-message budget are held back by the
/// sender's connection (the reader parks), not dropped: once receives are
/// posted every one arrives, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unexpected_flood_is_flow_controlled_not_lost() {
    let (domain, info) = setup();
    let mut small = info.clone();
    small.rx_attr.total_buffered_recv = 4096;
    let victim = open(&domain, &small);
    let good = open(&domain, &info);
    let dest = addr_of(&good, &victim);

    const N: usize = 600;
    const LEN: usize = 1024;
    let sent = Arc::new(AtomicUsize::new(0));
    let sender = {
        let ep = good.ep.clone();
        let sent = sent.clone();
        tokio::spawn(async move {
            for i in 0..N {
                let mut p = vec![(i % 251) as u8; LEN];
                p[..8].copy_from_slice(&(i as u64).to_le_bytes());
                to(ep.tsend(dest, Bytes::from(p), i as u64)).await.unwrap();
                sent.fetch_add(1, Ordering::Release);
            }
        })
    };
    // Let far more than the budget go out before anything is posted.
    to(async {
        while sent.load(Ordering::Acquire) < 64 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;

    for i in 0..N {
        let got = to(victim
            .ep
            .trecv(BytesMut::zeroed(LEN), FI_ADDR_UNSPEC, 0, u64::MAX))
        .await
        .unwrap();
        assert_eq!(got.tag, i as u64, "out of order or lost");
        let b = got.into_bytes();
        assert_eq!(b.len(), LEN);
        assert_eq!(u64::from_le_bytes(b[..8].try_into().unwrap()), i as u64);
        assert!(b[8..].iter().all(|&x| x == (i % 251) as u8));
    }
    to(sender).await.unwrap();
    assert_alive(&victim, &good, 1 << 40).await;
}

async fn exchange(a: &Ep, b: &Ep, n: usize, len: usize, tag_base: u64) {
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

/// Both endpoints send to each other first, at the same moment, so both
/// connect at once and one connection must give way. Repeated on fresh
/// pairs to meet the race from both sides.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn simultaneous_connect_loses_and_duplicates_nothing() {
    let (domain, info) = setup();
    for round in 0..20 {
        let a = open(&domain, &info);
        let b = open(&domain, &info);
        let to_b = addr_of(&a, &b);
        let to_a = addr_of(&b, &a);
        // Post everything from both sides before any connection can exist.
        const N: u64 = 50;
        for i in 0..N {
            a.ep.post_tsend(to_b, Bytes::from(i.to_le_bytes().to_vec()), i, i)
                .unwrap();
            b.ep.post_tsend(to_a, Bytes::from(i.to_le_bytes().to_vec()), i, i)
                .unwrap();
        }
        for ep in [&a, &b] {
            let mut got = Vec::new();
            while got.len() < N as usize {
                let e = to(ep
                    .ep
                    .trecv(BytesMut::zeroed(8), FI_ADDR_UNSPEC, 0, u64::MAX))
                .await
                .unwrap();
                got.push(e.tag);
            }
            assert_eq!(got, (0..N).collect::<Vec<_>>(), "round {round}");
        }
        // Each send completed exactly once, successfully.
        for ep in [&a, &b] {
            let mut ctxs = Vec::new();
            while ctxs.len() < N as usize {
                let item = to(ep.cq.next_timeout(T))
                    .await
                    .expect("missing send completion");
                ctxs.push(item.unwrap().context);
            }
            ctxs.sort_unstable();
            assert_eq!(ctxs, (0..N).collect::<Vec<_>>());
            assert!(ep.cq.is_empty());
            assert_eq!(ep.ep.tx_size_left().unwrap(), info.tx_attr.size);
        }
        exchange(&a, &b, 10, 16, 100).await;
    }
}

/// Transmit credits balance: delivery-complete sends (which make the
/// receiver send Acks), plain sends and failed sends all give back exactly
/// what they took.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transmit_credits_return_after_every_kind_of_send() {
    let (domain, info) = setup();
    let a = open(&domain, &info);
    let b = open(&domain, &info);
    let to_b = addr_of(&a, &b);
    let size = info.tx_attr.size;
    assert_eq!(a.ep.tx_size_left().unwrap(), size);

    const N: u64 = 100;
    let sends = async {
        for i in 0..N {
            let msg = SendMsg {
                dest: to_b,
                iov: vec![Bytes::from(vec![1u8; 100])],
                tag: Some(i),
                ..SendMsg::default()
            };
            a.ep.sendmsg(msg, OpFlags::DELIVERY_COMPLETE).await.unwrap();
        }
    };
    let recvs = async {
        for i in 0..N {
            let e =
                b.ep.trecv(BytesMut::zeroed(100), FI_ADDR_UNSPEC, i, 0)
                    .await
                    .unwrap();
            assert_eq!(e.len, 100);
        }
    };
    to(async { tokio::join!(sends, recvs) }).await;
    assert_eq!(a.ep.tx_size_left().unwrap(), size);
    // b sent N Acks: control frames, which must not have moved its count.
    assert_eq!(b.ep.tx_size_left().unwrap(), size);
    assert_eq!(b.ep.rx_size_left().unwrap(), info.rx_attr.size);

    // Delivery-complete to a message that arrives before its receive.
    let early = a.ep.sendmsg(
        SendMsg {
            dest: to_b,
            iov: vec![Bytes::from_static(b"early")],
            tag: Some(9999),
            ..SendMsg::default()
        },
        OpFlags::DELIVERY_COMPLETE,
    );
    to(early).await.unwrap();
    let e = to(b.ep.trecv(BytesMut::zeroed(8), FI_ADDR_UNSPEC, 9999, 0))
        .await
        .unwrap();
    assert_eq!(&e.into_bytes()[..], b"early");

    // Sends to an address nobody listens on fail, and give back credits.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let nowhere =
        a.av.insert_sync(&[weft::encode_sockaddr(&dead)], Default::default())
            .unwrap()
            .fi_addrs[0];
    for i in 0..10 {
        a.ep.post_tsend(nowhere, Bytes::from_static(b"x"), 0, 500 + i)
            .unwrap();
    }
    for _ in 0..10 {
        let item = to(a.cq.next_timeout(T)).await.expect("no completion");
        assert!(item.is_err());
    }
    assert_eq!(a.ep.tx_size_left().unwrap(), size);
    assert_alive(&b, &a, 4242).await;
    assert_eq!(a.ep.tx_size_left().unwrap(), size);
}

/// An endpoint sending to its own address: both ends of the connection
/// belong to one endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn send_to_self() {
    let (domain, info) = setup();
    let a = open(&domain, &info);
    let me = addr_of(&a, &a);
    for i in 0..50u64 {
        let recv = a.ep.trecv(BytesMut::zeroed(8), FI_ADDR_UNSPEC, i, 0);
        let send = a.ep.tsend(me, Bytes::from(i.to_le_bytes().to_vec()), i);
        let (got, sent) = to(async { tokio::join!(recv, send) }).await;
        sent.unwrap();
        assert_eq!(&got.unwrap().into_bytes()[..], &i.to_le_bytes());
    }
    assert_eq!(a.ep.tx_size_left().unwrap(), info.tx_attr.size);
}

/// A second connection claiming the identity of a live one either is
/// refused or replaces it (which closes the first): either way the
/// endpoint keeps working. Both orders of the identities are tried, so
/// both outcomes are met.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn second_connection_from_same_identity() {
    let (domain, info) = setup();
    let victim = open(&domain, &info);
    let good = open(&domain, &info);
    let va = sockaddr(&victim);
    let mut replaced = 0;
    // Identities whose address compares below and above the victim's (the
    // simultaneous-connect rule decides by that order).
    let (mut below, mut above) = (None, None);
    for _ in 0..1000 {
        let id = Identity::new().await.unwrap();
        let lower = weft::encode_sockaddr(&id.addr()) < weft::encode_sockaddr(&va);
        match lower {
            true if below.is_none() => below = Some(id),
            false if above.is_none() => above = Some(id),
            _ => {}
        }
        if below.is_some() && above.is_some() {
            break;
        }
    }
    let idents = [below.expect("a lower port"), above.expect("a higher port")];
    for (i, ident) in idents.iter().enumerate() {
        let (first, st) = hello_as(va, ident).await;
        assert_eq!(st, 0);
        // The victim answers the first handshake before it attaches the
        // connection, and refuses a second one that comes meanwhile (two
        // handshakes of one identity in flight): the lower identity, the
        // one that may replace, tries again until the first has settled.
        for attempt in 0..50 {
            let (second, st) = hello_as(va, ident).await;
            if st == 0 {
                replaced += 1;
                expect_closed(first).await;
                break;
            }
            expect_closed(second).await;
            if i == 1 || attempt == 49 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_alive(&victim, &good, i as u64).await;
    }
    assert!(replaced >= 1, "the replacing path was not reached");
}

/// A MSG listener bounds the connection requests it holds: beyond the
/// limit a connection is closed at once, one that never sends its request
/// is dropped at the handshake timeout, each reported on the listener's
/// EQ with the peer's address; a real client still gets through.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn listener_bounds_pending_requests_and_reports_them() {
    let mut hints = Info::default();
    hints.ep_attr.ep_type = EpType::Msg;
    let info = weft::getinfo(Some(&hints)).unwrap().remove(0);
    let fabric = weft::Fabric::open(&info).unwrap();
    let domain = fabric.domain(&info).unwrap();
    let pep = fabric.passive_endpoint(&info, None).unwrap();
    let eq = fabric.eq(64).unwrap();
    pep.bind_eq(&eq).unwrap();
    pep.set_conn_limits(
        weft::ConnLimits::default()
            .with_max_conns(2)
            .with_handshake_timeout(Duration::from_millis(200)),
    )
    .unwrap();
    pep.listen().unwrap();
    let addr = weft::decode_sockaddr(&pep.local_addr().unwrap()).unwrap();

    // The listener takes connections in the kernel's accept order, which
    // is the order the connects completed in: these two take the places.
    let mut silent = Vec::new();
    for _ in 0..2 {
        silent.push(to(TcpStream::connect(addr)).await.unwrap());
    }
    let extra = to(TcpStream::connect(addr)).await.unwrap();
    let extra_addr = extra.local_addr().unwrap();
    expect_closed(extra).await;
    let mut timed_out = 0;
    let mut refused = 0;
    for s in silent.drain(..) {
        expect_closed(s).await;
    }
    // Two timeouts and one refusal, each naming its peer.
    let t0 = std::time::Instant::now();
    while timed_out + refused < 3 && t0.elapsed() < T {
        match eq.read_err() {
            Ok(e) => {
                let peer = weft::decode_sockaddr(e.peer_addr.as_ref().unwrap()).unwrap();
                match e.err {
                    Error::TimedOut => timed_out += 1,
                    Error::ConnRefused => {
                        assert_eq!(peer, extra_addr);
                        refused += 1
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    assert_eq!((timed_out, refused), (2, 1));

    // A real client connects.
    let (cq, ceq) = (
        domain.cq(Default::default()).unwrap(),
        fabric.eq(8).unwrap(),
    );
    let c = domain.endpoint(&info).unwrap();
    c.bind_eq(&ceq).unwrap();
    c.bind_cq(&cq, weft::BindFlags::TRANSMIT | weft::BindFlags::RECV)
        .unwrap();
    let connecting = {
        let c = c.clone();
        let a = pep.local_addr().unwrap();
        tokio::spawn(async move { c.connect(a, Vec::new()).await })
    };
    let ev = to(eq.next_timeout(T)).await.unwrap().unwrap();
    assert_eq!(ev.kind, weft::EqEventKind::ConnReq);
    let req = weft::ConnRequest::from_event(&ev).unwrap();
    let s = domain.accept_endpoint(&info, &req).unwrap();
    let seq = fabric.eq(8).unwrap();
    s.bind_eq(&seq).unwrap();
    s.bind_cq(&cq, weft::BindFlags::TRANSMIT | weft::BindFlags::RECV)
        .unwrap();
    to(s.accept(Vec::new())).await.unwrap();
    to(connecting).await.unwrap().unwrap();
}

/// A MSG connection's fatal fault is a critical error (fi_endpoint(3)):
/// the endpoint is disabled (operations `OpBadState`), what was pending
/// completes with `Canceled`, the error is on the EQ, and `enable`
/// re-enables it so that it can connect again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fatal_fault_disables_and_enable_re_enables() {
    let mut hints = Info::default();
    hints.ep_attr.ep_type = EpType::Msg;
    let info = weft::getinfo(Some(&hints)).unwrap().remove(0);
    let fabric = weft::Fabric::open(&info).unwrap();
    let domain = fabric.domain(&info).unwrap();

    // A peer that accepts, then resets the connection.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fake = weft::encode_sockaddr(&l.local_addr().unwrap());
    let peer = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut req = [0u8; HEADER_LEN];
        s.read_exact(&mut req).await.unwrap();
        to(s.write_all(&Header::new(FrameKind::ConnResp).encode()))
            .await
            .unwrap();
        // Until the client has posted its receive.
        let mut b = [0u8; 1];
        let _ = tokio::time::timeout(Duration::from_millis(300), s.read(&mut b)).await;
        s.set_zero_linger().unwrap();
        drop(s);
    });
    let (cq, eq) = (
        domain.cq(Default::default()).unwrap(),
        fabric.eq(8).unwrap(),
    );
    let ep = domain.endpoint(&info).unwrap();
    ep.bind_eq(&eq).unwrap();
    ep.bind_cq(&cq, weft::BindFlags::TRANSMIT | weft::BindFlags::RECV)
        .unwrap();
    to(ep.connect(fake, Vec::new())).await.unwrap();
    let ev = to(eq.next_timeout(T)).await.unwrap().unwrap();
    assert_eq!(ev.kind, weft::EqEventKind::Connected);
    ep.post_recv(BytesMut::zeroed(16), 5).unwrap();
    to(peer).await.unwrap();

    let err = to(eq.next_timeout(T)).await.unwrap().unwrap_err();
    assert!(
        matches!(err.err, Error::ConnReset | Error::ConnAborted | Error::Io),
        "{err:?}"
    );
    let flushed = to(cq.next_timeout(T)).await.unwrap().unwrap_err();
    assert_eq!((flushed.context, flushed.err), (5, Error::Canceled));
    assert!(!ep.is_enabled());
    assert_eq!(
        ep.post_send(weft::FI_ADDR_UNSPEC, Bytes::from_static(b"x"), 1)
            .unwrap_err(),
        Error::OpBadState
    );

    // Re-enabled, it connects to a real listener.
    ep.enable().unwrap();
    assert!(ep.is_enabled());
    let pep = fabric.passive_endpoint(&info, None).unwrap();
    let peq = fabric.eq(8).unwrap();
    pep.bind_eq(&peq).unwrap();
    pep.listen().unwrap();
    let connecting = {
        let ep = ep.clone();
        let a = pep.local_addr().unwrap();
        tokio::spawn(async move { ep.connect(a, Vec::new()).await })
    };
    let ev = to(peq.next_timeout(T)).await.unwrap().unwrap();
    let req = weft::ConnRequest::from_event(&ev).unwrap();
    let server = domain.accept_endpoint(&info, &req).unwrap();
    let seq = fabric.eq(8).unwrap();
    server.bind_eq(&seq).unwrap();
    server
        .bind_cq(&cq, weft::BindFlags::TRANSMIT | weft::BindFlags::RECV)
        .unwrap();
    to(server.accept(Vec::new())).await.unwrap();
    to(connecting).await.unwrap().unwrap();
    let recv = server.recv(BytesMut::zeroed(16));
    let send = ep.send(weft::FI_ADDR_UNSPEC, Bytes::from_static(b"again"));
    let (got, sent) = to(async { tokio::join!(recv, send) }).await;
    sent.unwrap();
    assert_eq!(&got.unwrap().into_bytes()[..], b"again");
}
