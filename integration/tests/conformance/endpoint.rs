//! The endpoint state machine, bind rules, close, cancel, queue room and
//! default op flags (spec/fi_endpoint.3.md).

use bytes::{Bytes, BytesMut};
use weft::{AvAttr, BindFlags, CqAttr, Error, OpFlags, FI_ADDR_UNSPEC};
use weft_integration::{assert_cq_quiet, next_cq, within, Harness, Provider};

async fn data_ops_before_enable_are_opbadstate(p: Provider) {
    let h = Harness::connless(&p);
    let ep = h.endpoint();
    assert!(!ep.is_enabled());
    assert_eq!(
        ep.post_send(0, Bytes::from_static(b"x"), 1).unwrap_err(),
        Error::OpBadState
    );
    assert_eq!(
        ep.post_recv(BytesMut::zeroed(4), 1).unwrap_err(),
        Error::OpBadState
    );
    assert_eq!(
        ep.post_trecv(BytesMut::zeroed(4), FI_ADDR_UNSPEC, 0, 0, 1)
            .unwrap_err(),
        Error::OpBadState
    );
    assert_eq!(
        ep.inject(0, Bytes::from_static(b"x")).unwrap_err(),
        Error::OpBadState
    );
    let e = within("send before enable", ep.send(0, Bytes::from_static(b"x")))
        .await
        .unwrap_err();
    assert_eq!(e.err, Error::OpBadState);
    let e = within("recv before enable", ep.recv(BytesMut::zeroed(4)))
        .await
        .unwrap_err();
    assert_eq!(e.err, Error::OpBadState);
    assert_eq!(e.bufs.len(), 1, "the buffer comes back");
    assert_eq!(ep.cancel(1).unwrap_err(), Error::OpBadState);
    assert_eq!(ep.tx_size_left().unwrap_err(), Error::OpBadState);
    assert_eq!(ep.rx_size_left().unwrap_err(), Error::OpBadState);
    assert_eq!(ep.local_addr().unwrap_err(), Error::OpBadState);
}

async fn enable_without_cq_is_nocq(p: Provider) {
    let h = Harness::connless(&p);
    let av = h.av();
    let ep = h.endpoint();
    ep.bind_av(&av).unwrap();
    assert_eq!(ep.enable().unwrap_err(), Error::NoCq);
    // A transmit CQ alone is not enough either.
    let cq = h.cq();
    ep.bind_cq(&cq, BindFlags::TRANSMIT).unwrap();
    assert_eq!(ep.enable().unwrap_err(), Error::NoCq);
    assert!(!ep.is_enabled());
    // A receive counter completes the set.
    let c = h.domain.counter().unwrap();
    ep.bind_counter(&c, BindFlags::RECV).unwrap();
    ep.enable().unwrap();
    assert!(ep.is_enabled());
}

async fn rdm_without_av_is_noav(p: Provider) {
    let h = Harness::connless(&p);
    let ep = h.endpoint();
    let cq = h.cq();
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
        .unwrap();
    assert_eq!(ep.enable().unwrap_err(), Error::NoAv);
    let av = h.av();
    ep.bind_av(&av).unwrap();
    ep.enable().unwrap();
}

async fn msg_without_eq_is_noeq(p: Provider) {
    let h = Harness::msg(&p);
    let ep = h.endpoint();
    let cq = h.cq();
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
        .unwrap();
    assert_eq!(ep.enable().unwrap_err(), Error::NoEq);
    // MSG endpoints take no AV.
    assert_eq!(ep.bind_av(&h.av()).unwrap_err(), Error::Inval);
    let eq = h.eq();
    ep.bind_eq(&eq).unwrap();
    ep.enable().unwrap();
}

async fn objects_from_another_domain_are_domain(p: Provider) {
    let h = Harness::connless(&p);
    let other = h.other_domain();
    let ep = h.endpoint();
    let cq = other.cq(CqAttr::default()).unwrap();
    assert_eq!(
        ep.bind_cq(&cq, BindFlags::TRANSMIT).unwrap_err(),
        Error::Domain
    );
    let c = other.counter().unwrap();
    assert_eq!(
        ep.bind_counter(&c, BindFlags::SEND).unwrap_err(),
        Error::Domain
    );
    let av = other.av(AvAttr::default()).unwrap();
    assert_eq!(ep.bind_av(&av).unwrap_err(), Error::Domain);
    // Nothing got bound: the AV can close.
    av.close().unwrap();
}

async fn binds_after_enable_are_rejected(p: Provider) {
    let h = Harness::connless(&p);
    let e = h.rdm_ep();
    let cq = h.cq();
    assert_eq!(
        e.ep.bind_cq(&cq, BindFlags::TRANSMIT).unwrap_err(),
        Error::OpBadState
    );
    let c = h.domain.counter().unwrap();
    assert_eq!(
        e.ep.bind_counter(&c, BindFlags::SEND).unwrap_err(),
        Error::OpBadState
    );
    assert_eq!(e.ep.bind_av(&h.av()).unwrap_err(), Error::OpBadState);
    assert_eq!(e.ep.bind_eq(&h.eq()).unwrap_err(), Error::OpBadState);
    assert_eq!(e.ep.set_src_addr(e.addr()).unwrap_err(), Error::OpBadState);
    assert_eq!(e.ep.enable().unwrap_err(), Error::OpBadState);
    assert!(e.ep.is_enabled(), "a rejected bind leaves the EP enabled");
}

async fn bad_bind_flags(p: Provider) {
    let h = Harness::connless(&p);
    let ep = h.endpoint();
    let cq = h.cq();
    for f in [
        BindFlags::empty(),
        BindFlags::SELECTIVE_COMPLETION,
        BindFlags::READ,
        BindFlags::TRANSMIT | BindFlags::REMOTE_WRITE,
    ] {
        assert_eq!(ep.bind_cq(&cq, f).unwrap_err(), Error::BadFlags, "cq {f:?}");
    }
    let c = h.domain.counter().unwrap();
    for f in [
        BindFlags::empty(),
        BindFlags::SEND | BindFlags::SELECTIVE_COMPLETION,
    ] {
        assert_eq!(
            ep.bind_counter(&c, f).unwrap_err(),
            Error::BadFlags,
            "cntr {f:?}"
        );
    }
    // One CQ per direction.
    ep.bind_cq(&cq, BindFlags::TRANSMIT).unwrap();
    assert_eq!(
        ep.bind_cq(&h.cq(), BindFlags::TRANSMIT).unwrap_err(),
        Error::Inval
    );
    ep.bind_cq(&h.cq(), BindFlags::RECV).unwrap();
}

async fn rma_without_the_capability_is_nosys(p: Provider) {
    // Hints naming only message caps: the result has no RMA, whatever
    // the provider could do.
    let info = p
        .try_info_with(p.connless_type(), |h| {
            h.caps = weft::Caps::MSG | weft::Caps::TAGGED;
        })
        .expect("a message offer");
    let h = Harness::with_info(&p, info);
    assert!(
        !h.info.caps.contains(weft::Caps::RMA),
        "this test is for providers without RMA"
    );
    let ep = h.endpoint();
    let c = h.domain.counter().unwrap();
    for f in [
        BindFlags::READ,
        BindFlags::WRITE,
        BindFlags::REMOTE_READ,
        BindFlags::REMOTE_WRITE,
    ] {
        assert_eq!(ep.bind_counter(&c, f).unwrap_err(), Error::NoSys, "{f:?}");
    }
    ep.bind_counter(&c, BindFlags::SEND | BindFlags::RECV)
        .unwrap();
    // RMA operations need the capability too; their buffers come back.
    let (a, _b, to_b, _) = h.rdm_pair();
    let bytes = bytes::Bytes::from_static(b"rma");
    assert_eq!(a.ep.post_write(to_b, bytes, 0, 0, 1), Err(Error::NoSys));
    let r = a.ep.post_rmamsg(
        weft::RmaMsg {
            dest: to_b,
            op: weft::RmaOp::Read {
                bufs: vec![bytes::BytesMut::zeroed(4)],
            },
            addr: 0,
            key: 0,
            context: 2,
        },
        weft::OpFlags::empty(),
    );
    match r {
        Err((Error::NoSys, weft::RmaOp::Read { bufs })) => assert_eq!(bufs[0].len(), 4),
        other => panic!("read without FI_RMA: {other:?}"),
    }
}

async fn close_discards_outstanding_ops(p: Provider) {
    let h = Harness::connless(&p);
    let e = h.rdm_ep();
    e.ep.post_recv(BytesMut::zeroed(16), 1).unwrap();
    e.ep.post_trecv(BytesMut::zeroed(16), FI_ADDR_UNSPEC, 3, 0, 2)
        .unwrap();
    e.ep.close().unwrap();
    assert!(!e.ep.is_enabled());
    assert_cq_quiet(&e.cq, "close discards receives without completions").await;
}

async fn double_close_and_ops_after_close(p: Provider) {
    let h = Harness::connless(&p);
    let (a, _b, b_addr, _) = h.rdm_pair();
    a.ep.close().unwrap();
    assert_eq!(a.ep.close().unwrap_err(), Error::OpBadState);
    assert_eq!(
        a.ep.post_send(b_addr, Bytes::from_static(b"x"), 1)
            .unwrap_err(),
        Error::OpBadState
    );
    assert_eq!(
        a.ep.post_recv(BytesMut::zeroed(4), 1).unwrap_err(),
        Error::OpBadState
    );
    assert_eq!(a.ep.enable().unwrap_err(), Error::OpBadState);
    let e = within(
        "send after close",
        a.ep.send(b_addr, Bytes::from_static(b"x")),
    )
    .await
    .unwrap_err();
    assert_eq!(e.err, Error::OpBadState);
    // A disabled endpoint closes once, too.
    let d = h.endpoint();
    d.close().unwrap();
    assert_eq!(d.close().unwrap_err(), Error::OpBadState);
    assert_eq!(d.enable().unwrap_err(), Error::OpBadState);
}

async fn size_left(p: Provider) {
    let h = Harness::connless(&p);
    let e = h.rdm_ep();
    let tx0 = e.ep.tx_size_left().unwrap();
    let rx0 = e.ep.rx_size_left().unwrap();
    assert!(tx0 > 0 && tx0 <= h.info.tx_attr.size, "tx {tx0}");
    assert!(rx0 > 0 && rx0 <= h.info.rx_attr.size, "rx {rx0}");
    e.ep.post_recv(BytesMut::zeroed(8), 1).unwrap();
    e.ep.post_recv(BytesMut::zeroed(8), 2).unwrap();
    assert_eq!(e.ep.rx_size_left().unwrap(), rx0 - 2);
    e.ep.cancel(1).unwrap();
    e.ep.cancel(2).unwrap();
    for _ in 0..2 {
        assert_eq!(next_cq(&e.cq).await.unwrap_err().err, Error::Canceled);
    }
    assert_eq!(e.ep.rx_size_left().unwrap(), rx0, "cancel returns the room");
}

async fn op_flags_get_set(p: Provider) {
    let h = Harness::connless(&p);
    let ep = h.endpoint();
    assert_eq!(
        ep.op_flags(OpFlags::TRANSMIT).unwrap(),
        h.info.tx_attr.op_flags
    );
    assert_eq!(ep.op_flags(OpFlags::RECV).unwrap(), h.info.rx_attr.op_flags);
    ep.set_op_flags(
        OpFlags::TRANSMIT,
        OpFlags::COMPLETION | OpFlags::DELIVERY_COMPLETE,
    )
    .unwrap();
    ep.set_op_flags(OpFlags::RECV, OpFlags::COMPLETION).unwrap();
    assert_eq!(
        ep.op_flags(OpFlags::TRANSMIT).unwrap(),
        OpFlags::COMPLETION | OpFlags::DELIVERY_COMPLETE
    );
    assert_eq!(ep.op_flags(OpFlags::RECV).unwrap(), OpFlags::COMPLETION);
    // TRANSMIT xor RECV.
    for side in [OpFlags::TRANSMIT | OpFlags::RECV, OpFlags::empty()] {
        assert_eq!(ep.op_flags(side).unwrap_err(), Error::Inval);
        assert_eq!(
            ep.set_op_flags(side, OpFlags::COMPLETION).unwrap_err(),
            Error::Inval
        );
    }
    // Flags that do not belong to the side.
    assert_eq!(
        ep.set_op_flags(OpFlags::TRANSMIT, OpFlags::PEEK)
            .unwrap_err(),
        Error::BadFlags
    );
    assert_eq!(
        ep.set_op_flags(OpFlags::RECV, OpFlags::INJECT).unwrap_err(),
        Error::BadFlags
    );
    assert_eq!(ep.op_flags(OpFlags::RECV).unwrap(), OpFlags::COMPLETION);
}

async fn cancel_pending_receive(p: Provider) {
    let h = Harness::connless(&p);
    let (a, b, b_addr, _) = h.rdm_pair();
    b.ep.post_recv(BytesMut::zeroed(16), 0xCA).unwrap();
    b.ep.cancel(0xCA).unwrap();
    let item = next_cq(&b.cq).await;
    let e = item.unwrap_err();
    assert_eq!(e.err, Error::Canceled);
    assert_eq!(e.context, 0xCA);
    assert!(e.flags.contains(OpFlags::RECV), "{:?}", e.flags);
    assert_eq!(b.cq.read_err().unwrap_err(), Error::Again, "one entry only");
    assert_eq!(
        b.ep.cancel(0xCA).unwrap_err(),
        Error::NoEnt,
        "already cancelled"
    );

    // A completed receive cannot be cancelled.
    b.ep.post_recv(BytesMut::zeroed(16), 0xCB).unwrap();
    a.ep.post_send(b_addr, Bytes::from_static(b"done"), 1)
        .unwrap();
    let ok = next_cq(&b.cq).await.unwrap();
    assert_eq!(ok.context, 0xCB);
    assert_eq!(b.ep.cancel(0xCB).unwrap_err(), Error::NoEnt);
    assert_eq!(
        b.ep.cancel(0x1234).unwrap_err(),
        Error::NoEnt,
        "never posted"
    );
    assert_cq_quiet(&b.cq, "no entries after failed cancels").await;
}

async fn cancel_read_through_stream_form(p: Provider) {
    // The cancelled entry is visible through cq.read as Avail first.
    let h = Harness::connless(&p);
    let e = h.rdm_ep();
    e.ep.post_trecv(BytesMut::zeroed(8), FI_ADDR_UNSPEC, 1, 0, 77)
        .unwrap();
    e.ep.cancel(77).unwrap();
    within("cancel entry", async {
        while e.cq.is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(e.cq.read(4).unwrap_err(), Error::Avail);
    let err = e.cq.read_err().unwrap();
    assert_eq!((err.context, err.err), (77, Error::Canceled));
    assert!(err.flags.contains(OpFlags::RECV | OpFlags::TAGGED));
    assert_eq!(e.cq.read_err().unwrap_err(), Error::Again);
    assert_eq!(e.cq.read(4).unwrap_err(), Error::Again);
}

async fn default_op_flags_apply_to_operations(p: Provider) {
    let h = Harness::connless(&p);
    let b = h.rdm_ep();
    // Set before enable.
    let av = h.av();
    let cq = h.cq();
    let ep = h.endpoint();
    ep.bind_av(&av).unwrap();
    ep.bind_cq(
        &cq,
        BindFlags::TRANSMIT | BindFlags::RECV | BindFlags::SELECTIVE_COMPLETION,
    )
    .unwrap();
    ep.set_op_flags(OpFlags::TRANSMIT, OpFlags::COMPLETION)
        .unwrap();
    ep.enable().unwrap();
    let dest = av
        .insert_sync(&[b.addr()], Default::default())
        .unwrap()
        .fi_addrs[0];
    ep.post_send(dest, Bytes::from_static(b"a"), 1).unwrap();
    assert_eq!(
        next_cq(&cq).await.unwrap().context,
        1,
        "default COMPLETION reports under selective completion"
    );
    // Changed after enable: the reported flags and the behaviour agree.
    ep.set_op_flags(OpFlags::TRANSMIT, OpFlags::empty())
        .unwrap();
    assert_eq!(ep.op_flags(OpFlags::TRANSMIT).unwrap(), OpFlags::empty());
    ep.post_send(dest, Bytes::from_static(b"b"), 2).unwrap();
    assert_cq_quiet(&cq, "COMPLETION was cleared from the defaults").await;
    for _ in 0..2 {
        within("recv", b.ep.recv(BytesMut::zeroed(4)))
            .await
            .unwrap();
    }
}

async fn missing_capability_is_nosys(p: Provider) {
    let h = Harness::connless(&p);
    let mut hints = weft::Info::default();
    hints.ep_attr.ep_type = p.connless_type();
    hints.fabric_attr.prov_name = Some(p.name.to_string());
    hints.caps = weft::Caps::TAGGED;
    hints.domain_attr.name = h.info.domain_attr.name.clone();
    let info = weft::getinfo(Some(&hints)).unwrap().remove(0);
    assert!(info.caps.contains(weft::Caps::TAGGED));
    assert!(!info.caps.contains(weft::Caps::MSG), "{:?}", info.caps);
    let e = h.rdm_ep_with(&info, h.av(), BindFlags::empty());
    assert_eq!(
        e.ep.post_send(0, Bytes::from_static(b"x"), 1).unwrap_err(),
        Error::NoSys
    );
    assert_eq!(
        e.ep.post_recv(BytesMut::zeroed(4), 1).unwrap_err(),
        Error::NoSys
    );
    e.ep.post_trecv(BytesMut::zeroed(4), FI_ADDR_UNSPEC, 0, 0, 2)
        .unwrap();
}

async fn send_to_self(p: Provider) {
    let h = Harness::connless(&p);
    let e = h.rdm_ep();
    let me = e.insert(&e);
    let (got, sent) = within("loopback to self", async {
        tokio::join!(
            e.ep.recv(BytesMut::zeroed(8)),
            e.ep.send(me, Bytes::from_static(b"self"))
        )
    })
    .await;
    sent.unwrap();
    let got = got.unwrap();
    assert_eq!(got.src, me);
    assert_eq!(&got.into_bytes()[..], b"self");
}

/// `fi_getopt`/`fi_setopt`: what an endpoint has answers, what it lacks
/// is `NoProtoOpt`, the read-only option refuses a set with `NoSys`.
/// `FI_OPT_MIN_MULTI_RECV` answers where `FI_MULTI_RECV` is offered.
async fn getopt_setopt(p: Provider) {
    use weft::EpOpt;
    let h = Harness::connless(&p);
    let rdm = h.endpoint();
    // FI_OPT_MIN_MULTI_RECV exists where FI_MULTI_RECV does
    // (`multi_recv.rs` checks its values).
    let multi = h.info.caps.contains(weft::Caps::MULTI_RECV);
    assert_eq!(rdm.getopt(EpOpt::MinMultiRecv).is_ok(), multi);
    assert_eq!(rdm.setopt(EpOpt::MinMultiRecv, 64).is_ok(), multi);
    for opt in [EpOpt::BufferedMin, EpOpt::BufferedLimit, EpOpt::CmDataSize] {
        assert_eq!(
            rdm.getopt(opt).unwrap_err(),
            Error::NoProtoOpt,
            "{opt:?} on RDM"
        );
        assert_eq!(
            rdm.setopt(opt, 64).unwrap_err(),
            Error::NoProtoOpt,
            "{opt:?} on RDM"
        );
    }
    let h = Harness::msg(&p);
    let msg = h.endpoint();
    assert_eq!(
        msg.getopt(EpOpt::CmDataSize).unwrap(),
        h.info.ep_attr.cm_data_size
    );
    assert_eq!(msg.setopt(EpOpt::CmDataSize, 8).unwrap_err(), Error::NoSys);
}

/// `tx_attr.tclass`: a DSCP value or a label is applied (the endpoint
/// works with it); a class that is neither is `Inval` at creation.
async fn traffic_class_applied(p: Provider) {
    let h = Harness::connless(&p);
    let mut bad = h.info.clone();
    bad.tx_attr.tclass = weft::tclass::dscp_set(64);
    assert_eq!(h.domain.endpoint(&bad).unwrap_err(), Error::Inval);
    bad.tx_attr.tclass = weft::tclass::LABEL + 99;
    assert_eq!(h.domain.endpoint(&bad).unwrap_err(), Error::Inval);
    for tc in [weft::tclass::dscp_set(26), weft::tclass::LOW_LATENCY] {
        let mut info = h.info.clone();
        info.tx_attr.tclass = tc;
        let av = h.av();
        let cq = h.cq();
        let ep = h.domain.endpoint(&info).unwrap();
        ep.bind_av(&av).unwrap();
        ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
            .unwrap();
        ep.enable().unwrap();
        let dest = av
            .insert_sync(&[ep.local_addr().unwrap()], Default::default())
            .unwrap()
            .fi_addrs[0];
        let recv = ep.trecv(BytesMut::zeroed(16), weft::FI_ADDR_UNSPEC, 9, 0);
        let send = ep.tsend(dest, Bytes::from_static(b"classy"), 9);
        let (got, sent) = within("exchange", async { tokio::join!(recv, send) }).await;
        sent.unwrap();
        assert_eq!(&got.unwrap().bufs[0][..], b"classy");
    }
}

provider_tests! {
    traffic_class_applied,
    getopt_setopt,
    default_op_flags_apply_to_operations,
    missing_capability_is_nosys,
    send_to_self,
    data_ops_before_enable_are_opbadstate,
    enable_without_cq_is_nocq,
    rdm_without_av_is_noav,
    msg_without_eq_is_noeq,
    objects_from_another_domain_are_domain,
    binds_after_enable_are_rejected,
    bad_bind_flags,
    rma_without_the_capability_is_nosys,
    close_discards_outstanding_ops,
    double_close_and_ops_after_close,
    size_left,
    op_flags_get_set,
    cancel_pending_receive,
    cancel_read_through_stream_form,
}

// The cases that apply to udp's FI_EP_DGRAM endpoints.
udp_tests! {
    traffic_class_applied,
    default_op_flags_apply_to_operations,
    missing_capability_is_nosys,
    send_to_self,
    data_ops_before_enable_are_opbadstate,
    enable_without_cq_is_nocq,
    rdm_without_av_is_noav,
    objects_from_another_domain_are_domain,
    binds_after_enable_are_rejected,
    bad_bind_flags,
    rma_without_the_capability_is_nosys,
    close_discards_outstanding_ops,
    double_close_and_ops_after_close,
    size_left,
    cancel_pending_receive,
    cancel_read_through_stream_form,
}

// The cases that apply to shm (the others need MSG endpoints).
shm_tests! {
    traffic_class_applied,
    default_op_flags_apply_to_operations,
    missing_capability_is_nosys,
    send_to_self,
    data_ops_before_enable_are_opbadstate,
    enable_without_cq_is_nocq,
    rdm_without_av_is_noav,
    objects_from_another_domain_are_domain,
    binds_after_enable_are_rejected,
    bad_bind_flags,
    rma_without_the_capability_is_nosys,
    close_discards_outstanding_ops,
    double_close_and_ops_after_close,
    size_left,
    op_flags_get_set,
    cancel_pending_receive,
    cancel_read_through_stream_form,
}
