//! Raw peers that break the protocol: malformed frames, death in the
//! middle of a message (matched or unexpected).

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use weft::FI_ADDR_UNSPEC;
use weft_core::wire::{FrameKind, Header, FLAG_ACK_REQ};

use super::{addr_of, assert_alive, expect_closed, hello, open, setup, sockaddr, to, T};

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
