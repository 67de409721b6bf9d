//! The verbs domain: one protection domain per `fi_domain`, on the device
//! context librdmacm uses, shared by the domain's memory regions and the
//! queue pairs of its endpoints.
//!
//! Authorization keys: a region cannot tell one queue pair of its
//! protection domain from another (a remote key works on all of them), so
//! a key is enforced by giving it a protection domain of its own. The
//! domain's protection domain serves the domain's key (`domain_attr.auth_key`,
//! or none); every other key gets one made on first use ([`KeyPds`]),
//! on the same device context. A region keyed K is registered in K's
//! protection domain, and the queue pairs of a connection that proved K
//! are created there, with everything their work requests name (receive
//! and send slots, the shared receive queue): a peer that proved J holds
//! queue pairs of J's protection domain only, where K's remote keys are
//! not valid, so the device itself refuses its reads, writes and atomics
//! (a remote access error).
//!
//! A remote key is only honoured on a queue pair of the region's
//! protection domain, so an endpoint that is to be the target of RMA must
//! create its queue pairs there. Using librdmacm's context (not one from
//! `ibv_open_device`) matters: queue pairs made through rdma_cm live on
//! it, and objects of two contexts cannot be mixed.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};

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
use weft_core::sync::lock;
use weft_core::{Error, Result};

use crate::sys::{AtomicCap, CmId, Context, EventChannel, PoolMr, PortSpace, ProtectionDomain};
use weft_core::pool::{Carved, PoolMemory};

/// The per-domain verbs objects.
#[derive(Debug)]
pub struct VerbsDomain {
    /// The protection domain of the domain's key (or of no key).
    pd: Arc<ProtectionDomain>,
    /// The protection domains of other keys.
    keyed: KeyPds,
    /// The device does 64-bit atomics: remote-writable regions take them.
    atomics: bool,
    /// A domain opened for `FI_EP_DGRAM`: its AVs resolve addresses.
    ud: Option<Arc<UdResolver>>,
    /// Registrations of send sources, shared by the domain's endpoints.
    cache: Arc<SourceCache>,
    /// `domain_attr.auth_key`: what endpoints here prove unless they
    /// hold a key of their own, and regions' default key.
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
        keyed: KeyPds::default(),
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
        // fi_mr(3): a region without a key of its own takes the domain's.
        let key = req.auth_key.clone().or_else(|| self.key.clone());
        match self.pd_for(key.as_ref()) {
            Ok(pd) => crate::mr::register(&pd, self.atomics, req),
            Err(err) => Err(Rejected { err, req }),
        }
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

    /// The domain's cache and those of other keys' protection domains
    /// (while that key's endpoints are open) together.
    fn mr_cache_stats(&self) -> Option<MrCacheStats> {
        let mut s = self.cache.stats();
        for c in self.keyed.caches() {
            let k = c.stats();
            s.hits += k.hits;
            s.misses += k.misses;
            s.evictions += k.evictions;
            s.entries += k.entries;
            s.bytes += k.bytes;
        }
        Some(s)
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
    /// The protection domain of `key`: the domain's own for the domain's
    /// key, else that key's (made now if nothing holds it).
    pub(crate) fn pd_for(&self, key: Option<&AuthKey>) -> Result<Arc<ProtectionDomain>> {
        if key == self.key.as_ref() {
            return Ok(self.pd.clone());
        }
        self.keyed.get(key, self.pd.context())
    }

    /// The address resolver of a DGRAM domain.
    pub(crate) fn ud_resolver(&self) -> Option<Arc<UdResolver>> {
        self.ud.clone()
    }
}

/// Protection domains of keys other than the domain's, each made when a
/// region or connection first needs it and gone with the last object in
/// it: held weakly here, so a key costs nothing once its regions and
/// queue pairs are gone. Each has a registration cache of its own (a
/// registration serves one protection domain), with the domain's limits,
/// alive while an endpoint of that key is.
#[derive(Debug, Default)]
struct KeyPds(Mutex<Vec<KeyPd>>);

#[derive(Debug)]
struct KeyPd {
    key: Option<AuthKey>,
    pd: Weak<ProtectionDomain>,
    cache: Weak<SourceCache>,
}

impl KeyPds {
    fn get(&self, key: Option<&AuthKey>, ctx: &Arc<Context>) -> Result<Arc<ProtectionDomain>> {
        let mut all = lock(&self.0);
        all.retain(|e| e.pd.strong_count() > 0);
        if let Some(pd) = all
            .iter()
            .find(|e| e.key.as_ref() == key)
            .and_then(|e| e.pd.upgrade())
        {
            return Ok(pd);
        }
        let pd = ProtectionDomain::new(ctx)?;
        tracing::debug!(keys = all.len() + 1, "verbs protection domain for a key");
        all.push(KeyPd {
            key: key.cloned(),
            pd: Arc::downgrade(&pd),
            cache: Weak::new(),
        });
        Ok(pd)
    }

    /// The caches alive now.
    fn caches(&self) -> Vec<Arc<SourceCache>> {
        lock(&self.0)
            .iter()
            .filter_map(|e| e.cache.upgrade())
            .collect()
    }

    /// The registration cache of `pd`, one of these protection domains.
    fn cache(&self, pd: &Arc<ProtectionDomain>, limits: CacheLimits) -> Option<Arc<SourceCache>> {
        let mut all = lock(&self.0);
        let e = all
            .iter_mut()
            .find(|e| std::ptr::eq(e.pd.as_ptr(), Arc::as_ptr(pd)))?;
        if let Some(c) = e.cache.upgrade() {
            return Some(c);
        }
        let c = Arc::new(SourceCache::new(limits));
        e.cache = Arc::downgrade(&c);
        Some(c)
    }
}

/// The protection domain of the queue pairs, on device context `ctx`, of
/// an endpoint's connections that proved `key`: that key's protection
/// domain of the endpoint's domain when that is on the same device (so
/// the domain's regions under `key`, and only those, are reachable
/// through them), else one of their own.
pub(crate) fn endpoint_pd(
    cfg: &EpConfig,
    ctx: &Arc<Context>,
    key: Option<&AuthKey>,
) -> Result<Arc<ProtectionDomain>> {
    let dom = cfg
        .domain
        .as_ref()
        .and_then(|d| d.as_any().downcast_ref::<VerbsDomain>());
    match dom {
        Some(d) if d.pd.context().as_ptr() == ctx.as_ptr() => d.pd_for(key),
        _ => ProtectionDomain::new(ctx),
    }
}

/// The registration cache an endpoint on protection domain `pd` uses:
/// its domain's when `pd` is the domain's, that key's when `pd` is the
/// protection domain of another key (a registration serves only queue
/// pairs of its own protection domain), none for a protection domain of
/// the endpoint's own.
pub(crate) fn endpoint_cache(
    cfg: &EpConfig,
    pd: &Arc<ProtectionDomain>,
) -> Option<Arc<SourceCache>> {
    let dom = cfg
        .domain
        .as_ref()
        .and_then(|d| d.as_any().downcast_ref::<VerbsDomain>())?;
    if Arc::ptr_eq(&dom.pd, pd) {
        return Some(dom.cache.clone());
    }
    dom.keyed.cache(pd, dom.cache.limits())
}
