use super::*;

type M = Matcher<u64, u64, u32>;

const A: FiAddr = 7;
const B: FiAddr = 8;

fn no_av(_: &u32) -> FiAddr {
    FI_ADDR_NOTAVAIL
}

fn tspec(src: FiAddr, tag: u64, ignore: u64, context: u64) -> RecvSpec {
    RecvSpec {
        by_key: false,
        src,
        tagged: true,
        tag,
        ignore,
        context,
    }
}

fn uspec(src: FiAddr, context: u64) -> RecvSpec {
    RecvSpec {
        by_key: false,
        src,
        tagged: false,
        tag: 0,
        ignore: 0,
        context,
    }
}

fn tmsg(src: FiAddr, tag: u64, len: usize) -> MsgInfo {
    MsgInfo {
        key: None,
        src,
        tagged: true,
        tag,
        len,
        data: None,
    }
}

fn umsg(src: FiAddr, len: usize) -> MsgInfo {
    MsgInfo {
        key: None,
        src,
        tagged: false,
        tag: 0,
        len,
        data: None,
    }
}

fn queued(o: PostOutcome<u64, u64>) -> bool {
    matches!(o, PostOutcome::Queued)
}

fn matched(o: PostOutcome<u64, u64>) -> (u64, RecvSpec, MsgInfo, u64) {
    match o {
        PostOutcome::Matched {
            recv,
            spec,
            info,
            payload,
        } => (recv, spec, info, payload),
        PostOutcome::Queued => panic!("expected a match"),
    }
}

#[test]
fn tag_rule() {
    assert!(tag_matches(5, 0, 5));
    assert!(!tag_matches(5, 0, 4));
    assert!(tag_matches(0x10, 0x0F, 0x1F));
    assert!(!tag_matches(0x10, 0x0F, 0x2F));
    assert!(tag_matches(0, u64::MAX, 12345));
}

#[test]
fn first_posted_wins_across_exact_and_wildcard() {
    let mut m = M::new();
    assert!(queued(m.post(
        tspec(FI_ADDR_UNSPEC, 0x10, 0xFF, 1),
        1,
        &no_av
    )));
    assert!(queued(m.post(tspec(FI_ADDR_UNSPEC, 0x12, 0, 2), 2, &no_av)));
    assert!(queued(m.post(tspec(FI_ADDR_UNSPEC, 0x12, 0, 3), 3, &no_av)));
    assert!(queued(m.post(
        tspec(FI_ADDR_UNSPEC, 0x00, 0xFF, 4),
        4,
        &no_av
    )));
    let got: Vec<u64> = (0..4)
        .filter_map(|_| m.match_arrival(&tmsg(A, 0x12, 0)).map(|(_, r)| r))
        .collect();
    assert_eq!(got, [1, 2, 3, 4]);
    assert_eq!(m.posted_len(), 0);

    // The exact receive posted first beats a later wildcard one.
    m.post(tspec(A, 9, 0, 5), 5, &no_av);
    m.post(tspec(FI_ADDR_UNSPEC, 0, u64::MAX, 6), 6, &no_av);
    assert_eq!(m.match_arrival(&tmsg(A, 9, 0)).map(|(_, r)| r), Some(5));
    assert_eq!(m.match_arrival(&tmsg(A, 9, 0)).map(|(_, r)| r), Some(6));
    assert_eq!(m.match_arrival(&tmsg(A, 9, 0)), None);
}

#[test]
fn tag_and_ignore() {
    let mut m = M::new();
    m.post(tspec(FI_ADDR_UNSPEC, 0xAB00, 0x00FF, 1), 1, &no_av);
    assert_eq!(m.match_arrival(&tmsg(A, 0xAC00, 0)), None);
    let (spec, r) = m.match_arrival(&tmsg(A, 0xAB42, 0)).unwrap();
    assert_eq!((spec.context, r), (1, 1));
}

#[test]
fn directed_receive() {
    let mut m = M::new();
    m.post(tspec(A, 1, 0, 1), 1, &no_av);
    m.post(uspec(A, 2), 2, &no_av);
    m.post(tspec(A, 0, u64::MAX, 3), 3, &no_av);
    assert_eq!(m.match_arrival(&tmsg(B, 1, 0)), None);
    assert_eq!(m.match_arrival(&umsg(B, 0)), None);
    assert_eq!(m.match_arrival(&tmsg(FI_ADDR_NOTAVAIL, 1, 0)), None);
    assert_eq!(m.match_arrival(&tmsg(A, 1, 0)).map(|(_, r)| r), Some(1));
    assert_eq!(m.match_arrival(&umsg(A, 0)).map(|(_, r)| r), Some(2));
    assert_eq!(m.match_arrival(&tmsg(A, 77, 0)).map(|(_, r)| r), Some(3));

    // Directed receive against the unexpected queue.
    m.push_unexpected(0, tmsg(B, 4, 1), 10);
    m.push_unexpected(0, tmsg(A, 4, 1), 11);
    let (_, _, info, payload) = matched(m.post(tspec(A, 4, 0, 4), 4, &no_av));
    assert_eq!((info.src, payload), (A, 11));
    assert_eq!(m.unexpected_len(), 1);
}

#[test]
fn untagged_and_tagged_never_cross_match() {
    let mut m = M::new();
    m.post(uspec(FI_ADDR_UNSPEC, 1), 1, &no_av);
    assert_eq!(m.match_arrival(&tmsg(A, 0, 0)), None);
    m.post(tspec(FI_ADDR_UNSPEC, 0, u64::MAX, 2), 2, &no_av);
    assert_eq!(m.match_arrival(&umsg(A, 0)).map(|(_, r)| r), Some(1));
    assert_eq!(m.match_arrival(&umsg(A, 0)), None);

    m.push_unexpected(0, umsg(A, 3), 10);
    assert!(queued(m.post(
        tspec(FI_ADDR_UNSPEC, 0, u64::MAX, 3),
        3,
        &no_av
    )));
    let (_, _, _, payload) = matched(m.post(uspec(FI_ADDR_UNSPEC, 4), 4, &no_av));
    assert_eq!(payload, 10);
}

#[test]
fn unexpected_then_post_matches_oldest() {
    let mut m = M::new();
    m.push_unexpected(0, tmsg(A, 5, 10), 100);
    m.push_unexpected(0, tmsg(A, 6, 20), 101);
    m.push_unexpected(0, tmsg(B, 5, 30), 102);
    let (recv, spec, info, payload) = matched(m.post(tspec(FI_ADDR_UNSPEC, 5, 0, 1), 1, &no_av));
    assert_eq!(
        (recv, spec.context, info, payload),
        (1, 1, tmsg(A, 5, 10), 100)
    );
    let (.., payload) = matched(m.post(tspec(FI_ADDR_UNSPEC, 0, 0xF, 2), 2, &no_av));
    assert_eq!(payload, 101);
    let (.., payload) = matched(m.post(tspec(FI_ADDR_UNSPEC, 5, 0, 3), 3, &no_av));
    assert_eq!(payload, 102);
    assert!(queued(m.post(tspec(FI_ADDR_UNSPEC, 5, 0, 4), 4, &no_av)));
    assert_eq!((m.unexpected_len(), m.posted_len()), (0, 1));
}

#[test]
fn late_av_insert() {
    let mut m = M::new();
    // Sender raw id 3 was not in the AV when its message arrived.
    m.push_unexpected(3, tmsg(FI_ADDR_NOTAVAIL, 1, 8), 100);
    assert!(queued(m.post(tspec(A, 1, 0, 1), 1, &no_av)));
    assert_eq!(m.cancel(1).map(|(_, r)| r), Some(1));

    let av = |raw: &u32| if *raw == 3 { A } else { FI_ADDR_NOTAVAIL };
    assert!(queued(m.post(tspec(B, 1, 0, 2), 2, &av)));
    assert_eq!(
        m.peek(&tspec(A, 1, 0, 9), OpFlags::PEEK, &av)
            .map(|i| i.src),
        Ok(A)
    );
    let (recv, _, info, payload) = matched(m.post(tspec(A, 1, 0, 3), 3, &av));
    assert_eq!((recv, info.src, payload), (3, A, 100));

    // A receive from any source also reports the now-known source.
    m.push_unexpected(3, umsg(FI_ADDR_NOTAVAIL, 8), 101);
    let (_, _, info, _) = matched(m.post(uspec(FI_ADDR_UNSPEC, 4), 4, &av));
    assert_eq!(info.src, A);
}

#[test]
fn peek_leaves_message_and_no_match_is_nomsg() {
    let mut m = M::new();
    let spec = tspec(FI_ADDR_UNSPEC, 7, 0, 1);
    assert_eq!(m.peek(&spec, OpFlags::PEEK, &no_av), Err(Error::NoMsg));
    let msg = MsgInfo {
        data: Some(99),
        ..tmsg(A, 7, 12)
    };
    m.push_unexpected(0, msg, 100);
    assert_eq!(m.peek(&spec, OpFlags::PEEK, &no_av), Ok(msg));
    assert_eq!(m.peek(&spec, OpFlags::PEEK, &no_av), Ok(msg));
    assert_eq!(
        m.peek(&tspec(B, 7, 0, 1), OpFlags::PEEK, &no_av),
        Err(Error::NoMsg)
    );
    assert_eq!(
        m.peek(&tspec(A, 8, 0, 1), OpFlags::PEEK, &no_av),
        Err(Error::NoMsg)
    );
    assert_eq!(
        m.peek(&uspec(A, 1), OpFlags::PEEK, &no_av),
        Err(Error::NoMsg)
    );
    assert_eq!((m.unexpected_len(), m.unexpected_bytes()), (1, 12));
    let (.., payload) = matched(m.post(spec, 1, &no_av));
    assert_eq!(payload, 100);
}

#[test]
fn peek_flag_validation() {
    let mut m = M::new();
    m.push_unexpected(0, tmsg(A, 1, 1), 100);
    let spec = tspec(FI_ADDR_UNSPEC, 1, 0, 1);
    let both = OpFlags::PEEK | OpFlags::CLAIM | OpFlags::DISCARD;
    assert_eq!(m.peek(&spec, both, &no_av), Err(Error::Inval));
    assert_eq!(m.peek(&spec, OpFlags::CLAIM, &no_av), Err(Error::Inval));
    assert_eq!(m.peek(&spec, OpFlags::empty(), &no_av), Err(Error::Inval));
    assert_eq!(m.unexpected_len(), 1);
    // Unrelated flags ride along harmlessly.
    let flags = OpFlags::PEEK | OpFlags::COMPLETION;
    assert_eq!(m.peek(&spec, flags, &no_av), Ok(tmsg(A, 1, 1)));
}

#[test]
fn peek_claim_then_claim() {
    let mut m = M::new();
    m.push_unexpected(0, tmsg(A, 1, 5), 100);
    m.push_unexpected(0, tmsg(A, 1, 6), 101);
    let spec = tspec(FI_ADDR_UNSPEC, 1, 0, 42);
    let flags = OpFlags::PEEK | OpFlags::CLAIM;
    assert_eq!(m.peek(&spec, flags, &no_av), Ok(tmsg(A, 1, 5)));
    assert_eq!(m.claim(43, false), Err(Error::NoMsg));

    // The claimed message is invisible to other peeks and receives.
    let other = tspec(FI_ADDR_UNSPEC, 1, 0, 7);
    assert_eq!(m.peek(&other, OpFlags::PEEK, &no_av), Ok(tmsg(A, 1, 6)));
    let (.., payload) = matched(m.post(other, 7, &no_av));
    assert_eq!(payload, 101);
    assert!(queued(m.post(other, 8, &no_av)));
    assert_eq!(m.peek(&other, OpFlags::PEEK, &no_av), Err(Error::NoMsg));
    assert_eq!((m.unexpected_len(), m.unexpected_bytes()), (1, 5));

    assert_eq!(m.claim(42, false), Ok((tmsg(A, 1, 5), Some(100))));
    assert_eq!(m.claim(42, false), Err(Error::NoMsg));
    assert_eq!((m.unexpected_len(), m.unexpected_bytes()), (0, 0));
}

#[test]
fn claim_reports_source_resolved_at_peek() {
    let mut m = M::new();
    m.push_unexpected(3, tmsg(FI_ADDR_NOTAVAIL, 1, 5), 100);
    let av = |_: &u32| B;
    let spec = tspec(B, 1, 0, 42);
    let got = m.peek(&spec, OpFlags::PEEK | OpFlags::CLAIM, &av);
    assert_eq!(got, Ok(tmsg(B, 1, 5)));
    assert_eq!(m.claim(42, false), Ok((tmsg(B, 1, 5), Some(100))));
}

#[test]
fn peek_discard() {
    let mut m = M::new();
    m.push_unexpected(0, tmsg(A, 1, 5), 100);
    m.push_unexpected(0, tmsg(A, 1, 6), 101);
    let spec = tspec(FI_ADDR_UNSPEC, 1, 0, 1);
    let flags = OpFlags::PEEK | OpFlags::DISCARD;
    assert_eq!(m.peek(&spec, flags, &no_av), Ok(tmsg(A, 1, 5)));
    assert_eq!((m.unexpected_len(), m.unexpected_bytes()), (1, 6));
    assert_eq!(m.peek(&spec, flags, &no_av), Ok(tmsg(A, 1, 6)));
    assert_eq!(m.peek(&spec, flags, &no_av), Err(Error::NoMsg));
    assert_eq!(m.unexpected_bytes(), 0);
}

#[test]
fn claim_discard() {
    let mut m = M::new();
    m.push_unexpected(0, tmsg(A, 1, 5), 100);
    let spec = tspec(FI_ADDR_UNSPEC, 1, 0, 9);
    m.peek(&spec, OpFlags::PEEK | OpFlags::CLAIM, &no_av)
        .unwrap();
    assert_eq!(m.claim(9, true), Ok((tmsg(A, 1, 5), None)));
    assert_eq!(m.claim(9, true), Err(Error::NoMsg));
    assert_eq!((m.unexpected_len(), m.unexpected_bytes()), (0, 0));
}

#[test]
fn cancel_semantics() {
    let mut m = M::new();
    m.post(tspec(FI_ADDR_UNSPEC, 1, 0, 1), 1, &no_av);
    m.post(tspec(FI_ADDR_UNSPEC, 1, 0, 2), 2, &no_av);
    let (spec, r) = m.cancel(1).unwrap();
    assert_eq!((spec.context, r), (1, 1));
    assert_eq!(m.cancel(1), None);
    // The remaining receive still matches, after which it cannot be canceled.
    assert_eq!(m.match_arrival(&tmsg(A, 1, 0)).map(|(_, r)| r), Some(2));
    assert_eq!(m.cancel(2), None);
    assert_eq!(m.cancel(99), None);
    // Same context twice: the first posted goes first.
    m.post(uspec(FI_ADDR_UNSPEC, 5), 50, &no_av);
    m.post(uspec(FI_ADDR_UNSPEC, 5), 51, &no_av);
    assert_eq!(m.cancel(5).map(|(_, r)| r), Some(50));
    assert_eq!(m.cancel(5).map(|(_, r)| r), Some(51));
    assert_eq!(m.posted_len(), 0);
}

#[test]
fn drain_posted_in_post_order() {
    let mut m = M::new();
    m.post(tspec(FI_ADDR_UNSPEC, 1, 0, 1), 1, &no_av);
    m.post(uspec(A, 2), 2, &no_av);
    m.post(tspec(B, 0, 0xFF, 3), 3, &no_av);
    m.post(tspec(A, 4, 0, 4), 4, &no_av);
    let got: Vec<u64> = m.drain_posted().into_iter().map(|(_, r)| r).collect();
    assert_eq!(got, [1, 2, 3, 4]);
    assert_eq!(m.posted_len(), 0);
    assert_eq!(m.match_arrival(&tmsg(A, 1, 0)), None);
    assert_eq!(m.cancel(1), None);
    assert!(format!("{m:?}").contains("posted: 0"));
}

#[test]
fn unexpected_bytes_accounting() {
    let mut m = M::new();
    m.push_unexpected(0, tmsg(A, 1, 100), 1);
    m.push_unexpected(0, umsg(A, 20), 2);
    m.push_unexpected(0, tmsg(A, 2, 3), 3);
    assert_eq!((m.unexpected_len(), m.unexpected_bytes()), (3, 123));
    matched(m.post(uspec(FI_ADDR_UNSPEC, 1), 1, &no_av));
    assert_eq!(m.unexpected_bytes(), 103);
    m.peek(
        &tspec(FI_ADDR_UNSPEC, 1, 0, 5),
        OpFlags::PEEK | OpFlags::CLAIM,
        &no_av,
    )
    .unwrap();
    assert_eq!(m.unexpected_bytes(), 103);
    m.claim(5, true).unwrap();
    assert_eq!(m.unexpected_bytes(), 3);
    let drained = m.drain_unexpected();
    assert_eq!(drained, vec![(0, tmsg(A, 2, 3), 3)]);
    assert_eq!((m.unexpected_len(), m.unexpected_bytes()), (0, 0));
}

#[test]
fn many_exact_receives() {
    let mut m = M::new();
    for i in 0..10_000u64 {
        assert!(queued(m.post(tspec(FI_ADDR_UNSPEC, i, 0, i), i, &no_av)));
    }
    for i in (0..10_000u64).rev() {
        assert_eq!(m.match_arrival(&tmsg(A, i, 0)).map(|(_, r)| r), Some(i));
    }
    assert_eq!(m.posted_len(), 0);
}

mod model;

#[test]
fn repost_front_goes_ahead_of_later_receives() {
    let mut m = M::new();
    assert!(queued(m.post(tspec(FI_ADDR_UNSPEC, 5, 0, 1), 1, &no_av)));
    assert!(queued(m.post(tspec(FI_ADDR_UNSPEC, 0, 0xF, 2), 2, &no_av)));
    // Receive 1 matched a message whose sender then died: it comes back
    // ahead of receive 2 (exact and wildcard receives alike).
    let (_, r1) = m.match_arrival(&tmsg(A, 5, 8)).unwrap();
    assert_eq!(r1, 1);
    assert!(queued(m.repost_front(
        tspec(FI_ADDR_UNSPEC, 5, 0, 1),
        r1,
        &no_av
    )));
    assert_eq!(m.match_arrival(&tmsg(A, 5, 8)).unwrap().1, 1);
    assert_eq!(m.match_arrival(&tmsg(A, 5, 8)).unwrap().1, 2);
    // With a message already buffered, the reposted receive takes it.
    m.push_unexpected(0, tmsg(B, 5, 3), 300);
    let (recv, .., payload) = matched(m.repost_front(tspec(FI_ADDR_UNSPEC, 5, 0, 9), 9, &no_av));
    assert_eq!((recv, payload), (9, 300));
}

#[test]
fn remove_unexpected_takes_the_newest_unclaimed_pick() {
    let mut m = M::new();
    m.push_unexpected(0, tmsg(A, 5, 10), 100);
    m.push_unexpected(0, tmsg(A, 5, 20), 100);
    m.push_unexpected(0, tmsg(A, 6, 30), 101);
    assert_eq!(m.remove_unexpected(|&p| p == 100), Some(100));
    assert_eq!(m.unexpected_bytes(), 40);
    // The older one of the pair is left, and is what a receive finds.
    let (.., info, _) = matched(m.post(tspec(FI_ADDR_UNSPEC, 5, 0, 1), 1, &no_av));
    assert_eq!(info.len, 10);
    // Claimed messages are not removed.
    m.peek(
        &tspec(FI_ADDR_UNSPEC, 6, 0, 7),
        OpFlags::PEEK | OpFlags::CLAIM,
        &no_av,
    )
    .unwrap();
    assert_eq!(m.remove_unexpected(|&p| p == 101), None);
    assert_eq!(m.claim(7, false).unwrap().1, Some(101));
}

#[test]
fn spec_accepts_follows_the_matching_rules() {
    assert!(tspec(FI_ADDR_UNSPEC, 5, 0, 0).accepts(&tmsg(A, 5, 1)));
    assert!(!tspec(FI_ADDR_UNSPEC, 5, 0, 0).accepts(&tmsg(A, 6, 1)));
    assert!(tspec(FI_ADDR_UNSPEC, 4, 3, 0).accepts(&tmsg(A, 6, 1)));
    assert!(!uspec(FI_ADDR_UNSPEC, 0).accepts(&tmsg(A, 5, 1)));
    assert!(uspec(A, 0).accepts(&umsg(A, 1)));
    assert!(!uspec(A, 0).accepts(&umsg(B, 1)));
    // Unknown at arrival: may resolve to A by the time it is matched.
    assert!(uspec(A, 0).accepts(&umsg(FI_ADDR_NOTAVAIL, 1)));
}

#[test]
fn a_message_put_back_goes_ahead_of_every_buffered_one() {
    let mut m = M::new();
    m.push_unexpected(0, umsg(A, 2), 2);
    m.push_unexpected(0, tmsg(A, 7, 3), 3);
    // Message 1 had reached a receive whose future was then dropped.
    m.push_unexpected_front(0, umsg(A, 1), 1);
    m.push_unexpected_front(0, tmsg(A, 7, 0), 0);
    let (.., p) = matched(m.post(uspec(FI_ADDR_UNSPEC, 1), 1, &no_av));
    assert_eq!(p, 1);
    let (.., p) = matched(m.post(uspec(FI_ADDR_UNSPEC, 2), 2, &no_av));
    assert_eq!(p, 2);
    // Exact-tag and wildcard receives see the same order.
    let (.., p) = matched(m.post(tspec(FI_ADDR_UNSPEC, 0, u64::MAX, 3), 3, &no_av));
    assert_eq!(p, 0);
    let (.., p) = matched(m.post(tspec(FI_ADDR_UNSPEC, 7, 0, 4), 4, &no_av));
    assert_eq!(p, 3);
    assert_eq!(m.unexpected_len(), 0);
}

#[test]
fn receives_directed_by_key_take_only_senders_that_proved_it() {
    const KA: FiAddr = 0;
    const KB: FiAddr = 1;
    let keyed = |m: MsgInfo, k: FiAddr| MsgInfo {
        key: u16::try_from(k).ok(),
        ..m
    };
    let by_key = |s: RecvSpec| RecvSpec { by_key: true, ..s };
    let mut m = M::new();
    // Posted: exact, wildcard and untagged receives for key A.
    assert!(queued(m.post(by_key(tspec(KA, 5, 0, 1)), 1, &no_av)));
    assert!(queued(m.post(by_key(tspec(KA, 0, u64::MAX, 2)), 2, &no_av)));
    assert!(queued(m.post(by_key(uspec(KA, 3)), 3, &no_av)));
    // Key handle 0 is not address handle 0, and key B is not key A.
    assert_eq!(m.match_arrival(&tmsg(KA, 5, 0)), None);
    assert_eq!(m.match_arrival(&keyed(tmsg(A, 5, 0), KB)), None);
    assert_eq!(m.match_arrival(&keyed(umsg(B, 0), KB)), None);
    let got: Vec<u64> = [keyed(tmsg(A, 5, 0), KA), keyed(tmsg(B, 9, 0), KA)]
        .iter()
        .filter_map(|i| m.match_arrival(i).map(|(_, r)| r))
        .collect();
    assert_eq!(got, [1, 2]);
    assert_eq!(
        m.match_arrival(&keyed(umsg(B, 0), KA)).map(|(_, r)| r),
        Some(3)
    );

    // Unexpected: a receive by key skips other keys' messages.
    m.push_unexpected(1, keyed(tmsg(B, 7, 1), KB), 10);
    m.push_unexpected(2, keyed(tmsg(A, 7, 2), KA), 11);
    let (_, _, info, payload) = matched(m.post(by_key(tspec(KA, 7, 0, 4)), 4, &no_av));
    assert_eq!((payload, info.src, info.key), (11, A, Some(KA as u16)));
    assert!(queued(m.post(by_key(tspec(KA, 7, 0, 5)), 5, &no_av)));
    let (_, _, _, payload) = matched(m.post(tspec(FI_ADDR_UNSPEC, 7, 0, 6), 6, &no_av));
    assert_eq!(payload, 10);
}

#[test]
fn messages_put_back_in_their_order_stay_in_it() {
    let mut m = M::new();
    m.push_unexpected(0, umsg(A, 9), 9);
    // A dropped multi-receive stream hands back 1 and 2 in order, then 3
    // (still arriving at the drop) when it completes.
    m.push_unexpected_front_after(0, umsg(A, 1), 1);
    m.push_unexpected_front_after(0, umsg(A, 2), 2);
    m.push_unexpected_front_after(0, umsg(A, 3), 3);
    // A single receive's message given back goes ahead of all of them.
    m.push_unexpected_front(0, umsg(A, 0), 0);
    let got: Vec<u64> = (0..5)
        .map(|c| matched(m.post(uspec(FI_ADDR_UNSPEC, c), c, &no_av)).3)
        .collect();
    assert_eq!(got, [0, 1, 2, 3, 9]);
}

/// A receive that gives parts of itself (a multi-receive buffer, here a
/// receive whose payload above 1000 is room left): it keeps its place
/// among the posted receives while it has room, ends without the message
/// when that does not fit, and takes several buffered messages at once.
#[test]
fn a_receive_that_gives_parts_keeps_its_place() {
    fn take(r: &mut u64, info: &MsgInfo) -> Take<u64> {
        if *r < 1000 {
            return Take::Whole;
        }
        let room = *r - 1000;
        if info.len as u64 > room {
            return Take::End;
        }
        *r -= info.len as u64;
        if *r - 1000 < 10 {
            Take::Last(info.len as u64)
        } else {
            Take::Part(info.len as u64)
        }
    }
    let mut m = M::new();
    let mut ended = Vec::new();
    assert!(queued(m.post(uspec(B, 1), 1, &no_av)));
    assert!(queued(m.post(uspec(FI_ADDR_UNSPEC, 2), 1050, &no_av)));
    assert!(queued(m.post(uspec(FI_ADDR_UNSPEC, 3), 3, &no_av)));
    let mut arrive = |m: &mut M, src, len| {
        m.match_arrival_by(&umsg(src, len), &mut take, &mut ended)
            .map(|(s, r)| (s.context, r))
    };
    // From A: parts of receive 2, which stays ahead of receive 3.
    assert_eq!(arrive(&mut m, A, 20), Some((2, 20)));
    assert_eq!(arrive(&mut m, A, 15), Some((2, 15)));
    // From B: receive 1, posted first, still comes first.
    assert_eq!(arrive(&mut m, B, 5), Some((1, 1)));
    // 15 left: 20 does not fit, so receive 2 ends and 3 takes it.
    assert_eq!(arrive(&mut m, A, 20), Some((3, 3)));
    assert_eq!(ended, [1015]);
    assert_eq!(m.posted_len(), 0);

    // Posting takes buffered messages, oldest first, until the last part.
    for (i, len) in [10usize, 10, 25, 7].into_iter().enumerate() {
        m.push_unexpected(0, umsg(A, len), i as u64);
    }
    let out = m.post_by(uspec(FI_ADDR_UNSPEC, 4), 1050, &no_av, &mut take, false);
    let parts: Vec<(u64, u64)> = out.matched.iter().map(|(r, _, u)| (*r, *u)).collect();
    // 50 of room: 10, 10, 25 (5 left, below 10: the last part).
    assert_eq!(parts, [(10, 0), (10, 1), (25, 2)]);
    assert!(!out.queued && out.ended.is_none());
    assert_eq!(m.unexpected_len(), 1);
}
