//! Queue depth accounting shared by providers: `tx_attr.size` and
//! `rx_attr.size` slots, taken at post time and given back when the
//! operation ends.

use std::sync::atomic::{AtomicUsize, Ordering};

/// A queue's slots: operations in flight against its depth.
#[derive(Debug)]
pub struct Credits {
    used: AtomicUsize,
    size: usize,
}

impl Credits {
    /// A queue of depth `size` (at least 1), all slots free.
    pub fn new(size: usize) -> Credits {
        Credits {
            used: AtomicUsize::new(0),
            size: size.max(1),
        }
    }

    /// Takes a slot; `false` when the queue is full.
    pub fn try_take(&self) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                (u < self.size).then_some(u + 1)
            })
            .is_ok()
    }

    /// Takes a slot even past the depth (work already accepted elsewhere).
    pub fn take(&self) {
        self.used.fetch_add(1, Ordering::AcqRel);
    }

    /// Gives `n` slots back.
    ///
    /// One `fetch_sub`: every operation and every completion calls this,
    /// and the compare-and-swap loop it replaces was a load, the
    /// exchange and its retry test. A release never gives back more
    /// than was taken, so the subtraction does not wrap; if a caller's
    /// error ever did, the count is put back to zero at once (as the
    /// saturating loop kept it) rather than left near `usize::MAX`, where
    /// every `try_take` would fail for good.
    #[inline]
    pub fn release(&self, n: usize) {
        let before = self.used.fetch_sub(n, Ordering::AcqRel);
        if before < n {
            self.undo_wrap(n - before);
        }
    }

    /// [`release`](Self::release) past zero: adds back what wrapped.
    #[cold]
    #[inline(never)]
    fn undo_wrap(&self, over: usize) {
        self.used.fetch_add(over, Ordering::AcqRel);
    }

    /// Free slots.
    pub fn left(&self) -> usize {
        self.size.saturating_sub(self.used.load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_come_back_and_never_go_below_zero() {
        let c = Credits::new(2);
        assert!(c.try_take());
        assert!(c.try_take());
        assert!(!c.try_take(), "the depth holds");
        c.release(1);
        assert_eq!(c.left(), 1);
        c.release(1);
        assert_eq!(c.left(), 2);
        // More back than was taken (a caller's mistake): zero, as the
        // saturating release left it, and the queue still works.
        c.release(3);
        assert_eq!(c.left(), 2);
        assert!(c.try_take());
        assert!(c.try_take());
        assert!(!c.try_take());
    }
}
