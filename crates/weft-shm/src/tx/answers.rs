//! Request ids and the answers that echo them (`docs/design.md`, "RMA:
//! executed at the target"; split from `tx`): which id a request takes,
//! which waiting operation an answer ends, and what a broken answer
//! channel strands.

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

impl Peer {
    /// A request id that no operation waiting for this peer holds, so an
    /// answer names exactly one ([`fresh_id`]), from the endpoint's
    /// sequence `next`.
    pub(super) fn new_id(&self, next: &mut u64) -> (u64, u32) {
        // The operation answering is mostly older than all waiting, but
        // not when a broken answer took it from their midst (`answered`).
        let answering = self.answering.then_some(self.answering_seq);
        let front = self.pending.front().map(|p| p.seq);
        let oldest = match (answering, front) {
            (Some(a), Some(f)) => Some(a.min(f)),
            (a, f) => a.or(f),
        };
        fresh_id(next, oldest, |id| {
            (self.answering && self.answering_id == id) || self.pending.iter().any(|p| p.id == id)
        })
    }

    /// The target instance our requests go to.
    fn instance(&self) -> Instance {
        (self.owner.0, self.owner.1, self.serial)
    }
}

impl Peers {
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
    /// `Ok(None)`: no operation waits for `id` (it failed already, or
    /// the id is not one we gave), or the answer comes from another
    /// instance than the one our requests to `addr` go to — one that had
    /// the name before (its channel, closed, is still drained) — whose
    /// ids mean nothing here: it must neither end an operation nor fail
    /// older ones. `Err`: we send nothing to `addr`.
    pub fn answered(
        &mut self,
        addr: &[u8],
        id: u64,
        by: Option<Instance>,
        well_formed: impl FnOnce(&crate::rma::Pending) -> bool,
    ) -> Result<Option<Answered>, ()> {
        let peer = self.map.get_mut(addr).ok_or(())?;
        if by != Some(peer.instance()) {
            return Ok(None);
        }
        let Some(at) = peer.pending.iter().position(|p| u64::from(p.id) == id) else {
            return Ok(None);
        };
        let (op, lost) = match peer.pending.get(at).map(well_formed) {
            Some(true) => {
                let lost = peer.pending.drain(..at).collect();
                (peer.pending.pop_front(), lost)
            }
            _ => (peer.pending.remove(at), Vec::new()),
        };
        let Some(op) = op else {
            return Ok(None);
        };
        peer.answering = true;
        peer.answering_id = op.id;
        peer.answering_seq = op.seq;
        Ok(Some(Answered { op, lost }))
    }

    /// The answer channel of the endpoint at `addr`, claimed by the
    /// instance `by`, was freed as broken (`rx::lifecycle::free`): the
    /// answers queued behind the bad record are gone, so its operations
    /// whose buffers the target cannot touch (their bytes travel in
    /// records) fail now (`FI_ECONNABORTED`); should the target answer
    /// one of them still, the answer's id finds nothing and is dropped.
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
}
