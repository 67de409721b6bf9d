//! The receives of one receive queue, kept in post order apart from
//! the work requests on the device.
//!
//! A queue pair (or shared receive queue) consumes its receive work
//! requests strictly in post order and verbs cannot take one back, yet
//! a receive may be withdrawn (`cancel`, or its future dropped) while its
//! work request is posted. So each receive queue keeps the receives still
//! waiting, in post order, apart from the work requests on the device
//! ([`RxQueue`]):
//!
//! * A withdrawn receive leaves the waiting queue at once (its credit
//!   comes back); its work request stays posted, owning its memory, and
//!   now only catches a later message.
//! * A message that lands in its own receive's work request completes
//!   that receive in place — the fast path, as before (zero copy for
//!   registered buffers). Any other message goes to the oldest waiting
//!   receive, copied into its buffers, or is held until one is posted,
//!   as an unexpected message would be; a new receive takes a held
//!   message at once without posting.
//! * A receive whose buffers are its own work request's memory (a
//!   registered receive) and that is served by another work request's
//!   message gets the memory that message landed in, when the message
//!   fits its length (else buffers of its own lengths, copied into): its
//!   own stay with the device until its work request completes. A
//!   cancelled one gets buffers of its own lengths back at once (an
//!   awaited one none), rather than its own when a message (or the close)
//!   finally ends its work request, which could be never — except on a
//!   queue pair being flushed (a given-up connection's), where its flush
//!   is due: there it waits for that, handed no other message
//!   (`cancel_in_hand`).
//! * A new receive posts a work request only when no posted one is
//!   spare (every posted one is spoken for by a waiting receive), so the
//!   device never holds more than the receive queue's size and a
//!   withdrawn receive's work request is reused by the next receive.
//!
//! Messages thus reach receives in arrival order. A receive's future
//! that is dropped between the decision and the hand-over (another
//! thread completes it) gives its message back to the next receive.

use std::collections::VecDeque;

use bytes::BytesMut;
use weft_core::completion::OpDone;
use weft_core::credits::Credits;

use super::recv_mem::{Arrived, Shape};

/// A receive waiting for a message.
pub(in crate::msg) struct Waiting {
    /// Its work request id when it posted one; unique either way.
    pub(super) id: u64,
    /// Whether the work request `id` is its own (its buffers or slot).
    pub(super) own_wr: bool,
    pub done: OpDone,
    /// Its buffers, unless they are its work request's memory.
    pub bufs: Option<Vec<BytesMut>>,
    /// `bufs` were made like its own, which stay with the device: a
    /// message that landed elsewhere may be handed over in the memory it
    /// landed in instead of copied into them (`recv_side::deliver`).
    pub like: bool,
    /// Cancelled while its buffers are its work request's memory on a
    /// queue pair being flushed ([`RxQueue::cancel_in_hand`]): it waits
    /// for that flush (or a message in its own work request) and is
    /// handed no other message, whose memory would replace its own.
    pub(super) cancel_asked: bool,
}

impl Waiting {
    /// A receive with no work request of its own.
    pub fn new(id: u64, done: OpDone, bufs: Option<Vec<BytesMut>>) -> Waiting {
        Waiting {
            id,
            own_wr: false,
            done,
            bufs,
            like: false,
            cancel_asked: false,
        }
    }

    /// Its future was dropped: nobody takes its completion. Receives
    /// awaited through a shared context are not withdrawn when their
    /// future goes, so this is how those are found out.
    fn gone(&self) -> bool {
        self.done.waiter.as_ref().is_some_and(|w| w.is_canceled())
    }
}

/// A posted receive work request.
pub(super) struct PostedWr<M> {
    mem: M,
    /// Its receive still waits for it.
    owned: bool,
}

/// The work requests posted on one receive queue, in post order.
pub(super) type PostedWrs<M> = crate::msg::post_order::PostOrder<PostedWr<M>>;

/// The receives of one receive queue of the device: those waiting, in
/// post order; the work requests posted, in post order; and the messages
/// held for the next receive, in arrival order. While a message is held
/// no receive waits (a receive that finds one takes it).
pub(in crate::msg) struct RxQueue<M> {
    pub(super) wrs: PostedWrs<M>,
    pub(super) waiting: VecDeque<Waiting>,
    pub(super) held: VecDeque<Arrived>,
}

impl<M: Shape> Default for RxQueue<M> {
    fn default() -> Self {
        RxQueue {
            wrs: PostedWrs::default(),
            waiting: VecDeque::new(),
            held: VecDeque::new(),
        }
    }
}

impl<M: Shape> RxQueue<M> {
    /// The oldest held message, for a new receive.
    pub fn take_held(&mut self) -> Option<Arrived> {
        self.held.pop_front()
    }

    /// Whether a new receive must post a work request: none posted is
    /// spare. Posted ones are never fewer than waiting receives, so this
    /// keeps the device at no more than the queue's size.
    pub fn needs_wr(&self) -> bool {
        self.wrs.len() <= self.waiting.len()
    }

    /// Queues a receive; `mem`: the work request `id` it posted.
    // Always inlined: its receive and memory (about 200 bytes) are then
    // moved into the queues once, not into its parameters first.
    #[inline(always)]
    pub fn push(&mut self, id: u64, done: OpDone, bufs: Option<Vec<BytesMut>>, mem: Option<M>) {
        let own_wr = mem.is_some();
        if let Some(mem) = mem {
            self.wrs.insert(id, PostedWr { mem, owned: true });
        }
        self.waiting.push_back(Waiting {
            id,
            own_wr,
            done,
            bufs,
            like: false,
            cancel_asked: false,
        });
    }

    /// Work request `id` completed: its memory, with its receive when
    /// that still waits for it (the message is that receive's). `None`
    /// for an id that is not posted here.
    // Always inlined into its one caller: out of line its answer (about
    // 200 bytes) was built and then copied (a `memcpy` per receive).
    #[inline(always)]
    pub fn landed(&mut self, id: u64, credits: &Credits) -> Option<(M, Option<Waiting>)> {
        let wr = self.wrs.remove(id)?;
        if !wr.owned {
            return Some((wr.mem, None));
        }
        // On a queue pair the owner is the oldest waiting receive; a
        // shared queue's completions reach different CQs and may be
        // handled out of post order.
        let w = match self.waiting.front() {
            Some(w) if w.id == id => self.waiting.pop_front(),
            _ => match self.waiting.iter().position(|w| w.id == id) {
                Some(i) => self.waiting.remove(i),
                None => None,
            },
        };
        let Some(w) = w else {
            return Some((wr.mem, None));
        };
        if w.gone() {
            credits.release(1);
            return Some((wr.mem, None));
        }
        Some((wr.mem, Some(w)))
    }

    /// The usual completion, taken apart where it lies: work request
    /// `id` is the oldest posted, still its receive's, `pick` takes what
    /// it needs of its memory (a bounce slot's number), and that receive
    /// is the oldest waiting and still awaited. Both leave the queue; the
    /// receive's completion and buffers come out with what `pick` took.
    /// `None`, and nothing changed, for any other case ([`landed`]).
    ///
    /// [`landed`]: Self::landed
    // Always inlined: only the completion, the buffers and the slot move,
    // not the whole receive and memory (about 170 bytes) through
    // `landed`'s answer.
    #[inline(always)]
    pub fn take_own_front<T>(
        &mut self,
        id: u64,
        pick: impl FnOnce(&M) -> Option<T>,
    ) -> Option<(T, OpDone, Option<Vec<BytesMut>>)> {
        let (front, wr) = self.wrs.front()?;
        if front != id || !wr.owned {
            return None;
        }
        let w = self.waiting.front()?;
        if w.id != id || w.gone() {
            return None;
        }
        let t = pick(&wr.mem)?;
        drop(self.wrs.pop_front());
        let w = self.waiting.pop_front()?;
        Some((t, w.done, w.bufs))
    }

    /// Hands a message that is not its work request's receive's to the
    /// oldest waiting receive, or holds it. `first`: it is older than
    /// any held message (it comes back from a receive whose future went).
    pub fn route(
        &mut self,
        a: Arrived,
        first: bool,
        credits: &Credits,
    ) -> Option<(Waiting, Arrived)> {
        match self.next_live(credits) {
            Some(w) => Some((w, a)),
            None => {
                if first {
                    self.held.push_front(a);
                } else {
                    self.held.push_back(a);
                }
                None
            }
        }
    }

    /// The oldest waiting receive that is still awaited, out of the
    /// queue, with buffers to copy into.
    pub fn next_live(&mut self, credits: &Credits) -> Option<Waiting> {
        let mut i = 0;
        while let Some(asked) = self.waiting.get(i).map(|w| w.cancel_asked) {
            if asked {
                i += 1;
                continue;
            }
            let Some(mut w) = self.waiting.remove(i) else {
                break;
            };
            let gone = w.gone();
            let shape = self.disown(&w);
            if gone {
                credits.release(1);
                continue;
            }
            if w.bufs.is_none() {
                w.bufs = Some(like(&shape));
                w.like = true;
            }
            return Some(w);
        }
        None
    }

    /// Receive `w` leaves the queue: its work request, if any, only
    /// catches a later message from now on. Returns that request's
    /// buffer lengths.
    fn disown(&mut self, w: &Waiting) -> Vec<usize> {
        if !w.own_wr {
            return Vec::new();
        }
        match self.wrs.get_mut(w.id) {
            Some(wr) => {
                wr.owned = false;
                wr.mem.shape()
            }
            None => Vec::new(),
        }
    }

    /// The work request of no waiting receive was flushed: the oldest
    /// receive without a work request of its own can get no message any
    /// more (posted requests are never fewer than waiting receives, so
    /// each such receive meets one such flush).
    pub fn take_wrless(&mut self, credits: &Credits) -> Option<Waiting> {
        let i = self.waiting.iter().position(|w| !w.own_wr)?;
        let w = self.waiting.remove(i)?;
        credits.release(1);
        Some(w)
    }

    /// Withdraws the waiting receive with `context`, with its buffers (or
    /// buffers like them, while its own are the device's).
    pub fn cancel(&mut self, context: u64, credits: &Credits) -> Option<Waiting> {
        let i = self.position_of(context)?;
        self.withdraw(i, credits)
    }

    /// Where the waiting receive with `context` is.
    fn position_of(&self, context: u64) -> Option<usize> {
        self.waiting.iter().position(|w| w.done.context == context)
    }

    /// Withdraws waiting receive `i` ([`cancel`](Self::cancel)).
    fn withdraw(&mut self, i: usize, credits: &Credits) -> Option<Waiting> {
        let mut w = self.waiting.remove(i)?;
        credits.release(1);
        let shape = self.disown(&w);
        if w.bufs.is_none() {
            // An awaited receive is withdrawn for its future (dropped, or
            // reclaiming its buffers): stand-ins would be no use to it.
            w.bufs = Some(if w.done.waiter.is_some() {
                Vec::new()
            } else {
                like(&shape)
            });
        }
        Some(w)
    }

    /// As [`cancel`](Self::cancel) on a queue whose queue pair is being
    /// flushed (a given-up connection's): a receive whose own buffers are
    /// its work request's memory is left waiting, for the flush (due
    /// within the give-up's bounds) to end it `Canceled` with them — a
    /// withdrawal would hand out stand-ins and strand its own, a pool
    /// buffer among them, with a work request that can only be flushed.
    /// `None`: no receive with `context` waits; `Some(None)`: left for
    /// its flush; `Some(Some(w))`: withdrawn.
    pub fn cancel_in_hand(&mut self, context: u64, credits: &Credits) -> Option<Option<Waiting>> {
        let i = self.position_of(context)?;
        let w = self.waiting.get_mut(i)?;
        if w.bufs.is_none() {
            // Held messages may now outwait it (no other receive posts
            // to a flushed queue; the task carries them on at its end).
            w.cancel_asked = true;
            return Some(None);
        }
        Some(self.withdraw(i, credits))
    }

    /// Withdraws every receive whose future is gone; how many.
    pub fn sweep(&mut self, credits: &Credits) -> usize {
        let mut n = 0;
        let mut i = 0;
        while i < self.waiting.len() {
            if !self.waiting[i].gone() {
                i += 1;
                continue;
            }
            if let Some(w) = self.waiting.remove(i) {
                self.disown(&w);
                credits.release(1);
                n += 1;
            }
        }
        n
    }

    /// Empties the queue at close: the waiting receives, each with the
    /// memory of its own work request (if any); held messages are dropped
    /// and the other work requests keep their memory until the queue is
    /// gone.
    pub fn drain(&mut self) -> Vec<(Waiting, Option<M>)> {
        self.held.clear();
        let waiting: Vec<Waiting> = self.waiting.drain(..).collect();
        waiting
            .into_iter()
            .map(|w| {
                let mem = if w.own_wr {
                    self.wrs.remove(w.id).map(|wr| wr.mem)
                } else {
                    None
                };
                (w, mem)
            })
            .collect()
    }

    /// Empties the queue at close, without completions: the waiting
    /// receives come out (to be dropped), held messages are dropped, and
    /// every work request keeps its memory until the queue is gone.
    pub fn forget(&mut self) -> Vec<Waiting> {
        self.held.clear();
        for wr in self.wrs.values_mut() {
            wr.owned = false;
        }
        self.waiting.drain(..).collect()
    }

    /// Work requests posted and not reported yet.
    pub fn posted(&self) -> usize {
        self.wrs.len()
    }

    /// Receives waiting (including withdrawn ones not yet found out).
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }
}

/// Zeroed buffers of the given lengths (zeroed allocations are not
/// touched until written).
pub(super) fn like(shape: &[usize]) -> Vec<BytesMut> {
    shape.iter().map(|&n| BytesMut::zeroed(n)).collect()
}
