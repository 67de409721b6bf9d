//! Protection domains.

use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Weak};

use weft_core::pool::Slots;

use rdma_sys::{ibv_alloc_pd, ibv_dealloc_pd, ibv_pd};
use weft_core::Error;

use super::device::Context;
use super::last_error_or;
use super::pool_mr::{PoolList, PoolMr};

/// A protection domain (`ibv_pd`). Holds its [`Context`] alive.
pub struct ProtectionDomain {
    pd: NonNull<ibv_pd>,
    ctx: Arc<Context>,
    /// The buffer pools registered here.
    pools: PoolList,
}

// SAFETY: libibverbs objects may be used from any thread; a PD is only
// passed to thread-safe verbs (reg_mr, create_qp, ...).
unsafe impl Send for ProtectionDomain {}
// SAFETY: see `Send`.
unsafe impl Sync for ProtectionDomain {}

impl fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("device", &self.ctx.name())
            .finish()
    }
}

impl ProtectionDomain {
    /// `ibv_alloc_pd`.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<ProtectionDomain>, Error> {
        // SAFETY: the context is open (we hold an Arc of it).
        let pd = unsafe { ibv_alloc_pd(ctx.as_ptr()) };
        let pd = NonNull::new(pd).ok_or_else(|| last_error_or(Error::NoMem))?;
        Ok(Arc::new(ProtectionDomain {
            pd,
            ctx: Arc::clone(ctx),
            pools: PoolList::default(),
        }))
    }

    /// The device context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The pool registered here whose buffers hold `addr..addr + len`,
    /// if any (see [`PoolMr`]).
    pub fn pool_for(&self, addr: usize, len: usize) -> Option<Arc<PoolMr>> {
        self.pools.find(addr, len)
    }

    pub(super) fn add_pool(&self, slots: Slots, pool: Weak<PoolMr>) {
        self.pools.add(slots, pool);
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_pd {
        self.pd.as_ptr()
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: allocated by ibv_alloc_pd and freed once; every MR, QP,
        // SRQ and AH of this PD holds an Arc of it, so none is left.
        let ret = unsafe { ibv_dealloc_pd(self.pd.as_ptr()) };
        if ret != 0 {
            tracing::warn!(ret, "ibv_dealloc_pd failed");
        }
    }
}
