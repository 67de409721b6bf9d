//! A peer mapped and a channel of its claimed: its segment checked at
//! the mapping, the claim made step by step while it stays ours
//! (`docs/design.md`, "The state word"), and whether the channel and
//! the peer still are what we took them for.

use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;

use weft_core::{Error, Result};

use super::{answers, Peer};
use crate::claim_lock::ClaimLock;
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
        let (mut seg, file) =
            Segment::open_held(&crate::name::seg_name(name), min, max).map_err(|e| match e {
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
            file,
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
            // A channel in use is passed over without a system call.
            if c.state(&self.seg) != Some(FREE) {
                continue;
            }
            // The claim lock, before the claim's swap and held until its
            // last: while we hold it the owner never takes our claim for
            // a dead claimer's, whatever our pid says to it, so no group
            // of our writes lands in the next claimer's channel
            // (`docs/design.md`, "The state word"). Refused: another
            // claims this channel, as a failed swap.
            let at = c.ctl(C_STATE_GEN) as u64;
            let lock = match ClaimLock::try_take(self.file.as_fd(), at) {
                Ok(Some(lock)) => lock,
                Ok(None) => continue,
                Err(e) => {
                    // No claim without its lock (a kernel without
                    // `F_OFD_*` locks, before Linux 3.15): the sends wait.
                    static ONCE: std::sync::Once = std::sync::Once::new();
                    ONCE.call_once(|| {
                        tracing::warn!(error = ?e, peer = %self.name, "shm: cannot take a claim lock");
                    });
                    return false;
                }
            };
            let Some(gen) = c.begin_claim(&self.seg, me.0) else {
                continue;
            };
            let s = &self.seg;
            s.store32(c.ctl(C_PID), me.0, Release);
            s.store64(c.ctl(C_START), me.1, Release);
            s.store64(c.ctl(C_SERIAL), me.2, Release);
            // Each group of writes only while the claim is still ours.
            // Our claim lock keeps the owner from voiding it; a claim
            // still moves under us if a broken sender frees the channel,
            // and then the next group must not land in another's.
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
                // The claim moved under us (the owner took it, which it
                // does only once our lock is gone, or a broken sender
                // freed the channel): not ours to finish; the sends wait
                // for the next try.
                return false;
            }
            // Let go only after the claim's last swap: from here on the
            // channel is judged as an active one (`sender_alive`).
            drop(lock);
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
    use std::fs::File;
    use std::sync::atomic::Ordering::{Acquire, Release};

    use super::*;
    use crate::rx::{claim_held, sweep_claim};

    /// A peer record over a segment file with one channel, as
    /// `Peer::open` makes it for an unkeyed owner (the segment mapped
    /// through the descriptor it keeps), and the owner's own descriptor
    /// of that file (as its `EpShared::held`): another open file
    /// description. The file's name is gone at once.
    fn peer_and_owner() -> (Peer, File) {
        let g = Geometry::check(1, RING_MIN as u32).unwrap();
        let mut gone = crate::test_files::Leftovers::default();
        let path = gone.add(
            std::path::Path::new(crate::name::SHM_DIR)
                .join(format!("weft-claim-test-{}", crate::name::unique())),
        );
        std::fs::write(&path, vec![0u8; g.bytes()]).unwrap();
        let open = || File::options().read(true).write(true).open(&path).unwrap();
        let (mine, owner) = (open(), open());
        let seg = Segment::map_file(&mine, g.bytes()).unwrap();
        let p = Peer {
            name: "owner".into(),
            seg,
            file: mine.into(),
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
        };
        (p, owner)
    }

    fn peer() -> Peer {
        peer_and_owner().0
    }

    /// The byte of channel `c`'s claim lock.
    fn lock_at(c: &Chan) -> u64 {
        c.ctl(C_STATE_GEN) as u64
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
    /// fields; the hook runs once at each of its `CLAIM_LOOKS` looks.
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

    /// A live claimer in another pid namespace — its pid names nobody
    /// the owner can judge, so the owner's look by pid says dead — whose
    /// claim outlasts several sweep intervals at each of its looks: it
    /// holds its claim lock, so the owner's sweeps (`sweep_claim` with
    /// the owner's liveness look, the lock through its own descriptor
    /// first) never take its claim; it activates, and lets the lock go
    /// (another description takes the byte at once).
    #[test]
    fn a_claimer_holding_its_lock_is_never_voided() {
        let keys = EpKeys::single(None).unwrap();
        for k in 0..CLAIM_LOOKS {
            let (mut p, owner) = peer_and_owner();
            let mut seen = None;
            let mut sweeps = 0;
            let claimed = p.claim_with((7, 77, 777), "me", &keys, |at, s, c| {
                if at != k {
                    return;
                }
                for _ in 0..4 {
                    let word = c.state_word(s).unwrap();
                    assert_eq!(state_of(word), claiming(7));
                    let pid_says_alive = || false;
                    let alive = || claim_held(owner.as_fd(), c) || pid_says_alive();
                    assert!(!sweep_claim(s, c, &mut seen, word, alive));
                    sweeps += 1;
                }
            });
            assert_eq!(sweeps, 4);
            assert!(claimed, "held through look {k}, it was voided");
            let (c, gen) = p.chan.unwrap();
            assert_eq!(c.state_word(&p.seg), Some(state_gen(ACTIVE, gen)));
            // Let go after the activation: nobody holds it, and another
            // description (a next claimer's) can take it.
            assert!(!claim_held(owner.as_fd(), &c));
            assert!(ClaimLock::try_take(owner.as_fd(), lock_at(&c))
                .unwrap()
                .is_some());
        }
    }

    /// A claimer that dies in its claim (the lock never let go by hand;
    /// its descriptors closed and its mapping gone, as at its exit — the
    /// mapping too holds the open file description, and with it the
    /// lock): while held, the claim is never taken, whatever its pid
    /// says; once gone, the next sweep takes it (the same word seen a
    /// sweep interval before) and the owner can free it.
    #[test]
    fn a_claim_whose_lock_went_with_its_claimer_is_taken() {
        let (p, owner) = peer_and_owner();
        let s = Segment::map_file(&owner, p.g.bytes()).unwrap();
        let c = Chan { g: p.g, i: 0 };
        let lock = ClaimLock::try_take(p.file.as_fd(), lock_at(&c))
            .unwrap()
            .unwrap();
        let gen = c.begin_claim(&p.seg, 7).unwrap();
        assert!(p.seg.store32(c.ctl(C_PID), 7, Release));
        let word = c.state_word(&s).unwrap();
        let mut seen = None;
        // Its pid judged dead: another namespace's, or gone.
        let pid_says_alive = || false;
        let alive = || claim_held(owner.as_fd(), &c) || pid_says_alive();
        for _ in 0..4 {
            assert!(!sweep_claim(&s, &c, &mut seen, word, alive));
        }
        assert!(c.still_claiming(&s, 7, gen));
        // The claimer dies: its descriptor closes, its mapping goes.
        std::mem::forget(lock);
        drop(p);
        assert!(!claim_held(owner.as_fd(), &c));
        assert!(sweep_claim(&s, &c, &mut seen, word, alive));
        assert_eq!(c.state_word(&s), Some(state_gen(CLOSED, gen)));
        c.set_free(&s);
        assert_eq!(c.state_word(&s), Some(state_gen(FREE, gen)));
    }

    /// A channel whose claim lock another description holds (another
    /// claimer between its lock and its swap) is passed over as a failed
    /// swap: nothing written, the channel free; once let go, the claim
    /// goes through.
    #[test]
    fn a_channel_whose_lock_is_held_is_passed_over() {
        let keys = EpKeys::single(None).unwrap();
        let (mut p, other) = peer_and_owner();
        let c = Chan { g: p.g, i: 0 };
        let lock = ClaimLock::try_take(other.as_fd(), lock_at(&c))
            .unwrap()
            .unwrap();
        assert!(!p.claim((7, 77, 777), "me", &keys));
        assert_eq!(c.state_word(&p.seg), Some(state_gen(FREE, 0)));
        assert_eq!(p.seg.load32(c.ctl(C_PID), Acquire), Some(0));
        drop(lock);
        assert!(p.claim((7, 77, 777), "me", &keys));
        assert_eq!(c.state(&p.seg), Some(ACTIVE));
    }
}
