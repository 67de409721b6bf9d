//! Weft's udp provider: `FI_EP_DGRAM` endpoints over UDP sockets.
//!
//! A message is one datagram: a 24-byte header (tag, remote CQ data,
//! length; [`wire`]) and the payload, at most what one datagram carries
//! over the bound interface (its MTU less the IP, UDP and Weft headers).
//! Nothing is acknowledged or retransmitted: a datagram the network or a
//! full socket buffer loses is lost, as `FI_EP_DGRAM` allows.
//!
//! The receiver matches in software (`weft_core::tagmatch`): a datagram
//! that arrives before its receive is held, within the unexpected budget
//! (`rx_attr.total_buffered_recv`), for a receive posted later; past the
//! budget, and when it is not a well-formed Weft datagram, it is dropped
//! and counted (`EpStats::rx_dropped`, `EpStats::rx_malformed`).
//!
//! Progress follows the tcp provider's three wait modes: a reader task
//! woken by the reactor (`WaitMode::Interrupt`), a spinning thread parked
//! while a waiter drives the endpoint itself (`WaitMode::BusyPoll`), and
//! the waiter alone while it spins (`WaitMode::Inline`). See
//! `docs/design.md`, "The udp provider".
#![forbid(unsafe_code)]
// Rejected posts hand the request back by value; see weft_core::provider.
#![allow(clippy::result_large_err)]

mod domain;
mod driver;
mod endpoint;
pub mod ifaces;
mod keys;
mod multicast;
mod offer;
mod rx;
mod sock;
#[cfg(test)]
mod tests;
mod tx;
pub mod wire;

use std::sync::Arc;

use tokio::runtime::Handle;
use weft_core::attr::{EpType, Info};
use weft_core::progress::Progress;
use weft_core::provider::{EpConfig, Provider, ProviderDomain, ProviderEndpoint};
use weft_core::{Error, Result};

pub use offer::{offer, offers, CAPS};

/// Provider name.
pub const NAME: &str = "udp";
/// Bytes `FI_INJECT` accepts (at most `max_msg_size`).
pub const INJECT_SIZE: usize = 4096;
/// Default queue depth.
pub const QUEUE_SIZE: usize = 1024;
/// Buffers per operation.
pub const IOV_LIMIT: usize = 4;
/// Bytes of datagrams held for receives not yet posted, each charged its
/// length plus `weft_core::limits::UNEXPECTED_OVERHEAD`.
pub const BUFFERED_RECV: usize = 8 << 20;
/// `FI_TAG_GENERIC`: 64 tag bits.
pub const MEM_TAG_FORMAT: u64 = 0xAAAA_AAAA_AAAA_AAAA;

/// The udp provider, as the `weft` registry holds it.
#[derive(Debug, Clone, Copy, Default)]
pub struct UdpProvider;

impl Provider for UdpProvider {
    fn name(&self) -> &'static str {
        NAME
    }

    fn offers(&self) -> Vec<Info> {
        offers()
    }

    /// Keyed DGRAM endpoints prove their key in every datagram
    /// (`weft_core::dgram_auth`); SOCK_DGRAM endpoints refuse keys when
    /// they open (`OpNotSupp`).
    fn auth_keys(&self) -> bool {
        true
    }

    /// Keys held in the AV (`FI_AV_AUTH_KEY`): a DGRAM endpoint proves
    /// each AV entry's key and names it in the datagram (`keys.rs`).
    fn av_auth_keys(&self) -> bool {
        true
    }

    fn offer_for(&self, hints: &Info, offer: &mut Info) {
        offer::keyed(hints, offer);
    }

    fn open_domain(&self, _info: &Info) -> Result<Option<Arc<dyn ProviderDomain>>> {
        Ok(Some(Arc::new(domain::UdpDomain)))
    }

    fn open_endpoint(&self, cfg: EpConfig) -> Result<Arc<dyn ProviderEndpoint>> {
        open_endpoint(cfg, Handle::current())
    }
}

/// Opens (enables) a DGRAM or SOCK_DGRAM endpoint: binds its socket and
/// starts its drivers. Other endpoint types are `NoSys`; multicast is not
/// offered.
pub fn open_endpoint(cfg: EpConfig, rt: Handle) -> Result<Arc<dyn ProviderEndpoint>> {
    let allowed = match cfg.info.ep_attr.ep_type {
        EpType::Dgram => CAPS,
        EpType::SockDgram if cfg.srx.is_some() => return Err(Error::Inval),
        EpType::SockDgram => offer::SOCK_DGRAM_CAPS,
        _ => return Err(Error::NoSys),
    };
    if cfg.info.caps.intersects(!allowed) {
        // Asked for something no offer has (multicast, RMA, ...).
        return Err(Error::NoSys);
    }
    let _g = rt.enter();
    let _span = tracing::debug_span!("udp_open", fid = cfg.fid).entered();
    let shared = endpoint::EpShared::open(cfg, rt.clone())?;
    driver::start(&shared)?;
    let inline: Arc<dyn Progress> = Arc::new(driver::InlineProgress { ep: shared.clone() });
    Ok(Arc::new(endpoint::UdpEndpoint { shared, inline }))
}
