//! What a buffered message holds: a charge against the unexpected
//! budget, given back by `Drop`, so no path that ends a message can
//! forget to. (A connection's place in the count is
//! `weft_core::limits::ConnSlot`.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use crate::endpoint::EpShared;
use crate::srx::SrxCore;

/// Bytes one buffered unexpected message holds against its connection's
/// share and the budget it was admitted under (its endpoint's, or its
/// shared receive context's), released when the message is freed
/// (received, discarded, or dead with its connection).
#[derive(Debug)]
pub struct Charge {
    amount: usize,
    peer: Arc<AtomicUsize>,
    pool: Pool,
}

/// The budget a charge counts against.
#[derive(Debug)]
enum Pool {
    Ep(Weak<EpShared>),
    Srx(Weak<SrxCore>),
}

impl Charge {
    /// Charges `amount`. The caller checked that it fits, under the
    /// matcher lock, so admissions never race each other past the budget.
    pub fn new(ep: &Arc<EpShared>, peer: &Arc<AtomicUsize>, amount: usize) -> Charge {
        Charge::take(
            peer,
            &ep.unexp_charged,
            amount,
            Pool::Ep(Arc::downgrade(ep)),
        )
    }

    /// [`new`](Self::new) against a shared receive context's budget.
    pub fn srx(srx: &Arc<SrxCore>, peer: &Arc<AtomicUsize>, amount: usize) -> Charge {
        Charge::take(peer, &srx.charged, amount, Pool::Srx(Arc::downgrade(srx)))
    }

    fn take(peer: &Arc<AtomicUsize>, total: &AtomicUsize, amount: usize, pool: Pool) -> Charge {
        peer.fetch_add(amount, Ordering::AcqRel);
        total.fetch_add(amount, Ordering::AcqRel);
        Charge {
            amount,
            peer: peer.clone(),
            pool,
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.peer.fetch_sub(self.amount, Ordering::AcqRel);
        match &self.pool {
            Pool::Ep(w) => {
                if let Some(ep) = w.upgrade() {
                    ep.unexp_charged.fetch_sub(self.amount, Ordering::AcqRel);
                    ep.parked.wake_for_budget(&ep);
                }
            }
            Pool::Srx(w) => {
                if let Some(s) = w.upgrade() {
                    s.charged.fetch_sub(self.amount, Ordering::AcqRel);
                    s.wake_for_budget();
                }
            }
        }
    }
}
