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
//! receives stay for the other endpoints.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use weft_core::completion::CqErrEntry;
use weft_core::credits::Credits;
use weft_core::flags::OpFlags;
use weft_core::hash::{fast_map, FastMap};
use weft_core::provider::{EpConfig, ProviderSrx, RecvReq, Rejected};
use weft_core::sync::lock;
use weft_core::{Error, Result};

use super::complete::{finish_posted_recv, Held, Inflight};
use super::post::RecvTarget;
use crate::bufs::unregister;
use crate::pool::{SlotPool, SLOTS};
use crate::sys::{AccessFlags, ProtectionDomain, Srq, WorkCompletion};

/// Work request ids of shared receives have the top bit set, so they never
/// collide with an endpoint's own.
const SRX_WR_BIT: u64 = 1 << 63;

/// Scatter/gather elements per shared receive.
const SRX_SGE: u32 = 4;

/// A shared receive context of a verbs MSG domain.
pub struct MsgSrx {
    pub(super) pd: Arc<ProtectionDomain>,
    pub(super) srq: Arc<Srq>,
    pool: SlotPool,
    inflight: Mutex<FastMap<u64, Inflight>>,
    next_wr: AtomicU64,
    credits: Credits,
    size: usize,
    closed: AtomicBool,
}

impl std::fmt::Debug for MsgSrx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MsgSrx")
            .field("size", &self.size)
            .field("posted", &lock(&self.inflight).len())
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
            inflight: Mutex::new(fast_map()),
            next_wr: AtomicU64::new(SRX_WR_BIT),
            credits: Credits::new(size),
            size,
            closed: AtomicBool::new(false),
        }))
    }

    /// Receives it holds at most (what a bound endpoint's CQ must fit).
    pub fn size(&self) -> usize {
        self.size
    }

    /// A work completion of one of its receives, seen on the CQ of the
    /// endpoint configured by `ep`: completes the receive there.
    pub(super) fn on_completion(&self, wc: &WorkCompletion, ep: &EpConfig) {
        if wc.wr_id & SRX_WR_BIT == 0 {
            return;
        }
        let Some(Inflight { mut done, op }) = lock(&self.inflight).remove(&wc.wr_id) else {
            return;
        };
        self.credits.release(1);
        if done.cq.is_none() {
            done.cq.clone_from(&ep.rx_cq);
        }
        if done.cntr.is_none() {
            done.cntr.clone_from(&ep.rx_cntr);
        }
        finish_posted_recv(op, done, wc, Some(&self.pool));
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
        if !self.credits.try_take() {
            return reject(Error::Again, req);
        }
        let mut req = req;
        let wr_id = self.next_wr.fetch_add(1, Ordering::Relaxed) | SRX_WR_BIT;
        let target = RecvTarget {
            pool: &self.pool,
            pd: &self.pd,
            post: &|wr| self.srq.post_recv(wr),
        };
        // The table is locked across the post so a completion cannot look
        // the receive up before it is there.
        let mut g = lock(&self.inflight);
        match target.post(std::mem::take(&mut req.bufs), wr_id) {
            Ok(op) => {
                g.insert(wr_id, Inflight { done: req.done, op });
                Ok(())
            }
            Err((err, bufs)) => {
                drop(g);
                self.credits.release(1);
                req.bufs = bufs;
                Err(Rejected { err, req })
            }
        }
    }

    fn cancel(&self, _context: u64) -> bool {
        // A receive on the shared queue belongs to the device until a
        // message takes it; verbs cannot take one back.
        false
    }

    fn rx_size_left(&self) -> usize {
        self.credits.left()
    }

    fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        // No endpoint is bound any more; the receives still posted end
        // with Canceled. Registered buffers come back deregistered (the
        // device is fenced off them); slot receives never lent theirs.
        let pending: Vec<Inflight> = lock(&self.inflight).drain().map(|(_, v)| v).collect();
        for Inflight { done, op } in pending {
            let bufs = match op {
                Held::RecvSlot { bufs, .. } => bufs,
                Held::RecvRegistered { mrs, mut empty } => {
                    let mut b = unregister(mrs);
                    b.append(&mut empty);
                    b
                }
                _ => Vec::new(),
            };
            done.fail(
                CqErrEntry::new(0, OpFlags::RECV | OpFlags::MSG, Error::Canceled).with_bufs(bufs),
            );
        }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
