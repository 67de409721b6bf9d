//! The async side of a [`SpinHold`]: an endpoint's driver task stands aside
//! while an inline waiter spins, because the waiter does the work itself
//! and a driver woken for it would only find it gone (and, on a small
//! machine, cost the spinner or the peer its core).
//!
//! [`wake_at_lapse`] is the same stand for a busy-poll thread parked
//! beside a waiter: it times the hold's end on the runtime and wakes the
//! thread then, so that the thread need not wake itself to look.
//!
//! Runtime-free like the rest of the crate: the caller brings the idle
//! signal and the timer.

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use futures::future::select;

use crate::progress::SpinHold;

/// Returns once no waiter holds `hold`: it said it went idle (`idle()`'s
/// future ended) or its hold lapsed (`sleep` ran out).
///
/// The hold is read again after `idle()` is made, so the future `idle`
/// returns must count as waiting from its creation, not from its first
/// poll (Tokio's `Notify::notified` woken by `notify_waiters` does);
/// otherwise a waiter that goes idle in between is missed and the driver
/// sleeps out the rest of the hold.
pub async fn stand_aside<I, S>(hold: &SpinHold, idle: impl Fn() -> I, sleep: impl Fn(Duration) -> S)
where
    I: Future,
    S: Future,
{
    loop {
        let left = hold.remaining_ns();
        if left == 0 {
            return;
        }
        let idle = idle();
        if hold.remaining_ns() == 0 {
            return;
        }
        let _ = select(pin!(idle), pin!(sleep(Duration::from_nanos(left)))).await;
    }
}

/// The watcher of a busy-poll thread that parks with
/// [`SpinHold::park_while_held_backoff`]: each time `parked()` ends (the
/// thread parked beside a waiter and said so), it stands aside as long as
/// the hold lasts ([`stand_aside`]) and then wakes the thread to take
/// over ([`SpinHold::unpark_spinner`]). Returns when `live()` is false
/// after `parked()` ended.
///
/// Run on the waiter's runtime, the hold's end is a timer of that
/// runtime: while the waiter spins on a current-thread runtime it is
/// looked at during the runtime's own driver polls, on the waiter's
/// thread, with no thread switch. The thread's own timed wake-up at each
/// hold's end was two context switches on the waiter's core a
/// [`HOLD_NS`](crate::progress::HOLD_NS).
pub async fn wake_at_lapse<P, I, S>(
    hold: &SpinHold,
    parked: impl Fn() -> P,
    live: impl Fn() -> bool,
    idle: impl Fn() -> I,
    sleep: impl Fn(Duration) -> S,
) where
    P: Future,
    I: Future,
    S: Future,
{
    loop {
        parked().await;
        if !live() {
            return;
        }
        stand_aside(hold, &idle, &sleep).await;
        hold.unpark_spinner();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::executor::block_on;
    use futures::future::{pending, ready};
    use std::cell::Cell;

    #[test]
    fn no_hold_returns_without_waiting() {
        let hold = SpinHold::default();
        let made = Cell::new(0);
        block_on(stand_aside(
            &hold,
            || {
                made.set(made.get() + 1);
                pending::<()>()
            },
            |_| pending::<()>(),
        ));
        assert_eq!(made.get(), 0);
    }

    #[test]
    fn waiter_going_idle_while_registering_is_seen() {
        let hold = SpinHold::default();
        hold.waiter_active();
        // The waiter goes idle between the first read of the hold and the
        // second: neither future may be needed to end the stand.
        block_on(stand_aside(
            &hold,
            || {
                hold.waiter_idle();
                pending::<()>()
            },
            |_| pending::<()>(),
        ));
        assert_eq!(hold.remaining_ns(), 0);
    }

    #[test]
    fn the_watcher_wakes_a_napping_spinner_when_the_hold_ends() {
        use std::sync::atomic::{AtomicU64, Ordering};
        use std::sync::Arc;
        use std::time::Instant;

        let hold = Arc::new(SpinHold::default());
        // Long enough for the spinner to park before it ends, however
        // slow the machine is to start the thread (the watcher wakes it
        // only once the hold is over).
        let end = crate::progress::clock_ns() + 1_000_000_000;
        hold.waiter_active_at(end);
        // A spinner whose hold was renewed many times: its next nap is
        // the longest there is, so only the watcher ends it early.
        let h2 = hold.clone();
        let napped = Arc::new(AtomicU64::new(0));
        let n2 = napped.clone();
        let spinner = std::thread::spawn(move || {
            let mut nap = 60_000_000_000;
            let t = Instant::now();
            let parked = h2.park_while_held_backoff(&mut nap, 120_000_000_000);
            n2.store(nap, Ordering::Relaxed);
            (parked, t.elapsed())
        });
        let rounds = Cell::new(0);
        block_on(wake_at_lapse(
            &hold,
            || ready(()),
            || {
                rounds.set(rounds.get() + 1);
                rounds.get() == 1
            },
            pending::<()>,
            |d| {
                std::thread::sleep(d);
                ready(())
            },
        ));
        let (parked, took) = spinner.join().unwrap();
        assert!(parked, "the spinner parked beside the hold");
        assert_eq!(napped.load(Ordering::Relaxed), 120_000_000_000);
        assert!(
            took < Duration::from_secs(30),
            "woken by the watcher at the hold's end, not by its nap"
        );
        assert_eq!(hold.remaining_ns(), 0);
    }

    #[test]
    fn lapsed_hold_ends_the_stand() {
        let hold = SpinHold::default();
        // A hold that cannot lapse before the stand's first look, however
        // slow the machine (under emulation the 1 ms of a plain
        // `waiter_active` was gone before it, and the stand ended without
        // sleeping).
        hold.waiter_active_at(crate::progress::clock_ns() + 200_000_000);
        let slept = Cell::new(0);
        block_on(stand_aside(&hold, pending::<()>, |d| {
            assert!(d.as_nanos() > 0);
            slept.set(slept.get() + 1);
            std::thread::sleep(d);
            ready(())
        }));
        assert!(slept.get() >= 1);
        assert_eq!(hold.remaining_ns(), 0);
    }
}
