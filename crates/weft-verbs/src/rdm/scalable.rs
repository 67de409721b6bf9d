//! Scalable endpoints (`fi_scalable_ep`) on RDM: one listening address,
//! one RC connection per peer, one CQ and shared receive queue of bounce
//! slots, shared by several transmit contexts, and several receive
//! contexts that the messages name (`Header::rx_ctx`, set from the
//! `fi_rx_addr` bits of the sender's destination handle).
//!
//! A receive context's state (`rxc` in the code; not the per-key lanes
//! of an AV-keyed endpoint) is an [`RdmShared`] of its own that holds
//! the scalable endpoint's connections, tables, keys and verbs resources
//! (the same `Arc`s, so the key lanes of [`super::lanes`] too: an
//! `FI_AV_AUTH_KEY` scalable endpoint's contexts take what arrives under
//! any key it holds) but a receive side of its own (matcher, receive
//! credits, registry of multi-receive parts) and its own queues (`cfg`). The CQ
//! driver of the scalable endpoint looks the named context up (a
//! `OnceLock` per index, no lock) and hands it the message; from there
//! matching, buffering, a rendezvous read and its completion (the read
//! remembers its context), delivery, cancel and a dropped future's
//! message given back run on that context exactly as on a lone
//! endpoint. So past the hand-over no receive context takes a lock
//! another one takes.
//!
//! A transmit context posts through the scalable endpoint (its peer
//! table, connections, in-flight table and the connection's send queue):
//! with one RC connection per peer those are shared, as tcp's contexts
//! share its one stream per peer. Giving each transmit context queue
//! pairs of its own would take a connection per pair of contexts
//! (`tx_ctx_cnt × rx_ctx_cnt` QPs and CM handshakes per pair of
//! endpoints, each bound at accept to its receive context's CQ and SRQ)
//! and a hello naming the pair; not done (docs/design.md). Its queue's
//! room is the scalable endpoint's transmit credits, which are
//! `tx_attr.size` per context: `tx_size_left` reports at most its own
//! size, but one busy context can use another's share.
//!
//! Messages naming a context the endpoint does not have (or one not
//! enabled, or closed) are dropped, counted (`EpStats::rx_bad_ctx`) and
//! reported on the EQ with the sender's address; a delivery-complete or
//! announced one is answered with a failed "finished" flagged "no such
//! context", which fails the send with `AddrNotAvail`.
//!
//! A receive context takes multi-receive buffers as a lone endpoint
//! does (`super::multi`): its buffers sit in its matcher, a rendezvous
//! message is read into its part on the context, and a part still being
//! read when its stream is dropped keeps its place on the context it was
//! cut on (`super::arriving`: the registry is the context's, and the
//! placeholder taking that place is owned by it, so whoever sees the
//! read finish fills it there), ahead of that context's later messages.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::runtime::Handle;
use weft_core::addr::sockaddr_bytes;
use weft_core::completion::Returned;
use weft_core::flags::Caps;
use weft_core::progress::Progress;
use weft_core::provider::{
    EpConfig, EpStats, ProviderEndpoint, RecvReq, Rejected, RmaReq, SendReq,
};
use weft_core::sync::lock;
use weft_core::wire::rdm::{Header, Op as WireOp};
use weft_core::{Error, Result};

use super::{srx, RdmShared, VerbsRdmEndpoint};
use crate::cq_poller;

/// The most transmit or receive contexts one scalable endpoint has
/// (`max_ep_tx_ctx`, `max_ep_rx_ctx`): an index must fit the header's
/// one byte.
pub const MAX_CTX: usize = crate::info::RDM_MAX_CTX;

/// What a scalable endpoint keeps of its contexts.
#[derive(Debug)]
pub(crate) struct Contexts {
    /// Receive context `i` once enabled. Set once: an index opens once
    /// in the endpoint's life, so the CQ driver finds it without a lock.
    rx: Box<[OnceLock<Arc<RdmShared>>]>,
    /// Transmit context `i` was opened.
    tx: Box<[AtomicBool]>,
    /// `FI_NAMED_RX_CTX`: messages go to the context they name; without
    /// it every message goes to receive context 0 (fi_endpoint(3)).
    named: bool,
    /// Messages dropped for naming a context this endpoint does not have.
    dropped: AtomicU64,
}

impl Contexts {
    pub(crate) fn new(cfg: &EpConfig) -> Contexts {
        let a = &cfg.info.ep_attr;
        Contexts {
            rx: (0..a.rx_ctx_cnt.max(1)).map(|_| OnceLock::new()).collect(),
            tx: (0..a.tx_ctx_cnt.max(1))
                .map(|_| AtomicBool::new(false))
                .collect(),
            named: cfg.info.caps.contains(Caps::NAMED_RX_CTX),
            dropped: AtomicU64::new(0),
        }
    }
}

/// Where an arriving message goes.
pub(crate) enum Target {
    /// The endpoint it came to.
    Here,
    /// One of its receive contexts.
    Ctx(Arc<RdmShared>),
    /// Nowhere: the context it names does not exist (or is not open).
    Drop,
}

impl RdmShared {
    /// The receive context a message with header `hdr` is for. An
    /// endpoint that is not scalable takes context 0 only.
    #[inline]
    pub(crate) fn target(&self, hdr: &Header) -> Target {
        let Some(c) = &self.ctxs else {
            return if hdr.rx_ctx == 0 {
                Target::Here
            } else {
                Target::Drop
            };
        };
        let i = if c.named { usize::from(hdr.rx_ctx) } else { 0 };
        match c.rx.get(i).and_then(OnceLock::get) {
            Some(l) if !l.is_closed() => Target::Ctx(l.clone()),
            _ => Target::Drop,
        }
    }

    /// A message named a receive context this endpoint does not have:
    /// counted, reported on the EQ; a sender waiting for the answer (a
    /// delivery-complete or announced message) is told. No log line: a
    /// peer could send many, and the EQ report is bounded.
    pub(crate) fn bad_ctx(&self, hdr: &Header, conn: &Arc<super::Conn>) {
        if let Some(c) = &self.ctxs {
            c.dropped.fetch_add(1, Ordering::Relaxed);
        }
        self.cfg
            .eq_peer_error(Error::AddrNotAvail, sockaddr_bytes(&conn.peer).to_vec());
        if hdr.ack || hdr.op == WireOp::Rts {
            let mut h = self.fin_of(hdr, true);
            h.no_ctx = true;
            self.send_note(conn, h);
        }
    }

    /// This endpoint, if it is a receive context.
    pub(crate) fn as_rxc(&self) -> Option<Arc<RdmShared>> {
        self.rxc_closed.as_ref()?;
        self.me.upgrade()
    }

    /// The receive context a destination handle names (`fi_rx_addr`
    /// bits of the AV; checked by `admit`).
    #[inline]
    pub(crate) fn rx_ctx_of(&self, dest: weft_core::addr::FiAddr) -> u8 {
        let (_, rx) = weft_core::av::split_rx_addr(dest, self.rx_bits);
        u8::try_from(rx).unwrap_or(0)
    }

    /// A receive context of this scalable endpoint, with the context's
    /// `cfg` (its queues and sizes; senders are looked up in the
    /// endpoint's AV).
    fn rxc(&self, mut cfg: EpConfig) -> Arc<RdmShared> {
        cfg.av.clone_from(&self.cfg.av);
        let side = srx::Side::new(cfg.info.rx_attr.size.max(1), usize::MAX);
        Arc::new_cyclic(|me| RdmShared {
            me: me.clone(),
            cfg,
            rt: self.rt.clone(),
            local: self.local,
            local_raw: self.local_raw.clone(),
            nonce: self.nonce,
            cm: self.cm.clone(),
            listener: self.listener.clone(),
            tos: self.tos,
            gate: self.gate.clone(),
            keys: self.keys.clone(),
            source_err: self.source_err,
            peers: self.peers.clone(),
            by_qp: self.by_qp.clone(),
            side,
            srx: None,
            arriving: Mutex::new(Vec::new()),
            inflight: self.inflight.clone(),
            rndv: self.rndv.clone(),
            res: self.res.clone(),
            poller: self.poller.clone(),
            ep_sq: self.ep_sq.clone(),
            backlogged: self.backlogged.clone(),
            next_wr: self.next_wr.clone(),
            tx: self.tx.clone(),
            closed: self.closed.clone(),
            tasks: self.tasks.clone(),
            conn_count: self.conn_count.clone(),
            key_rejected: self.key_rejected.clone(),
            tx_windowed: self.tx_windowed.clone(),
            ctxs: None,
            rxc_closed: Some(AtomicBool::new(false)),
            rx_bits: self.rx_bits,
        })
    }
}

/// Opens (enables) a scalable RDM endpoint: `Inval` for more contexts
/// than [`MAX_CTX`], or with a shared context bound.
pub fn open(cfg: EpConfig, rt: Handle) -> Result<Arc<dyn ProviderEndpoint>> {
    // Its contexts are its queues; shared ones have no place there.
    if cfg.srx.is_some() || cfg.stx.is_some() {
        return Err(Error::Inval);
    }
    let a = &cfg.info.ep_attr;
    if [a.tx_ctx_cnt, a.rx_ctx_cnt]
        .iter()
        .any(|&n| n == 0 || n > MAX_CTX)
    {
        return Err(Error::Inval);
    }
    let shared = super::open::open_shared(cfg, rt, true)?;
    let inline: Arc<dyn Progress> = Arc::new(cq_poller::InlinePoll::new(shared.poller.clone()));
    Ok(Arc::new(VerbsRdmEndpoint { shared, inline }))
}

impl VerbsRdmEndpoint {
    pub(crate) fn open_tx_context(
        &self,
        index: usize,
        cfg: &EpConfig,
    ) -> Result<Arc<dyn ProviderEndpoint>> {
        let c = self.shared.ctxs.as_ref().ok_or(Error::NoSys)?;
        let slot = c.tx.get(index).ok_or(Error::Inval)?;
        if slot.swap(true, Ordering::AcqRel) {
            return Err(Error::Busy);
        }
        Ok(Arc::new(VerbsTxCtx {
            sep: self.shared.clone(),
            size: cfg.info.tx_attr.size.max(1),
            inline: self.inline.clone(),
            closed: AtomicBool::new(false),
        }))
    }

    pub(crate) fn open_rx_context(
        &self,
        index: usize,
        cfg: EpConfig,
    ) -> Result<Arc<dyn ProviderEndpoint>> {
        let c = self.shared.ctxs.as_ref().ok_or(Error::NoSys)?;
        let slot = c.rx.get(index).ok_or(Error::Inval)?;
        if slot.get().is_some() {
            return Err(Error::Busy);
        }
        let rxc = self.shared.rxc(cfg);
        // Two opens racing for the index: one sets it, the other is `Busy`.
        slot.set(rxc.clone()).map_err(|_| Error::Busy)?;
        Ok(Arc::new(VerbsRxCtx {
            rxc,
            inline: self.inline.clone(),
        }))
    }

    /// The scalable endpoint's count of messages for contexts it lacks.
    pub(crate) fn bad_ctx_count(&self) -> u64 {
        self.shared
            .ctxs
            .as_ref()
            .map_or(0, |c| c.dropped.load(Ordering::Relaxed))
    }

    /// At the scalable endpoint's close: its receive contexts' posted
    /// and buffered messages go, without completions.
    pub(crate) fn close_rxcs(&self) {
        if let Some(c) = &self.shared.ctxs {
            for l in c.rx.iter().filter_map(OnceLock::get) {
                close_rxc(l);
            }
        }
    }
}

fn close_rxc(l: &RdmShared) {
    if let Some(c) = &l.rxc_closed {
        c.store(true, Ordering::Release);
    }
    drop(lock(&l.side.matcher).drain_posted());
    drop(lock(&l.side.matcher).drain_unexpected());
}

/// A transmit context: posts through its scalable endpoint.
#[derive(Debug)]
pub struct VerbsTxCtx {
    sep: Arc<RdmShared>,
    /// Its queue's size (`tx_attr.size`).
    size: usize,
    inline: Arc<dyn Progress>,
    closed: AtomicBool,
}

impl ProviderEndpoint for VerbsTxCtx {
    fn post_send(&self, req: SendReq) -> std::result::Result<(), Rejected<SendReq>> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Rejected {
                err: Error::OpBadState,
                req,
            });
        }
        self.sep.send(req)
    }

    fn post_rma(&self, req: RmaReq) -> std::result::Result<(), Rejected<RmaReq>> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Rejected {
                err: Error::OpBadState,
                req,
            });
        }
        self.sep.rma(req)
    }

    fn atomic_valid(
        &self,
        kind: weft_core::atomic::AtomicKind,
        op: weft_core::atomic::AtomicOp,
        datatype: weft_core::atomic::Datatype,
    ) -> Result<usize> {
        crate::user_bufs::atomic_valid(kind, op, datatype)
    }

    fn post_recv(&self, req: RecvReq) -> std::result::Result<(), Rejected<RecvReq>> {
        // Receives belong to the receive contexts.
        Err(Rejected {
            err: Error::OpNotSupp,
            req,
        })
    }

    fn cancel(&self, _context: u64) -> bool {
        // Sends only: nothing posted here can be withdrawn.
        false
    }

    fn give_back(&self, r: Returned) {
        // No receive is ever posted here.
        drop(r);
    }

    fn local_addr(&self) -> Vec<u8> {
        self.sep.local_raw.clone()
    }

    fn progress_hook(&self) -> Option<Arc<dyn Progress>> {
        Some(self.inline.clone())
    }

    fn tx_size_left(&self) -> usize {
        self.sep.tx.left().min(self.size)
    }

    fn rx_size_left(&self) -> usize {
        0
    }

    fn stats(&self) -> EpStats {
        let mut s = EpStats::default();
        s.conns = self.sep.conn_count.load(Ordering::Acquire);
        s.tx_windowed = self.sep.tx_windowed.load(Ordering::Relaxed);
        s
    }

    fn close(&self) {
        // Its work already posted goes out and completes: it is on
        // connections the other contexts share.
        self.closed.store(true, Ordering::Release);
    }
}

/// A receive context: endpoint state that the scalable endpoint's CQ
/// driver feeds.
#[derive(Debug)]
pub struct VerbsRxCtx {
    rxc: Arc<RdmShared>,
    inline: Arc<dyn Progress>,
}

impl ProviderEndpoint for VerbsRxCtx {
    fn post_send(&self, req: SendReq) -> std::result::Result<(), Rejected<SendReq>> {
        // Sends belong to the transmit contexts.
        Err(Rejected {
            err: Error::OpNotSupp,
            req,
        })
    }

    fn post_recv(&self, req: RecvReq) -> std::result::Result<(), Rejected<RecvReq>> {
        self.rxc.post_recv_checked(req)
    }

    fn cancel(&self, context: u64) -> bool {
        self.rxc.cancel_recv(context)
    }

    fn give_back(&self, r: Returned) {
        self.rxc.take_back(r, false);
    }

    fn give_back_after(&self, r: Returned) {
        self.rxc.give_back_in_order(r);
    }

    fn local_addr(&self) -> Vec<u8> {
        self.rxc.local_raw.clone()
    }

    fn progress_hook(&self) -> Option<Arc<dyn Progress>> {
        Some(self.inline.clone())
    }

    fn tx_size_left(&self) -> usize {
        0
    }

    fn rx_size_left(&self) -> usize {
        self.rxc.side.rx.left()
    }

    fn stats(&self) -> EpStats {
        let mut s = EpStats::default();
        s.conns = self.rxc.conn_count.load(Ordering::Acquire);
        s.unexpected_bytes = self.rxc.side.unexp.load(Ordering::Acquire);
        s
    }

    fn close(&self) {
        // Messages for it from now on are dropped (`Target::Drop`); its
        // posted receives and buffered messages go without completions.
        close_rxc(&self.rxc);
    }
}
