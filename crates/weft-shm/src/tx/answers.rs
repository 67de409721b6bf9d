//! Request ids and the answers that echo them (`docs/design.md`, "RMA:
//! executed at the target"; split from `tx`): which id a request takes,
//! which waiting operation an answer ends, and what a broken answer
//! channel strands.

use std::collections::VecDeque;

use super::{Peer, Peers};
use crate::layout::ID_MAX;
use crate::live::Instance;

/// An answer's operation, found by its request's id
/// ([`Peers::answered`]).
#[derive(Debug)]
pub struct Answered {
    pub op: crate::rma::Pending,
    /// Operations sent to the same peer before it that still waited. A
    /// target takes one initiator's requests in order (they come on one
    /// channel, and ours to it is never replaced while any waits: a
    /// freed one fails them all) and answers each only once done with
    /// its bytes, in that order; so having answered a later request, it
    /// is done with these, and their answers were lost (queued behind a
    /// record that broke, on a channel freed for it). They fail
    /// (`FI_ECONNABORTED`), direct ones handing their buffers back: the
    /// target writes them no more. Empty when the answer itself does not
    /// fit its operation: a broken answer proves nothing of the others.
    pub lost: Vec<crate::rma::Pending>,
}

/// Ids a request may take: `ID_MAX + 1`, the wire's id bits.
const IDS: u64 = ID_MAX as u64 + 1;

/// The most ghosts a peer keeps (`Peers::strand`): with at most
/// `tx_attr.size` operations waiting, far fewer ids are held than there
/// are, so `fresh_id` finds a free one within that many steps. Only a
/// target that breaks its answer channel again and again without ever
/// answering reaches it; the oldest ghosts are then forgotten, and their
/// ids may be given again (`docs/design.md`, still open).
const GHOSTS_MAX: usize = 1 << 16;

/// The sequence number and id of a new request: the next of `next` (the
/// endpoint's sequence, advanced past it) whose id (its low bits) no
/// operation waiting for the peer holds. `oldest` is the sequence number
/// of the oldest one waiting there, `held` says whether an id is taken.
///
/// A peer's requests take ascending sequence numbers, so every one
/// waiting lies in `oldest..next`; while that span is shorter than the
/// ids there are, no two numbers in it share an id and the next is free
/// — found without looking at the waiting ones. Only an operation that
/// outwaited a million later requests (a direct one whose target never
/// answers, while ring ones around it are stranded) makes the span
/// longer: then the waiting ones are looked through, and a held id
/// passed over. At most `tx_attr.size` (1024) operations wait, so one is
/// free within that many steps.
pub(super) fn fresh_id(
    next: &mut u64,
    oldest: Option<u64>,
    held: impl Fn(u32) -> bool,
) -> (u64, u32) {
    let id_of = |s: u64| (s % IDS) as u32;
    let mut seq = *next;
    if oldest.is_some_and(|o| seq.wrapping_sub(o) >= IDS) {
        while held(id_of(seq)) {
            seq = seq.wrapping_add(1);
        }
    }
    *next = seq.wrapping_add(1);
    (seq, id_of(seq))
}

/// A peer's stranded requests, oldest first, as (sequence number, id):
/// their operations failed (`Peers::strand`), but the target may not
/// have read them yet, and would answer them late. Their ids count as
/// held, and the oldest as waiting, for [`fresh_id`] — else a new
/// request could take one after a round of ids sent elsewhere, and the
/// late answer end it (and, being a later answer, fail the direct ones
/// before it while the target still writes their buffers). A ghost ends
/// nothing: an answer with its id is dropped.
#[derive(Debug, Default)]
pub(super) struct Ghosts(VecDeque<(u64, u32)>);

impl Ghosts {
    /// A request that failed stranded, after every ghost kept (its
    /// sequence number is above theirs: those stranded before it left
    /// `pending` then, and it came after).
    pub(super) fn strand(&mut self, seq: u64, id: u32) {
        self.0.push_back((seq, id));
        let over = self.0.len().saturating_sub(GHOSTS_MAX);
        self.0.drain(..over);
    }

    /// An answer carrying `id` arrived: whether it is a ghost's. The
    /// target answers in order, so it is done with that request and
    /// every earlier one: their ghosts go.
    pub(super) fn answer(&mut self, id: u64) -> bool {
        let Some(at) = self.0.iter().position(|g| u64::from(g.1) == id) else {
            return false;
        };
        self.0.drain(..=at);
        true
    }

    /// The request numbered `seq` was answered (well formed): no answer
    /// comes to one before it any more.
    pub(super) fn passed(&mut self, seq: u64) {
        while self.0.front().is_some_and(|g| g.0 < seq) {
            self.0.pop_front();
        }
    }

    pub(super) fn oldest(&self) -> Option<u64> {
        self.0.front().map(|g| g.0)
    }

    pub(super) fn holds(&self, id: u32) -> bool {
        self.0.iter().any(|g| g.1 == id)
    }
}

impl Peer {
    /// A request id that no operation waiting for this peer holds, so an
    /// answer names exactly one ([`fresh_id`]), from the endpoint's
    /// sequence `next`.
    pub(super) fn new_id(&self, next: &mut u64) -> (u64, u32) {
        // The operation answering is mostly older than all waiting, but
        // not when a broken answer took it from their midst (`answered`);
        // a ghost may be older than both.
        let answering = self.answering.then_some(self.answering_seq);
        let front = self.pending.front().map(|p| p.seq);
        let ghost = self.ghosts.oldest();
        let oldest = [answering, front, ghost].into_iter().flatten().min();
        fresh_id(next, oldest, |id| {
            (self.answering && self.answering_id == id)
                || self.pending.iter().any(|p| p.id == id)
                || self.ghosts.holds(id)
        })
    }

    /// The target instance our requests go to.
    pub(crate) fn instance(&self) -> Instance {
        (self.owner.0, self.owner.1, self.serial)
    }
}

impl Peers {
    /// Whether `by`, the claimer of an answer channel under the name of
    /// `addr`, for which we keep no record, is an instance gone from that
    /// name: the name's segment file does not name it (another instance
    /// holds the name, or nobody: `by` closed, its file unlinked, though
    /// its process may run on — the common case), or it names it and `by`
    /// no longer runs (it crashed). Its answers, queued before it left,
    /// still drain: they are dropped. A record for it, and what waited
    /// there, went when it left (a send found its header's pid cleared,
    /// or the sweep did), so they end nothing; freeing the channel
    /// instead would lose the messages queued behind them. Only the
    /// running instance whose segment file holds the name, to whom we
    /// sent nothing, answers what we never asked: that breaks the rules.
    /// When unsure (the file cannot be read, its lock not tested), the
    /// answer is dropped: a dropped answer that nothing waits for is
    /// harmless, a wrongly broken channel is not.
    ///
    /// Up to a handful of syscalls, on this rare path only, outside the
    /// peers' lock: once per answer a gone instance had queued (a bounded
    /// number: it sends no more), not once per claim — whether the
    /// claimer is gone can change during a claim (it closes), so a value
    /// taken at the claim would be stale.
    pub fn gone_from_name(addr: &[u8], by: Option<Instance>) -> bool {
        let (Some(by), Ok(name)) = (by, crate::name::parse(addr)) else {
            return false;
        };
        crate::live::instance_of_name(name) != Some(by)
            || (!crate::live::alive(by.0, by.1)
                && crate::live::held_by(name, by) != crate::live::Held::Yes)
    }

    /// The RMA operation sent to the endpoint at `addr` whose request
    /// carried `id`, its answer now arriving on a channel claimed by the
    /// instance `by`, and those sent there before it that still wait
    /// (their answers were lost: see [`Answered`]) if the answer is
    /// `well_formed` for it. Under the same lock the peer is marked
    /// answering, so that a fence never sees the operation neither
    /// pending nor answering before it completes (a fenced send slipped
    /// through there and completed first). The caller clears the mark
    /// with [`set_answering`](Self::set_answering) once the operation
    /// has completed or failed.
    ///
    /// `Ok(None)`: no operation waits for `id` (it failed already — a
    /// ghost's answer —, or the id is not one we gave), or the answer
    /// comes from another instance than the one our requests to `addr`
    /// go to — one that had the name before (its channel, closed, is
    /// still drained) — whose ids mean nothing here: it must neither end
    /// an operation nor fail older ones. `Err`: we keep no record for
    /// `addr` at all; the caller asks [`gone_from_name`](Self::gone_from_name)
    /// — outside the lock: it reads the segment file — whether to drop
    /// the answer or break the channel.
    pub fn answered(
        &mut self,
        addr: &[u8],
        id: u64,
        by: Option<Instance>,
        well_formed: impl FnOnce(&crate::rma::Pending) -> bool,
    ) -> Result<Option<Answered>, ()> {
        let Some(peer) = self.map.get_mut(addr) else {
            return Err(());
        };
        if by != Some(peer.instance()) {
            return Ok(None);
        }
        if peer.ghosts.answer(id) {
            return Ok(None);
        }
        let Some(at) = peer.pending.iter().position(|p| u64::from(p.id) == id) else {
            return Ok(None);
        };
        let fits = peer.pending.get(at).is_some_and(well_formed);
        let (op, lost) = if fits {
            let lost = peer.pending.drain(..at).collect();
            (peer.pending.pop_front(), lost)
        } else {
            (peer.pending.remove(at), Vec::new())
        };
        let Some(op) = op else {
            return Ok(None);
        };
        if fits {
            // A broken answer proves nothing, and keeps them.
            peer.ghosts.passed(op.seq);
        }
        peer.answering = true;
        peer.answering_id = op.id;
        peer.answering_seq = op.seq;
        Ok(Some(Answered { op, lost }))
    }

    /// The answer channel of the endpoint at `addr`, claimed by the
    /// instance `by`, was freed as broken (`rx::lifecycle::free`): the
    /// answers queued behind the bad record are gone, so its operations
    /// whose buffers the target cannot touch (their bytes travel in
    /// records) fail now (`FI_ECONNABORTED`). Their ids stay taken as
    /// [`Ghosts`]: should the target answer one of them still, the answer
    /// finds its ghost and is dropped, and no new request had its id.
    /// Direct operations stay: the target may not have read their
    /// request yet, and would then still move bytes from or into their
    /// buffers; they end by their own answer, by the answer to a later
    /// request ([`answered`](Self::answered)), or as the target dies or
    /// the endpoint closes, each of which leaves their buffers safe. A
    /// channel of another instance than our requests' target strands
    /// nothing: no answer of ours was on it.
    pub fn strand(&mut self, addr: &[u8], by: Option<Instance>) -> Vec<crate::rma::Pending> {
        let Some(peer) = self.map.get_mut(addr) else {
            return Vec::new();
        };
        if by != Some(peer.instance()) {
            return Vec::new();
        }
        let mut ring = Vec::new();
        for p in std::mem::take(&mut peer.pending) {
            if p.direct.is_some() {
                peer.pending.push_back(p);
            } else {
                peer.ghosts.strand(p.seq, p.id);
                ring.push(p);
            }
        }
        ring
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids follow the sequence and wrap with it.
    #[test]
    fn ids_wrap() {
        let mut next = IDS - 2;
        assert_eq!(fresh_id(&mut next, None, |_| true), (IDS - 2, ID_MAX - 1));
        assert_eq!(
            fresh_id(&mut next, Some(IDS - 2), |_| true),
            (IDS - 1, ID_MAX)
        );
        // Across the wrap, the span from the oldest waiting is short:
        // no look at what is held.
        assert_eq!(fresh_id(&mut next, Some(IDS - 2), |_| true), (IDS, 0));
        assert_eq!(next, IDS + 1);
        let mut next = u64::MAX;
        assert_eq!(
            fresh_id(&mut next, Some(u64::MAX - 5), |_| false).1,
            (u64::MAX % IDS) as u32
        );
        assert_eq!(next, 0);
    }

    /// An operation that waited a whole round of ids: its id, and those
    /// after it still held, are passed over.
    #[test]
    fn held_ids_skipped() {
        let oldest = 7;
        let held = [7u32, 8, 10];
        let mut next = oldest + IDS;
        let (seq, id) = fresh_id(&mut next, Some(oldest), |i| held.contains(&i));
        assert_eq!((seq, id), (oldest + IDS + 2, 9));
        assert_eq!(next, seq + 1);
        let (_, id) = fresh_id(&mut next, Some(oldest), |i| held.contains(&i));
        assert_eq!(id, 11);
    }

    /// A stranded request's id is not given again, however many requests
    /// went elsewhere, until the target answered it: its late answer
    /// finds the ghost, not a new operation.
    #[test]
    fn ghost_id_not_reused() {
        let mut ghosts = Ghosts::default();
        ghosts.strand(5, 5);
        ghosts.strand(6, 6);
        // A round of ids later, with nothing else waiting for the peer.
        let mut next = 5 + IDS;
        let (seq, id) = fresh_id(&mut next, ghosts.oldest(), |i| ghosts.holds(i));
        assert_eq!((seq, id), (7 + IDS, 7));
        // The late answer to the first: dropped, its ghost gone, the
        // second's still held.
        assert!(ghosts.answer(5));
        assert!(!ghosts.holds(5));
        assert!(ghosts.holds(6));
        assert_eq!(ghosts.oldest(), Some(6));
        // An id no ghost holds is no ghost's answer.
        assert!(!ghosts.answer(7));
        assert!(ghosts.holds(6));
    }

    /// An answer to a ghost ends the ghosts before it (answers come in
    /// order); an answer to a later request ends all before that.
    #[test]
    fn ghosts_pass() {
        let mut ghosts = Ghosts::default();
        for s in [3u64, 4, 9, 12] {
            ghosts.strand(s, s as u32);
        }
        assert!(ghosts.answer(4));
        assert_eq!(ghosts.oldest(), Some(9));
        assert!(!ghosts.holds(3));
        ghosts.passed(10);
        assert_eq!(ghosts.oldest(), Some(12));
        ghosts.passed(12);
        assert_eq!(ghosts.oldest(), Some(12));
        ghosts.passed(13);
        assert_eq!(ghosts.oldest(), None);
        let mut next = 13 + IDS;
        assert_eq!(fresh_id(&mut next, ghosts.oldest(), |_| true).1, 13);
    }

    /// Ghosts are bounded: the oldest are forgotten past the cap, so the
    /// held ids stay far fewer than the ids there are.
    #[test]
    fn ghosts_bounded() {
        let mut ghosts = Ghosts::default();
        let n = GHOSTS_MAX as u64 + 3;
        for s in 0..n {
            ghosts.strand(s, (s % IDS) as u32);
        }
        assert_eq!(ghosts.oldest(), Some(3));
        assert!(!ghosts.holds(2));
        assert!(ghosts.holds(3));
    }
}
