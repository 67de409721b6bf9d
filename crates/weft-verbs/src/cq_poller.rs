//! Who polls a verbs CQ: a Tokio task woken through the completion
//! channel (interrupt and inline modes), a spinning thread (busy-poll), and
//! in inline and busy-poll modes also the task waiting for a completion
//! (the busy-poll thread parks while that task polls).
//!
//! The interrupt sequence never loses a wake-up: arm the CQ, then poll it
//! empty, then sleep on the channel; after a wake-up, poll (dispatching
//! what the event announced, and letting the tasks it woke run), take and
//! acknowledge the channel's event (one at most: see `start`), re-arm,
//! and poll again before sleeping. A completion that lands between a poll
//! and the re-arm is found by the poll that follows the re-arm.
//!
//! In inline mode the CQ is left unarmed while a waiter spins on it
//! (`stand_aside`): the waiter finds every completion itself, and an armed
//! CQ would only add a completion event per message — the reactor's
//! `epoll_wait`, a `read` of the channel and a re-arming `ioctl`, on the
//! core the spinner or the peer needs. Once the waiter sleeps (`idle`) or
//! stops polling (its hold lapses), the driver re-arms and polls again,
//! so a completion that landed in between is found by that poll.
//!
//! In busy-poll mode the spinning thread parks while a waiter holds the
//! CQ (`SpinHold`) and is woken when the hold ends by a task on the
//! runtime (`watch_holds`), not by a timeout of its own: a thread that
//! woke at the end of each hold to find it renewed cost a timer
//! interrupt and two context switches on the waiter's core a
//! millisecond, which with one CPU per process in the rxe VM (round trips
//! of hundreds of microseconds) is about one a round trip. Its own naps
//! grow while the hold is renewed (up to `MAX_NAP_NS`, 8 ms): they bound
//! the takeover only when the runtime does not run the task (a
//! current-thread runtime the application does not drive just then).
//! The watcher's timer is the runtime's (whole milliseconds, looked at
//! between tasks), so the takeover after a hold lapses takes 1–2 ms
//! where the thread's own timeout took 1.
//!
//! Polling and dispatch happen under one lock, so completions reach the
//! endpoint in the order the CQ gave them whoever polls.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};

use tokio::runtime::Handle;
use tokio::sync::Notify;
use weft_core::completion::WaitMode;
use weft_core::progress::{Progress, SpinHold, MAX_NAP_NS};
use weft_core::sync::{lock, FastMutex};
use weft_core::Result;

use crate::sys::{CompChannel, Cq, WorkCompletion};

/// Completions per poll call.
const BATCH: usize = 32;

/// Where polled work completions go.
pub trait CqSink: Send + Sync {
    /// One work completion, in CQ order.
    fn on_completion(&self, wc: &WorkCompletion);
}

/// A CQ and the lock that orders its polling.
pub struct CqPoller {
    cq: Arc<Cq>,
    buf: FastMutex<Vec<WorkCompletion>>,
    sink: Weak<dyn CqSink>,
    /// Busy-poll: the spinning thread parks while a waiter polls. Inline:
    /// the CQ stays unarmed while a waiter polls.
    hold: SpinHold,
    /// Inline: told when the waiter stops spinning and sleeps.
    waiter_idle: Notify,
    /// Busy-poll: told when the spinning thread parks beside a waiter
    /// (and when it ends), so that `watch_holds` times the hold's end.
    parked: Notify,
    /// Tests: the shortest nap beside a renewed hold, so that only the
    /// watcher can end one in time.
    #[cfg(test)]
    nap_floor: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for CqPoller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CqPoller").field("cq", &self.cq).finish()
    }
}

impl CqPoller {
    /// Polls the CQ empty and dispatches; `None` when the sink is gone.
    /// A poller that finds another one at work returns at once unless
    /// `wait` (that one is draining the same queue).
    pub fn drain(&self, wait: bool) -> Option<usize> {
        // The sink is upgraded only once there is something to hand it:
        // most inline passes find the CQ empty, and an upgrade is a
        // compare-and-swap and a release per pass. Whether it is gone
        // at all is one load.
        if self.sink.strong_count() == 0 {
            return None;
        }
        // Before the batch's guard: dropped after it, so an endpoint whose
        // last handle this is tears down with the batch unlocked.
        let mut sink: Option<Arc<dyn CqSink>> = None;
        let mut buf = if wait {
            lock(&self.buf)
        } else {
            match self.buf.try_lock() {
                Some(g) => g,
                None => return Some(0),
            }
        };
        self.poll_empty(&mut buf, |wcs| {
            if sink.is_none() {
                // Gone since the check above: its completions have
                // nobody to reach.
                sink = Some(self.sink.upgrade()?);
            }
            if let Some(sink) = &sink {
                for wc in wcs {
                    sink.on_completion(wc);
                }
            }
            Some(())
        })
    }

    /// Polls the CQ empty one last time, after its endpoint closed (the
    /// sink may be gone), handing each completion to `f` instead of the
    /// sink: what the closing endpoint still owes to others (a shared
    /// receive context's receives) goes there.
    pub fn drain_into(&self, f: &dyn Fn(&WorkCompletion)) -> usize {
        let mut buf = lock(&self.buf);
        self.poll_empty(&mut buf, |wcs| {
            wcs.iter().for_each(f);
            Some(())
        })
        .unwrap_or(0)
    }

    /// Polls into `buf` until the CQ is empty, handing each non-empty
    /// batch to `each`; `None` when `each` gives up.
    fn poll_empty(
        &self,
        buf: &mut Vec<WorkCompletion>,
        mut each: impl FnMut(&[WorkCompletion]) -> Option<()>,
    ) -> Option<usize> {
        let mut total = 0;
        loop {
            buf.clear();
            let n = match self.cq.poll(buf, BATCH) {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(error = %e, "ibv_poll_cq failed");
                    return Some(total);
                }
            };
            if n > 0 {
                each(buf)?;
            }
            total += n;
            if n < BATCH {
                return Some(total);
            }
        }
    }
}

/// The slot through which inline waiters find the CQ once it exists.
/// Locked on every inline pass: a lock without poisoning.
pub type PollerSlot = Arc<FastMutex<Option<Arc<CqPoller>>>>;

/// An empty [`PollerSlot`].
pub fn new_slot() -> PollerSlot {
    Arc::new(FastMutex::new(None))
}

/// Inline passes between two clock reads for the hold: far fewer than a
/// hold lasts (a pass is a CQ poll, the hold a millisecond).
const CLOCK_EVERY: u32 = 8;

/// Inline progress of a verbs endpoint: one poll of its CQ.
#[derive(Debug)]
pub struct InlinePoll {
    slot: PollerSlot,
    /// Passes since the hold was last taken.
    passes: AtomicU32,
    /// How long the endpoint's awaited operations wait.
    hint: weft_core::progress::SpinHint,
}

impl InlinePoll {
    /// Polls whatever CQ `slot` holds.
    pub fn new(slot: PollerSlot) -> InlinePoll {
        InlinePoll {
            slot,
            passes: AtomicU32::new(0),
            hint: Default::default(),
        }
    }
}

impl Progress for InlinePoll {
    fn spin_hint(&self) -> Option<&weft_core::progress::SpinHint> {
        Some(&self.hint)
    }

    fn cheap_pass(&self) -> bool {
        // A pass polls the CQ ring in user memory (no system call, one
        // queue however many connections feed it).
        true
    }

    fn progress(&self) -> usize {
        let p = lock(&self.slot).clone();
        p.and_then(|p| {
            // The hold is taken again once in CLOCK_EVERY passes: a clock
            // read per pass was a tenth of the inline path's instructions.
            let k = self.passes.fetch_add(1, Ordering::Relaxed);
            if k % CLOCK_EVERY == 0 {
                p.hold.waiter_active();
            }
            p.drain(false)
        })
        .unwrap_or(0)
    }

    fn idle(&self) {
        // The next pass takes the hold again.
        self.passes.store(0, Ordering::Relaxed);
        if let Some(p) = lock(&self.slot).as_ref() {
            p.hold.waiter_idle();
            p.waiter_idle.notify_waiters();
        }
    }
}

/// Inline: returns once no waiter spins on `p`'s CQ (it went to sleep or
/// its hold lapsed), so that the driver re-arms the CQ only then.
async fn stand_aside(p: &CqPoller) {
    weft_core::spin_hold::stand_aside(&p.hold, || p.waiter_idle.notified(), tokio::time::sleep)
        .await;
}

/// Busy-poll: wakes the spinning thread of `poller` each time a hold it
/// parked beside ends (the waiter stopped polling without going idle),
/// on a timer of the runtime instead of one of the thread's own. Ends
/// with the thread (its poller gone from `slot`, or its sink dropped).
async fn watch_holds(slot: PollerSlot, poller: Arc<CqPoller>) {
    let p = &poller;
    weft_core::spin_hold::wake_at_lapse(
        &p.hold,
        || p.parked.notified(),
        || is_live(&slot, p) && p.sink.strong_count() > 0,
        || p.waiter_idle.notified(),
        tokio::time::sleep,
    )
    .await;
}

/// Whether `slot` still holds `poller` (a close empties it).
fn is_live(slot: &PollerSlot, poller: &Arc<CqPoller>) -> bool {
    lock(slot).as_ref().is_some_and(|p| Arc::ptr_eq(p, poller))
}

/// Empties `slot` at close: a busy-poll thread ends at once, even one
/// parked beside a waiter, and its watcher with it. Returns the poller,
/// for a last drain.
pub fn stop(slot: &PollerSlot) -> Option<Arc<CqPoller>> {
    let p = lock(slot).take()?;
    p.hold.waiter_idle();
    p.waiter_idle.notify_waiters();
    p.parked.notify_one();
    Some(p)
}

/// A poller of `cq` that no driver runs and no sink hears, for the last
/// polls ([`CqPoller::drain_into`]) of a queue pair whose driver never
/// started (a close or failure during connection setup).
pub fn detached(cq: Arc<Cq>) -> Arc<CqPoller> {
    struct NoSink;
    impl CqSink for NoSink {
        fn on_completion(&self, _: &WorkCompletion) {}
    }
    poller_of(cq, Weak::<NoSink>::new())
}

fn poller_of(cq: Arc<Cq>, sink: Weak<dyn CqSink>) -> Arc<CqPoller> {
    Arc::new(CqPoller {
        cq,
        buf: FastMutex::new(Vec::with_capacity(BATCH)),
        sink,
        hold: SpinHold::default(),
        waiter_idle: Notify::new(),
        parked: Notify::new(),
        #[cfg(test)]
        nap_floor: std::sync::atomic::AtomicU64::new(0),
    })
}

/// Starts the driver of `cq` for `wait` and puts its poller in `slot`.
/// The driver holds `sink` weakly, so the endpoint's drop ends it. Returns
/// the task to abort when the endpoint closes (busy-poll: the thread's
/// watcher; the thread and its watcher also stop by themselves once the
/// sink is gone or `slot` is emptied).
/// On failure `slot` is left empty: no driver runs, and a later poll of
/// the CQ makes its own poller.
pub fn start<S: CqSink + 'static>(
    rt: &Handle,
    wait: WaitMode,
    cq_chan: (Arc<Cq>, Arc<CompChannel>),
    sink: &Arc<S>,
    slot: &PollerSlot,
) -> Result<Option<tokio::task::AbortHandle>> {
    let started = start_in(rt, wait, cq_chan, sink, slot);
    if started.is_err() {
        lock(slot).take();
    }
    started
}

fn start_in<S: CqSink + 'static>(
    rt: &Handle,
    wait: WaitMode,
    (cq, chan): (Arc<Cq>, Arc<CompChannel>),
    sink: &Arc<S>,
    slot: &PollerSlot,
) -> Result<Option<tokio::task::AbortHandle>> {
    let sink: Weak<S> = Arc::downgrade(sink);
    let sink: Weak<dyn CqSink> = sink;
    let poller = poller_of(cq.clone(), sink);
    *lock(slot) = Some(poller.clone());
    if wait == WaitMode::BusyPoll {
        let watch = rt.spawn(watch_holds(slot.clone(), poller.clone()));
        let slot = slot.clone();
        let spawned = std::thread::Builder::new()
            .name("weft-verbs-busy".into())
            .spawn(move || {
                busy_loop(&slot, &poller);
                // The watcher ends with the thread.
                poller.parked.notify_one();
            });
        if spawned.is_err() {
            watch.abort();
            return Err(weft_core::Error::NoMem);
        }
        return Ok(Some(watch.abort_handle()));
    }
    let afd = {
        let _g = rt.enter();
        chan.register_async()?
    };
    cq.req_notify(false)?;
    let inline = wait == WaitMode::Inline;
    let t = rt.spawn(async move {
        let mut armed = true;
        loop {
            if !armed {
                stand_aside(&poller).await;
                if let Err(e) = cq.req_notify(false) {
                    tracing::error!(error = %e, "CQ driver stops: re-arm failed");
                    return;
                }
                armed = true;
            }
            if poller.drain(true).is_none() {
                return;
            }
            // `poll_read_ready`, not `readable()`: the waker is kept in the
            // reactor's slot for the one reader (this task is the channel's
            // only one), where a `readable()` future is linked into the
            // list of waiters under its lock and unlinked at its end, on
            // every wake-up (`docs/benchmarks.md`, "Interrupt mode: the
            // sleep's own cost").
            let mut guard = match std::future::poll_fn(|cx| afd.poll_read_ready(cx)).await {
                Ok(g) => g,
                Err(e) => {
                    tracing::error!(error = %e, "CQ driver stops: channel wait failed");
                    return;
                }
            };
            // The event says completions wait: hand them over first and
            // let the tasks they wake run (an answer posted at once),
            // then take the event and re-arm. The channel's `read` and
            // the re-arming `ioctl` are then made while the peer works,
            // not between a completion and the application's answer to
            // it. Nothing is lost meanwhile: a completion that lands
            // while the CQ is disarmed is found by the poll after the
            // re-arm (top of the loop).
            match poller.drain(true) {
                None => return,
                Some(0) => {}
                Some(_) => weft_core::progress::requeue().await,
            }
            // The channel is this CQ's alone and the CQ is re-armed only
            // once its event is taken, so one read takes every event there
            // is; reading on to `EAGAIN` cost a system call per wake-up.
            // No event (a readiness without one): the CQ is still armed.
            let event = match chan.get_event() {
                Ok(ev) => ev,
                Err(e) => {
                    tracing::error!(error = %e, "CQ driver stops: channel read failed");
                    return;
                }
            };
            guard.clear_ready();
            if event.is_none() {
                continue;
            }
            if inline {
                // Re-armed at the top of the loop, once no waiter spins.
                armed = false;
            } else if let Err(e) = cq.req_notify(false) {
                tracing::error!(error = %e, "CQ driver stops: re-arm failed");
                return;
            }
        }
    });
    Ok(Some(t.abort_handle()))
}

/// The busy-poll thread: polls the CQ while no waiter does, parks while
/// one does, until `slot` no longer holds `poller` or the sink is gone.
fn busy_loop(slot: &PollerSlot, poller: &Arc<CqPoller>) {
    // The length of the last nap beside a hold (0: not parked).
    let mut nap = 0;
    loop {
        if !is_live(slot, poller) {
            return;
        }
        if poller.hold.remaining_ns() > 0 {
            // The watcher times this hold's end from here. Said before
            // the thread parks, and after it is registered as the one to
            // unpark: a hold that ends meanwhile is seen by the park's
            // own look, or by the watcher's unpark, which a park not
            // begun yet still takes.
            poller.hold.register_spinner();
            poller.parked.notify_one();
            #[cfg(test)]
            let max = {
                let floor = poller.nap_floor.load(std::sync::atomic::Ordering::Relaxed);
                nap = nap.max(floor);
                MAX_NAP_NS.max(floor)
            };
            #[cfg(not(test))]
            let max = MAX_NAP_NS;
            if poller.hold.park_while_held_backoff(&mut nap, max) {
                continue;
            }
        } else {
            nap = 0;
        }
        if poller.drain(true).is_none() {
            return;
        }
        // Give the core away between passes: on a machine with fewer
        // cores than spinners a bare spin starves the very threads it
        // completes work for.
        std::thread::yield_now();
    }
}

#[cfg(all(test, feature = "rdma"))]
#[path = "cq_poller_tests.rs"]
mod tests;
