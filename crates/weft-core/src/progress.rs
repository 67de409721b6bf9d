//! Inline progress: the task that waits for a completion drives the
//! provider itself instead of waiting for another thread to do it.
//!
//! This is libfabric's manual-progress model (`fi_cq_read` makes progress)
//! done the async way: a reader of an inline CQ, or the future of an
//! awaited operation on an inline endpoint, calls the bound endpoints'
//! [`Progress`] hooks for a bounded spin budget before it sleeps. The
//! completion is then produced on the thread that consumes it, with no
//! cross-thread wake-up on the latency path; after the budget the reactor
//! (which still drives the endpoint) takes over, so an idle reader costs no
//! CPU.

use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::task::Context;
use std::thread::Thread;
use std::time::{Duration, Instant};

/// Something that can make progress when asked, without blocking.
pub trait Progress: Send + Sync + Debug {
    /// Does whatever I/O is ready (non-blocking) and delivers the
    /// completions it produces; returns how many units of work it did
    /// (0: nothing was ready). Must never block or wait.
    fn progress(&self) -> usize;

    /// The waiter that was driving this stopped spinning (its budget ran
    /// out) and now sleeps until the reactor wakes it: whatever was held
    /// back while it spun must watch for I/O again.
    fn idle(&self) {}

    /// Whether one [`progress`](Self::progress) pass costs a few hundred
    /// instructions at most whatever the endpoint holds (memory reads, or
    /// one system call on one socket), so that a CQ reader may make
    /// [`PASSES_PER_POLL`] of them before it gives its thread back. A
    /// provider whose pass grows with its connections (a read per
    /// connection) keeps the default, [`FEW_PASSES_PER_POLL`]: sixteen
    /// of those would hold a current-thread runtime's other tasks back.
    fn cheap_pass(&self) -> bool {
        false
    }

    /// What the awaited operations of this endpoint have learned of how
    /// long their waits last, for their spin budget ([`SpinHint`]);
    /// `None`: the configured budget, for them and for the completion
    /// queue readers that drive this endpoint alone. A provider whose
    /// pass polls memory (a CQ ring, a shared segment) learns; one whose
    /// pass reads sockets does not: a reader that keeps reading a
    /// socket the sender is filling costs the sender (tcp at 1 MiB lost
    /// 7 % of its bandwidth with a learned budget, `docs/benchmarks.md`).
    fn spin_hint(&self) -> Option<&SpinHint> {
        None
    }
}

pub use crate::spin_hint::{spin_budget, SpinHint, DEFAULT_SPIN_US};

/// How long after its last pass a waiter still counts as spinning: covers
/// the gap between one awaited operation and the next.
pub const HOLD_NS: u64 = 1_000_000;

/// The longest a busy-poll thread parked beside a waiter that keeps
/// renewing its hold sleeps before it looks again
/// ([`SpinHold::park_while_held_backoff`]). It bounds the takeover when
/// nobody else wakes the thread at the hold's end (its watcher runs on
/// the endpoint's runtime, which a current-thread runtime runs only
/// while the application drives it): 8 holds, not more, so a waiter
/// that stops polling while its runtime is not driven leaves the
/// endpoint without progress for at most that long (a thread waking
/// once a hold, as before, cost the waiter's core two context switches
/// a millisecond).
pub const MAX_NAP_NS: u64 = 8 * HOLD_NS;

/// Lets the tasks woken so far run, then resumes: the task wakes itself
/// once and yields, which queues it behind them on both Tokio
/// schedulers (a task woken while it runs goes to the back of the run
/// queue). Not `tokio::task::yield_now`, which defers the task until the
/// scheduler has polled its I/O driver — an `epoll_wait` with a zero
/// timeout each time on a current-thread runtime, and there a write to
/// the runtime's own wake-up eventfd, answered by one more
/// `epoll_wait`, once the deferred task is woken (`docs/benchmarks.md`,
/// "Interrupt mode at 64 B: the driver's yields"). The runtime still polls
/// its driver on its own schedule (every 61 tasks), so a task that
/// requeues itself in a loop does not starve I/O. On a multi-thread
/// runtime an idle worker may take the task meanwhile, so there the
/// order is likely, not certain.
pub async fn requeue() {
    let mut queued = false;
    std::future::poll_fn(|cx| {
        if queued {
            return std::task::Poll::Ready(());
        }
        queued = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
    .await
}

/// Monotonic nanoseconds since the first call in this process.
pub fn clock_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Busy-poll hand-over between the waiter and the endpoint's spinning
/// thread: while a waiter drives progress itself the spinner parks, so
/// one process spins on one core and not two. A spinner beside a spinning
/// waiter only takes cores from the waiter and the peer (on two cores,
/// 4x libfabric's latency against about 0.8x without it).
#[derive(Debug, Default)]
pub struct SpinHold {
    until: AtomicU64,
    spinner: Mutex<Option<Thread>>,
}

impl SpinHold {
    /// A waiter is driving progress now (and for [`HOLD_NS`] after).
    pub fn waiter_active(&self) {
        self.waiter_active_at(clock_ns());
    }

    /// [`waiter_active`](Self::waiter_active) with the time (`clock_ns`)
    /// the caller read already: a spinning waiter reads the clock once per
    /// pass, not once per use.
    pub fn waiter_active_at(&self, now: u64) {
        self.until.store(now + HOLD_NS, Ordering::Release);
    }

    /// The waiter sleeps now: the spinner takes over at once.
    pub fn waiter_idle(&self) {
        self.until.store(0, Ordering::Release);
        let t = self.spinner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = t.as_ref() {
            t.unpark();
        }
    }

    /// Nanoseconds the hold still lasts (0: no waiter is spinning).
    pub fn remaining_ns(&self) -> u64 {
        self.until
            .load(Ordering::Acquire)
            .saturating_sub(clock_ns())
    }

    /// Spinner side: parks the calling thread while a waiter holds the
    /// endpoint (woken by [`SpinHold::waiter_idle`] or when the hold
    /// ends). Returns true when it parked, so the caller re-checks
    /// whether it should still run before polling.
    pub fn park_while_held(&self) -> bool {
        // A first nap every time: what is left of the hold.
        self.park_while_held_backoff(&mut 0, 0)
    }

    /// [`park_while_held`](Self::park_while_held) for a spinner whose
    /// wake-up at the hold's end someone else sees to
    /// ([`unpark_spinner`](Self::unpark_spinner), from a timer that
    /// costs no thread switch): the first nap of a hold lasts what is
    /// left of it, and each nap after it that finds the hold renewed
    /// twice the one before, up to `max_ns`. Parking for what is left
    /// each time woke the spinner once a [`HOLD_NS`] for as long as a
    /// waiter spun: a timer interrupt and two context switches on the
    /// waiter's core, about once a round trip where round trips take
    /// hundreds of microseconds (the rxe VM under emulation). The naps
    /// are what bounds the takeover if nobody wakes the spinner. `nap`: the
    /// last nap in nanoseconds, kept by the caller between calls (0 when
    /// the hold was not taken at the last look).
    pub fn park_while_held_backoff(&self, nap: &mut u64, max_ns: u64) -> bool {
        if self.remaining_ns() == 0 {
            *nap = 0;
            return false;
        }
        self.register_spinner();
        let left = self.remaining_ns();
        if left == 0 {
            *nap = 0;
            return false;
        }
        *nap = next_nap(*nap, left, max_ns);
        std::thread::park_timeout(Duration::from_nanos(*nap));
        true
    }

    /// Wakes the parked spinner without ending the hold: it looks at
    /// the hold again (the hold's watcher found it ended, or the
    /// endpoint closes).
    pub fn unpark_spinner(&self) {
        let t = self.spinner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = t.as_ref() {
            t.unpark();
        }
    }

    /// Makes the calling thread the one a waiter going idle, or
    /// [`unpark_spinner`](Self::unpark_spinner), unparks. Called before
    /// the hold is read again: a waiter that goes idle in between then
    /// finds this thread and unparks it.
    pub fn register_spinner(&self) {
        let me = std::thread::current();
        let mut t = self.spinner.lock().unwrap_or_else(|p| p.into_inner());
        if t.as_ref().map(Thread::id) != Some(me.id()) {
            *t = Some(me);
        }
    }

    /// A busy-poll thread's loop: `poll` (the work it did) until
    /// `closed`, stepping aside while a waiter holds the endpoint and
    /// yielding after a pass that found nothing — with fewer cores than
    /// spinners, a bare spin holds the core for a whole scheduler slice
    /// and starves the threads it completes work for.
    pub fn spin(&self, closed: impl Fn() -> bool, mut poll: impl FnMut() -> usize) {
        while !closed() {
            if self.park_while_held() {
                continue;
            }
            if poll() == 0 {
                std::thread::yield_now();
            }
        }
    }
}

/// The next nap of a spinner parked beside a hold ([`SpinHold::park_while_held_backoff`]):
/// what is left of the hold at the first nap (`last` 0), twice the last
/// one (at least a [`HOLD_NS`]) after it, never more than `max_ns` nor
/// less than what is left.
fn next_nap(last: u64, left: u64, max_ns: u64) -> u64 {
    if last == 0 {
        return left;
    }
    last.saturating_mul(2).max(HOLD_NS).min(max_ns).max(left)
}

/// The progress hooks of the endpoints bound to one queue. Weak, so a
/// queue never keeps a closed endpoint alive.
#[derive(Debug, Default)]
pub struct ProgressHooks {
    any: AtomicBool,
    hooks: RwLock<Vec<Weak<dyn Progress>>>,
    /// How many hooks `hooks` holds.
    count: AtomicUsize,
    /// The first hook ever added. While it is alive and the only one,
    /// `drive` runs it without the read lock (two atomic operations a
    /// pass of a spinning waiter): a hook is only ever removed once its
    /// endpoint is gone, so a live first hook is still in the list, and
    /// a list of one live first hook is that hook alone.
    first: OnceLock<Weak<dyn Progress>>,
}

impl ProgressHooks {
    /// Adds a hook (the same hook twice is kept once).
    pub fn add(&self, hook: &Arc<dyn Progress>) {
        let w = Arc::downgrade(hook);
        let mut g = self.hooks.write().unwrap_or_else(|p| p.into_inner());
        if !g.iter().any(|h| Weak::ptr_eq(h, &w)) {
            let _ = self.first.get_or_init(|| w.clone());
            g.push(w);
        }
        self.count.store(g.len(), Ordering::Release);
        self.any.store(true, Ordering::Release);
    }

    /// True when no hook was ever added.
    pub fn is_empty(&self) -> bool {
        !self.any.load(Ordering::Acquire)
    }

    /// Tells every live hook that its waiter sleeps now.
    pub fn idle(&self) {
        if self.is_empty() {
            return;
        }
        let g = self.hooks.read().unwrap_or_else(|p| p.into_inner());
        for p in g.iter().filter_map(Weak::upgrade) {
            p.idle();
        }
    }

    /// Runs every live hook once; returns the work done. Hooks whose
    /// endpoint is gone are pruned.
    #[inline]
    pub fn drive(&self) -> usize {
        // One hook (or none: then `first` is unset or dead, and the
        // general path below answers).
        if self.count.load(Ordering::Acquire) == 1 {
            if let Some(p) = self.first.get().and_then(Weak::upgrade) {
                return p.progress();
            }
        }
        self.drive_all()
    }

    /// The one hook, if the list is the first hook added and it is
    /// alive: a waiter that makes several passes in a row upgrades it
    /// once for all of them (each upgrade is a compare-and-swap, and its
    /// drop a decrement). `None`: use [`drive`](Self::drive).
    #[inline]
    pub fn single(&self) -> Option<Arc<dyn Progress>> {
        if self.count.load(Ordering::Acquire) == 1 {
            return self.first.get().and_then(Weak::upgrade);
        }
        None
    }

    /// [`drive`](Self::drive) of several hooks, or of a lone hook that
    /// is not the first one added.
    fn drive_all(&self) -> usize {
        if self.is_empty() {
            return 0;
        }
        let mut work = 0;
        let mut dead = false;
        {
            let g = self.hooks.read().unwrap_or_else(|p| p.into_inner());
            for h in g.iter() {
                match h.upgrade() {
                    Some(p) => work += p.progress(),
                    None => dead = true,
                }
            }
        }
        if dead {
            let mut g = self.hooks.write().unwrap_or_else(|p| p.into_inner());
            g.retain(|h| h.strong_count() > 0);
            self.count.store(g.len(), Ordering::Release);
            self.any.store(!g.is_empty(), Ordering::Release);
        }
        work
    }
}

/// The spin state of one waiter: when its current wait began.
///
/// A waiter does not spin inside `poll` for long (that would stall the
/// other futures of its task, e.g. the send joined with a receive): it
/// drives progress once per poll (a CQ reader, [`InlineWait::reader`], a
/// few times once its wait is under way) and, while within the budget,
/// asks to be polled again at once. Sibling futures and other tasks run
/// in between; past the budget the waiter sleeps until the reactor's
/// wake-up.
#[derive(Debug, Clone, Copy)]
pub struct InlineWait {
    since: Option<Instant>,
    /// `None`: [`spin_budget`]. Tests set a budget no scheduler delay can
    /// outlast, so they check the logic, not the machine's speed.
    budget: Option<Duration>,
    /// Passes per poll once the wait is under way: 1 for an awaited
    /// operation; a CQ reader's [`FEW_PASSES_PER_POLL`], or
    /// [`PASSES_PER_POLL`] when its endpoint makes cheap passes
    /// ([`Progress::cheap_pass`]).
    passes: u32,
    /// Nanoseconds since `since` at the last clock read: how long the
    /// wait had lasted when it was last looked at, for a [`SpinHint`]
    /// (no clock read of its own).
    seen_ns: u64,
    /// The wait went to sleep (its budget ran out).
    slept: bool,
}

impl Default for InlineWait {
    fn default() -> InlineWait {
        InlineWait {
            since: None,
            budget: None,
            passes: 1,
            seen_ns: 0,
            slept: false,
        }
    }
}

/// Passes a CQ reader makes in one poll once its wait is under way, as
/// long as they find nothing. Every return to the runtime re-polls each
/// future the reader is nested in, and reads the clock for the budget:
/// in `weft pingpong` that cost about three times an empty shm pass, so
/// a message that arrived was seen only that much later. The first poll
/// of a wait makes one pass, so that a future joined with the reader is
/// not held back by it. An awaited operation keeps one pass per poll: it
/// is the future a caller races against a timer or a cancellation
/// (`select!`), and passes that find nothing would only hold that check
/// back (in the cancel-safety soaks, a receive under a 0–200 µs timeout
/// was withdrawn a third as often). At 4 a poll, the return to the
/// runtime still cost as much as the four passes together (an empty
/// spinning iteration of `weft pingpong -p shm` 437 instructions); at 16
/// it is 245, and a poll holds the thread for a few microseconds at
/// most. Only for endpoints whose passes are cheap
/// ([`Progress::cheap_pass`]); others make [`FEW_PASSES_PER_POLL`].
pub const PASSES_PER_POLL: u32 = 16;

/// Passes a CQ reader makes in one poll when its endpoint's pass is not
/// known to be cheap (or several endpoints are bound).
pub const FEW_PASSES_PER_POLL: u32 = 4;

/// What one [`InlineWait::spin`] came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Spun<T> {
    /// The awaited value.
    Ready(T),
    /// Nothing yet; the waker was woken for an immediate re-poll.
    Again,
    /// Nothing yet, and the spin is over: register to be woken.
    Sleep,
}

impl InlineWait {
    /// A fresh wait of an awaited operation: one pass per poll.
    pub fn new() -> InlineWait {
        InlineWait::default()
    }

    /// A fresh wait of a CQ reader: up to [`FEW_PASSES_PER_POLL`] passes
    /// per poll once under way ([`PASSES_PER_POLL`] after
    /// [`cheap_passes`](Self::cheap_passes)).
    pub fn reader() -> InlineWait {
        InlineWait {
            passes: FEW_PASSES_PER_POLL,
            ..InlineWait::default()
        }
    }

    /// Whether the endpoint this reader drives makes cheap passes
    /// ([`Progress::cheap_pass`]); set before each poll, since the
    /// endpoints bound to a queue can change while a reader waits.
    #[inline]
    pub fn cheap_passes(&mut self, cheap: bool) {
        if self.passes != 1 {
            self.passes = if cheap {
                PASSES_PER_POLL
            } else {
                FEW_PASSES_PER_POLL
            };
        }
    }

    /// After a poll that found nothing: runs `drive` and, when it did
    /// work, tries `ready`; for a reader several times while nothing
    /// moves ([`cheap_passes`](Self::cheap_passes)). Returns the value, or `None` after re-arming
    /// `cx` for an immediate re-poll while the budget lasts; past the
    /// budget `idle` runs and the caller sleeps. A completion another
    /// thread delivers meanwhile wakes the caller through the waker it
    /// registered. `hint`: the budget it has learned (`None`: the
    /// configured one), told how long the wait lasted when it ends here;
    /// a wait that ends elsewhere is reported with
    /// [`finish`](Self::finish).
    pub fn poll<T>(
        &mut self,
        cx: &mut Context<'_>,
        hint: Option<&SpinHint>,
        drive: impl FnMut() -> usize,
        ready: impl FnMut(&mut Context<'_>) -> Option<T>,
        idle: impl FnOnce(),
    ) -> Option<T> {
        match self.spin(cx, hint, drive, ready, idle) {
            Spun::Ready(v) => Some(v),
            Spun::Again | Spun::Sleep => None,
        }
    }

    /// [`poll`](Self::poll), telling apart a wait that asked for a
    /// re-poll (`Again`: nothing to register, the caller is polled again
    /// at once) from one that sleeps (`Sleep`: the budget is spent or
    /// zero; the caller must register to be woken).
    pub fn spin<T>(
        &mut self,
        cx: &mut Context<'_>,
        hint: Option<&SpinHint>,
        mut drive: impl FnMut() -> usize,
        mut ready: impl FnMut(&mut Context<'_>) -> Option<T>,
        idle: impl FnOnce(),
    ) -> Spun<T> {
        let budget = match (self.budget, hint) {
            (Some(b), _) => b,
            (None, Some(h)) => h.budget(),
            (None, None) => spin_budget(),
        };
        if budget.is_zero() {
            return Spun::Sleep;
        }
        let passes = if self.since.is_some() { self.passes } else { 1 };
        for _ in 0..passes {
            if drive() == 0 {
                continue;
            }
            if let Some(v) = ready(cx) {
                self.finish(hint);
                return Spun::Ready(v);
            }
            // Work was done but the awaited completion is not there yet
            // (a large message still arriving): the budget counts time
            // without progress, so the wait keeps spinning. With a budget
            // of total time, a 1 MiB ping-pong (about 300 µs a message)
            // slept through the second half of every message (1.0x
            // libfabric's bandwidth against 1.45x for busy-poll). Bytes
            // moving, the task's other futures get their turn now.
            self.since = Some(Instant::now());
            self.seen_ns = 0;
            cx.waker().wake_by_ref();
            return Spun::Again;
        }
        // The clock is read once a poll, and only by a poll that found
        // nothing: a wait's first poll starts the budget after its pass
        // (a wait that ends at its first pass reads no clock at all).
        let within = match self.since {
            None => {
                self.since = Some(Instant::now());
                true
            }
            Some(since) => {
                let waited = since.elapsed();
                self.seen_ns = waited.as_nanos() as u64;
                waited < budget
            }
        };
        if within {
            cx.waker().wake_by_ref();
            Spun::Again
        } else {
            self.slept = true;
            idle();
            Spun::Sleep
        }
    }

    /// The wait ended (something was delivered): the next wait gets a
    /// fresh budget.
    pub fn reset(&mut self) {
        self.since = None;
        self.seen_ns = 0;
        self.slept = false;
    }

    /// [`reset`](Self::reset), first telling `hint` how long the wait
    /// lasted: a wait that spun, from its last clock read; one that
    /// slept, from a clock read now (its wake-up's delay included). A
    /// wait that ended before any clock read (its first pass found the
    /// completion) teaches nothing, and costs nothing.
    #[inline]
    pub fn finish(&mut self, hint: Option<&SpinHint>) {
        if let (Some(h), Some(since)) = (hint, self.since) {
            if self.slept {
                h.ended(since.elapsed());
            } else {
                h.ended(Duration::from_nanos(self.seen_ns));
            }
        }
        self.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spin_hint;

    #[derive(Debug, Default)]
    struct Count(AtomicUsize);

    impl Progress for Count {
        fn progress(&self) -> usize {
            self.0.fetch_add(1, Ordering::Relaxed);
            1
        }
    }

    #[test]
    fn drive_calls_live_hooks_and_prunes_dead_ones() {
        let hooks = ProgressHooks::default();
        assert!(hooks.is_empty());
        assert_eq!(hooks.drive(), 0);
        let a: Arc<dyn Progress> = Arc::new(Count::default());
        hooks.add(&a);
        hooks.add(&a);
        assert_eq!(hooks.drive(), 1, "a hook added twice runs once");
        {
            let b: Arc<dyn Progress> = Arc::new(Count::default());
            hooks.add(&b);
            assert_eq!(hooks.drive(), 2);
        }
        assert_eq!(hooks.drive(), 1, "the dropped endpoint's hook is gone");
        drop(a);
        assert_eq!(hooks.drive(), 0);
        assert!(hooks.is_empty());
        // The first hook gone, a later one alone is still driven.
        let c: Arc<dyn Progress> = Arc::new(Count::default());
        hooks.add(&c);
        assert_eq!(hooks.drive(), 1, "a lone hook that is not the first");
    }

    #[test]
    fn inline_wait_drives_then_asks_to_be_polled_again() {
        let woken = Arc::new(AtomicUsize::new(0));
        let waker = counting_waker(woken.clone());
        let mut cx = Context::from_waker(&waker);
        let c = Count::default();
        let mut w = InlineWait {
            budget: Some(Duration::from_secs(3600)),
            ..InlineWait::new()
        };
        let got: Option<()> = w.poll(&mut cx, None, || c.progress(), |_| None, || {});
        assert_eq!(got, None);
        assert_eq!(
            c.0.load(Ordering::Relaxed),
            1,
            "one drive per poll, no spinning inside"
        );
        assert_eq!(
            woken.load(Ordering::Relaxed),
            1,
            "re-polled at once within the budget"
        );
        let got = w.poll(&mut cx, None, || c.progress(), |_| Some(5), || {});
        assert_eq!(got, Some(5));
        assert!(w.since.is_none(), "a delivery resets the budget");
    }

    #[test]
    fn a_reader_makes_more_passes_once_under_way() {
        let woken = Arc::new(AtomicUsize::new(0));
        let waker = counting_waker(woken.clone());
        let mut cx = Context::from_waker(&waker);
        let passes = AtomicUsize::new(0);
        let drive = || {
            passes.fetch_add(1, Ordering::Relaxed);
            0
        };
        // An awaited operation's wait: one pass per poll, always.
        let mut op = InlineWait {
            budget: Some(Duration::from_secs(3600)),
            ..InlineWait::new()
        };
        let _: Option<()> = op.poll(&mut cx, None, drive, |_| None, || {});
        let _: Option<()> = op.poll(&mut cx, None, drive, |_| None, || {});
        assert_eq!(passes.load(Ordering::Relaxed), 2, "one pass per poll");
        passes.store(0, Ordering::Relaxed);
        woken.store(0, Ordering::Relaxed);
        let mut w = InlineWait {
            budget: Some(Duration::from_secs(3600)),
            ..InlineWait::reader()
        };
        let got: Option<()> = w.poll(&mut cx, None, drive, |_| None, || {});
        assert_eq!(got, None);
        assert_eq!(
            passes.load(Ordering::Relaxed),
            1,
            "a wait's first poll: one pass"
        );
        let got: Option<()> = w.poll(&mut cx, None, drive, |_| None, || {});
        assert_eq!(got, None);
        assert_eq!(
            passes.load(Ordering::Relaxed),
            1 + FEW_PASSES_PER_POLL as usize,
            "under way: several passes while nothing moves"
        );
        w.cheap_passes(true);
        let got: Option<()> = w.poll(&mut cx, None, drive, |_| None, || {});
        assert_eq!(got, None);
        assert_eq!(
            passes.load(Ordering::Relaxed),
            1 + (FEW_PASSES_PER_POLL + PASSES_PER_POLL) as usize,
            "cheap passes: more of them a poll"
        );
        assert_eq!(woken.load(Ordering::Relaxed), 3, "one wake-up per poll");
        // A pass that finds the completion ends the poll at once.
        let n = AtomicUsize::new(0);
        let got = w.poll(
            &mut cx,
            None,
            || n.fetch_add(1, Ordering::Relaxed) / 2,
            |_| Some(7),
            || {},
        );
        assert_eq!(got, Some(7));
        assert_eq!(
            n.load(Ordering::Relaxed),
            3,
            "ended by the pass that did work"
        );
    }

    #[test]
    fn spin_hold_parks_the_spinner_only_while_a_waiter_spins() {
        let hold = Arc::new(SpinHold::default());
        assert_eq!(hold.remaining_ns(), 0);
        assert!(!hold.park_while_held(), "no waiter: the spinner runs");
        // A hold no emulated machine outlasts before the next line.
        hold.waiter_active_at(clock_ns() + 200_000_000);
        assert!(hold.remaining_ns() > 0);
        // A spinner parked beside the waiter is released by waiter_idle
        // (the hold would also end by itself, so this cannot hang).
        let h2 = hold.clone();
        let spinner = std::thread::spawn(move || while h2.park_while_held() {});
        hold.waiter_idle();
        spinner.join().unwrap();
        assert_eq!(hold.remaining_ns(), 0);
        assert!(!hold.park_while_held());
    }

    #[test]
    fn a_spinner_naps_longer_while_the_hold_is_renewed() {
        let max = MAX_NAP_NS;
        // The first nap of a hold: what is left of it.
        assert_eq!(next_nap(0, 300_000, max), 300_000);
        // Renewed since: at least a hold, then doubling, up to the cap.
        assert_eq!(next_nap(300_000, HOLD_NS, max), HOLD_NS);
        assert_eq!(next_nap(HOLD_NS, 900_000, max), 2 * HOLD_NS);
        let mut nap = HOLD_NS;
        let mut naps = 1;
        while nap < max {
            nap = next_nap(nap, HOLD_NS, max);
            naps += 1;
        }
        assert_eq!(nap, max);
        assert_eq!(naps, 4, "1, 2, 4, 8 holds");
        assert_eq!(next_nap(max, HOLD_NS, max), max, "capped");
        // Never shorter than what is left (a hold taken far ahead).
        assert_eq!(next_nap(max, 10 * max, max), 10 * max);

        // No hold: no nap, and the next hold starts from its remainder.
        let hold = SpinHold::default();
        let mut nap = 5 * HOLD_NS;
        assert!(!hold.park_while_held_backoff(&mut nap, max));
        assert_eq!(nap, 0);
    }

    #[test]
    fn inline_wait_sleeps_after_the_budget() {
        let woken = Arc::new(AtomicUsize::new(0));
        let waker = counting_waker(woken.clone());
        let mut cx = Context::from_waker(&waker);
        let mut w = InlineWait {
            since: Some(Instant::now() - spin_budget() - Duration::from_millis(1)),
            budget: None,
            passes: FEW_PASSES_PER_POLL,
            ..InlineWait::default()
        };
        let idled = std::cell::Cell::new(false);
        let got: Option<()> = w.poll(&mut cx, None, || 0, |_| None, || idled.set(true));
        assert_eq!(got, None);
        assert!(idled.get(), "the provider hears that nobody spins any more");
        assert_eq!(
            woken.load(Ordering::Relaxed),
            0,
            "past the budget: wait for the reactor"
        );
    }

    #[test]
    fn inline_wait_work_without_a_delivery_restarts_the_budget() {
        let woken = Arc::new(AtomicUsize::new(0));
        let waker = counting_waker(woken.clone());
        let mut cx = Context::from_waker(&waker);
        // A budget no scheduler delay outlasts, and a start before the
        // poll: moving bytes starts the budget again from the poll.
        let start = Instant::now();
        let mut w = InlineWait {
            since: Some(start),
            budget: Some(Duration::from_secs(3600)),
            passes: FEW_PASSES_PER_POLL,
            ..InlineWait::default()
        };
        let idled = std::cell::Cell::new(false);
        let got: Option<()> = w.poll(&mut cx, None, || 4096, |_| None, || idled.set(true));
        assert_eq!(got, None);
        assert!(!idled.get(), "bytes moved: still spinning");
        assert_eq!(woken.load(Ordering::Relaxed), 1, "re-polled at once");
        assert!(
            w.since.is_some_and(|s| s >= start),
            "the budget starts again"
        );
        // Nothing more moves: past the budget the waiter sleeps.
        w.budget = Some(Duration::from_nanos(1));
        w.since = Some(start);
        let got: Option<()> = w.poll(&mut cx, None, || 0, |_| None, || idled.set(true));
        assert_eq!(got, None);
        assert!(idled.get());
    }

    #[test]
    fn a_wait_that_spun_or_slept_teaches_its_hint() {
        let woken = Arc::new(AtomicUsize::new(0));
        let waker = counting_waker(woken);
        let mut cx = Context::from_waker(&waker);
        let base = Duration::from_micros(DEFAULT_SPIN_US);
        // A wait under way for 300 µs: the poll that finds nothing reads
        // the clock, the next one finds the completion and reports it.
        let hint = SpinHint::default();
        let mut w = InlineWait {
            since: Some(Instant::now() - Duration::from_micros(300)),
            budget: Some(Duration::from_secs(3600)),
            passes: FEW_PASSES_PER_POLL,
            ..InlineWait::default()
        };
        let spun: Spun<()> = w.spin(&mut cx, Some(&hint), || 0, |_| None, || {});
        assert_eq!(spun, Spun::Again);
        let done = w.spin(&mut cx, Some(&hint), || 1, |_| Some(()), || {});
        assert_eq!(done, Spun::Ready(()));
        assert!(w.since.is_none(), "the next wait starts afresh");
        assert_eq!(
            hint.budget_from(base, false),
            spin_hint::MAX_HINTED,
            "8 x 300 µs, capped"
        );

        // A wait that slept 500 µs: learned from a clock read at its end.
        let hint = SpinHint::default();
        let mut w = InlineWait {
            since: Some(Instant::now() - Duration::from_micros(500)),
            budget: Some(Duration::from_nanos(1)),
            passes: FEW_PASSES_PER_POLL,
            ..InlineWait::default()
        };
        let slept: Spun<()> = w.spin(&mut cx, Some(&hint), || 0, |_| None, || {});
        assert_eq!(slept, Spun::Sleep);
        w.finish(Some(&hint));
        assert_eq!(hint.budget_from(base, false), spin_hint::MAX_HINTED);

        // One that slept through an idle spell teaches nothing.
        let hint = SpinHint::default();
        let mut w = InlineWait {
            since: Some(Instant::now() - Duration::from_secs(3)),
            budget: Some(Duration::from_nanos(1)),
            passes: FEW_PASSES_PER_POLL,
            ..InlineWait::default()
        };
        let slept: Spun<()> = w.spin(&mut cx, Some(&hint), || 0, |_| None, || {});
        assert_eq!(slept, Spun::Sleep);
        w.finish(Some(&hint));
        assert_eq!(hint.budget_from(base, false), base);
    }

    fn counting_waker(n: Arc<AtomicUsize>) -> std::task::Waker {
        struct W(Arc<AtomicUsize>);
        impl std::task::Wake for W {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
            fn wake_by_ref(self: &Arc<Self>) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        std::task::Waker::from(Arc::new(W(n)))
    }
}
