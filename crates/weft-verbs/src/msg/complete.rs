//! What the device holds for each posted operation, and how its work
//! completion ends it.
//!
//! Receives need more than a table: a queue pair (or shared receive
//! queue) consumes its receive work requests strictly in post order and
//! verbs cannot take one back, yet a receive may be withdrawn (`cancel`,
//! or its future dropped) while its work request is posted. So each
//! receive queue keeps the receives still waiting, in post order, apart
//! from the work requests on the device ([`RxQueue`]):
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
//!   registered receive) and that is served by a copy gets buffers of
//!   the same lengths instead: its own stay with the device until its
//!   work request completes. A cancelled one is handed back the same
//!   way, at once, rather than when a message (or the close) finally
//!   ends its work request, which could be never.
//! * A new receive posts a work request only when no posted one is
//!   spare (every posted one is spoken for by a waiting receive), so the
//!   device never holds more than the receive queue's size and a
//!   withdrawn receive's work request is reused by the next receive.
//!
//! Messages thus reach receives in arrival order. A receive's future
//! that is dropped between the decision and the hand-over (another
//! thread completes it) gives its message back to the next receive.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use weft_core::addr::FI_ADDR_NOTAVAIL;
use weft_core::completion::{trim_bufs, CqEntry, CqErrEntry, CqShared, OpDone, Returned};
use weft_core::counter::CounterShared;
use weft_core::credits::Credits;
use weft_core::flags::OpFlags;
use weft_core::hash::{fast_map, FastMap};
use weft_core::sync::lock;
use weft_core::Error;

use super::srx::SRX_WR_BIT;
use super::MsgShared;
use crate::cq_poller::CqSink;
use crate::local_mem::{Dst, Src};
use crate::slot_pool::SlotPool;
use crate::sys::{WcOpcode, WcStatus, WorkCompletion};
use crate::user_bufs::{unregister, RmaLocal};

/// Work request ids of an endpoint's own receives carry this bit (those
/// of a shared receive context carry [`SRX_WR_BIT`]), so a completion
/// finds its table without a lookup in the other.
pub(super) const RECV_WR_BIT: u64 = 1 << 62;

/// One posted send or RMA operation, owned by the in-flight table until
/// its completion: whatever the device may touch lives here until then.
pub(super) struct Inflight {
    pub done: OpDone,
    pub op: Held,
}

/// The memory behind a posted send or RMA operation.
pub(super) enum Held {
    /// A send of `len` bytes, copied inline into the work request.
    SendInline { len: usize },
    /// A send copied into a bounce slot.
    SendSlot { len: usize, slot: u32 },
    /// A send from the caller's buffers, registered.
    SendRegistered { len: usize, _mrs: Vec<Src> },
    /// An RMA write or read of `len` bytes.
    Rma {
        len: usize,
        kind: OpFlags,
        local: RmaLocal,
    },
}

/// The memory a receive work request fills.
pub(super) enum RecvMem {
    /// A bounce slot; the receive keeps its own buffers.
    Slot(u32),
    /// The receive's own buffers, registered (zero-length ones are not
    /// registered and are given back as they were).
    Registered { mrs: Vec<Dst>, empty: Vec<BytesMut> },
}

/// The buffer lengths of a receive whose buffers are a work request's
/// memory, for buffers like them.
pub(super) trait Shape {
    fn shape(&self) -> Vec<usize>;
}

impl Shape for RecvMem {
    fn shape(&self) -> Vec<usize> {
        match self {
            RecvMem::Slot(_) => Vec::new(),
            RecvMem::Registered { mrs, empty } => mrs
                .iter()
                .map(|m| m.len())
                .chain(empty.iter().map(|b| b.len()))
                .collect(),
        }
    }
}

impl RecvMem {
    /// The caller's buffers back (a slot goes back to `pool`).
    fn into_bufs(self, pool: &SlotPool) -> Vec<BytesMut> {
        match self {
            RecvMem::Slot(slot) => {
                pool.put(slot);
                Vec::new()
            }
            RecvMem::Registered { mrs, mut empty } => {
                let mut b = unregister(mrs);
                b.append(&mut empty);
                b
            }
        }
    }

    /// The message `wc` reports in this memory, taken out of it: copied
    /// out of a slot (which is free again), or with the buffers.
    fn into_arrived(self, wc: &WorkCompletion, pool: &SlotPool, route: &Route) -> Arrived {
        let len = wc.byte_len as usize;
        let body = if is_remote_write(wc) {
            // Nothing landed in the memory.
            drop(self.into_bufs(pool));
            Body::RemoteWrite { len }
        } else if let Some(e) = recv_error(wc) {
            drop(self.into_bufs(pool));
            Body::Failed(e)
        } else {
            let bufs = match self {
                RecvMem::Slot(slot) => {
                    let mut b = vec![BytesMut::zeroed(len)];
                    let copied = pool.scatter(pool.offset(slot), len, &mut b);
                    pool.put(slot);
                    copied.map(|_| b).map_err(|(e, _)| e)
                }
                RecvMem::Registered { mrs, empty } => {
                    let n = mrs.len();
                    let mut b = unregister(mrs);
                    if b.len() < n {
                        // A buffer whose registration could not be undone
                        // is leaked with its part of the message.
                        Err(Error::Io)
                    } else {
                        b.extend(empty);
                        trim_bufs(&mut b, len);
                        Ok(b)
                    }
                }
            };
            match bufs {
                Ok(bufs) => Body::Data { bufs, len },
                Err(e) => Body::Failed(e),
            }
        };
        Arrived {
            body,
            imm: wc.imm_data,
            route: route.clone(),
        }
    }
}

/// Where a completion is reported when its receive names no queue: the
/// CQ and counter of the endpoint a message arrived at (receives of a
/// shared context have none of their own; an endpoint's own receives
/// need none).
#[derive(Clone, Default)]
pub(super) struct Route {
    pub cq: Option<Arc<CqShared>>,
    pub cntr: Option<Arc<CounterShared>>,
}

impl Route {
    fn apply(&self, done: &mut OpDone) {
        if done.cq.is_none() {
            done.cq.clone_from(&self.cq);
        }
        if done.cntr.is_none() {
            done.cntr.clone_from(&self.cntr);
        }
    }
}

/// A message that did not end in its own receive: held until a receive
/// takes it.
pub(super) struct Arrived {
    body: Body,
    imm: Option<u32>,
    route: Route,
}

enum Body {
    /// `len` bytes, in `bufs` (cut to what they hold).
    Data { bufs: Vec<BytesMut>, len: usize },
    /// A write with remote CQ data of `len` bytes consumed the receive.
    RemoteWrite { len: usize },
    /// The device failed the receive (a message too long for the memory
    /// it landed in is `Trunc`).
    Failed(Error),
}

/// A receive waiting for a message.
pub(super) struct Waiting {
    /// Its work request id when it posted one; unique either way.
    id: u64,
    /// Whether the work request `id` is its own (its buffers or slot).
    own_wr: bool,
    pub done: OpDone,
    /// Its buffers, unless they are its work request's memory.
    pub bufs: Option<Vec<BytesMut>>,
}

impl Waiting {
    /// A receive with no work request of its own.
    pub fn new(id: u64, done: OpDone, bufs: Option<Vec<BytesMut>>) -> Waiting {
        Waiting {
            id,
            own_wr: false,
            done,
            bufs,
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
struct PostedWr<M> {
    mem: M,
    /// Its receive still waits for it.
    owned: bool,
}

/// The receives of one receive queue of the device: those waiting, in
/// post order; the work requests posted, by id; and the messages held
/// for the next receive, in arrival order. While a message is held no
/// receive waits (a receive that finds one takes it).
pub(super) struct RxQueue<M> {
    wrs: FastMap<u64, PostedWr<M>>,
    waiting: VecDeque<Waiting>,
    held: VecDeque<Arrived>,
}

impl<M: Shape> Default for RxQueue<M> {
    fn default() -> Self {
        RxQueue {
            wrs: fast_map(),
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
        });
    }

    /// Work request `id` completed: its memory, with its receive when
    /// that still waits for it (the message is that receive's). `None`
    /// for an id that is not posted here.
    pub fn landed(&mut self, id: u64, credits: &Credits) -> Option<(M, Option<Waiting>)> {
        let wr = self.wrs.remove(&id)?;
        if !wr.owned {
            return Some((wr.mem, None));
        }
        // On a queue pair the owner is the oldest waiting receive; a
        // shared queue's completions reach different CQs and may be
        // handled out of post order.
        let at = match self.waiting.front() {
            Some(w) if w.id == id => Some(0),
            _ => self.waiting.iter().position(|w| w.id == id),
        };
        let Some(w) = at.and_then(|i| self.waiting.remove(i)) else {
            return Some((wr.mem, None));
        };
        if w.gone() {
            credits.release(1);
            return Some((wr.mem, None));
        }
        Some((wr.mem, Some(w)))
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
    fn next_live(&mut self, credits: &Credits) -> Option<Waiting> {
        while let Some(mut w) = self.waiting.pop_front() {
            let gone = w.gone();
            let shape = self.disown(&w);
            if gone {
                credits.release(1);
                continue;
            }
            if w.bufs.is_none() {
                w.bufs = Some(like(&shape));
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
        match self.wrs.get_mut(&w.id) {
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
        let i = self
            .waiting
            .iter()
            .position(|w| w.done.context == context)?;
        let mut w = self.waiting.remove(i)?;
        credits.release(1);
        let shape = self.disown(&w);
        if w.bufs.is_none() {
            // An awaited receive is withdrawn because its future is gone:
            // nobody would see the buffers.
            w.bufs = Some(if w.done.waiter.is_some() {
                Vec::new()
            } else {
                like(&shape)
            });
        }
        Some(w)
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
                    self.wrs.remove(&w.id).map(|wr| wr.mem)
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

    /// Receives waiting (including withdrawn ones not yet found out).
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }
}

/// Zeroed buffers of the given lengths (zeroed allocations are not
/// touched until written).
fn like(shape: &[usize]) -> Vec<BytesMut> {
    shape.iter().map(|&n| BytesMut::zeroed(n)).collect()
}

/// A receive queue on the device with what completing its receives
/// needs: a queue pair's own, or a shared receive context's.
pub(super) struct RecvSide<'a> {
    pub q: &'a Mutex<RxQueue<RecvMem>>,
    pub credits: &'a Credits,
    /// Where its receives' slots come from.
    pub pool: &'a SlotPool,
}

impl RecvSide<'_> {
    /// A work completion of one of its receives, at an endpoint whose
    /// queues are `route`. False when the id is not posted here.
    pub fn on_completion(&self, wc: &WorkCompletion, route: &Route) -> bool {
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
    pub fn reroute(&self, mut a: Arrived, mut first: bool) {
        loop {
            let next = lock(self.q).route(a, first, self.credits);
            let Some((w, msg)) = next else { return };
            self.credits.release(1);
            match deliver(w, msg) {
                Some(back) => {
                    a = back;
                    first = true;
                }
                None => return,
            }
        }
    }

    /// Takes back a message whose receive's future was dropped after the
    /// message reached it: the oldest waiting receive gets it, or it is
    /// held ahead of every other message.
    pub fn give_back(&self, r: Returned) {
        let route = Route {
            cq: r.origin.cq,
            cntr: r.origin.cntr,
        };
        self.reroute(arrived_back(r.entry, route), true);
    }

    /// Withdraws the waiting receive with `context`; it ends with
    /// `Canceled` and its buffers. False if none waits.
    pub fn cancel(&self, context: u64) -> bool {
        let w = lock(self.q).cancel(context, self.credits);
        match w {
            Some(mut w) => {
                let bufs = w.bufs.take().unwrap_or_default();
                fail(w.done, bufs, Error::Canceled);
                true
            }
            None => false,
        }
    }
}

/// Ends receive `w` with message `a`, copied into its buffers. The
/// message comes back if the receive's future is gone.
pub(super) fn deliver(w: Waiting, a: Arrived) -> Option<Arrived> {
    let Waiting { mut done, bufs, .. } = w;
    a.route.apply(&mut done);
    let mut bufs = bufs.unwrap_or_default();
    let imm = a.imm;
    match &a.body {
        Body::Data { bufs: src, len } => {
            let placed = copy_into(src, &mut bufs);
            if placed < *len {
                let mut e = CqErrEntry::new(0, recv_flags(imm), Error::Trunc);
                trim_bufs(&mut bufs, placed);
                e.len = placed;
                e.olen = len - placed;
                e.data = u64::from(imm.unwrap_or(0));
                done.fail(e.with_bufs(bufs));
                return None;
            }
            finish_recv(done, bufs, placed, None, imm).map(|_| a)
        }
        Body::RemoteWrite { len } => finish_remote_write(done, bufs, *len, imm).map(|_| a),
        Body::Failed(e) => {
            fail(done, bufs, *e);
            None
        }
    }
}

/// Copies the bytes of `src` in order into `dst`; returns how many fit.
fn copy_into(src: &[BytesMut], dst: &mut [BytesMut]) -> usize {
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
fn fail(done: OpDone, mut bufs: Vec<BytesMut>, err: Error) {
    trim_bufs(&mut bufs, 0);
    done.fail(CqErrEntry::new(0, OpFlags::RECV | OpFlags::MSG, err).with_bufs(bufs));
}

impl CqSink for MsgShared {
    fn on_completion(&self, wc: &WorkCompletion) {
        self.probe.heard();
        if let Some(err) = fatal(wc) {
            // Before the failed operation completes: whoever hears of it
            // finds the endpoint disabled already.
            self.critical(err);
        }
        if wc.wr_id == super::probe::PROBE_WR_ID {
            self.probe.landed();
            return;
        }
        if wc.wr_id & super::stream::STREAM_WR_BIT != 0 {
            if let Some(core) = self.stream_core() {
                core.on_completion(wc);
            }
            return;
        }
        if wc.wr_id & SRX_WR_BIT != 0 {
            // A receive of the shared receive context, taken by a message
            // that arrived here.
            if let Some(srx) = self.srx() {
                srx.on_completion(wc, &self.cfg);
            }
            return;
        }
        if wc.wr_id & RECV_WR_BIT != 0 {
            if let Some(l) = lock(&self.link).clone() {
                self.recv_side(&l.recv_pool)
                    .on_completion(wc, &Route::default());
            }
            return;
        }
        let Some(Inflight { done, op }) = lock(&self.inflight).remove(wc.wr_id) else {
            return;
        };
        let len = match op {
            Held::Rma { len, kind, local } => return self.finish_rma(wc, done, len, kind, local),
            Held::SendInline { len } | Held::SendRegistered { len, .. } => len,
            Held::SendSlot { len, slot } => {
                if let Some(l) = lock(&self.link).as_ref() {
                    l.send_pool.put(slot);
                }
                len
            }
        };
        // A send: its registrations (if any) were dropped with `op`.
        self.tx.release(1);
        match wc.to_error() {
            None => done.complete(CqEntry {
                len,
                ..CqEntry::default()
            }),
            Some(e) => done.fail(CqErrEntry::new(0, OpFlags::SEND | OpFlags::MSG, e)),
        }
    }
}

impl MsgShared {
    /// Ends an RMA operation.
    fn finish_rma(
        &self,
        wc: &WorkCompletion,
        done: OpDone,
        len: usize,
        kind: OpFlags,
        local: RmaLocal,
    ) {
        self.tx.release(1);
        let bufs = local.into_bufs(wc.is_ok());
        match wc.to_error() {
            None => done.complete(CqEntry {
                len,
                bufs,
                ..CqEntry::default()
            }),
            Some(e) => done.fail(CqErrEntry::new(0, kind, e).with_bufs(bufs)),
        }
    }
}

/// The critical error a completion reports, if it is one: any failure but
/// a flush. A failed work request leaves an RC queue pair in the error
/// state (a bad key or address at the peer, a message longer than the
/// receive it landed in, retries exhausted because the peer is gone);
/// flushes only follow from that state, whatever caused it (such an
/// error, a disconnect, our own close).
fn fatal(wc: &WorkCompletion) -> Option<Error> {
    match wc.status {
        WcStatus::Success | WcStatus::WrFlushErr => None,
        // Reported as the receive's own error is.
        _ if wc.wr_id & (RECV_WR_BIT | SRX_WR_BIT) != 0 => recv_error(wc),
        _ => wc.to_error(),
    }
}

/// Ends receive `w` with the completion of its own work request, whose
/// memory is `mem` (the fast path: no copy beyond a slot's). The message
/// comes back if the receive's future is gone by now.
fn finish_in_place(
    w: Waiting,
    mem: RecvMem,
    wc: &WorkCompletion,
    pool: &SlotPool,
    route: &Route,
) -> Option<Arrived> {
    let Waiting { done, bufs, .. } = w;
    let back = match mem {
        RecvMem::Slot(slot) => {
            let mut bufs = bufs.unwrap_or_default();
            if is_remote_write(wc) {
                // Nothing landed in the slot: it is free again.
                pool.put(slot);
                finish_remote_write(done, bufs, wc.byte_len as usize, wc.imm_data)
            } else {
                let err = recv_error(wc);
                let mut placed = 0;
                if err.is_none() {
                    placed = pool
                        .scatter(pool.offset(slot), wc.byte_len as usize, &mut bufs)
                        .unwrap_or_else(|(_, placed)| placed);
                }
                pool.put(slot);
                finish_recv(done, bufs, placed, err, wc.imm_data)
            }
        }
        RecvMem::Registered { mrs, mut empty } => {
            let n = mrs.len();
            let mut bufs = unregister(mrs);
            let lost = bufs.len() < n;
            bufs.append(&mut empty);
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

/// The message of a completion whose receive's future went away, to hand
/// to the next receive (reported on the queues of `route`).
fn arrived_back(e: CqEntry, route: Route) -> Arrived {
    let imm = e
        .flags
        .contains(OpFlags::REMOTE_CQ_DATA)
        .then_some(e.data as u32);
    let body = if e.flags.contains(OpFlags::REMOTE_WRITE) {
        Body::RemoteWrite { len: e.len }
    } else {
        Body::Data {
            len: e.len,
            bufs: e.bufs,
        }
    };
    Arrived { body, imm, route }
}

/// `OpDone::complete`, except that a completion whose awaiting future is
/// gone comes back rather than being dropped.
fn hand_over(done: OpDone, entry: CqEntry) -> Option<CqEntry> {
    done.complete_from(entry, FI_ADDR_NOTAVAIL).map(|r| r.entry)
}

/// Whether a receive was consumed by the peer's RDMA write with
/// immediate (`fi_writedata`) rather than by a message. Only a successful
/// completion says which: a flushed one carries no opcode.
fn is_remote_write(wc: &WorkCompletion) -> bool {
    wc.is_ok() && wc.opcode == WcOpcode::RecvRdmaWithImm
}

/// Ends a receive consumed by a write with remote CQ data: the write's
/// target completion, reported as the RDM endpoint reports
/// `fi_writedata`'s (the flags of a remote write, not of a message; the
/// data; `len` the bytes written into the region), with the receive's
/// context and its buffers handed back untouched (empty). The entry
/// comes back if the receive's future is gone.
fn finish_remote_write(
    mut done: OpDone,
    mut bufs: Vec<BytesMut>,
    len: usize,
    imm: Option<u32>,
) -> Option<CqEntry> {
    done.flags = OpFlags::empty();
    trim_bufs(&mut bufs, 0);
    hand_over(
        done,
        CqEntry {
            context: 0,
            flags: OpFlags::RMA | OpFlags::REMOTE_WRITE | OpFlags::REMOTE_CQ_DATA,
            len,
            bufs,
            data: u64::from(imm.unwrap_or(0)),
            tag: 0,
            src: weft_core::addr::FI_ADDR_NOTAVAIL,
        },
    )
}

/// The error of a receive completion. A message longer than the posted
/// buffers ends the receive with a length error (rxe reports it as a local
/// QP operation error): to the application that is truncation.
fn recv_error(wc: &WorkCompletion) -> Option<Error> {
    match wc.status {
        WcStatus::LocLenErr | WcStatus::LocQpOpErr => Some(Error::Trunc),
        _ => wc.to_error(),
    }
}

fn recv_flags(imm: Option<u32>) -> OpFlags {
    let mut flags = OpFlags::RECV | OpFlags::MSG;
    if imm.is_some() {
        flags |= OpFlags::REMOTE_CQ_DATA;
    }
    flags
}

/// Completes a receive of `placed` bytes (buffers cut to what they
/// hold). A successful entry comes back if the receive's future is gone.
fn finish_recv(
    done: OpDone,
    mut bufs: Vec<BytesMut>,
    placed: usize,
    err: Option<Error>,
    imm: Option<u32>,
) -> Option<CqEntry> {
    let flags = recv_flags(imm);
    trim_bufs(&mut bufs, placed);
    match err {
        None => hand_over(
            done,
            CqEntry {
                context: 0,
                flags,
                len: placed,
                bufs,
                data: u64::from(imm.unwrap_or(0)),
                tag: 0,
                src: weft_core::addr::FI_ADDR_NOTAVAIL,
            },
        ),
        Some(e) => {
            done.fail(CqErrEntry::new(0, flags, e).with_bufs(bufs));
            None
        }
    }
}

#[cfg(test)]
#[path = "complete_tests.rs"]
mod tests;
