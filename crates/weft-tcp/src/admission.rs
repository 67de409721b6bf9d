//! What a buffered message holds: a charge against the unexpected
//! budget, given back by `Drop`, so no path that ends a message can
//! forget to. (A connection's place in the count is
//! `weft_core::limits::ConnSlot`.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use crate::endpoint::EpShared;

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
