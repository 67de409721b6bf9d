//! The flag matrix: every operation flag, on every operation, on every
//! provider, either takes effect or is refused with the documented error
//! (`BadFlags`) — as an operation's flag, as an endpoint's default
//! `op_flags`, and in getinfo hints (no match). A flag added to `OpFlags`
//! and ignored by a provider fails here.

use bytes::{Bytes, BytesMut};
use weft::{Error, Info, OpFlags, RecvMsg, SendMsg, FI_ADDR_UNSPEC};
use weft_integration::{assert_cq_quiet, within, Harness, Provider};

/// The flags an operation in the matrix may carry on top of `flag`.
fn send_msg(dest: u64, tagged: bool, flag: OpFlags, seq: u64) -> SendMsg {
    SendMsg {
        dest,
        iov: vec![Bytes::from(format!("flag matrix {seq}"))],
        tag: tagged.then_some(seq),
        // The flag asks for remote CQ data: give it some.
        data: flag.contains(OpFlags::REMOTE_CQ_DATA).then_some(seq),
        context: 0,
    }
}

/// Every transmit flag on send and tagged send: a supported one delivers
/// the message (with its effect where the receiver can see it), any other
/// is `BadFlags` and sends nothing.
async fn every_send_flag_is_honoured_or_refused(p: Provider) {
    let h = Harness::connless(&p);
    let (a, b, b_in_a, _) = h.rdm_pair();
    let ok = h.info.tx_attr.op_flags_supported;
    let mut seq = 0u64;
    for flag in OpFlags::all().iter() {
        for tagged in [false, true] {
            seq += 1;
            let r = within(
                "send",
                a.ep.sendmsg(send_msg(b_in_a, tagged, flag, seq), flag),
            )
            .await;
            if !ok.contains(flag) {
                let e = r.expect_err("an unsupported flag must be refused");
                assert_eq!(e.err, Error::BadFlags, "{flag:?} tagged={tagged}");
                assert_cq_quiet(&b.cq, "a refused send delivers nothing").await;
                continue;
            }
            r.unwrap_or_else(|e| panic!("{flag:?} tagged={tagged}: {e:?}"));
            let mut m = RecvMsg::untagged(BytesMut::zeroed(64), 0);
            m.tagged = tagged;
            m.tag = seq;
            let got = within("receive", b.ep.recvmsg(m, OpFlags::empty()))
                .await
                .unwrap_or_else(|e| panic!("{flag:?}: receive failed: {e:?}"));
            assert_eq!(&got.bufs[0][..], format!("flag matrix {seq}").as_bytes());
            if flag.contains(OpFlags::REMOTE_CQ_DATA) {
                assert!(got.flags.contains(OpFlags::REMOTE_CQ_DATA));
                assert_eq!(got.data, seq);
            }
        }
    }
}

/// Every receive flag on receive and tagged receive.
async fn every_recv_flag_is_honoured_or_refused(p: Provider) {
    let h = Harness::connless(&p);
    let (a, b, b_in_a, _) = h.rdm_pair();
    let ok = h.info.rx_attr.op_flags_supported;
    let mut seq = 1000u64;
    for flag in OpFlags::all().iter() {
        for tagged in [false, true] {
            seq += 1;
            let mut m = RecvMsg::untagged(BytesMut::zeroed(64), 0);
            m.tagged = tagged;
            m.tag = seq;
            m.src = FI_ADDR_UNSPEC;
            let peek_family = flag.intersects(OpFlags::PEEK | OpFlags::CLAIM | OpFlags::DISCARD);
            // The peek family is for tagged receives, and DISCARD only
            // with PEEK or CLAIM (fi_tagged(3)).
            let refused =
                !ok.contains(flag) || (peek_family && !tagged) || flag == OpFlags::DISCARD;
            if refused {
                let e = within("receive", b.ep.recvmsg(m, flag))
                    .await
                    .expect_err("an unsupported flag must be refused");
                assert_eq!(e.err, Error::BadFlags, "{flag:?} tagged={tagged}");
                continue;
            }
            if flag == OpFlags::MULTI_RECV {
                // Untagged only, and one completion per message: the
                // posted form (the awaited one is `recv_multi`).
                multi_recv_flag(&a, &b, b_in_a, tagged, seq).await;
                continue;
            }
            if peek_family {
                // Nothing is buffered: the peek (or a claim of nothing)
                // reports that no message matched.
                let e = within("peek", b.ep.recvmsg(m, flag))
                    .await
                    .expect_err("nothing to peek");
                assert_eq!(e.err, Error::NoMsg, "{flag:?}");
                continue;
            }
            let recv = b.ep.recvmsg(m, flag);
            let send = a.ep.sendmsg(
                send_msg(b_in_a, tagged, OpFlags::empty(), seq),
                OpFlags::empty(),
            );
            let (got, sent) = within("exchange", async { tokio::join!(recv, send) }).await;
            sent.unwrap();
            let got = got.unwrap_or_else(|e| panic!("{flag:?} tagged={tagged}: {e:?}"));
            assert_eq!(&got.bufs[0][..], format!("flag matrix {seq}").as_bytes());
        }
    }
}

/// `FI_MULTI_RECV` where it is honoured: a posted untagged receive takes
/// a message into its buffer (which a cancel then releases); a tagged
/// one, and the awaited single receive, are `BadFlags`.
async fn multi_recv_flag(
    a: &weft_integration::RdmEp,
    b: &weft_integration::RdmEp,
    b_in_a: u64,
    tagged: bool,
    seq: u64,
) {
    let flag = OpFlags::MULTI_RECV;
    let mut m = RecvMsg::untagged(BytesMut::zeroed(1 << 16), seq);
    m.tagged = tagged;
    let e = within("receive", b.ep.recvmsg(m, flag)).await.unwrap_err();
    assert_eq!(e.err, Error::BadFlags, "awaited, tagged={tagged}");
    let mut m = RecvMsg::untagged(BytesMut::zeroed(1 << 16), seq);
    m.tagged = tagged;
    if tagged {
        let (e, _) = b.ep.post_recvmsg(m, flag).unwrap_err();
        assert_eq!(e, Error::BadFlags);
        return;
    }
    b.ep.post_recvmsg(m, flag).unwrap();
    within(
        "send",
        a.ep.sendmsg(
            send_msg(b_in_a, false, OpFlags::empty(), seq),
            OpFlags::empty(),
        ),
    )
    .await
    .unwrap();
    let got = weft_integration::next_cq(&b.cq).await.unwrap();
    assert_eq!(&got.bufs[0][..], format!("flag matrix {seq}").as_bytes());
    b.ep.cancel(seq).unwrap();
    let c = weft_integration::next_cq(&b.cq).await.unwrap_err();
    assert!(c.flags.contains(OpFlags::MULTI_RECV));
}

/// Default `op_flags`: an endpoint refuses the ones its provider would not
/// honour, and getinfo offers nothing for hints that ask for them.
async fn default_op_flags_are_honoured_or_refused(p: Provider) {
    let h = Harness::connless(&p);
    let (tx_ok, rx_ok) = (
        h.info.tx_attr.op_flags_supported,
        h.info.rx_attr.op_flags_supported,
    );
    for flag in OpFlags::all().iter() {
        for tx in [true, false] {
            let mut info: Info = h.info.clone();
            let ok = if tx {
                info.tx_attr.op_flags = flag;
                tx_ok.contains(flag)
            } else {
                info.rx_attr.op_flags = flag;
                rx_ok.contains(flag)
            };
            let r = h.domain.endpoint(&info);
            match (ok, r) {
                (true, Ok(_)) => {}
                (false, Err(e)) => assert_eq!(e, Error::BadFlags, "{flag:?} tx={tx}"),
                (true, Err(e)) => panic!("{flag:?} tx={tx}: supported, yet {e:?}"),
                (false, Ok(_)) => panic!("{flag:?} tx={tx}: accepted and would be ignored"),
            }
            let mut hints = Info::default();
            hints.ep_attr.ep_type = p.connless_type();
            hints.fabric_attr.prov_name = Some(p.name.into());
            hints.domain_attr.name = h.info.domain_attr.name.clone();
            if tx {
                hints.tx_attr.op_flags = flag;
            } else {
                hints.rx_attr.op_flags = flag;
            }
            let found = weft::getinfo(Some(&hints)).map_or(0, |v| v.len());
            assert_eq!(found > 0, ok, "getinfo for {flag:?} tx={tx}");
        }
    }
}

provider_tests! {
    every_send_flag_is_honoured_or_refused,
    every_recv_flag_is_honoured_or_refused,
    default_op_flags_are_honoured_or_refused,
}

// The cases that apply to udp's FI_EP_DGRAM endpoints.
udp_tests! {
    every_send_flag_is_honoured_or_refused,
    every_recv_flag_is_honoured_or_refused,
    default_op_flags_are_honoured_or_refused,
}

// The cases that apply to shm.
shm_tests! {
    every_send_flag_is_honoured_or_refused,
    every_recv_flag_is_honoured_or_refused,
    default_op_flags_are_honoured_or_refused,
}
