//! A peer mapped and a channel of its claimed: its segment checked at
//! the mapping, the claim made step by step while it stays ours
//! (`docs/design.md`, "The state word"), and whether the channel and
//! the peer still are what we took them for.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use weft_core::{Error, Result};

use super::{answers, Peer};
use crate::keys::EpKeys;
use crate::layout::*;
use crate::ring::Chan;
use crate::segment::Segment;

/// How many looks [`Peer::claim`] takes whether its claim is still ours,
/// its activation's swap the last: one before each group of its writes.
#[cfg(test)]
const CLAIM_LOOKS: usize = 5;

impl Peer {
    /// Maps `name`'s segment and checks its header, for an endpoint that
    /// `spins` (not interrupt mode). `ConnRefused` when there is no such
    /// endpoint (any more), or what is under its segment's name is no
    /// segment (a FIFO, a directory, a file of no segment's size:
    /// `Segment::open`'s `Inval`, the name being valid).
    pub(super) fn open(name: &str, spins: bool) -> Result<Peer> {
        let min = Geometry::check(1, RING_MIN as u32)
            .map(|g| g.bytes())
            .unwrap_or(HEADER);
        let max = Geometry::check(CHANNELS_MAX as u32, RING_MAX as u32)
            .map(|g| g.bytes())
            .unwrap_or(HEADER);
        let mut seg =
            Segment::open(&crate::name::seg_name(name), min, max).map_err(|e| match e {
                Error::NoEnt | Error::Inval => Error::ConnRefused,
                e => e,
            })?;
        let owner = crate::live::owner_of(&seg).ok_or(Error::ConnRefused)?;
        let serial = seg
            .load64(H_SERIAL, Ordering::Acquire)
            .ok_or(Error::ConnRefused)?;
        let g = crate::ring::header_geometry(&seg).ok_or(Error::ConnRefused)?;
        // Its rings checked against the mapping once (`Chan::area`); a
        // geometry whose rings would not fit was refused just above.
        seg.set_rings(g.rings(), g.channels, g.ring);
        if !crate::live::owner_runs(name, (owner.0, owner.1, serial)) {
            return Err(Error::ConnRefused);
        }
        Ok(Peer {
            name: name.to_owned(),
            seg,
            g,
            chan: None,
            tail: 0,
            head_seen: 0,
            owner,
            serial,
            bell: crate::bell::open_remote(name),
            queue: VecDeque::new(),
            delivering: VecDeque::new(),
            pending: VecDeque::new(),
            answering: false,
            answering_id: 0,
            answering_seq: 0,
            ghosts: answers::Ghosts::default(),
            awaiting: None,
            refused: false,
            proves: None,
            spins,
        })
    }

    /// Claims a free channel, if there is one, proving the key `keys`
    /// hold for [`proves`](Self::proves).
    pub(super) fn claim(
        &mut self,
        me: crate::live::Instance,
        my_name: &str,
        keys: &EpKeys,
    ) -> bool {
        self.claim_with(me, my_name, keys, |_, _, _| {})
    }

    /// [`claim`](Self::claim), running `between(k, segment, channel)`
    /// right before its `k`th look whether the claim is still ours (`k`
    /// from 0 to `CLAIM_LOOKS` − 1, the last its activation's swap):
    /// where a test voids the claim as an owner can. A no-op otherwise.
    fn claim_with(
        &mut self,
        me: crate::live::Instance,
        my_name: &str,
        keys: &EpKeys,
        mut between: impl FnMut(usize, &Segment, &Chan),
    ) -> bool {
        if self.chan.is_some() {
            return true;
        }
        use Ordering::Release;
        for i in 0..self.g.channels {
            let c = Chan { g: self.g, i };
            let Some(gen) = c.begin_claim(&self.seg, me.0) else {
                continue;
            };
            let s = &self.seg;
            s.store32(c.ctl(C_PID), me.0, Release);
            s.store64(c.ctl(C_START), me.1, Release);
            s.store64(c.ctl(C_SERIAL), me.2, Release);
            // Each group of writes only while the claim is still ours: a
            // claim the owner voided (it took us for dead) may be the
            // next claimer's channel now. Narrowed, not closed: the owner
            // can void it right after a check (`Chan::still_claiming`).
            between(0, s, &c);
            if !c.still_claiming(s, me.0, gen) {
                return false;
            }
            s.store32(c.ctl(C_NAME_LEN), my_name.len() as u32, Release);
            s.write(c.ctl(C_NAME), my_name.as_bytes());
            between(1, s, &c);
            if !c.still_claiming(s, me.0, gen) {
                return false;
            }
            // Before `ACTIVE`: the receiver starts at position 0, whose
            // word must be 0 or a record of this claim's.
            c.clear_start(s);
            // A random source that failed (no nonce): the channel is
            // given straight back and the sends wait for the next try.
            let key = keys.key_for(self.proves);
            let Ok(proof) = crate::keyproof::prepare(s, &c, key, my_name, &self.name, gen) else {
                c.move_state(s, gen, claiming(me.0), CLOSED);
                return false;
            };
            // Checked after the proof's computation (a system call and a
            // MAC), right before its writes.
            between(2, s, &c);
            if !c.still_claiming(s, me.0, gen) {
                return false;
            }
            let awaiting = proof.write(s, &c);
            between(3, s, &c);
            if !c.still_claiming(s, me.0, gen) {
                return false;
            }
            // Waiting for the verdict: the owner rings us when it is in.
            s.store32(c.ctl(C_TX_WAIT), u32::from(awaiting.is_some()), Release);
            let probe = match crate::cma::mode() {
                crate::cma::Mode::Denied => 0,
                _ => crate::cma::probe_addr(),
            };
            s.store64(c.ctl(C_CMA_PROBE), probe, Release);
            between(4, s, &c);
            if !c.move_state(s, gen, claiming(me.0), ACTIVE) {
                // The owner freed the claim, taking us for dead (a claim
                // that outlasted a sweep interval): not ours to finish;
                // the sends wait for the next try.
                return false;
            }
            self.awaiting = awaiting;
            self.chan = Some((c, gen));
            self.tail = 0;
            self.head_seen = 0;
            return true;
        }
        false
    }

    /// Whether the claimed channel `c` (claim count `gen`) is still ours:
    /// an owner that freed it (it took us for dead or broken) may have
    /// given it to another sender. Its state word is read through the
    /// control block, checked against the mapping once.
    pub(super) fn still_ours(&self, c: &Chan, gen: u32) -> bool {
        c.block(&self.seg).is_some_and(|b| {
            b.load64(C_STATE_GEN, Ordering::Acquire) == Some(state_gen(ACTIVE, gen))
        })
    }

    /// The cheap check of every send: the owner has not closed the
    /// endpoint (it clears the pid in its header).
    pub(super) fn alive_now(&self) -> bool {
        self.seg.load32(H_PID, Ordering::Relaxed) == Some(self.owner.0)
    }

    /// Whether the instance mapped still owns its segment and runs (not
    /// whoever holds the name now: `live::owner_runs`).
    pub(crate) fn alive(&self) -> bool {
        crate::live::owner_of(&self.seg) == Some(self.owner)
            && crate::live::owner_runs(&self.name, self.instance())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::atomic::Ordering::{Acquire, Release};

    use super::*;

    /// A peer record over a segment in memory with one channel, as
    /// `Peer::open` makes it for an unkeyed owner.
    fn peer() -> Peer {
        let g = Geometry::check(1, RING_MIN as u32).unwrap();
        let seg = Segment::anonymous(&vec![0u8; g.bytes()]).unwrap();
        Peer {
            name: "owner".into(),
            seg,
            g,
            chan: None,
            tail: 0,
            head_seen: 0,
            owner: (1, 1),
            serial: 1,
            bell: None,
            queue: VecDeque::new(),
            delivering: VecDeque::new(),
            pending: VecDeque::new(),
            answering: false,
            answering_id: 0,
            answering_seq: 0,
            ghosts: answers::Ghosts::default(),
            awaiting: None,
            refused: false,
            proves: None,
            spins: false,
        }
    }

    /// What the next claimer (process 8) writes in its claim, after the
    /// owner took the voided one's and freed the channel: each field a
    /// voided claimer's group of writes would cover.
    fn next_claim(s: &Segment, c: &Chan) -> u32 {
        let gen = c.begin_claim(s, 8).unwrap();
        assert!(s.store32(c.ctl(C_PID), 8, Release));
        assert!(s.store64(c.ctl(C_START), 88, Release));
        assert!(s.store64(c.ctl(C_SERIAL), 888, Release));
        assert!(s.store32(c.ctl(C_NAME_LEN), 4, Release));
        assert!(s.write(c.ctl(C_NAME), b"next"));
        c.publish(s, 0, K_FIRST | F_LAST);
        assert!(s.store32(c.ctl(C_PROVES), 1, Release));
        assert!(s.store32(c.ctl(C_TX_WAIT), 1, Release));
        assert!(s.store64(c.ctl(C_CMA_PROBE), 0x88, Release));
        gen
    }

    /// The owner voids the claim before each of the claimer's looks
    /// whether it is still its own — it takes the claim from the word it
    /// judged (`Chan::take`), frees it and another sender claims the
    /// channel: the voided claimer gives up at that look, writes nothing
    /// further into the channel (every field of the next claim stays as
    /// that claimer wrote it) and never activates it.
    #[test]
    fn a_claim_voided_before_a_look_writes_nothing_further() {
        let keys = EpKeys::single(None).unwrap();
        for k in 0..CLAIM_LOOKS {
            let mut p = peer();
            let mut next = None;
            let claimed = p.claim_with((7, 77, 777), "me", &keys, |at, s, c| {
                if at != k {
                    return;
                }
                let word = c.state_word(s).unwrap();
                assert_eq!(state_of(word), claiming(7));
                assert!(c.take(s, word));
                c.set_free(s);
                next = Some(next_claim(s, c));
            });
            assert!(!claimed, "voided before look {k}, it claimed");
            assert!(p.chan.is_none());
            let (s, c) = (&p.seg, Chan { g: p.g, i: 0 });
            let gen = next.unwrap();
            assert_eq!(c.state_word(s), Some(state_gen(claiming(8), gen)));
            assert_eq!(s.load32(c.ctl(C_PID), Acquire), Some(8));
            assert_eq!(s.load64(c.ctl(C_START), Acquire), Some(88));
            assert_eq!(s.load64(c.ctl(C_SERIAL), Acquire), Some(888));
            assert_eq!(s.load32(c.ctl(C_NAME_LEN), Acquire), Some(4));
            let mut name = [0u8; 4];
            assert!(s.read(c.ctl(C_NAME), &mut name));
            assert_eq!(&name, b"next");
            assert_eq!(c.published_at(s, 0), Some(true));
            assert_eq!(s.load32(c.ctl(C_PROVES), Acquire), Some(1));
            assert_eq!(s.load32(c.ctl(C_TX_WAIT), Acquire), Some(1));
            assert_eq!(s.load64(c.ctl(C_CMA_PROBE), Acquire), Some(0x88));
        }
    }

    /// Unvoided, the same claim finishes: active at its count, with its
    /// fields — the looks cost nothing but the loads.
    #[test]
    fn a_claim_left_alone_activates() {
        let keys = EpKeys::single(None).unwrap();
        let mut p = peer();
        let mut looks = 0;
        assert!(p.claim_with((7, 77, 777), "me", &keys, |_, _, _| looks += 1));
        assert_eq!(looks, CLAIM_LOOKS);
        let (c, gen) = p.chan.unwrap();
        let s = &p.seg;
        assert_eq!(c.state_word(s), Some(state_gen(ACTIVE, gen)));
        assert_eq!(s.load32(c.ctl(C_PID), Acquire), Some(7));
        assert_eq!(s.load64(c.ctl(C_SERIAL), Acquire), Some(777));
        assert_eq!(c.published_at(s, 0), Some(false));
    }
}
