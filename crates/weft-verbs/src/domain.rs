//! The verbs domain: one protection domain per `fi_domain`, on the device
//! context librdmacm uses, shared by the domain's memory regions and the
//! queue pairs of its endpoints.
//!
//! Authorization keys: a region cannot tell one queue pair of its
//! protection domain from another (a remote key works on all of them), so
//! a region key is enforced only as the domain's own: on a keyed domain
//! every endpoint holds the domain's key (`crate::endpoint_key`), so every
//! connection on its queue pairs proved it, and a region under that key
//! (`MrAttr::auth_key` or the domain's default) is reached by that job
//! alone. Any other region key is `OpNotSupp`.
//!
//! A remote key is only honoured on a queue pair of the region's
//! protection domain, so an endpoint that is to be the target of RMA must
//! create its queue pairs there. Using librdmacm's context (not one from
//! `ibv_open_device`) matters: queue pairs made through rdma_cm live on
//! it, and objects of two contexts cannot be mixed.

use std::net::SocketAddr;
use std::sync::Arc;

use weft_core::addr::decode_sockaddr;
use weft_core::attr::{EpType, Info};
use weft_core::auth::AuthKey;
use weft_core::provider::{
    AddrResolver, EpConfig, MrCacheStats, MrRequest, ProviderDomain, ProviderMr, ProviderSrx,
    Rejected,
};

use crate::dgram::UdResolver;
use crate::regcache::CacheLimits;
use crate::user_bufs::SourceCache;
use weft_core::{Error, Result};

use crate::sys::{AtomicCap, CmId, Context, EventChannel, PoolMr, PortSpace, ProtectionDomain};
use weft_core::pool::{Carved, PoolMemory};

/// The per-domain verbs objects.
#[derive(Debug)]
pub struct VerbsDomain {
    pd: Arc<ProtectionDomain>,
    /// The device does 64-bit atomics: remote-writable regions take them.
    atomics: bool,
    /// A domain opened for `FI_EP_DGRAM`: its AVs resolve addresses.
    ud: Option<Arc<UdResolver>>,
    /// Registrations of send sources, shared by the domain's endpoints.
    cache: Arc<SourceCache>,
    /// `domain_attr.auth_key`: what every endpoint here proves.
    key: Option<AuthKey>,
    /// The endpoint type it was opened for: whose shared receive
    /// contexts it opens (MSG: an SRQ; RDM: a software matcher).
    ep_type: EpType,
}

/// Opens the domain of `info`: its device is the one that owns the
/// offer's source address.
pub fn open(info: &Info) -> Result<Arc<dyn ProviderDomain>> {
    let key = info
        .domain_attr
        .auth_key
        .as_deref()
        .map(AuthKey::new)
        .transpose()?;
    let src = info
        .src_addr
        .as_deref()
        .ok_or(Error::AddrNotAvail)
        .and_then(decode_sockaddr)?;
    // Binding an rdma_cm id to the address finds the device and gives its
    // librdmacm context, which outlives the id.
    let ch = EventChannel::new()?;
    let id = CmId::new(&ch, PortSpace::Tcp)?;
    id.bind_addr(SocketAddr::new(src.ip(), 0))?;
    let ctx = id.context()?;
    if let Some(want) = info.domain_attr.name.as_deref() {
        if ctx.name() != want {
            return Err(Error::NoDev);
        }
    }
    let atomics = ctx
        .query_device()
        .is_ok_and(|a| a.atomic_cap != AtomicCap::None);
    let pd = ProtectionDomain::new(&ctx)?;
    let ud = (info.ep_attr.ep_type == EpType::Dgram).then(|| UdResolver::new(src.ip(), pd.clone()));
    tracing::debug!(device = ctx.name(), atomics, "verbs domain open");
    let limits = CacheLimits::from_env(
        |k| std::env::var(k).ok(),
        crate::info::memlock_limit().flatten(),
    )?;
    tracing::debug!(?limits, "verbs registration cache");
    let cache = Arc::new(SourceCache::new(limits));
    Ok(Arc::new(VerbsDomain {
        pd,
        atomics,
        ud,
        cache,
        key,
        ep_type: info.ep_attr.ep_type,
    }))
}

impl ProviderDomain for VerbsDomain {
    fn mr_reg(
        &self,
        req: MrRequest,
    ) -> std::result::Result<Arc<dyn ProviderMr>, Rejected<MrRequest>> {
        if req.auth_key.is_some() && req.auth_key != self.key {
            // Not enforceable here (see the module docs): refused rather
            // than registered as if it were.
            return Err(Rejected {
                err: Error::OpNotSupp,
                req,
            });
        }
        crate::mr::register(&self.pd, self.atomics, req)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn srx_open(&self, size: usize) -> Result<Arc<dyn ProviderSrx>> {
        self.srx_open_attr(&weft_core::attr::RxAttr {
            size,
            ..weft_core::attr::RxAttr::default()
        })
    }

    fn srx_open_attr(&self, attr: &weft_core::attr::RxAttr) -> Result<Arc<dyn ProviderSrx>> {
        match self.ep_type {
            EpType::Rdm => Ok(crate::rdm::srx::open(attr)),
            _ => Ok(crate::msg::MsgSrx::open(&self.pd, attr.size)?),
        }
    }

    fn mr_cache_stats(&self) -> Option<MrCacheStats> {
        Some(self.cache.stats())
    }

    fn pool_alloc(&self, count: usize, size: usize) -> Result<PoolMemory> {
        let carved = Carved::new(count, size)?;
        let (mr, bufs) = PoolMr::new(&self.pd, carved, size)?;
        tracing::debug!(
            count,
            size,
            lkey = mr.lkey(),
            "verbs buffer pool registered"
        );
        Ok(PoolMemory {
            bufs,
            desc: u64::from(mr.lkey()),
            keep: Box::new(mr),
        })
    }

    fn addr_resolver(&self) -> Option<Arc<dyn AddrResolver>> {
        self.ud.clone().map(|r| r as Arc<dyn AddrResolver>)
    }
}

impl VerbsDomain {
    /// The domain's key (`domain_attr.auth_key`), if any.
    pub(crate) fn key(&self) -> Option<&AuthKey> {
        self.key.as_ref()
    }

    /// The address resolver of a DGRAM domain.
    pub(crate) fn ud_resolver(&self) -> Option<Arc<UdResolver>> {
        self.ud.clone()
    }
}

/// The protection domain an endpoint on device context `ctx` uses: its
/// domain's when that is on the same device (so the domain's regions are
/// reachable through it), else one of its own.
pub(crate) fn endpoint_pd(cfg: &EpConfig, ctx: &Arc<Context>) -> Result<Arc<ProtectionDomain>> {
    let dom = cfg
        .domain
        .as_ref()
        .and_then(|d| d.as_any().downcast_ref::<VerbsDomain>());
    match dom {
        Some(d) if d.pd.context().as_ptr() == ctx.as_ptr() => Ok(d.pd.clone()),
        _ => ProtectionDomain::new(ctx),
    }
}

/// The registration cache an endpoint on protection domain `pd` uses:
/// its domain's when `pd` is the domain's (a registration serves only
/// queue pairs of its own protection domain).
pub(crate) fn endpoint_cache(
    cfg: &EpConfig,
    pd: &Arc<ProtectionDomain>,
) -> Option<Arc<SourceCache>> {
    let dom = cfg
        .domain
        .as_ref()
        .and_then(|d| d.as_any().downcast_ref::<VerbsDomain>())?;
    Arc::ptr_eq(&dom.pd, pd).then(|| dom.cache.clone())
}
