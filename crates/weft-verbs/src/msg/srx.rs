//! Shared receive contexts for MSG endpoints: one `ibv_srq` whose posted
//! receives any bound endpoint's queue pair consumes.
//!
//! The receives are posted like a connection's own (a bounce slot of the
//! context's pool when they fit, else the application's buffers
//! registered), but on the shared receive queue, so a message arriving on
//! any connection takes the oldest one. Its work completion shows up on
//! the CQ of the endpoint it arrived at, which hands it here by its
//! `wr_id`; the completion then goes to that endpoint's receive CQ and
//! counter. A connection that ends does not flush the shared queue: its
//! receives stay for the other endpoints, in their order; only the one
//! its queue pair was filling, if any, is flushed, and ends `Canceled`
//! (see `MsgSrx::complete`).
//!
//! A receive can be withdrawn without losing a message, as on an
//! endpoint's own queue (see [`super::complete`]): by `cancel`, or by
//! dropping its future, which is noticed when a message would reach it
//! or when the context runs out of receives. A message that lands in a
//! withdrawn receive's work request goes to the oldest waiting receive,
//! reported on the CQ of the endpoint it arrived at.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use weft_core::completion::Returned;
use weft_core::credits::Credits;
use weft_core::provider::{EpConfig, ProviderSrx, RecvReq, Rejected};
use weft_core::sync::{lock, FastMutex};
use weft_core::{Error, Result};

use super::closing::fail_withdrawn;
use super::complete::{RecvMem, RecvSide, Route, RxQueue};
use super::post::RecvTarget;
use crate::slot_pool::{SlotPool, SLOTS};
use crate::sys::{AccessFlags, ProtectionDomain, Srq, WorkCompletion};

/// Work request ids of shared receives have the top bit set, so they never
/// collide with an endpoint's own.
pub(super) const SRX_WR_BIT: u64 = 1 << 63;

/// Scatter/gather elements per shared receive.
const SRX_SGE: u32 = 4;

/// A shared receive context of a verbs MSG domain.
pub struct MsgSrx {
    pub(super) pd: Arc<ProtectionDomain>,
    pub(super) srq: Arc<Srq>,
    pool: SlotPool,
    rxq: FastMutex<RxQueue<RecvMem>>,
    next_wr: AtomicU64,
    credits: Credits,
    size: usize,
    closed: AtomicBool,
    /// The memory of the work requests its close withdrew (registered
    /// receives' own buffers, bounce slots): posted still, so kept until
    /// the context is dropped, after the last poll of every endpoint
    /// bound to it (each holds the context).
    retired: FastMutex<Vec<RecvMem>>,
}

impl std::fmt::Debug for MsgSrx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MsgSrx")
            .field("size", &self.size)
            .field("waiting", &lock(&self.rxq).waiting())
            .finish()
    }
}

impl MsgSrx {
    /// A context of `size` receives on `pd`.
    pub fn open(pd: &Arc<ProtectionDomain>, size: usize) -> Result<Arc<MsgSrx>> {
        let wr = u32::try_from(size).map_err(|_| Error::Inval)?;
        let srq = Srq::new(pd, wr, SRX_SGE)?;
        Ok(Arc::new(MsgSrx {
            pd: pd.clone(),
            srq,
            pool: SlotPool::new(pd, SLOTS, AccessFlags::LOCAL_WRITE)?,
            rxq: FastMutex::new(RxQueue::default()),
            next_wr: AtomicU64::new(SRX_WR_BIT),
            credits: Credits::new(size),
            size,
            closed: AtomicBool::new(false),
            retired: FastMutex::new(Vec::new()),
        }))
    }

    /// Withdraws receives whose futures are gone, then takes a credit if
    /// that freed one.
    fn sweep_and_take(&self) -> bool {
        lock(&self.rxq).sweep(&self.credits) > 0 && self.credits.try_take()
    }

    /// Receives it holds at most (what a bound endpoint's CQ must fit).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Receives waiting for a message.
    pub(super) fn waiting(&self) -> usize {
        lock(&self.rxq).waiting()
    }

    fn side(&self) -> RecvSide<'_> {
        RecvSide {
            q: &self.rxq,
            credits: &self.credits,
            pool: &self.pool,
        }
    }

    /// A work completion of one of its receives, seen on the CQ of the
    /// endpoint configured by `ep`: completes the receive there.
    pub(super) fn on_completion(&self, wc: &WorkCompletion, ep: &EpConfig) {
        self.complete(wc, &route_of(ep));
    }

    /// A work completion of one of its receives, at an endpoint whose
    /// queues are `route` (it may be closed by now). A flushed receive
    /// (`WrFlushErr`: the queue pair holding it went to the error state,
    /// its connection ended or its endpoint closed) ends `Canceled`
    /// there; posting it again would put it behind receives posted after
    /// it while it stays first in line for a message, and a message
    /// takes the oldest receive posted.
    pub(super) fn complete(&self, wc: &WorkCompletion, route: &Route) {
        self.side().on_completion(wc, route);
    }
}

/// The queues a completion at the endpoint configured by `ep` reports to.
pub(super) fn route_of(ep: &EpConfig) -> Route {
    Route {
        cq: ep.rx_cq.clone(),
        cntr: ep.rx_cntr.clone(),
    }
}

impl ProviderSrx for MsgSrx {
    fn post_recv(&self, req: RecvReq) -> std::result::Result<(), Rejected<RecvReq>> {
        let reject = |err, req| Err(Rejected { err, req });
        if self.closed.load(Ordering::Acquire) {
            return reject(Error::OpBadState, req);
        }
        if req.bufs.len() > SRX_SGE as usize {
            return reject(Error::Inval, req);
        }
        if !self.credits.try_take() && !self.sweep_and_take() {
            return reject(Error::Again, req);
        }
        let wr_id = self.next_wr.fetch_add(1, Ordering::Relaxed) | SRX_WR_BIT;
        let target = RecvTarget {
            pool: &self.pool,
            pd: &self.pd,
            post: &|wr| self.srq.post_recv(wr),
        };
        self.side()
            .post(&target, req, wr_id)
            .inspect_err(|_| self.credits.release(1))
    }

    fn cancel(&self, context: u64) -> bool {
        self.side().cancel(context)
    }

    fn give_back(&self, r: Returned) {
        if !self.closed.load(Ordering::Acquire) {
            self.side().give_back(r);
        }
    }

    fn rx_size_left(&self) -> usize {
        self.credits.left()
    }

    fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        // No endpoint is bound any more; the receives still waiting end
        // with Canceled. Their work requests stay posted on the shared
        // queue, which a bound queue pair's device may still be filling
        // (the move to the error state is handled asynchronously, and
        // the last poll comes later): a registered receive gets buffers
        // like its own, whose memory stays here until the context goes.
        let waiting = lock(&self.rxq).drain();
        let kept = fail_withdrawn(waiting);
        lock(&self.retired).extend(kept);
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
