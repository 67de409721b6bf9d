//! Shared receive contexts (`fi_srx_context`): one pool of posted
//! receives that every bound endpoint takes its messages into.
//!
//! The application posts receives on the context, not on the endpoints;
//! a message arriving at any bound endpoint fills the oldest one, and the
//! completion goes to that endpoint's receive CQ and counter (fi_endpoint(3):
//! shared contexts have no CQ of their own). Receives posted through a
//! bound endpoint go to its context.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::BytesMut;
use weft_core::addr::FI_ADDR_UNSPEC;
use weft_core::completion::{CqEntry, CqErrEntry, OpDone};
use weft_core::flags::OpFlags;
use weft_core::provider::{ProviderSrx, RecvReq, Rejected};
use weft_core::{Error, Result};

use crate::endpoint::async_op;
use crate::fabric::{next_fid, Domain};
use crate::msg::RecvMsg;
use crate::opfuture::{post_when_room, OnDrop, OpFuture, Owner};

/// A shared receive context.
#[derive(Debug, Clone)]
pub struct SharedRxContext {
    pub(crate) inner: Arc<SrxInner>,
}

#[derive(Debug)]
pub(crate) struct SrxInner {
    fid: u64,
    pub(crate) domain: u64,
    pub(crate) prov: Arc<dyn ProviderSrx>,
    /// Endpoints bound to it (it cannot close while any is).
    pub(crate) bound: AtomicUsize,
    closed: AtomicBool,
}

impl Domain {
    /// `fi_srx_context`: a shared receive context holding up to `size`
    /// posted receives (0: the domain's `rx_attr.size`). `NoSys` when
    /// the domain's endpoints cannot share receives (its
    /// `max_ep_srx_ctx` is 0: tcp, verbs RDM and DGRAM).
    pub fn srx_context(&self, size: usize) -> Result<SharedRxContext> {
        if self.info().domain_attr.max_ep_srx_ctx == 0 {
            return Err(Error::NoSys);
        }
        let size = if size == 0 {
            self.info().rx_attr.size
        } else {
            size
        };
        let prov = self.inner.prov.as_ref().ok_or(Error::NoSys)?;
        let prov = prov.srx_open(size)?;
        let fid = next_fid();
        tracing::debug!(fid, size, "srx context open");
        Ok(SharedRxContext {
            inner: Arc::new(SrxInner {
                fid,
                domain: self.fid(),
                prov,
                bound: AtomicUsize::new(0),
                closed: AtomicBool::new(false),
            }),
        })
    }
}

impl SharedRxContext {
    /// The object id.
    pub fn fid(&self) -> u64 {
        self.inner.fid
    }

    fn open(&self) -> Result<()> {
        if self.inner.closed.load(Ordering::Acquire) {
            Err(Error::OpBadState)
        } else {
            Ok(())
        }
    }

    fn req(msg: RecvMsg, flags: OpFlags, waiter: Option<weft_core::completion::Waiter>) -> RecvReq {
        RecvReq {
            src: FI_ADDR_UNSPEC,
            bufs: msg.bufs,
            tagged: false,
            tag: 0,
            ignore: 0,
            flags,
            // The CQ and counter are the receiving endpoint's, known
            // when a message arrives.
            done: OpDone {
                context: msg.context,
                flags: OpFlags::RECV | OpFlags::MSG,
                report: true,
                cq: None,
                cntr: None,
                waiter,
            },
            multi: None,
        }
    }

    fn check(msg: &RecvMsg, flags: OpFlags) -> Result<()> {
        if msg.tagged || !flags.is_empty() {
            // Untagged receives only; no PEEK/CLAIM/MULTI_RECV here.
            return Err(if msg.tagged {
                Error::NoSys
            } else {
                Error::BadFlags
            });
        }
        if msg.bufs.is_empty() {
            return Err(Error::Inval);
        }
        Ok(())
    }

    /// `fi_recvmsg` on the context (untagged; no flags). The buffers come
    /// back on failure: `Again` when full, `OpBadState` once closed.
    pub fn post_recvmsg(
        &self,
        msg: RecvMsg,
        flags: OpFlags,
    ) -> std::result::Result<(), (Error, Vec<BytesMut>)> {
        if let Err(e) = self.open().and_then(|()| Self::check(&msg, flags)) {
            return Err((e, msg.bufs));
        }
        self.inner
            .prov
            .post_recv(Self::req(msg, flags, None))
            .map_err(|Rejected { err, req }| (err, req.bufs))
    }

    /// `fi_recv` on the context: receive into `buf` (its `len()` is the
    /// capacity).
    pub fn post_recv(&self, buf: BytesMut, context: u64) -> Result<()> {
        self.post_recvmsg(RecvMsg::untagged(buf, context), OpFlags::empty())
            .map_err(|(e, _)| e)
    }

    /// Receives one message, at whichever bound endpoint it arrives, and
    /// resolves with the completion. A full context is waited out.
    /// Dropping the future withdraws the receive, or, when a message
    /// already reached it, hands that message to the next receive of the
    /// context, reported on the CQ of the endpoint it arrived at.
    pub async fn recvmsg(
        &self,
        msg: RecvMsg,
        flags: OpFlags,
    ) -> std::result::Result<CqEntry, CqErrEntry> {
        let fail = |e: Error, bufs| CqErrEntry::new(0, OpFlags::RECV, e).with_bufs(bufs);
        if let Err(e) = self.open().and_then(|()| Self::check(&msg, flags)) {
            return Err(fail(e, msg.bufs));
        }
        let (ctx, tx, rx) = async_op();
        let mut msg = msg;
        msg.context = ctx;
        let on_drop = OnDrop::for_recv(flags);
        let req = Self::req(msg, flags, Some(tx));
        if let Err(r) = post_when_room(req, |r| self.inner.prov.post_recv(r)).await {
            return Err(fail(r.err, r.req.bufs));
        }
        let owner = Owner::Srx(self.inner.prov.clone());
        OpFuture::new(rx, ctx, Some(owner), on_drop, None).await
    }

    /// Receives one message into `buf`.
    pub async fn recv(&self, buf: BytesMut) -> std::result::Result<CqEntry, CqErrEntry> {
        let msg = RecvMsg::untagged(buf, 0);
        self.recvmsg(msg, OpFlags::empty()).await
    }

    /// `fi_cancel`: `NoEnt` unless a receive with `context` could be
    /// withdrawn (it then completes with `Canceled`).
    pub fn cancel(&self, context: u64) -> Result<()> {
        self.open()?;
        if self.inner.prov.cancel(context) {
            Ok(())
        } else {
            Err(Error::NoEnt)
        }
    }

    /// Receives that can still be posted.
    pub fn rx_size_left(&self) -> Result<usize> {
        self.open()?;
        Ok(self.inner.prov.rx_size_left())
    }

    /// `fi_close`: `Busy` while endpoints are bound to it. Pending
    /// receives complete with `Canceled`.
    pub fn close(&self) -> Result<()> {
        if self.inner.bound.load(Ordering::Acquire) > 0 {
            return Err(Error::Busy);
        }
        if !self.inner.closed.swap(true, Ordering::AcqRel) {
            self.inner.prov.close();
        }
        Ok(())
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }
}

impl Drop for SrxInner {
    fn drop(&mut self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            self.prov.close();
        }
    }
}
