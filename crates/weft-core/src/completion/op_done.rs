//! Where one operation's completion goes ([`OpDone`]): the counter, the
//! completion queue, or the future awaiting it, by the completion rules.

use std::sync::Arc;

use crate::addr::{FiAddr, FI_ADDR_NOTAVAIL};
use crate::counter::CounterShared;
use crate::error::Error;
use crate::flags::OpFlags;

use super::{CqEntry, CqErrEntry, CqItem, CqShared, Finished, Origin, Returned, Waiter};

/// Where the completion of one operation goes, and the rules for it.
#[derive(Debug)]
pub struct OpDone {
    /// The caller's context.
    pub context: u64,
    /// Flags of the completion entry (`FI_SEND | FI_MSG`, ...).
    pub flags: OpFlags,
    /// Report success to the CQ (false under selective completion without
    /// `FI_COMPLETION`). Errors are always reported.
    pub report: bool,
    /// The CQ bound for this direction.
    pub cq: Option<Arc<CqShared>>,
    /// The counter bound for this operation class.
    pub cntr: Option<Arc<CounterShared>>,
    /// The awaiting future of an `async fn` operation: it takes the
    /// completion instead of the CQ.
    pub waiter: Option<Waiter>,
}

/// An [`OpDone`] whose success was stamped into its entry and counted:
/// where the entry goes.
struct Settled {
    report: bool,
    cq: Option<Arc<CqShared>>,
    cntr: Option<Arc<CounterShared>>,
    waiter: Option<Waiter>,
}

impl OpDone {
    /// A success: the entry gets the operation's context and flags, and
    /// the counter moves — before the hand-over, so whoever the
    /// completion wakes sees it moved. (A message that comes back was
    /// counted as well: counters count completions, and it will complete
    /// again in the receive that takes it.) Taken apart, so that what is
    /// left is dropped field by field in place rather than by a call of
    /// the whole `OpDone`'s drop.
    #[inline(always)]
    fn settle(self, item: &mut CqItem) -> Settled {
        let OpDone {
            context,
            flags,
            report,
            cq,
            cntr,
            waiter,
        } = self;
        if let Ok(entry) = item {
            entry.context = context;
            entry.flags |= flags;
        }
        if let Some(c) = &cntr {
            c.add(1);
        }
        Settled {
            report,
            cq,
            cntr,
            waiter,
        }
    }

    /// Moves this completion out of `self`, leaving one that reports
    /// nothing and holds nothing: a receive completed through a reference
    /// to its request takes its completion this way, which costs less
    /// than moving the whole request.
    #[inline(always)]
    pub fn take(&mut self) -> OpDone {
        std::mem::replace(
            self,
            OpDone {
                context: 0,
                flags: OpFlags::empty(),
                report: false,
                cq: None,
                cntr: None,
                waiter: None,
            },
        )
    }

    /// The operation succeeded. For operations whose completion may be
    /// dropped unread (a send: the data went); receives use
    /// [`complete_from`](Self::complete_from).
    // Always: out of line (a send's completion, from the provider's
    // send path), the entry came in behind a pointer and was copied
    // into the item on this frame and from there into the queue, 112
    // bytes twice; inlined, the item is built where the caller builds
    // the entry (mostly defaults and a length).
    #[inline(always)]
    pub fn complete(self, entry: CqEntry) {
        // The queue's item from the start, as in `complete_from`.
        let mut item: CqItem = Ok(entry);
        let Settled {
            report, cq, waiter, ..
        } = self.settle(&mut item);
        if let Some(w) = waiter {
            // Nothing to give back: what was sent stays sent.
            let _ = w.send(Finished::new(
                item.map_err(Box::new),
                FI_ADDR_NOTAVAIL,
                Origin::unknown(),
            ));
        } else if report {
            if let Some(cq) = &cq {
                cq.lock_push().push(item);
            }
        }
    }

    /// [`complete`](Self::complete) of a success whose entry carries its
    /// length and nothing else (a send). When nothing takes the entry (an
    /// inject, or a send without `FI_COMPLETION` under selective
    /// completion) only the counter moves, as `settle` moves it, and the
    /// entry is never built: built into an item for nothing, and the
    /// whole `OpDone` dropped out of line, that was about 25 instructions
    /// an inject.
    #[inline(always)]
    pub fn complete_len(self, len: usize) {
        if !self.wants_entry() {
            let OpDone { cntr, .. } = self;
            if let Some(c) = &cntr {
                c.add(1);
            }
            return;
        }
        self.complete(CqEntry {
            len,
            ..CqEntry::default()
        });
    }

    /// Whether a success makes an entry: reported to the CQ, or handed
    /// to an awaiting future. Not for an inject, nor for a send without
    /// `FI_COMPLETION` under selective completion (errors are reported
    /// either way).
    #[inline(always)]
    pub fn wants_entry(&self) -> bool {
        self.report || self.waiter.is_some()
    }

    /// A receive succeeded with a message from `src` (the raw AV handle).
    /// If the future awaiting it is already gone the message comes back,
    /// uncounted, for the endpoint to hand to the next receive.
    #[must_use = "a returned message must go to the next receive"]
    // Always: left out of line (as it was in `deliver_in`), its entry and
    // completion are copied into its parameters, about 20 instructions.
    #[inline(always)]
    pub fn complete_from(self, entry: CqEntry, src: FiAddr) -> Option<Returned> {
        // The queue's item from the start: built in place where this is
        // inlined, it goes into the queue in one copy. Wrapped at the
        // push, the entry was copied into an item and the item into the
        // queue (112 bytes).
        let mut item: CqItem = Ok(entry);
        let Settled {
            report,
            cq,
            cntr,
            waiter,
        } = self.settle(&mut item);
        if let Some(w) = waiter {
            let origin = Origin { cq, cntr };
            return w
                .send(Finished::new(item.map_err(Box::new), src, origin))
                .err()
                .and_then(Returned::from_finished);
        }
        if report {
            if let Some(cq) = &cq {
                cq.lock_push().push(item);
            }
        }
        None
    }

    /// [`complete_from`](Self::complete_from) of a completion that stays
    /// where it lies (in a receive request its caller keeps, see
    /// `recv_completion::deliver_in`): only its handles (queue, counter,
    /// waiter) are taken out, and what is left holds nothing. Taking the
    /// whole completion out first ([`take`](Self::take)) copied it onto
    /// the stack and wrote an empty one back.
    #[must_use = "a returned message must go to the next receive"]
    #[inline(always)]
    pub fn complete_from_in(&mut self, entry: CqEntry, src: FiAddr) -> Option<Returned> {
        OpDone {
            context: self.context,
            flags: self.flags,
            report: self.report,
            cq: self.cq.take(),
            cntr: self.cntr.take(),
            waiter: self.waiter.take(),
        }
        .complete_from(entry, src)
    }

    /// The operation failed; `e.context`/`e.flags` are filled in here.
    pub fn fail(self, mut e: CqErrEntry) {
        e.context = self.context;
        e.flags |= self.flags;
        if let Some(c) = &self.cntr {
            c.add_err(1);
        }
        if let Some(w) = self.waiter {
            let _ = w.send(Finished::new(
                Err(Box::new(e)),
                FI_ADDR_NOTAVAIL,
                Origin::unknown(),
            ));
        } else if let Some(cq) = &self.cq {
            cq.push(Err(e));
        }
    }

    /// Fails a receive with an error entry that carries a whole message
    /// (`FI_SOURCE_ERR`: the sender is not in the AV). As in
    /// [`complete_from`](Self::complete_from), a receive whose future is
    /// gone does not consume it: the message comes back, with `src` and
    /// the sender's raw address `raw`, for the next receive.
    pub fn fail_from(mut self, mut e: CqErrEntry, src: FiAddr) -> Option<Returned> {
        e.context = self.context;
        e.flags |= self.flags;
        if let Some(c) = &self.cntr {
            c.add_err(1);
        }
        if let Some(w) = self.waiter.take() {
            let origin = Origin {
                cq: self.cq.take(),
                cntr: self.cntr.take(),
            };
            return w
                .send(Finished::new(Err(Box::new(e)), src, origin))
                .err()
                .and_then(Returned::from_finished);
        }
        if let Some(cq) = &self.cq {
            cq.push(Err(e));
        }
        None
    }

    /// Fails with a bare error code.
    pub fn fail_with(self, err: Error) {
        let e = CqErrEntry::new(self.context, OpFlags::empty(), err);
        self.fail(e);
    }
}
