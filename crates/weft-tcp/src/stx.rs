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
/// shared transmit context's. Bound to a context it counts what it
/// holds, so that an endpoint closed with operations in flight
/// (discarded, never completed) gives the context its room back; an
/// endpoint of its own counts nothing more (no cost per operation).
#[derive(Debug)]
pub struct TxCredits {
    pool: Arc<Credits>,
    held: Option<AtomicUsize>,
}

impl TxCredits {
    /// The credits of an endpoint built from `cfg`. `Inval` for another
    /// provider's context.
    pub fn for_endpoint(cfg: &EpConfig) -> Result<TxCredits> {
        let Some(s) = &cfg.stx else {
            return Ok(TxCredits {
                pool: Arc::new(Credits::new(cfg.info.tx_attr.size)),
                held: None,
            });
        };
        let stx = s.as_any().downcast_ref::<TcpStx>().ok_or(Error::Inval)?;
        Ok(TxCredits {
            pool: stx.credits.clone(),
            held: Some(AtomicUsize::new(0)),
        })
    }

    /// Takes a slot; `false` when the queue is full.
    pub fn try_take(&self) -> bool {
        if !self.pool.try_take() {
            return false;
        }
        if let Some(h) = &self.held {
            h.fetch_add(1, Ordering::AcqRel);
        }
        true
    }

    /// Gives `n` slots back; to a shared context at most what this
    /// endpoint holds, so a completion racing
    /// [`release_all`](Self::release_all) cannot give back twice.
    pub fn release(&self, n: usize) {
        let Some(h) = &self.held else {
            self.pool.release(n);
            return;
        };
        let mut given = 0;
        let _ = h.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
            given = held.min(n);
            Some(held - given)
        });
        self.pool.release(given);
    }

    /// Endpoint close: whatever it held of a shared context goes back.
    pub fn release_all(&self) {
        if let Some(h) = &self.held {
            self.pool.release(h.swap(0, Ordering::AcqRel));
        }
    }

    /// Free slots.
    pub fn left(&self) -> usize {
        self.pool.left()
    }
}
