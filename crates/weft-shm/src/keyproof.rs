//! Authorization keys on shm channels (`docs/wire.md`, "Key proof";
//! `docs/design.md`, "Authorization keys"). A keyed owner publishes a
//! fresh nonce in each free channel; a keyed sender, claiming it, writes
//! a nonce of its own and its MAC (HMAC-SHA256 with the key) over both
//! nonces, both endpoint names, the channel and the claim count. The
//! owner checks it in constant time against the nonce it kept to itself
//! before it reads a single record, writes its verdict and, when it
//! accepts, its own MAC over the same transcript in the other role; the
//! sender checks that before it writes anything. So neither side talks
//! to a peer without the key, an old proof is worth nothing (the other
//! side's nonce is fresh), and nothing in the segment can stand in for a
//! proof: the owner verifies against its private copy of its nonce.
//!
//! The sender also writes its key's id (`keys::key_id`), so an owner
//! holding several keys (`FI_AV_AUTH_KEY`) checks the MAC with the one
//! key the id names, and knows which key the channel proved.
//!
//! An unkeyed owner refuses senders that prove a key; a keyed owner
//! refuses senders that prove none. A sender waits for the verdict when
//! it holds a key or the owner's header says the owner does.

use std::sync::atomic::Ordering::{Acquire, Release};

use weft_core::addr::FiAddr;
use weft_core::auth::{AuthKey, Role, Tag, MAC_LEN};
use weft_core::wire::claim::{fresh_nonce, Nonce, NONCE_LEN};
use weft_core::Result;

use crate::keys::{EpKeys, HeldKey, KeyId, KEY_ID_LEN};
use crate::layout::*;
use crate::ring::Chan;
use crate::segment::Segment;

/// Label of shm channel transcripts (no other transcript starts so).
const LABEL: &[u8] = b"weft-shm-auth-1";

/// What both MACs of one claim cover.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChanTranscript {
    /// The owner's nonce for this claim.
    pub rx_nonce: Nonce,
    /// The sender's nonce.
    pub tx_nonce: Nonce,
    /// The sender's endpoint name.
    pub sender: String,
    /// The owner's endpoint name.
    pub owner: String,
    /// The channel's index.
    pub chan: u32,
    /// The claim count.
    pub gen: u32,
}

impl ChanTranscript {
    /// The label, the role, both nonces, the channel and claim count
    /// (little-endian u32s), then both names, each after its length.
    pub fn bytes(&self, role: Role) -> Vec<u8> {
        let mut b = Vec::with_capacity(LABEL.len() + 1 + 2 * NONCE_LEN + 10 + 2 * NAME_MAX);
        b.extend_from_slice(LABEL);
        b.push(role as u8);
        b.extend_from_slice(&self.rx_nonce);
        b.extend_from_slice(&self.tx_nonce);
        b.extend_from_slice(&self.chan.to_le_bytes());
        b.extend_from_slice(&self.gen.to_le_bytes());
        for n in [&self.sender, &self.owner] {
            // Names are at most NAME_MAX (48) bytes: the length fits.
            b.push(n.len() as u8);
            b.extend_from_slice(n.as_bytes());
        }
        b
    }

    fn prove(&self, key: &AuthKey, role: Role) -> Result<Tag> {
        key.prove_bytes(&self.bytes(role))
    }
}

fn read_nonce(seg: &Segment, at: usize) -> Option<Nonce> {
    let mut n = [0u8; NONCE_LEN];
    seg.read(at, &mut n).then_some(n)
}

/// Owner: publishes a fresh nonce for the channel's next claim (before
/// the channel is free) and returns it, to be kept; `None` if the random
/// source failed, and then every claim of the channel is refused until
/// it is freed again.
pub fn publish_nonce(seg: &Segment, c: &Chan) -> Option<Nonce> {
    let n = fresh_nonce().ok()?;
    seg.write(c.ctl(C_RX_NONCE), &n).then_some(n)
}

/// Owner: the verdict on a claim by `sender`, checked against `nonce`,
/// the owner's own copy of the nonce it published. A keyed claim names
/// its key by id; only a key the owner holds is tried, and only that one.
/// An accepted keyed claim gets the owner's proof. Writes `C_AUTH` and
/// returns `None` (refused) or `Some` of the AV key handle the claim
/// proved (`Some(None)`: the owner's own key, or no key).
pub fn judge(
    seg: &Segment,
    c: &Chan,
    keys: &EpKeys,
    nonce: Option<Nonce>,
    owner: &str,
    sender: &str,
    gen: u32,
) -> Option<Option<FiAddr>> {
    let proves = seg.load32(c.ctl(C_PROVES), Acquire) == Some(1);
    let ok = match (keys.keyed(), proves) {
        (false, false) => Some(None),
        (false, true) | (true, false) => None,
        (true, true) => {
            let mut id = [0u8; KEY_ID_LEN];
            let held = seg
                .read(c.ctl(C_KEY_ID), &mut id)
                .then(|| keys.by_id(&id))
                .flatten();
            held.and_then(|k| {
                let p = owner_proof(seg, c, &k.key, nonce, owner, sender, gen)?;
                // The proof first, the verdict after it (release).
                seg.write(c.ctl(C_RX_PROOF), &p).then_some(k.handle)
            })
        }
    };
    seg.store32(
        c.ctl(C_AUTH),
        if ok.is_some() { AUTH_OK } else { AUTH_REFUSED },
        Release,
    );
    ok
}

/// The owner's MAC when the sender's verifies, else `None`.
fn owner_proof(
    seg: &Segment,
    c: &Chan,
    key: &AuthKey,
    nonce: Option<Nonce>,
    owner: &str,
    sender: &str,
    gen: u32,
) -> Option<Tag> {
    let t = ChanTranscript {
        rx_nonce: nonce?,
        tx_nonce: read_nonce(seg, c.ctl(C_TX_NONCE))?,
        sender: sender.to_owned(),
        owner: owner.to_owned(),
        chan: u32::try_from(c.i).ok()?,
        gen,
    };
    let mut tag = [0u8; MAC_LEN];
    if !seg.read(c.ctl(C_TX_PROOF), &mut tag) {
        return None;
    }
    key.verify_bytes(&t.bytes(Role::Connector), &tag).ok()?;
    t.prove(key, Role::Acceptor).ok()
}

/// Sender: what it waits for after its claim.
#[derive(Debug)]
pub struct Awaiting {
    /// With a key: the key and the transcript the owner must prove.
    proof: Option<(AuthKey, ChanTranscript)>,
}

/// The owner's answer as a sender sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not given yet.
    Pending,
    /// Accepted (and, keyed, the owner proved the key).
    Accepted,
    /// Refused, or the owner's proof is not good.
    Refused,
}

/// A claim's proof, computed but not written yet: the fresh nonce (a
/// system call) and the MAC take microseconds, the writes nanoseconds,
/// so a claimer checks that its claim is still its own between the two
/// (`tx::Peer::claim`), and a claim the owner voided meanwhile writes
/// nothing over the next claimer's fields.
#[derive(Debug)]
pub struct Prepared {
    owner_keyed: bool,
    proof: Option<(AuthKey, ChanTranscript, KeyId, Tag)>,
}

/// Sender, during its claim of `c` (before its claim's word goes
/// `ACTIVE`): reads the owner's nonce and keyedness, draws our nonce and
/// computes the proof, writing nothing ([`Prepared::write`] writes it).
pub fn prepare(
    seg: &Segment,
    c: &Chan,
    key: Option<&HeldKey>,
    me: &str,
    owner: &str,
    gen: u32,
) -> Result<Prepared> {
    let owner_keyed = seg.load32(H_KEYED, Acquire) == Some(1);
    let Some(HeldKey { key: k, id, .. }) = key else {
        return Ok(Prepared {
            owner_keyed,
            proof: None,
        });
    };
    let t = ChanTranscript {
        rx_nonce: read_nonce(seg, c.ctl(C_RX_NONCE)).unwrap_or([0; NONCE_LEN]),
        tx_nonce: fresh_nonce()?,
        sender: me.to_owned(),
        owner: owner.to_owned(),
        chan: u32::try_from(c.i).unwrap_or(u32::MAX),
        gen,
    };
    let p = t.prove(k, Role::Connector)?;
    Ok(Prepared {
        owner_keyed,
        proof: Some((k.clone(), t, *id, p)),
    })
}

impl Prepared {
    /// Writes the proof (or that there is none) into `c`'s control block
    /// and returns what the claimer must wait for, `None` when it may
    /// write at once (neither side keyed).
    pub fn write(self, seg: &Segment, c: &Chan) -> Option<Awaiting> {
        let Some((k, t, id, p)) = self.proof else {
            seg.store32(c.ctl(C_PROVES), 0, Release);
            return self.owner_keyed.then_some(Awaiting { proof: None });
        };
        seg.write(c.ctl(C_TX_NONCE), &t.tx_nonce);
        seg.write(c.ctl(C_KEY_ID), &id);
        seg.write(c.ctl(C_TX_PROOF), &p);
        seg.store32(c.ctl(C_PROVES), 1, Release);
        Some(Awaiting {
            proof: Some((k, t)),
        })
    }
}

/// Sender: the owner's verdict on its claim, its proof checked in
/// constant time.
pub fn verdict(seg: &Segment, c: &Chan, w: &Awaiting) -> Verdict {
    match seg.load32(c.ctl(C_AUTH), Acquire) {
        Some(AUTH_UNKNOWN) => Verdict::Pending,
        Some(AUTH_OK) => {
            let Some((k, t)) = &w.proof else {
                return Verdict::Accepted;
            };
            let mut tag = [0u8; MAC_LEN];
            let good = seg.read(c.ctl(C_RX_PROOF), &mut tag)
                && k.verify_bytes(&t.bytes(Role::Acceptor), &tag).is_ok();
            if good {
                Verdict::Accepted
            } else {
                Verdict::Refused
            }
        }
        _ => Verdict::Refused,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn seg() -> (Segment, Chan) {
        let g = Geometry::check(2, RING_MIN as u32).unwrap();
        let s = Segment::anonymous(&vec![0u8; g.bytes()]).unwrap();
        (s, Chan { g, i: 1 })
    }

    fn key(k: &[u8]) -> HeldKey {
        let key = AuthKey::new(k).unwrap();
        HeldKey {
            handle: None,
            id: crate::keys::key_id(&key).unwrap(),
            key,
        }
    }

    fn owner(k: Option<&HeldKey>) -> EpKeys {
        EpKeys::single(k.map(|h| h.key.clone())).unwrap()
    }

    #[test]
    fn transcript_layout() {
        let t = ChanTranscript {
            rx_nonce: [1; 16],
            tx_nonce: [2; 16],
            sender: "s".into(),
            owner: "ow".into(),
            chan: 3,
            gen: 0x0102,
        };
        let mut want = b"weft-shm-auth-1".to_vec();
        want.push(2);
        want.extend_from_slice(&[1; 16]);
        want.extend_from_slice(&[2; 16]);
        want.extend_from_slice(&[3, 0, 0, 0, 2, 1, 0, 0]);
        want.extend_from_slice(&[1, b's', 2, b'o', b'w']);
        assert_eq!(t.bytes(Role::Connector), want);
    }

    /// One claim, both sides, over one anonymous segment.
    fn run(
        owner_key: Option<&[u8]>,
        sender_key: Option<&[u8]>,
        tamper: impl FnOnce(&Segment, &Chan),
    ) -> (bool, Verdict) {
        let (s, c) = seg();
        if owner_key.is_some() {
            s.store32(H_KEYED, 1, Release);
        }
        let nonce = publish_nonce(&s, &c);
        let ok = owner_key.map(key);
        let sk = sender_key.map(key);
        let w = prepare(&s, &c, sk.as_ref(), "snd", "own", 5)
            .unwrap()
            .write(&s, &c);
        tamper(&s, &c);
        let accepted = judge(&s, &c, &owner(ok.as_ref()), nonce, "own", "snd", 5).is_some();
        let v = w.map_or(Verdict::Accepted, |w| verdict(&s, &c, &w));
        (accepted, v)
    }

    #[test]
    fn one_key_both_ways() {
        assert_eq!(
            run(Some(b"k"), Some(b"k"), |_, _| {}),
            (true, Verdict::Accepted)
        );
        assert_eq!(run(None, None, |_, _| {}), (true, Verdict::Accepted));
    }

    #[test]
    fn mismatches_are_refused_on_both_sides() {
        for (o, s) in [
            (Some(&b"k"[..]), Some(&b"other"[..])),
            (Some(b"k"), None),
            (None, Some(b"k")),
        ] {
            assert_eq!(
                run(o, s, |_, _| {}),
                (false, Verdict::Refused),
                "{o:?} {s:?}"
            );
        }
    }

    /// Changes the byte at `at`. Flipped, not overwritten: a fixed byte
    /// equals a proof's own one time in 256, and the proof would stand
    /// (a test failed so).
    fn flip(s: &Segment, at: usize) {
        let mut b = [0u8; 1];
        s.read(at, &mut b);
        s.write(at, &[b[0] ^ 0x55]);
    }

    #[test]
    fn forged_and_replayed_proofs_are_refused() {
        // Garbage in the sender's proof or its nonce.
        for at in [C_TX_PROOF, C_TX_PROOF + 31, C_TX_NONCE + 3] {
            let r = run(Some(b"k"), Some(b"k"), |s, c| flip(s, c.ctl(at)));
            assert!(!r.0, "field {at}");
        }
        // The owner's nonce changed in the segment before the claim: the
        // owner checks against its own copy.
        let (s, c) = seg();
        let k = key(b"k");
        let nonce = publish_nonce(&s, &c);
        s.write(c.ctl(C_RX_NONCE), &[0; NONCE_LEN]);
        prepare(&s, &c, Some(&k), "snd", "own", 5)
            .unwrap()
            .write(&s, &c);
        assert!(judge(&s, &c, &owner(Some(&k)), nonce, "own", "snd", 5).is_none());
        // A proof made for another claim count, or another channel.
        let (s, c) = seg();
        let nonce = publish_nonce(&s, &c);
        prepare(&s, &c, Some(&k), "snd", "own", 5)
            .unwrap()
            .write(&s, &c);
        assert!(judge(&s, &c, &owner(Some(&k)), nonce, "own", "snd", 6).is_none());
        let other = Chan { g: c.g, i: 0 };
        assert!(judge(&s, &other, &owner(Some(&k)), nonce, "own", "snd", 5).is_none());
        // A whole proof replayed against a fresh owner nonce.
        let (s, c) = seg();
        let first = publish_nonce(&s, &c);
        prepare(&s, &c, Some(&k), "snd", "own", 5)
            .unwrap()
            .write(&s, &c);
        let mut old = [0u8; 64];
        s.read(c.ctl(C_TX_NONCE), &mut old[..16]);
        s.read(c.ctl(C_TX_PROOF), &mut old[16..48]);
        assert!(judge(&s, &c, &owner(Some(&k)), first, "own", "snd", 5).is_some());
        let fresh = publish_nonce(&s, &c);
        assert_ne!(first, fresh);
        s.write(c.ctl(C_TX_NONCE), &old[..16]);
        s.write(c.ctl(C_TX_PROOF), &old[16..48]);
        s.store32(c.ctl(C_PROVES), 1, Release);
        assert!(judge(&s, &c, &owner(Some(&k)), fresh, "own", "snd", 5).is_none());
        // No nonce of the owner's (its random source failed): refused.
        assert!(judge(&s, &c, &owner(Some(&k)), None, "own", "snd", 5).is_none());
    }

    #[test]
    fn a_forged_owner_proof_is_refused_by_the_sender() {
        let (s, c) = seg();
        let k = key(b"k");
        let nonce = publish_nonce(&s, &c);
        let w = prepare(&s, &c, Some(&k), "snd", "own", 5)
            .unwrap()
            .write(&s, &c)
            .unwrap();
        assert_eq!(verdict(&s, &c, &w), Verdict::Pending);
        // An owner (or anyone) saying yes without the key's proof.
        s.store32(c.ctl(C_AUTH), AUTH_OK, Release);
        assert_eq!(verdict(&s, &c, &w), Verdict::Refused);
        assert!(judge(&s, &c, &owner(Some(&k)), nonce, "own", "snd", 5).is_some());
        assert_eq!(verdict(&s, &c, &w), Verdict::Accepted);
        flip(&s, c.ctl(C_RX_PROOF + 31));
        assert_eq!(verdict(&s, &c, &w), Verdict::Refused);
        s.store32(c.ctl(C_AUTH), 77, Release);
        assert_eq!(verdict(&s, &c, &w), Verdict::Refused);
    }

    #[test]
    fn an_owner_of_several_keys_checks_the_one_the_id_names() {
        let av = EpKeys::detached(vec![
            (3, AuthKey::new(b"job-a").unwrap()),
            (7, AuthKey::new(b"job-b").unwrap()),
        ])
        .unwrap();
        let try_claim = |k: &HeldKey, tamper: &dyn Fn(&Segment, &Chan)| {
            let (s, c) = seg();
            s.store32(H_KEYED, 1, Release);
            let nonce = publish_nonce(&s, &c);
            let w = prepare(&s, &c, Some(k), "snd", "own", 5)
                .unwrap()
                .write(&s, &c)
                .unwrap();
            tamper(&s, &c);
            let got = judge(&s, &c, &av, nonce, "own", "snd", 5);
            (got, verdict(&s, &c, &w))
        };
        let none = |_: &Segment, _: &Chan| {};
        assert_eq!(
            try_claim(&key(b"job-b"), &none),
            (Some(Some(7)), Verdict::Accepted)
        );
        assert_eq!(
            try_claim(&key(b"job-a"), &none),
            (Some(Some(3)), Verdict::Accepted)
        );
        assert_eq!(try_claim(&key(b"job-c"), &none), (None, Verdict::Refused));
        // The id of a held key over a MAC made with another key.
        let a_id = key(b"job-a").id;
        let swap = move |s: &Segment, c: &Chan| {
            s.write(c.ctl(C_KEY_ID), &a_id);
        };
        assert_eq!(try_claim(&key(b"job-c"), &swap), (None, Verdict::Refused));
        assert_eq!(try_claim(&key(b"job-b"), &swap), (None, Verdict::Refused));
    }

    #[test]
    fn unkeyed_senders_wait_only_for_keyed_owners() {
        let (s, c) = seg();
        assert!(prepare(&s, &c, None, "snd", "own", 1)
            .unwrap()
            .write(&s, &c)
            .is_none());
        assert_eq!(s.load32(c.ctl(C_PROVES), Acquire), Some(0));
        s.store32(H_KEYED, 1, Release);
        let w = prepare(&s, &c, None, "snd", "own", 2)
            .unwrap()
            .write(&s, &c)
            .unwrap();
        s.store32(c.ctl(C_AUTH), AUTH_REFUSED, Release);
        assert_eq!(verdict(&s, &c, &w), Verdict::Refused);
    }
}
