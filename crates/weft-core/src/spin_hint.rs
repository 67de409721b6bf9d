//! How long an inline waiter spins before it sleeps, learned from how
//! long its waits last.
//!
//! A fixed budget is either short enough to give an idle thread back
//! quickly, or long enough to ride out a slow round trip; not both. A
//! waiter whose answers take half a millisecond or more (a verbs
//! ping-pong of 16 KiB and up under the rxe VM's emulation) slept in
//! every wait of a 200 µs budget, each time paying a completion event, a
//! wake-up and the re-arming (`docs/benchmarks.md`, "Inline mode: the
//! spin budget learns the round trip"). A [`SpinHint`] keeps a moving
//! average of the waits that
//! ended within reach, and the budget becomes [`HINT_FACTOR`] times it,
//! never below the configured budget and never above [`MAX_HINTED`]: a
//! fast link keeps the configured 200 µs, a slow one spins through its
//! usual wait with room to spare, and a waiter with nothing coming still
//! sleeps after at most [`MAX_HINTED`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// Default spin budget of an inline waiter, in microseconds of no
/// progress: a little over a loopback round trip, so a ping-pong reply is
/// caught while spinning, while a waiter with nothing coming gives its
/// thread back quickly. Passes that move bytes start the budget again.
pub const DEFAULT_SPIN_US: u64 = 200;

/// The most a learned budget grows to: past it a waiter sleeps however
/// long its waits have been.
pub const MAX_HINTED: Duration = Duration::from_millis(2);

/// A learned budget is this many times the average wait: room for the
/// waits that run long (a wait that outlasts the budget pays a wake-up,
/// several times a spinning wait's cost under emulation).
pub const HINT_FACTOR: u64 = 8;

/// The configured budget and whether it was set explicitly: read once
/// per process from `WEFT_INLINE_SPIN_US` (0 disables spinning), else
/// [`DEFAULT_SPIN_US`].
fn configured() -> (Duration, bool) {
    static BUDGET: OnceLock<(Duration, bool)> = OnceLock::new();
    *BUDGET.get_or_init(|| {
        match std::env::var("WEFT_INLINE_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
        {
            Some(us) => (Duration::from_micros(us), true),
            None => (Duration::from_micros(DEFAULT_SPIN_US), false),
        }
    })
}

/// The configured spin budget: `WEFT_INLINE_SPIN_US` when set (0
/// disables spinning), else [`DEFAULT_SPIN_US`]. A budget set explicitly
/// is kept as it is; the default one is the floor of a learned budget
/// ([`SpinHint`]).
pub fn spin_budget() -> Duration {
    configured().0
}

/// What one waiter (a completion queue's readers) has learned of its
/// waits: a moving average of the waits that ended within
/// [`MAX_HINTED`], in nanoseconds (0: nothing learned yet). Shared by
/// the readers of one queue without a lock: two readers updating it at
/// once lose one sample, which an average does not miss.
#[derive(Debug, Default)]
pub struct SpinHint {
    avg_ns: AtomicU64,
}

impl SpinHint {
    /// The budget of the next wait: [`spin_budget`] when it was set
    /// explicitly or is zero; else [`HINT_FACTOR`] times the average
    /// wait, within [`spin_budget`]..=[`MAX_HINTED`].
    pub fn budget(&self) -> Duration {
        let (base, pinned) = configured();
        self.budget_from(base, pinned)
    }

    /// [`budget`](Self::budget) from a given configured budget.
    pub fn budget_from(&self, base: Duration, pinned: bool) -> Duration {
        if pinned || base.is_zero() {
            return base;
        }
        let avg = self.avg_ns.load(Ordering::Relaxed);
        let hinted = Duration::from_nanos(avg.saturating_mul(HINT_FACTOR));
        hinted.clamp(base, MAX_HINTED.max(base))
    }

    /// A wait ended after `waited`: counted in the average when a budget
    /// could have covered it. Longer ones (an idle peer, a process
    /// stopped) say nothing about the round trip and are left out, so an
    /// idle spell does not make the next waits spin longer.
    pub fn ended(&self, waited: Duration) {
        if waited > MAX_HINTED {
            return;
        }
        let w = waited.as_nanos() as u64;
        let avg = self.avg_ns.load(Ordering::Relaxed);
        // A quarter of the way to each new wait: a change of pace is
        // followed within a few waits, one odd wait moves it little.
        let next = if avg == 0 {
            w.max(1)
        } else if w >= avg {
            avg + (w - avg) / 4
        } else {
            avg - (avg - w) / 4
        };
        self.avg_ns.store(next.max(1), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: Duration = Duration::from_micros(DEFAULT_SPIN_US);

    /// `h` after `n` waits of `us` microseconds each.
    fn fed(h: &SpinHint, us: u64, n: usize) {
        for _ in 0..n {
            h.ended(Duration::from_micros(us));
        }
    }

    #[test]
    fn nothing_learned_keeps_the_configured_budget() {
        let h = SpinHint::default();
        assert_eq!(h.budget_from(BASE, false), BASE);
    }

    #[test]
    fn short_waits_keep_the_configured_budget() {
        let h = SpinHint::default();
        fed(&h, 5, 32);
        // 8 x 5 µs is below the floor.
        assert_eq!(h.budget_from(BASE, false), BASE);
    }

    #[test]
    fn slow_round_trips_lengthen_the_budget_up_to_the_cap() {
        let h = SpinHint::default();
        fed(&h, 150, 32);
        let b = h.budget_from(BASE, false);
        assert!(
            b >= Duration::from_micros(1_100) && b <= Duration::from_micros(1_250),
            "about 8 x 150 µs: {b:?}"
        );
        fed(&h, 1_900, 32);
        assert_eq!(h.budget_from(BASE, false), MAX_HINTED);
    }

    #[test]
    fn idle_spells_are_not_learned() {
        let h = SpinHint::default();
        fed(&h, 20, 8);
        let before = h.budget_from(BASE, false);
        for _ in 0..100 {
            h.ended(Duration::from_secs(3));
        }
        assert_eq!(h.budget_from(BASE, false), before);
    }

    #[test]
    fn the_average_follows_a_change_of_pace() {
        let h = SpinHint::default();
        fed(&h, 200, 32);
        assert!(h.budget_from(BASE, false) > Duration::from_micros(1_500));
        fed(&h, 2, 32);
        assert_eq!(h.budget_from(BASE, false), BASE, "back to the floor");
    }

    #[test]
    fn an_explicit_or_zero_budget_is_kept() {
        let h = SpinHint::default();
        fed(&h, 150, 32);
        let set = Duration::from_micros(50);
        assert_eq!(h.budget_from(set, true), set);
        assert_eq!(h.budget_from(Duration::ZERO, false), Duration::ZERO);
        // A configured budget above the cap is never lowered.
        let big = Duration::from_millis(5);
        assert_eq!(h.budget_from(big, false), big);
    }
}
