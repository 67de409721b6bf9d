//! The registration of a buffer pool: one `ibv_mr` over all of a pool's
//! buffers, made once, whose local key every operation on one of them
//! uses instead of a registration of its own.
//!
//! The memory is one allocation ([`Carved`]): the buffers are views of it
//! that the application and the provider pass around, and the
//! registration owns the allocation's last byte (the keeper), which keeps
//! the whole allocation alive until the registration is gone. So the
//! memory this registration names is never freed while registered,
//! whoever holds the buffers. Scatter/gather elements are made only for a
//! buffer the caller holds (borrowed), and the device writes a buffer
//! only through a work request the provider posted for it while it holds
//! that buffer in flight, as for [`super::BytesMutMr`].
//!
//! The protection domain lists its pools (weakly), so that an endpoint
//! recognises a pool buffer by its address — one comparison per pool of
//! the domain — and posts it with the pool's key: no registration, no
//! registration-cache lookup, no copy.

use std::fmt;
use std::sync::{Arc, Weak};

use bytes::BytesMut;
use weft_core::pool::{Carved, Slots};
use weft_core::Error;

use super::mr::{AccessFlags, RawMr, Sge};
use super::pd::ProtectionDomain;

/// A pool's registration (local write: receives and RDMA read targets
/// land in its buffers, sends and RDMA write sources are read from them).
pub struct PoolMr {
    mr: RawMr,
    slots: Slots,
    /// `None` only once leaked after a failed deregistration.
    keeper: Option<BytesMut>,
}

impl fmt::Debug for PoolMr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolMr")
            .field("addr", &format_args!("{:#x}", self.mr.addr))
            .field("len", &self.mr.len)
            .field("lkey", &self.mr.lkey)
            .finish()
    }
}

impl PoolMr {
    /// Registers the buffers of `carved` on `pd` and lists the pool there;
    /// the buffers come back for the pool to hand out.
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        carved: Carved,
        size: usize,
    ) -> Result<(Arc<PoolMr>, Vec<BytesMut>), Error> {
        let Carved {
            mut bufs,
            keeper,
            span,
        } = carved;
        let slots = Slots::of(&bufs, size)?;
        let base = bufs.first_mut().ok_or(Error::Inval)?.as_mut_ptr();
        // SAFETY: `base..base + span` is the buffers of one allocation
        // (`Slots::of` checked they lie end to end from `base`), which
        // `keeper`, owned by the returned PoolMr until a successful
        // deregistration (see Drop), keeps allocated. The device writes
        // it only through work requests naming a buffer the provider
        // holds in flight, as for BytesMutMr.
        let mr = unsafe { RawMr::register(pd, base, span, AccessFlags::LOCAL_WRITE)? };
        let pool = Arc::new(PoolMr {
            mr,
            slots,
            keeper: Some(keeper),
        });
        pd.add_pool(slots, Arc::downgrade(&pool));
        ALL_POOLS.add(slots, Arc::downgrade(&pool));
        Ok((pool, bufs))
    }

    /// The local key (`fi_mr_desc`).
    pub fn lkey(&self) -> u32 {
        self.mr.lkey
    }

    /// Whether the pool is registered on `pd` (its key means nothing on
    /// another protection domain).
    pub fn is_on(&self, pd: &ProtectionDomain) -> bool {
        self.mr.is_on(pd)
    }

    /// Whether `addr..addr + len` lies in this pool's buffers.
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        self.slots.contains(addr, len)
    }

    fn sge_at(&self, addr: usize, len: usize) -> Result<Sge<'_>, Error> {
        if !self.contains(addr, len) {
            return Err(Error::Inval);
        }
        let base = usize::try_from(self.mr.addr).map_err(|_| Error::Inval)?;
        self.mr.sge(addr - base, len)
    }

    /// The element over `buf`, a part of one of this pool's buffers that
    /// the caller holds (in flight, for the operation it posts: a send
    /// source, a receive or an RDMA read target). `Inval` outside the
    /// pool.
    pub fn sge_of(&self, buf: &[u8]) -> Result<Sge<'_>, Error> {
        self.sge_at(buf.as_ptr() as usize, buf.len())
    }
}

impl Drop for PoolMr {
    fn drop(&mut self) {
        if self.mr.deregister().is_err() {
            // The device may still access the memory: never free it.
            std::mem::forget(self.keeper.take());
        }
    }
}

/// Every pool of the process, whatever its protection domain: their
/// buffers must stay out of registration caches (an entry would hold the
/// buffer, and so keep it from its pool, until evicted).
static ALL_POOLS: PoolList = PoolList::new();

/// Whether `addr..addr + len` lies in a live pool of any protection
/// domain (a buffer of another domain's pool, or a rendezvous source
/// that needs remote access its pool does not give).
pub fn in_any_pool(addr: usize, len: usize) -> bool {
    ALL_POOLS.find(addr, len).is_some()
}

/// The pools of one protection domain, listed weakly: a pool that is gone
/// is skipped and pruned.
#[derive(Default)]
pub(super) struct PoolList {
    pools: std::sync::Mutex<Vec<(Slots, Weak<PoolMr>)>>,
    /// Pools listed, read without the lock: domains without pools pay
    /// one load per buffer.
    n: std::sync::atomic::AtomicUsize,
}

impl PoolList {
    pub(super) const fn new() -> PoolList {
        PoolList {
            pools: std::sync::Mutex::new(Vec::new()),
            n: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    pub(super) fn add(&self, slots: Slots, p: Weak<PoolMr>) {
        let mut g = weft_core::sync::lock(&self.pools);
        g.retain(|(_, w)| w.strong_count() > 0);
        g.push((slots, p));
        self.n.store(g.len(), std::sync::atomic::Ordering::Release);
    }

    pub(super) fn find(&self, addr: usize, len: usize) -> Option<Arc<PoolMr>> {
        if self.n.load(std::sync::atomic::Ordering::Acquire) == 0 || len == 0 {
            return None;
        }
        let g = weft_core::sync::lock(&self.pools);
        // A pool that is gone may share addresses with a newer one: only
        // a live one answers.
        g.iter()
            .filter(|(s, _)| s.contains(addr, len))
            .find_map(|(_, w)| w.upgrade())
    }
}
