//! Authorization keys on shm (`docs/wire.md`, "Key proof"): a channel is
//! read only after its sender proved the owner's key, and a keyed sender
//! writes only after the owner proved it back. Endpoints of one key talk
//! (tagged and untagged, `FI_SOURCE` right); other keys, and keyed vs
//! unkeyed, fail the sends with `FI_EKEYREJECTED`, reported on both EQs
//! with the other's address and counted on both sides, nothing delivered,
//! while the owner goes on serving its legitimate peer. Proofs written by
//! hand into the segment (garbage, replayed from another claim, missing)
//! are refused and nothing in their ring is read. Regions keyed with
//! another key refuse RMA (`FI_EACCES`). Keys of the wrong size are
//! refused at open. Keys in the AV: `shm_av_auth_keys.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use weft::{
    AddressVector, CompletionQueue, Domain, EpType, Error, EventQueue, Info, MrAccess, MrAttr,
    OpFlags, WaitMode, FI_ADDR_UNSPEC,
};
use weft_integration::{
    assert_cq_quiet, bad_keys_refused_at_open, delivered, enabled_endpoint_with_eq, next_cq,
    payload, within, Provider, TIMEOUT,
};
use weft_shm::layout::*;
use weft_shm::ring::{Chan, RecHead};
use weft_shm::segment::Segment;

const JOB_A: &[u8] = b"job-a key";
const JOB_B: &[u8] = b"job-b key";
const RW: MrAccess = MrAccess::REMOTE_READ.union(MrAccess::REMOTE_WRITE);

/// The shm RDM offer (with RMA) for an endpoint holding `key`.
fn info(key: Option<&[u8]>) -> Info {
    let i = Provider::named("shm")
        .try_info_with(EpType::Rdm, |h| {
            h.caps = weft::Caps::MSG | weft::Caps::TAGGED | weft::Caps::RMA;
            h.domain_attr.mr_mode =
                weft::MrMode::PROV_KEY | weft::MrMode::VIRT_ADDR | weft::MrMode::LOCAL;
            h.mode = weft::Mode::RX_CQ_DATA;
            h.ep_attr.auth_key = key.map(<[u8]>::to_vec);
        })
        .expect("a keyed shm offer");
    assert_eq!(i.ep_attr.auth_key.as_deref(), key);
    assert_eq!(
        i.domain_attr.max_ep_auth_key,
        weft_core::av::MAX_AV_AUTH_KEYS
    );
    i
}

fn domain(domain_key: Option<&[u8]>) -> Domain {
    let mut i = info(None);
    i.domain_attr.auth_key = domain_key.map(<[u8]>::to_vec);
    weft::Fabric::open(&i).unwrap().domain(&i).unwrap()
}

struct Ep {
    ep: weft::Endpoint,
    av: AddressVector,
    cq: CompletionQueue,
    eq: EventQueue,
    addr: Vec<u8>,
}

impl Ep {
    fn open(d: &Domain, key: Option<&[u8]>) -> Ep {
        Ep::open_in(d, key, WaitMode::Interrupt)
    }

    fn open_in(d: &Domain, key: Option<&[u8]>, mode: WaitMode) -> Ep {
        let av = d.av(Default::default()).unwrap();
        let eq = d.fabric().eq(64).unwrap();
        let (ep, cq) = enabled_endpoint_with_eq(d, &info(key), &av, Some(&eq), mode);
        let addr = ep.local_addr().unwrap();
        Ep {
            ep,
            av,
            cq,
            eq,
            addr,
        }
    }

    fn insert(&self, peer: &Ep) -> weft::FiAddr {
        self.av
            .insert_sync(std::slice::from_ref(&peer.addr), Default::default())
            .unwrap()
            .fi_addrs[0]
    }

    fn name(&self) -> String {
        String::from_utf8(self.addr.clone())
            .unwrap()
            .trim_start_matches("fi_shm://")
            .to_owned()
    }

    /// The endpoint's segment, mapped as another process would.
    fn segment(&self) -> Segment {
        let g = Geometry::OURS;
        Segment::open(
            &weft_shm::name::seg_name(&self.name()),
            g.bytes(),
            g.bytes(),
        )
        .unwrap()
    }
}

async fn until(what: &str, ok: impl Fn() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < TIMEOUT, "{what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The next error on `eq`: `KeyRejected`, naming `peer`.
async fn reported(eq: &EventQueue, peer: &[u8]) {
    let e = within("an EQ report", async {
        loop {
            match eq.read_err() {
                Ok(e) => return e,
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    })
    .await;
    assert_eq!(e.err, Error::KeyRejected, "{e:?}");
    assert_eq!(e.peer_addr.as_deref(), Some(peer));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_keys_are_refused_at_open() {
    let d = domain(None);
    bad_keys_refused_at_open(&d, &info(None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_wait_mode_waits_for_the_verdict() {
    for mode in [WaitMode::Interrupt, WaitMode::BusyPoll, WaitMode::Inline] {
        let d = domain(Some(JOB_A));
        let (a, b) = (Ep::open_in(&d, None, mode), Ep::open_in(&d, None, mode));
        let (b_in_a, a_in_b) = (a.insert(&b), b.insert(&a));
        let o = Ep::open_in(&d, Some(JOB_B), mode);
        let o_to_b = o.insert(&b);
        for i in 0..20u8 {
            assert_eq!(
                delivered(&a.ep, &b.ep, b_in_a, payload(100, i)).await,
                a_in_b
            );
            assert_eq!(
                delivered(&b.ep, &a.ep, a_in_b, payload(100, i)).await,
                b_in_a
            );
        }
        refused_both_ways(&o, &b, o_to_b).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_talks_tagged_and_untagged() {
    // b takes its key from its domain, a has its own: the same key.
    let (da, db) = (domain(None), domain(Some(JOB_A)));
    let a = Ep::open(&da, Some(JOB_A));
    let b = Ep::open(&db, None);
    let (b_in_a, a_in_b) = (a.insert(&b), b.insert(&a));
    for i in 0..50u64 {
        // Small and CMA-sized messages.
        let msg = payload(1 + (i as usize * 7919) % 100_000, i as u8);
        assert_eq!(delivered(&a.ep, &b.ep, b_in_a, msg.clone()).await, a_in_b);
        b.ep.post_trecv(BytesMut::zeroed(100_000), FI_ADDR_UNSPEC, i, 0, 100 + i)
            .unwrap();
        a.ep.post_tsend(b_in_a, msg.clone(), i, 200 + i).unwrap();
        assert_eq!(
            within("send", next_cq(&a.cq)).await.unwrap().context,
            200 + i
        );
        let r = within("receive", next_cq(&b.cq)).await.unwrap();
        assert_eq!((r.context, r.tag, r.src), (100 + i, i, a_in_b));
        assert!(r.flags.contains(OpFlags::RECV | OpFlags::TAGGED));
        assert_eq!(&r.into_bytes()[..], &msg[..]);
    }
    assert_eq!(
        delivered(&b.ep, &a.ep, a_in_b, payload(10, 1)).await,
        b_in_a
    );
    for e in [&a, &b] {
        let s = e.ep.stats().unwrap();
        assert_eq!((s.rx_key_rejected, s.rx_malformed), (0, 0));
        assert!(e.eq.read_err().is_err(), "no refusal reported");
    }
}

/// A send from `from` to `to` fails with `KeyRejected`, both EQs report
/// it naming the other, both count it.
async fn refused_both_ways(from: &Ep, to: &Ep, dest: weft::FiAddr) {
    let before = (
        from.ep.stats().unwrap().rx_key_rejected,
        to.ep.stats().unwrap().rx_key_rejected,
    );
    let r = within("refused send", from.ep.send(dest, payload(64, 0xEE))).await;
    assert_eq!(r.unwrap_err().err, Error::KeyRejected);
    reported(&from.eq, &to.addr).await;
    reported(&to.eq, &from.addr).await;
    assert_eq!(from.ep.stats().unwrap().rx_key_rejected, before.0 + 1);
    until("the owner counts it", || {
        to.ep.stats().unwrap().rx_key_rejected == before.1 + 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_keys_and_no_key_are_refused_while_the_peer_is_served() {
    let d = domain(None);
    let b = Ep::open(&d, Some(JOB_A));
    let friend = Ep::open(&d, Some(JOB_A));
    let other_job = Ep::open(&d, Some(JOB_B));
    let unkeyed = Ep::open(&d, None);
    let a_in_b = b.insert(&friend);
    let f = friend.insert(&b);
    for i in 0..3u8 {
        refused_both_ways(&other_job, &b, other_job.insert(&b)).await;
        refused_both_ways(&unkeyed, &b, unkeyed.insert(&b)).await;
        // A keyed sender refuses an unkeyed owner, and is refused by it.
        refused_both_ways(&friend, &unkeyed, friend.insert(&unkeyed)).await;
        assert_eq!(
            delivered(&friend.ep, &b.ep, f, payload(100, i)).await,
            a_in_b,
            "the friend is served meanwhile"
        );
    }
    b.ep.post_recv(BytesMut::zeroed(64), 1).unwrap();
    assert_cq_quiet(&b.cq, "nothing of the strangers delivered").await;
    unkeyed.ep.post_recv(BytesMut::zeroed(64), 2).unwrap();
    assert_cq_quiet(&unkeyed.cq, "nothing of the keyed sender delivered").await;
}

/// Claims channel `i` of `seg` by hand as a sender named `name`,
/// announcing a proof made of `nonce` and `proof`, and writes one message
/// record into its ring. Returns the channel.
fn forge_claim(seg: &Segment, i: usize, name: &str, nonce: &[u8], proof: &[u8]) -> Chan {
    let g = Geometry::OURS;
    let c = Chan { g, i };
    let me = weft_shm::live::me();
    use Ordering::Release;
    let gen = c.begin_claim(seg, me.0).expect("a free channel");
    seg.store32(c.ctl(C_PID), me.0, Release);
    seg.store64(c.ctl(C_START), me.1, Release);
    seg.store32(c.ctl(C_NAME_LEN), name.len() as u32, Release);
    seg.write(c.ctl(C_NAME), name.as_bytes());
    c.clear_start(seg);
    seg.write(c.ctl(C_TX_NONCE), nonce);
    seg.write(c.ctl(C_TX_PROOF), proof);
    seg.store32(c.ctl(C_PROVES), u32::from(!proof.is_empty()), Release);
    // The message is in the ring before the owner even looks.
    let h = RecHead {
        word: K_FIRST | F_LAST,
        len: 5,
        total: 5,
        ..RecHead::default()
    };
    let (at, _) = c.write_head(seg, 0, &h);
    seg.write(at, b"forge");
    c.publish(seg, 0, h.word);
    assert!(c.move_state(seg, gen, claiming(me.0), ACTIVE));
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_replayed_and_missing_proofs_are_refused() {
    let d = domain(None);
    let b = Ep::open(&d, Some(JOB_A));
    let friend = Ep::open(&d, Some(JOB_A));
    let f = friend.insert(&b);
    let a_in_b = b.insert(&friend);
    let seg = b.segment();
    // The friend's claim: its proof, as a process of the same user could
    // read it from the segment.
    delivered(&friend.ep, &b.ep, f, Bytes::from_static(b"first")).await;
    let mine = (0..CHANNELS)
        .map(|i| Chan {
            g: Geometry::OURS,
            i,
        })
        .find(|c| c.state(&seg) == Some(ACTIVE))
        .expect("the friend's channel");
    let mut nonce = [0u8; 16];
    let mut proof = [0u8; 32];
    assert!(seg.read(mine.ctl(C_TX_NONCE), &mut nonce));
    assert!(seg.read(mine.ctl(C_TX_PROOF), &mut proof));
    assert_eq!(
        seg.load32(mine.ctl(C_AUTH), Ordering::Acquire),
        Some(AUTH_OK)
    );
    let friend_name = friend.name();
    let mut flipped = proof;
    flipped[0] ^= 1;
    let forgeries: [(&str, &[u8], &[u8]); 4] = [
        // Replayed under the friend's name on another channel.
        (&friend_name, &nonce, &proof),
        // Garbage, a flipped bit, and no proof at all.
        ("forger", &[0x5A; 16], &[0xA5; 32]),
        (&friend_name, &nonce, &flipped),
        ("forger", &[], &[]),
    ];
    let free_chans: Vec<usize> = (0..CHANNELS)
        .filter(|&i| i != mine.i)
        .take(forgeries.len())
        .collect();
    let mut chans = Vec::new();
    for ((name, n, p), i) in forgeries.iter().zip(&free_chans) {
        chans.push(forge_claim(&seg, *i, name, n, p));
    }
    until("every forged claim refused", || {
        b.ep.stats().unwrap().rx_key_rejected == forgeries.len() as u64
    })
    .await;
    for c in &chans {
        assert_eq!(
            seg.load32(c.ctl(C_AUTH), Ordering::Acquire),
            Some(AUTH_REFUSED)
        );
        assert_eq!(c.head(&seg), 0, "nothing of its ring read");
    }
    assert_eq!(b.ep.stats().unwrap().rx_malformed, 0);
    // The friend goes on; the forged messages are never delivered.
    assert_eq!(
        delivered(&friend.ep, &b.ep, f, Bytes::from_static(b"second")).await,
        a_in_b
    );
    b.ep.post_recv(BytesMut::zeroed(64), 7).unwrap();
    assert_cq_quiet(&b.cq, "no forged message delivered").await;
    // Refused channels nobody gives up are freed within two sweeps, each
    // with a fresh nonce for the next claim.
    until("refused channels freed", || {
        chans.iter().all(|c| c.state(&seg) == Some(FREE))
    })
    .await;
    let mut fresh = [0u8; 16];
    assert!(seg.read(chans[0].ctl(C_RX_NONCE), &mut fresh));
    assert_ne!(fresh, [0; 16]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regions_keyed_with_another_key_refuse_rma() {
    // The domain's key is A: the endpoints and the default region hold it.
    let d = domain(Some(JOB_A));
    let a = Ep::open(&d, None);
    let b = Ep::open(&d, None);
    let to_b = a.insert(&b);
    b.insert(&a);
    let dom_keyed = d
        .mr_regattr(MrAttr::alloc(4096, RW).requested_key(1))
        .unwrap();
    let other = d
        .mr_regattr(MrAttr::alloc(4096, RW).requested_key(2).auth_key(JOB_B))
        .unwrap();
    let same = d
        .mr_regattr(MrAttr::alloc(4096, RW).requested_key(3).auth_key(JOB_A))
        .unwrap();
    for mr in [&dom_keyed, &same] {
        within(
            "write",
            a.ep.write(to_b, payload(16, 1), mr.addr(), mr.key()),
        )
        .await
        .unwrap();
        let got = within(
            "read",
            a.ep.read(to_b, BytesMut::zeroed(16), mr.addr(), mr.key()),
        )
        .await
        .unwrap();
        assert_eq!(&got.into_bytes()[..], &payload(16, 1)[..]);
    }
    let w = within(
        "refused write",
        a.ep.write(to_b, payload(16, 2), other.addr(), other.key()),
    )
    .await;
    assert_eq!(w.unwrap_err().err, Error::Access);
    let r = within(
        "refused read",
        a.ep.read(to_b, BytesMut::zeroed(16), other.addr(), other.key()),
    )
    .await;
    assert_eq!(r.unwrap_err().err, Error::Access);
    let mut untouched = [1u8; 16];
    other.read_at(0, &mut untouched).unwrap();
    assert_eq!(untouched, [0; 16]);
    // An endpoint keyed with B, in the same domain, reaches B's region
    // only.
    let c = Ep::open(&d, Some(JOB_B));
    let e = Ep::open(&d, Some(JOB_B));
    let to_e = c.insert(&e);
    e.insert(&c);
    within(
        "write",
        c.ep.write(to_e, payload(16, 3), other.addr(), other.key()),
    )
    .await
    .unwrap();
    let w = within(
        "refused write",
        c.ep.write(to_e, payload(16, 4), dom_keyed.addr(), dom_keyed.key()),
    )
    .await;
    assert_eq!(w.unwrap_err().err, Error::Access);
}

/// A claim clears the word at position 0 of its channel's ring, where
/// the owner starts reading each claim: a channel freed after its sender
/// closed and claimed again delivers the new sender's message once and
/// the old one's not again (it would take the receive first). Keyed, the new sender writes nothing until
/// the owner has accepted its claim, and the owner reads the ring in the
/// pass that accepts it: without the clear it read the last claim's
/// record still at position 0, every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_after_a_close_reads_only_its_own_records() {
    let d = domain(None);
    let b = Ep::open(&d, Some(JOB_A));
    let seg = b.segment();
    let g = Geometry::OURS;
    let active = || {
        (0..g.channels)
            .filter(|&i| Chan { g, i }.state(&seg) != Some(FREE))
            .count()
    };
    for (round, ctx) in [(1u8, 10u64), (2, 20)] {
        let a = Ep::open(&d, Some(JOB_A));
        let to_b = a.insert(&b);
        b.ep.post_recv(BytesMut::zeroed(64), ctx).unwrap();
        a.ep.post_send(to_b, payload(64, round), ctx).unwrap();
        let r = within("the message", next_cq(&b.cq)).await.unwrap();
        assert_eq!(r.context, ctx, "round {round}");
        assert_eq!(&r.into_bytes()[..], &payload(64, round)[..]);
        within("the send", next_cq(&a.cq)).await.unwrap();
        a.ep.close().unwrap();
        until("the owner frees the closed sender's channel", || {
            active() == 0
        })
        .await;
    }
}
