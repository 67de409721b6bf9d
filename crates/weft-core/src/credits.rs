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
    pub fn release(&self, n: usize) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                Some(u.saturating_sub(n))
            });
    }

    /// Free slots.
    pub fn left(&self) -> usize {
        self.size.saturating_sub(self.used.load(Ordering::Acquire))
    }
}
