//! The shm domain: memory regions (`mr`), and address resolution that
//! waits for a named peer to appear (`fi_av_insert` of a name whose
//! endpoint does not exist yet resolves when it does, or fails with
//! `FI_ETIMEDOUT` after `FI_SHM_RESOLVE_TIMEOUT` milliseconds, 5000 by
//! default).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use weft_core::attr::RxAttr;
use weft_core::provider::{
    AddrResolver, MrRequest, ProviderDomain, ProviderMr, ProviderSrx, Rejected,
};
use weft_core::soft_srx::{SoftSrx, SrxHandle};
use weft_core::{Error, Result};

use crate::name;

/// How long an insert waits for its peer by default.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_millis(5000);
/// How often a waiting insert looks for its peer.
const RESOLVE_POLL: Duration = Duration::from_millis(5);

/// The resolve timeout: `FI_SHM_RESOLVE_TIMEOUT` (milliseconds) if set
/// to a number, else [`RESOLVE_TIMEOUT`].
pub fn resolve_timeout() -> Duration {
    std::env::var("FI_SHM_RESOLVE_TIMEOUT")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(RESOLVE_TIMEOUT, Duration::from_millis)
}

/// Whether the endpoint at `addr` exists now: its segment has a valid
/// header, its doorbell is made (its version stored) and its owner runs.
pub fn present(addr: &[u8]) -> bool {
    let Ok(n) = name::parse(addr) else {
        return false;
    };
    crate::live::ready_instance_of_name(n).is_some_and(|i| crate::live::owner_runs(n, i))
}

/// The domain object.
#[derive(Debug)]
pub struct ShmDomain {
    resolver: Arc<ShmResolver>,
    /// The domain's memory regions, which its endpoints' peers reach.
    pub regions: Arc<crate::mr::Regions>,
}

impl ShmDomain {
    pub fn new() -> ShmDomain {
        ShmDomain {
            resolver: Arc::new(ShmResolver {
                timeout: resolve_timeout(),
            }),
            regions: Arc::default(),
        }
    }
}

impl Default for ShmDomain {
    fn default() -> Self {
        ShmDomain::new()
    }
}

impl ProviderDomain for ShmDomain {
    fn mr_reg(
        &self,
        req: MrRequest,
    ) -> std::result::Result<Arc<dyn ProviderMr>, Rejected<MrRequest>> {
        self.regions.register(req)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn addr_resolver(&self) -> Option<Arc<dyn AddrResolver>> {
        Some(self.resolver.clone())
    }

    /// Shared memory a peer can map where peers may attach to us anyway
    /// (`pool`): large messages to and from its buffers are then copied
    /// by plain loads and stores. Plain memory otherwise, or if the
    /// kernel will not make the file (no `memfd`, a seccomp filter).
    fn pool_alloc(&self, count: usize, size: usize) -> Result<weft_core::pool::PoolMemory> {
        if crate::pool::enabled() {
            match crate::pool::alloc(count, size) {
                Ok(m) => return Ok(m),
                Err(Error::Inval) => return Err(Error::Inval),
                // Past the size limit, plain memory says so too.
                Err(e) => tracing::debug!(error = %e, "shm pool not shared: plain memory"),
            }
        }
        weft_core::pool::PoolMemory::plain(count, size)
    }

    fn srx_open(&self, size: usize) -> Result<Arc<dyn ProviderSrx>> {
        self.srx_open_attr(&RxAttr {
            size,
            ..RxAttr::default()
        })
    }

    fn srx_open_attr(&self, attr: &RxAttr) -> Result<Arc<dyn ProviderSrx>> {
        let c = SoftSrx::<crate::endpoint::EpShared>::open(
            attr,
            crate::BUFFERED_RECV,
            crate::IOV_LIMIT,
        );
        Ok(Arc::new(SrxHandle(c)))
    }
}

/// Waits for named peers.
#[derive(Debug)]
pub struct ShmResolver {
    timeout: Duration,
}

impl AddrResolver for ShmResolver {
    fn resolve(&self, addr: Vec<u8>) -> BoxFuture<'static, Result<()>> {
        let timeout = self.timeout;
        Box::pin(async move {
            name::parse(&addr)?;
            let until = Instant::now() + timeout;
            loop {
                if present(&addr) {
                    return Ok(());
                }
                if Instant::now() >= until {
                    return Err(Error::TimedOut);
                }
                tokio::time::sleep(RESOLVE_POLL).await;
            }
        })
    }

    fn forget(&self, _addr: &[u8]) {}

    fn validate(&self, addr: &[u8]) -> Result<()> {
        name::parse(addr).map(|_| ())
    }

    fn resolved(&self, addr: &[u8]) -> bool {
        present(addr)
    }
}
