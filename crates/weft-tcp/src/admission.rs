//! What a peer may make an endpoint hold: a place in the connection
//! count, and a charge against the unexpected-message budget. Both are
//! given back by `Drop`, so no path that ends a connection or a message
//! can forget to.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use crate::endpoint::EpShared;

/// One place in an endpoint's connection count.
#[derive(Debug)]
pub struct ConnSlot {
    count: Arc<AtomicUsize>,
}

impl ConnSlot {
    /// A place if fewer than `max` are taken.
    pub fn try_take(count: &Arc<AtomicUsize>, max: usize) -> Option<ConnSlot> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| ConnSlot {
                count: count.clone(),
            })
    }

    /// A place whatever the count: connections the application asked for
    /// (outbound, MSG) are counted but never refused here.
    pub fn take(count: &Arc<AtomicUsize>) -> ConnSlot {
        count.fetch_add(1, Ordering::AcqRel);
        ConnSlot {
            count: count.clone(),
        }
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Bytes one buffered unexpected message holds against its connection's
/// share and the endpoint's budget, released when the message is freed
/// (received, discarded, or dead with its connection).
#[derive(Debug)]
pub struct Charge {
    amount: usize,
    peer: Arc<AtomicUsize>,
    ep: Weak<EpShared>,
}

impl Charge {
    /// Charges `amount`. The caller checked that it fits, under the
    /// matcher lock, so admissions never race each other past the budget.
    pub fn new(ep: &Arc<EpShared>, peer: &Arc<AtomicUsize>, amount: usize) -> Charge {
        peer.fetch_add(amount, Ordering::AcqRel);
        ep.unexp_charged.fetch_add(amount, Ordering::AcqRel);
        Charge {
            amount,
            peer: peer.clone(),
            ep: Arc::downgrade(ep),
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.peer.fetch_sub(self.amount, Ordering::AcqRel);
        if let Some(ep) = self.ep.upgrade() {
            ep.unexp_charged.fetch_sub(self.amount, Ordering::AcqRel);
            ep.parked.wake_for_budget(&ep);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn slots_stop_at_the_limit_and_come_back_on_drop() {
        let count = Arc::new(AtomicUsize::new(0));
        let a = ConnSlot::try_take(&count, 2).unwrap();
        let b = ConnSlot::try_take(&count, 2).unwrap();
        assert!(ConnSlot::try_take(&count, 2).is_none());
        // Counted beyond the limit, never refused.
        let c = ConnSlot::take(&count);
        assert_eq!(count.load(Ordering::Acquire), 3);
        drop((a, c));
        assert_eq!(count.load(Ordering::Acquire), 1);
        assert!(ConnSlot::try_take(&count, 2).is_some());
        drop(b);
        assert_eq!(count.load(Ordering::Acquire), 0);
    }
}
