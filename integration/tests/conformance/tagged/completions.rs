//! Where completions go: inject without one, selective completion on both
//! sides, delivery complete, errors counted on the counter.

use bytes::{Bytes, BytesMut};
use weft::{BindFlags, Error, OpFlags, RecvMsg, SendMsg, FI_ADDR_UNSPEC};
use weft_integration::{assert_cq_quiet, next_cq, payload, within, Harness, Provider, RdmEp};

use super::{post, recv_ok};

pub(super) async fn inject_no_completion_counter_counts(p: Provider) {
    let h = Harness::connless(&p);
    let b = h.rdm_ep();
    let av = h.av();
    let cq = h.cq();
    let cntr = h.domain.counter().unwrap();
    let ep = h.endpoint();
    ep.bind_av(&av).unwrap();
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
        .unwrap();
    ep.bind_counter(&cntr, BindFlags::SEND).unwrap();
    ep.enable().unwrap();
    let a = RdmEp { ep, av, cq };
    let b_addr = a.insert(&b);
    a.ep.inject(b_addr, Bytes::from_static(b"inj1")).unwrap();
    a.ep.tinject(b_addr, Bytes::from_static(b"inj2"), 5)
        .unwrap();
    assert_eq!(within("send counter", cntr.wait(2)).await.unwrap(), 2);
    let r = within("recv inject", b.ep.recv(BytesMut::zeroed(8)))
        .await
        .unwrap();
    assert_eq!(&r.into_bytes()[..], b"inj1");
    let r = within(
        "recv tinject",
        b.ep.trecv(BytesMut::zeroed(8), FI_ADDR_UNSPEC, 5, 0),
    )
    .await
    .unwrap();
    assert_eq!(&r.into_bytes()[..], b"inj2");
    assert_cq_quiet(&a.cq, "inject generates no completion").await;
    // Above inject_size: MsgSize.
    let big = payload(h.info.tx_attr.inject_size + 1, 0);
    assert_eq!(a.ep.inject(b_addr, big).unwrap_err(), Error::MsgSize);
}

pub(super) async fn selective_completion(p: Provider) {
    let h = Harness::connless(&p);
    let b = h.rdm_ep();
    let a = h.rdm_ep_with(&h.info, h.av(), BindFlags::SELECTIVE_COMPLETION);
    let b_addr = a.insert(&b);
    a.ep.post_send(b_addr, Bytes::from_static(b"quiet"), 1)
        .unwrap();
    a.ep.post_sendmsg(
        SendMsg {
            dest: b_addr,
            iov: vec![Bytes::from_static(b"loud")],
            context: 2,
            ..SendMsg::default()
        },
        OpFlags::COMPLETION,
    )
    .unwrap();
    let r = recv_ok(&a).await;
    assert_eq!(r.context, 2, "only the FI_COMPLETION send reports");
    for want in [&b"quiet"[..], b"loud"] {
        let r = within("recv", b.ep.recv(BytesMut::zeroed(8)))
            .await
            .unwrap();
        assert_eq!(&r.into_bytes()[..], want);
    }
    assert_cq_quiet(&a.cq, "no entry without FI_COMPLETION").await;
    // Errors are always reported.
    let dead =
        a.av.insert_sync(&[h.dead_addr()], Default::default())
            .unwrap()
            .fi_addrs[0];
    a.ep.post_send(dead, Bytes::from_static(b"lost"), 3)
        .unwrap();
    let e = next_cq(&a.cq).await.unwrap_err();
    assert_eq!(e.context, 3);
    assert!(e.flags.contains(OpFlags::SEND));
}

pub(super) async fn delivery_complete(p: Provider) {
    let h = Harness::connless(&p);
    let (a, b, b_addr, _) = h.rdm_pair();
    a.ep.post_sendmsg(
        SendMsg {
            dest: b_addr,
            iov: vec![payload(1000, 5)],
            context: 1,
            ..SendMsg::default()
        },
        OpFlags::DELIVERY_COMPLETE,
    )
    .unwrap();
    let s = recv_ok(&a).await;
    assert_eq!(s.context, 1);
    // Delivered: the target has it even though no receive was posted.
    let r = within("recv after delivery", b.ep.recv(BytesMut::zeroed(2000)))
        .await
        .unwrap();
    assert_eq!(&r.into_bytes()[..], &payload(1000, 5)[..]);
    // Two completion levels at once are BadFlags.
    let e =
        a.ep.post_sendmsg(
            SendMsg {
                dest: b_addr,
                iov: vec![payload(1, 0)],
                ..SendMsg::default()
            },
            OpFlags::DELIVERY_COMPLETE | OpFlags::TRANSMIT_COMPLETE,
        )
        .unwrap_err();
    assert_eq!(e, Error::BadFlags);
}

pub(super) async fn selective_completion_on_receive(p: Provider) {
    let h = Harness::connless(&p);
    let a = h.rdm_ep();
    let b = h.rdm_ep_with(&h.info, h.av(), BindFlags::SELECTIVE_COMPLETION);
    let b_addr = a.insert(&b);
    let quiet = RecvMsg {
        src: FI_ADDR_UNSPEC,
        bufs: vec![BytesMut::zeroed(8)],
        context: 1,
        ..RecvMsg::default()
    };
    post(&b, quiet, OpFlags::empty());
    let loud = RecvMsg {
        src: FI_ADDR_UNSPEC,
        bufs: vec![BytesMut::zeroed(8)],
        context: 2,
        ..RecvMsg::default()
    };
    post(&b, loud, OpFlags::COMPLETION);
    a.ep.post_send(b_addr, Bytes::from_static(b"one"), 0)
        .unwrap();
    a.ep.post_send(b_addr, Bytes::from_static(b"two"), 0)
        .unwrap();
    let r = recv_ok(&b).await;
    assert_eq!(r.context, 2);
    assert_eq!(&r.into_bytes()[..], b"two", "the quiet receive took 'one'");
    assert_cq_quiet(&b.cq, "no entry for the quiet receive").await;
}

pub(super) async fn send_error_counts_on_counter(p: Provider) {
    let h = Harness::connless(&p);
    let av = h.av();
    let cq = h.cq();
    let cntr = h.domain.counter().unwrap();
    let ep = h.endpoint();
    ep.bind_av(&av).unwrap();
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
        .unwrap();
    ep.bind_counter(&cntr, BindFlags::SEND).unwrap();
    ep.enable().unwrap();
    let dead = av
        .insert_sync(&[h.dead_addr()], Default::default())
        .unwrap()
        .fi_addrs[0];
    // The wait must be under way (it notes the error count when it
    // starts) before the error happens: polled once here, not spawned,
    // since a spawned task may start after the error on a slow machine.
    let mut w = Box::pin(cntr.wait(1));
    assert!(futures::poll!(&mut w).is_pending());
    ep.post_send(dead, Bytes::from_static(b"x"), 9).unwrap();
    let e = next_cq(&cq).await.unwrap_err();
    assert_eq!(e.context, 9);
    assert_eq!(cntr.read_err(), 1);
    assert_eq!(cntr.read(), 0);
    assert_eq!(
        within("wait ends on error", w).await.unwrap_err(),
        Error::Avail
    );
}
