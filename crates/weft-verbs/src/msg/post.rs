//! Posting sends and receives: each picks where its bytes live (inline in
//! the work request, a bounce slot, or the caller's registered buffers)
//! and posts with the in-flight table locked, so that the completion —
//! which another thread may poll the moment the post returns — finds its
//! entry.

use std::sync::Arc;

use bytes::BytesMut;
use weft_core::flags::Mode;
use weft_core::provider::{RecvReq, Rejected, RmaOp, RmaReq, SendReq};
use weft_core::sync::lock;
use weft_core::{Error, Result};

use super::complete::{Held, Inflight};
use super::{Link, MsgShared};
use crate::bufs::{gather, imm_data, post_rma, register_source};
use crate::pool::{SlotPool, SLOT};
use crate::sys::{
    AccessFlags, BytesMutMr, Payload, ProtectionDomain, RecvRequest, SendOp, SendRequest, Sge,
};

impl MsgShared {
    /// The checks every post shares: the endpoint is open and connected,
    /// and `len` bytes in `iovs` buffers fit its limits.
    fn admit(&self, len: usize, iovs: usize) -> Result<Arc<Link>> {
        if self.is_closed() {
            return Err(Error::OpBadState);
        }
        let link = lock(&self.link).clone().ok_or(Error::NotConn)?;
        if len > self.cfg.info.ep_attr.max_msg_size {
            return Err(Error::MsgSize);
        }
        if iovs > self.cfg.info.tx_attr.iov_limit.max(1) {
            return Err(Error::Inval);
        }
        Ok(link)
    }

    pub(super) fn post_send(&self, req: SendReq) -> std::result::Result<(), Rejected<SendReq>> {
        let reject = |err, req| Err(Rejected { err, req });
        let link = match self.admit(req.len(), req.iov.len()) {
            Ok(l) => l,
            Err(e) => return reject(e, req),
        };
        let op = match imm_data(req.data) {
            Ok(None) => SendOp::Send,
            Ok(Some(imm)) => SendOp::SendWithImm(imm),
            Err(e) => return reject(e, req),
        };
        if !self.tx.try_take() {
            return reject(Error::Again, req);
        }
        let wr_id = self.wr_id();
        let mut g = lock(&self.inflight);
        match send_on(&link, &req, op, wr_id) {
            Ok(op) => {
                g.insert(wr_id, Inflight { done: req.done, op });
                Ok(())
            }
            Err(e) => {
                drop(g);
                self.tx.release(1);
                reject(e, req)
            }
        }
    }

    pub(super) fn post_rma(&self, req: RmaReq) -> std::result::Result<(), Rejected<RmaReq>> {
        let reject = |err, req| Err(Rejected { err, req });
        let (n, data) = match &req.op {
            RmaOp::Write { iov, data } => (iov.len(), *data),
            RmaOp::Read { bufs } => (bufs.len(), None),
            RmaOp::Atomic(_) => (1, None),
        };
        let link = match self.admit(req.len(), n) {
            Ok(l) => l,
            Err(e) => return reject(e, req),
        };
        // Remote CQ data travels as the write's 32-bit immediate, which
        // completes the receive at the head of the peer's queue (see the
        // module docs of `msg`): only an application that accepted
        // FI_RX_CQ_DATA expects that, for others it is not offered.
        let rx_cq_data = self.cfg.info.mode.contains(Mode::RX_CQ_DATA)
            || self.cfg.info.rx_attr.mode.contains(Mode::RX_CQ_DATA);
        if data.is_some() && !rx_cq_data {
            return reject(Error::NoSys, req);
        }
        let imm = match imm_data(data) {
            Ok(imm) => imm,
            Err(e) => return reject(e, req),
        };
        let Ok(rkey) = u32::try_from(req.key) else {
            // Verbs keys are 32 bits: no region has this key.
            return reject(Error::Access, req);
        };
        if !self.tx.try_take() {
            return reject(Error::Again, req);
        }
        let wr_id = self.wr_id();
        let mut g = lock(&self.inflight);
        let kind = req.op.flags();
        let len = req.len();
        let inline_max = link.qp.caps().max_inline_data as usize;
        match post_rma(
            &link.qp,
            (&link.pd, link.cache.as_ref(), Some(&link.read_pool)),
            inline_max,
            req.op,
            (req.addr, rkey),
            imm,
            wr_id,
        ) {
            Ok(local) => {
                let op = Held::Rma { len, kind, local };
                g.insert(wr_id, Inflight { done: req.done, op });
                Ok(())
            }
            Err((err, op)) => {
                drop(g);
                self.tx.release(1);
                reject(err, RmaReq { op, ..req })
            }
        }
    }

    /// Posts `req` on the QP (the caller accounts for its credit).
    pub(super) fn post_recv_on(
        &self,
        link: &Link,
        mut req: RecvReq,
    ) -> std::result::Result<(), Rejected<RecvReq>> {
        let wr_id = self.wr_id();
        let mut g = lock(&self.inflight);
        match recv_on(link, std::mem::take(&mut req.bufs), wr_id) {
            Ok(op) => {
                g.insert(wr_id, Inflight { done: req.done, op });
                Ok(())
            }
            Err((err, bufs)) => {
                req.bufs = bufs;
                Err(Rejected { err, req })
            }
        }
    }
}

/// Posts the send of `req` as `op` and says what now holds its bytes.
fn send_on(link: &Link, req: &SendReq, op: SendOp, wr_id: u64) -> Result<Held> {
    let len = req.len();
    let post = |payload: Payload<'_>| link.qp.post_send(&SendRequest::new(wr_id, op, payload));
    if len > 0 && len <= link.qp.caps().max_inline_data as usize {
        let data = gather(&req.iov, len);
        post(Payload::Inline(&data))?;
        return Ok(Held::SendInline { len });
    }
    if len > 0 && len <= SLOT {
        if let Some(slot) = link.send_pool.take() {
            let parts = req.iov.iter().map(|b| &b[..]);
            link.send_pool
                .post_from(slot, parts, |sge| post(Payload::Sges(&[sge])))?;
            return Ok(Held::SendSlot { len, slot });
        }
    }
    let mrs = req
        .iov
        .iter()
        .filter(|b| !b.is_empty())
        .map(|b| register_source(link.cache.as_ref(), &link.pd, b, AccessFlags::NONE))
        .collect::<Result<Vec<_>>>()?;
    let sges = mrs
        .iter()
        .map(|m| m.sge())
        .collect::<Result<Vec<Sge<'_>>>>()?;
    post(Payload::Sges(&sges))?;
    drop(sges);
    Ok(Held::SendRegistered { len, _mrs: mrs })
}

/// Posts a receive into `bufs` and says what now holds them; on failure
/// the buffers come back.
fn recv_on(
    link: &Link,
    bufs: Vec<BytesMut>,
    wr_id: u64,
) -> std::result::Result<Held, (Error, Vec<BytesMut>)> {
    let target = RecvTarget {
        pool: &link.recv_pool,
        pd: &link.pd,
        post: &|wr| link.qp.post_recv(wr),
    };
    target.post(bufs, wr_id)
}

/// Where receives are posted: a connection's queue pair, or the shared
/// receive queue of a shared receive context, each with its slots.
pub(super) struct RecvTarget<'a> {
    pub pool: &'a SlotPool,
    pub pd: &'a Arc<ProtectionDomain>,
    pub post: &'a dyn Fn(&RecvRequest<'_>) -> Result<()>,
}

impl RecvTarget<'_> {
    /// Posts a receive into `bufs`: a bounce slot when they fit one,
    /// else the buffers themselves, registered. On failure the buffers
    /// come back.
    pub(super) fn post(
        &self,
        bufs: Vec<BytesMut>,
        wr_id: u64,
    ) -> std::result::Result<Held, (Error, Vec<BytesMut>)> {
        let cap: usize = bufs.iter().map(|b| b.len()).sum();
        if cap > 0 && cap <= SLOT {
            if let Some(slot) = self.pool.take() {
                let posted = self.pool.with(|mr| {
                    let sge = mr.sge(self.pool.offset(slot), cap)?;
                    (self.post)(&RecvRequest {
                        wr_id,
                        sges: &[sge],
                    })
                });
                return match posted {
                    Ok(()) => Ok(Held::RecvSlot { bufs, slot }),
                    Err(e) => {
                        self.pool.put(slot);
                        Err((e, bufs))
                    }
                };
            }
        }
        self.post_registered(bufs, wr_id)
    }

    fn post_registered(
        &self,
        bufs: Vec<BytesMut>,
        wr_id: u64,
    ) -> std::result::Result<Held, (Error, Vec<BytesMut>)> {
        let mut mrs = Vec::with_capacity(bufs.len());
        let mut empty = Vec::new();
        let mut failed = None;
        for b in bufs {
            if b.is_empty() || failed.is_some() {
                empty.push(b);
                continue;
            }
            match BytesMutMr::new(self.pd, b, AccessFlags::LOCAL_WRITE) {
                Ok(mr) => mrs.push(mr),
                Err(e) => failed = Some(e),
            }
        }
        let posted = match failed {
            Some(e) => Err(e),
            None => mrs
                .iter()
                .map(|m| m.sge())
                .collect::<Result<Vec<Sge<'_>>>>()
                .and_then(|sges| (self.post)(&RecvRequest { wr_id, sges: &sges })),
        };
        match posted {
            Ok(()) => Ok(Held::RecvRegistered { mrs, empty }),
            Err(e) => {
                let mut back: Vec<BytesMut> = mrs
                    .into_iter()
                    .filter_map(|m| m.into_inner().ok())
                    .collect();
                back.append(&mut empty);
                Err((e, back))
            }
        }
    }
}
