//! The key proof end to end without rdma_cm: a [`Dialer`] and a
//! [`Gate`] exchanging the private data the two rounds would carry, and
//! everything a peer without the key (or a replaying or reflecting one)
//! can send instead.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use std::net::Ipv4Addr;

const JOB_A: &[u8] = b"job-a key";
const JOB_B: &[u8] = b"job-b key";
const TTL: Duration = Duration::from_secs(10);

fn key(k: &[u8]) -> AuthKey {
    AuthKey::new(k).unwrap()
}

fn client() -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 66, 0, 2))
}

fn listener() -> SocketAddr {
    "10.66.0.1:7471".parse().unwrap()
}

fn refused() -> Verdict {
    Verdict::Reject {
        data: payload::refused(),
        report: Some(Error::KeyRejected),
    }
}

/// Round 1: the dialer's opening, and the challenge the gate answers.
fn round1(d: &Dialer, g: &Gate, now: Instant) -> Vec<u8> {
    match g.on_request(&d.opening().unwrap(), Some(client()), listener(), now) {
        Verdict::Reject { data, report: None } => data,
        v => panic!("no challenge: {v:?}"),
    }
}

/// Round 2's request for `data` after challenge `c`.
fn proof_for(d: &Dialer, c: &[u8], data: &[u8]) -> Vec<u8> {
    match d.answer(Error::ConnRefused, c, client(), listener(), data) {
        Answer::Prove(p) => p,
        a => panic!("no proof: {a:?}"),
    }
}

#[test]
fn the_same_key_proves_and_the_data_comes_through() {
    let now = Instant::now();
    for kind in [ConnKind::Msg, ConnKind::Rdm] {
        let g = Gate::new(Some(key(JOB_A)), kind, TTL).unwrap();
        let d = Dialer::new(key(JOB_A), kind).unwrap();
        let c = round1(&d, &g, now);
        assert_eq!(c.len(), payload::CHALLENGE_LEN);
        assert_eq!(g.pending(), 1);
        let p = proof_for(&d, &c, b"cm data");
        assert!(p.len() <= payload::MAX_REQUEST);
        // The key never travels: neither request holds its bytes.
        for sent in [&d.opening().unwrap(), &p, &c] {
            assert!(!sent.windows(JOB_A.len()).any(|w| w == JOB_A));
        }
        assert_eq!(
            g.on_request(&p, Some(client()), listener(), now),
            Verdict::Proven(b"cm data".to_vec(), 0)
        );
        assert_eq!(g.pending(), 0, "the challenge is spent");
        // Padding from the transport changes nothing.
        let d = Dialer::new(key(JOB_A), kind).unwrap();
        let mut c = round1(&d, &g, now);
        c.resize(148, 0);
        let mut p = proof_for(&d, &c, b"");
        p.resize(payload::MAX_REQUEST, 0);
        assert_eq!(
            g.on_request(&p, Some(client()), listener(), now),
            Verdict::Proven(Vec::new(), 0)
        );
    }
}

#[test]
fn keyed_and_unkeyed_refuse_each_other() {
    let now = Instant::now();
    let plain = crate::cm_data::cm_encode(b"hi").unwrap();
    // An unkeyed acceptor takes plain requests and refuses every keyed
    // form, reporting it.
    let open = Gate::new(None, ConnKind::Msg, TTL).unwrap();
    assert_eq!(
        open.on_request(&plain, Some(client()), listener(), now),
        Verdict::Plain
    );
    let d = Dialer::new(key(JOB_A), ConnKind::Msg).unwrap();
    let v = open.on_request(&d.opening().unwrap(), Some(client()), listener(), now);
    assert_eq!(v, refused());
    // ... which the keyed connector takes as `KeyRejected`.
    let Verdict::Reject { data, .. } = v else {
        unreachable!()
    };
    assert_eq!(
        d.answer(Error::ConnRefused, &data, client(), listener(), b""),
        Answer::Fail(Error::KeyRejected)
    );
    assert_eq!(
        payload::rejection(Error::ConnRefused, &data),
        Error::KeyRejected
    );
    // A keyed acceptor refuses a plain request (and an empty one).
    let keyed = Gate::new(Some(key(JOB_A)), ConnKind::Msg, TTL).unwrap();
    assert_eq!(
        keyed.on_request(&plain, Some(client()), listener(), now),
        refused()
    );
    assert_eq!(
        keyed.on_request(&[], Some(client()), listener(), now),
        refused()
    );
    assert_eq!(keyed.pending(), 0);
}

#[test]
fn another_key_is_refused_before_anything_is_proven() {
    let now = Instant::now();
    let g = Gate::new(Some(key(JOB_A)), ConnKind::Rdm, TTL).unwrap();
    let d = Dialer::new(key(JOB_B), ConnKind::Rdm).unwrap();
    // The selector names another key: no challenge, no table entry.
    assert_eq!(
        g.on_request(&d.opening().unwrap(), Some(client()), listener(), now),
        refused()
    );
    assert_eq!(g.pending(), 0);
    // An opening without a requester address cannot be bound.
    let d = Dialer::new(key(JOB_A), ConnKind::Rdm).unwrap();
    assert_eq!(
        g.on_request(&d.opening().unwrap(), None, listener(), now),
        refused()
    );
}

#[test]
fn forged_reflected_replayed_and_moved_proofs_are_refused() {
    let now = Instant::now();
    let g = Gate::new(Some(key(JOB_A)), ConnKind::Msg, TTL).unwrap();
    let d = Dialer::new(key(JOB_A), ConnKind::Msg).unwrap();
    let at = |p: &[u8]| g.on_request(p, Some(client()), listener(), now);

    // Forged: a MAC made without the key.
    let c = round1(&d, &g, now);
    let CmAuth::Challenge { nonce: na, .. } = payload::decode(&c).unwrap() else {
        unreachable!()
    };
    let forged = payload::proof(&handle_of(&na), &[0x42; SHORT_MAC_LEN], b"x").unwrap();
    assert_eq!(at(&forged), refused());
    // The guess spent the challenge: the right proof is refused now too.
    assert_eq!(at(&proof_for(&d, &c, b"x")), refused());

    // Reflected: the acceptor's own MAC (cut to size) as the connector's.
    let c = round1(&d, &g, now);
    let CmAuth::Challenge {
        nonce: na,
        mac: amac,
    } = payload::decode(&c).unwrap()
    else {
        unreachable!()
    };
    let mut short = [0u8; SHORT_MAC_LEN];
    short.copy_from_slice(&amac[..SHORT_MAC_LEN]);
    assert_eq!(
        at(&payload::proof(&handle_of(&na), &short, b"").unwrap()),
        refused()
    );

    // Replayed: a good proof works once.
    let c = round1(&d, &g, now);
    let p = proof_for(&d, &c, b"once");
    assert_eq!(at(&p), Verdict::Proven(b"once".to_vec(), 0));
    assert_eq!(at(&p), refused());

    // Tampered: the data the MAC covers changed on the way.
    let c = round1(&d, &g, now);
    let mut p = proof_for(&d, &c, b"data");
    let last = payload::PROOF_PREFIX + 3;
    p[last] ^= 1;
    assert_eq!(at(&p), refused());

    // Moved: a good proof sent from another address than the opening.
    let c = round1(&d, &g, now);
    let p = proof_for(&d, &c, b"");
    let elsewhere = IpAddr::V4(Ipv4Addr::new(10, 66, 0, 3));
    assert_eq!(
        g.on_request(&p, Some(elsewhere), listener(), now),
        refused()
    );

    // Relayed: a challenge from another listener than the one dialled.
    let c = round1(&d, &g, now);
    let other: SocketAddr = "10.66.0.1:7472".parse().unwrap();
    assert!(matches!(
        d.answer(Error::ConnRefused, &c, client(), other, b""),
        Answer::Refuse(_)
    ));

    // A handle never issued, and a proof cut short.
    assert_eq!(
        at(&payload::proof(&[7; 8], &[0; SHORT_MAC_LEN], b"").unwrap()),
        refused()
    );
    let c = round1(&d, &g, now);
    let p = proof_for(&d, &c, b"abc");
    assert_eq!(at(&p[..p.len() - 1]), refused());
    // Rejection forms sent as requests.
    assert_eq!(at(&c), refused());
    assert_eq!(at(&payload::refused()), refused());
}

#[test]
fn a_challenge_expires() {
    let t0 = Instant::now();
    let g = Gate::new(Some(key(JOB_A)), ConnKind::Rdm, TTL).unwrap();
    let d = Dialer::new(key(JOB_A), ConnKind::Rdm).unwrap();
    let c = round1(&d, &g, t0);
    let p = proof_for(&d, &c, b"late");
    let late = t0 + TTL + Duration::from_millis(1);
    assert_eq!(
        g.on_request(&p, Some(client()), listener(), late),
        refused()
    );
    assert_eq!(g.pending(), 0);
}

#[test]
fn a_flood_of_openings_is_bounded() {
    let now = Instant::now();
    let g = Gate::new(Some(key(JOB_A)), ConnKind::Rdm, TTL).unwrap();
    let first = Dialer::new(key(JOB_A), ConnKind::Rdm).unwrap();
    let c = round1(&first, &g, now);
    // A replayed opening (the same nonce and selector, as an eavesdropper
    // could resend it) gets a fresh challenge each time, never more than
    // the table holds.
    let open = first.opening().unwrap();
    for _ in 0..MAX_CHALLENGES + 50 {
        let v = g.on_request(&open, Some(client()), listener(), now);
        assert!(matches!(v, Verdict::Reject { report: None, .. }));
        assert!(g.pending() <= MAX_CHALLENGES);
    }
    assert_eq!(g.pending(), MAX_CHALLENGES);
    // The oldest challenge was evicted: its proof is refused, and the
    // acceptor still serves a new connector.
    assert_eq!(
        g.on_request(&proof_for(&first, &c, b""), Some(client()), listener(), now),
        refused()
    );
    let d = Dialer::new(key(JOB_A), ConnKind::Rdm).unwrap();
    let c = round1(&d, &g, now);
    assert_eq!(
        g.on_request(&proof_for(&d, &c, b"ok"), Some(client()), listener(), now),
        Verdict::Proven(b"ok".to_vec(), 0)
    );
}

#[test]
fn the_connector_checks_the_challenge_first() {
    let now = Instant::now();
    let d = Dialer::new(key(JOB_A), ConnKind::Msg).unwrap();
    // A challenge made with another key: a notice, no MAC of ours.
    let other = Gate::new(Some(key(JOB_B)), ConnKind::Msg, TTL).unwrap();
    let twin = Dialer::new(key(JOB_B), ConnKind::Msg).unwrap();
    let c = round1(&twin, &other, now);
    let CmAuth::Challenge { nonce: na, .. } = payload::decode(&c).unwrap() else {
        unreachable!()
    };
    let a = d.answer(Error::ConnRefused, &c, client(), listener(), b"");
    assert_eq!(a, Answer::Refuse(payload::notice(&handle_of(&na))));
    // A challenge with random bytes for a MAC, and one for another
    // attempt (made for another connector nonce, with the right key).
    let forged = payload::challenge(&[5; 16], &[6; 32]);
    assert!(matches!(
        d.answer(Error::ConnRefused, &forged, client(), listener(), b""),
        Answer::Refuse(_)
    ));
    let g = Gate::new(Some(key(JOB_A)), ConnKind::Msg, TTL).unwrap();
    let earlier = Dialer::new(key(JOB_A), ConnKind::Msg).unwrap();
    let stale = round1(&earlier, &g, now);
    assert!(matches!(
        d.answer(Error::ConnRefused, &stale, client(), listener(), b""),
        Answer::Refuse(_)
    ));
    // A challenge for the other connection kind.
    let rdm = Gate::new(Some(key(JOB_A)), ConnKind::Rdm, TTL).unwrap();
    let c = round1(&d, &rdm, now);
    assert!(matches!(
        d.answer(Error::ConnRefused, &c, client(), listener(), b""),
        Answer::Refuse(_)
    ));
    // A challenge cut short proves nothing; a foreign rejection keeps
    // its own error.
    let c = round1(&d, &g, now);
    assert_eq!(
        d.answer(
            Error::ConnRefused,
            &c[..payload::CHALLENGE_LEN - 1],
            client(),
            listener(),
            b""
        ),
        Answer::Fail(Error::KeyRejected)
    );
    assert_eq!(
        d.answer(Error::ConnRefused, &[0; 148], client(), listener(), b""),
        Answer::Fail(Error::ConnRefused)
    );
    // Data too long for a proof.
    assert_eq!(
        d.answer(
            Error::ConnRefused,
            &c,
            client(),
            listener(),
            &[0; payload::PROOF_DATA_MAX + 1]
        ),
        Answer::Fail(Error::Inval)
    );
}

#[test]
fn a_notice_spends_the_challenge_and_is_reported() {
    let now = Instant::now();
    let g = Gate::new(Some(key(JOB_A)), ConnKind::Msg, TTL).unwrap();
    let d = Dialer::new(key(JOB_A), ConnKind::Msg).unwrap();
    let c = round1(&d, &g, now);
    let CmAuth::Challenge { nonce: na, .. } = payload::decode(&c).unwrap() else {
        unreachable!()
    };
    let n = payload::notice(&handle_of(&na));
    assert_eq!(g.on_request(&n, Some(client()), listener(), now), refused());
    assert_eq!(g.pending(), 0);
    // The proof that would have followed is refused now.
    assert_eq!(
        g.on_request(&proof_for(&d, &c, b""), Some(client()), listener(), now),
        refused()
    );
}

#[test]
fn a_gate_of_several_keys_says_which_one_was_proven() {
    let now = Instant::now();
    let (a, b, c) = (key(JOB_A), key(JOB_B), key(b"job-c key"));
    // JOB_A twice (an AV may hold the same bytes under two handles): the
    // first is the one named.
    let g = Gate::with_keys(vec![a.clone(), b.clone(), a.clone()], ConnKind::Rdm, TTL).unwrap();
    for (k, want) in [(&a, 0), (&b, 1)] {
        let d = Dialer::new(k.clone(), ConnKind::Rdm).unwrap();
        let ch = round1(&d, &g, now);
        let p = proof_for(&d, &ch, b"hello");
        let v = g.on_request(&p, Some(client()), listener(), now);
        assert_eq!(v, Verdict::Proven(b"hello".to_vec(), want));
        assert_eq!(g.proven(want), Some(k));
    }
    // A key the gate does not hold: refused at the opening, nothing kept.
    let d = Dialer::new(c, ConnKind::Rdm).unwrap();
    assert_eq!(
        g.on_request(&d.opening().unwrap(), Some(client()), listener(), now),
        refused()
    );
    assert_eq!(g.pending(), 0);
    // A proof for a challenge made under one key does not pass with
    // another key's MAC: the challenge remembers its key.
    let da = Dialer::new(a.clone(), ConnKind::Rdm).unwrap();
    let ch = round1(&da, &g, now);
    let db = Dialer::new(b.clone(), ConnKind::Rdm).unwrap();
    let forged = match db.answer(Error::ConnRefused, &ch, client(), listener(), b"x") {
        // B cannot verify A's challenge: it refuses instead of proving.
        Answer::Refuse(n) => n,
        other => panic!("B proved A's challenge: {other:?}"),
    };
    assert_eq!(
        g.on_request(&forged, Some(client()), listener(), now),
        refused()
    );
    assert_eq!(g.pending(), 0, "the notice spent the challenge");
}

#[test]
fn openings_name_their_key_by_a_fixed_one_way_identifier() {
    let (a, b) = (key(JOB_A), key(JOB_B));
    let (ia, ib) = (key_id(&a).unwrap(), key_id(&b).unwrap());
    assert_ne!(ia, ib);
    assert_eq!(ia, key_id(&key(JOB_A)).unwrap());
    assert!(!JOB_A.windows(ia.len()).any(|w| w == ia));
    let d = Dialer::new(a.clone(), ConnKind::Msg).unwrap();
    let o = d.opening().unwrap();
    let Ok(payload::CmAuth::Open { key_id: sent, .. }) = payload::decode(&o) else {
        panic!("not an opening")
    };
    assert_eq!(sent, ia);
    // The identifier alone proves nothing: the right identifier with
    // another key's selector is refused, as is the right selector under
    // another key's identifier (the gate looks the key up, then checks).
    let g = Gate::new(Some(a), ConnKind::Msg, TTL).unwrap();
    let nonce = [7u8; 16];
    let wrong_sel = payload::open(&nonce, &b.selector(&nonce).unwrap(), &ia);
    assert_eq!(
        g.on_request(&wrong_sel, Some(client()), listener(), Instant::now()),
        refused()
    );
    let right_sel = key(JOB_A).selector(&nonce).unwrap();
    let wrong_id = payload::open(&nonce, &right_sel, &ib);
    assert_eq!(
        g.on_request(&wrong_id, Some(client()), listener(), Instant::now()),
        refused()
    );
    let both = payload::open(&nonce, &right_sel, &ia);
    assert!(matches!(
        g.on_request(&both, Some(client()), listener(), Instant::now()),
        Verdict::Reject { report: None, .. }
    ));
}
