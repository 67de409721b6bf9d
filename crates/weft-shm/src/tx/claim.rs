//! A peer mapped and a channel of its claimed: its segment checked at
//! the mapping, the claim made step by step while it stays ours
//! (`docs/design.md`, "The state word"), and whether the channel and
//! the peer still are what we took them for.

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;

use weft_core::{Error, Result};

use super::{answers, Peer};
use crate::claim_lock::ClaimLock;
use crate::keys::EpKeys;
use crate::layout::*;
use crate::ring::Chan;
use crate::segment::{FileId, Segment};

/// Whether we may write the memory of the owner `pid` of segment `seg`
/// (split copies): CMA is permitted outright here (Yama's
/// `ptrace_scope` 0 or no Yama: any process of this user may write any
/// other's memory already, so an offer forged in a segment by a third
/// process buys it nothing it could not do itself; under
/// `ptrace_scope` 1 it could make us write where it may not) and we can
/// read the probe word the header names. Reading and writing another
/// process's memory need the same right (`PTRACE_MODE_ATTACH`), so a
/// read that works says a write will; a seccomp filter allowing one call
/// only makes the write fail, and the owner then copies the part itself.
/// An owner that shares our memory is checked offer by offer
/// (`split::begin_write`).
fn can_write(seg: &Segment, pid: u32) -> bool {
    if crate::cma::mode() != crate::cma::Mode::Permitted || crate::split::split_min() == usize::MAX
    {
        return false;
    }
    let addr = seg.load64(H_CMA_PROBE, Ordering::Acquire).unwrap_or(0);
    addr != 0 && crate::cma::probe(pid, addr)
}

/// How many looks [`Peer::claim`] takes whether its claim is still ours,
/// its activation's swap the last: one before each group of its writes.
#[cfg(test)]
const CLAIM_LOOKS: usize = 5;

/// How many points [`Peer::claim_with`] runs its hook at: right after
/// the claim's swap, then before each look.
#[cfg(test)]
const CLAIM_HOOKS: usize = CLAIM_LOOKS + 1;

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
            Segment::open_id(&crate::name::seg_name(name), min, max).map_err(|e| match e {
                Error::NoEnt | Error::Inval => Error::ConnRefused,
                e => e,
            })?;
        // Pid 0: an owner closing (its pid cleared before its name goes).
        let owner = crate::live::owner_of(&seg)
            .filter(|o| o.0 != 0)
            .ok_or(Error::ConnRefused)?;
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
        // Whether the owner shares our memory must be known for certain
        // before we write it (`split::shares_memory`): if not, no splits.
        let (split_ok, mine) = match can_write(&seg, owner.0) {
            false => (false, false),
            true => match crate::split::shares_memory(owner.0) {
                Some(mine) => (true, mine),
                None => (false, false),
            },
        };
        Ok(Peer {
            bell: crate::bell::open_remote(name),
            spins,
            split_ok,
            mine,
            ..Peer::unclaimed(name.to_owned(), seg, file, g, owner, serial)
        })
    }

    /// The record of a peer mapped as `seg` (file `file`, geometry `g`),
    /// whose owner instance is `owner` and `serial`: no channel, nothing
    /// queued, no doorbell, not spinning.
    fn unclaimed(
        name: String,
        seg: Segment,
        file: FileId,
        g: Geometry,
        owner: (u32, u64),
        serial: u64,
    ) -> Peer {
        Peer {
            name,
            seg,
            file,
            g,
            chan: None,
            tail: 0,
            head_seen: 0,
            owner,
            serial,
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
            split_ok: false,
            mine: false,
            splits: 0,
            spins: false,
        }
    }

    /// Claims a free channel, if there is one, proving the key `keys`
    /// hold for [`proves`](Self::proves): true once one is ours, false
    /// when none could be had now (all taken, or a claim moved under
    /// us: the sends wait for the next try). An error ends the sends
    /// waiting for this peer (`fail_all`): its segment is gone from its
    /// name, or replaced (`ConnReset`, as for a peer found dead), or a
    /// claim lock cannot be taken here (a kernel or a seccomp filter
    /// refusing `F_OFD_SETLK`, a descriptor limit): no claim could ever
    /// be made, and the sends would wait forever.
    pub(super) fn claim(
        &mut self,
        me: crate::live::Instance,
        my_name: &str,
        keys: &EpKeys,
    ) -> Result<bool> {
        self.claim_with(me, my_name, keys, Peer::claim_fd, |_, _, _| {})
    }

    /// The segment opened again by name, for one claim's lock: the claim
    /// lock goes with the last reference to its open file description,
    /// so it is taken through a description nothing else holds — never
    /// mapped, closed once the claim is over — which a `fork` child
    /// shares only if forked during the claim itself (`claim_lock`).
    /// `ConnReset` when the name holds no segment or another file than
    /// the one mapped (the owner closed; a newer one took the name): no
    /// lock there says anything about our claim. Another file is told by
    /// its identity (`FileId`) and then by the owner instance its header
    /// names: device and inode alone can repeat on tmpfs. A name we may
    /// not open (`EACCES`/`EPERM`: another user's file under it now) is
    /// likewise no segment of our peer's. Out of descriptors (`MFile`,
    /// for the process's limit or the system's) is the claim's error.
    fn claim_fd(&self) -> Result<OwnedFd> {
        let gone = |why: &str| {
            tracing::debug!(peer = %self.name, why, "shm: peer segment gone from its name");
            Error::ConnReset
        };
        let seg = crate::name::seg_name(&self.name);
        let fd = Segment::open_fd(&seg).map_err(|e| match e {
            Error::NoEnt | Error::Inval => gone("no segment under the name"),
            // Refused: another user's file under the name, or ours with
            // our permission on it lost (that one is said as it is).
            Error::Access | Error::Perm => match Segment::id_by_name(&seg) {
                Ok(id) if id == self.file => {
                    tracing::warn!(peer = %self.name, error = ?e, "shm: the peer's segment may no longer be opened");
                    e
                }
                _ => gone("a file we may not open under the name"),
            },
            e => e,
        })?;
        if FileId::of_fd(&fd)? != self.file {
            return Err(gone("another file under the name"));
        }
        if header_owner(&fd) != Some(self.instance()) {
            return Err(gone("another owner in the file under the name"));
        }
        Ok(fd)
    }

    /// [`claim`](Self::claim), its locks taken through what `open` opens
    /// ([`claim_fd`](Self::claim_fd)), running `between(k, segment,
    /// channel)` at `k` = 0 right after the claim's swap, and at `k` = 1
    /// to `CLAIM_LOOKS` right before the (`k` − 1)th look whether the
    /// claim is still ours (the last its activation's swap): where a test
    /// voids the claim as an owner can, looks at its lock, or gives it a
    /// descriptor that cannot lock. A no-op otherwise.
    fn claim_with(
        &mut self,
        me: crate::live::Instance,
        my_name: &str,
        keys: &EpKeys,
        open: impl FnOnce(&Peer) -> Result<OwnedFd>,
        mut between: impl FnMut(usize, &Segment, &Chan),
    ) -> Result<bool> {
        if self.chan.is_some() {
            return Ok(true);
        }
        use Ordering::Release;
        // Opened at the first free channel, for every try of this call;
        // closed as it returns, after the lock is let go.
        let (mut open, mut opened) = (Some(open), None::<OwnedFd>);
        for i in 0..self.g.channels {
            let c = Chan { g: self.g, i };
            // A channel in use is passed over without a system call.
            if c.state(&self.seg) != Some(FREE) {
                continue;
            }
            if let Some(open) = open.take() {
                opened = Some(open(self)?);
            }
            let Some(fd) = &opened else {
                continue;
            };
            // The claim lock, before the claim's swap and held until its
            // last: while we hold it the owner never takes our claim for
            // a dead claimer's, whatever our pid says to it, so no group
            // of our writes lands in the next claimer's channel
            // (`docs/design.md`, "The state word"). Refused: another
            // claims this channel, as a failed swap. Failed: no claim
            // can be made without it, ever — an error, not a wait.
            let at = c.ctl(C_STATE_GEN) as u64;
            let Some(lock) = ClaimLock::try_take(fd.as_fd(), at)? else {
                continue;
            };
            let Some(gen) = c.begin_claim(&self.seg, me.0) else {
                continue;
            };
            let s = &self.seg;
            between(0, s, &c);
            s.store32(c.ctl(C_PID), me.0, Release);
            s.store64(c.ctl(C_START), me.1, Release);
            s.store64(c.ctl(C_SERIAL), me.2, Release);
            // Each group of writes only while the claim is still ours.
            // Our claim lock keeps the owner from voiding it; a claim
            // still moves under us if a broken sender frees the channel,
            // and then the next group must not land in another's.
            between(1, s, &c);
            if !c.still_claiming(s, me.0, gen) {
                return Ok(false);
            }
            s.store32(c.ctl(C_NAME_LEN), my_name.len() as u32, Release);
            s.write(c.ctl(C_NAME), my_name.as_bytes());
            between(2, s, &c);
            if !c.still_claiming(s, me.0, gen) {
                return Ok(false);
            }
            // Before `ACTIVE`: the receiver starts at position 0, whose
            // word must be 0 or a record of this claim's.
            c.clear_start(s);
            // A random source that failed (no nonce): the channel is
            // given straight back and the sends wait for the next try.
            let key = keys.key_for(self.proves);
            let Ok(proof) = crate::keyproof::prepare(s, &c, key, my_name, &self.name, gen) else {
                c.move_state(s, gen, claiming(me.0), CLOSED);
                return Ok(false);
            };
            // Checked after the proof's computation (a system call and a
            // MAC), right before its writes.
            between(3, s, &c);
            if !c.still_claiming(s, me.0, gen) {
                return Ok(false);
            }
            let awaiting = proof.write(s, &c);
            between(4, s, &c);
            if !c.still_claiming(s, me.0, gen) {
                return Ok(false);
            }
            // Waiting for the verdict: the owner rings us when it is in.
            s.store32(c.ctl(C_TX_WAIT), u32::from(awaiting.is_some()), Release);
            let probe = match crate::cma::mode() {
                crate::cma::Mode::Denied => 0,
                _ => crate::cma::probe_addr(),
            };
            s.store64(c.ctl(C_CMA_PROBE), probe, Release);
            between(5, s, &c);
            if !c.move_state(s, gen, claiming(me.0), ACTIVE) {
                // The claim moved under us (the owner took it, which it
                // does only once our lock is gone, or a broken sender
                // freed the channel): not ours to finish; the sends wait
                // for the next try.
                return Ok(false);
            }
            // Let go only after the claim's last swap: from here on the
            // channel is judged as an active one (`sender_alive`).
            drop(lock);
            self.awaiting = awaiting;
            self.chan = Some((c, gen));
            self.tail = 0;
            self.head_seen = 0;
            return Ok(true);
        }
        Ok(false)
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

/// The owner instance (`H_PID`, `H_START`, `H_SERIAL`) the header of
/// the segment file `fd` names, read through the descriptor
/// (`live::read_instance`): `None` when it cannot be read whole or is no
/// segment's header. Read without atomics, as the
/// claim's check of which file it opened, not of a word that moves: an
/// owner writes them before its segment takes its name, and clears
/// only its pid as it closes (then no claim is wanted there anyway).
fn header_owner(fd: &OwnedFd) -> Option<crate::live::Instance> {
    crate::live::read_instance(fd).ok().flatten()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::fs::File;
    use std::sync::atomic::Ordering::{Acquire, Release};

    use super::*;
    use crate::rx::{claim_held, judge, sweep_claim};
    use crate::test_files::Leftovers;

    /// A peer record over a segment file with `channels` channels under
    /// the peer's segment name, as `Peer::open` makes it for an unkeyed
    /// owner (the segment mapped, the file's identity noted), the owner's
    /// own descriptor of that file (as its `EpShared::held`: another
    /// open file description), and what removes the file.
    fn peer_and_owner_of(channels: u32) -> (Peer, File, Leftovers) {
        let g = Geometry::check(channels, RING_MIN as u32).unwrap();
        let name = format!("ct-{}", crate::name::unique());
        let mut gone = Leftovers::default();
        let path = gone.add(seg_path(&name));
        std::fs::write(&path, with_owner(g.bytes(), (1, 1, 1))).unwrap();
        let open = || File::options().read(true).write(true).open(&path).unwrap();
        let (mine, owner) = (open(), open());
        let seg = Segment::map_file(&mine, g.bytes()).unwrap();
        let p = Peer::unclaimed(name, seg, FileId::of_fd(&mine).unwrap(), g, (1, 1), 1);
        (p, owner, gone)
    }

    /// A segment file's bytes, `len` of them, its header a segment's
    /// (its magic) naming the owner instance `(pid, start, serial)` and
    /// nothing else.
    fn with_owner(len: usize, (pid, start, serial): crate::live::Instance) -> Vec<u8> {
        let mut b = vec![0u8; len];
        b[H_MAGIC..H_MAGIC + 8].copy_from_slice(&MAGIC.to_ne_bytes());
        b[H_PID..H_PID + 4].copy_from_slice(&pid.to_ne_bytes());
        b[H_START..H_START + 8].copy_from_slice(&start.to_ne_bytes());
        b[H_SERIAL..H_SERIAL + 8].copy_from_slice(&serial.to_ne_bytes());
        b
    }

    /// Where `name`'s segment file is.
    fn seg_path(name: &str) -> String {
        format!("{}{}", crate::name::SHM_DIR, crate::name::seg_name(name))
    }

    fn peer_and_owner() -> (Peer, File, Leftovers) {
        peer_and_owner_of(1)
    }

    /// The byte of channel `c`'s claim lock.
    fn lock_at(c: &Chan) -> u64 {
        c.ctl(C_STATE_GEN) as u64
    }

    /// `p.claim_with` as `claim` makes it, with the hook `between`.
    fn claim_hooked(
        p: &mut Peer,
        keys: &EpKeys,
        between: impl FnMut(usize, &Segment, &Chan),
    ) -> Result<bool> {
        p.claim_with((7, 77, 777), "me", keys, Peer::claim_fd, between)
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
    /// whether it is still its own (hook points 1 to `CLAIM_LOOKS`) — it
    /// takes the claim from the word it judged (`Chan::take`), frees it
    /// and another sender claims the channel: the voided claimer gives
    /// up at that look, writes nothing further into the channel (every
    /// field of the next claim stays as that claimer wrote it) and never
    /// activates it.
    #[test]
    fn a_claim_voided_before_a_look_writes_nothing_further() {
        let keys = EpKeys::single(None).unwrap();
        for k in 1..CLAIM_HOOKS {
            let (mut p, _owner, _gone) = peer_and_owner();
            let mut next = None;
            let claimed = claim_hooked(&mut p, &keys, |at, s, c| {
                if at != k {
                    return;
                }
                let word = c.state_word(s).unwrap();
                assert_eq!(state_of(word), claiming(7));
                assert!(c.take(s, word));
                c.set_free(s);
                next = Some(next_claim(s, c));
            })
            .unwrap();
            assert!(!claimed, "voided before look {}, it claimed", k - 1);
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
    /// fields; the hook runs once at each of its `CLAIM_HOOKS` points,
    /// and at every one — from right after the claim's swap to right
    /// before the activation's — the claim lock is held, as another
    /// description (the owner's) sees it; let go once active.
    #[test]
    fn a_claim_left_alone_activates_holding_its_lock_throughout() {
        let keys = EpKeys::single(None).unwrap();
        let (mut p, owner, _gone) = peer_and_owner();
        let mut looks = Vec::new();
        assert!(claim_hooked(&mut p, &keys, |at, _, c| {
            assert!(claim_held(owner.as_fd(), c).unwrap(), "not held at {at}");
            looks.push(at);
        })
        .unwrap());
        assert_eq!(looks, (0..CLAIM_HOOKS).collect::<Vec<_>>());
        let (c, gen) = p.chan.unwrap();
        let s = &p.seg;
        assert_eq!(c.state_word(s), Some(state_gen(ACTIVE, gen)));
        assert_eq!(s.load32(c.ctl(C_PID), Acquire), Some(7));
        assert_eq!(s.load64(c.ctl(C_SERIAL), Acquire), Some(777));
        assert_eq!(c.published_at(s, 0), Some(false));
        assert!(!claim_held(owner.as_fd(), &c).unwrap());
    }

    /// The owner's judgement of a claimer, as `rx::claimer_alive` makes
    /// it (`rx::judge`): the lock when it can be looked at, else
    /// `pid_says`.
    fn owner_judges(owner: &File, c: &Chan, pid_says: bool) -> bool {
        judge(claim_held(owner.as_fd(), c), || pid_says)
    }

    /// A live claimer in another pid namespace — its pid names nobody
    /// the owner can judge, so the owner's look by pid says dead — whose
    /// claim outlasts several sweep intervals at each hook point: it
    /// holds its claim lock, so the owner's sweeps (`sweep_claim` with
    /// the owner's liveness look) never take its claim; it activates,
    /// and lets the lock go (another description takes the byte at once).
    #[test]
    fn a_claimer_holding_its_lock_is_never_voided() {
        let keys = EpKeys::single(None).unwrap();
        for k in 0..CLAIM_HOOKS {
            let (mut p, owner, _gone) = peer_and_owner();
            let mut seen = None;
            let mut sweeps = 0;
            let claimed = claim_hooked(&mut p, &keys, |at, s, c| {
                if at != k {
                    return;
                }
                for _ in 0..4 {
                    let word = c.state_word(s).unwrap();
                    assert_eq!(state_of(word), claiming(7));
                    let alive = || owner_judges(&owner, c, false);
                    assert!(!sweep_claim(s, c, &mut seen, word, alive));
                    sweeps += 1;
                }
            })
            .unwrap();
            assert_eq!(sweeps, 4);
            assert!(claimed, "held through hook {k}, it was voided");
            let (c, gen) = p.chan.unwrap();
            assert_eq!(c.state_word(&p.seg), Some(state_gen(ACTIVE, gen)));
            // Let go after the activation: nobody holds it, and another
            // description (a next claimer's) can take it.
            assert!(!claim_held(owner.as_fd(), &c).unwrap());
            assert!(ClaimLock::try_take(owner.as_fd(), lock_at(&c))
                .unwrap()
                .is_some());
        }
    }

    /// A claimer that dies in its claim (the lock never let go by hand;
    /// the description it was taken through closed, as at its exit):
    /// while held, the claim is never taken, whatever its pid says;
    /// once gone, the next sweep takes it (the same word seen a sweep
    /// interval before) even though its pid still says alive (another
    /// process has it now) and the owner can free it.
    #[test]
    fn a_claim_whose_lock_went_with_its_claimer_is_taken() {
        let (p, owner, _gone) = peer_and_owner();
        let s = Segment::map_file(&owner, p.g.bytes()).unwrap();
        let c = Chan { g: p.g, i: 0 };
        let claimer = p.claim_fd().unwrap();
        let lock = ClaimLock::try_take(claimer.as_fd(), lock_at(&c))
            .unwrap()
            .unwrap();
        let gen = c.begin_claim(&p.seg, 7).unwrap();
        assert!(p.seg.store32(c.ctl(C_PID), 7, Release));
        let word = c.state_word(&s).unwrap();
        let mut seen = None;
        // Its pid judged dead: another namespace's, or gone.
        for _ in 0..4 {
            let alive = || owner_judges(&owner, &c, false);
            assert!(!sweep_claim(&s, &c, &mut seen, word, alive));
        }
        assert!(c.still_claiming(&s, 7, gen));
        // The claimer dies: its claim's description closes.
        std::mem::forget(lock);
        drop(claimer);
        assert!(!claim_held(owner.as_fd(), &c).unwrap());
        // Its pid reused: the lock look, which worked, decides.
        let alive = || owner_judges(&owner, &c, true);
        assert!(sweep_claim(&s, &c, &mut seen, word, alive));
        assert_eq!(c.state_word(&s), Some(state_gen(CLOSED, gen)));
        c.set_free(&s);
        assert_eq!(c.state_word(&s), Some(state_gen(FREE, gen)));
    }

    /// With two channels and channel 0's claim lock held by another
    /// description (another claimer between its lock and its swap),
    /// channel 0 is passed over as a failed swap — nothing written, the
    /// channel free — and channel 1 is claimed.
    #[test]
    fn a_channel_whose_lock_is_held_is_passed_over() {
        let keys = EpKeys::single(None).unwrap();
        let (mut p, other, _gone) = peer_and_owner_of(2);
        let (c0, c1) = (Chan { g: p.g, i: 0 }, Chan { g: p.g, i: 1 });
        let lock = ClaimLock::try_take(other.as_fd(), lock_at(&c0))
            .unwrap()
            .unwrap();
        assert!(p.claim((7, 77, 777), "me", &keys).unwrap());
        assert_eq!(p.chan.map(|(c, _)| c.i), Some(1));
        assert_eq!(c1.state(&p.seg), Some(ACTIVE));
        assert_eq!(c0.state_word(&p.seg), Some(state_gen(FREE, 0)));
        assert_eq!(p.seg.load32(c0.ctl(C_PID), Acquire), Some(0));
        drop(lock);
    }

    /// A claim lock that cannot be taken (here through a descriptor open
    /// only for reading: `EBADF` for a write lock; a kernel before Linux
    /// 3.15 or a seccomp filter likewise) is the claim's error — no
    /// channel touched — not a claim that waits for ever.
    #[test]
    fn a_claim_lock_that_fails_is_the_claims_error() {
        let keys = EpKeys::single(None).unwrap();
        let (mut p, _owner, _gone) = peer_and_owner();
        let path = seg_path(&p.name);
        let read_only = |_: &Peer| Ok(OwnedFd::from(File::open(&path).unwrap()));
        let r = p.claim_with((7, 77, 777), "me", &keys, read_only, |_, _, _| {});
        assert_eq!(r, Err(Error::BadF));
        assert!(p.chan.is_none());
        let c = Chan { g: p.g, i: 0 };
        assert_eq!(c.state_word(&p.seg), Some(state_gen(FREE, 0)));
    }

    /// The peer's segment gone from its name, or another file under it
    /// (its owner closed; a new one took the name): the claim fails
    /// `ConnReset`, no lock taken in the other file, no channel touched.
    #[test]
    fn a_claim_on_a_segment_gone_from_its_name_fails() {
        let keys = EpKeys::single(None).unwrap();
        let (mut p, _owner, _gone) = peer_and_owner();
        let path = seg_path(&p.name);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(p.claim((7, 77, 777), "me", &keys), Err(Error::ConnReset));
        std::fs::write(&path, with_owner(p.g.bytes(), p.instance())).unwrap();
        assert_eq!(p.claim((7, 77, 777), "me", &keys), Err(Error::ConnReset));
        let c = Chan { g: p.g, i: 0 };
        assert_eq!(c.state_word(&p.seg), Some(state_gen(FREE, 0)));
    }

    /// A queued send of `n` bytes, its completion's context `n`.
    fn queued(n: u64) -> crate::out::Out {
        crate::out::Out {
            flags: 0,
            tag: 0,
            data: 0,
            iov: weft_core::provider::Iov::new(),
            len: n as usize,
            off: 0,
            started: false,
            dc: false,
            cma: false,
            lead: None,
            done: Some(weft_core::completion::OpDone {
                context: n,
                flags: weft_core::flags::OpFlags::empty(),
                report: true,
                cq: None,
                cntr: None,
                waiter: None,
            }),
            fence: false,
            answer: None,
            proves: None,
            direct: None,
        }
    }

    /// A claim that fails with an error at a flush (here the peer's
    /// segment gone from its name) ends every send queued for that peer
    /// once, in order, `ConnReset` — none left waiting for a claim that
    /// cannot come, none ended twice (a later flush ends nothing).
    #[test]
    fn a_claim_that_fails_ends_each_queued_send_once() {
        let keys = EpKeys::single(None).unwrap();
        let (mut p, _owner, _gone) = peer_and_owner();
        p.queue.extend((1..=3).map(queued));
        std::fs::remove_file(seg_path(&p.name)).unwrap();
        let (mut seq, mut ended) = (0, crate::out::EndedList::new());
        p.flush((7, 77, 777), "me", &keys, &mut seq, &mut ended);
        let got: Vec<_> = ended
            .drain(..)
            .map(|(done, len, r)| (done.map(|d| d.context), len, r))
            .collect();
        let reset = Err(Error::ConnReset);
        assert_eq!(
            got,
            vec![
                (Some(1), 1, reset),
                (Some(2), 2, reset),
                (Some(3), 3, reset)
            ]
        );
        assert!(p.queue.is_empty() && p.chan.is_none());
        p.flush((7, 77, 777), "me", &keys, &mut seq, &mut ended);
        assert!(ended.is_empty());
        let c = Chan { g: p.g, i: 0 };
        assert_eq!(c.state_word(&p.seg), Some(state_gen(FREE, 0)));
    }

    /// The very file mapped, its header naming another owner instance
    /// than the peer record's (as a newer segment whose device and inode
    /// repeat the old one's would, on tmpfs): `ConnReset`, no channel
    /// touched; each of pid, start time and serial is checked.
    #[test]
    fn a_claim_on_a_file_naming_another_owner_fails() {
        let keys = EpKeys::single(None).unwrap();
        for field in [H_PID, H_START, H_SERIAL] {
            let (mut p, _owner, _gone) = peer_and_owner();
            if field == H_PID {
                assert!(p.seg.store32(field, 2, Release));
            } else {
                assert!(p.seg.store64(field, 2, Release));
            }
            assert_eq!(p.claim((7, 77, 777), "me", &keys), Err(Error::ConnReset));
            let c = Chan { g: p.g, i: 0 };
            assert_eq!(c.state_word(&p.seg), Some(state_gen(FREE, 0)));
        }
        let (p, _owner, _gone) = peer_and_owner();
        assert_eq!(header_owner(&p.claim_fd().unwrap()), Some((1, 1, 1)));
    }
}
