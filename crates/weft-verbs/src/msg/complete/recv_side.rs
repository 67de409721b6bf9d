//! A receive queue's completions: a message ends its own receive in
//! place, or is copied into the oldest waiting one, or is held.

use bytes::BytesMut;
use weft_core::completion::{trim_bufs, CqEntry, CqErrEntry, OpDone, Returned};
use weft_core::credits::Credits;
use weft_core::flags::OpFlags;
use weft_core::sync::{lock, FastMutex};
use weft_core::Error;

use super::recv_finish::{
    finish_recv, finish_remote_write, is_remote_write, recv_error, recv_flags,
};
use super::recv_mem::{arrived_back, Arrived, Body, RecvMem, Route};
use super::rx_queue::{RxQueue, Waiting};
use crate::slot_pool::SlotPool;
use crate::sys::{WcStatus, WorkCompletion};
use crate::user_bufs::unregister_before;

/// Hands `a` to the oldest waiting receive of `q` (held if none waits;
/// `first`: ahead of the messages held), and on to the next should that
/// receive's future have gone meanwhile.
pub(in crate::msg) fn reroute_on(
    q: &FastMutex<RxQueue<RecvMem>>,
    credits: &Credits,
    mut a: Arrived,
    mut first: bool,
) {
    loop {
        let next = lock(q).route(a, first, credits);
        let Some((w, msg)) = next else { return };
        credits.release(1);
        match deliver(w, msg) {
            Some(back) => {
                a = back;
                first = true;
            }
            None => return,
        }
    }
}

/// Takes back into `q` a message whose receive's future was dropped
/// after the message reached it: the oldest waiting receive gets it, or
/// it is held ahead of every other message. Needs no slot pool: the
/// message is in memory of its own by now.
pub(in crate::msg) fn give_back_to(
    q: &FastMutex<RxQueue<RecvMem>>,
    credits: &Credits,
    r: Returned,
) {
    reroute_on(q, credits, returned_arrival(r), true);
}

/// Hands a message given back to the oldest receive of `q` still
/// awaited (again, should that receive's future be gone by the
/// hand-over); the message comes back if none waits, and `q` holds
/// nothing of it.
pub(in crate::msg) fn offer_to_waiting(
    q: &FastMutex<RxQueue<RecvMem>>,
    credits: &Credits,
    mut a: Arrived,
) -> Option<Arrived> {
    loop {
        let next = lock(q).next_live(credits);
        let Some(w) = next else { return Some(a) };
        credits.release(1);
        a = deliver(w, a)?;
    }
}

/// A message given back, as the queue it goes to holds it.
pub(in crate::msg) fn returned_arrival(r: Returned) -> Arrived {
    let route = Route {
        cq: r.origin.cq,
        cntr: r.origin.cntr,
    };
    arrived_back(r.entry, route)
}

/// A receive queue on the device with what completing its receives
/// needs: a queue pair's own, or a shared receive context's.
pub(in crate::msg) struct RecvSide<'a> {
    pub q: &'a FastMutex<RxQueue<RecvMem>>,
    pub credits: &'a Credits,
    /// Where its receives' slots come from.
    pub pool: &'a SlotPool,
}

impl RecvSide<'_> {
    /// A work completion of one of its receives, at an endpoint whose
    /// queues are `route`. False when the id is not posted here.
    // Always inlined: the usual case (a message in the bounce slot of
    // the oldest receive, which still waits for it) is handled in its
    // caller, everything else out of line.
    #[inline(always)]
    pub fn on_completion(&self, wc: &WorkCompletion, route: &Route) -> bool {
        let own = lock(self.q).take_own_front(wc.wr_id, RecvMem::slot);
        let Some((slot, mut done, bufs)) = own else {
            return self.on_other_completion(wc, route);
        };
        self.credits.release(1);
        route.apply(&mut done);
        let back = finish_slot(done, bufs.unwrap_or_default(), slot, wc, self.pool);
        if let Some(e) = back {
            self.reroute(arrived_back(e, route.clone()), true);
        }
        true
    }

    /// [`on_completion`](Self::on_completion) of any but the usual case.
    #[inline(never)]
    fn on_other_completion(&self, wc: &WorkCompletion, route: &Route) -> bool {
        let landed = lock(self.q).landed(wc.wr_id, self.credits);
        let Some((mem, own)) = landed else {
            return false;
        };
        if let Some(mut w) = own {
            self.credits.release(1);
            route.apply(&mut w.done);
            if let Some(back) = finish_in_place(w, mem, wc, self.pool, route) {
                self.reroute(back, true);
            }
            return true;
        }
        if wc.status == WcStatus::WrFlushErr {
            // No message: the queue is being flushed (its connection
            // ended). A receive with no work request of its own would
            // otherwise wait for ever.
            drop(mem.into_bufs(self.pool));
            let w = lock(self.q).take_wrless(self.credits);
            if let Some(mut w) = w {
                route.apply(&mut w.done);
                let bufs = w.bufs.take().unwrap_or_default();
                fail(w.done, bufs, Error::Canceled);
            }
            return true;
        }
        let a = mem.into_arrived(wc, self.pool, route);
        self.reroute(a, false);
        true
    }

    /// Hands `a` to the oldest waiting receive (again, should that
    /// receive's future be gone by the hand-over) or holds it.
    pub fn reroute(&self, a: Arrived, first: bool) {
        reroute_on(self.q, self.credits, a, first);
    }

    /// Takes back a message whose receive's future was dropped after the
    /// message reached it: the oldest waiting receive gets it, or it is
    /// held ahead of every other message.
    pub fn give_back(&self, r: Returned) {
        give_back_to(self.q, self.credits, r);
    }

    /// Withdraws the waiting receive with `context`; it ends with
    /// `Canceled` and its buffers. False if none waits.
    pub fn cancel(&self, context: u64) -> bool {
        cancel_on(self.q, self.credits, context)
    }
}

/// Withdraws the waiting receive of `q` with `context`: it ends with
/// `Canceled` and its buffers (while its own are its work request's:
/// zeroed ones like them, or none for an awaited receive), its credit
/// back. Its work request, if it posted one, stays in `q` with its
/// memory until the device reports it (it now only catches a later
/// message). False if none waits.
pub(in crate::msg) fn cancel_on(
    q: &FastMutex<RxQueue<RecvMem>>,
    credits: &Credits,
    context: u64,
) -> bool {
    let w = lock(q).cancel(context, credits);
    match w {
        Some(mut w) => {
            let bufs = w.bufs.take().unwrap_or_default();
            fail(w.done, bufs, Error::Canceled);
            true
        }
        None => false,
    }
}

/// As [`cancel_on`] on the queue of a queue pair being flushed
/// ([`RxQueue::cancel_in_hand`]): a receive whose buffers are its work
/// request's memory is found but left to end `Canceled` at its flush,
/// with them. False if none waits.
pub(in crate::msg) fn cancel_flushing_on(
    q: &FastMutex<RxQueue<RecvMem>>,
    credits: &Credits,
    context: u64,
) -> bool {
    let found = lock(q).cancel_in_hand(context, credits);
    match found {
        Some(Some(mut w)) => {
            let bufs = w.bufs.take().unwrap_or_default();
            fail(w.done, bufs, Error::Canceled);
            true
        }
        Some(None) => true,
        None => false,
    }
}

/// Ends receive `w` with message `a`, copied into its buffers. The
/// message comes back if the receive's future is gone.
///
/// A receive whose own memory stays with the device (`Waiting::like`: a
/// registered receive, a pool buffer's among them) is handed the memory
/// the message landed in instead, when the message fits its length: no
/// copy, and a pool buffer comes back to its pool through this
/// completion (`BufferPool::reclaim`), where a copy would name no pool.
/// Its own memory goes on catching a later message, as a withdrawn
/// receive's does.
pub(in crate::msg) fn deliver(w: Waiting, a: Arrived) -> Option<Arrived> {
    let Waiting {
        mut done,
        bufs,
        like,
        ..
    } = w;
    a.route.apply(&mut done);
    let mut bufs = bufs.unwrap_or_default();
    let Arrived { body, imm, route } = a;
    match body {
        Body::Data { bufs: src, len } if like && len <= bufs.iter().map(|b| b.len()).sum() => {
            finish_recv(done, src, len, None, imm).map(|e| arrived_back(e, route))
        }
        Body::Data { bufs: src, len } => {
            let placed = copy_into(&src, &mut bufs);
            if placed < len {
                let mut e = CqErrEntry::new(0, recv_flags(imm), Error::Trunc);
                trim_bufs(&mut bufs, placed);
                e.len = placed;
                e.olen = len - placed;
                e.data = u64::from(imm.unwrap_or(0));
                done.fail(e.with_bufs(bufs));
                return None;
            }
            let body = Body::Data { bufs: src, len };
            finish_recv(done, bufs, placed, None, imm).map(|_| Arrived { body, imm, route })
        }
        Body::RemoteWrite { len } => {
            let body = Body::RemoteWrite { len };
            finish_remote_write(done, bufs, len, imm).map(|_| Arrived { body, imm, route })
        }
        Body::Failed(e) => {
            fail(done, bufs, e);
            None
        }
    }
}

/// Copies the bytes of `src` in order into `dst`; returns how many fit.
pub(super) fn copy_into(src: &[BytesMut], dst: &mut [BytesMut]) -> usize {
    let mut placed = 0;
    let mut d = dst.iter_mut();
    let mut cur: Option<&mut BytesMut> = d.next();
    let mut at = 0;
    for s in src {
        let mut s = &s[..];
        while !s.is_empty() {
            let Some(b) = cur.as_deref_mut() else {
                return placed;
            };
            let n = (b.len() - at).min(s.len());
            b[at..at + n].copy_from_slice(&s[..n]);
            s = &s[n..];
            at += n;
            placed += n;
            if at == b.len() {
                cur = d.next();
                at = 0;
            }
        }
    }
    placed
}

/// Ends a receive that gets no message with `err`, buffers handed back
/// untouched.
pub(super) fn fail(done: OpDone, mut bufs: Vec<BytesMut>, err: Error) {
    trim_bufs(&mut bufs, 0);
    done.fail(CqErrEntry::new(0, OpFlags::RECV | OpFlags::MSG, err).with_bufs(bufs));
}

/// Ends a receive with the completion of its own work request, whose
/// memory is bounce slot `slot` of `pool` (free again afterwards): the
/// message is copied into `bufs`. The entry comes back if the receive's
/// future is gone by now.
#[inline(always)]
fn finish_slot(
    done: OpDone,
    mut bufs: Vec<BytesMut>,
    slot: u32,
    wc: &WorkCompletion,
    pool: &SlotPool,
) -> Option<CqEntry> {
    if is_remote_write(wc) {
        // Nothing landed in the slot: it is free again.
        pool.put(slot);
        return finish_remote_write(done, bufs, wc.byte_len as usize, wc.imm_data);
    }
    let err = recv_error(wc);
    let placed = if err.is_none() {
        pool.scatter_put(slot, wc.byte_len as usize, &mut bufs)
            .unwrap_or_else(|(_, placed)| placed)
    } else {
        pool.put(slot);
        0
    };
    finish_recv(done, bufs, placed, err, wc.imm_data)
}

/// Ends receive `w` with the completion of its own work request, whose
/// memory is `mem` (the fast path: no copy beyond a slot's). The message
/// comes back if the receive's future is gone by now.
// Always inlined into its one caller: its receive and memory (about 200
// bytes) are not copied into its parameters.
#[inline(always)]
fn finish_in_place(
    w: Waiting,
    mem: RecvMem,
    wc: &WorkCompletion,
    pool: &SlotPool,
    route: &Route,
) -> Option<Arrived> {
    let Waiting { done, bufs, .. } = w;
    let back = match mem {
        RecvMem::Slot(slot) => finish_slot(done, bufs.unwrap_or_default(), slot, wc, pool),
        RecvMem::Registered { mrs, empty } => {
            let (n, k) = (mrs.len(), empty.len());
            let bufs = unregister_before(mrs, empty);
            let lost = bufs.len() - k < n;
            if is_remote_write(wc) && !lost {
                finish_remote_write(done, bufs, wc.byte_len as usize, wc.imm_data)
            } else {
                let err = recv_error(wc).or(lost.then_some(Error::Io));
                let placed = if err.is_none() {
                    wc.byte_len as usize
                } else {
                    0
                };
                finish_recv(done, bufs, placed, err, wc.imm_data)
            }
        }
    };
    back.map(|e| arrived_back(e, route.clone()))
}
