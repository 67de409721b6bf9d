//! `FI_EP_RDM` over RC queue pairs: one RC connection per peer, made by
//! rdma_cm on the first send to it, all of an endpoint's connections
//! sharing one CQ, one shared receive queue of bounce slots, and one
//! software tag matcher.
//!
//! Messages up to a slot are sent eagerly (header and payload in one send,
//! inline when small; one without CQ data or acknowledgement, untagged
//! or with a small tag, bare, without the header, to a peer that takes
//! that); larger ones announce the sender's registered buffer
//! (request-to-send), the receiver reads it with RDMA read into the
//! matched receive's buffers and answers "finished" (see [`weft_core::wire::rdm`]). The
//! sender's buffer stays registered and owned by the endpoint until then.
//!
//! Connections: each endpoint listens on its address; a connect request
//! carries the requester's listening address as CM data, so both sides
//! key the connection by the peer's endpoint address. When two endpoints
//! connect to each other at once, the request from the lower address wins:
//! the higher one accepts it, the lower one rejects the other with a
//! marker, and the loser's queued sends leave on the winning connection.
//!
//! Send queues are kept small per connection; work that does not fit waits
//! in the peer's backlog, in order, until completions make room.
//!
//! Multi-receive buffers (`FI_MULTI_RECV`) are receives of the matcher
//! that give each message a part of themselves ([`multi`]); the messages
//! of a dropped stream still being read keep their places ([`arriving`]).
//!
//! Hostile and failing peers (see [`peers`]): inbound connection requests
//! beyond `limits.max_conns` connections (outbound and handshaking ones
//! included) are rejected and reported on the EQ with the requester's
//! address, as are requests without a Weft hello and handshakes not
//! completed within `limits.handshake_timeout` (their QP and id are
//! destroyed). A connection that ends (the peer disconnects, its process
//! dies, any work request fails: an RC queue pair is in the error state
//! after its first failed completion) gives back everything it held: its
//! place in the count, its QP, its peer entry once nothing else waits
//! there, the buffered announcements of messages it can no longer
//! deliver, and the receives that had matched them, which go back to the
//! head of the posted receives in the order they were matched (a claim
//! fails instead: it asked for that very message). Sends the peer still
//! owed a "finished" fail with `ConnReset`; a peer that goes silent
//! without a disconnect ends its connection the same way, by a work
//! request that fails once its retries are spent or, for sends owed a
//! "finished" and nothing else on the device, by the failed liveness
//! probe of [`probe`]. So an RDM endpoint never raises
//! the critical-error fault of fi_endpoint(3) (`EpConfig::fault`): a dead
//! connection costs the operations that were on it, and the next send to
//! that peer makes a new one; the endpoint itself stays enabled.
//!
//! A traffic class (`tx_attr.tclass`) is the IP TOS of the listener and of
//! every connection's rdma_cm id, set before route resolution. As on MSG
//! (see `crate::msg`), a connection carries the class of the endpoint
//! that made it: between endpoints of different classes, each accepted
//! connection has its peer's.
//!
//! Authorization keys (`crate::keyproof`): an endpoint with a key makes
//! and takes connections only with peers that prove it, in two connect
//! requests, the first answered by the acceptor's challenge; the hello
//! then travels in the proof, covered by its MAC, as the listening port
//! alone (a whole sockaddr does not fit beside the MAC): the listening
//! address is that port at the IP address the request came from. A
//! refusal fails the sends queued for the peer with `KeyRejected` and is
//! reported on both sides' EQs with the other's address (and counted,
//! `EpStats::rx_key_rejected`). Everything the endpoint builds lives in
//! its key's protection domain (`crate::domain`), so its connections
//! reach that key's regions and no others.
//!
//! Idle connections are not retired (`limits.idle_timeout` is not used
//! here), only counted against `max_conns`. The target of RDMA writes
//! sees no traffic from them, so an idle connection cannot be told from
//! one carrying RMA; and a disconnect flushes whatever the peer has
//! posted on it, which fails those operations at the peer: this protocol
//! has no resend, so closing one side on a timer would turn a quiet
//! period into spurious failures. An idle connection holds one QP and
//! nothing else (receive buffers are the shared queue's, nothing is
//! buffered for it), so `max_conns` bounds what idle peers cost; when
//! they go away everything is reclaimed. Retiring them safely needs a
//! drain exchange on the wire (stop posting, wait for the peer's last
//! completion, then disconnect), which the tcp provider's `Shutdown`
//! frame provides there.

mod arriving;
mod closing;
mod keys;
mod lanes;
mod multi;
mod open;
mod peers;
mod post;
mod probe;
mod rma;
mod rx;
pub(crate) mod scalable;
mod sources;
pub(crate) mod srx;
mod tasks;
mod tx;
mod windows;

pub(crate) use sources::Sender;
pub(crate) use tasks::Tasks;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use tokio::runtime::Handle;
use weft_core::addr::{decode_sockaddr, encode_sockaddr, FiAddr};
use weft_core::completion::{CqErrEntry, OpDone, Returned};
use weft_core::credits::Credits;
use weft_core::flags::OpFlags;
use weft_core::hash::{fast_map, FastMap};
use weft_core::progress::Progress;
use weft_core::provider::{
    EpConfig, EpStats, ProviderEndpoint, RecvReq, Rejected, RmaReq, SendReq,
};
use weft_core::sync::lock;
use weft_core::tagmatch::{Matcher, MsgInfo, RecvSpec};
use weft_core::{Error, Result};

use crate::cm_events::CmChannel;
use crate::cq_poller::{self, PollerSlot};
use crate::slot_pool::Loan;
use crate::sys::{BytesMr, BytesMutMr, CmId, CompChannel, Cq, PortSpace, QueuePair};
use weft_core::limits::ConnSlot;

pub(crate) use tx::inject_size;
use weft_core::wire::rdm::Header;

/// Send work requests one connection may have outstanding; more waits in
/// the peer's backlog (a QP's send queue costs memory per peer).
const QP_SEND_WR: usize = 128;
/// Largest inline send (header included) asked of a QP.
const QP_INLINE: usize = 256;
/// Send work requests of all connections together: what the shared CQ
/// holds beside the receive slots.
const EP_SEND_WR: usize = 4096;
/// Bytes per receive (and send) slot: a 4 KiB payload and its header, so
/// page-sized messages still go eagerly (a rendezvous costs a
/// registration on each side and two more messages).
pub(crate) const RDM_SLOT: usize = 4096 + weft_core::wire::rdm::HDR;
/// Listen backlog of the endpoint's rdma_cm id.
const LISTEN_BACKLOG: i32 = 256;

/// One RC connection to a peer endpoint.
pub(crate) struct Conn {
    pub id: CmId,
    pub qp: Arc<QueuePair>,
    /// The peer's endpoint (listening) address.
    pub peer: SocketAddr,
    /// The peer endpoint's incarnation (from its CM data).
    pub peer_nonce_cell: AtomicU64,
    /// The feature byte of the peer's hello (`cm_data::FEAT_*`; set
    /// before the connection carries anything).
    pub peer_features: AtomicU8,
    /// Send work requests this QP may still take.
    pub sq: Credits,
    pub dead: AtomicBool,
    /// Rendezvous reads from this connection's peer that are posted and
    /// not yet completed.
    pub reads: AtomicUsize,
    /// Receives whose messages were cut off by the end of this
    /// connection, with the order they were matched in. They go back to
    /// the posted receives together once its last read is in, so that
    /// they keep that order.
    pub orphans: Mutex<Vec<Orphan>>,
    /// The key it proved and what its work requests name.
    pub lane: Arc<lanes::Lane>,
    /// Its liveness probe ([`probe`]).
    pub probe: crate::liveness::Probe,
    /// Source slots whose windows the peer did not revoke: given back
    /// once the queue pair they are bound to is destroyed.
    pub parked: Mutex<Vec<windows::Parked>>,
    /// Its place in the endpoint's connection count, given back after the
    /// QP and id (declared before it) are destroyed.
    pub _slot: ConnSlot,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("peer", &self.peer)
            .field("qp", &self.qp.qp_num())
            .finish()
    }
}

impl Conn {
    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    pub(crate) fn peer_nonce(&self) -> u64 {
        self.peer_nonce_cell.load(Ordering::Acquire)
    }

    /// The peer's incarnation and feature byte, from its hello.
    pub(crate) fn peer_hello_set(&self, n: u64, features: u8) {
        self.peer_nonce_cell.store(n, Ordering::Release);
        self.peer_features.store(features, Ordering::Release);
    }

    /// Whether a message may go without its header (see
    /// [`weft_core::wire::rdm`]).
    fn takes_bare(&self) -> bool {
        self.peer_features.load(Ordering::Relaxed) & crate::cm_data::FEAT_BARE != 0
    }

    /// Whether the peer revokes the windows it reads through ([`windows`]).
    pub(crate) fn takes_windows(&self) -> bool {
        self.peer_features.load(Ordering::Relaxed) & crate::cm_data::FEAT_WINDOWS != 0
    }

    /// Keeps a source slot the peer may still read until the connection
    /// (and its queue pair, declared before) is gone.
    pub(crate) fn park(&self, p: windows::Parked) {
        lock(&self.parked).push(p);
    }

    /// The AV key handle the connection proved (`FI_AV_AUTH_KEY`), as
    /// messages carry it.
    pub(crate) fn key(&self) -> Option<u16> {
        self.lane.handle.and_then(|h| u16::try_from(h).ok())
    }

    /// The sender of what arrives on it.
    pub(crate) fn sender(&self) -> Sender {
        Sender {
            addr: self.peer,
            key: self.key(),
        }
    }

    fn inline_max(&self) -> usize {
        self.qp.caps().max_inline_data as usize
    }
}

/// Work for a peer that could not be posted yet.
pub(crate) enum Deferred {
    /// A send (no connection yet, or no room on it).
    Send(SendReq),
    /// A "finished" for a transfer the peer waits on, and the connection
    /// the transfer was announced on (a window's "finished" revokes it
    /// only there).
    Fin(Header, Weak<Conn>),
    /// A rendezvous read for a matched receive.
    Read(Box<ReadJob>),
    /// A rendezvous read into a buffer of the endpoint's own (a
    /// delivery-complete message nobody was waiting for), from the
    /// connection that announced it.
    Pull(Arc<rx::Pull>, Header, Arc<Conn>),
    /// An RMA read or write.
    Rma(RmaReq),
}

/// The state of one peer endpoint.
#[derive(Default)]
pub(crate) struct PeerState {
    /// The connection that carries sends to the peer.
    pub conn: Option<Arc<Conn>>,
    /// Sends waiting for that connection to exist.
    pub pending: VecDeque<Deferred>,
    /// Our outbound connect is in progress.
    pub connecting: bool,
    /// An inbound connection is being accepted.
    pub accepting: bool,
    /// The lane (key) of its connection, or of the one being made: one
    /// connection per peer address, so one key at a time.
    pub lane: usize,
}

impl PeerState {
    /// Nothing is kept for the peer: its entry can go.
    pub(crate) fn is_empty(&self) -> bool {
        self.conn.is_none() && self.pending.is_empty() && !self.connecting && !self.accepting
    }
}

/// A buffered message nobody was waiting for.
pub(crate) enum Unexp {
    /// Its payload, copied out of the receive slot, and its sender.
    Eager(Bytes, Sender),
    /// Its announcement: the payload is still at the sender.
    Rts { conn: Arc<Conn>, hdr: Header },
    /// Its payload, being pulled from the sender.
    Pull(Arc<rx::Pull>),
    /// Its payload, left in its receive slot: it came past a shared
    /// context's budget (see [`srx`]).
    Slot(srx::SlotHold, Sender),
}

/// A matched receive waiting for (or doing) its rendezvous read.
pub(crate) struct ReadJob {
    /// When it was matched (an id from the endpoint's counter): orders
    /// the receives of a connection that died.
    pub seq: u64,
    pub req: RecvReq,
    pub info: MsgInfo,
    pub hdr: Header,
    pub conn: Arc<Conn>,
    /// Registers a part of an awaited multi-receive buffer while it is
    /// read into (see [`arriving`]).
    pub arriving: Option<arriving::Guard>,
    /// The receive context it was matched on, if a scalable endpoint's
    /// (set by `start_read`).
    pub rxc: Option<Arc<RdmShared>>,
}

/// A receive cut off by the end of its sender's connection.
#[derive(Debug)]
pub(crate) struct Orphan {
    /// When it was matched: the order it goes back in.
    pub seq: u64,
    pub req: RecvReq,
    /// The receive context it goes back to, if a scalable endpoint's.
    pub rxc: Option<Arc<RdmShared>>,
}

/// Where a rendezvous read into a receive lands.
pub(crate) enum ReadInto {
    /// The receive's buffers, registered for it.
    Registered(Vec<crate::local_mem::Dst>),
    /// A staging slot, copied into them at the completion.
    Staged(Loan),
}

/// Where a pull's read lands.
pub(crate) enum PullInto {
    /// A buffer of the endpoint's, registered for it.
    Registered(BytesMutMr),
    /// A staging slot, copied into a buffer of the endpoint's at the
    /// completion.
    Staged(Loan),
}

/// What holds a send's bytes while the device may read them.
pub(crate) enum TxHeld {
    Inline,
    Slot(u32),
    Registered(#[allow(dead_code)] BytesMr),
}

/// One posted work request, owned here until its completion.
pub(crate) enum Op {
    /// An eager send: done at its work completion.
    Send {
        done: OpDone,
        len: usize,
        held: TxHeld,
        conn: Arc<Conn>,
    },
    /// A request-to-send; the send itself ends with the peer's "finished".
    Rts {
        cookie: u64,
        held: TxHeld,
        conn: Arc<Conn>,
    },
    /// A "finished".
    Fin { held: TxHeld, conn: Arc<Conn> },
    /// A receive slot on the shared receive queue.
    Slot { slot: u32 },
    /// A pull of an unexpected message into the endpoint's buffer.
    Pull {
        pull: Arc<rx::Pull>,
        hdr: Header,
        into: PullInto,
        conn: Arc<Conn>,
    },
    /// A rendezvous read for a matched receive.
    Read {
        job: ReadJob,
        into: ReadInto,
        placed: usize,
        conn: Arc<Conn>,
    },
    /// An RMA read or write of the application's.
    Rma(rma::RmaOpState),
    /// The RDMA write of a write with remote CQ data; the operation ends
    /// with the note posted after it (`then`).
    RmaPart {
        held: crate::user_bufs::RmaLocal,
        conn: Arc<Conn>,
        then: u64,
    },
    /// The connection's liveness probe ([`probe`]).
    Probe { conn: Arc<Conn> },
}

impl Op {
    /// The connection the work request is on (a receive slot is on the
    /// shared queue, not on one).
    fn conn(&self) -> Option<&Arc<Conn>> {
        match self {
            Op::Send { conn, .. }
            | Op::Rts { conn, .. }
            | Op::Fin { conn, .. }
            | Op::Pull { conn, .. }
            | Op::Read { conn, .. }
            | Op::RmaPart { conn, .. }
            | Op::Probe { conn } => Some(conn),
            Op::Rma(st) => Some(&st.conn),
            Op::Slot { .. } => None,
        }
    }
}

/// A send waiting for the peer's "finished": a rendezvous one (whose
/// buffer stays registered, or whose source slot stays lent, and owned
/// here, until then) or a delivery-complete one.
pub(crate) struct RndvSend {
    pub done: OpDone,
    pub len: usize,
    pub _mr: Option<Arc<BytesMr>>,
    /// The source slot the peer reads through a window ([`windows`]).
    pub loan: Option<windows::SourceLoan>,
    pub conn: Arc<Conn>,
}

/// The verbs objects every connection of the endpoint shares, and those
/// of each key ([`lanes`]).
pub(crate) struct Res {
    pub chan: Arc<CompChannel>,
    pub cq: Arc<Cq>,
    pub lanes: lanes::Lanes,
}

pub(crate) type RdmMatcher = Matcher<RecvReq, srx::Held, srx::Src>;

/// State shared by the endpoint handle, its connection tasks and its CQ
/// driver. Connections (and with them the QPs) are declared before the
/// in-flight table so that they go first when the endpoint is dropped.
pub struct RdmShared {
    pub(crate) me: Weak<RdmShared>,
    pub(crate) cfg: EpConfig,
    pub(crate) rt: Handle,
    pub(crate) local: SocketAddr,
    pub(crate) local_raw: Vec<u8>,
    /// This endpoint's incarnation: tells a peer's restart from a
    /// duplicate connect.
    pub(crate) nonce: u64,
    pub(crate) cm: Arc<CmChannel>,
    pub(crate) listener: Arc<CmId>,
    /// The IP TOS of every connection's rdma_cm id (`tx_attr.tclass`).
    pub(crate) tos: Option<u8>,
    /// The key connections prove (its own, else its domain's), and the
    /// listener's open challenges.
    pub(crate) gate: Arc<crate::keyproof::Gate>,
    /// The keys it holds, by key lane ([`lanes`]); a scalable endpoint's
    /// receive contexts share them.
    pub(crate) keys: Arc<keys::RdmKeys>,
    /// `FI_SOURCE_ERR`: a message from a sender not in the AV completes
    /// as an `AddrNotAvail` error carrying the sender's address.
    pub(crate) source_err: bool,
    pub(crate) peers: Arc<Mutex<FastMap<SocketAddr, PeerState>>>,
    pub(crate) by_qp: Arc<Mutex<FastMap<u32, Arc<Conn>>>>,
    /// The matcher and receive credits: this endpoint's own, or those of
    /// the shared receive context it is bound to (`srx`).
    pub(crate) side: Arc<srx::Side>,
    pub(crate) srx: Option<Arc<srx::RdmSrx>>,
    /// Parts of awaited multi-receive buffers being read into.
    pub(crate) arriving: Mutex<Vec<Arc<arriving::Arriving>>>,
    pub(crate) inflight: Arc<Mutex<FastMap<u64, Op>>>,
    pub(crate) rndv: Arc<Mutex<FastMap<u64, RndvSend>>>,
    pub(crate) res: Arc<Res>,
    pub(crate) poller: PollerSlot,
    /// Send work requests all connections may still post (CQ room).
    pub(crate) ep_sq: Arc<Credits>,
    /// Peers with work in their backlog.
    pub(crate) backlogged: Arc<AtomicUsize>,
    next_wr: Arc<AtomicU64>,
    pub(crate) tx: Arc<Credits>,
    pub(crate) closed: Arc<AtomicBool>,
    pub(crate) tasks: Arc<Mutex<Tasks>>,
    /// Connections open or being made (each holds a [`ConnSlot`]).
    pub(crate) conn_count: Arc<AtomicUsize>,
    /// Connections refused for their key, either way
    /// (`EpStats::rx_key_rejected`).
    pub(crate) key_rejected: Arc<AtomicU64>,
    /// Rendezvous sends through memory windows (`EpStats::tx_windowed`).
    pub(crate) tx_windowed: Arc<AtomicU64>,
    /// A scalable endpoint's receive contexts (`scalable`); `None`
    /// elsewhere.
    pub(crate) ctxs: Option<Arc<scalable::Contexts>>,
    /// Set when this is a receive context of a scalable endpoint (the
    /// endpoint's connections, keys, queues and tables, with a receive
    /// side and queues of its own): closed on its own.
    pub(crate) rxc_closed: Option<AtomicBool>,
    /// `rx_ctx_bits` of the AV: a destination's receive context.
    pub(crate) rx_bits: u32,
}

impl std::fmt::Debug for RdmShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmShared")
            .field("fid", &self.cfg.fid)
            .field("local", &self.local)
            .field("conns", &lock(&self.by_qp).len())
            .finish()
    }
}

impl weft_core::recv_completion::RecvCtx for RdmShared {
    fn rx_credits(&self) -> &Credits {
        &self.side.rx
    }

    fn reported_addr(&self, a: FiAddr) -> FiAddr {
        RdmShared::reported_addr(self, a)
    }

    fn give_back(&self, r: Returned) {
        self.take_back(r, false);
    }

    fn give_back_after(&self, r: Returned) {
        self.give_back_in_order(r);
    }
}

impl RdmShared {
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
            || self
                .rxc_closed
                .as_ref()
                .is_some_and(|c| c.load(Ordering::Acquire))
    }

    pub(crate) fn wr_id(&self) -> u64 {
        self.next_wr.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn reported_addr(&self, a: FiAddr) -> FiAddr {
        match &self.cfg.av {
            Some(av) => lock(av).reported_addr(a),
            None => a,
        }
    }

    /// The checks every transmit post makes (state, length, buffer
    /// count, destination), then its credit: the peer's address and the
    /// lane of the key its entry names, or why the post is refused.
    fn admit(&self, dest: FiAddr, len: usize, n_bufs: usize) -> Result<(SocketAddr, usize)> {
        if self.is_closed() {
            return Err(Error::OpBadState);
        }
        if len > self.cfg.info.ep_attr.max_msg_size {
            return Err(Error::MsgSize);
        }
        if n_bufs > self.cfg.info.tx_attr.iov_limit.max(1) {
            return Err(Error::Inval);
        }
        let (_, rx) = weft_core::av::split_rx_addr(dest, self.rx_bits);
        if rx >= scalable::MAX_CTX as u32 {
            // No peer has that receive context (the header's one byte).
            return Err(Error::Inval);
        }
        let dest = self.dest_of(dest)?;
        if !self.tx.try_take() {
            return Err(Error::Again);
        }
        Ok(dest)
    }

    fn dest_of(&self, dest: FiAddr) -> Result<(SocketAddr, usize)> {
        let av = self.cfg.av.as_ref().ok_or(Error::NoAv)?;
        let t = lock(av);
        let (raw, key) = t.lookup_keyed(dest).map_err(|_| Error::AddrNotAvail)?;
        let a = decode_sockaddr(raw).map_err(|_| Error::AddrNotAvail)?;
        Ok((a, self.keys.lane_for_dest(key)?))
    }

    fn recv(&self, req: RecvReq) -> std::result::Result<(), Rejected<RecvReq>> {
        // Directed by key: a key the endpoint holds (fi_av(3)).
        if req.flags.contains(OpFlags::AUTH_KEY) {
            let err = match self.keys.av_mode() {
                false => Some(Error::BadFlags),
                true if !self.keys.holds(req.src) => Some(Error::Inval),
                true => None,
            };
            if let Some(err) = err {
                return Err(Rejected { err, req });
            }
        }
        let spec = spec_of(&req);
        let resolve = srx::Src::resolve;
        if req.flags.contains(OpFlags::PEEK) {
            let r = lock(&self.side.matcher).peek(&spec, req.flags, &resolve);
            match r {
                Ok(info) => rx::complete_peek(self, req, info),
                Err(Error::Inval) => {
                    return Err(Rejected {
                        err: Error::Inval,
                        req,
                    })
                }
                Err(e) => req.done.fail(CqErrEntry::new(0, OpFlags::RECV, e)),
            }
            return Ok(());
        }
        if req.flags.contains(OpFlags::CLAIM) {
            let discard = req.flags.contains(OpFlags::DISCARD);
            let r = lock(&self.side.matcher).claim(spec.context, discard);
            match r {
                Ok((info, Some(h))) => {
                    // Delivered through the normal path, which gives back
                    // one receive credit.
                    self.side.rx.take();
                    if let Some(req) = srx::take_held(self, self.srx.as_deref(), req, info, h, true)
                    {
                        self.repost(req);
                    }
                }
                Ok((info, None)) => rx::complete_peek(self, req, info),
                Err(e) => req.done.fail(CqErrEntry::new(0, OpFlags::RECV, e)),
            }
            return Ok(());
        }
        if !self.side.rx.try_take() {
            return Err(Rejected {
                err: Error::Again,
                req,
            });
        }
        self.repost(req);
        Ok(())
    }

    /// A receive matched a buffered message that arrived here.
    pub(crate) fn take_unexpected(&self, req: RecvReq, info: MsgInfo, u: Unexp, claimed: bool) {
        match u {
            Unexp::Eager(data, from) => rx::copy_and_deliver_from(self, req, info, &data, from),
            Unexp::Rts { conn, hdr } => {
                if conn.is_dead() {
                    if claimed {
                        // The caller asked for this very message; it is gone.
                        rx::fail_recv(self, req, info, 0, Error::ConnReset);
                    } else {
                        // Its sender is gone and the payload with it: the
                        // receive goes on to the next message instead.
                        self.repost(req);
                    }
                    return;
                }
                self.start_read(ReadJob {
                    seq: self.wr_id(),
                    req,
                    info,
                    hdr,
                    conn,
                    arriving: None,
                    rxc: None,
                });
            }
            Unexp::Pull(p) => p.matched(self, req, info, claimed),
            Unexp::Slot(s, from) => {
                let req = self.copy_from_slot(req, s.off, s.len);
                let placed = s.len.min(req.capacity());
                // The slot goes back to the receive queue first.
                drop(s);
                rx::deliver_from(self, req, info, placed, from);
            }
        }
    }
}

pub(crate) fn spec_of(req: &RecvReq) -> RecvSpec {
    RecvSpec {
        by_key: req.flags.contains(OpFlags::AUTH_KEY),
        src: req.src,
        tagged: req.tagged,
        tag: req.tag,
        ignore: req.ignore,
        context: req.done.context,
    }
}

/// The `ProviderEndpoint` handle.
#[derive(Debug)]
pub struct VerbsRdmEndpoint {
    pub(crate) shared: Arc<RdmShared>,
    pub(crate) inline: Arc<dyn Progress>,
}

/// Opens an RDM endpoint: listens on the domain's address (or the one
/// given), builds the shared CQ and receive queue, and starts the drivers.
pub fn open(cfg: EpConfig, rt: Handle) -> Result<Arc<dyn ProviderEndpoint>> {
    let shared = open::open_shared(cfg, rt, false)?;
    let inline: Arc<dyn Progress> = Arc::new(cq_poller::InlinePoll::new(shared.poller.clone()));
    Ok(Arc::new(VerbsRdmEndpoint { shared, inline }))
}

impl ProviderEndpoint for VerbsRdmEndpoint {
    fn stats(&self) -> EpStats {
        let ep = &self.shared;
        let mut s = EpStats::default();
        s.conns = ep.conn_count.load(Ordering::Acquire);
        // A bound endpoint holds nothing of its own: its context does.
        if ep.srx.is_none() {
            s.unexpected_bytes = ep.side.unexp.load(Ordering::Acquire);
        }
        s.peers = lock(&ep.peers).len();
        let conns: Vec<Arc<Conn>> = lock(&ep.by_qp).values().cloned().collect();
        s.tclass = crate::qp_tclass(conns.iter().map(|c| &*c.qp));
        s.rx_key_rejected = ep.key_rejected.load(Ordering::Relaxed);
        s.tx_windowed = ep.tx_windowed.load(Ordering::Relaxed);
        s.rx_bad_ctx = self.bad_ctx_count();
        s
    }

    fn post_send(&self, req: SendReq) -> std::result::Result<(), Rejected<SendReq>> {
        self.shared.send(req)
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
        self.shared.rma(req)
    }

    fn post_recv(&self, req: RecvReq) -> std::result::Result<(), Rejected<RecvReq>> {
        self.shared.post_recv_checked(req)
    }

    fn give_back(&self, r: Returned) {
        self.shared.take_back(r, false);
    }

    fn give_back_after(&self, r: Returned) {
        self.shared.give_back_in_order(r);
    }

    fn cancel(&self, context: u64) -> bool {
        self.shared.cancel_recv(context)
    }

    fn tx_context(&self, index: usize, cfg: EpConfig) -> Result<Arc<dyn ProviderEndpoint>> {
        self.open_tx_context(index, &cfg)
    }

    fn rx_context(&self, index: usize, cfg: EpConfig) -> Result<Arc<dyn ProviderEndpoint>> {
        self.open_rx_context(index, cfg)
    }

    fn local_addr(&self) -> Vec<u8> {
        self.shared.local_raw.clone()
    }

    fn progress_hook(&self) -> Option<Arc<dyn Progress>> {
        Some(self.inline.clone())
    }

    fn tx_size_left(&self) -> usize {
        self.shared.tx.left()
    }

    fn rx_size_left(&self) -> usize {
        self.shared.side.rx.left()
    }

    fn close(&self) {
        let ep = &self.shared;
        if ep.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(c) = &ep.srx {
            c.forget(ep);
        }
        self.close_rxcs();
        let tasks = lock(&ep.tasks).take_all();
        for t in tasks {
            t.abort();
        }
        cq_poller::stop(&ep.poller);
        ep.cm.close();
        let conns: Vec<Arc<Conn>> = lock(&ep.by_qp).drain().map(|(_, c)| c).collect();
        for c in &conns {
            c.dead.store(true, Ordering::Release);
            let _ = c.id.disconnect();
            let _ = c.qp.to_error();
        }
        ep.keys.release();
        // Outstanding operations are discarded without completions; what
        // the device may still touch stays owned by the in-flight tables
        // until the endpoint (and its QPs) are gone. A context's receives
        // are not the endpoint's: those it was reading for end (`closing`).
        let waiting: Vec<Deferred> = {
            let mut peers = lock(&ep.peers);
            let w = match ep.srx {
                Some(_) => peers
                    .values_mut()
                    .flat_map(|p| p.pending.drain(..))
                    .collect(),
                None => Vec::new(),
            };
            peers.clear();
            w
        };
        match &ep.srx {
            // The context's receives and copied messages stay for the
            // other endpoints.
            Some(c) => {
                c.leave(ep);
                ep.end_context_reads(&conns, waiting);
            }
            None => {
                drop(lock(&ep.side.matcher).drain_posted());
                drop(lock(&ep.side.matcher).drain_unexpected());
            }
        }
    }
}

impl Drop for VerbsRdmEndpoint {
    fn drop(&mut self) {
        self.close();
    }
}
