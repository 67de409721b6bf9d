//! Matching: tag and ignore bits, tagged against untagged, directed
//! receives, unexpected messages, order across senders.

use bytes::{Bytes, BytesMut};
use weft::{FiAddr, OpFlags, RecvMsg};
use weft_integration::{assert_cq_quiet, payload, within, Harness, Provider, RdmEp};

use super::{post, recv_ok, send_delivered, tagged_recv};

pub(super) async fn tag_and_ignore_matching(p: Provider) {
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

pub(super) async fn tagged_and_untagged_do_not_cross(p: Provider) {
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

pub(super) async fn directed_receive(p: Provider) {
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

pub(super) async fn unexpected_messages_matched_later(p: Provider) {
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

pub(super) async fn unexpected_from_late_inserted_sender(p: Provider) {
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

pub(super) async fn three_senders_in_order(p: Provider) {
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
