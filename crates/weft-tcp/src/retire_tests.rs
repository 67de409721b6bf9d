//! An RDM connection retired while idle keeps every request in order when
//! sends race with the retirement, at either end: a request posted on the
//! connection just after this end queued its `Shutdown` goes over the next
//! connection, and requests the peer's `Shutdown` left unsent go out
//! before anything posted since.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use bytes::Bytes;
use weft_core::provider::iov1;
use weft_core::sync::lock;
use weft_core::wire::{FrameKind, Header, HEADER_LEN};
use weft_core::Error;

use crate::frame::TxFrame;
use crate::rx::tests::rig;

fn request(tag: u64, len: usize) -> TxFrame {
    let mut h = Header::new(FrameKind::Tagged);
    h.tag = tag;
    h.len = len as u64;
    TxFrame::new(h, iov1(Bytes::from(vec![7u8; len])), None)
}

/// The rig's connection as its peer's connection (as an RDM endpoint's
/// connect or accept leaves it); the peer's key.
fn attached(r: &crate::rx::tests::Rig) -> std::net::SocketAddr {
    let key = r.conn.peer_key;
    lock(&r.ep.peers).entry(key).or_default().conn = Some(r.conn.clone());
    key
}

fn pending_tags(r: &crate::rx::tests::Rig) -> Vec<u64> {
    lock(&r.ep.peers)[&r.conn.peer_key]
        .pending
        .iter()
        .map(|f| f.hdr.tag)
        .collect()
}

#[tokio::test]
async fn a_request_posted_on_a_connection_just_retired_takes_the_next_one() {
    let r = rig(1 << 20).await;
    attached(&r);
    crate::sweep::retire(&r.ep, &r.conn);
    // A sender that picked the connection before it was retired.
    r.conn.send(request(1, 8));
    assert_eq!(pending_tags(&r), vec![1], "waits for the next connection");
    {
        let peers = lock(&r.ep.peers);
        let p = &peers[&r.conn.peer_key];
        assert!(p.conn.is_none() && p.connecting);
        assert!(p.draining.is_some(), "the retired one is still read");
    }
    // The peer takes no request after `Shutdown`: nothing may follow it.
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    let deadline = tokio::time::Instant::now() + Duration::from_millis(300);
    while tokio::time::Instant::now() < deadline {
        let ready = tokio::time::timeout(Duration::from_millis(50), r.peer.readable()).await;
        if let Ok(Ok(())) = ready {
            match r.peer.try_read(&mut buf) {
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
    }
    assert_eq!(got.len(), HEADER_LEN, "only the Shutdown went out");
    let h = weft_core::wire::decode(&got, 1 << 20).unwrap();
    assert_eq!(h.kind, Some(FrameKind::Shutdown));
}

fn shutdown_frame() -> crate::rx::tests::Script {
    crate::rx::tests::Script::default().bytes(&Header::new(FrameKind::Shutdown).encode())
}

#[tokio::test]
async fn requests_the_peers_shutdown_left_unsent_go_before_later_ones() {
    let mut r = rig(1 << 20).await;
    let key = attached(&r);
    // The peer does not read: a large request fills the socket part-way
    // and two small ones queue behind it, never begun.
    r.conn.send(request(100, 16 << 20));
    r.conn.send(request(1, 8));
    r.conn.send(request(2, 8));
    assert!(!r.conn.tx_idle());
    // A later request already waiting for the next connection.
    {
        let mut peers = lock(&r.ep.peers);
        let p = peers.get_mut(&key).unwrap();
        p.pending.push(request(3, 8));
        p.connecting = true;
    }
    let st = r.pass(&mut shutdown_frame());
    assert!(!matches!(st, crate::rx::RxStatus::Closed(_)), "{st:?}");
    assert_eq!(
        pending_tags(&r),
        vec![1, 2, 3],
        "the unsent ones first, in order"
    );
    assert!(lock(&r.ep.peers)[&key].conn.is_none());
    // A request posted on the connection now follows them.
    r.conn.send(request(4, 8));
    assert_eq!(pending_tags(&r), vec![1, 2, 3, 4]);
}

#[tokio::test]
async fn at_the_end_of_the_stream_requeued_requests_precede_a_racing_one() {
    // A peer gone (its end of the stream read, no retirement) while
    // requests were queued: they go over a new connection, ahead of one
    // posted meanwhile.
    let r = rig(1 << 20).await;
    let key = attached(&r);
    // Each request holds a credit of the endpoint's queue, as a post
    // takes.
    for _ in 0..3 {
        assert!(r.ep.tx.try_take());
    }
    r.conn.send(request(100, 16 << 20));
    r.conn.send(request(1, 8));
    {
        let mut peers = lock(&r.ep.peers);
        let p = peers.get_mut(&key).unwrap();
        p.pending.push(request(3, 8));
        p.connecting = true;
    }
    let credits = r.ep.tx.left();
    crate::driver::end(&r.conn, crate::rx::RxStatus::Closed(None));
    assert!(r.conn.is_dead());
    assert_eq!(pending_tags(&r), vec![1, 3]);
    assert_eq!(
        r.ep.tx.left(),
        credits + 1,
        "the one part-way out failed, its credit back"
    );
}

/// Reads what the connection writes to the test's end, flushing its
/// queue as the writer task would, until the end closes (half-close) or
/// `limit` passes. The bytes, and whether the end came.
async fn read_to_end(r: &crate::rx::tests::Rig, limit: Duration) -> (usize, bool) {
    let mut total = 0;
    let mut buf = vec![0u8; 1 << 16];
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        let _ = r.conn.flush();
        let ready = tokio::time::timeout(Duration::from_millis(20), r.peer.readable()).await;
        if let Ok(Ok(())) = ready {
            match r.peer.try_read(&mut buf) {
                Ok(0) => return (total, true),
                Ok(n) => total += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
    }
    (total, false)
}

#[tokio::test]
async fn a_request_part_way_out_is_finished_before_this_end_half_closes() {
    let mut r = rig(1 << 20).await;
    let key = attached(&r);
    let big = 8 << 20;
    r.conn.send(request(100, big));
    r.conn.send(request(1, 8));
    // The peer's `Shutdown`, through the receive path.
    let st = r.pass(&mut shutdown_frame());
    assert!(
        !matches!(st, crate::rx::RxStatus::Closed(_)),
        "read on after a peer's retirement: {st:?}"
    );
    assert_eq!(pending_tags(&r), vec![1], "the unbegun one waits");
    assert!(lock(&r.ep.peers)[&key].conn.is_none());
    let (n, ended) = read_to_end(&r, Duration::from_secs(10)).await;
    assert!(ended, "half-closed once the request was out");
    assert_eq!(n, HEADER_LEN + big, "the request part-way out, whole");
    assert!(!r.conn.is_dead(), "still read, for what the peer owes");
}

#[tokio::test]
async fn acks_owed_when_the_peer_retires_still_complete_sends() {
    let mut r = rig(1 << 20).await;
    attached(&r);
    // A delivery-complete send, out and waiting for the peer's ack.
    let mut h = Header::new(FrameKind::Msg);
    h.len = 8;
    h.flags |= weft_core::wire::FLAG_ACK_REQ;
    let done = weft_core::completion::OpDone {
        context: 42,
        flags: weft_core::flags::OpFlags::SEND | weft_core::flags::OpFlags::MSG,
        report: true,
        cq: Some(r.cq.clone()),
        cntr: None,
        waiter: None,
    };
    r.conn.send(TxFrame::new(
        h,
        iov1(Bytes::from_static(&[5; 8])),
        Some(done),
    ));
    // The peer retires the connection, then acks the send it took.
    let mut ack = Header::new(FrameKind::Ack);
    ack.seq = 1;
    let mut bytes = Header::new(FrameKind::Shutdown).encode().to_vec();
    bytes.extend_from_slice(&ack.encode());
    let mut s = crate::rx::tests::Script::default().bytes(&bytes);
    let st = r.pass(&mut s);
    assert!(!matches!(st, crate::rx::RxStatus::Closed(_)), "{st:?}");
    let got = r.completions();
    assert_eq!(got.len(), 1);
    let e = got[0].as_ref().expect("completed, not failed");
    assert_eq!((e.context, e.len), (42, 8));
    let (_, ended) = read_to_end(&r, Duration::from_secs(5)).await;
    assert!(ended, "half-closed: nothing was queued");
}

#[tokio::test]
async fn acks_this_end_owes_go_out_before_its_half_close() {
    let mut r = rig(1 << 20).await;
    attached(&r);
    // A delivery-complete request of the peer's was delivered here: its
    // ack waits for a frame to ride with.
    r.conn.answer(7, 0);
    let st = r.pass(&mut shutdown_frame());
    assert!(!matches!(st, crate::rx::RxStatus::Closed(_)), "{st:?}");
    let (n, ended) = read_to_end(&r, Duration::from_secs(5)).await;
    assert!(ended);
    assert_eq!(n, HEADER_LEN, "the ack, then the end");
}

#[tokio::test]
async fn at_the_peers_end_what_is_queued_goes_out_before_the_close() {
    // This end retired the connection while a large read answer was
    // still going out (the peer reads slowly); the peer's half-close
    // arrives before the answer is out: the connection closes only after.
    let mut r = rig(1 << 20).await;
    attached(&r);
    let big = 8 << 20;
    let mut h = Header::new(FrameKind::RmaReadResp);
    h.len = big as u64;
    r.conn
        .send(TxFrame::new(h, iov1(Bytes::from(vec![3u8; big])), None));
    crate::sweep::retire(&r.ep, &r.conn);
    r.conn.answer(9, 0);
    let st = r.pass(&mut crate::rx::tests::Script::default().eof());
    assert_eq!(st, crate::rx::RxStatus::Closed(None));
    crate::driver::end(&r.conn, st);
    assert!(!r.conn.is_dead(), "open until the queue is out");
    let (n, ended) = read_to_end(&r, Duration::from_secs(10)).await;
    assert!(ended);
    assert_eq!(
        n,
        HEADER_LEN + big + HEADER_LEN + HEADER_LEN,
        "the answer, the Shutdown, the ack"
    );
    assert!(r.conn.is_dead(), "closed once it was");
}

#[tokio::test]
async fn acks_riding_on_a_requeued_request_stay_on_the_connection() {
    let mut r = rig(1 << 20).await;
    attached(&r);
    let big = 8 << 20;
    r.conn.send(request(100, big));
    // An ack owed, then a request queued behind the large one: the ack
    // rides on it.
    r.conn.answer(7, 0);
    r.conn.send(request(1, 8));
    let st = r.pass(&mut shutdown_frame());
    assert!(!matches!(st, crate::rx::RxStatus::Closed(_)), "{st:?}");
    assert_eq!(pending_tags(&r), vec![1]);
    let (n, ended) = read_to_end(&r, Duration::from_secs(10)).await;
    assert!(ended);
    assert_eq!(
        n,
        HEADER_LEN + big + HEADER_LEN,
        "the request part-way out, the ack"
    );
}

#[tokio::test]
async fn a_request_on_a_retired_connection_closed_since_is_resent() {
    let r = rig(1 << 20).await;
    attached(&r);
    crate::sweep::retire(&r.ep, &r.conn);
    // The peer never closed it: the sweeper did, after its stall timeout.
    r.conn.fail(Error::TimedOut);
    r.conn.send(request(1, 8));
    assert_eq!(pending_tags(&r), vec![1], "sent again, not failed");
}
