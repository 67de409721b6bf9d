//! A place in an endpoint's (or a passive endpoint's) connection count,
//! given back by `Drop`, so that no path that ends a connection, or a
//! request nobody answered, can forget to. The same rule as the tcp
//! provider's: inbound connections are refused beyond the limit, the
//! ones the application asked for are counted but never refused.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// One place in a connection count.
#[derive(Debug)]
pub(crate) struct ConnSlot {
    count: Arc<AtomicUsize>,
}

impl ConnSlot {
    /// A place if fewer than `max` are taken.
    pub(crate) fn try_take(count: &Arc<AtomicUsize>, max: usize) -> Option<ConnSlot> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| ConnSlot {
                count: count.clone(),
            })
    }

    /// A place whatever the count (outbound connections).
    pub(crate) fn take(count: &Arc<AtomicUsize>) -> ConnSlot {
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
        let c = ConnSlot::take(&count);
        assert_eq!(count.load(Ordering::Acquire), 3);
        drop((a, c));
        assert_eq!(count.load(Ordering::Acquire), 1);
        assert!(ConnSlot::try_take(&count, 2).is_some());
        drop(b);
        assert_eq!(count.load(Ordering::Acquire), 0);
    }
}
