//! The API forms: posted and awaited sends and receives, both on one
//! endpoint, and the CQ as a stream.

use bytes::{Bytes, BytesMut};
use weft::{Error, OpFlags};
use weft_integration::{assert_cq_quiet, payload, within, Harness, Provider};

use super::recv_ok;

pub(super) async fn send_recv_post_form(p: Provider) {
    let h = Harness::connless(&p);
    let (a, b, b_addr, _) = h.rdm_pair();
    b.ep.post_recv(BytesMut::zeroed(64), 0x10).unwrap();
    a.ep.post_send(b_addr, Bytes::from_static(b"post form"), 0x20)
        .unwrap();
    let r = recv_ok(&b).await;
    assert_eq!(r.context, 0x10);
    assert!(
        r.flags.contains(OpFlags::RECV | OpFlags::MSG),
        "{:?}",
        r.flags
    );
    assert_eq!(r.len, 9);
    assert_eq!(&r.into_bytes()[..], b"post form");
    let s = recv_ok(&a).await;
    assert_eq!(s.context, 0x20);
    assert!(
        s.flags.contains(OpFlags::SEND | OpFlags::MSG),
        "{:?}",
        s.flags
    );
}

pub(super) async fn send_recv_async_form(p: Provider) {
    let h = Harness::connless(&p);
    let (a, b, b_addr, a_in_b) = h.rdm_pair();
    let (got, sent) = within("async send/recv", async {
        tokio::join!(
            b.ep.recv(BytesMut::zeroed(64)),
            a.ep.send(b_addr, payload(40, 1))
        )
    })
    .await;
    let sent = sent.unwrap();
    assert!(sent.flags.contains(OpFlags::SEND));
    let got = got.unwrap();
    assert_eq!(got.src, a_in_b);
    assert_eq!(&got.into_bytes()[..], &payload(40, 1)[..]);
    assert_cq_quiet(&a.cq, "async completions do not go to the CQ").await;
    assert!(b.cq.is_empty());
}

pub(super) async fn both_forms_on_one_endpoint(p: Provider) {
    let h = Harness::connless(&p);
    let (a, b, b_addr, _) = h.rdm_pair();
    b.ep.post_recv(BytesMut::zeroed(16), 1).unwrap();
    let recv_fut = b.ep.recv(BytesMut::zeroed(16));
    let sends = async {
        a.ep.send(b_addr, Bytes::from_static(b"first"))
            .await
            .unwrap();
        a.ep.post_send(b_addr, Bytes::from_static(b"second"), 2)
            .unwrap();
    };
    let (got, ()) = within("mixed forms", async { tokio::join!(recv_fut, sends) }).await;
    // The posted receive came first, so it took the first message.
    let r = recv_ok(&b).await;
    assert_eq!(r.context, 1);
    assert_eq!(&r.into_bytes()[..], b"first");
    assert_eq!(&got.unwrap().into_bytes()[..], b"second");
    assert_eq!(recv_ok(&a).await.context, 2);
    assert_cq_quiet(&a.cq, "only the posted send reports").await;
}

pub(super) async fn cq_stream_yields_in_order(p: Provider) {
    use futures::StreamExt;
    let h = Harness::connless(&p);
    let (a, b, b_addr, _) = h.rdm_pair();
    b.ep.post_recv(BytesMut::zeroed(8), 1).unwrap();
    b.ep.post_recv(BytesMut::zeroed(8), 2).unwrap();
    b.ep.cancel(2).unwrap();
    a.ep.post_send(b_addr, Bytes::from_static(b"s"), 0).unwrap();
    let mut cq = b.cq.clone();
    let first = within("stream", cq.next()).await.unwrap();
    let second = within("stream", cq.next()).await.unwrap();
    let mut items = [first, second];
    items.sort_by_key(|i| i.is_ok());
    let err = items[0].as_ref().unwrap_err();
    assert_eq!((err.context, err.err), (2, Error::Canceled));
    assert_eq!(items[1].as_ref().unwrap().context, 1);
}
