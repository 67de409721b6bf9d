//! The endpoint's shared state: matching, peers, credits, connections,
//! and the paths the operations take (the provider boundary itself is in
//! `boundary.rs`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::runtime::Handle;
use tokio::sync::Notify;
use weft_core::addr::{decode_sockaddr, sockaddr_bytes, FiAddr, FI_ADDR_NOTAVAIL};
use weft_core::attr::EpType;
use weft_core::av::shared::lock_synced;
use weft_core::completion::{CqErrEntry, Returned, WaitMode};
use weft_core::credits::Credits;
use weft_core::flags::OpFlags;
use weft_core::hash::{fast_map, FastMap};
use weft_core::limits::{ConnLimits, UNEXPECTED_OVERHEAD};
use weft_core::multi_recv;
use weft_core::provider::{EpConfig, Iov, RecvReq, Rejected, SendReq};
use weft_core::sync::lock;
use weft_core::tagmatch::{Matcher, MsgInfo, RecvSpec};
use weft_core::wire::claim::Nonce;
use weft_core::wire::{FrameKind, Header, FLAG_ACK_REQ, FLAG_CQ_DATA};
use weft_core::{Error, Result};

use crate::admission::Charge;
use crate::conn::Conn;
use crate::driver::ConnCache;
use crate::frame::TxFrame;
use crate::keys::{EpKeys, Source};
use crate::parked::Parked;
use crate::rx::{Arrival, Unexpected};

pub use crate::boundary::TcpEndpoint;

pub type TcpMatcher = Matcher<RecvReq, Arc<Unexpected>, Source>;

/// Per-peer state of an RDM endpoint.
#[derive(Debug, Default)]
pub struct PeerState {
    pub conn: Option<Arc<Conn>>,
    /// Frames waiting for the connection to exist.
    pub pending: Vec<TxFrame>,
    /// Our outbound connection attempt is in flight.
    pub connecting: bool,
    /// It has dialled (it waits first for a retired connection to end,
    /// and until then an inbound connection is taken, not refused).
    pub dialled: bool,
    /// An inbound connection was accepted and is being set up.
    pub accepting: bool,
    /// The AV key handle `pending` was queued under (`FI_AV_AUTH_KEY`).
    pub want: Option<FiAddr>,
    /// A connection this end retired while idle, read until the peer
    /// closes it. Frames the peer wrote on it before it saw `Shutdown`
    /// must be handled before anything it sends on a new connection, so a
    /// new one is not read until this one has ended (`connect.rs`).
    pub draining: Option<Arc<Conn>>,
}

impl PeerState {
    /// Nothing left that needs the entry.
    pub fn is_empty(&self) -> bool {
        self.conn.is_none()
            && self.pending.is_empty()
            && !self.connecting
            && !self.accepting
            && self.draining.is_none()
    }
}

/// State shared by the endpoint handle, its connections and its drivers.
#[derive(Debug)]
pub struct EpShared {
    /// Itself, for what is handed only `&self` but must charge the
    /// budget (a message given back by a dropped receive future).
    pub me: std::sync::Weak<EpShared>,
    pub cfg: EpConfig,
    pub ep_type: EpType,
    pub max_msg: usize,
    pub buffered_limit: usize,
    pub local: SocketAddr,
    pub rt: Handle,
    pub matcher: Mutex<TcpMatcher>,
    pub peers: Mutex<FastMap<SocketAddr, PeerState>>,
    /// MSG: the one connection.
    pub msg_conn: Mutex<Option<Arc<Conn>>>,
    /// `FI_EP_SOCK_STREAM`: the connection, until the application takes it.
    pub sock: crate::sock_stream::SockSlot,
    /// MSG: the connection is gone, so receives can no longer be filled.
    pub msg_dead: AtomicBool,
    /// Every live connection (the busy-poll thread walks these).
    pub conns: Mutex<Vec<Arc<Conn>>>,
    pub conns_gen: AtomicUsize,
    /// Transmit credits: the endpoint's own, or its shared transmit
    /// context's.
    pub tx: crate::stx::TxCredits,
    pub rx: Credits,
    /// What peers may make this endpoint hold.
    pub limits: ConnLimits,
    /// The domain's memory regions, which peers' RMA requests reach.
    pub regions: Option<Arc<crate::mr::Regions>>,
    /// `rma_events::WATCHED` when remote counters are bound (every
    /// access then carries a ticket), else 0.
    pub watch: u8,
    /// The DSCP value of `tx_attr.tclass`, marked on every connection.
    pub dscp: Option<u8>,
    /// One connection's share of `buffered_limit`.
    pub peer_cap: usize,
    /// Unexpected-message bytes buffered now (payload plus the fixed
    /// overhead of each message), against `buffered_limit`.
    pub unexp_charged: AtomicUsize,
    /// Connections waiting for a receive or for budget.
    pub parked: Parked,
    /// Connections open or handshaking (see `admission::ConnSlot`).
    pub conn_count: Arc<AtomicUsize>,
    /// Inline progress's view of the connections; the sweeper lets go of
    /// dead ones when nobody polls.
    pub inline_cache: Mutex<ConnCache>,
    pub closed: AtomicBool,
    /// Background tasks (listener, sweeper) to stop on close; each
    /// connection keeps its own drivers' handles.
    pub tasks: Mutex<Vec<tokio::task::AbortHandle>>,
    /// Busy-poll thread running.
    pub busy_running: AtomicBool,
    /// The inline ack timer is running (see `driver::ack_timer`).
    pub ack_timer: AtomicBool,
    /// Inline and busy-poll modes: whether a waiter is spinning on this
    /// endpoint, so the reactor readers (inline) or the busy-poll thread
    /// stand aside.
    pub hold: weft_core::progress::SpinHold,
    /// Inline mode: the spinning waiter went to sleep.
    pub inline_idle: Notify,
    /// Nonces of our `Hello`s still being answered, with the address each
    /// was sent to (`verify`).
    pub claims: Mutex<FastMap<Nonce, SocketAddr>>,
    /// Turns to verify a peer's claim.
    pub verify_turns: tokio::sync::Semaphore,
    /// The authorization keys peers must prove they hold (`keyproof`).
    pub keys: EpKeys,
    /// `FI_SOURCE_ERR` (RDM): a message from a sender not in the AV is
    /// an `AddrNotAvail` error entry carrying the sender's address.
    pub source_err: bool,
    /// TLS for every connection, when the domain runs it (`tls`).
    pub tls: Option<Arc<crate::tls::TlsContext>>,
    /// The shared receive context messages go to, when bound to one
    /// (`srx`): then `matcher`, `rx` and the budget fields serve only
    /// RMA read answers.
    pub srx: Option<crate::srx::SrxLink>,
    /// A scalable endpoint's contexts (`scalable.rs`); empty otherwise.
    pub ctxs: crate::scalable::Contexts,
}

/// An endpoint runs its domain's TLS (loaded when the domain opened,
/// from its attribute or the environment), or files of its own when its
/// attributes name others.
fn endpoint_tls(
    files: Option<&weft_core::tls::TlsFiles>,
    domain: Option<&crate::mr::TcpDomain>,
) -> Result<Option<Arc<crate::tls::TlsContext>>> {
    let Some(d) = domain else {
        return crate::tls::TlsContext::resolve(files);
    };
    match (files, &d.tls) {
        (None, t) => Ok(t.clone()),
        (Some(f), Some(t)) if t.files() == f => Ok(Some(t.clone())),
        (Some(f), _) => crate::tls::TlsContext::resolve(Some(f)),
    }
}

impl weft_core::recv_completion::RecvCtx for EpShared {
    fn rx_credits(&self) -> &Credits {
        match &self.srx {
            Some(l) => l.core.rx_credits(),
            None => &self.rx,
        }
    }

    fn reported_addr(&self, a: FiAddr) -> FiAddr {
        EpShared::reported_addr(self, a)
    }

    fn give_back(&self, r: Returned) {
        self.take_back(r, false);
    }

    fn give_back_after(&self, r: Returned) {
        self.take_back(r, true);
    }
}

impl EpShared {
    pub fn new(cfg: EpConfig, local: SocketAddr, rt: Handle) -> Result<Arc<EpShared>> {
        Self::with_contexts(cfg, local, rt, crate::scalable::Contexts::default())
    }

    /// [`new`](Self::new) for a scalable endpoint, with its contexts.
    pub fn with_contexts(
        cfg: EpConfig,
        local: SocketAddr,
        rt: Handle,
        ctxs: crate::scalable::Contexts,
    ) -> Result<Arc<EpShared>> {
        let info = &cfg.info;
        let dscp = weft_core::tclass::to_dscp(info.tx_attr.tclass)?;
        let keys = EpKeys::for_endpoint(info, cfg.av.as_ref())?;
        let source_err = info.ep_attr.ep_type == EpType::Rdm
            && info.caps.contains(weft_core::flags::Caps::SOURCE_ERR);
        let buffered_limit = info.rx_attr.total_buffered_recv.max(1);
        let ep_type = info.ep_attr.ep_type;
        let max_msg = info.ep_attr.max_msg_size;
        let (tx, rx) = (
            crate::stx::TxCredits::for_endpoint(&cfg)?,
            Credits::new(info.rx_attr.size),
        );
        let domain = cfg
            .domain
            .as_ref()
            .and_then(|d| d.as_any().downcast_ref::<crate::mr::TcpDomain>());
        let regions = domain.map(|d| d.regions.clone());
        let tls = endpoint_tls(info.domain_attr.tls.as_ref(), domain)?;
        let remote = &cfg.remote_cntrs;
        let watch = if remote.read.is_some() || remote.write.is_some() {
            crate::rma_events::WATCHED
        } else {
            0
        };
        let srx = crate::srx::SrxLink::core_of(&cfg)?;
        let ep = Arc::new_cyclic(|me| EpShared {
            srx: srx.map(|core| crate::srx::SrxLink::new(core, &cfg, me)),
            ctxs,
            me: me.clone(),
            regions,
            watch,
            ep_type,
            dscp,
            max_msg,
            buffered_limit,
            limits: cfg.limits,
            // A MSG endpoint has one peer, which may use the whole budget.
            peer_cap: if ep_type == EpType::Rdm {
                cfg.limits.peer_buffered.min(buffered_limit)
            } else {
                buffered_limit
            },
            unexp_charged: AtomicUsize::new(0),
            parked: Parked::default(),
            conn_count: Arc::new(AtomicUsize::new(0)),
            inline_cache: Mutex::new(ConnCache::new()),
            local,
            rt,
            matcher: Mutex::new(Matcher::new()),
            peers: Mutex::new(fast_map()),
            msg_conn: Mutex::new(None),
            sock: Default::default(),
            msg_dead: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
            conns_gen: AtomicUsize::new(0),
            tx,
            rx,
            closed: AtomicBool::new(false),
            tasks: Mutex::new(Vec::new()),
            busy_running: AtomicBool::new(false),
            ack_timer: AtomicBool::new(false),
            hold: weft_core::progress::SpinHold::default(),
            inline_idle: Notify::new(),
            claims: Mutex::new(fast_map()),
            verify_turns: tokio::sync::Semaphore::new(crate::verify::MAX_VERIFYING),
            keys,
            source_err,
            tls,
            cfg,
        });
        if let Some(l) = &ep.srx {
            l.core.join(&l.member);
        }
        Ok(ep)
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The AV handle of a peer identity (its address, under the key its
    /// connection proved), `FI_ADDR_NOTAVAIL` if not inserted.
    pub fn resolve_src(&self, src: &Source) -> FiAddr {
        match &self.cfg.av {
            Some(av) => lock_synced(av)
                .find_keyed(&sockaddr_bytes(&src.addr), src.key)
                .unwrap_or(FI_ADDR_NOTAVAIL),
            None => FI_ADDR_NOTAVAIL,
        }
    }

    /// [`resolve_src`](Self::resolve_src) for a connection's arrivals:
    /// `cache` keeps the answer until the AV changes.
    pub fn resolve_src_cached(&self, src: &Source, cache: &mut Option<(u64, FiAddr)>) -> FiAddr {
        let Some(av) = &self.cfg.av else {
            return FI_ADDR_NOTAVAIL;
        };
        let av = lock_synced(av);
        let v = av.version();
        if let Some((cv, a)) = *cache {
            if cv == v {
                return a;
            }
        }
        let a = av
            .find_keyed(&sockaddr_bytes(&src.addr), src.key)
            .unwrap_or(FI_ADDR_NOTAVAIL);
        *cache = Some((v, a));
        a
    }

    /// `FI_SOURCE_ERR`: for a message of `info` from `from`, a sender not
    /// in the AV, what its error entry reports as the source (the handle,
    /// or user id, of the key the sender proved; else `FI_ADDR_NOTAVAIL`)
    /// and the sender's address. `None`: report it as usual.
    pub fn unknown_sender(&self, info: &MsgInfo, from: &Source) -> Option<(FiAddr, Vec<u8>)> {
        if !self.source_err || info.src != FI_ADDR_NOTAVAIL {
            return None;
        }
        let reported = match (&self.cfg.av, from.key) {
            (Some(av), Some(k)) => {
                let t = lock(av);
                t.keys()
                    .reported(k, t.flags().contains(weft_core::flags::AvFlags::AV_USER_ID))
            }
            _ => FI_ADDR_NOTAVAIL,
        };
        Some((reported, sockaddr_bytes(&from.addr).to_vec()))
    }

    /// What completions report for a source handle (user ids).
    pub fn reported_addr(&self, a: FiAddr) -> FiAddr {
        match &self.cfg.av {
            Some(av) => lock_synced(av).reported_addr(a),
            None => a,
        }
    }

    /// Whether `charge` more bytes fit `conn`'s share of the budget.
    pub fn peer_fits(&self, conn: &Conn, charge: usize) -> bool {
        conn.charged.load(Ordering::Acquire).saturating_add(charge) <= self.peer_cap
    }

    pub(crate) fn fits(&self, conn: &Conn, charge: usize) -> bool {
        self.peer_fits(conn, charge)
            && self
                .unexp_charged
                .load(Ordering::Acquire)
                .saturating_add(charge)
                <= self.buffered_limit
    }

    /// Matches an arriving message. `None`: nothing matched and the
    /// message does not fit the budget (the endpoint's or this
    /// connection's share), so the reader parks until a receive that takes
    /// it is posted or enough budget comes back.
    pub fn arrival(self: &Arc<Self>, conn: &Arc<Conn>, info: MsgInfo) -> Option<Arrival> {
        if let Some(l) = &self.srx {
            return l.core.arrival(self, l, conn, info);
        }
        let mut ended = Vec::new();
        let out = self.arrival_locked(conn, info, &mut ended);
        // Multi-receive buffers the message did not fit are released once
        // the matcher's lock is let go.
        self.end_buffers(ended);
        out
    }

    fn arrival_locked(
        self: &Arc<Self>,
        conn: &Arc<Conn>,
        info: MsgInfo,
        ended: &mut Vec<RecvReq>,
    ) -> Option<Arrival> {
        let mut m = lock(&self.matcher);
        if let Some((_, req)) = m.match_arrival_by(&info, &mut multi_recv::take, ended) {
            return Some(Arrival::Posted(req));
        }
        // Every message costs something, a zero-length one included.
        let charge = UNEXPECTED_OVERHEAD.saturating_add(info.len);
        if !self.fits(conn, charge) {
            // Parked before the second look: budget released in between
            // either shows in that look or finds this connection parked.
            self.parked.park(conn, info);
            if !self.fits(conn, charge) {
                return None;
            }
            self.parked.unpark(conn);
        }
        let charge = Charge::new(self, &conn.charged, charge);
        let u = Unexpected::arriving(info.len, conn.source(), None, charge);
        m.push_unexpected(conn.source(), info, u.clone());
        Some(Arrival::Unexpected(u))
    }

    /// A message on `conn` named a receive context this endpoint does not
    /// have (or has not opened): it is counted
    /// ([`EpStats::rx_bad_ctx`](weft_core::provider::EpStats)) and reported
    /// on the EQ, and its bytes are skipped; the connection, which other
    /// contexts' messages share, carries on.
    /// No log line: this is per message, and a peer could make many; the
    /// EQ report is bounded.
    pub fn bad_ctx(&self, conn: &Conn) {
        self.ctxs.dropped.fetch_add(1, Ordering::Relaxed);
        self.cfg.eq_peer_error(
            Error::AddrNotAvail,
            sockaddr_bytes(&conn.source().addr).to_vec(),
        );
    }

    /// A message still arriving died with its connection: it leaves the
    /// unexpected queue (and gives back its budget) at once.
    pub fn drop_dead_unexpected(&self, u: &Arc<Unexpected>) {
        if let Some(l) = &self.srx {
            l.core.drop_dead(u);
            return;
        }
        let gone = lock(&self.matcher).remove_unexpected(|p| Arc::ptr_eq(p, u));
        drop(gone);
    }

    /// Registers a connection with the drivers.
    pub fn add_conn(self: &Arc<Self>, conn: &Arc<Conn>) {
        {
            let mut conns = lock(&self.conns);
            // Checked under the lock `close` drains: a handshake that ends
            // after the close must not leave a connection behind.
            if self.is_closed() {
                drop(conns);
                conn.abort();
                return;
            }
            conns.push(conn.clone());
        }
        self.conns_gen.fetch_add(1, Ordering::AcqRel);
        crate::driver::start(self, conn);
    }

    /// A connection died: forget it so the next send reconnects (RDM), or
    /// report it on the EQ (MSG).
    pub fn conn_failed(&self, conn: &Conn, err: Error) {
        {
            let mut conns = lock(&self.conns);
            conns.retain(|c| !std::ptr::eq(c.as_ref(), conn));
            let len = conns.len();
            if conns.capacity() > 64 && len * 4 < conns.capacity() {
                conns.shrink_to(len * 2);
            }
        }
        self.conns_gen.fetch_add(1, Ordering::AcqRel);
        if self.is_closed() {
            return;
        }
        match self.ep_type {
            EpType::Rdm => self.detach(conn),
            _ => {
                let is_ours = lock(&self.msg_conn)
                    .as_ref()
                    .is_some_and(|c| std::ptr::eq(c.as_ref(), conn));
                if is_ours {
                    self.msg_dead.store(true, Ordering::Release);
                    if err == Error::Shutdown {
                        self.flush_posted();
                        self.cfg.eq_shutdown();
                    } else {
                        // A critical error: the endpoint is disabled (its
                        // operations refused) before what was pending is
                        // flushed and the error reported.
                        self.cfg.fault.raise();
                        self.flush_posted();
                        self.cfg.eq_error(err, Vec::new());
                    }
                }
            }
        }
    }

    /// RDM: `conn` no longer carries sends to its peer; the peer's entry
    /// goes once nothing else is in it, so identities that came and went
    /// do not accumulate.
    pub fn detach(&self, conn: &Conn) {
        let mut peers = lock(&self.peers);
        if let Some(p) = peers.get_mut(&conn.peer_key) {
            let is =
                |c: &Option<Arc<Conn>>| c.as_ref().is_some_and(|c| std::ptr::eq(c.as_ref(), conn));
            if is(&p.conn) {
                p.conn = None;
            }
            if is(&p.draining) {
                p.draining = None;
            }
            if p.is_empty() {
                peers.remove(&conn.peer_key);
                shrink_map(&mut peers);
            }
        }
    }

    /// RDM: `conn` was retired while idle; it carries no more sends and
    /// is read until its peer closes it (see [`PeerState::draining`]).
    pub fn retire(&self, conn: &Arc<Conn>) {
        let mut peers = lock(&self.peers);
        let p = peers.entry(conn.peer_key).or_default();
        if p.conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            p.conn = None;
        }
        // One that died meanwhile was already detached: nothing to wait for.
        if !conn.is_dead() {
            p.draining = Some(conn.clone());
        } else if p.is_empty() {
            peers.remove(&conn.peer_key);
        }
    }

    /// Waits until no connection this end retired to `peer` is still
    /// being read (bounded: a retiring connection the peer does not close
    /// within the stall timeout is closed by the sweeper).
    pub async fn drained(&self, peer: SocketAddr) {
        let old = lock(&self.peers)
            .get(&peer)
            .and_then(|p| p.draining.clone());
        if let Some(old) = old {
            // Waited out one stall timeout at a time while bytes still
            // arrive: the peer may be finishing a large message on it.
            loop {
                let before = old.rx_total();
                old.ended(self.limits.stall_timeout).await;
                if old.is_dead() || old.rx_total() == before {
                    return;
                }
            }
        }
    }

    /// MSG after the connection died: every posted receive completes with
    /// `Canceled`, as a flushed queue pair's would. Messages that arrived
    /// before the end stay matchable.
    pub(crate) fn flush_posted(&self) {
        let posted = lock(&self.matcher).drain_posted();
        for (_, req) in posted {
            weft_core::recv_completion::cancel_recv(self, req);
        }
    }

    fn frame_for(req: &mut SendReq) -> (Header, Iov) {
        let mut h = Header::new(if req.tag.is_some() {
            FrameKind::Tagged
        } else {
            FrameKind::Msg
        });
        h.tag = req.tag.unwrap_or(0);
        h.len = req.len() as u64;
        if let Some(d) = req.data {
            h.flags |= FLAG_CQ_DATA;
            h.data = d;
        }
        if req.flags.contains(OpFlags::DELIVERY_COMPLETE) {
            h.flags |= FLAG_ACK_REQ;
        }
        (h, std::mem::take(&mut req.iov))
    }

    pub(crate) fn send(
        self: &Arc<Self>,
        req: SendReq,
    ) -> std::result::Result<(), Rejected<SendReq>> {
        self.send_from(req, None)
    }

    /// [`send`](Self::send) taking its room from `queue` (a scalable
    /// endpoint's transmit context) instead of the endpoint's.
    pub(crate) fn send_from(
        self: &Arc<Self>,
        mut req: SendReq,
        queue: Option<&Arc<Credits>>,
    ) -> std::result::Result<(), Rejected<SendReq>> {
        if req.len() > self.max_msg {
            return Err(Rejected {
                err: Error::MsgSize,
                req,
            });
        }
        let route = match self.route(req.dest) {
            Ok(r) => r,
            Err(err) => return Err(Rejected { err, req }),
        };
        if !self.take_room(queue) {
            return Err(Rejected {
                err: Error::Again,
                req,
            });
        }
        let (mut h, payload) = Self::frame_for(&mut req);
        h.rx_ctx = route.rx_ctx();
        let mut frame = TxFrame::new(h, payload, Some(req.done));
        frame.charge_to(queue);
        self.dispatch(route, frame);
        Ok(())
    }

    /// Takes a transmit credit of `queue` (a scalable endpoint's transmit
    /// context) or, without one, of the endpoint's own queue; `false`
    /// when that queue is full.
    pub(crate) fn take_room(&self, queue: Option<&Arc<Credits>>) -> bool {
        match queue {
            Some(q) => q.try_take(),
            None => self.tx.try_take(),
        }
    }

    /// Where a frame for `dest` goes: a peer (RDM, connected lazily) or
    /// the connection.
    pub(crate) fn route(&self, dest: FiAddr) -> Result<Route> {
        if self.ep_type == EpType::Rdm {
            self.dest_source(dest).map(|(s, rx)| Route::Peer(s, rx))
        } else {
            lock(&self.msg_conn)
                .clone()
                .filter(|c| !c.is_dead())
                .map(Route::Conn)
                .ok_or(Error::NotConn)
        }
    }

    pub(crate) fn dispatch(self: &Arc<Self>, route: Route, frame: TxFrame) {
        match route {
            Route::Peer(dest, _) => crate::connect::rdm_send(self, dest, frame),
            Route::Conn(conn) => conn.send(frame),
        }
    }

    /// The peer an RDM handle names: its address and the key it was
    /// inserted under, and the receive context its `fi_rx_addr` bits name
    /// (`MAX_CTX` and above are `Inval`: no peer has them). A key this
    /// endpoint cannot prove is `NoKey`.
    fn dest_source(&self, dest: FiAddr) -> Result<(Source, u16)> {
        let av = self.cfg.av.as_ref().ok_or(Error::NoAv)?;
        // `lookup` ignores the receive-context bits of the handle.
        let t = lock_synced(av);
        let (_, rx) = weft_core::av::split_rx_addr(dest, t.rx_ctx_bits());
        let (bytes, key) = t.lookup_keyed(dest).map_err(|_| Error::AddrNotAvail)?;
        let addr = decode_sockaddr(bytes).map_err(|_| Error::AddrNotAvail)?;
        drop(t);
        let rx = u16::try_from(rx)
            .ok()
            .filter(|&r| usize::from(r) < crate::scalable::MAX_CTX)
            .ok_or(Error::Inval)?;
        self.keys.check_dest(key)?;
        Ok((Source { addr, key }, rx))
    }

    pub(crate) fn recv(
        self: &Arc<Self>,
        req: RecvReq,
    ) -> std::result::Result<(), Rejected<RecvReq>> {
        if req.flags.contains(OpFlags::AUTH_KEY) && !self.keys.holds(req.src) {
            // A key the endpoint was not enabled with: no sender can have
            // proven it here.
            return Err(Rejected {
                err: Error::Inval,
                req,
            });
        }
        let spec = spec_of(&req);
        let resolve = |s: &Source| self.resolve_src(s);
        if req.flags.contains(OpFlags::PEEK) {
            let r = lock(&self.matcher).peek(&spec, req.flags, &resolve);
            match r {
                Ok(info) => crate::rx::complete_peek(self, req, info),
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
            let r = lock(&self.matcher).claim(spec.context, discard);
            match r {
                Ok((info, Some(u))) => {
                    // The claimed message is delivered through the normal
                    // path, which gives back one receive credit.
                    self.rx.take();
                    self.take_unexpected(req, info, u);
                }
                Ok((info, None)) => crate::rx::complete_peek(self, req, info),
                Err(e) => req.done.fail(CqErrEntry::new(0, OpFlags::RECV, e)),
            }
            return Ok(());
        }
        if !self.rx.try_take() {
            return Err(Rejected {
                err: Error::Again,
                req,
            });
        }
        self.repost(req);
        Ok(())
    }

    /// Matches a receive that already holds its credit.
    fn repost(&self, req: RecvReq) {
        self.place(req, false);
    }

    /// A receive whose message died mid-way (its sender's connection
    /// ended or stalled): it is not failed, it goes back to the head of
    /// the posted receives for the next message it accepts.
    pub fn repost_front(&self, req: RecvReq) {
        self.place(req, true);
    }
}

/// Gives back the room a burst of peers left in `m`: a map keeps its
/// capacity after removals, so a thousand peers that came and went would
/// cost their entries' space for good.
pub fn shrink_map<K: std::hash::Hash + Eq, V>(m: &mut FastMap<K, V>) {
    let len = m.len();
    if m.capacity() > 64 && len * 4 < m.capacity() {
        m.shrink_to(len * 2);
    }
}

/// Where a send goes.
pub(crate) enum Route {
    /// An RDM peer, connected on first use, and the receive context of
    /// it the handle names (`fi_rx_addr`; 0 without).
    Peer(Source, u16),
    /// A MSG endpoint's connection.
    Conn(Arc<Conn>),
}

impl Route {
    /// The receive context a message on this route names.
    pub(crate) fn rx_ctx(&self) -> u16 {
        match self {
            Route::Peer(_, rx) => *rx,
            Route::Conn(_) => 0,
        }
    }
}

/// The matching criteria of a receive.
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

/// The passive wait mode a driver uses.
pub fn busy(ep: &EpShared) -> bool {
    ep.cfg.wait == WaitMode::BusyPoll
}
