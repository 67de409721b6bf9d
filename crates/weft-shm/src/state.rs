//! A channel's state word (`C_STATE_GEN`, layout version 9): its state
//! and claim count in one 64-bit word. Every move a sender makes on a
//! claim of its own — finishing it, closing the channel, giving it back
//! — is one compare-and-swap from the state it expects *at its claim's
//! count*, so a sender whose channel the owner freed and another sender
//! claimed (at a later count) moves nothing: before, the state and the
//! count were two words, and a give-back could only compare the state,
//! closing the next claimer's channel when a free and a claim fell
//! between its check of the count and its swap (`docs/design.md`, "The
//! state word").

use std::sync::atomic::Ordering::Acquire;

use crate::layout::*;
use crate::ring::Chan;
use crate::segment::Segment;

impl Chan {
    /// The channel's state word (`None`: not inside the segment, which a
    /// checked geometry rules out).
    pub fn state_word(&self, seg: &Segment) -> Option<u64> {
        seg.load64(self.ctl(C_STATE_GEN), Acquire)
    }

    /// The channel's state (the word's low half).
    pub fn state(&self, seg: &Segment) -> Option<u32> {
        self.state_word(seg).map(state_of)
    }

    /// Sender: takes the channel if it is free, marking it claimed by
    /// process `pid` (`claiming`) at the count after the last claim's, in
    /// one compare-and-swap; the claim's count, or `None` (not free, or
    /// taken meanwhile). The count moves with the claim, so it is never
    /// seen before the claim is.
    pub fn begin_claim(&self, seg: &Segment, pid: u32) -> Option<u32> {
        let w = self.state_word(seg)?;
        if state_of(w) != FREE {
            return None;
        }
        let gen = gen_of(w).wrapping_add(1);
        let claimed = state_gen(claiming(pid), gen);
        seg.cas64(self.ctl(C_STATE_GEN), w, claimed).then_some(gen)
    }

    /// Sender: moves its claim `gen` from state `from` to `to`; false,
    /// nothing moved, when the word is not `from` at `gen` — the owner
    /// freed the channel (it took the sender for dead or broken), and the
    /// channel may be another's now.
    pub fn move_state(&self, seg: &Segment, gen: u32, from: u32, to: u32) -> bool {
        seg.cas64(
            self.ctl(C_STATE_GEN),
            state_gen(from, gen),
            state_gen(to, gen),
        )
    }

    /// Sender: hands its active claim `gen` back (`CLOSED`; the owner
    /// frees the channel once drained): at closing, after a refused key
    /// proof, or when its sweep finds a record of its unpublished
    /// (`Peer::drop_if_unpublished`). False when the channel is no longer
    /// that claim's.
    pub fn give_back(&self, seg: &Segment, gen: u32) -> bool {
        self.move_state(seg, gen, ACTIVE, CLOSED)
    }

    /// Sender: whether its claim `gen`, begun by process `pid`, is still
    /// being made — nobody moved it: not the owner (which since version
    /// 10 takes a claim only once its claimer's claim lock is gone, so
    /// never a live claimer's), not a broken sender freeing the channel.
    /// Checked before each group of the claim's writes: a claimer whose
    /// claim moved that goes on writing would overwrite the next
    /// claimer's fields (`docs/design.md`, "The state word").
    pub fn still_claiming(&self, seg: &Segment, pid: u32, gen: u32) -> bool {
        self.state_word(seg) == Some(state_gen(claiming(pid), gen))
    }

    /// Owner: takes the channel to free it, from the exact word `seen` it
    /// judged (a stale claim, or a state only a broken sender writes) to
    /// `CLOSED` at that word's count. False, nothing moved, when the word
    /// moved since: the claimer finished its claim (its channel is live),
    /// or the channel was claimed anew — left for the next pass. Only
    /// after a take does the owner reset the channel and free it: its
    /// resets would otherwise wipe a live sender's head and verdict.
    pub fn take(&self, seg: &Segment, seen: u64) -> bool {
        seg.cas64(self.ctl(C_STATE_GEN), seen, state_gen(CLOSED, gen_of(seen)))
    }

    /// Owner: frees the channel (`FREE`), keeping its count, in one
    /// atomic step: whatever the word held, the next claim counts on from
    /// it, and a sender's move on an earlier claim fails.
    pub fn set_free(&self, seg: &Segment) {
        seg.and64(self.ctl(C_STATE_GEN), !u64::from(u32::MAX));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn seg() -> (Segment, Chan) {
        let g = Geometry::check(2, RING_MIN as u32).unwrap();
        let seg = Segment::anonymous(&vec![0u8; g.bytes()]).unwrap();
        (seg, Chan { g, i: 1 })
    }

    /// A claim made and finished by process `pid`: its count.
    fn claim(seg: &Segment, c: &Chan, pid: u32) -> u32 {
        let gen = c.begin_claim(seg, pid).unwrap();
        assert!(c.move_state(seg, gen, claiming(pid), ACTIVE));
        gen
    }

    /// The stale-sender sweep's give-back, in the window it used to lose:
    /// after its re-check that the channel is still its own, the owner
    /// frees the channel and another sender claims it. The give-back
    /// compares the word at the stale claim's count, so it fails and the
    /// new claim stays active (with version 8's state-only swap, ACTIVE
    /// to CLOSED, it closed it and the new claimer failed its sends with
    /// `FI_ECONNABORTED`). The new claim's own give-back still works.
    #[test]
    fn a_give_back_leaves_a_claim_made_at_a_newer_count_alone() {
        let (seg, c) = seg();
        let old = claim(&seg, &c, 100);
        c.set_free(&seg);
        let new = claim(&seg, &c, 200);
        assert_eq!(new, old.wrapping_add(1));
        assert!(!c.give_back(&seg, old));
        assert_eq!(c.state_word(&seg), Some(state_gen(ACTIVE, new)));
        // Closed, freed and claimed a third time: neither earlier claim
        // moves it.
        assert!(c.give_back(&seg, new));
        c.set_free(&seg);
        let third = claim(&seg, &c, 300);
        assert!(!c.give_back(&seg, new));
        assert!(!c.give_back(&seg, old));
        assert_eq!(c.state(&seg), Some(ACTIVE));
        assert!(c.give_back(&seg, third));
        assert_eq!(c.state_word(&seg), Some(state_gen(CLOSED, third)));
    }

    /// The owner judged a claim stale (its claimer looked dead) while
    /// the claimer finished it: the owner's take, from the word it judged,
    /// fails and the channel stays active, as its sender left it. Likewise
    /// a channel seen free under us and claimed anew before the take; and
    /// a take from the word still there succeeds, voiding the claim.
    #[test]
    fn the_owner_takes_only_the_word_it_judged() {
        let (seg, c) = seg();
        let gen = c.begin_claim(&seg, 7).unwrap();
        let seen = c.state_word(&seg).unwrap();
        assert!(c.still_claiming(&seg, 7, gen));
        // The claimer activates between the owner's load and its take.
        assert!(c.move_state(&seg, gen, claiming(7), ACTIVE));
        assert!(!c.take(&seg, seen));
        assert_eq!(c.state_word(&seg), Some(state_gen(ACTIVE, gen)));
        // A channel freed under us (a broken sender), then claimed anew
        // after the pass's load: the take from FREE fails.
        assert!(c.give_back(&seg, gen));
        c.set_free(&seg);
        let seen = c.state_word(&seg).unwrap();
        assert_eq!(seen, state_gen(FREE, gen));
        let next = c.begin_claim(&seg, 8).unwrap();
        assert!(!c.take(&seg, seen));
        assert_eq!(c.state_word(&seg), Some(state_gen(claiming(8), next)));
        // The word unchanged: taken, and the claim is void for its maker.
        let seen = c.state_word(&seg).unwrap();
        assert!(c.take(&seg, seen));
        assert_eq!(c.state_word(&seg), Some(state_gen(CLOSED, next)));
        assert!(!c.still_claiming(&seg, 8, next));
        assert!(!c.move_state(&seg, next, claiming(8), ACTIVE));
        c.set_free(&seg);
        assert_eq!(c.state_word(&seg), Some(state_gen(FREE, next)));
    }

    /// A claim takes only a free channel and counts on from its last
    /// claim (through the count's wrap); a claim the owner freed while it
    /// was being made cannot go active afterwards.
    #[test]
    fn claims_count_and_a_freed_claim_stays_freed() {
        let (seg, c) = seg();
        let gen = c.begin_claim(&seg, 7).unwrap();
        assert_eq!(gen, 1, "a new segment's count is 0");
        assert_eq!(c.state(&seg), Some(claiming(7)));
        assert_eq!(c.begin_claim(&seg, 8), None, "taken");
        // The owner took the claimer for dead.
        c.set_free(&seg);
        assert!(!c.move_state(&seg, gen, claiming(7), ACTIVE));
        assert_eq!(c.state_word(&seg), Some(state_gen(FREE, gen)));
        assert_eq!(claim(&seg, &c, 8), 2);
        // The count wraps; the word's halves stay apart.
        let w = state_gen(FREE, u32::MAX);
        assert!(seg.store64(c.ctl(C_STATE_GEN), w, std::sync::atomic::Ordering::Release));
        assert_eq!(c.begin_claim(&seg, 9), Some(0));
        assert_eq!(c.state_word(&seg), Some(state_gen(claiming(9), 0)));
        // Whatever a broken sender wrote, a free keeps its count.
        let w = state_gen(0x1234_5678, 41);
        assert!(seg.store64(c.ctl(C_STATE_GEN), w, std::sync::atomic::Ordering::Release));
        c.set_free(&seg);
        assert_eq!(c.state_word(&seg), Some(state_gen(FREE, 41)));
    }
}
