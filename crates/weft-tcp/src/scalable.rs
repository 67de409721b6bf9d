//! Scalable endpoints (`fi_scalable_ep`) on RDM: one listening address
//! and one connection per peer, shared by several transmit contexts and
//! demultiplexed into several receive contexts by the context a message
//! names (`Header::rx_ctx`, set from the `fi_rx_addr` bits of the
//! sender's destination handle).
//!
//! A receive context is an [`EpShared`] of its own without a listener or
//! connections: its matcher, receive credits, unexpected-message budget
//! and parked list are its alone, so receives posted on one context never
//! take a lock another context takes. The scalable endpoint's readers hand
//! each message to the context it names (`rx.rs`), and everything that
//! follows (matching, buffering, delivery, a dropped future's message
//! given back) runs on that context as on a lone endpoint.
//!
//! A transmit context posts through the scalable endpoint's send path
//! (its peer table and connections: one TCP stream per peer carries every
//! context's frames, in posting order); what it owns is its queue's room
//! (`tx_attr.size`) and where its completions go, which the API layer
//! puts in each request.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use weft_core::addr::encode_sockaddr;
use weft_core::completion::Returned;
use weft_core::credits::Credits;
use weft_core::provider::{
    EpConfig, EpStats, ProviderEndpoint, RecvReq, Rejected, RmaReq, SendReq,
};
use weft_core::wire::Header;
use weft_core::{Error, Result};

use crate::boundary::TcpEndpoint;
use crate::endpoint::EpShared;

/// The most transmit or receive contexts one scalable endpoint has
/// (`max_ep_tx_ctx`, `max_ep_rx_ctx`): an index must fit the frame's
/// 16-bit `rx_ctx`, and each receive context costs a matcher.
pub const MAX_CTX: usize = 256;

/// What a scalable endpoint keeps of its contexts. Empty on every other
/// endpoint, which then reads `rx_ctx` 0 as "mine" and any other index
/// as a context it does not have.
#[derive(Debug, Default)]
pub struct Contexts {
    /// Receive context `i` once opened. Set once: an index opens once in
    /// the endpoint's life, so a reader finds its target without a lock.
    rx: Box<[OnceLock<Arc<EpShared>>]>,
    /// Transmit context `i` was opened.
    tx: Box<[AtomicBool]>,
    /// `FI_NAMED_RX_CTX`: messages go to the context they name; without
    /// it every message goes to receive context 0 (fi_endpoint(3): only
    /// a named context can be targeted).
    named: bool,
    /// Messages dropped for naming a context this endpoint does not have.
    pub dropped: AtomicU64,
}

/// Where an arriving message goes.
pub enum Target {
    /// The endpoint whose connection it came on.
    Here,
    /// One of its receive contexts.
    Ctx(Arc<EpShared>),
    /// Nowhere: the context it names does not exist (or is not open).
    Drop,
}

impl Contexts {
    /// The contexts of a scalable endpoint opened with `cfg`.
    pub fn for_scalable(cfg: &EpConfig) -> Contexts {
        let a = &cfg.info.ep_attr;
        Contexts {
            rx: (0..a.rx_ctx_cnt).map(|_| OnceLock::new()).collect(),
            tx: (0..a.tx_ctx_cnt).map(|_| AtomicBool::new(false)).collect(),
            named: cfg.info.caps.contains(weft_core::flags::Caps::NAMED_RX_CTX),
            dropped: AtomicU64::new(0),
        }
    }

    /// Whether this is a scalable endpoint's.
    pub fn scalable(&self) -> bool {
        !self.tx.is_empty() || !self.rx.is_empty()
    }

    /// The receive context a message with header `hdr` is for.
    #[inline]
    pub fn target(&self, hdr: &Header) -> Target {
        if self.rx.is_empty() {
            return if hdr.rx_ctx == 0 {
                Target::Here
            } else {
                Target::Drop
            };
        }
        let i = if self.named {
            usize::from(hdr.rx_ctx)
        } else {
            0
        };
        match self.rx.get(i).and_then(OnceLock::get) {
            Some(c) if !c.is_closed() => Target::Ctx(c.clone()),
            _ => Target::Drop,
        }
    }

    /// The open receive contexts.
    pub fn rx_open(&self) -> impl Iterator<Item = &Arc<EpShared>> {
        self.rx.iter().filter_map(OnceLock::get)
    }
}

/// Opens transmit context `index` of scalable endpoint `sep`, with a
/// queue of `cfg.info.tx_attr.size` operations: `Inval` beyond its count,
/// `Busy` when opened before.
pub fn tx_context(
    sep: &Arc<EpShared>,
    index: usize,
    cfg: &EpConfig,
) -> Result<Arc<dyn ProviderEndpoint>> {
    let slot = sep.ctxs.tx.get(index).ok_or(Error::Inval)?;
    if slot.swap(true, Ordering::AcqRel) {
        return Err(Error::Busy);
    }
    Ok(Arc::new(TcpTxCtx {
        sep: sep.clone(),
        queue: Arc::new(Credits::new(cfg.info.tx_attr.size.max(1))),
        closed: AtomicBool::new(false),
    }))
}

/// Opens receive context `index` of scalable endpoint `sep`, with the
/// context's queues and sizes from `cfg`; errors as [`tx_context`].
pub fn rx_context(
    sep: &Arc<EpShared>,
    index: usize,
    cfg: EpConfig,
) -> Result<Arc<dyn ProviderEndpoint>> {
    let slot = sep.ctxs.rx.get(index).ok_or(Error::Inval)?;
    if slot.get().is_some() {
        return Err(Error::Busy);
    }
    let mut cfg = cfg;
    // Senders are looked up in the scalable endpoint's AV.
    cfg.av.clone_from(&sep.cfg.av);
    let ep = EpShared::new(cfg, sep.local, sep.rt.clone())?;
    // Two opens racing for the index: one sets it, the other is `Busy`.
    slot.set(ep.clone()).map_err(|_| Error::Busy)?;
    Ok(Arc::new(TcpRxCtx {
        inner: TcpEndpoint::new(ep),
    }))
}

/// A transmit context.
#[derive(Debug)]
pub struct TcpTxCtx {
    sep: Arc<EpShared>,
    /// Its transmit queue's room, its own: each frame holds a credit of
    /// it until written (`frame::Credit::Ctx`).
    queue: Arc<Credits>,
    closed: AtomicBool,
}

impl ProviderEndpoint for TcpTxCtx {
    fn post_send(&self, req: SendReq) -> std::result::Result<(), Rejected<SendReq>> {
        if self.closed.load(Ordering::Acquire) || self.sep.is_closed() {
            return Err(Rejected {
                err: Error::OpBadState,
                req,
            });
        }
        self.sep.send_from(req, Some(&self.queue))
    }

    fn post_rma(&self, req: RmaReq) -> std::result::Result<(), Rejected<RmaReq>> {
        if self.closed.load(Ordering::Acquire) || self.sep.is_closed() {
            return Err(Rejected {
                err: Error::OpBadState,
                req,
            });
        }
        // Over the scalable endpoint's connections, as its sends: a read's
        // answer and a write's acknowledgement come back on them, and the
        // operation's own completion goes to this context's queues.
        self.sep.rma_from(req, Some(&self.queue))
    }

    fn atomic_valid(
        &self,
        kind: weft_core::atomic::AtomicKind,
        op: weft_core::atomic::AtomicOp,
        datatype: weft_core::atomic::Datatype,
    ) -> Result<usize> {
        crate::atomic::valid(self.sep.max_msg, kind, op, datatype)
    }

    fn post_recv(&self, req: RecvReq) -> std::result::Result<(), Rejected<RecvReq>> {
        // Receives belong to the receive contexts.
        Err(Rejected {
            err: Error::OpNotSupp,
            req,
        })
    }

    fn cancel(&self, _context: u64) -> bool {
        // Nothing posted here can be withdrawn: sends only.
        false
    }

    fn give_back(&self, r: Returned) {
        // Only a receive's future hands a message back, and no receive
        // is ever posted here; dropping it is all there is to do.
        drop(r);
    }

    fn local_addr(&self) -> Vec<u8> {
        encode_sockaddr(&self.sep.local)
    }

    fn tx_size_left(&self) -> usize {
        self.queue.left()
    }

    fn rx_size_left(&self) -> usize {
        0
    }

    fn stats(&self) -> EpStats {
        let mut s = EpStats::default();
        s.conns = self.sep.conn_count.load(Ordering::Acquire);
        s
    }

    fn close(&self) {
        // Its frames already queued go out and complete: they are on
        // connections the other contexts share.
        self.closed.store(true, Ordering::Release);
    }
}

/// A receive context: a listener-less endpoint that the scalable
/// endpoint's readers feed.
#[derive(Debug)]
pub struct TcpRxCtx {
    inner: TcpEndpoint,
}

impl ProviderEndpoint for TcpRxCtx {
    fn post_send(&self, req: SendReq) -> std::result::Result<(), Rejected<SendReq>> {
        // Sends belong to the transmit contexts.
        Err(Rejected {
            err: Error::OpNotSupp,
            req,
        })
    }

    fn post_recv(&self, req: RecvReq) -> std::result::Result<(), Rejected<RecvReq>> {
        self.inner.post_recv(req)
    }

    fn cancel(&self, context: u64) -> bool {
        self.inner.cancel(context)
    }

    fn give_back(&self, r: Returned) {
        self.inner.give_back(r);
    }

    fn give_back_after(&self, r: Returned) {
        self.inner.give_back_after(r);
    }

    fn local_addr(&self) -> Vec<u8> {
        self.inner.local_addr()
    }

    fn tx_size_left(&self) -> usize {
        0
    }

    fn rx_size_left(&self) -> usize {
        self.inner.rx_size_left()
    }

    fn stats(&self) -> EpStats {
        self.inner.stats()
    }

    fn close(&self) {
        // Messages for it from now on are dropped (`Target::Drop`).
        self.inner.close();
    }
}
