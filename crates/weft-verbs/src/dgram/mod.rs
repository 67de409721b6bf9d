//! `FI_EP_DGRAM` over a UD queue pair.
//!
//! A datagram is one UD packet: at most the port's MTU, delivered at most
//! once, in no promised order. Nothing of Weft's own travels with it (the
//! remote CQ data is the packet's immediate data), so a send is exactly
//! the application's bytes.
//!
//! An endpoint's address is the IP and port of an rdma_cm id in the UDP
//! port space; the endpoint answers the address resolutions (SIDR) of
//! peers inserting it with its queue pair number. Inserting an address
//! into the AV runs that resolution ([`resolve`]), so the entries hold
//! address handles and sends need no lookup beyond them.
//!
//! Receives land in registered slots of the endpoint (each a GRH and an
//! MTU), always posted to the queue pair, and are copied into the
//! application's buffers: datagrams that arrive before a receive is posted
//! wait in their slots instead of being dropped, and a receive can be
//! cancelled, which one handed to the device could not be.
//!
//! Multicast groups ([`multicast`]) are joined through rdma_cm ids of
//! their own; the queue pair is attached to each group's GID, so group
//! datagrams arrive in the same slots.

mod multicast;
mod resolve;
mod rx;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::runtime::Handle;
use weft_core::addr::{decode_sockaddr, encode_sockaddr, FiAddr};
use weft_core::completion::{OpDone, Returned};
use weft_core::credits::Credits;
use weft_core::flags::OpFlags;
use weft_core::hash::{fast_map, FastMap};
use weft_core::progress::Progress;
use weft_core::provider::{EpConfig, EpStats, ProviderEndpoint, RecvReq, Rejected, SendReq};
use weft_core::recv_completion::RecvCtx;
use weft_core::sync::lock;
use weft_core::{Error, Result};

use crate::cm_events::CmChannel;
use crate::cq_poller::{self, PollerSlot};
use crate::slot_pool::SlotPool;
use crate::sys::{
    AccessFlags, AddressHandle, AhAttr, CmEventKind, CmId, CompChannel, ConnParam, Cq, Payload,
    PortSpace, QpCaps, QpInitAttr, QpType, QueuePair, SendOp, SendRequest, UdDest, GRH_LEN,
    UDP_QKEY,
};

pub use resolve::{UdPeer, UdResolver};

/// Receive slots per endpoint: how many datagrams may wait for receives.
const RX_SLOTS: usize = 256;
/// Send slots per endpoint (sends larger than the inline limit).
const TX_SLOTS: usize = 256;
/// Receive work requests carry this bit; the rest of the id is the slot.
const RECV_BIT: u64 = 1 << 63;
/// Pending address resolutions a listener keeps.
const LISTEN_BACKLOG: i32 = 1024;
/// No traffic class seen yet (in the `AtomicU16`s of [`DgramShared`]).
const NO_TCLASS: u16 = u16::MAX;

/// The endpoint's verbs objects, children after parents.
struct Res {
    listener: CmId,
    chan: Arc<CompChannel>,
    cq: Arc<Cq>,
    qp: Arc<QueuePair>,
    send_pool: SlotPool,
    recv_pool: SlotPool,
}

/// A send on the device.
struct Inflight {
    done: OpDone,
    len: usize,
    slot: Option<u32>,
}

/// A datagram waiting in its slot for a receive.
struct Arrival {
    held: Held,
    len: usize,
    src: FiAddr,
    data: Option<u64>,
}

/// Where a datagram waiting for a receive is.
enum Held {
    /// In its receive slot (with the GRH before it).
    Slot(u32),
    /// Given back by a receive whose future was dropped as the datagram
    /// reached it: in that receive's buffer.
    Copied(bytes::BytesMut),
}

#[derive(Default)]
struct RxQueue {
    posted: VecDeque<RecvReq>,
    arrived: VecDeque<Arrival>,
}

/// Address (AV bytes) → the peer entry and its copy of the endpoint's
/// traffic class.
type OwnAhs = FastMap<Vec<u8>, (Arc<UdPeer>, Arc<AddressHandle>)>;

/// State shared by the endpoint handle and its drivers.
pub struct DgramShared {
    cfg: EpConfig,
    rt: Handle,
    local: SocketAddr,
    mtu: usize,
    resolver: Arc<UdResolver>,
    cm: Arc<CmChannel>,
    res: Res,
    rxq: Mutex<RxQueue>,
    inflight: Mutex<FastMap<u64, Inflight>>,
    next_wr: AtomicU64,
    tx: Credits,
    rx: Credits,
    poller: PollerSlot,
    closed: AtomicBool,
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
    /// The IP TOS of `tx_attr.tclass`.
    tos: Option<u8>,
    /// The domain resolves each address once, for all its endpoints, into
    /// an address handle of the default class; an endpoint with a class
    /// of its own sends through copies with that class, made on first
    /// use, each with the peer entry it copies (a re-resolved address
    /// gets a new copy).
    own_ahs: Mutex<OwnAhs>,
    /// The traffic class of the address handle last sent with, and of
    /// the last datagram received (`NO_TCLASS`: none yet).
    tx_tclass: AtomicU16,
    rx_tclass: AtomicU16,
    /// Joined multicast groups.
    groups: multicast::Groups,
}

impl std::fmt::Debug for DgramShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DgramShared")
            .field("local", &self.local)
            .field("qpn", &self.res.qp.qp_num())
            .finish()
    }
}

/// The `ProviderEndpoint` handle.
#[derive(Debug)]
pub struct VerbsDgramEndpoint {
    shared: Arc<DgramShared>,
    inline: Arc<dyn Progress>,
}

/// Opens a DGRAM endpoint on a DGRAM domain: binds its rdma_cm id,
/// builds the UD queue pair on the domain's protection domain, posts the
/// receive slots and starts answering resolutions.
pub fn open(cfg: EpConfig, rt: Handle) -> Result<Arc<dyn ProviderEndpoint>> {
    let resolver = cfg
        .domain
        .as_ref()
        .and_then(|d| d.as_any().downcast_ref::<crate::domain::VerbsDomain>())
        .and_then(|d| d.ud_resolver())
        // A DGRAM endpoint needs a domain opened for DGRAM, whose AV
        // resolves addresses.
        .ok_or(Error::Inval)?;
    let tos = crate::tos_of(&cfg.info)?;
    let want = cfg
        .src_addr
        .as_deref()
        .or(cfg.info.src_addr.as_deref())
        .ok_or(Error::AddrNotAvail)
        .and_then(decode_sockaddr)?;
    let cm = CmChannel::open(&rt)?;
    let listener = CmId::new(&cm.ch, PortSpace::Udp)?;
    listener.bind_addr(want)?;
    listener.listen(LISTEN_BACKLOG)?;
    let local = listener.local_addr().ok_or(Error::AddrNotAvail)?;
    let ctx = listener.context()?;
    let pd = resolver.pd().clone();
    if pd.context().as_ptr() != ctx.as_ptr() {
        // The address belongs to another device than the domain's.
        return Err(Error::AddrNotAvail);
    }
    let info = &cfg.info;
    let mtu = info.ep_attr.max_msg_size.clamp(1, 4096);
    let tx_size = info.tx_attr.size.max(1);
    let chan = CompChannel::new(&ctx)?;
    let cq = Cq::new(&ctx, (tx_size + RX_SLOTS + 16) as u32, Some(&chan))?;
    let qp = QueuePair::new(
        &pd,
        &QpInitAttr {
            qp_type: QpType::Ud,
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            srq: None,
            caps: QpCaps {
                max_send_wr: tx_size as u32,
                max_recv_wr: RX_SLOTS as u32,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: info.tx_attr.inject_size as u32,
            },
            sq_sig_all: false,
        },
    )?;
    qp.activate_ud(listener.port_num(), 0, UDP_QKEY, 0)?;
    let res = Res {
        send_pool: SlotPool::with_slot(&pd, TX_SLOTS, mtu, AccessFlags::NONE)?,
        recv_pool: SlotPool::with_slot(&pd, RX_SLOTS, GRH_LEN + mtu, AccessFlags::LOCAL_WRITE)?,
        listener,
        chan,
        cq,
        qp,
    };
    let shared = Arc::new(DgramShared {
        tx: Credits::new(tx_size),
        rx: Credits::new(info.rx_attr.size.max(1)),
        cfg,
        rt,
        local,
        mtu,
        resolver,
        cm,
        res,
        rxq: Mutex::new(RxQueue::default()),
        inflight: Mutex::new(fast_map()),
        next_wr: AtomicU64::new(1),
        poller: cq_poller::new_slot(),
        closed: AtomicBool::new(false),
        tasks: Mutex::new(Vec::new()),
        tos,
        own_ahs: Mutex::new(fast_map()),
        tx_tclass: AtomicU16::new(NO_TCLASS),
        rx_tclass: AtomicU16::new(NO_TCLASS),
        groups: multicast::Groups::default(),
    });
    for slot in 0..RX_SLOTS as u32 {
        shared.post_slot(slot)?;
    }
    let t = cq_poller::start(
        &shared.rt,
        shared.cfg.wait,
        (shared.res.cq.clone(), shared.res.chan.clone()),
        &shared,
        &shared.poller,
    )?;
    lock(&shared.tasks).extend(t);
    answer_resolutions(&shared);
    tracing::debug!(local = %local, qpn = shared.res.qp.qp_num(), "verbs dgram endpoint open");
    let inline: Arc<dyn Progress> = Arc::new(cq_poller::InlinePoll::new(shared.poller.clone()));
    Ok(Arc::new(VerbsDgramEndpoint { shared, inline }))
}

/// Answers every resolution request (SIDR) reaching the endpoint's id
/// with its queue pair; the kernel adds the Q_Key.
fn answer_resolutions(ep: &Arc<DgramShared>) {
    let mut events = ep.cm.subscribe(ep.res.listener.token());
    let qpn = ep.res.qp.qp_num();
    let cm = Arc::downgrade(&ep.cm);
    let t = ep.rt.spawn(async move {
        while let Some(ev) = events.recv().await {
            if ev.kind != CmEventKind::ConnectRequest {
                continue;
            }
            if let Some(id) = ev.new_id {
                if let Err(e) = id.accept(&ConnParam::new(&[]).with_qp_num(qpn)) {
                    tracing::debug!(error = %e, "verbs dgram: answering a resolution failed");
                }
                // The reply went out during accept; a UD id keeps no state
                // worth holding (nor does its route on the channel).
                let token = id.token();
                drop(id);
                if let Some(cm) = cm.upgrade() {
                    cm.unsubscribe(token);
                }
            }
        }
    });
    lock(&ep.tasks).push(t.abort_handle());
}

impl DgramShared {
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Where a send to `dest` goes: the address handle (of the
    /// endpoint's traffic class), QPN and Q_Key of a joined group or of
    /// the resolved peer behind an AV handle.
    fn dest(&self, dest: FiAddr) -> Result<(Arc<AddressHandle>, u32, u32)> {
        let (ah, qpn, qkey) = match self.groups.dest(dest) {
            Some(group) => group?,
            None => {
                let (peer, ah) = self.peer(dest)?;
                (ah, peer.qpn, peer.qkey)
            }
        };
        self.tx_tclass
            .store(u16::from(ah.attr().traffic_class), Ordering::Relaxed);
        Ok((ah, qpn, qkey))
    }

    /// The resolved peer behind AV handle `dest`, and the address handle
    /// to send to it with (of the endpoint's traffic class).
    fn peer(&self, dest: FiAddr) -> Result<(Arc<UdPeer>, Arc<AddressHandle>)> {
        let av = self.cfg.av.as_ref().ok_or(Error::NoAv)?;
        let t = lock(av);
        let raw = t.lookup(dest).map_err(|_| Error::AddrNotAvail)?;
        let peer = self.resolver.peer(raw).ok_or(Error::AddrNotAvail)?;
        let ah = match self.tos {
            Some(tos) if peer.ah.attr().traffic_class != tos => {
                let mut own = lock(&self.own_ahs);
                match own.get(raw) {
                    Some((p, ah)) if Arc::ptr_eq(p, &peer) => ah.clone(),
                    _ => {
                        let attr = AhAttr {
                            traffic_class: tos,
                            ..*peer.ah.attr()
                        };
                        let ah = AddressHandle::new(self.resolver.pd(), &attr)?;
                        own.insert(raw.to_vec(), (peer.clone(), ah.clone()));
                        ah
                    }
                }
            }
            _ => peer.ah.clone(),
        };
        Ok((peer, ah))
    }

    fn post_send(&self, req: SendReq) -> std::result::Result<(), Rejected<SendReq>> {
        let reject = |err, req| Err(Rejected { err, req });
        if self.is_closed() {
            return reject(Error::OpBadState, req);
        }
        let len = req.len();
        if len > self.mtu {
            return reject(Error::MsgSize, req);
        }
        let inline = len <= self.cfg.info.tx_attr.inject_size;
        if req.flags.contains(OpFlags::INJECT) && !inline {
            return reject(Error::MsgSize, req);
        }
        if req.iov.len() > self.cfg.info.tx_attr.iov_limit {
            return reject(Error::Inval, req);
        }
        let imm = match crate::user_bufs::imm_data(req.data) {
            Ok(imm) => imm,
            Err(e) => return reject(e, req),
        };
        let (ah, remote_qpn, remote_qkey) = match self.dest(req.dest) {
            Ok(p) => p,
            Err(e) => return reject(e, req),
        };
        if !self.tx.try_take() {
            return reject(Error::Again, req);
        }
        let op = match imm {
            Some(v) => SendOp::SendWithImm(v),
            None => SendOp::Send,
        };
        let dest = UdDest {
            ah: &ah,
            remote_qpn,
            remote_qkey,
        };
        let wr_id = self.next_wr.fetch_add(1, Ordering::Relaxed) & !RECV_BIT;
        let mut g = lock(&self.inflight);
        let posted = if inline {
            let bytes = crate::user_bufs::gather(&req.iov, len);
            let wr = SendRequest::new(wr_id, op, Payload::Inline(&bytes)).ud(dest);
            self.res.qp.post_send(&wr).map(|()| None)
        } else {
            match self.res.send_pool.take() {
                None => Err(Error::Again),
                Some(slot) => {
                    let parts = req.iov.iter().map(|b| &b[..]);
                    self.res
                        .send_pool
                        .post_from(slot, parts, |sge| {
                            let sges = [sge];
                            let wr = SendRequest::new(wr_id, op, Payload::Sges(&sges)).ud(dest);
                            self.res.qp.post_send(&wr)
                        })
                        .map(|()| Some(slot))
                }
            }
        };
        match posted {
            Ok(slot) => {
                g.insert(
                    wr_id,
                    Inflight {
                        done: req.done,
                        len,
                        slot,
                    },
                );
                Ok(())
            }
            Err(e) => {
                drop(g);
                self.tx.release(1);
                reject(e, req)
            }
        }
    }
}

/// A traffic class kept in an `AtomicU16`.
fn tclass_in(a: &AtomicU16) -> Option<u8> {
    u8::try_from(a.load(Ordering::Relaxed)).ok()
}

impl ProviderEndpoint for VerbsDgramEndpoint {
    fn stats(&self) -> EpStats {
        let ep = &self.shared;
        let mut s = EpStats::default();
        s.tclass = tclass_in(&ep.tx_tclass);
        s.rx_tclass = tclass_in(&ep.rx_tclass);
        // Datagrams waiting for a receive, counted as buffered messages are.
        s.unexpected_bytes = lock(&ep.rxq)
            .arrived
            .iter()
            .map(|a| a.len + weft_core::limits::UNEXPECTED_OVERHEAD)
            .sum();
        s
    }

    fn post_send(&self, req: SendReq) -> std::result::Result<(), Rejected<SendReq>> {
        self.shared.post_send(req)
    }

    fn join(&self, group: Vec<u8>) -> futures::future::BoxFuture<'static, Result<FiAddr>> {
        self.shared.join(group)
    }

    fn leave(&self, mc: FiAddr) -> Result<()> {
        self.shared.leave(mc)
    }

    fn post_recv(&self, req: RecvReq) -> std::result::Result<(), Rejected<RecvReq>> {
        self.shared.post_recv(req)
    }

    fn cancel(&self, context: u64) -> bool {
        self.shared.cancel(context)
    }

    fn give_back(&self, r: Returned) {
        RecvCtx::give_back(&*self.shared, r);
    }

    fn local_addr(&self) -> Vec<u8> {
        encode_sockaddr(&self.shared.local)
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

    fn close(&self) {
        let ep = &self.shared;
        if ep.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let _ = ep.res.qp.to_error();
        for t in lock(&ep.tasks).drain(..) {
            t.abort();
        }
        cq_poller::stop(&ep.poller);
        ep.leave_all();
        ep.cm.unsubscribe(ep.res.listener.token());
        ep.cm.close();
        // Outstanding operations are discarded without completions; the
        // slots stay registered until the endpoint (and its QP) is gone.
        let mut q = lock(&ep.rxq);
        q.posted.clear();
        q.arrived.clear();
    }
}

impl Drop for VerbsDgramEndpoint {
    fn drop(&mut self) {
        self.close();
    }
}
