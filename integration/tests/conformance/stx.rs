//! Shared transmit contexts (`fi_stx_context`, fi_endpoint(3)): endpoints
//! bound at creation (`tx_ctx_cnt = FI_SHARED_CONTEXT`) post their
//! transmit operations into the context's one queue: its room is shared,
//! each operation still completes on its endpoint's CQ. Providers whose
//! offers have none (`max_ep_stx_ctx` 0) must refuse them.

use bytes::{Bytes, BytesMut};
use weft::{BindFlags, EpType, Error, SharedTxContext, TxAttr, SHARED_CONTEXT};
use weft_integration::{within, Harness, Provider, RdmEp};

/// An enabled RDM endpoint of `h` with `av`, sending through `stx`.
fn bound(h: &Harness, av: &weft::AddressVector, stx: &SharedTxContext) -> RdmEp {
    let cq = h.cq();
    let ep = h.endpoint();
    ep.bind_av(av).unwrap();
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
        .unwrap();
    ep.bind_stx(stx).unwrap();
    ep.enable().unwrap();
    RdmEp {
        ep,
        av: av.clone(),
        cq,
    }
}

/// Two endpoints share one queue's room: what one has in flight the
/// other cannot post; an endpoint closed with sends in flight gives its
/// room back; sends through the context complete on their endpoint's CQ.
async fn endpoints_share_the_queue(p: Provider) {
    let Some(info) = p.try_info_with(EpType::Rdm, |h| h.ep_attr.tx_ctx_cnt = SHARED_CONTEXT) else {
        let h = Harness::rdm(&p);
        assert_eq!(h.info.domain_attr.max_ep_stx_ctx, 0);
        let e = h.domain.stx_context(&TxAttr::default()).unwrap_err();
        assert_eq!(e, Error::NoSys);
        return;
    };
    assert_eq!(info.ep_attr.tx_ctx_cnt, SHARED_CONTEXT);
    let h = Harness::with_info(&p, info);
    let stx = h
        .domain
        .stx_context(&TxAttr {
            size: 4,
            ..TxAttr::default()
        })
        .unwrap();
    assert_eq!(stx.attr().size, 4);
    assert_eq!(stx.attr().iov_limit, h.info.tx_attr.iov_limit);
    let av = h.av();
    let (a, b) = (bound(&h, &av, &stx), bound(&h, &av, &stx));
    // A peer that takes the connection but never answers the handshake:
    // sends to it stay in flight.
    let stalled = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = weft::encode_sockaddr(&stalled.local_addr().unwrap());
    let to_stalled = av
        .insert_sync(&[addr], Default::default())
        .unwrap()
        .fi_addrs[0];
    for i in 0..3 {
        a.ep.post_send(to_stalled, Bytes::from_static(b"x"), i)
            .unwrap();
    }
    assert_eq!(stx.tx_size_left().unwrap(), 1);
    assert_eq!(b.ep.tx_size_left().unwrap(), 1, "a's sends take b's room");
    b.ep.post_send(to_stalled, Bytes::from_static(b"y"), 3)
        .unwrap();
    assert_eq!(
        a.ep.post_send(to_stalled, Bytes::from_static(b"z"), 4)
            .unwrap_err(),
        Error::Again
    );
    // a closes with three sends in flight: discarded, their room back.
    a.ep.close().unwrap();
    assert_eq!(stx.tx_size_left().unwrap(), 3);
    // b's sends to a live peer complete on b's CQ.
    let c = h.rdm_ep();
    let to_c = b.insert(&c);
    let recv = c.ep.recv(BytesMut::zeroed(8));
    let (sent, got) = tokio::join!(b.ep.send(to_c, Bytes::from_static(b"hi")), recv);
    sent.unwrap();
    assert_eq!(&got.unwrap().into_bytes()[..], b"hi");
    b.ep.post_send(to_c, Bytes::from_static(b"ho"), 9).unwrap();
    let e = within("b's CQ", weft_integration::next_cq(&b.cq))
        .await
        .unwrap();
    assert_eq!(e.context, 9);
    assert_eq!(
        stx.tx_size_left().unwrap(),
        3,
        "b's stalled send still holds one"
    );
    drop(stalled);
}

/// Binding rules and close.
async fn binding_rules_and_close(p: Provider) {
    let Some(info) = p.try_info_with(EpType::Rdm, |h| h.ep_attr.tx_ctx_cnt = SHARED_CONTEXT) else {
        return;
    };
    let h = Harness::with_info(&p, info);
    let stx = h.domain.stx_context(&TxAttr::default()).unwrap();
    assert_eq!(stx.attr().size, h.info.tx_attr.size);
    let bad = TxAttr {
        op_flags: weft::OpFlags::COMPLETION,
        ..TxAttr::default()
    };
    assert_eq!(h.domain.stx_context(&bad).unwrap_err(), Error::BadFlags);
    let ep = h.endpoint();
    let other = h.other_domain().stx_context(&TxAttr::default()).unwrap();
    assert_eq!(ep.bind_stx(&other).unwrap_err(), Error::Domain);
    ep.bind_stx(&stx).unwrap();
    assert_eq!(ep.bind_stx(&stx).unwrap_err(), Error::Inval);
    assert_eq!(stx.close().unwrap_err(), Error::Busy);
    ep.close().unwrap();
    stx.close().unwrap();
    assert_eq!(stx.tx_size_left().unwrap_err(), Error::OpBadState);
    assert_eq!(h.endpoint().bind_stx(&stx).unwrap_err(), Error::OpBadState);
    // After enable.
    let live = h.rdm_ep();
    let stx2 = h.domain.stx_context(&TxAttr::default()).unwrap();
    assert_eq!(live.ep.bind_stx(&stx2).unwrap_err(), Error::OpBadState);
}

provider_tests! {
    endpoints_share_the_queue,
    binding_rules_and_close,
}
