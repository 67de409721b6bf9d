//! What a completion carries: remote CQ data, source addresses (also with
//! a map AV or a sender inserted late), scatter/gather buffers.

use bytes::{Bytes, BytesMut};
use weft::{
    AvAttr, AvType, BindFlags, Error, OpFlags, RecvMsg, SendMsg, FI_ADDR_NOTAVAIL, FI_ADDR_UNSPEC,
};
use weft_integration::{payload, within, Harness, Provider};

use super::{post, recv_ok, send_delivered};

pub(super) async fn remote_cq_data(p: Provider) {
    let h = Harness::connless(&p);
    let (a, b, b_addr, _) = h.rdm_pair();
    b.ep.post_recv(BytesMut::zeroed(16), 1).unwrap();
    a.ep.post_senddata(b_addr, Bytes::from_static(b"with data"), 0xFEED_BEEF, 2)
        .unwrap();
    let r = recv_ok(&b).await;
    assert!(r.flags.contains(OpFlags::REMOTE_CQ_DATA), "{:?}", r.flags);
    assert_eq!(r.data, 0xFEED_BEEF);
    assert_eq!(&r.into_bytes()[..], b"with data");
    // Without data, no flag.
    b.ep.post_recv(BytesMut::zeroed(16), 3).unwrap();
    a.ep.post_send(b_addr, Bytes::from_static(b"none"), 4)
        .unwrap();
    let r = recv_ok(&b).await;
    assert_eq!(r.context, 3);
    assert!(!r.flags.contains(OpFlags::REMOTE_CQ_DATA));
}

pub(super) async fn source_address_in_completions(p: Provider) {
    let h = Harness::connless(&p);
    let b = h.rdm_ep();
    let a = h.rdm_ep();
    let c = h.rdm_ep();
    // Pad b's AV so handles differ from 0.
    b.insert(&b);
    let a_in_b = b.insert(&a);
    let b_from_a = a.insert(&b);
    let b_from_c = c.insert(&b);
    a.ep.post_send(b_from_a, Bytes::from_static(b"a"), 0)
        .unwrap();
    let r = within("recv from a", b.ep.recv(BytesMut::zeroed(4)))
        .await
        .unwrap();
    assert_eq!(r.src, a_in_b, "FI_SOURCE: the sender's handle");
    // An unknown sender is FI_ADDR_NOTAVAIL.
    c.ep.post_send(b_from_c, Bytes::from_static(b"c"), 0)
        .unwrap();
    let r = within("recv from c", b.ep.recv(BytesMut::zeroed(4)))
        .await
        .unwrap();
    assert_eq!(r.src, FI_ADDR_NOTAVAIL);
}

pub(super) async fn map_av_messaging(p: Provider) {
    let h = Harness::connless(&p);
    let map = || {
        h.av_with(AvAttr {
            av_type: AvType::Map,
            ..AvAttr::default()
        })
    };
    let a = h.rdm_ep_with(&h.info, map(), BindFlags::empty());
    let b = h.rdm_ep_with(&h.info, map(), BindFlags::empty());
    let b_addr = a.insert(&b);
    let a_in_b = b.insert(&a);
    let (got, sent) = within("MAP send/recv", async {
        tokio::join!(
            b.ep.trecv(BytesMut::zeroed(8), a_in_b, 1, 0),
            a.ep.tsend(b_addr, Bytes::from_static(b"map"), 1)
        )
    })
    .await;
    sent.unwrap();
    let got = got.unwrap();
    assert_eq!(got.src, a_in_b);
    assert_eq!(&got.into_bytes()[..], b"map");
}

pub(super) async fn iov_send_and_recv(p: Provider) {
    let h = Harness::connless(&p);
    let (a, b, b_addr, _) = h.rdm_pair();
    let parts = [payload(3, 1), payload(10, 2), payload(0, 3), payload(7, 4)];
    let whole: Vec<u8> = parts.iter().flat_map(|b| b.iter().copied()).collect();
    let m = RecvMsg {
        src: FI_ADDR_UNSPEC,
        bufs: vec![
            BytesMut::zeroed(4),
            BytesMut::zeroed(4),
            BytesMut::zeroed(32),
        ],
        context: 1,
        ..RecvMsg::default()
    };
    post(&b, m, OpFlags::empty());
    a.ep.post_sendmsg(
        SendMsg {
            dest: b_addr,
            iov: parts.to_vec(),
            context: 2,
            ..SendMsg::default()
        },
        OpFlags::empty(),
    )
    .unwrap();
    let r = recv_ok(&b).await;
    assert_eq!(r.len, 20);
    assert_eq!(r.bufs.len(), 3);
    assert_eq!(&r.bufs[0][..], &whole[..4], "buffers fill in order");
    assert_eq!(&r.bufs[1][..], &whole[4..8]);
    assert_eq!(&r.bufs[2][..], &whole[8..]);
    assert_eq!(&r.into_bytes()[..], &whole[..]);
    assert_eq!(recv_ok(&a).await.context, 2);
    // More buffers than iov_limit is Inval.
    let too_many = vec![Bytes::from_static(b"x"); h.info.tx_attr.iov_limit + 1];
    let e =
        a.ep.post_sendmsg(
            SendMsg {
                dest: b_addr,
                iov: too_many,
                ..SendMsg::default()
            },
            OpFlags::empty(),
        )
        .unwrap_err();
    assert_eq!(e, Error::Inval);
}

pub(super) async fn late_inserted_sender_reported_as_source(p: Provider) {
    let h = Harness::connless(&p);
    let a = h.rdm_ep();
    let b = h.rdm_ep();
    let b_addr = a.insert(&b);
    send_delivered(&a, b_addr, Bytes::from_static(b"early"), None).await;
    let a_in_b = b.insert(&a);
    let r = within("recv", b.ep.recv(BytesMut::zeroed(8)))
        .await
        .unwrap();
    assert_eq!(
        r.src, a_in_b,
        "the source is known by the time it is received"
    );
}
