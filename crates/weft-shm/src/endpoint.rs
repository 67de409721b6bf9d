//! The endpoint's shared state and the `ProviderEndpoint` operations.
//!
//! An endpoint owns one segment (its receive channels) and its doorbell,
//! both named after it; it maps the segments of the peers it sends to
//! (`tx`). See `docs/design.md`, "The shm provider".

use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio::io::unix::AsyncFd;
use tokio::runtime::Handle;
use tokio::sync::Notify;
use weft_core::addr::{FiAddr, FI_ADDR_NOTAVAIL};
use weft_core::av::shared::lock_synced;
use weft_core::av::AvTable;
use weft_core::completion::{Returned, WaitMode};
use weft_core::credits::Credits;
use weft_core::flags::Caps;
use weft_core::progress::{Progress, SpinHold};
use weft_core::provider::{
    EpConfig, EpStats, ProviderEndpoint, RecvReq, Rejected, RmaReq, SendReq,
};
use weft_core::recv_completion::RecvCtx;
use weft_core::soft_rx::{self, post_recv_keyed};
use weft_core::soft_srx::{RxSide, Sender, SoftSide, SoftSrx};
use weft_core::sync::{lock, FastMutex};
use weft_core::{Error, Result};

use crate::layout::*;
use crate::name;
use crate::rx::{Held, RxState};
use crate::segment::Segment;
use crate::tx::{Offered, Peers};

/// The receive side of one endpoint, or of the shared context it is
/// bound to: posted receives, and messages that arrived before a receive
/// took them (kept with their sender's address, so a sender inserted
/// into the AV later is still found).
pub type ShmSide = SoftSide<EpShared>;

/// The matcher of a receive side.
pub type ShmMatcher = weft_core::tagmatch::Matcher<RecvReq, Held, Sender<EpShared>>;

/// State shared by the endpoint handle and its drivers.
#[derive(Debug)]
pub struct EpShared {
    /// This endpoint, as the messages held for it name it.
    pub this: Weak<EpShared>,
    pub cfg: EpConfig,
    pub rt: Handle,
    pub name: String,
    /// `fi_shm://<name>`.
    pub addr: Vec<u8>,
    /// The endpoint's own segment: its receive channels.
    pub seg: Segment,
    pub g: Geometry,
    /// The doorbell, held open for reading so that peers can open it for
    /// writing (a FIFO without a reader refuses them).
    pub bell: File,
    /// The segment file with this process's shared lock on it, taken
    /// when the file was made (`create::create_segment`): how peers in
    /// other pid namespaces know it runs.
    pub held: File,
    /// The doorbell registered with the reactor (interrupt and inline
    /// modes; busy-poll has none).
    pub abell: Option<AsyncFd<File>>,
    /// This process (pid, start time).
    pub me: (u32, u64),
    /// This endpoint's serial in its process (`layout::H_SERIAL`).
    pub serial: u64,
    /// Which file our segment is (`held`'s): with `serial`, the owner a
    /// split offer of ours is vouched for as (`split::vouch`).
    pub seg_id: Option<crate::segment::FileId>,
    pub max_msg: usize,
    pub inject: usize,
    pub iov_limit: usize,
    /// The receive side: the endpoint's own, or its shared context's.
    pub side: Arc<ShmSide>,
    /// The shared receive context it is bound to.
    pub srx: Option<Arc<SoftSrx<EpShared>>>,
    /// What the receiver knows of each channel; one driver at a time.
    pub rx_state: FastMutex<RxState>,
    /// The peers sent to.
    pub peers: FastMutex<Peers>,
    /// Sends wait in some peer's queue.
    pub tx_pending: AtomicBool,
    /// Wakes the interrupt-mode driver (a queued send, a receive posted
    /// while a channel waits for one).
    pub kick: Notify,
    pub tx: Credits,
    /// A channel's next message waits for budget or a receive.
    pub parked: AtomicBool,
    /// Channels dropped for breaking the layout's rules.
    pub malformed: AtomicU64,
    /// Messages read from their sender's memory (CMA records), and RMA
    /// transfers moved directly (`rma::direct`): `EpStats::rx_direct`.
    pub direct: AtomicU64,
    /// Of those, messages whose sender wrote its part itself
    /// (`split`): `EpStats::rx_split`.
    pub split: AtomicU64,
    /// The endpoint's authorization keys: its own (`ep_attr.auth_key`,
    /// else the domain's) or its AV's (`FI_AV_AUTH_KEY`). Its channels
    /// take only senders that prove one, and it sends only to owners that
    /// prove the key back (`keyproof`).
    pub keys: crate::keys::EpKeys,
    /// Claims refused for their key, either way (`EpStats::rx_key_rejected`).
    pub key_rejected: AtomicU64,
    /// The domain's regions, which peers' RMA requests reach.
    pub regions: Option<Arc<crate::mr::Regions>>,
    /// The AV's version, read without its lock (a private AV; a named
    /// one's is read under the lock after its sync): [`av_version`](Self::av_version).
    pub av_version: Option<weft_core::av::AvVersion>,
    /// `FI_SOURCE_ERR`.
    pub source_err: bool,
    pub closed: AtomicBool,
    pub tasks: Mutex<Vec<tokio::task::AbortHandle>>,
    pub hold: SpinHold,
    pub inline_idle: Notify,
    /// When peers' and senders' liveness was last checked (`clock_ns`).
    pub last_sweep: AtomicU64,
    /// When a spinning waiter's pass last found work (`clock_ns`).
    pub last_work: AtomicU64,
    /// Passes of the inline waiter since it last slept, and the time its
    /// last clock read gave (`driver::InlineProgress`).
    pub spins: AtomicU32,
    pub spin_now: AtomicU64,
    /// Passes made (`driver::FULL_EVERY`), and the channels in use as the
    /// last pass left them (`driver::published`).
    pub passes: AtomicU32,
    pub live: AtomicU64,
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

/// The name an endpoint takes: the one its source address gives, else a
/// fresh one.
fn own_name(cfg: &EpConfig) -> Result<String> {
    match cfg.src_addr.as_deref().or(cfg.info.src_addr.as_deref()) {
        Some(a) => name::parse(a).map(str::to_owned),
        None => Ok(name::unique()),
    }
}

impl EpShared {
    /// This endpoint instance, as its claims name it (`C_PID`, `C_START`,
    /// `C_SERIAL`).
    pub fn instance(&self) -> crate::live::Instance {
        (self.me.0, self.me.1, self.serial)
    }

    /// Creates the segment and doorbell and builds the state. Must run
    /// inside the runtime (the reactor registration).
    pub fn open(cfg: EpConfig, rt: Handle) -> Result<Arc<EpShared>> {
        let info = &cfg.info;
        let name = own_name(&cfg)?;
        // Checked before anything is created (a bad key leaves nothing);
        // AV keys are held from here until the endpoint closes.
        let keys = crate::keys::EpKeys::for_endpoint(info, cfg.av.as_ref())?;
        // Before anything is created too: a failure after the header
        // would leave a file naming us, unheld, for our whole life.
        let srx = SoftSrx::of(&cfg.srx)?;
        let g = Geometry::OURS;
        let me = crate::live::me();
        let serial = crate::live::serial();
        let mut rx_state = RxState::new(g.channels);
        // The whole header but the version, written before the file
        // takes the name, locked since it was made
        // (`create::create_segment`): from the first instant under the
        // name, the file names us and a process in another pid
        // namespace sees us alive by the lock.
        let crate::create::Made { seg, held } = crate::create::create_segment(&name, g, |seg| {
            use Ordering::Release;
            seg.store32(H_CHANNELS, g.channels as u32, Release);
            seg.store32(H_RING, g.ring as u32, Release);
            seg.store32(H_PID, me.0, Release);
            seg.store64(H_START, me.1, Release);
            seg.store64(H_SERIAL, serial, Release);
            seg.store64(H_CMA_PROBE, crate::cma::probe_addr(), Release);
            if keys.keyed() {
                seg.store32(H_KEYED, 1, Release);
                rx_state.publish_nonces(seg, g);
            }
            seg.store64(H_MAGIC, MAGIC, Release);
        })?;
        let made = (|| {
            let bell = crate::bell::create(&name)?;
            let abell = if cfg.wait == WaitMode::BusyPoll {
                None
            } else {
                Some(crate::bell::register(&bell)?)
            };
            Ok::<_, Error>((bell, abell))
        })();
        let (bell, abell) = match made {
            Ok(b) => b,
            Err(e) => {
                // Only while the name is still our segment's: then the
                // doorbell under it is ours (or a stale one) too.
                if crate::live::is_under(&held, &crate::live::seg_path(&name)) {
                    crate::live::unlink_files(&name);
                }
                return Err(e);
            }
        };
        // Last, once the doorbell is there: peers take a segment without
        // it for one not there yet (`ring::header_geometry`,
        // `domain::present`), as they open the doorbell when they map
        // the segment.
        seg.store32(H_VERSION, VERSION, Ordering::Release);
        // Our rings checked against the mapping once: the receive pass
        // and its quiet look reach a channel's ring by an index test
        // (`Chan::area`; false, which our own geometry rules out, would
        // leave each ring checked at every use).
        let mut seg = seg;
        seg.set_rings(g.rings(), g.channels, g.ring);
        let max_msg = match info.ep_attr.max_msg_size {
            0 => crate::MAX_MSG_SIZE,
            m => m.min(crate::MAX_MSG_SIZE),
        };
        let inject = match info.tx_attr.inject_size {
            0 => crate::INJECT_SIZE,
            n => n,
        }
        .min(max_msg);
        let buffered_limit = match info.rx_attr.total_buffered_recv {
            0 => crate::BUFFERED_RECV,
            n => n,
        };
        let side = match &srx {
            Some(c) => c.side.clone(),
            None => RxSide::new(info.rx_attr.size, buffered_limit),
        };
        let iov_limit = info.tx_attr.iov_limit.clamp(1, crate::IOV_LIMIT);
        let tx = Credits::new(info.tx_attr.size);
        let source_err = info.caps.contains(Caps::SOURCE_ERR);
        let regions = cfg
            .domain
            .as_ref()
            .and_then(|d| d.as_any().downcast_ref::<crate::domain::ShmDomain>())
            .map(|d| d.regions.clone());
        let av_version = cfg.av.as_ref().and_then(|av| lock(av).version_watch());
        tracing::debug!(%name, keyed = keys.keyed(), wait = ?cfg.wait, "shm endpoint open");
        let ep = Arc::new_cyclic(|this| EpShared {
            this: this.clone(),
            rt,
            addr: name::addr(&name),
            name,
            seg,
            g,
            bell,
            seg_id: crate::segment::FileId::of_fd(&held).ok(),
            held,
            abell,
            me,
            serial,
            max_msg,
            inject,
            iov_limit,
            side,
            srx: srx.clone(),
            rx_state: FastMutex::new(rx_state),
            peers: FastMutex::new(Peers::default()),
            tx_pending: AtomicBool::new(false),
            kick: Notify::new(),
            tx,
            parked: AtomicBool::new(false),
            malformed: AtomicU64::new(0),
            direct: AtomicU64::new(0),
            split: AtomicU64::new(0),
            keys,
            key_rejected: AtomicU64::new(0),
            regions,
            av_version,
            source_err,
            closed: AtomicBool::new(false),
            tasks: Mutex::new(Vec::new()),
            hold: SpinHold::default(),
            inline_idle: Notify::new(),
            last_sweep: AtomicU64::new(weft_core::progress::clock_ns()),
            last_work: AtomicU64::new(0),
            spins: AtomicU32::new(0),
            spin_now: AtomicU64::new(0),
            passes: AtomicU32::new(0),
            live: AtomicU64::new(0),
            cfg,
        });
        if let Some(c) = &srx {
            c.join(Arc::downgrade(&ep));
        }
        Ok(ep)
    }

    /// The version of the AV `av` (the endpoint's), what a cached
    /// lookup is checked against
    /// ([`version_now`](weft_core::av::version_now)).
    #[inline(always)]
    pub fn av_version(&self, av: &Mutex<AvTable>) -> u64 {
        weft_core::av::version_now(&self.av_version, av)
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The AV handle of the sender `who` (`keys::ident`: an address, and
    /// on an `FI_AV_AUTH_KEY` endpoint the key its channel proved, under
    /// which it is looked up), `FI_ADDR_NOTAVAIL` if it is not in the AV.
    pub fn resolve_src(&self, who: &[u8]) -> FiAddr {
        let Some(av) = &self.cfg.av else {
            return FI_ADDR_NOTAVAIL;
        };
        let t = lock_synced(av);
        let found = if self.keys.av_mode() {
            let (addr, key) = crate::keys::split(who);
            t.find_keyed(addr, key)
        } else {
            t.find(who)
        };
        found.unwrap_or(FI_ADDR_NOTAVAIL)
    }

    /// The address of AV handle `dest` and the AV key handle to prove
    /// there: `NoAv` without an AV, `AddrNotAvail` for a handle not in
    /// it, `NoKey` for an entry under no key or a key the endpoint was
    /// not enabled with (`FI_AV_AUTH_KEY` endpoints holding keys).
    pub fn dest(&self, dest: FiAddr) -> Result<(crate::tx::Addr, Option<FiAddr>)> {
        let av = self.cfg.av.as_ref().ok_or(Error::NoAv)?;
        let (addr, key) = match lock_synced(av).lookup_keyed(dest) {
            Ok((b, k)) => (crate::tx::Addr::from_slice(crate::name::canonical(b)), k),
            Err(_) => return Err(Error::AddrNotAvail),
        };
        Ok((addr, self.keys.for_dest(key)?))
    }

    /// The checks a send and an RMA operation pass, in this order, before
    /// anything is queued: `MsgSize` past `max_msg_size` (or
    /// `inject_size` with `FI_INJECT`), `Inval` for more than `iov_limit`
    /// buffers, the destination's errors ([`dest`](Self::dest)), `Again`
    /// with the transmit queue full. On success one transmit credit is
    /// taken.
    #[inline]
    pub fn admit(
        &self,
        len: usize,
        inject: bool,
        nbufs: usize,
        dest: FiAddr,
    ) -> Result<(crate::tx::Addr, Option<FiAddr>)> {
        if len > self.max_msg || (inject && len > self.inject) {
            return Err(Error::MsgSize);
        }
        if nbufs > self.iov_limit {
            return Err(Error::Inval);
        }
        let d = self.dest(dest)?;
        if !self.tx.try_take() {
            return Err(Error::Again);
        }
        Ok(d)
    }

    fn recv(&self, req: RecvReq) -> std::result::Result<(), Rejected<RecvReq>> {
        let holds = |h: FiAddr| self.keys.holds(h);
        let r = post_recv_keyed(
            self,
            &self.side.matcher,
            req,
            self.iov_limit,
            self.keys
                .av_mode()
                .then_some(&holds as &dyn Fn(FiAddr) -> bool),
            &Sender::resolve,
            &|req, info, held| crate::rx::deliver_held(self, req, info, held),
        );
        self.unpark();
        // The success apart: kept and returned as a whole, the result (a
        // refused request's size) was copied on every receive.
        match r {
            Ok(()) => Ok(()),
            Err(r) => Err(r),
        }
    }

    /// A claim between this endpoint and the endpoint at `peer` failed
    /// for its key (on either side): counted, and reported on the bound
    /// EQ with the peer's address, as tcp reports its refusals.
    pub fn key_refused(&self, peer: &[u8]) {
        self.key_rejected.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            peer = %String::from_utf8_lossy(peer),
            "shm: authorization key refused"
        );
        self.cfg.eq_peer_error(Error::KeyRejected, peer.to_vec());
    }

    /// A channel waits for budget or for a receive: whoever drives the
    /// endpoint looks again.
    pub fn unpark(&self) {
        if self.parked.load(Ordering::Acquire) {
            self.kick.notify_one();
        }
    }
}

/// The `ProviderEndpoint` handle.
#[derive(Debug)]
pub struct ShmEndpoint {
    pub shared: Arc<EpShared>,
    /// Inline progress of this endpoint (queues hold it weakly).
    pub inline: Arc<dyn Progress>,
}

impl ProviderEndpoint for ShmEndpoint {
    fn stats(&self) -> EpStats {
        let ep = &self.shared;
        let mut s = EpStats::default();
        // A bound endpoint holds nothing of its own: its context
        // reports what it holds.
        if ep.srx.is_none() {
            s.unexpected_bytes = ep.side.unexp.load(Ordering::Acquire);
        }
        s.peers = lock(&ep.peers).len();
        s.conns = lock(&ep.rx_state).active();
        s.rx_malformed = ep.malformed.load(Ordering::Relaxed);
        s.rx_direct = ep.direct.load(Ordering::Relaxed);
        s.rx_split = ep.split.load(Ordering::Relaxed);
        s.rx_key_rejected = ep.key_rejected.load(Ordering::Relaxed);
        s
    }

    /// The send itself is here, not in a callee: the request is looked
    /// at by reference until its end (`tx/post.rs`), as moving it into a
    /// call copies all of it.
    fn post_send(&self, req: SendReq) -> std::result::Result<(), Rejected<SendReq>> {
        let ep = &*self.shared;
        let offered = if ep.is_closed() {
            Err(Error::OpBadState)
        } else {
            ep.offer(&req)
        };
        match offered {
            Ok(Offered::Sent(len)) => {
                crate::tx_drive::complete_ok(req.done, len);
                Ok(())
            }
            Ok(Offered::Queue(q)) => {
                ep.send_queued(req, q);
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
            ep.unpark();
            return Ok(());
        }
        ep.recv(req)
    }

    fn post_rma(&self, req: RmaReq) -> std::result::Result<(), Rejected<RmaReq>> {
        if self.shared.is_closed() {
            return Err(Rejected {
                err: Error::OpBadState,
                req,
            });
        }
        self.shared.rma(req)
    }

    fn atomic_valid(
        &self,
        kind: weft_core::atomic::AtomicKind,
        op: weft_core::atomic::AtomicOp,
        datatype: weft_core::atomic::Datatype,
    ) -> Result<usize> {
        crate::atomic::valid(self.shared.max_msg, kind, op, datatype)
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
        self.shared.addr.clone()
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
        // Peers sending here see the owner gone (pid 0) at their next
        // liveness check and fail what they still hold for us.
        ep.seg.store32(H_PID, 0, Ordering::Release);
        // The doorbell before the segment: once the segment is gone a
        // new endpoint may take the name and make its own doorbell,
        // which ours removed after would be. Each only if the file under
        // the name is still ours (same device and inode): had another
        // endpoint taken the name, its files are not ours to remove.
        // While our segment is under the name and we hold its lock,
        // nobody else removes it or makes a doorbell, so nothing changes
        // between the look and the unlink.
        if crate::live::is_under(&ep.held, &crate::live::seg_path(&ep.name)) {
            let bell = name::bell_path(&ep.name);
            if crate::live::is_under(&ep.bell, std::path::Path::new(bell.as_str())) {
                let _ = std::fs::remove_file(&bell);
            }
            Segment::unlink(&name::seg_name(&ep.name));
        }
        weft_core::soft_srx::close_side(&**ep, &ep.side, ep.srx.as_deref());
        let peers = std::mem::take(&mut *lock(&ep.peers));
        peers.release();
        let rx = std::mem::replace(&mut *lock(&ep.rx_state), RxState::new(0));
        crate::rx::abandon(ep, rx);
        // Removing the AV's keys is no longer `Busy` on our account.
        ep.keys.release();
        ep.tx_pending.store(false, Ordering::Release);
        ep.hold.waiter_idle();
        ep.kick.notify_one();
        tracing::debug!(name = %ep.name, "shm endpoint closed");
    }
}

impl Drop for ShmEndpoint {
    fn drop(&mut self) {
        self.close();
    }
}
