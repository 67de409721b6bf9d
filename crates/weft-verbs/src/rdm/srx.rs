//! Shared receive contexts (`fi_srx_context`) on RDM endpoints.
//!
//! An RDM endpoint matches in software ([`Side`]: the tag matcher, the
//! receive credits, the count of unexpected bytes); its bounce slots,
//! shared receive queue and RC connections only carry messages to that
//! matcher. So what a context shares is the [`Side`]: every bound
//! endpoint places what arrives at it into the context's, and a receive
//! posted to the context meets the messages of every bound endpoint in
//! one order. The slots and connections stay the endpoint's: binding more
//! endpoints, or more peers connecting, adds no receive buffers beyond
//! what an RDM endpoint has anyway (its fixed slot pool; a connection
//! costs a QP and no buffer).
//!
//! A held message names the endpoint it arrived at ([`Held::at`]): an
//! announced (rendezvous) message can only be read over that endpoint's
//! connection, into the matched receive's buffers, and it completes on
//! that endpoint's queues. A sender is resolved in that endpoint's AV
//! ([`Src`]). What ends without a message (a failed peek, a cancel)
//! reports on the first bound endpoint's queues; a context has none.
//!
//! The budget (`rx_attr.total_buffered_recv`) bounds what is held: a
//! copied message (its payload and overhead), a held announcement (its
//! overhead) and a delivery-complete pull (payload and overhead). What
//! does not fit stays in its receive slot ([`SlotHold`]; an announcement
//! keeps the slot it came in), which goes back to the receive queue only
//! when a receive takes the message; with every slot of an endpoint
//! held, its peers' sends wait in RNR retries. A lone endpoint has no
//! budget.
//!
//! A multi-receive buffer posted to the context is one receive of the
//! shared matcher: each endpoint cuts the parts of the messages that
//! arrive at it, copies or reads into them over its own connections
//! (parts are disjoint), and completes them on its own queues.
//!
//! `weft_core::soft_srx` is not reused: it holds only whole payloads
//! (`BytesMut`), while a message held here may be an announcement whose
//! bytes are still at the sender, a pull in flight or a message left in
//! its slot, and taking one starts work (an RDMA read, a copy out of the
//! slot pool) on the endpoint it came to.

// A refused receive hands the whole request back, as at the provider
// boundary.
#![allow(clippy::result_large_err)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use weft_core::addr::{FiAddr, FI_ADDR_NOTAVAIL};
use weft_core::attr::RxAttr;
use weft_core::completion::{CqErrEntry, Returned};
use weft_core::credits::Credits;
use weft_core::flags::OpFlags;
use weft_core::limits::UNEXPECTED_OVERHEAD;
use weft_core::multi_recv;
use weft_core::provider::{EpStats, ProviderSrx, RecvReq, Rejected};
use weft_core::recv_completion::{
    cancel_recv, complete_peek, copy_and_deliver, fail_recv, RecvCtx,
};
use weft_core::soft_rx::Charge;
use weft_core::soft_srx::{report_to, Members, Queues};
use weft_core::sync::lock;
use weft_core::tagmatch::{Matcher, MsgInfo};
use weft_core::Error;

use super::{spec_of, RdmShared, Unexp};

/// The receive side an endpoint matches on: its own, or its context's.
#[derive(Debug)]
pub(crate) struct Side {
    pub matcher: Mutex<super::RdmMatcher>,
    /// Receives that can still be posted (`rx_attr.size`).
    pub rx: Credits,
    /// Bytes of unexpected messages held here: each message's payload
    /// (copied or being pulled) plus `UNEXPECTED_OVERHEAD`.
    pub unexp: Arc<AtomicUsize>,
    /// The budget of `unexp` for copied messages
    /// (`rx_attr.total_buffered_recv` of a context; none on a lone
    /// endpoint).
    pub limit: usize,
    /// Held messages whose payload waits elsewhere: at the sender (an
    /// announcement) or in a receive slot past the budget.
    pub waiting: Arc<AtomicUsize>,
}

impl Side {
    pub(crate) fn new(size: usize, limit: usize) -> Arc<Side> {
        Arc::new(Side {
            matcher: Mutex::new(Matcher::new()),
            rx: Credits::new(size),
            unexp: Arc::new(AtomicUsize::new(0)),
            limit,
            waiting: Arc::new(AtomicUsize::new(0)),
        })
    }
}

/// A receive slot kept by the message in it; reposted on drop, when the
/// message was copied out or dropped.
pub(crate) struct SlotHold {
    ep: Weak<RdmShared>,
    slot: u32,
    /// Where the payload starts in the receive region.
    pub off: usize,
    pub len: usize,
}

impl SlotHold {
    pub(crate) fn new(ep: &RdmShared, slot: u32, off: usize, len: usize) -> SlotHold {
        SlotHold {
            ep: ep.me.clone(),
            slot,
            off,
            len,
        }
    }
}

impl Drop for SlotHold {
    fn drop(&mut self) {
        if let Some(ep) = self.ep.upgrade() {
            ep.repost_slot(self.slot);
        }
    }
}

/// A held message's sender as the matcher keeps it: its endpoint address
/// and the endpoint it arrived at, whose AV resolves it (so a sender
/// inserted later is still found).
#[derive(Debug, Clone)]
pub(crate) struct Src {
    pub peer: SocketAddr,
    /// The AV key handle its connection proved (`FI_AV_AUTH_KEY`).
    pub key: Option<u16>,
    pub at: Weak<RdmShared>,
}

impl Src {
    pub(crate) fn resolve(&self) -> FiAddr {
        self.at
            .upgrade()
            .map_or(FI_ADDR_NOTAVAIL, |e| e.resolve_src(&self.peer, self.key))
    }
}

/// A message nobody was waiting for, with the endpoint it arrived at and
/// its share of the unexpected bytes.
pub(crate) struct Held {
    pub at: Weak<RdmShared>,
    pub u: Unexp,
    _charge: Option<Charge>,
    _waits: Option<Charge>,
    /// The receive slot an announcement past the budget keeps (its
    /// header was read out already): the back-pressure, released with
    /// the message.
    _slot: Option<SlotHold>,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held").finish_non_exhaustive()
    }
}

impl RdmShared {
    /// `u`, arrived here, with its `charge` against the budget.
    pub(crate) fn held(&self, u: Unexp, charge: Option<Charge>) -> Held {
        let waits = matches!(u, Unexp::Rts { .. } | Unexp::Slot(..));
        Held {
            at: self.me.clone(),
            u,
            _charge: charge,
            _waits: waits.then(|| Charge::force(&self.side.waiting, 1)),
            _slot: None,
        }
    }

    /// Announcement `u`, arrived here past the budget: uncharged, it
    /// keeps the receive slot `slot` it came in until it goes.
    pub(crate) fn held_in_slot(&self, u: Unexp, slot: SlotHold) -> Held {
        Held {
            _slot: Some(slot),
            ..self.held(u, None)
        }
    }

    /// `u` of `n` payload bytes, arrived here, charged whatever the
    /// budget: a message admitted once already and given back (or the
    /// placeholder of one still being read into a dropped stream).
    pub(crate) fn held_forced(&self, u: Unexp, n: usize) -> Held {
        let charge = Charge::force(&self.side.unexp, n + UNEXPECTED_OVERHEAD);
        self.held(u, Some(charge))
    }

    /// The matcher's sender `peer` (under AV key `key`), arrived here.
    pub(crate) fn src(&self, peer: SocketAddr, key: Option<u16>) -> Src {
        Src {
            peer,
            key,
            at: self.me.clone(),
        }
    }

    /// This endpoint's receive CQ and counter.
    pub(crate) fn rx_queues(&self) -> Queues {
        (self.cfg.rx_cq.clone(), self.cfg.rx_cntr.clone())
    }

    /// Points a receive that a message arriving here takes at this
    /// endpoint's queues when it is a context's (which has none).
    pub(crate) fn report_here(&self, req: &mut RecvReq) {
        if self.srx.is_some() {
            report_to(req, self.rx_queues());
        }
    }

    /// Whether `held` arrived here.
    pub(crate) fn is_mine(&self, held: &Held) -> bool {
        std::ptr::eq(held.at.as_ptr(), self)
    }
}

/// A receive matched `held`: the endpoint it arrived at takes it (reads
/// it over its connection, completes on its queues). One that closed
/// meanwhile still hands over a copied payload through `ctx`, on the
/// queues of context `srx`'s first bound endpoint; an announcement went
/// with its connections, so the receive is returned, to go on to the
/// next message (a claim fails: it asked for that one).
#[must_use]
pub(crate) fn take_held(
    ctx: &dyn RecvCtx,
    srx: Option<&RdmSrx>,
    mut req: RecvReq,
    info: MsgInfo,
    held: Held,
    claimed: bool,
) -> Option<RecvReq> {
    let Held { at, u, .. } = held;
    if let Some(ep) = at.upgrade().filter(|e| !e.is_closed()) {
        ep.report_here(&mut req);
        ep.take_unexpected(req, info, u, claimed);
        return None;
    }
    if let Some(c) = srx {
        c.fallback(&mut req);
    }
    match u {
        Unexp::Eager(data, _) => {
            copy_and_deliver(ctx, req, info, &data);
            None
        }
        _ if claimed => {
            fail_recv(ctx, req, info, 0, Error::ConnReset);
            None
        }
        _ => Some(req),
    }
}

/// A shared receive context of RDM endpoints.
#[derive(Debug)]
pub(crate) struct RdmSrx {
    me: Weak<RdmSrx>,
    pub side: Arc<Side>,
    iov_limit: usize,
    members: Members<RdmShared>,
    closed: AtomicBool,
}

impl RdmSrx {
    /// A context of `attr.size` receives.
    pub(crate) fn open(attr: &RxAttr) -> Arc<RdmSrx> {
        // No budget asked: none, as on a lone endpoint.
        let limit = match attr.total_buffered_recv {
            0 => usize::MAX,
            n => n,
        };
        Arc::new_cyclic(|me| RdmSrx {
            me: me.clone(),
            side: Side::new(attr.size.max(1), limit),
            iov_limit: attr.iov_limit.max(1),
            members: Members::default(),
            closed: AtomicBool::new(false),
        })
    }

    /// The context `srx` names, if any: `Inval` for another kind's.
    pub(crate) fn of(srx: &Option<Arc<dyn ProviderSrx>>) -> weft_core::Result<Option<Arc<RdmSrx>>> {
        match srx {
            None => Ok(None),
            Some(s) => s
                .as_any()
                .downcast_ref::<RdmSrx>()
                .and_then(|c| c.me.upgrade())
                .map(Some)
                .ok_or(Error::Inval),
        }
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub(crate) fn join(&self, ep: Weak<RdmShared>) {
        self.members.join(ep);
    }

    /// A bound endpoint closed: it reports nothing more. Its copied
    /// messages stay held for the context's receives; its announcements
    /// and pulls cannot be read any more (its connections are gone) and
    /// leave.
    pub(crate) fn leave(&self, ep: &RdmShared) {
        self.forget(ep);
        let gone: Vec<Held> = {
            let mut m = lock(&self.side.matcher);
            std::iter::from_fn(|| {
                m.remove_unexpected(|h| ep.is_mine(h) && !matches!(h.u, Unexp::Eager(..)))
            })
            .collect()
        };
        drop(gone);
    }

    /// A bound endpoint is closing: what the context ends or takes back
    /// no longer goes to it (it would be dropped there).
    pub(crate) fn forget(&self, ep: &RdmShared) {
        self.members.leave(ep);
    }

    /// Where what ends without a message reports: the first bound
    /// endpoint's queues (an awaited receive reports to its future).
    fn fallback(&self, req: &mut RecvReq) {
        self.members.fallback(req, RdmShared::rx_queues);
    }

    /// Points a receive that a closing bound endpoint ends (it was
    /// pointed at that endpoint's queues) at the first bound endpoint
    /// still open, as [`fallback`](Self::fallback) does for what ends
    /// without a message; with none left it keeps its queues.
    pub(crate) fn report_instead(&self, req: &mut RecvReq) {
        if req.done.waiter.is_some() {
            return;
        }
        if let Some(m) = self.members.live().first() {
            report_to(req, m.rx_queues());
        }
    }

    /// Posts `req` to the context's matcher, or hands it the held
    /// messages it matches (each through the endpoint it arrived at). A
    /// multi-receive buffer takes every one it accepts that fits; the
    /// part of one whose message went with its endpoint ends instead,
    /// its range unused.
    fn place(&self, req: RecvReq) {
        let Some(mut req) = multi_recv::unless_piece(self, req, self.is_closed()) else {
            return;
        };
        if self.is_closed() {
            self.fallback(&mut req);
            cancel_recv(self, req);
            return;
        }
        let spec = spec_of(&req);
        let resolve = Src::resolve;
        let out = lock(&self.side.matcher).post_by(
            spec,
            req,
            &resolve,
            &mut weft_core::multi_recv::take,
            false,
        );
        let again: Vec<RecvReq> = out
            .matched
            .into_iter()
            .filter_map(|(recv, info, held)| take_held(self, Some(self), recv, info, held, false))
            .collect();
        for req in again {
            self.place(req);
        }
        if let Some(r) = out.ended {
            multi_recv::end(self, r, false);
        }
    }

    /// Ends `req` through endpoint `at` (on its queues), else through the
    /// context.
    fn end_at(
        &self,
        mut req: RecvReq,
        at: Option<Arc<RdmShared>>,
        f: impl FnOnce(&dyn RecvCtx, RecvReq),
    ) {
        match at {
            Some(ep) => {
                report_to(&mut req, ep.rx_queues());
                f(&*ep, req);
            }
            None => {
                self.fallback(&mut req);
                f(self, req);
            }
        }
    }

    /// Hands a message whose receive's future was dropped to the bound
    /// endpoint it was reported on (found by its CQ; else the first),
    /// which puts it ahead of later arrivals.
    fn route_back(&self, r: Returned, after: bool) {
        if self.is_closed() {
            return;
        }
        let Some(m) = self.members.reported_on(&r, RdmShared::rx_queues) else {
            return;
        };
        if !after {
            m.take_back(r, false);
            return;
        }
        // A dropped stream's message: the parts of its buffer before it
        // still being read, at whichever bound endpoint, keep their
        // places ahead of it.
        let addr = r.entry.bufs.first().map(|b| b.as_ptr() as usize);
        for other in self.members.live() {
            if !Arc::ptr_eq(&other, &m) {
                other.hold_places_before(addr);
            }
        }
        m.give_back_in_order(r);
    }
}

impl RecvCtx for RdmSrx {
    fn rx_credits(&self) -> &Credits {
        &self.side.rx
    }

    /// The context has no AV: reached only for what ends without a
    /// message or whose endpoint closed, reported as found.
    fn reported_addr(&self, a: FiAddr) -> FiAddr {
        a
    }

    fn give_back(&self, r: Returned) {
        self.route_back(r, false);
    }

    fn give_back_after(&self, r: Returned) {
        self.route_back(r, true);
    }
}

impl ProviderSrx for RdmSrx {
    fn post_recv(&self, mut req: RecvReq) -> std::result::Result<(), Rejected<RecvReq>> {
        let reject = |err, req| Err(Rejected { err, req });
        if let Some(err) = weft_core::soft_srx::refused_post(self.is_closed(), &req, self.iov_limit)
        {
            return reject(err, req);
        }
        let spec = spec_of(&req);
        let resolve = Src::resolve;
        if req.flags.contains(OpFlags::PEEK) {
            let r = lock(&self.side.matcher)
                .peek_with(&spec, req.flags, &resolve, &|_, h| h.at.upgrade());
            match r {
                Ok((info, at)) => self.end_at(req, at, |ctx, req| complete_peek(ctx, req, info)),
                Err(Error::Inval) => return reject(Error::Inval, req),
                Err(e) => {
                    self.fallback(&mut req);
                    req.done.fail(CqErrEntry::new(0, OpFlags::RECV, e));
                }
            }
            return Ok(());
        }
        if req.flags.contains(OpFlags::CLAIM) {
            // Taken whole even for a discard: it reports on the queues of
            // the endpoint it arrived at.
            let r = lock(&self.side.matcher).claim(spec.context, false);
            match r {
                Ok((info, Some(held))) if req.flags.contains(OpFlags::DISCARD) => {
                    let at = held.at.upgrade();
                    drop(held);
                    self.end_at(req, at, |ctx, req| complete_peek(ctx, req, info));
                }
                Ok((info, Some(held))) => {
                    // Delivered through the normal path, which gives back
                    // one credit.
                    self.side.rx.take();
                    self.fallback(&mut req);
                    if let Some(req) = take_held(self, Some(self), req, info, held, true) {
                        self.place(req);
                    }
                }
                Ok((info, None)) => {
                    self.end_at(req, None, |ctx, req| complete_peek(ctx, req, info))
                }
                Err(e) => {
                    self.fallback(&mut req);
                    req.done.fail(CqErrEntry::new(0, OpFlags::RECV, e));
                }
            }
            return Ok(());
        }
        if !self.side.rx.try_take() {
            return reject(Error::Again, req);
        }
        if multi_recv::is_buffer(&req) {
            // Its completions without a message report here.
            self.fallback(&mut req);
        }
        self.place(req);
        Ok(())
    }

    fn cancel(&self, context: u64) -> bool {
        let found = self
            .members
            .cancel_in(&self.side.matcher, context, self, RdmShared::rx_queues);
        // A dropped stream withdraws its buffer last: the places of its
        // messages still being read, at any bound endpoint, are taken.
        for m in self.members.live() {
            m.hold_all_places();
        }
        found
    }

    fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.members
            .close_in(&self.side.matcher, self, RdmShared::rx_queues);
    }

    fn give_back(&self, r: Returned) {
        self.route_back(r, false);
    }

    fn give_back_after(&self, r: Returned) {
        self.route_back(r, true);
    }

    fn rx_size_left(&self) -> usize {
        self.side.rx.left()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn matches(&self) -> bool {
        true
    }

    fn stats(&self) -> EpStats {
        let mut s = EpStats::default();
        s.unexpected_bytes = self.side.unexp.load(Ordering::Acquire);
        // Messages whose bytes wait at their sender or in a slot: what
        // the budget holds back.
        s.parked = self.side.waiting.load(Ordering::Acquire);
        s
    }
}

/// Opens a context for RDM endpoints with `attr`.
pub(crate) fn open(attr: &RxAttr) -> Arc<dyn ProviderSrx> {
    RdmSrx::open(attr)
}
