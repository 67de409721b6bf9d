//! The endpoint's shared state and the `ProviderEndpoint` operations.
//!
//! One UDP socket per endpoint, bound to the endpoint's address: every
//! datagram it sends leaves from that address, so the source of a
//! datagram is the sender's endpoint address, which is what the receiver's
//! AV holds (`FI_SOURCE`, directed receives).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use socket2::{Domain, Socket, Type};
use tokio::runtime::Handle;
use tokio::sync::Notify;
use weft_core::addr::{decode_sockaddr, encode_sockaddr, sockaddr_bytes, FiAddr, FI_ADDR_NOTAVAIL};
use weft_core::attr::AddrFormat;
use weft_core::av::shared::lock_synced;
use weft_core::av::AvTable;
use weft_core::completion::Returned;
use weft_core::credits::Credits;
use weft_core::dgram_auth::{addr_bytes, first_seq, AddrBytes};
use weft_core::flags::Caps;
use weft_core::progress::{Progress, SpinHold};
use weft_core::provider::{EpConfig, EpStats, ProviderEndpoint, RecvReq, Rejected, SendReq};
use weft_core::recv_completion::RecvCtx;
use weft_core::soft_rx;
use weft_core::soft_srx::{RxSide, Sender, SoftSide, SoftSrx};
use weft_core::sync::{lock, FastMutex};
use weft_core::{Error, Result};

use crate::keys::EpKeys;
use crate::rx::RxState;
use crate::tx::{Offered, TxQueue};

/// A datagram's sender as matching and AV lookups know it: its address
/// and, on an `FI_AV_AUTH_KEY` endpoint, the handle of the key its
/// datagram proved (the same address under another key is another peer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub addr: SocketAddr,
    pub key: Option<FiAddr>,
}

/// The receive side of one endpoint, or of the shared context it is
/// bound to: posted receives, and datagrams that arrived before a
/// receive took them (kept with the address they came from, so a sender
/// inserted into the AV later is still found).
pub type UdpSide = SoftSide<EpShared>;

/// Socket buffers asked for (the kernel caps them at `rmem_max` and
/// `wmem_max`): a burst of datagrams waits in the kernel while the
/// endpoint's drivers are busy, instead of being dropped there.
const SOCKET_BUFFER: usize = 4 << 20;

/// State shared by the endpoint handle and its drivers.
#[derive(Debug)]
pub struct EpShared {
    /// This endpoint, as the datagrams held for it name it.
    pub this: Weak<EpShared>,
    pub cfg: EpConfig,
    pub rt: Handle,
    /// The socket, non-blocking; every driver reads and writes through
    /// it directly.
    pub sock: std::net::UdpSocket,
    /// The same socket registered with the reactor, for the reader task
    /// (interrupt and inline modes; busy-poll has none). An inline waiter
    /// takes it out while it spins (`driver.rs`).
    pub reg: Mutex<Option<tokio::net::UdpSocket>>,
    /// `reg` holds a registration: a spinning waiter tests this, not the
    /// lock.
    pub registered: AtomicBool,
    pub local: SocketAddr,
    /// The largest message one datagram carries from here.
    pub max_msg: usize,
    /// `FI_EP_SOCK_DGRAM`: datagrams are the payload alone, without
    /// Weft's header (no tag, no CQ data), as a UDP socket's are.
    pub raw: bool,
    pub inject: usize,
    pub iov_limit: usize,
    /// The receive side: the endpoint's own, or its shared context's.
    pub side: Arc<UdpSide>,
    /// The shared receive context it is bound to.
    pub srx: Option<Arc<SoftSrx<EpShared>>>,
    /// The receive staging buffer: one driver reads at a time.
    /// Per-message locks: [`FastMutex`], without poisoning.
    pub rx_state: FastMutex<RxState>,
    pub txq: FastMutex<TxQueue>,
    /// Datagrams wait in `txq` (the socket was full).
    pub tx_pending: AtomicBool,
    /// Wakes the writer task.
    pub tx_kick: Notify,
    pub tx: Credits,
    pub dropped: AtomicU64,
    pub malformed: AtomicU64,
    /// The endpoint's authorization keys: every datagram sent carries a
    /// proof of one, every one received must (`keys.rs`).
    pub keys: EpKeys,
    /// The next sequence number a keyed datagram carries.
    pub seq: AtomicU64,
    /// This endpoint's address as its datagram MACs cover it.
    pub src_bytes: AddrBytes,
    /// Datagrams that did not prove the key (`EpStats::rx_key_rejected`).
    pub key_rejected: AtomicU64,
    /// Datagrams whose proof was a replay (`EpStats::rx_replayed`).
    pub replayed: AtomicU64,
    /// `FI_SOURCE_ERR`: a datagram from a sender not in the AV completes
    /// as an `AddrNotAvail` error carrying the sender's address.
    pub source_err: bool,
    /// The AV's version, read without its lock (a private AV; a named
    /// one's is read under the lock after its sync): [`av_version`](Self::av_version).
    pub av_version: Option<weft_core::av::AvVersion>,
    pub closed: AtomicBool,
    pub tasks: Mutex<Vec<tokio::task::AbortHandle>>,
    /// Joined multicast groups (`multicast.rs`).
    pub groups: crate::multicast::Groups,
    /// A waiter drives the endpoint itself (inline and busy-poll modes):
    /// the busy-poll thread parks, the reactor's reader stands aside.
    pub hold: SpinHold,
    /// Inline passes since the waiter last read the clock for the hold
    /// (`driver::InlineProgress`).
    pub spins: std::sync::atomic::AtomicU32,
    /// Inline mode: the spinning waiter went to sleep.
    pub inline_idle: Notify,
}

impl RecvCtx for EpShared {
    fn rx_credits(&self) -> &Credits {
        &self.side.rx
    }

    fn reported_addr(&self, a: FiAddr) -> FiAddr {
        match &self.cfg.av {
            Some(av) => lock_synced(av).reported_addr(a),
            None => a,
        }
    }

    fn give_back(&self, r: Returned) {
        self.take_back(r, false);
    }

    fn give_back_after(&self, r: Returned) {
        self.take_back(r, true);
    }
}

/// The address an endpoint binds: the one it was given (`src_addr`,
/// which an offer sets to its interface's address), else loopback.
fn bind_addr(cfg: &EpConfig) -> Result<SocketAddr> {
    match cfg.src_addr.as_deref().or(cfg.info.src_addr.as_deref()) {
        Some(b) => decode_sockaddr(b),
        None if cfg.info.addr_format == AddrFormat::SockaddrIn6 => {
            Ok(SocketAddr::from((Ipv6Addr::LOCALHOST, 0)))
        }
        None => Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))),
    }
}

/// A non-blocking UDP socket bound to `addr`, its packets marked with
/// `dscp`.
fn open_socket(addr: SocketAddr, dscp: Option<u8>) -> Result<std::net::UdpSocket> {
    let domain = if addr.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let s = Socket::new(domain, Type::DGRAM, Some(socket2::Protocol::UDP))?;
    if addr.is_ipv6() {
        // An IPv6 endpoint talks IPv6 only: IPv4-mapped sources would
        // match no AV entry.
        s.set_only_v6(true)?;
    }
    // Best effort: the kernel caps both, and a smaller buffer only means
    // the kernel drops sooner under a burst.
    let _ = s.set_recv_buffer_size(SOCKET_BUFFER);
    let _ = s.set_send_buffer_size(SOCKET_BUFFER);
    if let Some(d) = dscp {
        let v = u32::from(d) << 2;
        if addr.is_ipv4() {
            s.set_tos_v4(v)?;
        } else {
            s.set_tclass_v6(v)?;
        }
    }
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    Ok(s.into())
}

impl EpShared {
    /// Binds the socket and builds the state. Must run inside the
    /// runtime (the reactor registration).
    pub fn open(cfg: EpConfig, rt: Handle) -> Result<Arc<EpShared>> {
        let info = &cfg.info;
        let dscp = weft_core::tclass::to_dscp(info.tx_attr.tclass)?;
        let sock = open_socket(bind_addr(&cfg)?, dscp)?;
        let local = sock.local_addr()?;
        let raw = info.ep_attr.ep_type == weft_core::attr::EpType::SockDgram;
        let keys = EpKeys::for_endpoint(&cfg, raw)?;
        if keys.keyed() && local.ip().is_unspecified() {
            // A datagram's MAC names the address it is sent to, which a
            // wildcard socket does not know.
            return Err(Error::Inval);
        }
        // Without a header, a datagram carries that much more payload;
        // with a key, the trailer's bytes less.
        let path = (crate::ifaces::max_msg_at(local.ip())
            + if raw { crate::wire::HEADER_LEN } else { 0 })
        .saturating_sub(keys.trailer_len());
        let max_msg = match info.ep_attr.max_msg_size {
            0 => path,
            m => m.min(path),
        };
        let inject = match info.tx_attr.inject_size {
            0 => crate::INJECT_SIZE,
            n => n,
        }
        .min(max_msg);
        let source_err = info.caps.contains(Caps::SOURCE_ERR);
        let buffered_limit = match info.rx_attr.total_buffered_recv {
            0 => crate::BUFFERED_RECV,
            n => n,
        };
        let srx = SoftSrx::of(&cfg.srx)?;
        let side = match &srx {
            Some(c) => c.side.clone(),
            None => RxSide::new(info.rx_attr.size, buffered_limit),
        };
        tracing::debug!(%local, max_msg, keyed = keys.keyed(), wait = ?cfg.wait, "udp endpoint open");
        let iov_limit = info.tx_attr.iov_limit.clamp(1, crate::IOV_LIMIT);
        let tx = Credits::new(info.tx_attr.size);
        let av_version = cfg.av.as_ref().and_then(|av| lock(av).version_watch());
        let ep = Arc::new_cyclic(|this| EpShared {
            this: this.clone(),
            rt,
            sock,
            reg: Mutex::new(None),
            registered: AtomicBool::new(false),
            local,
            max_msg,
            raw,
            inject,
            iov_limit,
            side,
            srx: srx.clone(),
            rx_state: FastMutex::new(RxState::new()),
            txq: FastMutex::new(TxQueue::default()),
            tx_pending: AtomicBool::new(false),
            tx_kick: Notify::new(),
            tx,
            dropped: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
            keys,
            seq: AtomicU64::new(first_seq()),
            src_bytes: addr_bytes(&local),
            key_rejected: AtomicU64::new(0),
            replayed: AtomicU64::new(0),
            source_err,
            av_version,
            closed: AtomicBool::new(false),
            tasks: Mutex::new(Vec::new()),
            groups: Default::default(),
            hold: SpinHold::default(),
            spins: std::sync::atomic::AtomicU32::new(0),
            inline_idle: Notify::new(),
            cfg,
        });
        if let Some(c) = &srx {
            c.join(Arc::downgrade(&ep));
        }
        Ok(ep)
    }

    /// The version of the AV `av` (the endpoint's), what a cached
    /// destination or sender is checked against
    /// ([`version_now`](weft_core::av::version_now)).
    #[inline(always)]
    pub fn av_version(&self, av: &Mutex<AvTable>) -> u64 {
        weft_core::av::version_now(&self.av_version, av)
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The AV handle of the endpoint at `p.addr` (under the key `p.key`
    /// proved), `FI_ADDR_NOTAVAIL` if it is not in the AV.
    pub fn resolve_src(&self, p: &Peer) -> FiAddr {
        match &self.cfg.av {
            Some(av) => lock_synced(av)
                .find_keyed(&sockaddr_bytes(&p.addr), p.key)
                .unwrap_or(FI_ADDR_NOTAVAIL),
            None => FI_ADDR_NOTAVAIL,
        }
    }

    /// Where AV handle `dest` sends to, and the key handle its entry was
    /// inserted under.
    pub fn dest_addr(&self, dest: FiAddr) -> Result<(SocketAddr, Option<FiAddr>)> {
        if dest & crate::multicast::MC_BIT != 0 && dest != FI_ADDR_NOTAVAIL {
            return self.groups.dest(dest).map(|a| (a, None));
        }
        let av = self.cfg.av.as_ref().ok_or(Error::NoAv)?;
        let t = lock_synced(av);
        let (bytes, key) = t.lookup_keyed(dest).map_err(|_| Error::AddrNotAvail)?;
        let addr = decode_sockaddr(bytes).map_err(|_| Error::AddrNotAvail)?;
        Ok((addr, key))
    }

    /// `FI_SOURCE_ERR`: for a datagram whose sender is not in the AV,
    /// what its error entry reports as the source (the handle, or user
    /// id, of the key the datagram proved; else `FI_ADDR_NOTAVAIL`) and
    /// the sender's address. `None`: complete it as usual.
    pub fn unknown_sender(&self, src: FiAddr, from: &Peer) -> Option<(FiAddr, Vec<u8>)> {
        if !self.source_err || src != FI_ADDR_NOTAVAIL {
            return None;
        }
        let reported = match (&self.cfg.av, from.key) {
            (Some(av), Some(k)) => {
                let t = lock_synced(av);
                let user_ids = t.flags().contains(weft_core::flags::AvFlags::AV_USER_ID);
                t.keys().reported(k, user_ids)
            }
            _ => FI_ADDR_NOTAVAIL,
        };
        Some((reported, encode_sockaddr(&from.addr)))
    }

    pub(crate) fn recv(&self, req: RecvReq) -> std::result::Result<(), Rejected<RecvReq>> {
        // Keyed receives only where keys live in the AV (no sender can
        // have proven a key not held here); never on a shared context,
        // whose receives are not this endpoint's.
        let keyed = self.keys.av_mode() && self.srx.is_none();
        let holds = |k| self.keys.holds(k);
        weft_core::soft_rx::post_recv_keyed(
            self,
            &self.side.matcher,
            req,
            self.iov_limit,
            keyed.then_some(&holds as &dyn Fn(FiAddr) -> bool),
            &Sender::resolve,
            &|req, info, held| crate::rx::deliver_held(self, req, info, held),
        )
    }
}

/// The `ProviderEndpoint` handle.
#[derive(Debug)]
pub struct UdpEndpoint {
    pub shared: Arc<EpShared>,
    /// Inline progress of this endpoint (queues hold it weakly).
    pub inline: Arc<dyn Progress>,
}

impl ProviderEndpoint for UdpEndpoint {
    fn join(&self, group: Vec<u8>) -> futures::future::BoxFuture<'static, Result<FiAddr>> {
        let r = decode_sockaddr(&group)
            .map_err(|_| Error::Inval)
            .and_then(|g| self.shared.join(g));
        Box::pin(async move { r })
    }

    fn leave(&self, mc: FiAddr) -> Result<()> {
        self.shared.leave(mc)
    }

    fn stats(&self) -> EpStats {
        let ep = &self.shared;
        let mut s = EpStats::default();
        // A bound endpoint holds nothing of its own: its context
        // reports what it holds.
        if ep.srx.is_none() {
            s.unexpected_bytes = ep.side.unexp.load(Ordering::Acquire);
        }
        s.rx_dropped = ep.dropped.load(Ordering::Relaxed);
        s.rx_malformed = ep.malformed.load(Ordering::Relaxed);
        s.rx_key_rejected = ep.key_rejected.load(Ordering::Relaxed);
        s.rx_replayed = ep.replayed.load(Ordering::Relaxed);
        let sock = socket2::SockRef::from(&ep.sock);
        let tos = if ep.local.is_ipv4() {
            sock.tos_v4()
        } else {
            sock.tclass_v6()
        };
        s.tclass = tos.ok().and_then(|t| u8::try_from(t).ok());
        s
    }

    /// The send itself is here, not in a callee: the request is looked
    /// at by reference until its end (`tx.rs`), as moving it into a call
    /// copies all of it.
    fn post_send(&self, req: SendReq) -> std::result::Result<(), Rejected<SendReq>> {
        let ep = &*self.shared;
        match ep.offer(&req) {
            Ok(Offered::Sent(len, r)) => {
                crate::tx::finish(ep, req.done, len, r);
                Ok(())
            }
            Ok(Offered::Wait(q, w)) => {
                w.enqueue(ep, q, req.iov, req.done);
                Ok(())
            }
            Err(err) => Err(Rejected { err, req }),
        }
    }

    /// The usual receive is queued here, where the request lies, once
    /// the matcher is locked: see `soft_rx::lock_plain`.
    fn post_recv(&self, req: RecvReq) -> std::result::Result<(), Rejected<RecvReq>> {
        let ep = &*self.shared;
        if ep.is_closed() {
            return Err(Rejected {
                err: Error::OpBadState,
                req,
            });
        }
        if let Some(m) = soft_rx::lock_plain(ep, &ep.side.matcher, &req, ep.iov_limit) {
            soft_rx::post_locked(m, req, &Sender::resolve, &|req, info, held| {
                crate::rx::deliver_held(ep, req, info, held)
            });
            return Ok(());
        }
        ep.recv(req)
    }

    fn cancel(&self, context: u64) -> bool {
        soft_rx::cancel(&*self.shared, &self.shared.side.matcher, context)
    }

    fn give_back(&self, r: Returned) {
        self.shared.take_back(r, false);
    }

    fn give_back_after(&self, r: Returned) {
        self.shared.take_back(r, true);
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
        self.shared.side.rx.left()
    }

    fn close(&self) {
        let ep = &self.shared;
        if ep.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        for t in lock(&ep.tasks).drain(..) {
            t.abort();
        }
        ep.registered.store(false, Ordering::Release);
        let reg = lock(&ep.reg).take();
        drop(reg);
        ep.groups.leave_all();
        weft_core::soft_srx::close_side(&**ep, &ep.side, ep.srx.as_deref());
        let queued = std::mem::take(&mut *lock(&ep.txq));
        drop(queued);
        ep.tx_pending.store(false, Ordering::Release);
        // A parked busy-poll thread sees the close now.
        ep.hold.waiter_idle();
        ep.tx_kick.notify_one();
        ep.keys.release();
        tracing::debug!(local = %ep.local, "udp endpoint closed");
    }
}

impl Drop for UdpEndpoint {
    fn drop(&mut self) {
        self.close();
    }
}
