//! RDM messaging: message and tagged sends and receives in both API forms,
//! matching (tag/ignore, directed, unexpected, PEEK/CLAIM/DISCARD),
//! completion contents and error paths (spec/fi_endpoint.3.md,
//! fi_tagged(3), fi_msg(3); fabtests rdm_tagged_peek, unexpected_msg,
//! recv_cancel).

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use weft::{
    AvAttr, AvType, BindFlags, CqEntry, Error, FiAddr, OpFlags, RecvMsg, SendMsg, FI_ADDR_NOTAVAIL,
    FI_ADDR_UNSPEC,
};
use weft_integration::{
    assert_cq_quiet, next_cq, payload, within, Harness, Provider, RdmEp, QUIET,
};

/// A tagged send with `DELIVERY_COMPLETE`: once it resolves the target has
/// the message (matched or buffered as unexpected).
async fn send_delivered(ep: &RdmEp, dest: FiAddr, data: Bytes, tag: Option<u64>) {
    let msg = SendMsg {
        dest,
        iov: vec![data],
        tag,
        ..SendMsg::default()
    };
    within(
        "delivery-complete send",
        ep.ep.sendmsg(msg, OpFlags::DELIVERY_COMPLETE),
    )
    .await
    .unwrap();
}

fn tagged_recv(ctx: u64, tag: u64, ignore: u64, cap: usize) -> RecvMsg {
    RecvMsg {
        src: FI_ADDR_UNSPEC,
        bufs: vec![BytesMut::zeroed(cap)],
        tagged: true,
        tag,
        ignore,
        context: ctx,
    }
}

fn post(ep: &RdmEp, msg: RecvMsg, flags: OpFlags) {
    ep.ep.post_recvmsg(msg, flags).map_err(|(e, _)| e).unwrap();
}

async fn recv_ok(ep: &RdmEp) -> CqEntry {
    match next_cq(&ep.cq).await {
        Ok(e) => e,
        Err(e) => panic!("expected a completion, got error entry {e:?}"),
    }
}

async fn send_recv_post_form(p: Provider) {
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

async fn send_recv_async_form(p: Provider) {
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

async fn both_forms_on_one_endpoint(p: Provider) {
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

async fn tag_and_ignore_matching(p: Provider) {
    let h = Harness::connless(&p);
    let (a, b, b_addr, _) = h.rdm_pair();
    // 0x200 does not match tag 0x100 with ignore 0xFF.
    send_delivered(&a, b_addr, Bytes::from_static(b"other"), Some(0x200)).await;
    post(&b, tagged_recv(1, 0x100, 0xFF, 16), OpFlags::empty());
    assert_cq_quiet(&b.cq, "tag 0x200 must not match 0x100/0xFF").await;
    a.ep.post_tsend(b_addr, Bytes::from_static(b"match"), 0x1AB, 9)
        .unwrap();
    let r = recv_ok(&b).await;
    assert_eq!(r.context, 1);
    assert_eq!(r.tag, 0x1AB, "the entry carries the message's tag");
    assert!(r.flags.contains(OpFlags::TAGGED | OpFlags::RECV));
    assert_eq!(&r.into_bytes()[..], b"match");
    // The exact tag picks up the unexpected one.
    post(&b, tagged_recv(2, 0x200, 0, 16), OpFlags::empty());
    let r = recv_ok(&b).await;
    assert_eq!((r.context, r.tag), (2, 0x200));
    assert_eq!(&r.into_bytes()[..], b"other");
}

async fn tagged_and_untagged_do_not_cross(p: Provider) {
    let h = Harness::connless(&p);
    let (a, b, b_addr, _) = h.rdm_pair();
    send_delivered(&a, b_addr, Bytes::from_static(b"tagged"), Some(0)).await;
    b.ep.post_recv(BytesMut::zeroed(16), 1).unwrap();
    assert_cq_quiet(&b.cq, "an untagged receive must not take a tagged message").await;
    post(&b, tagged_recv(2, 0, u64::MAX, 16), OpFlags::empty());
    let r = recv_ok(&b).await;
    assert_eq!(r.context, 2);
    assert_eq!(&r.into_bytes()[..], b"tagged");
    a.ep.post_send(b_addr, Bytes::from_static(b"plain"), 3)
        .unwrap();
    let r = recv_ok(&b).await;
    assert_eq!(r.context, 1);
    assert_eq!(&r.into_bytes()[..], b"plain");
}

async fn directed_receive(p: Provider) {
    let h = Harness::connless(&p);
    assert!(h.info.caps.contains(weft::Caps::DIRECTED_RECV));
    let b = h.rdm_ep();
    let a = h.rdm_ep();
    let c = h.rdm_ep();
    let b_from_a = a.insert(&b);
    let b_from_c = c.insert(&b);
    let a_in_b = b.insert(&a);
    let c_in_b = b.insert(&c);
    // c's message is there first; a receive directed at a ignores it.
    send_delivered(&c, b_from_c, Bytes::from_static(b"from c"), Some(4)).await;
    let mut m = tagged_recv(1, 4, 0, 16);
    m.src = a_in_b;
    post(&b, m, OpFlags::empty());
    assert_cq_quiet(&b.cq, "a directed receive ignores other senders").await;
    send_delivered(&a, b_from_a, Bytes::from_static(b"from a"), Some(4)).await;
    let r = recv_ok(&b).await;
    assert_eq!((r.context, r.src), (1, a_in_b));
    assert_eq!(&r.into_bytes()[..], b"from a");
    // Untagged directed receives too.
    a.ep.post_send(b_from_a, Bytes::from_static(b"msg a"), 0)
        .unwrap();
    c.ep.post_send(b_from_c, Bytes::from_static(b"msg c"), 0)
        .unwrap();
    let m = RecvMsg {
        src: c_in_b,
        bufs: vec![BytesMut::zeroed(16)],
        context: 2,
        ..RecvMsg::default()
    };
    post(&b, m, OpFlags::empty());
    let r = recv_ok(&b).await;
    assert_eq!((r.context, r.src), (2, c_in_b));
    assert_eq!(&r.into_bytes()[..], b"msg c");
    // The wildcard receives get what is left.
    post(&b, tagged_recv(3, 0, u64::MAX, 16), OpFlags::empty());
    let r = recv_ok(&b).await;
    assert_eq!((r.context, r.src), (3, c_in_b));
    assert_eq!(&r.into_bytes()[..], b"from c");
    b.ep.post_recv(BytesMut::zeroed(16), 4).unwrap();
    let r = recv_ok(&b).await;
    assert_eq!((r.context, r.src), (4, a_in_b));
    assert_eq!(&r.into_bytes()[..], b"msg a");
}

async fn unexpected_messages_matched_later(p: Provider) {
    let h = Harness::connless(&p);
    let (a, b, b_addr, _) = h.rdm_pair();
    for i in 0..5u8 {
        send_delivered(&a, b_addr, payload(100 + i as usize, i), Some(7)).await;
    }
    send_delivered(&a, b_addr, payload(50_000, 9), None).await;
    for i in 0..5u8 {
        post(&b, tagged_recv(i as u64, 7, 0, 200), OpFlags::empty());
    }
    for i in 0..5u8 {
        let r = recv_ok(&b).await;
        assert_eq!(r.context, i as u64, "unexpected messages match in order");
        assert_eq!(&r.into_bytes()[..], &payload(100 + i as usize, i)[..]);
    }
    let r = within("large unexpected", b.ep.recv(BytesMut::zeroed(60_000)))
        .await
        .unwrap();
    assert_eq!(r.len, 50_000);
    assert_eq!(&r.into_bytes()[..], &payload(50_000, 9)[..]);
}

async fn unexpected_from_late_inserted_sender(p: Provider) {
    let h = Harness::connless(&p);
    let a = h.rdm_ep();
    let b = h.rdm_ep();
    let b_addr = a.insert(&b);
    // b does not know a yet.
    send_delivered(&a, b_addr, Bytes::from_static(b"early"), Some(11)).await;
    let a_in_b = b.insert(&a);
    let mut m = tagged_recv(1, 11, 0, 16);
    m.src = a_in_b;
    post(&b, m, OpFlags::empty());
    let r = recv_ok(&b).await;
    assert_eq!(r.context, 1);
    assert_eq!(&r.into_bytes()[..], b"early");
}

async fn peek_leaves_message(p: Provider) {
    let h = Harness::connless(&p);
    let (a, b, b_addr, a_in_b) = h.rdm_pair();
    send_delivered(&a, b_addr, Bytes::from_static(b"peeked"), Some(21)).await;
    post(&b, tagged_recv(1, 21, 0, 16), OpFlags::PEEK);
    let r = recv_ok(&b).await;
    assert_eq!(r.context, 1);
    assert_eq!((r.tag, r.len), (21, 6), "peek reports tag and length");
    assert_eq!(r.src, a_in_b);
    // Still there: peek again, then receive it.
    post(&b, tagged_recv(2, 21, 0, 16), OpFlags::PEEK);
    assert_eq!(recv_ok(&b).await.context, 2);
    post(&b, tagged_recv(3, 21, 0, 16), OpFlags::empty());
    let r = recv_ok(&b).await;
    assert_eq!(r.context, 3);
    assert_eq!(&r.into_bytes()[..], b"peeked");
}

async fn peek_without_match_is_nomsg(p: Provider) {
    let h = Harness::connless(&p);
    let (_a, b, _, _) = h.rdm_pair();
    post(&b, tagged_recv(5, 99, 0, 16), OpFlags::PEEK);
    let e = next_cq(&b.cq).await.unwrap_err();
    assert_eq!(e.err, Error::NoMsg);
    assert_eq!(e.context, 5);
    assert!(e.flags.contains(OpFlags::RECV));
    // Peek needs a tagged receive.
    let m = RecvMsg {
        bufs: vec![BytesMut::zeroed(4)],
        src: FI_ADDR_UNSPEC,
        ..RecvMsg::default()
    };
    let (err, bufs) = b.ep.post_recvmsg(m, OpFlags::PEEK).unwrap_err();
    assert_eq!(err, Error::BadFlags);
    assert_eq!(bufs.len(), 1);
}

async fn peek_claim_then_claim(p: Provider) {
    let h = Harness::connless(&p);
    let (a, b, b_addr, _) = h.rdm_pair();
    send_delivered(&a, b_addr, Bytes::from_static(b"claimed"), Some(31)).await;
    post(
        &b,
        tagged_recv(7, 31, 0, 16),
        OpFlags::PEEK | OpFlags::CLAIM,
    );
    let r = recv_ok(&b).await;
    assert_eq!((r.context, r.tag, r.len), (7, 31, 7));
    // A claimed message is no longer available to other receives.
    post(&b, tagged_recv(8, 31, 0, 16), OpFlags::empty());
    assert_cq_quiet(&b.cq, "a claimed message is reserved").await;
    post(&b, tagged_recv(7, 31, 0, 16), OpFlags::CLAIM);
    let r = recv_ok(&b).await;
    assert_eq!(r.context, 7);
    assert_eq!(&r.into_bytes()[..], b"claimed");
    b.ep.cancel(8).unwrap();
    assert_eq!(next_cq(&b.cq).await.unwrap_err().err, Error::Canceled);
}

async fn peek_discard(p: Provider) {
    let h = Harness::connless(&p);
    let (a, b, b_addr, _) = h.rdm_pair();
    send_delivered(&a, b_addr, Bytes::from_static(b"gone"), Some(41)).await;
    post(
        &b,
        tagged_recv(1, 41, 0, 16),
        OpFlags::PEEK | OpFlags::DISCARD,
    );
    let r = recv_ok(&b).await;
    assert_eq!((r.context, r.tag), (1, 41));
    post(&b, tagged_recv(2, 41, 0, 16), OpFlags::PEEK);
    assert_eq!(next_cq(&b.cq).await.unwrap_err().err, Error::NoMsg);
}

async fn claim_discard(p: Provider) {
    let h = Harness::connless(&p);
    let (a, b, b_addr, _) = h.rdm_pair();
    send_delivered(&a, b_addr, Bytes::from_static(b"drop me"), Some(51)).await;
    post(
        &b,
        tagged_recv(3, 51, 0, 16),
        OpFlags::PEEK | OpFlags::CLAIM,
    );
    assert_eq!(recv_ok(&b).await.context, 3);
    post(
        &b,
        tagged_recv(3, 51, 0, 16),
        OpFlags::CLAIM | OpFlags::DISCARD,
    );
    let r = recv_ok(&b).await;
    assert_eq!(r.context, 3);
    post(&b, tagged_recv(4, 51, 0, 16), OpFlags::PEEK);
    assert_eq!(next_cq(&b.cq).await.unwrap_err().err, Error::NoMsg);
    // DISCARD alone is not a valid receive.
    let (err, _) =
        b.ep.post_recvmsg(tagged_recv(5, 51, 0, 16), OpFlags::DISCARD)
            .unwrap_err();
    assert_eq!(err, Error::BadFlags);
}

async fn remote_cq_data(p: Provider) {
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

async fn source_address_in_completions(p: Provider) {
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

async fn map_av_messaging(p: Provider) {
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

async fn iov_send_and_recv(p: Provider) {
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

async fn inject_no_completion_counter_counts(p: Provider) {
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

async fn selective_completion(p: Provider) {
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

async fn truncation(p: Provider) {
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

async fn oversize_send_is_msgsize(p: Provider) {
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

async fn zero_length_message(p: Provider) {
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

async fn three_senders_in_order(p: Provider) {
    const N: usize = 30;
    let h = Harness::connless(&p);
    let b = h.rdm_ep();
    let senders: Vec<(RdmEp, FiAddr, FiAddr)> = (0..3)
        .map(|_| {
            let s = h.rdm_ep();
            let dest = s.insert(&b);
            let me = b.insert(&s);
            (s, dest, me)
        })
        .collect();
    for i in 0..3 * N {
        b.ep.post_recv(BytesMut::zeroed(16), i as u64).unwrap();
    }
    let tasks: Vec<_> = senders
        .iter()
        .enumerate()
        .map(|(k, (s, dest, _))| {
            let (ep, dest) = (s.ep.clone(), *dest);
            tokio::spawn(async move {
                for seq in 0..N {
                    let mut m = vec![k as u8];
                    m.extend_from_slice(&(seq as u32).to_le_bytes());
                    ep.send(dest, m.into()).await.unwrap();
                }
            })
        })
        .collect();
    let mut next = [0u32; 3];
    for _ in 0..3 * N {
        let r = recv_ok(&b).await;
        let src = r.src;
        let d = r.into_bytes();
        let k = d[0] as usize;
        assert_eq!(src, senders[k].2, "source matches the sender");
        let seq = u32::from_le_bytes([d[1], d[2], d[3], d[4]]);
        assert_eq!(seq, next[k], "per-sender order from sender {k}");
        next[k] += 1;
    }
    assert_eq!(next, [N as u32; 3]);
    for t in tasks {
        within("sender task", t).await.unwrap();
    }
}

async fn delivery_complete(p: Provider) {
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

async fn peer_closed_sends_fail(p: Provider) {
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

async fn dropped_recv_future_withdraws(p: Provider) {
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

async fn truncation_of_unexpected_and_large(p: Provider) {
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

async fn large_messages_racing_receives(p: Provider) {
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

async fn selective_completion_on_receive(p: Provider) {
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

async fn send_error_counts_on_counter(p: Provider) {
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

async fn cq_stream_yields_in_order(p: Provider) {
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

async fn late_inserted_sender_reported_as_source(p: Provider) {
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

provider_tests! {
    truncation_of_unexpected_and_large,
    large_messages_racing_receives,
    selective_completion_on_receive,
    send_error_counts_on_counter,
    cq_stream_yields_in_order,
    late_inserted_sender_reported_as_source,
    send_recv_post_form,
    send_recv_async_form,
    both_forms_on_one_endpoint,
    tag_and_ignore_matching,
    tagged_and_untagged_do_not_cross,
    directed_receive,
    unexpected_messages_matched_later,
    unexpected_from_late_inserted_sender,
    peek_leaves_message,
    peek_without_match_is_nomsg,
    peek_claim_then_claim,
    peek_discard,
    claim_discard,
    remote_cq_data,
    source_address_in_completions,
    map_av_messaging,
    iov_send_and_recv,
    inject_no_completion_counter_counts,
    selective_completion,
    truncation,
    oversize_send_is_msgsize,
    zero_length_message,
    three_senders_in_order,
    delivery_complete,
    peer_closed_sends_fail,
    dropped_recv_future_withdraws,
}

// The cases that apply to udp's FI_EP_DGRAM endpoints. The others stay
// out because they take something a datagram cannot give: a send that
// waits until the target has the message (`FI_DELIVERY_COMPLETE`, which
// the peek, claim, ordering and late-sender cases use to know a message
// is buffered), a send to a dead address that fails (a datagram to
// nobody is lost, not failed), a peer's end seen by its sender, or
// messages larger than one datagram. `integration/tests/udp.rs` covers
// the same ground for udp without them.
udp_tests! {
    selective_completion_on_receive,
    cq_stream_yields_in_order,
    send_recv_post_form,
    send_recv_async_form,
    both_forms_on_one_endpoint,
    peek_without_match_is_nomsg,
    remote_cq_data,
    source_address_in_completions,
    map_av_messaging,
    iov_send_and_recv,
    inject_no_completion_counter_counts,
    truncation,
    oversize_send_is_msgsize,
    zero_length_message,
    dropped_recv_future_withdraws,
}

// The cases that apply to shm. The others send to an address where
// no endpoint is (an shm insert of such a name waits for it to appear,
// then fails after the resolve timeout): `selective_completion` and
// `send_error_counts_on_counter`; the sends to a killed peer are in
// `shm_faults.rs`.
shm_tests! {
    truncation_of_unexpected_and_large,
    large_messages_racing_receives,
    selective_completion_on_receive,
    cq_stream_yields_in_order,
    late_inserted_sender_reported_as_source,
    send_recv_post_form,
    send_recv_async_form,
    both_forms_on_one_endpoint,
    tag_and_ignore_matching,
    tagged_and_untagged_do_not_cross,
    directed_receive,
    unexpected_messages_matched_later,
    unexpected_from_late_inserted_sender,
    peek_leaves_message,
    peek_without_match_is_nomsg,
    peek_claim_then_claim,
    peek_discard,
    claim_discard,
    remote_cq_data,
    source_address_in_completions,
    map_av_messaging,
    iov_send_and_recv,
    inject_no_completion_counter_counts,
    truncation,
    oversize_send_is_msgsize,
    zero_length_message,
    three_senders_in_order,
    delivery_complete,
    peer_closed_sends_fail,
    dropped_recv_future_withdraws,
}
