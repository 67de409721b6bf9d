//! Shared receive contexts (`fi_srx_context`): one pool of posted
//! receives that every bound endpoint takes its messages into.
//!
//! The application posts receives on the context, not on the endpoints;
//! a message arriving at any bound endpoint fills the oldest one, and the
//! completion goes to that endpoint's receive CQ and counter (fi_endpoint(3):
//! shared contexts have no CQ of their own). Receives posted through a
//! bound endpoint go to its context.
//!
//! Contexts that match in software (tcp, udp, shm, verbs RDM) take
//! tagged receives, receives directed by source,
//! `FI_PEEK`/`FI_CLAIM`/`FI_DISCARD` and multi-receive buffers (see
//! `srx_multi.rs`) as an endpoint does; verbs MSG's (a shared receive
//! queue) takes untagged receives only.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::BytesMut;
use weft_core::addr::{FiAddr, FI_ADDR_UNSPEC};
use weft_core::attr::RxAttr;
use weft_core::completion::{CqErrEntry, OpDone};
use weft_core::flags::{Caps, OpFlags};
use weft_core::provider::{EpStats, ProviderSrx, RecvReq, Rejected};
use weft_core::{Error, Result};

use crate::endpoint::{async_op, OpResult};
use crate::fabric::{next_fid, Domain};
use crate::msg::RecvMsg;
use crate::opfuture::{wait_then_post, Lazy, OnDrop, OpFuture, Owner, Started};

/// A shared receive context.
#[derive(Debug, Clone)]
pub struct SharedRxContext {
    pub(crate) inner: Arc<SrxInner>,
}

#[derive(Debug)]
pub(crate) struct SrxInner {
    pub(crate) state: CtxState,
    pub(crate) prov: Arc<dyn ProviderSrx>,
    /// The attributes it was opened with (zeros filled from the domain).
    attr: RxAttr,
    /// `FI_OPT_MIN_MULTI_RECV` of the context's multi-receives.
    pub(crate) min_multi_recv: AtomicUsize,
    /// The domain's `ep_attr.max_msg_size`: the largest minimum.
    pub(crate) max_msg_size: usize,
}

/// What every shared context (receive or transmit) has: its ids, the
/// endpoints bound to it, whether it is closed.
#[derive(Debug)]
pub(crate) struct CtxState {
    fid: u64,
    domain: u64,
    /// Endpoints bound to it (it cannot close while any is).
    bound: AtomicUsize,
    closed: AtomicBool,
}

impl CtxState {
    /// A context of domain `domain` just opened (`what`: "srx", "stx").
    pub(crate) fn open(domain: u64, what: &'static str, size: usize) -> CtxState {
        let fid = next_fid();
        tracing::debug!(fid, size, what, "shared context open");
        CtxState {
            fid,
            domain,
            bound: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
        }
    }

    pub(crate) fn fid(&self) -> u64 {
        self.fid
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// `OpBadState` once closed.
    pub(crate) fn live(&self) -> Result<()> {
        if self.is_closed() {
            Err(Error::OpBadState)
        } else {
            Ok(())
        }
    }

    /// Whether an endpoint of domain `domain` may bind it: `Domain` for
    /// another domain's context, `OpBadState` for a closed one.
    pub(crate) fn bindable(&self, domain: u64) -> Result<()> {
        if self.domain != domain {
            return Err(Error::Domain);
        }
        self.live()
    }

    pub(crate) fn bind(&self) {
        self.bound.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn unbind(&self) {
        self.bound.fetch_sub(1, Ordering::AcqRel);
    }

    /// `fi_close`: `Busy` while endpoints are bound; `Ok(true)` when this
    /// call is the one that closed it.
    pub(crate) fn close(&self) -> Result<bool> {
        if self.bound.load(Ordering::Acquire) > 0 {
            return Err(Error::Busy);
        }
        Ok(self.close_now())
    }

    /// Closes it whatever is bound (last handle gone); true the first time.
    pub(crate) fn close_now(&self) -> bool {
        !self.closed.swap(true, Ordering::AcqRel)
    }
}

impl Domain {
    /// `fi_srx_context`: a shared receive context holding up to `size`
    /// posted receives (0: the domain's `rx_attr.size`), with the
    /// domain's other receive attributes. `NoSys` when the domain's
    /// endpoints cannot share receives (its `max_ep_srx_ctx` is 0:
    /// verbs RDM and DGRAM, udp `FI_EP_SOCK_DGRAM`).
    pub fn srx_context(&self, size: usize) -> Result<SharedRxContext> {
        let attr = RxAttr {
            size,
            ..RxAttr::default()
        };
        self.srx_context_attr(&attr)
    }

    /// `fi_srx_context` with its `fi_rx_attr`: `size` (posted receives),
    /// `total_buffered_recv` (what the peers of every bound endpoint
    /// together may have buffered unexpected; tcp, udp, shm, verbs RDM),
    /// `caps` (`FI_MSG`, `FI_TAGGED`, `FI_RECV`, `FI_DIRECTED_RECV`,
    /// `FI_MULTI_RECV`, within the domain's receive caps, else `Inval`;
    /// empty: those the domain has) and
    /// `iov_limit`; a 0 field takes the domain's. Default `op_flags` are
    /// not supported (`BadFlags`).
    pub fn srx_context_attr(&self, attr: &RxAttr) -> Result<SharedRxContext> {
        let info = self.info();
        if info.domain_attr.max_ep_srx_ctx == 0 {
            return Err(Error::NoSys);
        }
        if !attr.op_flags.is_empty() {
            return Err(Error::BadFlags);
        }
        let dom = &info.rx_attr;
        let pick = |v: usize, d: usize| if v == 0 { d } else { v };
        // What a receive side can have; RMA and the rest are endpoints'.
        let recv_caps =
            Caps::MSG | Caps::TAGGED | Caps::RECV | Caps::DIRECTED_RECV | Caps::MULTI_RECV;
        let caps = if attr.caps.is_empty() {
            dom.caps & recv_caps
        } else {
            attr.caps
        };
        if !(dom.caps & recv_caps).contains(caps) {
            return Err(Error::Inval);
        }
        let attr = RxAttr {
            caps,
            size: pick(attr.size, dom.size),
            total_buffered_recv: pick(attr.total_buffered_recv, dom.total_buffered_recv),
            iov_limit: pick(attr.iov_limit, dom.iov_limit),
            ..dom.clone()
        };
        let prov = self.inner.prov.as_ref().ok_or(Error::NoSys)?;
        let prov = prov.srx_open_attr(&attr)?;
        Ok(SharedRxContext {
            inner: Arc::new(SrxInner {
                state: CtxState::open(self.fid(), "srx", attr.size),
                prov,
                attr,
                min_multi_recv: AtomicUsize::new(weft_core::multi_recv::DEFAULT_MIN_MULTI_RECV),
                max_msg_size: info.ep_attr.max_msg_size,
            }),
        })
    }
}

impl SharedRxContext {
    /// The object id.
    pub fn fid(&self) -> u64 {
        self.inner.state.fid()
    }

    fn open(&self) -> Result<()> {
        self.inner.state.live()
    }

    pub(crate) fn req(
        &self,
        msg: RecvMsg,
        flags: OpFlags,
        waiter: Option<weft_core::completion::Waiter>,
    ) -> RecvReq {
        let directed = self.inner.attr.caps.contains(Caps::DIRECTED_RECV);
        let mut req = RecvReq {
            src: if directed { msg.src } else { FI_ADDR_UNSPEC },
            bufs: msg.bufs,
            tagged: msg.tagged,
            tag: msg.tag,
            ignore: msg.ignore,
            flags,
            // The CQ and counter are the receiving endpoint's, known
            // when a message arrives.
            done: OpDone {
                context: msg.context,
                flags: OpFlags::RECV | OpFlags::msg_or_tagged(msg.tagged),
                report: true,
                cq: None,
                cntr: None,
                waiter,
            },
            multi: None,
        };
        if flags.contains(OpFlags::MULTI_RECV) {
            weft_core::multi_recv::attach(&mut req, self.min_multi_recv(), None);
        }
        req
    }

    pub(crate) fn check(&self, msg: &RecvMsg, flags: OpFlags) -> Result<()> {
        if !self.inner.prov.matches() {
            // Untagged receives only; no PEEK/CLAIM/MULTI_RECV here.
            if msg.tagged {
                return Err(Error::NoSys);
            }
            if !flags.is_empty() {
                return Err(Error::BadFlags);
            }
        } else {
            let peeks = OpFlags::PEEK | OpFlags::CLAIM | OpFlags::DISCARD;
            if flags.contains(OpFlags::MULTI_RECV) {
                let capable = self.inner.attr.caps.contains(Caps::MULTI_RECV);
                if flags != OpFlags::MULTI_RECV {
                    return Err(Error::BadFlags);
                }
                crate::endpoint::check_multi(capable, msg, self.min_multi_recv())?;
            } else if !peeks.contains(flags) || !crate::endpoint::peek_flags_ok(msg, flags) {
                return Err(Error::BadFlags);
            }
            let need = if msg.tagged { Caps::TAGGED } else { Caps::MSG };
            if !self.inner.attr.caps.contains(need) {
                return Err(Error::NoSys);
            }
        }
        if msg.bufs.is_empty() && !flags.intersects(OpFlags::PEEK | OpFlags::CLAIM) {
            return Err(Error::Inval);
        }
        if msg.bufs.len() > self.inner.attr.iov_limit.max(1) {
            return Err(Error::Inval);
        }
        Ok(())
    }

    /// `fi_recvmsg` on the context: tagged or untagged, with the peek
    /// family or `FI_MULTI_RECV` (see
    /// [`post_recv_multi`](Self::post_recv_multi)) where the context
    /// matches in software; untagged without flags on verbs MSG's. The
    /// buffers come back on failure: `Again` when full, `OpBadState`
    /// once closed.
    pub fn post_recvmsg(
        &self,
        msg: RecvMsg,
        flags: OpFlags,
    ) -> std::result::Result<(), (Error, Vec<BytesMut>)> {
        if let Err(e) = self.open().and_then(|()| self.check(&msg, flags)) {
            return Err((e, msg.bufs));
        }
        self.inner
            .prov
            .post_recv(self.req(msg, flags, None))
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
    pub fn recvmsg(
        &self,
        msg: RecvMsg,
        flags: OpFlags,
    ) -> impl Future<Output = OpResult> + Send + '_ {
        Lazy::new(move || self.start_recv(msg, flags))
    }

    /// Checks and posts a receive for its future (also for endpoints
    /// bound to the context). One future, one completion: a
    /// multi-receive is [`recv_multi`](Self::recv_multi) (`BadFlags`).
    pub(crate) fn start_recv(&self, msg: RecvMsg, flags: OpFlags) -> Started<'_> {
        let fail = |e: Error, bufs| CqErrEntry::new(0, OpFlags::RECV, e).with_bufs(bufs);
        if flags.contains(OpFlags::MULTI_RECV) {
            return Started::Failed(fail(Error::BadFlags, msg.bufs));
        }
        if let Err(e) = self.open().and_then(|()| self.check(&msg, flags)) {
            return Started::Failed(fail(e, msg.bufs));
        }
        let (ctx, tx, rx) = async_op();
        let mut msg = msg;
        msg.context = ctx;
        let on_drop = OnDrop::for_recv(flags);
        let req = self.req(msg, flags, Some(tx));
        let prov = &self.inner.prov;
        let future =
            move |rx| OpFuture::new(rx, ctx, Some(Owner::Srx(prov.clone())), on_drop, None);
        match prov.post_recv(req) {
            Ok(()) => Started::Posted(future(rx)),
            Err(Rejected {
                err: Error::Again,
                req,
            }) => Started::Boxed(Box::pin(async move {
                if let Err(r) = wait_then_post(req, |r| prov.post_recv(r)).await {
                    return Err(fail(r.err, r.req.bufs));
                }
                future(rx).await
            })),
            Err(r) => Started::Failed(fail(r.err, r.req.bufs)),
        }
    }

    /// Receives one message into `buf`.
    pub fn recv(&self, buf: BytesMut) -> impl Future<Output = OpResult> + Send + '_ {
        self.recvmsg(RecvMsg::untagged(buf, 0), OpFlags::empty())
    }

    /// `fi_trecv` on the context: a tagged receive of a message whose tag
    /// matches `tag` outside the bits of `ignore`, from `src`
    /// (`FI_ADDR_UNSPEC`: anyone; honoured with `FI_DIRECTED_RECV` in the
    /// context's caps, as an address of the AV of the endpoint a message
    /// arrives at). Contexts that do not match in software (verbs MSG)
    /// refuse it (`NoSys`).
    pub fn post_trecv(
        &self,
        buf: BytesMut,
        src: FiAddr,
        tag: u64,
        ignore: u64,
        context: u64,
    ) -> Result<()> {
        self.post_recvmsg(
            RecvMsg::tagged(buf, src, tag, ignore, context),
            OpFlags::empty(),
        )
        .map_err(|(e, _)| e)
    }

    /// Receives one tagged message into `buf` (see
    /// [`post_trecv`](Self::post_trecv)).
    pub fn trecv(
        &self,
        buf: BytesMut,
        src: FiAddr,
        tag: u64,
        ignore: u64,
    ) -> impl Future<Output = OpResult> + Send + '_ {
        self.recvmsg(RecvMsg::tagged(buf, src, tag, ignore, 0), OpFlags::empty())
    }

    /// The attributes the context was opened with.
    pub fn attr(&self) -> &RxAttr {
        &self.inner.attr
    }

    /// What the context holds now: `unexpected_bytes` (buffered for no
    /// receive yet, with the per-message overhead, against
    /// `total_buffered_recv`) and `parked` (connections of bound
    /// endpoints waiting for a receive or for that budget). Zeros where
    /// the provider tracks nothing (verbs).
    pub fn stats(&self) -> EpStats {
        self.inner.prov.stats()
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
        if self.inner.state.close()? {
            self.inner.prov.close();
        }
        Ok(())
    }
}

impl Drop for SrxInner {
    fn drop(&mut self) {
        if self.state.close_now() {
            self.prov.close();
        }
    }
}
