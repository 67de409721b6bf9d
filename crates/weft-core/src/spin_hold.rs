//! The async side of a [`SpinHold`]: an endpoint's driver task stands aside
//! while an inline waiter spins, because the waiter does the work itself
//! and a driver woken for it would only find it gone (and, on a small
//! machine, cost the spinner or the peer its core).
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
