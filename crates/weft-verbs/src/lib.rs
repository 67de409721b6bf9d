//! Weft's RDMA verbs provider, on `rdma-sys`.
//!
//! Only the `sys` modules call libibverbs/librdmacm; everything above them
//! is safe code. Built without the `rdma` feature, the provider offers
//! nothing and says why.
//!
//! Implemented: device discovery and getinfo (`info`), `FI_EP_MSG` over RC
//! queue pairs connected with rdma_cm (send/recv, remote CQ data through
//! send-with-immediate, inline sends for small messages), `FI_EP_RDM` over
//! RC connections made on first use (tagged matching in software, eager
//! and RDMA-read rendezvous transfers, a shared receive queue),
//! `FI_EP_DGRAM` over a UD queue pair whose AV inserts resolve addresses
//! through rdma_cm (`dgram`), memory
//! regions on the protection domain of their authorization key (`domain`:
//! the domain's, or one per other key) with RDMA write
//! and read on both endpoint types, completion
//! channels driven by the Tokio reactor, a busy-poll thread, or inline
//! polling by the waiting task, and authorization keys on MSG and RDM
//! endpoints, proven in rdma_cm private data (`keyproof`).

// Rejected posts hand the request back by value; see weft_core::provider.
#![allow(clippy::result_large_err)]

/// Provider name.
pub const NAME: &str = "verbs";

#[cfg(feature = "rdma")]
#[allow(unsafe_code)]
pub mod sys;

// Plain and keyed private data, and the key proof's logic, build and are
// unit-tested without the RDMA stack too.
#[cfg(feature = "rdma")]
mod async_reader;
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
mod cm_data;
#[cfg(feature = "rdma")]
mod cm_events;
#[cfg(feature = "rdma")]
mod cq_poller;
#[cfg(feature = "rdma")]
mod dgram;
#[cfg(feature = "rdma")]
mod domain;
#[cfg(feature = "rdma")]
pub mod info;
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
mod keyproof;
#[cfg(feature = "rdma")]
mod liveness;
#[cfg(feature = "rdma")]
mod local_mem;
#[cfg(feature = "rdma")]
mod mr;
#[cfg(feature = "rdma")]
mod msg;
#[cfg(feature = "rdma")]
mod user_bufs;
// Pure logic (device-node parsing, the registration cache's bookkeeping)
// builds and is unit-tested without the RDMA stack too.
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
mod dev_nodes;
// What a device's async events do (routing and logging) is pure logic,
// unit-tested without the RDMA stack too.
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
mod device_events;
#[cfg(feature = "rdma")]
mod passive;
pub mod private_data_check;
#[cfg(feature = "rdma")]
mod rdm;
pub mod regcache;
#[cfg(feature = "rdma")]
mod slot_pool;
// The stream's wire format and credit accounting are pure logic, built
// and unit-tested without the RDMA stack too.
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
mod stream_wire;

use std::sync::Arc;

use tokio::runtime::Handle;
use weft_core::attr::{EpType, Info};
use weft_core::auth::{effective_key, AuthKey};
use weft_core::provider::{EpConfig, PassiveConfig, Provider, ProviderEndpoint, ProviderPassive};
use weft_core::{Error, Result};

/// Why this build offers no verbs domains, or `None` when it was built
/// with RDMA support and found a usable device.
pub fn unavailable_reason() -> Option<String> {
    #[cfg(feature = "rdma")]
    {
        info::no_device_reason()
    }
    #[cfg(not(feature = "rdma"))]
    {
        Some("weft was built without the `verbs` feature (no RDMA support compiled in)".into())
    }
}

/// What commonly causes `err` from this provider on this machine, if the
/// cause can be seen from here: a locked-memory limit too low for memory
/// registration behind `NoMem`, the missing device behind `NoDev`.
/// libfabric's errno values cannot say which limit or node is at fault;
/// this names it so that a tool can print it next to the error.
pub fn error_hint(err: Error) -> Option<String> {
    #[cfg(feature = "rdma")]
    match err {
        Error::NoMem => return info::memlock_warning(),
        Error::NoDev | Error::NoData => return info::no_device_reason(),
        _ => {}
    }
    let _ = err;
    None
}

/// The offers of this provider (empty without a device).
pub fn offers() -> Vec<Info> {
    #[cfg(feature = "rdma")]
    {
        info::offers()
    }
    #[cfg(not(feature = "rdma"))]
    {
        Vec::new()
    }
}

/// Opens the provider side of a domain (its protection domain); `NoSys`
/// in a build without RDMA support.
pub fn open_domain(info: &Info) -> Result<Arc<dyn weft_core::provider::ProviderDomain>> {
    #[cfg(feature = "rdma")]
    {
        domain::open(info)
    }
    #[cfg(not(feature = "rdma"))]
    {
        let _ = info;
        Err(Error::NoSys)
    }
}

/// Opens (enables) an endpoint: `FI_EP_MSG`, `FI_EP_RDM` or `FI_EP_DGRAM`
/// (the last on a domain opened with a DGRAM info). Other types
/// are not offered by getinfo and are `NoSys` here. A traffic class
/// (`tx_attr.tclass`) becomes the IP TOS of the endpoint's rdma_cm ids
/// and address handles; one that is neither a DSCP value nor a label is
/// `Inval`. Keys: see [`endpoint_key`].
pub fn open_endpoint(cfg: EpConfig, rt: Handle) -> Result<Arc<dyn ProviderEndpoint>> {
    endpoint_key(&cfg.info)?;
    #[cfg(feature = "rdma")]
    match cfg.info.ep_attr.ep_type {
        // MSG and RDM endpoints take receives from a shared context; a
        // stream endpoint's receives are its own.
        weft_core::attr::EpType::Dgram | weft_core::attr::EpType::SockStream
            if cfg.srx.is_some() =>
        {
            return Err(Error::NoSys)
        }
        weft_core::attr::EpType::Msg | weft_core::attr::EpType::SockStream => {
            return msg::open(cfg, rt)
        }
        weft_core::attr::EpType::Rdm => return rdm::open(cfg, rt),
        weft_core::attr::EpType::Dgram => return dgram::open(cfg, rt),
        _ => {}
    }
    let _ = (cfg, rt);
    Err(Error::NoSys)
}

/// Opens (enables) a scalable RDM endpoint (`rdm::scalable`); `NoSys`
/// for other endpoint types. Keys: see [`endpoint_key`].
pub fn open_scalable(cfg: EpConfig, rt: Handle) -> Result<Arc<dyn ProviderEndpoint>> {
    endpoint_key(&cfg.info)?;
    #[cfg(feature = "rdma")]
    if cfg.info.ep_attr.ep_type == weft_core::attr::EpType::Rdm {
        return rdm::scalable::open(cfg, rt);
    }
    let _ = (cfg, rt);
    Err(Error::NoSys)
}

/// The IP TOS byte of `info`'s traffic class (DSCP << 2, ECN bits
/// clear), which RoCE carries as the traffic class of the address vector
/// of a queue pair or address handle; `None` leaves the device default.
#[cfg(feature = "rdma")]
pub(crate) fn tos_of(info: &Info) -> Result<Option<u8>> {
    Ok(weft_core::tclass::to_dscp(info.tx_attr.tclass)?.map(|d| d << 2))
}

/// The traffic class the device holds in the address vectors of `qps`
/// (`EpStats::tclass`): `None` when there is none to read, a query fails
/// or they disagree.
#[cfg(feature = "rdma")]
pub(crate) fn qp_tclass<'a>(qps: impl IntoIterator<Item = &'a sys::QueuePair>) -> Option<u8> {
    let mut seen = None;
    for qp in qps {
        let tc = qp.address_vector().ok()?.traffic_class;
        if seen.is_some_and(|s| s != tc) {
            return None;
        }
        seen = Some(tc);
    }
    seen
}

/// Opens a listening passive endpoint: `addr` raw, else the offer's
/// source address (an address of the RDMA device's netdev).
pub fn open_passive(cfg: PassiveConfig, rt: Handle) -> Result<Arc<dyn ProviderPassive>> {
    #[cfg(feature = "rdma")]
    {
        let raw = cfg
            .addr
            .clone()
            .or_else(|| cfg.info.src_addr.clone())
            .ok_or(Error::AddrNotAvail)?;
        let a = weft_core::addr::decode_sockaddr(&raw)?;
        let tos = tos_of(&cfg.info)?;
        Ok(Arc::new(passive::VerbsPassive::open(a, cfg, tos, rt)?))
    }
    #[cfg(not(feature = "rdma"))]
    {
        let _ = (cfg, rt);
        Err(Error::NoDev)
    }
}

/// The verbs provider, as the `weft` registry holds it.
#[derive(Debug, Clone, Copy, Default)]
pub struct VerbsProvider;

impl Provider for VerbsProvider {
    fn name(&self) -> &'static str {
        NAME
    }

    fn built(&self) -> bool {
        cfg!(feature = "rdma")
    }

    fn offers(&self) -> Vec<Info> {
        offers()
    }

    fn unavailable_reason(&self) -> Option<String> {
        unavailable_reason()
    }

    fn error_hint(&self, err: Error) -> Option<String> {
        error_hint(err)
    }

    /// MSG and RDM endpoints prove their key over rdma_cm
    /// (`keyproof`); DGRAM endpoints refuse one (`OpNotSupp`).
    fn auth_keys(&self) -> bool {
        true
    }

    /// Keys in the AV (`FI_AV_AUTH_KEY`) on RDM endpoints (a lane per
    /// key, `rdm`); MSG and DGRAM domains with them are `OpNotSupp`.
    fn av_auth_keys(&self) -> bool {
        true
    }

    /// Hints with `FI_AV_AUTH_KEY` match RDM offers only, which then hold
    /// up to an AV's worth of keys per endpoint.
    fn offer_for(&self, hints: &Info, offer: &mut Info) {
        if hints.domain_attr.av_auth_key {
            offer.domain_attr.max_ep_auth_key = match offer.ep_attr.ep_type {
                EpType::Rdm => weft_core::av::MAX_AV_AUTH_KEYS,
                _ => 0,
            };
        }
    }

    fn open_domain(
        &self,
        info: &Info,
    ) -> Result<Option<Arc<dyn weft_core::provider::ProviderDomain>>> {
        no_av_keys(info)?;
        no_tls(info)?;
        open_domain(info).map(Some)
    }

    fn open_endpoint(&self, cfg: EpConfig) -> Result<Arc<dyn ProviderEndpoint>> {
        no_tls(&cfg.info)?;
        open_endpoint(cfg, Handle::current())
    }

    fn open_scalable(&self, cfg: EpConfig) -> Result<Arc<dyn ProviderEndpoint>> {
        no_tls(&cfg.info)?;
        open_scalable(cfg, Handle::current())
    }

    fn open_passive(&self, cfg: PassiveConfig) -> Result<Arc<dyn ProviderPassive>> {
        no_av_keys(&cfg.info)?;
        effective_key(
            cfg.info.ep_attr.auth_key.as_deref(),
            cfg.info.domain_attr.auth_key.as_deref(),
        )?;
        no_tls(&cfg.info)?;
        open_passive(cfg, Handle::current())
    }
}

/// The key an endpoint with `info` proves (its own, else its domain's).
/// A key of the wrong size is `Inval`; a key on a DGRAM endpoint is
/// `OpNotSupp` (no connection to prove it on). A key other than a keyed
/// domain's is taken: its connections' queue pairs live in that key's
/// protection domain (`domain`), where the domain's regions under other
/// keys are out of reach.
pub fn endpoint_key(info: &Info) -> Result<Option<AuthKey>> {
    no_av_keys(info)?;
    let key = effective_key(
        info.ep_attr.auth_key.as_deref(),
        info.domain_attr.auth_key.as_deref(),
    )?;
    if key.is_some() && info.ep_attr.ep_type == EpType::Dgram {
        return Err(Error::OpNotSupp);
    }
    Ok(key)
}

/// Refuses keys in the AV (`FI_AV_AUTH_KEY`) on anything but RDM
/// (`OpNotSupp`): a MSG connection proves one key, chosen before any AV
/// entry names a peer, and DGRAM has no connection to prove one on.
fn no_av_keys(info: &Info) -> Result<()> {
    if info.domain_attr.av_auth_key && info.ep_attr.ep_type != EpType::Rdm {
        return Err(Error::OpNotSupp);
    }
    Ok(())
}

/// Refuses TLS (`OpNotSupp`): RDMA traffic bypasses any stream a TLS
/// session could wrap, so a verbs object asked for TLS would carry the
/// application's bytes in the clear.
fn no_tls(info: &Info) -> Result<()> {
    if info.domain_attr.tls.is_some() {
        return Err(Error::OpNotSupp);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Keys on MSG and RDM (the endpoint's own before its domain's),
    /// refused on DGRAM; FI_AV_AUTH_KEY domains and endpoints refused
    /// but for RDM, whose offers then hold an AV's keys.
    #[test]
    fn which_keys_are_taken() {
        let p = VerbsProvider;
        assert!(p.auth_keys());
        assert!(p.av_auth_keys());
        for t in [EpType::Msg, EpType::Dgram] {
            let mut i = Info::default();
            i.domain_attr.av_auth_key = true;
            i.ep_attr.ep_type = t;
            assert_eq!(p.open_domain(&i).err(), Some(Error::OpNotSupp));
            assert_eq!(endpoint_key(&i), Err(Error::OpNotSupp));
            let mut o = Info::default();
            o.ep_attr.ep_type = t;
            o.domain_attr.max_ep_auth_key = 1;
            p.offer_for(&i, &mut o);
            assert_eq!(o.domain_attr.max_ep_auth_key, 0);
        }
        let mut i = Info::default();
        i.domain_attr.av_auth_key = true;
        i.ep_attr.ep_type = EpType::Rdm;
        assert_eq!(no_av_keys(&i), Ok(()));
        let mut o = Info::default();
        o.ep_attr.ep_type = EpType::Rdm;
        p.offer_for(&i, &mut o);
        assert_eq!(
            o.domain_attr.max_ep_auth_key,
            weft_core::av::MAX_AV_AUTH_KEYS
        );
        let a = AuthKey::new(b"job-a").unwrap();
        let b = AuthKey::new(b"job-b").unwrap();
        for t in [EpType::Msg, EpType::Rdm] {
            let mut i = Info::default();
            i.ep_attr.ep_type = t;
            assert_eq!(endpoint_key(&i), Ok(None));
            i.ep_attr.auth_key = Some(b"job-a".to_vec());
            assert_eq!(endpoint_key(&i), Ok(Some(a.clone())));
            i.domain_attr.auth_key = Some(b"job-b".to_vec());
            assert_eq!(endpoint_key(&i), Ok(Some(a.clone())));
            i.ep_attr.auth_key = None;
            assert_eq!(endpoint_key(&i), Ok(Some(b.clone())));
            i.ep_attr.auth_key = Some(Vec::new());
            assert_eq!(endpoint_key(&i), Err(Error::Inval));
        }
        let mut i = Info::default();
        i.ep_attr.ep_type = EpType::Dgram;
        assert_eq!(endpoint_key(&i), Ok(None));
        i.domain_attr.auth_key = Some(b"job-a".to_vec());
        assert_eq!(endpoint_key(&i), Err(Error::OpNotSupp));
        for o in offers() {
            let want = usize::from(o.ep_attr.ep_type != EpType::Dgram);
            assert_eq!(o.domain_attr.max_ep_auth_key, want);
            assert!(!o.domain_attr.av_auth_key);
        }
    }

    /// TLS is refused before anything is opened, and no offer claims it.
    #[test]
    fn tls_is_refused() {
        let p = VerbsProvider;
        assert_eq!(
            p.check_tls(Some(&weft_core::tls::TlsFiles::new("c", "k", "ca"))),
            Err(Error::OpNotSupp)
        );
        let mut i = Info::default();
        i.domain_attr.tls = Some(weft_core::tls::TlsFiles::new("c", "k", "ca"));
        assert_eq!(p.open_domain(&i).err(), Some(Error::OpNotSupp));
        assert_eq!(no_tls(&i), Err(Error::OpNotSupp));
        assert_eq!(no_tls(&Info::default()), Ok(()));
        for o in offers() {
            assert!(!o.domain_attr.tls_capable);
        }
    }
}
