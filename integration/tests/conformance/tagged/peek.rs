//! `FI_PEEK`, `FI_CLAIM` and `FI_DISCARD` on buffered messages.

use bytes::{Bytes, BytesMut};
use weft::{Error, OpFlags, RecvMsg, FI_ADDR_UNSPEC};
use weft_integration::{assert_cq_quiet, next_cq, Harness, Provider};

use super::{post, recv_ok, send_delivered, tagged_recv};

pub(super) async fn peek_leaves_message(p: Provider) {
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

pub(super) async fn peek_without_match_is_nomsg(p: Provider) {
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

pub(super) async fn peek_claim_then_claim(p: Provider) {
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

pub(super) async fn peek_discard(p: Provider) {
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

pub(super) async fn claim_discard(p: Provider) {
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
