//! Shared receive contexts (`fi_srx_context`) on RDM and MSG endpoints.
//!
//! A context is one receive side that several endpoints feed: one
//! matcher (posted receives and unexpected messages, tagged and
//! untagged, with `weft_core`'s rules, so peek/claim/discard, directed
//! receives and cancel behave as on a lone endpoint), one set of receive
//! credits (`rx_attr.size`), and one unexpected-message budget
//! (`rx_attr.total_buffered_recv`) with one list of connections parked on
//! it. Every connection of every bound endpoint is charged against that
//! one budget, and each connection against its own share of it (the
//! endpoint's `FI_TCP_MAX_PEER_BUFFERED`): binding more endpoints, or
//! more peers connecting, adds no buffering.
//!
//! A multi-receive buffer (`FI_MULTI_RECV`) is one posted receive of
//! that matcher, so it packs the messages of every bound endpoint; the
//! readers of several endpoints fill their disjoint parts of it at once.
//!
//! A message matched at an endpoint reports on that endpoint's receive CQ
//! and counter (fi_endpoint(3): a context has none of its own): the
//! receive is given the endpoint's queues when it matches
//! ([`SrxMember::report_to`]), and a buffered message keeps the queues of
//! the endpoint it arrived at. What ends without a message (a failed
//! peek, a cancel, a multi-receive buffer's release without a message)
//! reports on the first bound endpoint's queues.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use weft_core::addr::{FiAddr, FI_ADDR_NOTAVAIL};
use weft_core::attr::RxAttr;
use weft_core::completion::{CqErrEntry, CqShared, Returned};
use weft_core::counter::CounterShared;
use weft_core::credits::Credits;
use weft_core::flags::OpFlags;
use weft_core::limits::UNEXPECTED_OVERHEAD;
use weft_core::multi_recv;
use weft_core::provider::{EpStats, ProviderSrx, RecvReq, Rejected};
use weft_core::recv_completion::{cancel_recv, complete_peek, fail_recv, RecvCtx};
use weft_core::sync::lock;
use weft_core::tagmatch::{Matcher, MsgInfo};
use weft_core::{Error, Result};

use crate::admission::Charge;
use crate::conn::Conn;
use crate::endpoint::{spec_of, EpShared};
use crate::keys::Source;
use crate::parked::Parked;
use crate::rx::{Arrival, Unexpected};

/// A buffered message's sender, and the endpoint it arrived at (whose AV
/// resolves a sender unknown at arrival).
#[derive(Debug)]
pub struct SrxKey {
    src: Source,
    ep: Weak<EpShared>,
}

impl SrxKey {
    fn resolve(&self) -> FiAddr {
        self.ep
            .upgrade()
            .map_or(FI_ADDR_NOTAVAIL, |e| e.resolve_src(&self.src))
    }
}

type SrxMatcher = Matcher<RecvReq, Arc<Unexpected>, SrxKey>;

/// A bound endpoint as its context knows it: where its messages report.
#[derive(Debug)]
pub struct SrxMember {
    pub ep: Weak<EpShared>,
    cq: Option<Arc<CqShared>>,
    cntr: Option<Arc<CounterShared>>,
}

impl SrxMember {
    /// Points `req`'s completion at this endpoint's receive queues.
    fn report_to(&self, req: &mut RecvReq) {
        req.done.cq.clone_from(&self.cq);
        req.done.cntr.clone_from(&self.cntr);
    }
}

/// An endpoint's binding to its context.
#[derive(Debug)]
pub struct SrxLink {
    pub core: Arc<SrxCore>,
    pub member: Arc<SrxMember>,
    /// One connection's share of the context's budget.
    pub peer_cap: usize,
}

impl SrxLink {
    /// The context of `cfg.srx`, if any: `Inval` for another provider's.
    pub fn core_of(cfg: &weft_core::provider::EpConfig) -> Result<Option<Arc<SrxCore>>> {
        match &cfg.srx {
            None => Ok(None),
            Some(s) => s
                .as_any()
                .downcast_ref::<TcpSrx>()
                .map(|t| Some(t.core.clone()))
                .ok_or(Error::Inval),
        }
    }

    /// Binds endpoint `me`, being built from `cfg`, to `core`.
    pub fn new(
        core: Arc<SrxCore>,
        cfg: &weft_core::provider::EpConfig,
        me: &Weak<EpShared>,
    ) -> SrxLink {
        let member = Arc::new(SrxMember {
            ep: me.clone(),
            cq: cfg.rx_cq.clone(),
            cntr: cfg.rx_cntr.clone(),
        });
        SrxLink {
            peer_cap: cfg.limits.peer_buffered.min(core.limit),
            core,
            member,
        }
    }
}

/// The shared receive side.
#[derive(Debug)]
pub struct SrxCore {
    me: Weak<SrxCore>,
    matcher: Mutex<SrxMatcher>,
    rx: Credits,
    /// `rx_attr.total_buffered_recv`: what every bound endpoint's peers
    /// together may have buffered.
    limit: usize,
    /// Unexpected bytes buffered now (each message: length + overhead).
    pub charged: AtomicUsize,
    /// Connections of bound endpoints waiting for a receive or budget.
    pub parked: Parked,
    members: Mutex<Vec<Weak<SrxMember>>>,
    closed: AtomicBool,
}

/// The `ProviderSrx` handle.
#[derive(Debug)]
pub struct TcpSrx {
    pub core: Arc<SrxCore>,
}

impl TcpSrx {
    pub fn open(attr: &RxAttr) -> Arc<TcpSrx> {
        let core = Arc::new_cyclic(|me| SrxCore {
            me: me.clone(),
            matcher: Mutex::new(Matcher::new()),
            rx: Credits::new(attr.size.max(1)),
            limit: attr.total_buffered_recv.max(1),
            charged: AtomicUsize::new(0),
            parked: Parked::default(),
            members: Mutex::new(Vec::new()),
            closed: AtomicBool::new(false),
        });
        Arc::new(TcpSrx { core })
    }
}

impl RecvCtx for SrxCore {
    fn rx_credits(&self) -> &Credits {
        &self.rx
    }

    fn reported_addr(&self, a: FiAddr) -> FiAddr {
        a
    }

    fn give_back(&self, r: Returned) {
        self.take_back(r, false);
    }

    fn give_back_after(&self, r: Returned) {
        self.take_back(r, true);
    }
}

impl SrxCore {
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Registers a bound endpoint.
    pub fn join(&self, m: &Arc<SrxMember>) {
        let mut v = lock(&self.members);
        v.retain(|w| w.strong_count() > 0);
        v.push(Arc::downgrade(m));
    }

    /// A bound endpoint closed: its parked connections leave the list
    /// and later cancels report elsewhere.
    pub fn leave(&self, m: &Arc<SrxMember>, conns: &[Arc<Conn>]) {
        lock(&self.members).retain(|w| w.strong_count() > 0 && !w.ptr_eq(&Arc::downgrade(m)));
        for c in conns {
            self.parked.unpark(c);
        }
    }

    /// Where something that ends without a message reports: the first
    /// bound endpoint's queues (awaited receives report to their future);
    /// a multi-receive buffer, given this as it is posted, reports its
    /// completions without a message there.
    fn fallback(&self, req: &mut RecvReq) {
        if req.done.cq.is_some() || req.done.waiter.is_some() {
            return;
        }
        let first = lock(&self.members).iter().find_map(Weak::upgrade);
        if let Some(m) = first {
            if multi_recv::is_buffer(req) {
                multi_recv::release_to(req, (m.cq.clone(), m.cntr.clone()));
            }
            m.report_to(req);
        }
    }

    /// Reports the release of multi-receive buffers that ended without
    /// the message they were offered. No lock of the context held.
    fn end_buffers(&self, ended: impl IntoIterator<Item = RecvReq>) {
        for r in ended {
            multi_recv::end(self, r, false);
        }
    }

    fn fits(&self, conn: &Conn, peer_cap: usize, charge: usize) -> bool {
        conn.charged.load(Ordering::Acquire).saturating_add(charge) <= peer_cap
            && self.charged.load(Ordering::Acquire).saturating_add(charge) <= self.limit
    }

    /// Budget came back: wakes parked connections whose message now fits.
    pub fn wake_for_budget(&self) {
        let room = self
            .limit
            .saturating_sub(self.charged.load(Ordering::Acquire));
        self.parked.wake_for_budget_in(room, &|c: &Conn, charge| {
            c.charged.load(Ordering::Acquire).saturating_add(charge) <= c.srx_cap
        });
    }

    /// A message arrived at `ep` (bound through `link`) on `conn`: the
    /// oldest accepting receive takes it, else it is buffered within the
    /// context's budget. `None`: it does not fit, `conn` is parked.
    pub fn arrival(
        &self,
        ep: &Arc<EpShared>,
        link: &SrxLink,
        conn: &Arc<Conn>,
        info: MsgInfo,
    ) -> Option<Arrival> {
        let mut ended = Vec::new();
        let out = self.arrival_locked(ep, link, conn, info, &mut ended);
        // Multi-receive buffers the message did not fit are released once
        // the matcher's lock is let go.
        self.end_buffers(ended);
        out
    }

    fn arrival_locked(
        &self,
        ep: &Arc<EpShared>,
        link: &SrxLink,
        conn: &Arc<Conn>,
        info: MsgInfo,
        ended: &mut Vec<RecvReq>,
    ) -> Option<Arrival> {
        let mut m = lock(&self.matcher);
        // A plain receive whole, or a part of the oldest multi-receive
        // buffer that has room for it.
        if let Some((_, mut req)) = m.match_arrival_by(&info, &mut multi_recv::take, ended) {
            link.member.report_to(&mut req);
            return Some(Arrival::Posted(req));
        }
        let me = self.me.upgrade()?;
        let charge = UNEXPECTED_OVERHEAD.saturating_add(info.len);
        if !self.fits(conn, link.peer_cap, charge) {
            // Parked before the second look, as on a lone endpoint.
            self.parked.park(conn, info);
            if !self.fits(conn, link.peer_cap, charge) {
                return None;
            }
            self.parked.unpark(conn);
        }
        let charge = Charge::srx(&me, &conn.charged, charge);
        let u = Unexpected::arriving(info.len, conn.source(), Some(link.member.clone()), charge);
        let key = SrxKey {
            src: conn.source(),
            ep: Arc::downgrade(ep),
        };
        m.push_unexpected(key, info, u.clone());
        Some(Arrival::Unexpected(u))
    }

    /// A buffered message died with its connection before it was whole.
    pub fn drop_dead(&self, u: &Arc<Unexpected>) {
        let gone = lock(&self.matcher).remove_unexpected(|p| Arc::ptr_eq(p, u));
        drop(gone);
    }

    /// Matches a receive holding its credit against the buffered
    /// messages, or queues it (at the head with `front`: a receive whose
    /// message died goes back where it was; the part of a multi-receive
    /// buffer ends instead, its range unused). A buffer takes every
    /// buffered message it accepts that fits, under one hold of the lock.
    pub fn place(&self, req: RecvReq, front: bool) {
        let Some(req) = multi_recv::unless_piece(self, req, self.is_closed()) else {
            return;
        };
        let spec = spec_of(&req);
        let resolve = |k: &SrxKey| k.resolve();
        let out = lock(&self.matcher).post_by(spec, req, &resolve, &mut multi_recv::take, front);
        if out.queued {
            self.parked.wake_for_recv(&spec);
        }
        for (recv, info, payload) in out.matched {
            self.take_unexpected(recv, info, payload);
        }
        self.end_buffers(out.ended);
    }

    /// A receive took buffered message `u`: deliver it now, or when the
    /// rest of it arrives (its reader delivers then).
    fn take_unexpected(&self, mut req: RecvReq, info: MsgInfo, u: Arc<Unexpected>) {
        if let Some(at) = &u.at {
            at.report_to(&mut req);
        }
        let ep = u.at.as_ref().and_then(|a| a.ep.upgrade());
        let mut g = lock(&u.st);
        if let Some(err) = g.failed {
            drop(g);
            if req.flags.contains(OpFlags::CLAIM) {
                self.end(ep.as_deref(), |ctx| fail_recv(ctx, req, info, 0, err));
            } else {
                self.place(req, false);
            }
            return;
        }
        if g.complete {
            let data = std::mem::take(&mut g.data);
            drop(g);
            match &ep {
                Some(e) => crate::rx::copy_and_deliver(e, req, info, &data, &u.from),
                None => weft_core::recv_completion::copy_and_deliver(self, req, info, &data),
            }
        } else {
            g.waiter = Some(Box::new((req, info)));
        }
    }

    /// Runs a completion through the endpoint a message arrived at (its
    /// AV reports the source), or through the context when it is gone.
    fn end(&self, ep: Option<&EpShared>, f: impl FnOnce(&dyn RecvCtx)) {
        match ep {
            Some(e) => f(e),
            None => f(self),
        }
    }

    /// A message whose receive's future was dropped as it arrived: to the
    /// oldest accepting receive, else ahead of every buffered message,
    /// charged even past the budget (it was admitted once).
    pub fn take_back(&self, mut r: Returned, after: bool) {
        if self.is_closed() {
            return;
        }
        let Some(me) = self.me.upgrade() else {
            return;
        };
        let at = self.member_for(&r);
        let ep = at.ep.upgrade();
        let mut info = r.info();
        let data = r.take_bytes();
        let from = match &ep {
            Some(e) => e.source_key(info.src, &r.raw),
            None => Source::plain(std::net::SocketAddr::from((
                std::net::Ipv4Addr::UNSPECIFIED,
                0,
            ))),
        };
        info.key = from.key.and_then(|k| u16::try_from(k).ok());
        let mut m = lock(&self.matcher);
        let mut ended = Vec::new();
        if let Some((_, mut req)) = m.match_arrival_by(&info, &mut multi_recv::take, &mut ended) {
            drop(m);
            self.end_buffers(ended);
            at.report_to(&mut req);
            match &ep {
                Some(e) => crate::rx::copy_and_deliver(e, req, info, &data, &from),
                None => weft_core::recv_completion::copy_and_deliver(self, req, info, &data),
            }
            return;
        }
        let charge = UNEXPECTED_OVERHEAD.saturating_add(info.len);
        let share = Arc::new(AtomicUsize::new(0));
        let key = SrxKey {
            src: from,
            ep: at.ep.clone(),
        };
        let u = Unexpected::whole(
            data,
            info.len,
            from,
            Some(at),
            Charge::srx(&me, &share, charge),
        );
        if after {
            m.push_unexpected_front_after(key, info, u);
        } else {
            m.push_unexpected_front(key, info, u);
        }
        drop(m);
        self.end_buffers(ended);
    }

    /// The bound endpoint a returned message was reported to (found by
    /// its CQ), else a stand-in with the queues it names.
    fn member_for(&self, r: &Returned) -> Arc<SrxMember> {
        let found = lock(&self.members)
            .iter()
            .filter_map(Weak::upgrade)
            .find(|m| match (&m.cq, &r.origin.cq) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (None, None) => true,
                _ => false,
            });
        found.unwrap_or_else(|| {
            Arc::new(SrxMember {
                ep: Weak::new(),
                cq: r.origin.cq.clone(),
                cntr: r.origin.cntr.clone(),
            })
        })
    }

    fn post(&self, mut req: RecvReq) -> std::result::Result<(), Rejected<RecvReq>> {
        let reject = |err, req| Err(Rejected { err, req });
        if self.is_closed() {
            return reject(Error::OpBadState, req);
        }
        if req.flags.contains(OpFlags::AUTH_KEY) {
            return reject(Error::BadFlags, req);
        }
        let spec = spec_of(&req);
        let resolve = |k: &SrxKey| k.resolve();
        if req.flags.contains(OpFlags::PEEK) {
            let r = lock(&self.matcher).peek_with(&spec, req.flags, &resolve, &|_, u| u.at.clone());
            match r {
                Ok((info, at)) => {
                    if let Some(a) = &at {
                        a.report_to(&mut req);
                    }
                    let ep = at.and_then(|a| a.ep.upgrade());
                    self.end(ep.as_deref(), |ctx| complete_peek(ctx, req, info));
                }
                Err(Error::Inval) => return reject(Error::Inval, req),
                Err(e) => {
                    self.fallback(&mut req);
                    req.done.fail(CqErrEntry::new(0, OpFlags::RECV, e));
                }
            }
            return Ok(());
        }
        if req.flags.contains(OpFlags::CLAIM) {
            let discard = req.flags.contains(OpFlags::DISCARD);
            // Taken whole even for a discard: its queues are needed.
            let r = lock(&self.matcher).claim(spec.context, false);
            match r {
                Ok((info, None)) => {
                    self.fallback(&mut req);
                    complete_peek(self, req, info);
                }
                Ok((info, Some(u))) if discard => {
                    if let Some(a) = &u.at {
                        a.report_to(&mut req);
                    }
                    let ep = u.at.as_ref().and_then(|a| a.ep.upgrade());
                    drop(u);
                    self.end(ep.as_deref(), |ctx| complete_peek(ctx, req, info));
                }
                Ok((info, Some(u))) => {
                    // Delivered through the normal path, which gives
                    // back one credit.
                    self.rx.take();
                    self.take_unexpected(req, info, u);
                }
                Err(e) => {
                    self.fallback(&mut req);
                    req.done.fail(CqErrEntry::new(0, OpFlags::RECV, e));
                }
            }
            return Ok(());
        }
        if !self.rx.try_take() {
            return reject(Error::Again, req);
        }
        if multi_recv::is_buffer(&req) {
            self.fallback(&mut req);
        }
        self.place(req, false);
        Ok(())
    }

    fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let (posted, unexpected) = {
            let mut m = lock(&self.matcher);
            (m.drain_posted(), m.drain_unexpected())
        };
        for (_, req) in posted {
            cancel_recv(self, req);
        }
        drop(unexpected);
        self.parked.wake_all();
    }
}

impl ProviderSrx for TcpSrx {
    fn post_recv(&self, req: RecvReq) -> std::result::Result<(), Rejected<RecvReq>> {
        self.core.post(req)
    }

    fn cancel(&self, context: u64) -> bool {
        let r = lock(&self.core.matcher).cancel(context);
        match r {
            Some((_, mut req)) => {
                self.core.fallback(&mut req);
                cancel_recv(&*self.core, req);
                true
            }
            None => false,
        }
    }

    fn give_back(&self, r: Returned) {
        self.core.take_back(r, false);
    }

    fn give_back_after(&self, r: Returned) {
        self.core.take_back(r, true);
    }

    fn rx_size_left(&self) -> usize {
        self.core.rx.left()
    }

    fn close(&self) {
        self.core.close();
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn matches(&self) -> bool {
        true
    }

    fn stats(&self) -> EpStats {
        let mut s = EpStats::default();
        s.parked = self.core.parked.len();
        s.unexpected_bytes = self.core.charged.load(Ordering::Acquire);
        s
    }
}
