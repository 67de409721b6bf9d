//! The give-up of a connection that failed after its link was built
//! ([`MsgShared::give_up_link`]), and the task that ends what was posted
//! on its queue pair.
//!
//! librdmacm moves the queue pair to RTR and RTS as it handles the reply
//! (connect) or in `rdma_accept`, before `Established`, and `admit`
//! checks only that the endpoint is open and has a link: sends, RMA
//! operations and receives may be on the queue pair when it is given up,
//! and the device may still be working on them (soft-RoCE handles the
//! move to the error state in its own tasks). So nothing posted is ended
//! at the give-up itself. The queue pair goes to the error state, where
//! the device reports every work request it holds, each with its own
//! completion (a flush, or what it did before the move), and a task
//! ([`GivenUp`]) polls the CQ until every work request posted on it has
//! reported, at most [`LAST_WQE_WAIT`] after the move:
//!
//! * a send or RMA operation ends with its completion: a flush fails it
//!   `Canceled`, one the device completed before (a message the peer
//!   acked) succeeds; its credit and buffers come back then;
//! * a receive of the endpoint's own queue ends as on a live connection:
//!   a message that filled it (acked to its sender) completes it, a flush
//!   fails it `Canceled` with its own buffers (a pool buffer among them:
//!   the device is done with it, so `BufferPool::reclaim` takes it back);
//!   until then `cancel` withdraws it at once if its buffers are in hand
//!   (a bounce slot's), its work request left to the task, and leaves one
//!   in its own memory to that flush ([`super::retired`]);
//! * a shared receive context's receive that the queue pair took goes
//!   back to the context (as at a close: see `closing`).
//!
//! What has not reported by the bound (a device that neither flushes nor
//! answers in half a second) ends once the queue pair is destroyed: the
//! task, still polling the CQ, waits a second [`LAST_WQE_WAIT`] at most
//! until every work request reported or it holds the last reference to
//! the link (the connect or accept that gave up holds one until it
//! returns; `admit` or the probe only for an instant). Holding
//! the last, it destroys the queue pair, polls the CQ once more (what the
//! device completed up to then counts) and only then hands back the
//! memory of what is left. Should the link still be held then, those
//! operations fail without their memory, which is parked on the link and
//! goes after its queue pair (receives get zeroed buffers like their
//! own, as a withdrawn receive does: a pool buffer among that memory
//! stays lent until the link goes).
//!
//! Once the application closed the endpoint, the task ends its
//! operations without completions, as the close does; their memory still
//! comes back only as the device reports them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use weft_core::completion::{trim_bufs, CqEntry, CqErrEntry};
use weft_core::credits::Credits;
use weft_core::flags::OpFlags;
use weft_core::provider::ProviderSrx;
use weft_core::sync::{lock, FastMutex};
use weft_core::Error;

use super::closing::{fail_withdrawn, LAST_WQE_WAIT};
use super::complete::{reroute_on, Held, Inflight, RecvMem, RecvSide, Route, RxQueue, RECV_WR_BIT};
use super::post::InflightQueue;
use super::retired::{push_retired, RetiredSlot};
use super::srx::{route_of, MsgSrx, SRX_WR_BIT};
use super::{stream, Link, MsgShared};
use crate::async_reader::DeviceEvents;
use crate::cm_events::CmChannel;
use crate::cq_poller::{self, CqPoller};
use crate::device_events::{Closing, LastWqe};
use crate::slot_pool::SlotPool;
use crate::sys::WorkCompletion;
use crate::user_bufs::unregister_before;

/// How often the task polls the CQ while work requests of the endpoint's
/// own are outstanding: soft-RoCE flushes within milliseconds, and a
/// device that raises no event for a flush leaves nothing to wait on.
const POLL_TICK: Duration = Duration::from_millis(1);

impl MsgShared {
    /// A connect or accept that failed after building its link (every
    /// exit from then on): lets the link and the event reader go, so a
    /// later connect finds none, and the route of its id on `chan` (the
    /// channel the caller subscribed it on: a close racing this may have
    /// taken the endpoint's already). Unless the close came first: it
    /// owns them then (it takes the link after marking the endpoint
    /// closed, and this decides under the link's lock, so exactly one of
    /// the two has it). The queue pair may have passed RTR (librdmacm
    /// moves it as it handles the reply, or in `rdma_accept`): it goes to
    /// the error state, its last-WQE wait registered first if the
    /// endpoint is bound to a shared receive context. The connection
    /// never started, so no end will come for it.
    ///
    /// What was posted on the queue pair is ended by a task once the
    /// device reported it (see the module): the sends and RMA operations
    /// (none is posted on it any more), the receives of the endpoint's
    /// own queue (the messages it held go to the next queue at once), the
    /// shared receives it took. A stream's state, which holds the queue
    /// pair and its pinned buffers, goes with the link.
    pub(super) fn give_up_link(self: &Arc<Self>, chan: &CmChannel) {
        let taken = {
            let mut g = lock(&self.link);
            if self.is_closed() {
                None
            } else {
                g.take()
            }
        };
        let Some(l) = taken else { return };
        // While the id lives (its token cannot name a newer one yet).
        chan.unsubscribe(l.id.token());
        let sends = retire_sends(&self.inflight, &l.retired);
        let events = lock(&self.events).take();
        // A driver only if a step of `start` after the driver's start
        // failed (a failed driver start leaves none).
        let poller = cq_poller::stop(&self.poller);
        // Only a connection that failed has a stream still `Built`; a
        // later connect builds its own. Its core (pinned receive buffers
        // the queue pair may write) is dropped after the link.
        let core = {
            let mut s = lock(&self.stream);
            if matches!(*s, stream::Slot::Built(_)) {
                Some(std::mem::take(&mut *s))
            } else {
                None
            }
        };
        let Closing { last_wqe, moved_at } = lock(&self.qp_end).abandon(
            || events.as_ref().map(|e| e.last_wqe(l.qp.qp_num())),
            || {
                let _ = l.qp.to_error();
            },
        );
        let _ = l.id.disconnect();
        let since = moved_at.unwrap_or_else(Instant::now);
        let poller = poller.unwrap_or_else(|| cq_poller::detached(l.cq.clone()));
        // The endpoint's own receives are ended by the task; the messages
        // the queue held (arrived, no receive waiting) are the next
        // queue's at once, in order.
        // Under the link's lock, which `give_back` holds throughout: a
        // message given back goes either before the move (held first,
        // moved first) or after it with this queue in `retired_rx`
        // (after the queues of earlier give-ups whose tasks still live).
        let rxq = self.srx().is_none().then(|| {
            let _g = lock(&self.link);
            let q = Arc::new(retire_queue(&self.rxq, &self.rx));
            push_retired(&self.retired_rx, q.clone());
            q
        });
        let slot = rxq.clone().map(|q| RetiredSlot {
            ep: self.clone(),
            q,
        });
        let srx = self.cfg.srx.clone().filter(|_| self.srx().is_some());
        let task = GivenUp {
            ep: self.clone(),
            link: Some(l),
            poller,
            sends: FastMutex::new(sends),
            rxq,
            srx,
            route: route_of(&self.cfg),
            last_wqe,
            until: since + LAST_WQE_WAIT,
            core,
            slot,
            _events: events,
        };
        self.rt.spawn(task.run());
    }
}

/// The in-flight table, locked, to post an operation on the link whose
/// `retired` mark this is: `None` once the link was given up
/// ([`retire_sends`] took its operations), and the operation is refused.
pub(super) fn open_table<'a>(
    inflight: &'a FastMutex<InflightQueue>,
    retired: &AtomicBool,
) -> Option<weft_core::sync::FastGuard<'a, InflightQueue>> {
    let g = lock(inflight);
    // Read under the table's lock, as `retire_sends` sets it.
    (!retired.load(Ordering::Relaxed)).then_some(g)
}

/// Takes the sends and RMA operations posted on `l`'s queue pair, and
/// closes it to new ones: `post_send` and `post_rma` look at the mark
/// under the same lock before posting, so every operation on the queue
/// pair is either taken here or never posted (refused `NotConn`, as
/// without a link). Every entry in the table is `l`'s: a link is only
/// given up before its connection started, and each connect or accept
/// builds its link on an endpoint that had none.
pub(super) fn retire_sends(
    inflight: &FastMutex<InflightQueue>,
    retired: &AtomicBool,
) -> InflightQueue {
    let mut g = lock(inflight);
    // Under the table's lock, which orders it with the posts.
    retired.store(true, Ordering::Relaxed);
    std::mem::take(&mut *g)
}

/// The receive queue of a queue pair that was given up, taken out of
/// `rxq` with its waiting receives and posted work requests (their
/// completions end them, on the old queue); `rxq` is left empty for the
/// next queue pair but for the messages the old queue held (they arrived
/// and no receive took them: the next receive does), each held again, in
/// order.
///
/// A fresh queue rather than the old one kept for the next connection:
/// a retry posts its receives anew, none counts a dead work request as
/// spare, and no slot index names the old pool.
pub(super) fn retire_queue(
    rxq: &FastMutex<RxQueue<RecvMem>>,
    credits: &Credits,
) -> FastMutex<RxQueue<RecvMem>> {
    let mut g = lock(rxq);
    let mut old = std::mem::take(&mut *g);
    // A queue holds messages only while no receive waits, and the new
    // one has none.
    while let Some(a) = old.take_held() {
        // A failed receive or a write's notification belongs to the
        // failed connection: it would fail or misreport the next one's
        // first receive.
        if !a.is_message() {
            continue;
        }
        let none = g.route(a, false, credits);
        debug_assert!(none.is_none(), "a fresh queue has no receive");
    }
    FastMutex::new(old)
}

/// What a given-up queue pair still owes: the task that ends it.
struct GivenUp {
    ep: Arc<MsgShared>,
    /// The given-up link: its queue pair (in the error state), its CQ and
    /// the slots its operations use.
    /// `None` once the task destroyed it.
    link: Option<Arc<Link>>,
    poller: Arc<CqPoller>,
    /// The sends and RMA operations posted on it ([`retire_sends`]).
    sends: FastMutex<InflightQueue>,
    /// The endpoint's own receive queue of the connection
    /// ([`retire_queue`]); `None` on a shared receive context.
    rxq: Option<Arc<FastMutex<RxQueue<RecvMem>>>>,
    /// The shared receive context the queue pair took receives of.
    srx: Option<Arc<dyn ProviderSrx>>,
    route: Route,
    last_wqe: Option<LastWqe>,
    /// [`LAST_WQE_WAIT`] after the move to the error state.
    until: Instant,
    /// A stream's state: dropped after the link.
    core: Option<stream::Slot>,
    /// Keeps the device's event reader running through the wait.
    _events: Option<Arc<DeviceEvents>>,
    /// `rxq`'s place in `retired_rx`, given up with the task (or when
    /// its last step takes the queue to end what it holds).
    slot: Option<RetiredSlot>,
}

impl GivenUp {
    async fn run(mut self) {
        // Only a queue pair of a shared receive context waits for its
        // last WQE: the shared receives it took are not counted here.
        let mut heard = self.srx.is_none();
        loop {
            self.poll();
            let own = self.outstanding();
            if own == 0 && heard {
                break;
            }
            let now = Instant::now();
            if now >= self.until {
                break;
            }
            // Ticks while operations of ours are out; else only the event
            // (or the bound) ends the wait.
            let next = if own > 0 {
                (now + POLL_TICK).min(self.until)
            } else {
                self.until
            };
            match self.last_wqe.as_mut().filter(|_| !heard) {
                Some(w) => {
                    if tokio::time::timeout_at(next, w).await.is_ok() {
                        heard = true;
                    }
                }
                None => tokio::time::sleep_until(next).await,
            }
        }
        // What the event (or the bound) says is on the CQ by now.
        self.poll();
        tracing::debug!(
            qp = self.link.as_ref().map(|l| l.qp.qp_num()),
            last_wqe = heard,
            outstanding = self.outstanding(),
            "verbs msg: given-up queue pair polled"
        );
        self.finish(heard).await;
    }

    /// Work requests of the endpoint's own not reported yet.
    fn outstanding(&self) -> usize {
        lock(&self.sends).len() + self.rxq.as_ref().map_or(0, |q| lock(q).posted())
    }

    /// Polls the CQ empty while the task holds the link.
    fn poll(&self) {
        if let Some(l) = &self.link {
            self.poll_on(&l.send_pool, &l.recv_pool);
        }
    }

    /// Polls the CQ empty, ending what each completion reports; the
    /// memory of a bounce slot goes back to `send_pool` or `recv_pool`.
    /// Once the application closed the endpoint, its operations end
    /// without completions, as at a close (their memory still comes back
    /// only as the device reports them).
    fn poll_on(&self, send_pool: &SlotPool, recv_pool: &SlotPool) {
        // Read again for each completion (an atomic load): a close
        // during the drain leaves only the window a live connection's
        // completion has, not the rest of the drain.
        let forgotten = std::cell::Cell::new(false);
        let forget_if_closed = || {
            let closed = self.ep.is_closed();
            if let (true, false, Some(q)) = (closed, forgotten.get(), &self.rxq) {
                // Their work requests stay posted: a completion only
                // hands their memory back.
                drop(lock(q).forget());
                forgotten.set(true);
            }
            closed
        };
        forget_if_closed();
        let x = self
            .srx
            .as_ref()
            .and_then(|s| s.as_any().downcast_ref::<MsgSrx>());
        let side = self.rxq.as_ref().map(|q| RecvSide {
            q,
            credits: &self.ep.rx,
            pool: recv_pool,
        });
        let own_route = Route::default();
        self.poller.drain_into(&|wc| {
            if wc.wr_id & SRX_WR_BIT != 0 {
                if let Some(x) = x {
                    x.complete(wc, &self.route);
                }
            } else if wc.wr_id & RECV_WR_BIT != 0 {
                if let Some(side) = &side {
                    forget_if_closed();
                    side.on_completion(wc, &own_route);
                }
            } else if wc.wr_id & super::stream::STREAM_WR_BIT != 0
                || wc.wr_id == super::probe::PROBE_WR_ID
            {
                // The stream goes with the link; the probe never ran.
            } else {
                let op = lock(&self.sends).remove(wc.wr_id);
                if let Some(op) = op {
                    let report = !forget_if_closed();
                    end_op(op, Some(wc), Some(send_pool), &self.ep.tx, report);
                }
            }
        });
    }

    /// Waits, polling the CQ, until every work request of ours reported
    /// (`None`, the link still held by the task), or the task holds the
    /// last reference to the link, at most [`LAST_WQE_WAIT`]. Holding the
    /// last, it destroys the queue pair, then polls the CQ a last time
    /// (what the device reported up to the destruction is there: the
    /// poller holds the CQ) with the slot pools still alive, and returns
    /// them: the memory of what is left may go now. `None` with work
    /// requests outstanding: the link is still held elsewhere.
    async fn destroy(&mut self) -> Option<(SlotPool, SlotPool)> {
        let deadline = Instant::now() + LAST_WQE_WAIT;
        loop {
            self.poll();
            if self.outstanding() == 0 {
                return None;
            }
            // The queue pair's other holders are the link's and the
            // stream's state the task holds (dropped right after the
            // queue pair, so its buffers outlive it).
            let last = self.link.as_ref().is_some_and(|l| {
                let by_core = self
                    .core
                    .as_ref()
                    .and_then(stream::Slot::core)
                    .is_some_and(|c| Arc::strong_count(c) == 1 && c.holds(&l.qp));
                Arc::strong_count(l) == 1 && Arc::strong_count(&l.qp) == 1 + usize::from(by_core)
            });
            if let Some(l) = self.link.take_if(|_| last) {
                match Arc::try_unwrap(l) {
                    Ok(l) => return Some(self.destroy_link(l)),
                    Err(back) => self.link = Some(back),
                }
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(POLL_TICK).await;
        }
    }

    /// Destroys the queue pair at once if the task holds the last
    /// reference to it, polling the CQ right before and draining it
    /// after, as [`destroy`](Self::destroy) does. `None`, nothing done,
    /// if the link is held elsewhere. Runs for a queue pair of a shared
    /// receive context only, which never has a stream (refused on a
    /// stream endpoint): no stream state holds the queue pair.
    fn destroy_if_last(&mut self) -> Option<(SlotPool, SlotPool)> {
        let l = self.link.as_ref()?;
        let last = Arc::strong_count(l) == 1 && Arc::strong_count(&l.qp) == 1;
        let l = self.link.take_if(|_| last)?;
        match Arc::try_unwrap(l) {
            Ok(l) => Some(self.destroy_link(l)),
            Err(back) => {
                self.link = Some(back);
                None
            }
        }
    }

    /// Destroys the queue pair of a link the task holds alone: the CQ
    /// polled right before (some providers, mlx4 and mlx5, clean a
    /// destroyed queue pair's entries from the CQ, so the poll after it
    /// finds only what the provider left; rxe leaves them), the queue
    /// pair dropped, then a stream's state that held it (its buffers
    /// outlive the queue pair), the CQ drained again, then the memory
    /// parked on the link. The slot pools are handed back for what is
    /// left to end.
    fn destroy_link(&mut self, l: Link) -> (SlotPool, SlotPool) {
        let Link {
            qp,
            send_pool,
            recv_pool,
            parked,
            ..
        } = l;
        self.poll_on(&send_pool, &recv_pool);
        drop(qp);
        drop(self.core.take());
        self.poll_on(&send_pool, &recv_pool);
        drop(parked);
        (send_pool, recv_pool)
    }

    /// Ends what is left once the polls are over: the messages the old
    /// queue holds go to the endpoint's queue; operations the device did
    /// not report end once the queue pair is destroyed, or, should the
    /// link still be held by then, at once with their memory parked on
    /// the link.
    ///
    /// `heard`: false while a queue pair of a shared receive context
    /// never had its last-WQE event: shared receives it took may be
    /// reported yet, so it is destroyed and the CQ drained even with none
    /// of ours outstanding, when the task holds the last reference.
    async fn finish(mut self, heard: bool) {
        let mut pools = None;
        if self.outstanding() > 0 {
            // Their memory is handed back only once the queue pair is
            // destroyed (the stream's state, whose buffers are its own
            // registrations, goes right after it).
            pools = self.destroy().await;
            // Our sends may all report during the wait, with the
            // shared receives the queue pair took still unheard of.
            if pools.is_none() && !heard {
                pools = self.destroy_if_last();
            }
        } else if !heard {
            pools = self.destroy_if_last();
        }
        let report = !self.ep.is_closed();
        let GivenUp {
            ep,
            link,
            sends,
            rxq,
            core,
            slot,
            ..
        } = self;
        let mut sends = sends.into_inner();
        // From now on a message given back goes to the other retired
        // queues or the endpoint's queue only, and `cancel` looks no more
        // here (its receives are about to end, `Canceled` or completed).
        drop(slot);
        let mut old = rxq
            .map(|q| {
                let mut g = lock(&q);
                std::mem::take(&mut *g)
            })
            .unwrap_or_default();
        // Late messages of the failed connection, after those carried at
        // the give-up (unless the endpoint closed: dropped as at a close,
        // its receives forgotten).
        if report {
            carry_held(&mut old, &ep.rxq, &ep.rx);
        } else {
            drop(old.forget());
        }
        let all = sends.is_empty() && old.posted() == 0;
        let waiting = old.drain();
        match link {
            None => {
                tracing::debug!("verbs msg: given-up queue pair destroyed before its last reports");
                let send_pool = pools.as_ref().map(|(s, _)| s);
                while let Some(op) = sends.pop_front() {
                    end_op(op, None, send_pool, &ep.tx, report);
                }
                fail_left(waiting, &ep.rx, report);
                drop(old);
                drop(pools);
            }
            Some(link) if all => {
                // Every work request reported: the device is done with
                // all their memory. Receives still waiting got no message
                // and no flush of their own (none should be left).
                fail_left(waiting, &ep.rx, report);
                drop(link);
                drop(core);
            }
            Some(link) => {
                tracing::warn!(
                    qp = link.qp.qp_num(),
                    "verbs msg: given-up queue pair still held: its operations fail without their memory"
                );
                let mut memory: Vec<Box<dyn Send>> = Vec::new();
                while let Some(Inflight { done, op }) = sends.pop_front() {
                    ep.tx.release(1);
                    let kind = match &op {
                        Held::Rma { kind, .. } => *kind,
                        _ => OpFlags::SEND | OpFlags::MSG,
                    };
                    memory.push(Box::new(op));
                    if report {
                        done.fail(CqErrEntry::new(0, kind, Error::Canceled));
                    }
                }
                let n = waiting.len();
                // Empty once closed (forgotten above).
                memory.push(Box::new(fail_withdrawn(waiting)));
                ep.rx.release(n);
                // The withdrawn work requests' memory is in the queue.
                memory.push(Box::new(old));
                // The stream's state: its buffers may be on the queue
                // pair yet.
                if let Some(core) = core {
                    memory.push(Box::new(core));
                }
                // Dropped with the link, after its queue pair: a pool
                // buffer among it stays lent until then.
                lock(&link.parked).extend(memory);
                drop(link);
            }
        }
    }
}

/// Hands the messages `old` holds to `next` (its oldest waiting receive,
/// or held), in order; an arrival that is no message (a failed receive,
/// a write with remote CQ data) is the failed connection's and goes.
pub(super) fn carry_held(
    old: &mut RxQueue<RecvMem>,
    next: &FastMutex<RxQueue<RecvMem>>,
    credits: &Credits,
) {
    while let Some(a) = old.take_held() {
        if a.is_message() {
            reroute_on(next, credits, a, false);
        }
    }
}

/// Fails each receive of `waiting` `Canceled` with its buffers (a
/// registered receive's own, taken from their registrations), its credit
/// released: the device is done with them (every work request reported,
/// or the queue pair destroyed). A bounce slot is dropped with its pool.
fn fail_left(
    waiting: Vec<(super::complete::Waiting, Option<RecvMem>)>,
    credits: &Credits,
    report: bool,
) {
    let n = waiting.len();
    for (mut w, mem) in waiting {
        if !report {
            // Closed: its memory goes, without a completion.
            drop((w, mem));
            continue;
        }
        let mut bufs = w.bufs.take().unwrap_or_default();
        if let Some(RecvMem::Registered { mrs, empty }) = mem {
            bufs = unregister_before(mrs, empty);
        }
        trim_bufs(&mut bufs, 0);
        w.done.fail(
            CqErrEntry::new(0, OpFlags::RECV | OpFlags::MSG, Error::Canceled).with_bufs(bufs),
        );
    }
    credits.release(n);
}

/// Ends a send or RMA operation of a given-up queue pair with its work
/// completion, or `Canceled` without one (the queue pair destroyed
/// first): its credit and memory come back (a bounce slot to
/// `send_pool`, while it exists). A completion the device made before the
/// flush stands: the peer acked that message.
pub(super) fn end_op(
    op: Inflight,
    wc: Option<&WorkCompletion>,
    send_pool: Option<&SlotPool>,
    tx: &Credits,
    report: bool,
) {
    let Inflight { done, op } = op;
    tx.release(1);
    // Closed: ends as its memory goes, without a completion.
    let done = Some(done).filter(|_| report);
    let err = match wc {
        Some(wc) => wc.to_error(),
        None => Some(Error::Canceled),
    };
    let len = match op {
        Held::Rma { len, kind, local } => {
            let bufs = local.into_bufs(err.is_none());
            match err {
                None => {
                    if let Some(d) = done {
                        d.complete(CqEntry {
                            len,
                            bufs,
                            ..CqEntry::default()
                        });
                    }
                }
                Some(e) => {
                    if let Some(d) = done {
                        d.fail(CqErrEntry::new(0, kind, e).with_bufs(bufs));
                    }
                }
            }
            return;
        }
        // Its memory (registrations, a pool buffer) goes before the
        // completion is reported: whoever hears of it may reuse it.
        send => match send {
            Held::SendSlot { len, slot } => {
                if let Some(p) = send_pool {
                    p.put(slot);
                }
                len
            }
            Held::SendInline { len }
            | Held::SendQuiet { len }
            | Held::SendRegistered { len, .. }
            | Held::SendOne { len, .. }
            | Held::SendPool { len, .. } => len,
            Held::Rma { len, .. } => len,
        },
    };
    match err {
        None => {
            if let Some(d) = done {
                d.complete(CqEntry {
                    len,
                    ..CqEntry::default()
                });
            }
        }
        Some(e) => {
            if let Some(d) = done {
                d.fail(CqErrEntry::new(0, OpFlags::SEND | OpFlags::MSG, e));
            }
        }
    }
}

#[cfg(test)]
#[path = "give_up_tests.rs"]
mod tests;
