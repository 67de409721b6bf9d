//! `FI_EP_MSG` over an RC queue pair connected with rdma_cm.
//!
//! On the wire this is a plain RC QP: a send is one RDMA send (with
//! immediate data for remote CQ data), nothing is framed, so plain rdma_cm
//! RC programs are valid peers. The only protocol of Weft's own is the CM
//! private data: one length byte, then the user's CM data (rdma_cm pads
//! private data to a fixed size, so its length must travel with it).
//!
//! Buffers are the caller's, registered for the life of one operation and
//! owned by the in-flight table until the device reports the work request
//! complete: the device never sees memory safe code can free or change.
//! Sends up to the device's inline limit are copied into the work request
//! instead and need no registration.
//!
//! Remote CQ data rides in the 32-bit immediate of the send or RDMA
//! write (wider data is refused with `Inval`). Receives are the
//! application's own buffers posted on the QP, so, as in libfabric's
//! verbs provider (its `FI_RX_CQ_DATA` mode), a write with remote CQ data
//! (`fi_writedata`) consumes the receive at the head of the target's
//! queue just as a message would: that receive completes with the flags
//! of a remote write (`FI_RMA | FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA`),
//! the data, `len` the bytes written into the region and its buffers
//! handed back untouched. Until the target posts a receive, the write
//! waits (receiver-not-ready retries), like a send. The offer carries
//! `FI_RX_CQ_DATA` as an optional mode: applications whose hints do not
//! accept it get the offer without it, and their writedata is `NoSys`.
//!
//! An endpoint with an authorization key connects in two requests, the
//! first answered by the listener's challenge (`crate::keyproof`); its
//! CM data then shares the request with the proof, so it may be at most
//! [`PROOF_DATA_MAX`] (30) bytes instead of [`CM_DATA_SIZE`]. Its data
//! is covered by the proof's MAC. An accepting endpoint with a key takes
//! only a request that proved that key. The queue pair lives in the
//! protection domain of the key the connection proved (`crate::domain`),
//! so it reaches that key's regions and no others.
//!
//! Connection setup is bounded by `limits.handshake_timeout` on both
//! sides (from the request to `Established`), as in the tcp provider: a
//! peer that never completes its side costs the endpoint one timeout, not
//! a QP forever. Listening and the limit on pending requests are the
//! passive endpoint's (`crate::passive`).
//!
//! A receive can be withdrawn (`cancel`, or its future dropped) at any
//! time without losing a message, although verbs cannot take back a work
//! request: the receive leaves the queue of waiting receives and the
//! message that lands in its work request goes to the next receive (see
//! [`complete`]). After a withdrawal the next message lands in the
//! withdrawn receive's work request, so one longer than that receive's
//! buffers ends the connection with a length error, as it would have
//! ended it had the receive stayed; receives of one size never meet it.
//!
//! Sends whose success nothing takes (an inject, a send without
//! `FI_COMPLETION` under selective completion; no counter bound) and that
//! go inline are posted unsignaled, as libfabric's verbs provider posts
//! its injects: the device makes no completion for them unless they fail,
//! and the next signaled completion of the send queue, which an RC queue
//! pair completes in order, ends them (`complete::end_quiet_before`). At
//! most [`QUIET_RUN`] go in a row, so their credits come back.
//!
//! Critical errors (fi_endpoint(3)): a work request that fails other than
//! by a flush (a bad key or address at the peer, a message longer than the
//! receive it lands in, at either end; retries exhausted), or an rdma_cm
//! event saying that the connection broke, disables the endpoint (its
//! operations are `OpBadState`), lets the queue pair flush what was posted
//! (`Canceled`), disconnects so that the peer hears of it, and puts the
//! error on the EQ once. An orderly end (`rdma_disconnect` by either side)
//! is `FI_SHUTDOWN` instead and raises nothing. A peer that goes silent
//! without a disconnect is found the same way (see [`probe`]). `enable`
//! cannot re-enable a disabled endpoint (`NoSys`, `ProviderEndpoint::reenable`'s
//! default): its registrations and flushed work requests belong to the
//! dead queue pair, whose completions may still be arriving, and rdma_cm
//! ids are not reconnected; open a new endpoint.
//!
//! A traffic class (`tx_attr.tclass`) is set as the IP TOS of the rdma_cm
//! id before route resolution on the connecting side, whose queue pair's
//! address vector then carries it. On RoCE the connect request carries
//! that traffic class and the accepting side's queue pair is built from
//! it: a connection has the class of the side that connected. The
//! accepting endpoint sets its own on its id before `rdma_accept` too,
//! which (measured on rxe, Linux 6.1) does not change its queue pair.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::runtime::Handle;
use weft_core::addr::{decode_sockaddr, encode_sockaddr};
use weft_core::attr::EpType;
use weft_core::auth::AuthKey;
use weft_core::completion::{CqErrEntry, Returned};
use weft_core::credits::Credits;
use weft_core::flags::OpFlags;
use weft_core::progress::Progress;
use weft_core::provider::{
    EpConfig, EpStats, ProviderEndpoint, RecvReq, Rejected, RmaReq, SendReq,
};
use weft_core::sync::{lock, FastMutex};
use weft_core::{Error, Result};

use crate::async_reader::DeviceEvents;
use crate::cm_events::CmChannel;
use crate::cq_poller::{self, PollerSlot};
use crate::keyproof::payload::{self, PROOF_DATA_MAX};
use crate::liveness::Probe;
use crate::slot_pool::{SlotPool, SLOTS};
use crate::sys::{
    AccessFlags, CmId, CompChannel, ConnParam, Cq, ProtectionDomain, QpCaps, QpInitAttr, QpType,
    QueuePair,
};

mod closing;
mod complete;
mod connect;
mod give_up;
mod post;
mod post_order;
mod probe;
mod retired;
mod srx;
pub mod stream;

pub use srx::MsgSrx;

use complete::{cancel_flushing_on, RecvMem, RxQueue};

pub use crate::cm_data::{cm_decode, cm_encode, CM_DATA_SIZE};

/// The longest run of unsignaled sends (`post::quiet_turn`): one send in
/// this many at least is signaled when nothing else is, which bounds the
/// credits quiet sends hold until a completion ends them, at the cost of
/// a completion per run.
const QUIET_RUN: usize = 16;

/// The verbs resources of one connection, children after parents.
pub struct Link {
    pub id: CmId,
    pub pd: Arc<ProtectionDomain>,
    pub chan: Arc<CompChannel>,
    pub cq: Arc<Cq>,
    pub qp: Arc<QueuePair>,
    pub send_pool: SlotPool,
    pub recv_pool: SlotPool,
    /// Slots for small RDMA reads.
    pub read_pool: Arc<SlotPool>,
    /// The domain's registration cache (when `pd` is the domain's).
    pub cache: Option<Arc<crate::user_bufs::SourceCache>>,
    /// Given up: no send or RMA operation is posted on it any more.
    /// Set and read under the endpoint's in-flight table's lock
    /// (`give_up::retire_sends`).
    retired: AtomicBool,
    /// Memory of operations a give-up failed while the link was still
    /// held elsewhere (`give_up`): the device may still use it, so it
    /// goes with the link. Declared after `qp`, and `Link` has no `Drop`
    /// of its own: the fields drop in order, so this memory goes after
    /// the link's reference to the queue pair (its last, once the stream
    /// that also held it went).
    parked: FastMutex<Vec<Box<dyn Send>>>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("qp", &self.qp.qp_num())
            .finish()
    }
}

/// State shared by the endpoint handle and its drivers.
pub struct MsgShared {
    pub cfg: EpConfig,
    pub rt: Handle,
    /// The key it proves (its own, else its domain's).
    key: Option<AuthKey>,
    pub link: FastMutex<Option<Arc<Link>>>,
    /// The channel whose events concern our id (ours, or the listener's).
    pub cm: Mutex<Option<Arc<CmChannel>>>,
    /// The CQ poller, for inline waiters.
    poller: PollerSlot,
    /// Receives posted before the QP existed.
    early_recvs: Mutex<Vec<RecvReq>>,
    /// Sends and RMA operations on the device.
    inflight: FastMutex<post::InflightQueue>,
    /// The receives of the connection's own receive queue.
    rxq: FastMutex<RxQueue<RecvMem>>,
    /// The receive queues of given-up queue pairs while their tasks
    /// live (`give_up`), oldest give-up first: a message given back goes
    /// to the oldest receive still waiting there
    /// (`retired::give_back_routed`), and `cancel` finds receives there.
    retired_rx: retired::RetiredList,
    next_wr: AtomicUsize,
    tx: Credits,
    /// Sends may go unsignaled (`post::quiet_turn`): set once the
    /// connection is established and its drivers run.
    quiet_ok: AtomicBool,
    /// Quiet sends posted since the last signaled send or RMA operation
    /// (changed under the in-flight table's lock).
    quiet_run: AtomicUsize,
    /// The longest run of quiet sends: a quarter of the transmit
    /// queue's credits, at most [`QUIET_RUN`].
    quiet_max: usize,
    /// Quiet sends posted (`EpStats::tx_unsignaled`; changed under the
    /// in-flight table's lock).
    quiet_sent: AtomicU64,
    rx: Credits,
    connecting: AtomicBool,
    closed: AtomicBool,
    /// The connection's end was reported on the EQ (it is reported once).
    ended: AtomicBool,
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
    /// `FI_EP_SOCK_STREAM`: the byte stream over the connection.
    stream: Mutex<stream::Slot>,
    /// The stream was handed out: it, not the endpoint, ends the
    /// connection.
    stream_taken: AtomicBool,
    /// Connections refused for their key, either way
    /// (`EpStats::rx_key_rejected`).
    key_rejected: AtomicU64,
    /// The liveness probe of a connection whose receives wait on a
    /// silent peer (a stream has its own).
    probe: Probe,
    /// The async events of the device of its queue pair, read while it
    /// lives, when it is bound to a shared receive context (`None`
    /// otherwise, until the link is built, or if no reader could be
    /// started).
    events: FastMutex<Option<Arc<DeviceEvents>>>,
    /// Whether the connection's end or its close moved the queue pair to
    /// the error state first, and the one last-WQE wait (`closing`).
    qp_end: FastMutex<crate::device_events::QpEnd>,
}

impl std::fmt::Debug for MsgShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MsgShared")
            .field("fid", &self.cfg.fid)
            .field("link", &*lock(&self.link))
            .finish()
    }
}

impl MsgShared {
    fn new(cfg: EpConfig, rt: Handle, key: Option<AuthKey>) -> Arc<MsgShared> {
        let (tx, rx) = (cfg.info.tx_attr.size, cfg.info.rx_attr.size);
        Arc::new(MsgShared {
            cfg,
            rt,
            key,
            link: FastMutex::new(None),
            cm: Mutex::new(None),
            poller: cq_poller::new_slot(),
            early_recvs: Mutex::new(Vec::new()),
            inflight: FastMutex::new(post::InflightQueue::default()),
            rxq: FastMutex::new(RxQueue::default()),
            retired_rx: FastMutex::new(Vec::new()),
            next_wr: AtomicUsize::new(1),
            tx: Credits::new(tx),
            quiet_ok: AtomicBool::new(false),
            quiet_run: AtomicUsize::new(0),
            quiet_max: (tx / 4).min(QUIET_RUN),
            quiet_sent: AtomicU64::new(0),
            rx: Credits::new(rx),
            connecting: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            tasks: Mutex::new(Vec::new()),
            stream: Mutex::new(stream::Slot::None),
            stream_taken: AtomicBool::new(false),
            key_rejected: AtomicU64::new(0),
            probe: Probe::default(),
            events: FastMutex::new(None),
            qp_end: FastMutex::default(),
        })
    }

    /// The bound shared receive context, if any.
    pub(super) fn srx(&self) -> Option<&MsgSrx> {
        self.cfg.srx.as_ref()?.as_any().downcast_ref::<MsgSrx>()
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn is_stream(&self) -> bool {
        self.cfg.info.ep_attr.ep_type == EpType::SockStream
    }

    /// The stream's state, on a `FI_EP_SOCK_STREAM` endpoint.
    fn stream_core(&self) -> Option<Arc<stream::StreamCore>> {
        lock(&self.stream).core().cloned()
    }

    /// Withdraws receives whose futures are gone, then takes a receive
    /// credit if that freed one.
    fn sweep_and_take(&self) -> bool {
        lock(&self.rxq).sweep(&self.rx) > 0 && self.rx.try_take()
    }

    /// Reports a connection that ended in `e` on the EQ, counting it if
    /// it was refused for its key.
    fn report_failed(&self, e: Error, cm: Vec<u8>) {
        if e == Error::KeyRejected {
            self.key_rejected.fetch_add(1, Ordering::Relaxed);
        }
        self.cfg.eq_error(e, cm);
    }

    fn wr_id(&self) -> u64 {
        self.next_wr.fetch_add(1, Ordering::Relaxed) as u64
    }

    /// Builds completion channel, CQ and QP on the id's device, in the
    /// protection domain of `key`, the key the connection proves (so it
    /// reaches the domain's regions under that key and no others).
    fn build_link(self: &Arc<Self>, id: CmId, key: Option<&AuthKey>) -> Result<Arc<Link>> {
        let ctx = id.context()?;
        let pd = crate::domain::endpoint_pd(&self.cfg, &ctx, key)?;
        let chan = CompChannel::new(&ctx)?;
        let info = &self.cfg.info;
        let srx = self.srx();
        let mut events = None;
        if let Some(x) = srx {
            // The shared queue's receives name the context's registrations,
            // which only queue pairs of its protection domain can use: the
            // domain's key's, on the domain's device.
            if !Arc::ptr_eq(&x.pd, &pd) {
                let same_dev = x.pd.context().as_ptr() == ctx.as_ptr();
                return Err(if same_dev {
                    Error::OpNotSupp
                } else {
                    Error::Domain
                });
            }
            // Only an endpoint on a shared receive context waits for a
            // last-WQE event (at its close). Started after the checks (a
            // refused endpoint starts no thread), before the queue pair
            // exists: an event about it finds a reader. Held here until
            // the link is set: a failure on the way lets it go.
            events = crate::async_reader::watch(&ctx);
        }
        // Every receive of a shared context may complete on this CQ.
        let rx_depth = srx.map_or(info.rx_attr.size, |x| x.size().max(info.rx_attr.size));
        // One send queue entry more than the application's: the liveness
        // probe's, which must never take the room of a send it posts.
        let sq = info.tx_attr.size + 1;
        let mut depth = u32::try_from(sq + rx_depth).map_err(|_| Error::Inval)?;
        let mut caps = QpCaps {
            max_send_wr: u32::try_from(sq).map_err(|_| Error::Inval)?,
            max_recv_wr: info.rx_attr.size as u32,
            max_send_sge: info.tx_attr.iov_limit as u32,
            max_recv_sge: info.rx_attr.iov_limit as u32,
            max_inline_data: info.tx_attr.inject_size as u32,
        };
        if self.is_stream() {
            (caps, depth) = (stream::qp_caps(), stream::cq_depth());
        }
        let cq = Cq::new(&ctx, depth.max(16), Some(&chan))?;
        let qp = id.create_qp(
            &pd,
            &QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: cq.clone(),
                recv_cq: cq.clone(),
                srq: srx.map(|x| x.srq.clone()),
                caps,
                sq_sig_all: false,
            },
        )?;
        // A stream posts no MSG operations: one slot each, not 1 MiB
        // pinned for nothing.
        let slots = if self.is_stream() { 1 } else { SLOTS };
        let send_pool = SlotPool::new(&pd, slots, AccessFlags::NONE)?;
        // Nor does a connection on a shared receive context receive into
        // slots of its own: its queue pair has no receive queue (its
        // receives are the context's, in the context's slots).
        let rx_slots = if srx.is_some() { 1 } else { slots };
        let recv_pool = SlotPool::new(&pd, rx_slots, AccessFlags::LOCAL_WRITE)?;
        let read_pool = crate::user_bufs::read_pool(&pd)?;
        let core = if self.is_stream() {
            Some(stream::StreamCore::new(&pd, qp.clone())?)
        } else {
            None
        };
        let link = Arc::new(Link {
            cache: crate::domain::endpoint_cache(&self.cfg, &pd),
            id,
            pd,
            chan,
            cq,
            qp,
            send_pool,
            recv_pool,
            read_pool,
            retired: AtomicBool::new(false),
            parked: FastMutex::new(Vec::new()),
        });
        {
            // Published only on an endpoint not closed, decided under the
            // link's lock as `give_up_link` decides: the close marks the
            // endpoint closed before it takes the link, so either it finds
            // this link (and moves, hands off and unsubscribes it) or the
            // link is never set. A closed endpoint's fresh queue pair never
            // reached RTR (no connect or accept ran on it): dropping it here
            // loses nothing.
            let mut g = lock(&self.link);
            if self.is_closed() {
                return Err(Error::OpBadState);
            }
            // Before the link: a close that finds the link finds its reader.
            *lock(&self.events) = events;
            *g = Some(link.clone());
            // Receives posted while unconnected go to the new QP first, so
            // the peer's first message finds them; moved in the same hold
            // of the link's lock that publishes it, so that a `cancel`
            // (which looks under that lock) finds each either waiting for
            // a link or on the queue pair, never between the two.
            // One the queue pair refuses ends in the same hold, as a
            // cancel under this lock ends a receive.
            let early = std::mem::take(&mut *lock(&self.early_recvs));
            for r in early {
                if let Err(rej) = self.post_recv_on(&link, r) {
                    self.rx.release(1);
                    rej.req.done.fail_with(rej.err);
                }
            }
        }
        if let Some(core) = core {
            // Taken back by `give_up_link` should the connection fail.
            *lock(&self.stream) = stream::Slot::Built(core);
        }
        Ok(link)
    }

    /// The connection ended in order (`rdma_disconnect` by either
    /// side): the QP flushes what is posted (each fails with `Canceled`),
    /// and the EQ hears `FI_SHUTDOWN` once.
    pub(super) fn peer_gone(&self) {
        if self.is_closed() || self.ended.load(Ordering::Acquire) {
            return;
        }
        // A work request of ours that failed before the disconnect came
        // (a receive too short for what landed in it: the very reason the
        // peer, told by the NAK, disconnected) is on the CQ already and
        // makes this a critical error, not an orderly end: hear it first.
        // The slot's guard is not held through the drain.
        let poller = lock(&self.poller).clone();
        if let Some(p) = poller {
            p.drain(true);
        }
        // The drain may have waited behind another (a busy-poll pass):
        // a close meanwhile ends it too.
        if self.is_closed() || self.ended.swap(true, Ordering::AcqRel) {
            return;
        }
        // Cloned in a statement of its own: an `if let` on the guard's
        // temporary would hold the link's lock through the verbs calls.
        let link = lock(&self.link).clone();
        if let Some(l) = link {
            self.end_qp(&l);
        }
        if let Some(core) = self.stream_core() {
            // What arrived before the disconnect is on the CQ by now (the
            // peer disconnects after its sends completed): in the stream
            // before its end.
            let poller = lock(&self.poller).clone();
            if let Some(p) = poller {
                p.drain(true);
            }
            core.ended(false);
        }
        self.cfg.eq_shutdown();
    }

    /// A critical error of the connection (fi_endpoint(3)): a work
    /// request failed and left the QP in the error state, or rdma_cm
    /// reports the connection broken. Unless the connection had already
    /// ended, the endpoint is disabled (operations `OpBadState`) before
    /// anything else is reported; the QP flushes what is posted (each
    /// `Canceled`), the peer hears of it through the disconnect, and the
    /// EQ hears `err` once.
    pub(super) fn critical(&self, err: Error) {
        if self.is_closed() || self.ended.swap(true, Ordering::AcqRel) {
            return;
        }
        self.cfg.fault.raise();
        let link = lock(&self.link).clone();
        if let Some(l) = link {
            self.end_qp(&l);
            let _ = l.id.disconnect();
        }
        if let Some(core) = self.stream_core() {
            core.ended(true);
        }
        tracing::debug!(error = %err, "verbs msg: critical error, endpoint disabled");
        self.cfg.eq_error(err, Vec::new());
    }
}

/// The `ProviderEndpoint` handle.
#[derive(Debug)]
pub struct VerbsMsgEndpoint {
    pub shared: Arc<MsgShared>,
    inline: Arc<dyn Progress>,
}

/// Opens an MSG endpoint (connected later by `connect` or `accept`).
pub fn open(cfg: EpConfig, rt: Handle) -> Result<Arc<dyn ProviderEndpoint>> {
    let key = weft_core::auth::effective_key(
        cfg.info.ep_attr.auth_key.as_deref(),
        cfg.info.domain_attr.auth_key.as_deref(),
    )?;
    let shared = MsgShared::new(cfg, rt, key);
    let inline: Arc<dyn Progress> = Arc::new(cq_poller::InlinePoll::new(shared.poller.clone()));
    Ok(Arc::new(VerbsMsgEndpoint { shared, inline }))
}

impl ProviderEndpoint for VerbsMsgEndpoint {
    fn stats(&self) -> EpStats {
        let ep = &self.shared;
        // Open or being set up, as the tcp provider counts.
        let up = lock(&ep.link).is_some() && !ep.ended.load(Ordering::Acquire) && !ep.is_closed();
        let mut s = EpStats::default();
        s.conns = usize::from(up);
        s.peers = s.conns;
        if up {
            let link = lock(&ep.link).clone();
            s.tclass = crate::qp_tclass(link.as_ref().map(|l| &*l.qp));
        }
        s.rx_key_rejected = ep.key_rejected.load(Ordering::Relaxed);
        s.tx_unsignaled = ep.quiet_sent.load(Ordering::Relaxed);
        s
    }

    fn take_byte_stream(&self) -> Result<Box<dyn weft_core::provider::ByteStream>> {
        if !self.shared.is_stream() {
            return Err(Error::NoSys);
        }
        stream::take(&self.shared)
    }

    fn takes_pool_sends(&self) -> bool {
        // `send_on` posts a pool buffer under its pool's key.
        true
    }

    fn post_send(&self, req: SendReq) -> std::result::Result<(), Rejected<SendReq>> {
        if self.shared.is_stream() {
            // Its data moves through the stream only.
            return Err(Rejected {
                err: Error::NoSys,
                req,
            });
        }
        self.shared.post_send(req)
    }

    fn atomic_valid(
        &self,
        kind: weft_core::atomic::AtomicKind,
        op: weft_core::atomic::AtomicOp,
        datatype: weft_core::atomic::Datatype,
    ) -> weft_core::Result<usize> {
        crate::user_bufs::atomic_valid(kind, op, datatype)
    }

    fn post_rma(&self, req: RmaReq) -> std::result::Result<(), Rejected<RmaReq>> {
        if self.shared.is_stream() {
            return Err(Rejected {
                err: Error::NoSys,
                req,
            });
        }
        self.shared.post_rma(req)
    }

    fn post_recv(&self, req: RecvReq) -> std::result::Result<(), Rejected<RecvReq>> {
        let ep = &self.shared;
        if ep.is_closed() {
            return Err(Rejected {
                err: Error::OpBadState,
                req,
            });
        }
        if ep.cfg.srx.is_some() {
            // Its receives are the shared context's (the front end posts
            // them there); its queue pair has no receive queue to take
            // one, so a receive here would never complete. As weft's
            // async receive of such an endpoint answers.
            return Err(Rejected {
                err: Error::OpNotSupp,
                req,
            });
        }
        if req
            .flags
            .intersects(OpFlags::PEEK | OpFlags::CLAIM | OpFlags::DISCARD)
            || req.tagged
            || ep.is_stream()
        {
            return Err(Rejected {
                err: Error::NoSys,
                req,
            });
        }
        if req.bufs.len() > ep.cfg.info.rx_attr.iov_limit {
            return Err(Rejected {
                err: Error::Inval,
                req,
            });
        }
        if !ep.rx.try_take() && !ep.sweep_and_take() {
            return Err(Rejected {
                err: Error::Again,
                req,
            });
        }
        // The link is borrowed under its lock through the post, not
        // cloned (an `Arc` increment and decrement a receive). The order
        // link, receive queue, slot pool is the receive completion's,
        // which holds the link as long; the queue's lock was held across
        // the verb call already. Held through the early push too: a link
        // built meanwhile (`build_link` sets it and takes the early
        // receives in one hold) cannot miss this one.
        let g = lock(&ep.link);
        match g.as_ref() {
            Some(l) => ep.post_recv_on(l, req).inspect_err(|_| ep.rx.release(1)),
            None => {
                lock(&ep.early_recvs).push(req);
                Ok(())
            }
        }
    }

    fn give_back(&self, r: Returned) {
        // Under the link's lock, as a receive completion (the order link,
        // receive queue), which orders it with a give-up's retirement
        // (see `retired`). The list is cloned (no allocation while it is
        // empty): no lock of it is held through a completion.
        let ep = &self.shared;
        let g = lock(&ep.link);
        let retired = lock(&ep.retired_rx).clone();
        retired::give_back_routed(g.is_some(), &retired, &ep.rxq, &ep.rx, ep.is_closed(), r);
    }

    fn cancel(&self, context: u64) -> bool {
        // In post order: retired queues' receives (oldest first), the
        // link's, those still waiting for a link. Under the link's lock:
        // a give-up takes the link, then retires the queue in a later
        // hold of it; in between, `rxq` with no link holds receives of
        // the queue pair given up. Closed: the tasks end them silently.
        // The receives waiting for a link are looked at in the same hold:
        // `build_link` moves them onto its queue pair in the hold that
        // publishes the link, so each is in exactly one of the places
        // looked at (looked at after the lock was let go, one moved
        // meanwhile was in neither, and its cancel failed `NoEnt`).
        let ep = &self.shared;
        let g = lock(&ep.link);
        let retired = lock(&ep.retired_rx).clone();
        let found = retired::cancel_retired(&retired, &ep.rx, ep.is_closed(), context)
            || match g.as_ref() {
                Some(l) => ep.recv_side(&l.recv_pool).cancel(context),
                None => !ep.is_closed() && cancel_flushing_on(&ep.rxq, &ep.rx, context),
            };
        if found {
            return true;
        }
        let req = {
            let mut early = lock(&ep.early_recvs);
            early
                .iter()
                .position(|r| r.done.context == context)
                .map(|i| early.remove(i))
        };
        drop(g);
        match req {
            Some(r) => {
                self.shared.rx.release(1);
                r.done.fail(
                    CqErrEntry::new(0, OpFlags::RECV | OpFlags::MSG, Error::Canceled)
                        .with_bufs(r.bufs),
                );
                true
            }
            None => false,
        }
    }

    fn local_addr(&self) -> Vec<u8> {
        let a = lock(&self.shared.link)
            .as_ref()
            .and_then(|l| l.id.local_addr())
            .map(|a| encode_sockaddr(&a));
        a.or_else(|| self.shared.cfg.info.src_addr.clone())
            .unwrap_or_default()
    }

    fn peer_addr(&self) -> Option<Vec<u8>> {
        lock(&self.shared.link)
            .as_ref()
            .and_then(|l| l.id.peer_addr())
            .map(|a| encode_sockaddr(&a))
    }

    fn progress_hook(&self) -> Option<Arc<dyn Progress>> {
        Some(self.inline.clone())
    }

    fn tx_size_left(&self) -> usize {
        self.shared.tx.left()
    }

    fn rx_size_left(&self) -> usize {
        self.shared.rx.left()
    }

    fn connect(&self, dest: Vec<u8>, cm_data: Vec<u8>) -> BoxFuture<'static, Result<Vec<u8>>> {
        let ep = self.shared.clone();
        async move {
            let room = if ep.key.is_some() {
                PROOF_DATA_MAX
            } else {
                CM_DATA_SIZE
            };
            if cm_data.len() > room {
                return Err(Error::Inval);
            }
            let dest = decode_sockaddr(&dest)?;
            if ep.is_closed() {
                return Err(Error::OpBadState);
            }
            if lock(&ep.link).is_some() || ep.connecting.swap(true, Ordering::AcqRel) {
                return Err(Error::IsConn);
            }
            let r = connect::active_connect(ep.clone(), dest, cm_data).await;
            ep.connecting.store(false, Ordering::Release);
            match &r {
                Ok(cm) => ep.cfg.eq_connected(cm.clone()),
                Err(e) if lock(&ep.link).is_none() => {
                    tracing::debug!(error = %e, "verbs connect failed");
                }
                Err(_) => {}
            }
            r
        }
        .boxed()
    }

    fn accept(&self, cm_data: Vec<u8>) -> BoxFuture<'static, Result<()>> {
        let ep = self.shared.clone();
        async move {
            let pd = cm_encode(&cm_data)?;
            if ep.is_closed() {
                return Err(Error::OpBadState);
            }
            // As a connect: an endpoint with a link (or building one) is
            // connected, and a give-up of this accept's link would retire
            // the other's operations.
            if lock(&ep.link).is_some() || ep.connecting.swap(true, Ordering::AcqRel) {
                return Err(Error::IsConn);
            }
            let r = async {
                let h = ep.cfg.conn.clone().ok_or(Error::OpBadState)?;
                let req = crate::passive::request_of(&h)?;
                let tos = crate::tos_of(&ep.cfg.info)?;
                if ep.key.is_some() && ep.key.as_ref() != req.proven() {
                    // The connection would join a job whose key it did not
                    // prove (on a keyed domain: reach its regions).
                    let (id, chan) = req.take()?;
                    let _ = id.reject(&payload::refused());
                    chan.unsubscribe(id.token());
                    ep.report_failed(Error::KeyRejected, Vec::new());
                    return Err(Error::KeyRejected);
                }
                // An unkeyed endpoint may take a request its listener's key
                // proved: its queue pair goes where that key's do.
                let proven = req.proven().cloned();
                let (id, chan) = req.take()?;
                // The route the request left on the listener's channel goes
                // on every exit before the link is built (`give_up_link` lets
                // it go after).
                let token = id.token();
                if let Some(t) = tos {
                    id.set_tos(t).inspect_err(|_| chan.unsubscribe(token))?;
                }
                let mut events = chan.subscribe(token);
                *lock(&ep.cm) = Some(chan.clone());
                let link = ep
                    .build_link(id, proven.as_ref())
                    .inspect_err(|_| chan.unsubscribe(token))?;
                // As in a connect: every error from here on lets the link go
                // (its queue pair past RTR once `rdma_accept` returns).
                let r = async {
                    link.id
                        .accept(&ConnParam::new(&pd))
                        .map_err(|e| (e, None))?;
                    connect::established(&ep, &mut events)
                        .await
                        .map_err(|(e, data)| (e, Some(cm_decode(&data))))?;
                    Ok(())
                }
                .await
                .and_then(|()| ep.start(&link, events).map_err(|e| (e, None)));
                match r {
                    Ok(()) => {
                        ep.cfg.eq_connected(Vec::new());
                        Ok(())
                    }
                    Err((e, heard)) => {
                        ep.give_up_link(&chan);
                        if let Some(data) = heard {
                            ep.cfg.eq_error(e, data);
                        }
                        Err(e)
                    }
                }
            }
            .await;
            ep.connecting.store(false, Ordering::Release);
            r
        }
        .boxed()
    }

    fn shutdown(&self) -> Result<()> {
        let link = lock(&self.shared.link).clone().ok_or(Error::NotConn)?;
        link.id.disconnect()
    }

    fn close(&self) {
        // A stream handed out owns the connection from then on.
        if !self.shared.stream_taken.load(Ordering::Acquire) {
            self.shared.close_now();
        }
    }
}

impl Drop for VerbsMsgEndpoint {
    fn drop(&mut self) {
        self.close();
    }
}
