//! Sizes and failures: truncation, oversize and zero-length messages, large
//! messages racing receives, a closed peer, a dropped receive future.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use weft::{Error, OpFlags, RecvMsg, SendMsg, FI_ADDR_UNSPEC};
use weft_integration::{assert_cq_quiet, next_cq, payload, within, Harness, Provider, QUIET};

use super::{post, recv_ok, send_delivered, tagged_recv};

pub(super) async fn truncation(p: Provider) {
    let h = Harness::connless(&p);
    let (a, b, b_addr, _) = h.rdm_pair();
    b.ep.post_recv(BytesMut::zeroed(4), 1).unwrap();
    a.ep.post_send(b_addr, payload(10, 3), 2).unwrap();
    let e = next_cq(&b.cq).await.unwrap_err();
    assert_eq!(e.err, Error::Trunc);
    assert_eq!(e.context, 1);
    assert_eq!(e.olen, 6, "olen = bytes that did not fit");
    assert_eq!(e.len, 4);
    assert!(e.flags.contains(OpFlags::RECV));
    let placed: Vec<u8> = e.bufs.iter().flat_map(|b| b.iter().copied()).collect();
    assert_eq!(&placed[..], &payload(10, 3)[..4]);
    // The endpoint keeps working.
    b.ep.post_recv(BytesMut::zeroed(16), 3).unwrap();
    a.ep.post_send(b_addr, payload(10, 4), 4).unwrap();
    let r = recv_ok(&b).await;
    assert_eq!(r.context, 3);
    assert_eq!(&r.into_bytes()[..], &payload(10, 4)[..]);
}

pub(super) async fn oversize_send_is_msgsize(p: Provider) {
    let h = Harness::connless(&p);
    let (a, _b, b_addr, _) = h.rdm_pair();
    let max = h.info.ep_attr.max_msg_size;
    // One shared (lazily zeroed) buffer, gathered twice: no copy is made.
    let half = Bytes::from(vec![0u8; max / 2 + 1]);
    let msg = SendMsg {
        dest: b_addr,
        iov: vec![half.clone(), half],
        context: 1,
        ..SendMsg::default()
    };
    assert_eq!(
        a.ep.post_sendmsg(msg.clone(), OpFlags::empty())
            .unwrap_err(),
        Error::MsgSize
    );
    let e = within("async oversize", a.ep.sendmsg(msg, OpFlags::empty()))
        .await
        .unwrap_err();
    assert_eq!(e.err, Error::MsgSize);
    assert_cq_quiet(&a.cq, "a rejected post reports nothing").await;
}

pub(super) async fn zero_length_message(p: Provider) {
    let h = Harness::connless(&p);
    let (a, b, b_addr, a_in_b) = h.rdm_pair();
    b.ep.post_recv(BytesMut::zeroed(8), 1).unwrap();
    a.ep.post_send(b_addr, Bytes::new(), 2).unwrap();
    let r = recv_ok(&b).await;
    assert_eq!((r.context, r.len, r.src), (1, 0, a_in_b));
    assert_eq!(recv_ok(&a).await.context, 2);
    // Also into a zero-length buffer, tagged.
    let (got, sent) = within("zero tagged", async {
        tokio::join!(
            b.ep.trecv(BytesMut::new(), FI_ADDR_UNSPEC, 3, 0),
            a.ep.tsend(b_addr, Bytes::new(), 3)
        )
    })
    .await;
    sent.unwrap();
    assert_eq!(got.unwrap().len, 0);
}

pub(super) async fn peer_closed_sends_fail(p: Provider) {
    let h = Harness::connless(&p);
    let (a, b, b_addr, _) = h.rdm_pair();
    b.ep.post_recv(BytesMut::zeroed(8), 1).unwrap();
    within("first send", a.ep.send(b_addr, Bytes::from_static(b"hi")))
        .await
        .unwrap();
    assert_eq!(recv_ok(&b).await.context, 1);
    b.ep.close().unwrap();
    drop(b);
    // Later sends end with an error (a send already in flight when the
    // peer went away may still complete), never hang.
    let mut failed = None;
    for i in 0..50 {
        match within("send to closed peer", a.ep.send(b_addr, payload(1024, i))).await {
            Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let e = failed.expect("sends to a closed peer must fail");
    assert!(e.flags.contains(OpFlags::SEND), "{:?}", e.flags);
    // The post form reports error entries on the CQ.
    a.ep.post_send(b_addr, Bytes::from_static(b"post"), 0xE)
        .unwrap();
    let item = next_cq(&a.cq).await;
    let e = item.unwrap_err();
    assert_eq!(e.context, 0xE);
}

pub(super) async fn dropped_recv_future_withdraws(p: Provider) {
    let h = Harness::connless(&p);
    let (a, b, b_addr, _) = h.rdm_pair();
    // Poll the receive long enough for it to be posted, then drop it.
    let r = tokio::time::timeout(QUIET, b.ep.recv(BytesMut::zeroed(8))).await;
    assert!(r.is_err(), "nothing was sent yet");
    let r =
        tokio::time::timeout(QUIET, b.ep.trecv(BytesMut::zeroed(8), FI_ADDR_UNSPEC, 1, 0)).await;
    assert!(r.is_err());
    a.ep.post_send(b_addr, Bytes::from_static(b"later"), 1)
        .unwrap();
    a.ep.post_tsend(b_addr, Bytes::from_static(b"tagged"), 1, 2)
        .unwrap();
    b.ep.post_recv(BytesMut::zeroed(8), 10).unwrap();
    post(&b, tagged_recv(11, 1, 0, 8), OpFlags::empty());
    let mut got: Vec<(u64, Vec<u8>)> = Vec::new();
    for _ in 0..2 {
        let r = recv_ok(&b).await;
        got.push((r.context, r.into_bytes().to_vec()));
    }
    got.sort();
    assert_eq!(
        got,
        vec![(10, b"later".to_vec()), (11, b"tagged".to_vec())],
        "messages go to the later receives"
    );
    assert_cq_quiet(&b.cq, "withdrawn receives report nothing").await;
}

pub(super) async fn truncation_of_unexpected_and_large(p: Provider) {
    let h = Harness::connless(&p);
    let (a, b, b_addr, _) = h.rdm_pair();
    // Unexpected first, then a receive too small for it.
    send_delivered(&a, b_addr, payload(10, 6), None).await;
    b.ep.post_recv(BytesMut::zeroed(4), 1).unwrap();
    let e = next_cq(&b.cq).await.unwrap_err();
    assert_eq!((e.err, e.context, e.len, e.olen), (Error::Trunc, 1, 4, 6));
    // A large message into a posted receive of half its size (the direct
    // read path), spread over two buffers.
    let m = RecvMsg {
        src: FI_ADDR_UNSPEC,
        bufs: vec![BytesMut::zeroed(10_000), BytesMut::zeroed(30_000)],
        context: 2,
        ..RecvMsg::default()
    };
    post(&b, m, OpFlags::empty());
    a.ep.post_send(b_addr, payload(80_000, 7), 3).unwrap();
    let e = next_cq(&b.cq).await.unwrap_err();
    assert_eq!((e.err, e.context), (Error::Trunc, 2));
    assert_eq!((e.len, e.olen), (40_000, 40_000));
    let placed: Vec<u8> = e.bufs.iter().flat_map(|b| b.iter().copied()).collect();
    assert_eq!(&placed[..], &payload(80_000, 7)[..40_000]);
    // The stream stays in sync: the next message is intact.
    a.ep.post_send(b_addr, payload(100, 8), 4).unwrap();
    let r = within("after truncation", b.ep.recv(BytesMut::zeroed(200)))
        .await
        .unwrap();
    assert_eq!(&r.into_bytes()[..], &payload(100, 8)[..]);
}

pub(super) async fn large_messages_racing_receives(p: Provider) {
    let h = Harness::connless(&p);
    let (a, b, b_addr, _) = h.rdm_pair();
    for (i, len) in [1usize << 16, 1 << 20, 3 << 20].into_iter().enumerate() {
        let data = payload(len, i as u8);
        // Send first, receive right after: the receive may meet the message
        // before, during or after its arrival.
        a.ep.post_send(b_addr, data.clone(), i as u64).unwrap();
        let r = within("large recv", b.ep.recv(BytesMut::zeroed(len)))
            .await
            .unwrap();
        assert_eq!(r.len, len);
        assert!(
            r.into_bytes()[..] == data[..],
            "payload of {len} bytes intact"
        );
        assert_eq!(recv_ok(&a).await.context, i as u64);
    }
}
