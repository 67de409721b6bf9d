//! Who drives an endpoint, as for tcp and udp: a Tokio task that sleeps
//! on the doorbell in the reactor (interrupt mode, and inline mode once
//! the waiter sleeps), a spinning thread (busy-poll mode), or the waiter
//! itself (inline and busy-poll modes, through [`InlineProgress`]).
//!
//! Senders ring the doorbell only when the task said it sleeps (the
//! segment header's `sleeping` word): while both sides spin, no message
//! costs a system call. Likewise a send waiting for delivery (a CMA
//! send), and a spinning endpoint's send queued for want of room, ask
//! their receiver to ring them only when the task is about to sleep
//! (`EpShared::ask_rings`), never in busy-poll mode, whose thread does
//! not sleep.

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use weft_core::completion::WaitMode;
use weft_core::progress::clock_ns;
use weft_core::sync::lock;
use weft_core::Result;

use crate::endpoint::EpShared;
use crate::layout::{C_HEAD, H_SLEEPING};
use crate::ring::Chan;

/// How often the liveness of peers and senders is checked: a killed peer's
/// operations fail within this (plus one check's time).
pub const SWEEP_EVERY: Duration = Duration::from_millis(100);

/// The sweep period in force: [`SWEEP_EVERY`] unless [`set_sweep_every`]
/// changed it.
static SWEEP_NS: AtomicU64 = AtomicU64::new(SWEEP_EVERY.as_nanos() as u64);

/// Sets the sweep period of every endpoint of this process: for tests
/// that must tell a doorbell wake-up from a sweep's (a driver task sleeps
/// at most this long, so a lost doorbell only delays it by this), in a
/// test binary of their own (peers' deaths are found as late).
pub fn set_sweep_every(every: Duration) {
    let ns = u64::try_from(every.as_nanos()).unwrap_or(u64::MAX).max(1);
    SWEEP_NS.store(ns, Ordering::Relaxed);
}

fn sweep_ns() -> u64 {
    SWEEP_NS.load(Ordering::Relaxed)
}

/// How long a spinning waiter finds nothing before its empty passes
/// yield the core: long enough that a round trip on a quiet machine
/// (2 µs) never yields, short enough that a waiter on a loaded one gives
/// the peer its core within a fraction of a time slice. (At 5 µs the
/// soaks of `cancel_safe.rs` saw too few receives time out: a waiter
/// that yields at once mostly comes back to a message already there.)
const YIELD_AFTER_NS: u64 = 20_000;

/// A spinning waiter reads the clock once in this many passes.
const CLOCK_EVERY: u32 = 8;

/// `last_work` of a pass that found work before the clock was read
/// again: never long ago (the yield's subtraction saturates at 0).
const WORK_UNSTAMPED: u64 = u64::MAX;

/// Starts the endpoint's drivers for its wait mode.
pub fn start(ep: &Arc<EpShared>) -> Result<()> {
    if ep.cfg.wait == WaitMode::BusyPoll {
        let ep2 = ep.clone();
        std::thread::Builder::new()
            .name("weft-shm-busy".into())
            .spawn(move || busy_loop(ep2))?;
        return Ok(());
    }
    let t = ep.rt.spawn(run(ep.clone()));
    lock(&ep.tasks).push(t.abort_handle());
    Ok(())
}

/// One non-blocking pass at time `now` (`clock_ns`, read once by the
/// caller): queued sends, the channels, and (when due) the liveness
/// checks. `full`: look at every channel for new claims (the driver task,
/// woken by a doorbell a new sender may have rung); spinning callers look
/// only at the channels in use, and at all of them every
/// `FULL_EVERY` passes. Returns the work done.
pub fn poll_once(ep: &EpShared, now: u64, full: bool) -> usize {
    let k = ep.passes.load(Ordering::Relaxed);
    ep.passes.store(k.wrapping_add(1), Ordering::Relaxed);
    pass_at(ep, now, full || k % FULL_EVERY == 0, false)
}

/// [`poll_once`] whose caller counts its own passes (the inline hook:
/// one count for the clock and the full passes, which then coincide).
/// `looked`: the caller found something published or parked just now
/// ([`quiet`]), so the receive pass goes ahead without looking again.
fn pass_at(ep: &EpShared, now: u64, full: bool, looked: bool) -> usize {
    let last = ep.last_sweep.load(Ordering::Relaxed);
    let sweep = now.saturating_sub(last) >= sweep_ns()
        && ep
            .last_sweep
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
    let full = full || sweep;
    let mut n = ep.flush();
    if sweep {
        n += ep.sweep_peers();
    }
    if !full && !looked && !ep.parked.load(Ordering::Acquire) && !published(ep) {
        return n;
    }
    if let Some(mut st) = ep.rx_state.try_lock() {
        n += crate::rx::pass(ep, &mut st, sweep, full);
    }
    n
}

/// Spinning passes look at every channel, for new claims, once in this
/// many passes; the others look only at the channels in use. Sixteen idle
/// channels cost a spinning pass most of its instructions, and a claim
/// waits a few passes at most (the driver task's passes are all full).
pub const FULL_EVERY: u32 = 16;

// The inline hook's quiet passes skip `poll_once` between clock reads,
// so its full passes must fall on clock passes.
const _: () = assert!(FULL_EVERY % CLOCK_EVERY == 0);

/// Whether a channel in use has records past what we consumed, looked at
/// without taking the receive state: the word at the head we published
/// (which equals ours after every pass) is set, a record or padding
/// published in band (`ring::Chan::next`). A spinning pass that finds
/// none skips the rest, its lock included (taking and releasing it was a
/// quarter of an empty pass). A sender that writes our head word only
/// delays its own channel to the next full pass, or makes every pass
/// look at it; a head word that names no word at all counts as
/// published, so the pass sees the channel.
#[inline(always)]
fn published(ep: &EpShared) -> bool {
    let mut live = ep.live.load(Ordering::Relaxed);
    while live != 0 {
        let i = live.trailing_zeros() as usize;
        live &= live - 1;
        let c = Chan { g: ep.g, i };
        let Some(b) = c.block(&ep.seg) else {
            continue;
        };
        let head = b.load64(C_HEAD, Ordering::Relaxed).unwrap_or(0);
        if c.published_at(&ep.seg, head) != Some(false) {
            return true;
        }
    }
    false
}

/// Whether a spinning pass would find nothing to do, as far as the
/// words it looks at first tell: no send queued, no channel parked,
/// nothing published on a channel in use.
#[inline(always)]
fn quiet(ep: &EpShared) -> bool {
    !ep.tx_pending.load(Ordering::Acquire) && !ep.parked.load(Ordering::Acquire) && !published(ep)
}

fn set_sleeping(ep: &EpShared, on: bool) {
    ep.seg.store32(H_SLEEPING, u32::from(on), Ordering::Relaxed);
}

async fn run(ep: Arc<EpShared>) {
    let Some(bell) = ep.abell.as_ref() else {
        return;
    };
    // The window the driver last stayed awake in (`stay_awake`).
    let mut window = None;
    // What a sleep also ends on, kept from one sleep to the next (see
    // [`sleep`]).
    let mut sweep = pin!(tokio::time::sleep(Duration::from_nanos(sweep_ns())));
    let mut kicked = pin!(ep.kick.notified());
    // The last pass found work and the tasks it woke have run since.
    let mut answered = false;
    loop {
        if ep.is_closed() {
            return;
        }
        stand_aside(&ep).await;
        // After an answer with nothing seen since, the pass before
        // sleeping (below) is the next look: a pass here too found
        // nothing in a ping-pong (the peer is still on its way), for a
        // full pass's instructions a wake-up. A stream keeps passing
        // here, awake, so that its senders do not find it asleep and
        // ring.
        let look = !std::mem::take(&mut answered) || !quiet(&ep);
        if look && poll_once(&ep, clock_ns(), true) > 0 {
            // The tasks it woke answer first.
            weft_core::progress::requeue().await;
            answered = true;
            continue;
        }
        if stay_awake(&ep, &mut window).await {
            // The tasks it woke answer first, as after any pass.
            weft_core::progress::requeue().await;
            continue;
        }
        set_sleeping(&ep, true);
        ep.ask_rings();
        // Pairs with the sender's fence between publishing and reading
        // `sleeping`: either it sees us asleep, or we see its record.
        // Likewise with a receiver's fence between consuming and reading
        // our ask to be rung: either it rings, or this pass sees the
        // delivery.
        fence(Ordering::SeqCst);
        if poll_once(&ep, clock_ns(), true) > 0 {
            set_sleeping(&ep, false);
            continue;
        }
        if sleep(&ep, bell, sweep.as_mut(), kicked.as_mut())
            .await
            .is_err()
        {
            return;
        }
        set_sleeping(&ep, false);
    }
}

/// The driver task's sleep: until its doorbell rings, it is kicked
/// (`EpShared::kick`), or the next sweep of its peers is due; `Err` if
/// the doorbell cannot be waited on. The sweep's timer and the kick's
/// waiter are the caller's, kept from one sleep to the next: made for
/// each sleep and dropped at its end, they were entered into and taken
/// out of the runtime's timer wheel and the `Notify`'s list of waiters on
/// every wake-up. The doorbell is waited on by `poll_read_ready`, which
/// keeps the waker in the reactor's slot for one reader, instead of a
/// `readable()` future linked into its list of waiters and unlinked at
/// the end. Together about 1,200 of the 8,500 instructions of a 64 B
/// interrupt-mode round trip (`docs/benchmarks.md`, "Interrupt mode:
/// the sleep's own cost").
async fn sleep<'a>(
    ep: &'a EpShared,
    bell: &tokio::io::unix::AsyncFd<std::fs::File>,
    mut sweep: Pin<&mut tokio::time::Sleep>,
    mut kicked: Pin<&mut tokio::sync::futures::Notified<'a>>,
) -> std::io::Result<()> {
    if sweep.is_elapsed() {
        // Due one period after the last sweep (any pass's, this task's
        // or an inline waiter's), at once if that is past: the task
        // sleeps at most a period, and a sweep comes at most a period
        // late.
        let due = ep
            .last_sweep
            .load(Ordering::Relaxed)
            .saturating_add(sweep_ns());
        let wait = Duration::from_nanos(due.saturating_sub(clock_ns()));
        sweep.as_mut().reset(tokio::time::Instant::now() + wait);
    }
    std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = bell.poll_read_ready(cx) {
            drain(r?);
            return Poll::Ready(Ok(()));
        }
        if kicked.as_mut().poll(cx).is_ready() {
            // Spent: the next sleep waits for the next kick.
            kicked.set(ep.kick.notified());
            return Poll::Ready(Ok(()));
        }
        sweep.as_mut().poll(cx).map(Ok)
    })
    .await
}

/// Takes every pending wake-up from the doorbell (one pass serves them
/// all). A read short of the buffer emptied the FIFO, so its readiness
/// is cleared there, without the read that would fail: a byte written
/// since keeps it set (Tokio clears it only if no event came after the
/// one this guard was made from).
fn drain(mut guard: tokio::io::unix::AsyncFdReadyGuard<'_, std::fs::File>) {
    use std::io::Read;
    let mut b = [0u8; 64];
    loop {
        match guard.get_inner().read(&mut b) {
            Ok(n) if n == b.len() => {}
            Ok(_) => return guard.clear_ready(),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return guard.clear_ready(),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // Another error leaves the readiness set: the next wait
            // returns at once, and its read says again.
            Err(_) => return,
        }
    }
}

/// How long the driver task keeps passing, before it sleeps, while a
/// CMA send of ours waits for its receiver to read it
/// ([`stay_awake`]).
pub const STAY_AWAKE: Duration = Duration::from_micros(500);

/// Before the driver task sleeps with CMA sends of ours unread
/// (`EpShared::cma_out`): it keeps passing, yielding to the runtime's
/// other tasks between passes, until a pass finds work (true: the loop
/// goes on as after any pass), an inline waiter takes over (true: the
/// loop stands aside), nothing of ours is unread, or the window (see
/// [`window_until`]) has closed (false: it sleeps, asking to be rung, as
/// before). Why: the receiver reads a CMA message straight from our
/// memory, and on the machines measured that read took 2.5x as long
/// while our CPU was idle (`process_vm_readv` of 1 MiB: 190–210 µs with
/// the sender asleep, 70–80 with its CPU busy, in a VM whose idle vCPUs
/// halt), and the send's end then cost a doorbell and a wake-up more;
/// awake, an interrupt-mode 1 MiB ping-pong took 0.4–0.7x as long
/// (`docs/benchmarks.md`, "shm interrupt mode: staying awake while a CMA
/// send is read").
async fn stay_awake(ep: &EpShared, window: &mut Option<(u64, u64)>) -> bool {
    // Nothing unread, mostly: then no clock is read.
    let Some(newest) = ep.cma_out() else {
        return false;
    };
    let Some(until) = window_until(window, Some(newest), clock_ns()) else {
        return false;
    };
    loop {
        weft_core::progress::requeue().await;
        if poll_once(ep, clock_ns(), false) > 0 || ep.hold.remaining_ns() > 0 {
            return true;
        }
        if ep.cma_out().is_none() || clock_ns() >= until {
            return false;
        }
    }
}

/// The end of the window to stay awake in, at `now`, for the newest
/// unread CMA send `newest` (its stamp; `None`: none unread), given the
/// last window (`window`: the stamp it opened for and its end), or
/// `None` for none. A newer send than the last window's opens a window of
/// [`STAY_AWAKE`]; the same send goes on in its window until it ends
/// (work found in between does not cost it the rest); only older sends
/// left unread — a receiver that does not read them (no receive, no
/// budget) — open none, so they cost one window each, not one a wake-up.
fn window_until(window: &mut Option<(u64, u64)>, newest: Option<u64>, now: u64) -> Option<u64> {
    let newest = newest?;
    let until = match *window {
        Some((stamp, until)) if stamp == newest => until,
        Some((stamp, _)) if stamp > newest => return None,
        _ => {
            let until = now.saturating_add(STAY_AWAKE.as_nanos() as u64);
            *window = Some((newest, until));
            until
        }
    };
    (now < until).then_some(until)
}

/// While an inline waiter spins on this endpoint it polls the rings
/// itself; the task waits until the waiter sleeps (it says so through
/// `inline_idle`) or stops polling.
async fn stand_aside(ep: &EpShared) {
    if ep.cfg.wait != WaitMode::Inline {
        return;
    }
    weft_core::spin_hold::stand_aside(&ep.hold, || ep.inline_idle.notified(), tokio::time::sleep)
        .await;
}

fn busy_loop(ep: Arc<EpShared>) {
    ep.hold
        .spin(|| ep.is_closed(), || poll_once(&ep, clock_ns(), false));
}

/// Inline progress: the waiting task drives the endpoint itself.
#[derive(Debug)]
pub struct InlineProgress {
    pub ep: Arc<EpShared>,
    /// How long the endpoint's awaited operations wait.
    pub hint: weft_core::progress::SpinHint,
}

impl InlineProgress {
    /// After a pass that found nothing at `now`.
    #[inline(always)]
    fn empty_pass(&self, now: u64) {
        if now.saturating_sub(self.ep.last_work.load(Ordering::Relaxed)) > YIELD_AFTER_NS {
            // The peer is another process: with fewer cores than
            // runnable threads, a spin that never enters the kernel holds
            // the core for a whole time slice while the peer waits for it
            // (on two loaded cores, 64 B round trips took 130–370 µs).
            // After a short spin with nothing found, each empty pass
            // yields; sched_yield costs under a microsecond when nothing
            // else wants the core.
            std::thread::yield_now();
        }
    }
}

impl weft_core::progress::Progress for InlineProgress {
    fn spin_hint(&self) -> Option<&weft_core::progress::SpinHint> {
        Some(&self.hint)
    }

    fn progress(&self) -> usize {
        if self.ep.is_closed() {
            return 0;
        }
        // The clock is read once in CLOCK_EVERY passes (a spinning pass
        // read it three times, a fifth of its time: `docs/benchmarks.md`,
        // "shm RDM"); what it times (the sweep, the hold, the yield)
        // is coarser than a few passes.
        let k = self.ep.spins.load(Ordering::Relaxed);
        self.ep.spins.store(k.wrapping_add(1), Ordering::Relaxed);
        let clock = k % CLOCK_EVERY == 0;
        if !clock && quiet(&self.ep) {
            // Between two clock reads nothing timed falls due (the sweep
            // and the hold look at `now`, which only the clock pass
            // moves, and that pass always takes the long way), and full
            // passes are on clock passes too (`FULL_EVERY` is a multiple
            // of `CLOCK_EVERY`): with nothing queued to send, no channel
            // parked and nothing published, the pass would find nothing.
            // Only the yield is left to decide.
            self.empty_pass(self.ep.spin_now.load(Ordering::Relaxed));
            return 0;
        }
        self.pass(k, clock)
    }

    fn cheap_pass(&self) -> bool {
        // A pass reads each channel's head from shared memory: no system
        // call, however many peers.
        true
    }

    fn idle(&self) {
        // The next pass reads the clock and takes the hold again.
        self.ep.spins.store(0, Ordering::Relaxed);
        self.ep.hold.waiter_idle();
        self.ep.inline_idle.notify_waiters();
    }
}

impl InlineProgress {
    /// The pass of [`progress`](weft_core::progress::Progress::progress)
    /// once its quiet look found something (or the clock is due): its
    /// own function, so that the quiet return, which a spinning waiter
    /// makes on most passes, saves and restores no registers for it.
    #[inline(never)]
    fn pass(&self, k: u32, clock: bool) -> usize {
        let now = if clock {
            let t = clock_ns();
            self.ep.spin_now.store(t, Ordering::Relaxed);
            self.ep.hold.waiter_active_at(t);
            if self.ep.last_work.load(Ordering::Relaxed) == WORK_UNSTAMPED {
                self.ep.last_work.store(t, Ordering::Relaxed);
            }
            t
        } else {
            self.ep.spin_now.load(Ordering::Relaxed)
        };
        // One pass per call: passing again for 2 µs before returning
        // empty saved `epoll_wait` calls but held back the waiting task's
        // own send, making a 64 B round trip 2.8x slower
        // (`docs/benchmarks.md`, "shm RDM").
        // A pass between clock reads is here because `quiet` found
        // something (or a send queued, for which the look is cheap).
        let n = pass_at(&self.ep, now, k % FULL_EVERY == 0, !clock);
        if n > 0 {
            // Stamped at the next clock read: `now` may be from before a
            // pause of the waiter, and work stamped with it would look
            // old at once (a yield right after work).
            self.ep.last_work.store(WORK_UNSTAMPED, Ordering::Relaxed);
        } else {
            self.empty_pass(now);
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::{window_until, STAY_AWAKE};

    const W: u64 = STAY_AWAKE.as_nanos() as u64;

    /// A window opens for each newer unread CMA send, goes on for the
    /// same send until it ends, and none opens for older sends left
    /// unread, nor with none unread.
    #[test]
    fn a_window_for_each_newer_send_and_none_for_older_ones_left() {
        let mut w = None;
        assert_eq!(window_until(&mut w, None, 0), None, "nothing unread");
        assert_eq!(
            window_until(&mut w, Some(5), 1_000),
            Some(1_000 + W),
            "a send out"
        );
        assert_eq!(
            window_until(&mut w, Some(5), 2_000),
            Some(1_000 + W),
            "the same send: the same window, resumed"
        );
        assert_eq!(window_until(&mut w, Some(5), 1_000 + W), None, "ended");
        assert_eq!(
            window_until(&mut w, Some(5), 9 * W),
            None,
            "not again, later"
        );
        assert_eq!(
            window_until(&mut w, Some(7), 10 * W),
            Some(11 * W),
            "a newer send: a new window"
        );
        assert_eq!(
            window_until(&mut w, Some(6), 10 * W + 1),
            None,
            "read, an older one left unread: none"
        );
        assert_eq!(w, Some((7, 11 * W)), "the newest window kept");
        assert_eq!(window_until(&mut w, None, 10 * W + 2), None, "all read");
        assert_eq!(
            window_until(&mut w, Some(8), 12 * W),
            Some(13 * W),
            "and the next"
        );
    }
}
