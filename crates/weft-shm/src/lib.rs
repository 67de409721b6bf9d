//! Weft's shm provider: `FI_EP_RDM` endpoints between the processes of
//! one host, over shared memory.
//!
//! Each endpoint owns a segment in `/dev/shm` named after it (its address
//! is `fi_shm://<name>`): a header and 16 receive channels, each a
//! single-producer ring of 256 KiB that one sending endpoint claims
//! ([`layout`], `docs/wire.md`). A sender copies a message into its ring
//! in records of at most a quarter ring; the receiver matches in software
//! (`weft_core::tagmatch`) and copies each record straight into the
//! receive's buffers, or holds the message for a later receive within
//! the unexpected budget (`rx_attr.total_buffered_recv`). A message that
//! fits neither waits in its ring: nothing is dropped. Messages of 32 to
//! 256 KiB (larger ones too when their channel is idle) go in one copy
//! instead, where the kernel permits it: the receiver reads them from the
//! sender's memory (`process_vm_readv`, [`cma`]). RMA reads and writes go
//! as request records that the target's receive pass checks (key, range,
//! right) and executes on its own regions, answering over its channel
//! back (`rma`, `mr`) — from 256 KiB moving the bytes itself between the
//! region and the initiator's buffers by CMA; atomics the same way,
//! applied by `weft_core::atomic` (`atomic`).
//!
//! Everything read from a segment is checked before use: a peer writing
//! garbage there gets its channel freed (`EpStats::rx_malformed`), never
//! an access outside the segment or a panic. The unsafe code is confined
//! to three modules: `segment` (the mapping and its accessors),
//! `claim_lock` (the `fcntl` byte-lock calls, which rustix lacks) and
//! [`pool`] (a buffer pool's memory put under a shared mapping a peer may
//! map, so large messages between pools are copied without the kernel),
//! and one call in `bell` (registering the doorbell with Tokio's
//! reactor, whose safe form is deprecated).
//!
//! Progress follows the other providers' three wait modes; in interrupt
//! mode the driver sleeps in the Tokio reactor on a doorbell FIFO that
//! senders write only when it said it sleeps. A killed peer is found by
//! its pid and start time within [`SWEEP_EVERY`]: sends to it fail with
//! `FI_ECONNRESET`, its segment is removed, and segments of crashed runs
//! are reclaimed when a process opens its first shm domain. See
//! `docs/design.md`, "The shm provider".
#![deny(unsafe_code)]
// Rejected posts hand the request back by value; see weft_core::provider.
#![allow(clippy::result_large_err)]

mod atomic;
mod bell;
mod by_addr;
pub mod claim_lock;
pub mod cma;
mod create;
mod domain;
mod driver;
mod endpoint;
mod keyproof;
mod keys;
pub mod layout;
pub mod live;
mod mr;
pub mod name;
mod offer;
mod out;
pub mod pool;
mod pool_map;
pub mod ring;
mod rma;
mod rx;
mod rx_done;
pub mod scan;
pub mod segment;
pub mod split;
mod srx;
mod state;
#[cfg(test)]
mod test_fifo;
#[cfg(test)]
mod test_files;
mod tx;
mod tx_drive;

use std::sync::{Arc, Once};

use tokio::runtime::Handle;
use weft_core::attr::{EpType, Info};
use weft_core::progress::Progress;
use weft_core::provider::{EpConfig, Provider, ProviderDomain, ProviderEndpoint};
use weft_core::{Error, Result};

pub use domain::{resolve_timeout, RESOLVE_TIMEOUT};
pub use driver::{set_sweep_every, SWEEP_EVERY};
pub use offer::{fabric_name, offer, offers, CAPS};

/// Provider name.
pub const NAME: &str = "shm";
/// Largest message.
pub const MAX_MSG_SIZE: usize = 64 << 20;
/// Bytes `FI_INJECT` accepts.
pub const INJECT_SIZE: usize = 4096;
/// Default queue depth.
pub const QUEUE_SIZE: usize = 1024;
/// Buffers per operation.
pub const IOV_LIMIT: usize = 4;
/// Bytes of messages held for receives not yet posted, each charged its
/// length plus `weft_core::limits::UNEXPECTED_OVERHEAD`.
pub const BUFFERED_RECV: usize = 64 << 20;
/// `FI_TAG_GENERIC`: 64 tag bits.
pub const MEM_TAG_FORMAT: u64 = 0xAAAA_AAAA_AAAA_AAAA;

/// The shm provider, as the `weft` registry holds it.
#[derive(Debug, Clone, Copy, Default)]
pub struct ShmProvider;

impl Provider for ShmProvider {
    fn name(&self) -> &'static str {
        NAME
    }

    fn offers(&self) -> Vec<Info> {
        offers()
    }

    /// Channels prove keys when they are claimed (`keyproof`).
    fn auth_keys(&self) -> bool {
        true
    }

    /// Keys held in the AV (`FI_AV_AUTH_KEY`): a claim names the key it
    /// proves by id (`keys`).
    fn av_auth_keys(&self) -> bool {
        true
    }

    fn open_domain(&self, _info: &Info) -> Result<Option<Arc<dyn ProviderDomain>>> {
        static RECLAIM: Once = Once::new();
        RECLAIM.call_once(|| {
            live::reclaim_stale();
        });
        Ok(Some(Arc::new(domain::ShmDomain::new())))
    }

    fn open_endpoint(&self, cfg: EpConfig) -> Result<Arc<dyn ProviderEndpoint>> {
        open_endpoint(cfg, Handle::current())
    }
}

/// Opens (enables) an RDM endpoint: creates its segment and doorbell and
/// starts its drivers. Other endpoint types, and capabilities no offer
/// has (RMA events), are `NoSys`.
pub fn open_endpoint(cfg: EpConfig, rt: Handle) -> Result<Arc<dyn ProviderEndpoint>> {
    if cfg.info.ep_attr.ep_type != EpType::Rdm {
        return Err(Error::NoSys);
    }
    if cfg.info.caps.intersects(!CAPS) {
        return Err(Error::NoSys);
    }
    let _g = rt.enter();
    let _span = tracing::debug_span!("shm_open", fid = cfg.fid).entered();
    let shared = endpoint::EpShared::open(cfg, rt.clone())?;
    let inline: Arc<dyn Progress> = Arc::new(driver::InlineProgress {
        ep: shared.clone(),
        hint: Default::default(),
    });
    let ep = endpoint::ShmEndpoint { shared, inline };
    // On failure `ep` drops, and its close removes the segment and
    // doorbell: else they would stay under our name, naming a live
    // process, unheld, for as long as it runs.
    driver::start(&ep.shared)?;
    Ok(Arc::new(ep))
}
