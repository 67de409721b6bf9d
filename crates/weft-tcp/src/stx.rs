//! Shared transmit contexts (`fi_stx_context`) on RDM and MSG endpoints:
//! the room of one transmit queue (`tx_attr.size`) that the bound
//! endpoints share. Each endpoint's operations still go out on its own
//! connections, in its order per peer, and complete on its own CQ; an
//! operation takes one credit of the context when posted and gives it
//! back when it ends.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use weft_core::attr::TxAttr;
use weft_core::credits::Credits;
use weft_core::provider::{EpConfig, ProviderStx};
use weft_core::{Error, Result};

/// The context.
#[derive(Debug)]
pub struct TcpStx {
    credits: Arc<Credits>,
}

impl TcpStx {
    pub fn open(attr: &TxAttr) -> Arc<TcpStx> {
        Arc::new(TcpStx {
            credits: Arc::new(Credits::new(attr.size.max(1))),
        })
    }
}

impl ProviderStx for TcpStx {
    fn tx_size_left(&self) -> usize {
        self.credits.left()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// An endpoint's transmit credits: its own queue's, or its share of a
/// shared transmit context's. It counts what it holds, so that an
/// endpoint closed with operations in flight (discarded, never
/// completed) gives the context its room back.
#[derive(Debug)]
pub struct TxCredits {
    pool: Arc<Credits>,
    held: AtomicUsize,
}

impl TxCredits {
    /// The credits of an endpoint built from `cfg`. `Inval` for another
    /// provider's context.
    pub fn for_endpoint(cfg: &EpConfig) -> Result<TxCredits> {
        let pool = match &cfg.stx {
            None => Arc::new(Credits::new(cfg.info.tx_attr.size)),
            Some(s) => s
                .as_any()
                .downcast_ref::<TcpStx>()
                .map(|t| t.credits.clone())
                .ok_or(Error::Inval)?,
        };
        Ok(TxCredits {
            pool,
            held: AtomicUsize::new(0),
        })
    }

    /// Takes a slot; `false` when the queue is full.
    pub fn try_take(&self) -> bool {
        if !self.pool.try_take() {
            return false;
        }
        self.held.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// Gives `n` slots back: at most what this endpoint holds, so a
    /// completion racing [`release_all`](Self::release_all) cannot give
    /// back twice.
    pub fn release(&self, n: usize) {
        let mut given = 0;
        let _ = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                given = h.min(n);
                Some(h - given)
            });
        self.pool.release(given);
    }

    /// Endpoint close: whatever it held goes back to the queue.
    pub fn release_all(&self) {
        let n = self.held.swap(0, Ordering::AcqRel);
        self.pool.release(n);
    }

    /// Free slots.
    pub fn left(&self) -> usize {
        self.pool.left()
    }
}
