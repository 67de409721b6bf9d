//! The receive queues of given-up queue pairs while their tasks live
//! (`MsgShared::retired_rx`, see `give_up`): every one still live, in
//! the order of their give-ups, so that a message given back reaches the
//! oldest receive still waiting, and `cancel` finds a receive held there.
//!
//! Each queue leaves the list when its task ends, or when the task is
//! dropped unfinished with its runtime ([`RetiredSlot`]), whatever the
//! order in which the tasks end: a later give-back or cancel is then
//! offered nothing no task ends.
//!
//! `give_back` routes under the link's lock, as a receive completion
//! does (the order link, receive queue). A give-up takes the link in one
//! critical section of that lock and retires its queue (moving the
//! messages held to `rxq`, adding it to the list) in a later one: a
//! message given back between the two finds no link, and in the list
//! only earlier give-ups' queues whose tasks still live (their waiting
//! receives, older still, may take it); untaken, it is held first in
//! `rxq` (or taken by a receive still waiting there), so the retirement
//! moves it ahead of the others; one given back after the retirement is
//! held ahead of those moved.

use std::sync::Arc;

use weft_core::completion::Returned;
use weft_core::credits::Credits;
use weft_core::sync::{lock, FastMutex};

use super::complete::{
    cancel_flushing_on, offer_to_waiting, reroute_on, returned_arrival, RecvMem, RxQueue,
};
use super::MsgShared;

/// A given-up queue pair's receive queue, shared by its task and the
/// endpoint's list.
pub(super) type RetiredQueue = Arc<FastMutex<RxQueue<RecvMem>>>;

/// The live retired queues, oldest give-up first.
pub(super) type RetiredList = FastMutex<Vec<RetiredQueue>>;

/// A retired queue's place in the endpoint's list, taken out when the
/// task ends, or is dropped unfinished (its runtime shut down): a
/// message given back later would otherwise be offered to receives no
/// task ends.
pub(super) struct RetiredSlot {
    pub(super) ep: Arc<MsgShared>,
    pub(super) q: RetiredQueue,
}

impl Drop for RetiredSlot {
    fn drop(&mut self) {
        clear_retired(&self.ep.retired_rx, &self.q);
    }
}

/// Adds `q` to `list` as its newest: its receives were posted after
/// those of every queue retired before it.
pub(super) fn push_retired(list: &RetiredList, q: RetiredQueue) {
    lock(list).push(q);
}

/// Takes `q` out of `list`, leaving the others (older or newer give-ups'
/// queues whose tasks still live) in their order.
pub(super) fn clear_retired(list: &RetiredList, q: &RetiredQueue) {
    lock(list).retain(|s| !Arc::ptr_eq(s, q));
}

/// Where a message given back goes (its receive completed, the
/// receive's future dropped before it was read): to the oldest receive
/// still waiting in the queues give-ups retired (`retired`, oldest
/// give-up first, while their tasks live), link or not: every receive
/// of a queue was posted before every receive of a queue retired later,
/// and before every receive in `rxq`. Else to `rxq` (the current
/// link's, or the endpoint's), ahead of every message it holds: without
/// a link the messages held at the give-up are already there
/// (`retire_queue`) and this one arrived before them; a retired queue's
/// late messages are carried behind them when its task ends.
///
/// Without a link, an arrival that is no message (a write with remote
/// CQ data) is the failed connection's and goes rather than reach the
/// next connection's first receive; once the endpoint is closed with no
/// link the arrival is dropped, offered to nothing, as at a close (with
/// a link, not offered to the retired queues: no completion once
/// closed).
pub(super) fn give_back_routed(
    linked: bool,
    retired: &[RetiredQueue],
    rxq: &FastMutex<RxQueue<RecvMem>>,
    credits: &Credits,
    closed: bool,
    r: Returned,
) {
    if closed && !linked {
        return;
    }
    let mut a = returned_arrival(r);
    // A close keeps the link in its slot: closed with one, the retired
    // queues' receives are offered nothing either.
    if !closed {
        for q in retired {
            match offer_to_waiting(q, credits, a) {
                Some(back) => a = back,
                None => return,
            }
        }
    }
    if !linked && !a.is_message() {
        return;
    }
    reroute_on(rxq, credits, a, true);
}

/// Cancels the receive with `context` still waiting in a retired queue
/// (the oldest give-up's first). One whose buffers are in hand (a bounce
/// slot's receive, or one without a work request of its own) ends
/// `Canceled` at once with them, its credit back; its work request stays
/// in the queue with its memory for the task, which waits for the device
/// to report it. One whose buffers are its work request's memory is left
/// waiting: the flush the task awaits ends it `Canceled` with its own
/// buffers (a pool buffer back to its pool), or a message that landed
/// before the queue pair's move completes it — a withdrawal now would
/// hand out stand-ins and strand its own memory with a work request that
/// can only be flushed. False if no retired queue has it waiting (its
/// task may have taken the queue to end it: it ends `Canceled` there
/// anyway). Once the endpoint is closed none is cancelled: the tasks end
/// them without completions.
pub(super) fn cancel_retired(
    retired: &[RetiredQueue],
    credits: &Credits,
    closed: bool,
    context: u64,
) -> bool {
    !closed
        && retired
            .iter()
            .any(|q| cancel_flushing_on(q, credits, context))
}
