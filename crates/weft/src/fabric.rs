//! Fabric and domain: provider discovery (`getinfo`), and the factory of
//! every other object.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::runtime::Handle;
use weft_core::attr::Info;
use weft_core::completion::{CqFormat, CqShared, WaitMode};
use weft_core::counter::CounterShared;
use weft_core::eventq::EqShared;
use weft_core::getinfo;
use weft_core::provider::{Provider, ProviderDomain};
use weft_core::{Error, Result};

use crate::av::{AddressVector, AvAttr};
use crate::counter::Counter;
use crate::cq::CompletionQueue;
use crate::endpoint::Endpoint;
use crate::eq::EventQueue;
use crate::passive::PassiveEndpoint;

static NEXT_FID: AtomicU64 = AtomicU64::new(1);

/// A fresh object id (fid).
pub(crate) fn next_fid() -> u64 {
    NEXT_FID.fetch_add(1, Ordering::Relaxed)
}

/// Why `provider` offers nothing here (no device, not compiled in), if it
/// is one Weft knows.
pub fn provider_unavailable(provider: &str) -> Option<String> {
    crate::registry::known(provider)?.unavailable_reason()
}

/// The cause behind `err` from `provider` that the code alone cannot
/// carry, when it is visible from this process: e.g. for verbs, the
/// locked-memory limit that made a registration fail with `NoMem`. Meant
/// to be printed beside the error.
pub fn error_hint(provider: &str, err: crate::Error) -> Option<String> {
    crate::registry::known(provider)?.error_hint(err)
}

/// Every offer of every provider, filtered by `FI_PROVIDER` when set.
pub fn all_offers() -> Vec<Info> {
    let filter = std::env::var("FI_PROVIDER").ok();
    let mut v: Vec<Info> = crate::registry::all()
        .iter()
        .filter(|p| p.built())
        .flat_map(|p| p.offers())
        .collect();
    if let Some(f) = filter.filter(|f| !f.trim().is_empty()) {
        v.retain(|i| {
            getinfo::provider_selected(&f, i.fabric_attr.prov_name.as_deref().unwrap_or(""))
        });
    }
    v
}

/// `fi_getinfo`: the offers that satisfy `hints`, narrowed to them.
/// Nothing matching is `NoData`; an unknown provider name in the hints
/// matches nothing.
pub fn getinfo(hints: Option<&Info>) -> Result<Vec<Info>> {
    let mut offers = all_offers();
    if let Some(h) = hints {
        for o in &mut offers {
            if let Some(p) = o
                .fabric_attr
                .prov_name
                .as_deref()
                .and_then(crate::registry::known)
            {
                p.offer_for(h, o);
            }
        }
    }
    if hints.is_some_and(|h| h.domain_attr.av_auth_key) {
        // A provider may enforce an endpoint's own key without keeping
        // keys in AVs: its offers cannot serve these hints (verbs keeps
        // them on RDM only, and says so in `offer_for`).
        offers.retain(|o| {
            o.fabric_attr
                .prov_name
                .as_deref()
                .and_then(crate::registry::known)
                .is_some_and(|p| p.av_auth_keys())
        });
    }
    getinfo::getinfo(hints, &offers)
}

/// Attributes of a completion queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqAttr {
    /// Expected depth (a hint: entries are never dropped).
    pub size: usize,
    /// Entry format.
    pub format: CqFormat,
    /// How readers wait.
    pub wait: WaitMode,
}

impl Default for CqAttr {
    fn default() -> Self {
        CqAttr {
            size: 1024,
            format: CqFormat::Tagged,
            wait: WaitMode::Interrupt,
        }
    }
}

/// A fabric: the root object, tied to a Tokio runtime.
#[derive(Debug, Clone)]
pub struct Fabric {
    pub(crate) inner: Arc<FabricInner>,
}

#[derive(Debug)]
pub(crate) struct FabricInner {
    pub(crate) fid: u64,
    pub(crate) prov: &'static dyn Provider,
    pub(crate) rt: Handle,
}

impl Fabric {
    /// Opens the fabric of `info` on the current Tokio runtime.
    /// Outside a runtime this is `NoDev` (use [`Fabric::open_with`]).
    pub fn open(info: &Info) -> Result<Fabric> {
        let rt = Handle::try_current().map_err(|_| Error::NoDev)?;
        Fabric::open_with(info, rt)
    }

    /// Opens the fabric of `info`, running its I/O on `rt`.
    pub fn open_with(info: &Info, rt: Handle) -> Result<Fabric> {
        let name = info
            .fabric_attr
            .prov_name
            .as_deref()
            .unwrap_or_else(|| crate::registry::default_name());
        let prov = crate::registry::find(name).ok_or(Error::NoData)?;
        tracing::debug!(provider = prov.name(), "fabric open");
        Ok(Fabric {
            inner: Arc::new(FabricInner {
                fid: next_fid(),
                prov,
                rt,
            }),
        })
    }

    /// The provider's name.
    pub fn provider(&self) -> &str {
        self.inner.prov.name()
    }

    /// The provider's implementation.
    pub(crate) fn prov(&self) -> &'static dyn Provider {
        self.inner.prov
    }

    /// The object id.
    pub fn fid(&self) -> u64 {
        self.inner.fid
    }

    /// Opens a domain for `info`. A `domain_attr.auth_key` of the wrong
    /// size is `Inval`; one on a provider that does not enforce keys is
    /// `OpNotSupp`, as is `domain_attr.av_auth_key` on one that does not
    /// keep keys in AVs (verbs MSG and DGRAM), and `domain_attr.tls` on one that runs
    /// no TLS (verbs). On tcp,
    /// `domain_attr.tls` (else the `FI_TCP_TLS_*` variables, read now) is
    /// loaded and checked here: a missing file is `NoEnt`, a file that
    /// does not parse, a key that is not the certificate's or only some of
    /// the variables set is `Inval` (`docs/design.md`, "TLS on tcp").
    pub fn domain(&self, info: &Info) -> Result<Domain> {
        let p = info
            .fabric_attr
            .prov_name
            .as_deref()
            .unwrap_or(self.provider());
        if p != self.provider() {
            return Err(Error::Inval);
        }
        check_keys(self.prov(), None, info.domain_attr.auth_key.as_deref())?;
        check_tls(self.prov(), info)?;
        if info.domain_attr.av_auth_key {
            // The AV holds the keys; a domain key besides them would be a
            // second, contradictory default.
            if info.domain_attr.auth_key.is_some() {
                return Err(Error::Inval);
            }
            if !self.prov().av_auth_keys() {
                return Err(Error::OpNotSupp);
            }
        }
        let _span = tracing::debug_span!("domain_open", provider = p).entered();
        let prov = {
            let _rt = self.inner.rt.enter();
            self.inner
                .prov
                .open_domain(&crate::addrfmt::provider_info(info)?)?
        };
        Ok(Domain {
            inner: Arc::new(DomainInner {
                fid: next_fid(),
                fabric: self.clone(),
                info: info.clone(),
                prov,
            }),
        })
    }

    /// Opens an event queue of `size` entries (1 ..= 1 << 16).
    pub fn eq(&self, size: usize) -> Result<EventQueue> {
        if size == 0 || size > 1 << 16 {
            return Err(Error::Inval);
        }
        Ok(EventQueue::new(EqShared::new(next_fid(), size)))
    }

    /// Opens a passive (listening) endpoint for MSG connections. `addr`:
    /// raw address to bind, `None` for an ephemeral loopback port. Its
    /// `ep_attr.auth_key` (else `domain_attr.auth_key`) is the key
    /// connecting endpoints must prove they hold; sizes and providers as
    /// for [`Domain::endpoint`].
    pub fn passive_endpoint(&self, info: &Info, addr: Option<Vec<u8>>) -> Result<PassiveEndpoint> {
        PassiveEndpoint::new(self.clone(), info.clone(), addr)
    }
}

/// A domain: the resource group endpoints, queues and AVs belong to.
#[derive(Debug, Clone)]
pub struct Domain {
    pub(crate) inner: Arc<DomainInner>,
}

#[derive(Debug)]
pub(crate) struct DomainInner {
    pub(crate) fid: u64,
    pub(crate) fabric: Fabric,
    pub(crate) info: Info,
    /// The provider's per-domain state (verbs: device context and
    /// protection domain); `None` for providers that keep none.
    pub(crate) prov: Option<Arc<dyn ProviderDomain>>,
}

impl Domain {
    /// The object id.
    pub fn fid(&self) -> u64 {
        self.inner.fid
    }

    /// The info the domain was opened with.
    pub fn info(&self) -> &Info {
        &self.inner.info
    }

    /// The fabric.
    pub fn fabric(&self) -> &Fabric {
        &self.inner.fabric
    }

    /// Opens an address vector.
    pub fn av(&self, attr: AvAttr) -> Result<AddressVector> {
        AddressVector::open(self.clone(), attr)
    }

    /// Opens a completion queue (`size` 1 ..= 1 << 20).
    pub fn cq(&self, attr: CqAttr) -> Result<CompletionQueue> {
        if attr.size == 0 || attr.size > 1 << 20 {
            return Err(Error::Inval);
        }
        let format = match attr.format {
            CqFormat::Unspec => CqFormat::Tagged,
            f => f,
        };
        Ok(CompletionQueue::new(
            CqShared::new(next_fid(), format, attr.wait, attr.size),
            self.fid(),
        ))
    }

    /// Opens a counter.
    pub fn counter(&self) -> Result<Counter> {
        Ok(Counter::new(CounterShared::new(next_fid()), self.fid()))
    }

    /// Creates a (disabled) endpoint for `info`. Its authorization key is
    /// `info.ep_attr.auth_key`, else the domain's `domain_attr.auth_key`:
    /// 1 ..= 64 bytes (`Inval` otherwise), on a provider that enforces
    /// keys (`OpNotSupp` otherwise; verbs refuses keys on DGRAM endpoints
    /// when the endpoint is enabled; udp refuses them on SOCK_DGRAM endpoints, and
    /// on DGRAM endpoints bound to a wildcard address is `Inval`).
    pub fn endpoint(&self, info: &Info) -> Result<Endpoint> {
        Endpoint::new(self.clone(), info.clone(), None)
    }

    /// Creates the endpoint that will accept a connection request
    /// (`FI_CONNREQ` event): bind it, enable it, then `accept`.
    pub fn accept_endpoint(&self, info: &Info, req: &crate::eq::ConnRequest) -> Result<Endpoint> {
        Endpoint::new(self.clone(), info.clone(), Some(req.handle()))
    }

    pub(crate) fn rt(&self) -> &Handle {
        &self.inner.fabric.inner.rt
    }
}

/// The TLS configuration an object of `info` would run, checked by its
/// provider now (files readable and consistent; refused where the
/// provider runs no TLS), so a bad one fails the call that creates it.
pub(crate) fn check_tls(prov: &dyn Provider, info: &Info) -> Result<()> {
    prov.check_tls(info.domain_attr.tls.as_ref())
}

/// An endpoint's or domain's authorization keys: sizes the providers take
/// (`Inval` otherwise), on a provider that enforces them (`OpNotSupp`
/// otherwise: a key it would ignore must not look like protection).
pub(crate) fn check_keys(
    prov: &dyn Provider,
    ep: Option<&[u8]>,
    domain: Option<&[u8]>,
) -> Result<()> {
    let key = weft_core::auth::effective_key(ep, domain)?;
    if key.is_some() && !prov.auth_keys() {
        return Err(Error::OpNotSupp);
    }
    Ok(())
}
