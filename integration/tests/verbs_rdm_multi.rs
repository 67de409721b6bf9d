//! Multi-receive buffers (`FI_MULTI_RECV`) on the verbs provider's RDM
//! endpoints, across two devices (server on rxe1, clients on rxe2, in
//! the VM of `integration/run-rxe`): several senders' messages, eager
//! and read by RDMA, packed into one buffer at once; a sender that dies
//! while its message is being read. The provider-independent behaviours
//! are the conformance suite's (`conformance/multi_recv.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use weft::{EpOpt, EpType, Error, FiAddr, Info, OpFlags, WaitMode};
use weft_integration::{next_cq, verbs_offer, within, Node};

const SERVER_DEV: &str = "rxe1";
const CLIENT_DEV: &str = "rxe2";

/// Message `i` of client `k`, `len` bytes (at least 16): both numbers,
/// then bytes that depend on them.
fn message(k: u64, i: u64, len: usize) -> Bytes {
    let mut v = k.to_le_bytes().to_vec();
    v.extend_from_slice(&i.to_le_bytes());
    v.extend((16..len.max(16)).map(|j| (j as u8).wrapping_mul(31) ^ (k as u8) ^ (i as u8)));
    v.into()
}

/// The client and number of a received message, checking every byte.
fn parse(b: &[u8]) -> (u64, u64) {
    assert!(b.len() >= 16, "a message has 16 bytes at least");
    let k = u64::from_le_bytes(b[..8].try_into().unwrap());
    let i = u64::from_le_bytes(b[8..16].try_into().unwrap());
    assert_eq!(
        b,
        &message(k, i, b.len())[..],
        "message {i} of client {k} corrupted"
    );
    (k, i)
}

/// A server on its device, releasing buffers below `min` free bytes,
/// and the clients' RDM offer.
fn server(min: usize) -> Option<(Node, Info)> {
    let s = Node::open(&verbs_offer(SERVER_DEV, EpType::Rdm)?, WaitMode::Interrupt);
    s.ep.setopt(EpOpt::MinMultiRecv, min).unwrap();
    Some((s, verbs_offer(CLIENT_DEV, EpType::Rdm)?))
}

/// Sizes on both sides of the eager limit (a 4 KiB slot payload).
fn size_of(k: u64, i: u64) -> usize {
    [100usize, 5_000, 40, 20_000, 3_000, 9_000][((k + i) % 6) as usize]
}

/// Four clients send at once, small and large messages mixed: each
/// message lands whole in its own part of the buffers (reads from
/// several connections run into one buffer at the same time), each
/// client's in order, and every buffer comes back whole.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_multi_recv_many_clients() {
    let Some((s, cinfo)) = server(20_000) else {
        return;
    };
    const CLIENTS: u64 = 4;
    const N: u64 = 30;
    let clients: Vec<Node> = (0..CLIENTS)
        .map(|_| Node::open(&cinfo, WaitMode::Interrupt))
        .collect();
    let srcs: Vec<FiAddr> = clients.iter().map(|c| s.handle_of(c)).collect();
    let mut senders = Vec::new();
    for (k, c) in clients.iter().enumerate() {
        let to_s = c.handle_of(&s);
        let ep = c.ep.clone();
        senders.push(tokio::spawn(async move {
            for i in 0..N {
                let k = k as u64;
                ep.send(to_s, message(k, i, size_of(k, i))).await.unwrap();
            }
        }));
    }
    let mut next = [0u64; CLIENTS as usize];
    let mut got = 0;
    let mut buffers = 0;
    const LEN: usize = 64 * 1024;
    let mut stream = within("post", s.ep.recv_multi(BytesMut::zeroed(LEN)))
        .await
        .unwrap();
    while got < CLIENTS * N {
        // The next buffer is posted before this one is read.
        let mut cur = stream;
        stream = within("post", s.ep.recv_multi(BytesMut::zeroed(LEN)))
            .await
            .unwrap();
        let mut offset = 0;
        let mut placed = Vec::new();
        while got < CLIENTS * N {
            let Some(m) = within("stream", cur.next()).await else {
                break;
            };
            let m = m.unwrap();
            assert_eq!(m.offset, offset, "packed");
            offset += m.len;
            let (k, i) = parse(cur.bytes(&m));
            assert_eq!(m.src, srcs[k as usize], "source of client {k}");
            assert_eq!(i, next[k as usize], "client {k}'s messages in order");
            next[k as usize] += 1;
            got += 1;
            placed.push((m.offset, m.len));
        }
        if got < CLIENTS * N {
            let whole = cur.into_buffer().expect("ended");
            assert_eq!(whole.len(), LEN);
            for (o, l) in placed {
                parse(&whole[o..o + l]);
            }
        }
        buffers += 1;
    }
    drop(stream);
    for t in senders {
        within("sends", t).await.unwrap();
    }
    assert!(buffers > 4, "{buffers} buffers");
}

/// A sender that goes away while its large message may be on its way
/// (announced, being read, or read): nothing hangs, the buffer goes on
/// taking another client's messages after whatever the message held
/// (its range stays unused if it died part-way), and a cancel releases
/// the buffer after every part is done.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_multi_recv_sender_dies_mid_read() {
    let Some((s, cinfo)) = server(1024) else {
        return;
    };
    let doomed = Node::open(&cinfo, WaitMode::Interrupt);
    let other = Node::open(&cinfo, WaitMode::Interrupt);
    let from_other = s.handle_of(&other);
    let (d_to_s, o_to_s) = (doomed.handle_of(&s), other.handle_of(&s));
    // Connected first, so that the close finds an established connection.
    s.ep.post_recv(BytesMut::zeroed(64), 1).unwrap();
    within("hello", doomed.ep.send(d_to_s, message(9, 0, 16)))
        .await
        .unwrap();
    within("hello", next_cq(&s.cq)).await.unwrap();
    let left = s.ep.rx_size_left().unwrap();

    const BIG: usize = 8 << 20;
    let at =
        s.ep.post_recv_multi(BytesMut::zeroed(BIG + 4096), 7)
            .unwrap();
    doomed.ep.post_send(d_to_s, message(9, 1, BIG), 1).unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    doomed.ep.close().unwrap();
    drop(doomed);
    // Long enough for the server to see the connection end.
    tokio::time::sleep(Duration::from_millis(500)).await;
    within("send", other.ep.send(o_to_s, message(1, 0, 100)))
        .await
        .unwrap();
    // The cancel comes right after the other message: its error follows
    // every part's completion (the large one's too, if it was read).
    let mut seen_other = false;
    let mut canceled = false;
    loop {
        let e = within("completion", next_cq(&s.cq)).await;
        match e {
            Ok(e) if e.len == BIG => {
                eprintln!("the large message was read whole");
                // Read whole before the close: a message like any other.
                assert_eq!(at.offset_of(&e), Some(0));
                assert_eq!(parse(&e.bufs[0]), (9, 1));
            }
            Ok(e) => {
                // The other client's message, after whatever the large
                // one took (nothing, or its whole range).
                assert!(!seen_other, "one message of the other client");
                seen_other = true;
                assert_eq!((e.len, e.src), (100, from_other));
                let o = at.offset_of(&e).unwrap();
                assert!(o == 0 || o == BIG, "at {o}");
                eprintln!("the other client's message at {o}");
                assert_eq!(parse(&e.bufs[0]), (1, 0));
                // 4096 - 100 (or more) left, above the minimum.
                assert!(!e.flags.contains(OpFlags::MULTI_RECV));
                s.ep.cancel(7).unwrap();
                canceled = true;
            }
            Err(c) => {
                assert!(canceled, "unexpected error completion {c:?}");
                assert_eq!((c.context, c.err), (7, Error::Canceled));
                assert!(c.flags.contains(OpFlags::MULTI_RECV));
                break;
            }
        }
    }
    assert_eq!(s.ep.rx_size_left().unwrap(), left, "released");
}
