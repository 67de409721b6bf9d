//! The peer's queue driven: queued operations begun and written in
//! order (a fence waits for what is outstanding), a channel lost under
//! us given up, and what waits failed.

use std::sync::atomic::{fence, Ordering};

use weft_core::Error;

use super::{EndedList, Out, Peer};
use crate::keys::EpKeys;
use crate::layout::*;

impl Peer {
    /// Whether sends wait here (queued, or for delivery).
    pub(crate) fn busy(&self) -> bool {
        !self.queue.is_empty() || !self.delivering.is_empty() || !self.pending.is_empty()
    }

    /// Whether an operation to this peer has begun and not completed.
    pub(super) fn outstanding(&self) -> bool {
        !self.delivering.is_empty() || !self.pending.is_empty() || self.answering
    }

    /// `o` begins: its answer is waited for from now. An RMA request
    /// with a direct form goes direct if the owner read our probe: its
    /// lead is the direct one, nothing follows it, and its buffers stay
    /// exposed in the operation until the answer. The request takes its
    /// id here, in the order requests enter the ring, from the
    /// endpoint's sequence `seq` (`Peers::next_seq`).
    pub(super) fn begin(&mut self, o: &mut Out, seq: &mut u64) {
        if let Some(mut p) = o.answer.take() {
            if let Some(d) = o.direct.take() {
                if self.direct_ready() && self.cma_pays() {
                    o.lead = Some(d);
                    o.len = 0;
                    p.go_direct(std::mem::take(&mut o.iov));
                }
            }
            (p.seq, p.id) = self.new_id(seq);
            if let Some(l) = o.lead.as_deref_mut() {
                l.word = (l.word & !ID_MASK) | (p.id << ID_SHIFT);
            }
            self.pending.push_back(*p);
        }
    }

    /// Whether the owner accepted our claim and can read our memory.
    fn direct_ready(&self) -> bool {
        self.awaiting.is_none()
            && self.chan.is_some_and(|(c, _)| {
                self.seg.load32(c.ctl(C_CMA), Ordering::Acquire) == Some(CMA_OK)
            })
    }

    /// Sends queued sends while the ring takes them.
    pub(crate) fn flush(
        &mut self,
        me: crate::live::Instance,
        my_name: &str,
        keys: &EpKeys,
        seq: &mut u64,
        ended: &mut EndedList,
    ) {
        if let Some((c, gen)) = self.chan {
            // The owner freed our channel (it found a record of ours
            // broken, or a CMA read of our memory failed): what waits
            // for its head or its answers never comes.
            if !self.still_ours(&c, gen) {
                self.chan = None;
                self.fail_all(Error::ConnAborted, ended);
                return;
            }
        }
        self.delivered(ended);
        if self.queue.is_empty() {
            return;
        }
        match self.claim(me, my_name, keys) {
            Ok(true) => {}
            Ok(false) => return,
            // No claim can be made: what waits would wait forever.
            Err(e) => {
                self.fail_all(e, ended);
                return;
            }
        }
        while let Some(mut o) = self.queue.pop_front() {
            if o.fence {
                if self.outstanding() {
                    self.queue.push_front(o);
                    return;
                }
                o.fence = false;
            }
            self.begin(&mut o, seq);
            match self.advance(&mut o) {
                Ok(true) => self.written(o, ended),
                Ok(false) => {
                    self.queue.push_front(o);
                    return;
                }
                Err(e) => {
                    ended.push((o.done, o.len, Err(e)));
                    self.fail_all(e, ended);
                    return;
                }
            }
        }
    }

    /// Gives up a channel a record of ours was unpublished in under us,
    /// failing what waits (`FI_ECONNABORTED`, as when the owner frees a
    /// channel it finds broken); true if it did. Called by the sweep,
    /// off the message path, under the peers lock. The crux: every write
    /// of ours to the ring (records, pads, the 0 after each) happens under
    /// that same lock, so none is half done while we look. Every record
    /// from the owner's head to our tail is ours and published, and the 0
    /// we store after a record lands only at our tail; the one other 0 of
    /// ours is the one at ring offset 0 (`clear_start` at the claim, and
    /// `write_pad` wrapping to the ring's start), and that too is the
    /// word at our tail then, never between the head and it. So a 0 at that
    /// head is another writer's store: a sender that lost the channel
    /// before our claim writing on (`advance` looks before each record,
    /// which narrows that to the record it is writing, but does not close
    /// it: its header or payload stores can still land in our records).
    /// The owner would wait at the word forever and our ring would fill.
    /// Given back `CLOSED`, the owner frees it (drained up to the 0) and
    /// our next send claims anew. The give-back compares the state word
    /// at our claim's count (`Chan::give_back`): should the owner free
    /// the channel and another sender claim it between the re-check and
    /// the give-back, the word is at a later count and nothing moves.
    pub(crate) fn drop_if_unpublished(&mut self, ended: &mut EndedList) -> bool {
        let Some((c, gen)) = self.chan else {
            return false;
        };
        if self.awaiting.is_some() || !self.still_ours(&c, gen) {
            return false;
        }
        let head = c.head(&self.seg);
        let unpublished = head != self.tail
            && c.room_after(head, self.tail).is_some()
            && c.published_at(&self.seg, head) == Some(false);
        // The word's load is Relaxed (it is the receiver's hot-path
        // look); without this fence it could be satisfied after the
        // re-check's load of the state on a weak-memory CPU, and the
        // re-check would not cover a free and a new claim before it.
        fence(Ordering::Acquire);
        // Looked at again: freed meanwhile, the head read may be the
        // next claim's 0 (`flush` ends what waits then).
        let lost = unpublished && self.still_ours(&c, gen);
        if lost {
            tracing::debug!(peer = %self.name, "shm: a record of ours unpublished; channel given back");
            // The sends the head already passed arrived: they complete.
            self.delivered_to(head, ended);
            c.give_back(&self.seg, gen);
            self.chan = None;
            self.fail_all(Error::ConnAborted, ended);
            // A sleeping owner frees the channel now, not at its next
            // wake-up.
            self.wake();
        }
        lost
    }

    pub(crate) fn fail_all(&mut self, e: Error, ended: &mut EndedList) {
        for o in self.queue.drain(..) {
            ended.push((o.done, o.len, Err(e)));
            if let Some(p) = o.answer {
                let p = *p;
                ended.push((Some(p.done), p.len, Err(e)));
            }
        }
        ended.extend(self.delivering.drain(..).map(|d| (d.done, d.len, Err(e))));
        self.splits = 0;
        ended.extend(
            self.pending
                .drain(..)
                .map(|p| (Some(p.done), p.len, Err(e))),
        );
    }
}
