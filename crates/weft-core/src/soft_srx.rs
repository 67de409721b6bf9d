//! Shared receive contexts (`fi_srx_context`) for the providers that
//! match in software and hold unexpected messages themselves (udp, shm).
//!
//! Such an endpoint already keeps its whole receive side in one place —
//! a matcher, receive credits and an unexpected budget ([`RxSide`]) —
//! so sharing it is handing several endpoints the same one: a bound
//! endpoint places what arrives at it into its context's side exactly as
//! a lone endpoint places into its own, and the budget
//! (`rx_attr.total_buffered_recv`) is then the context's, whatever the
//! number of endpoints bound. What the context adds is where things
//! report: a context has no queues (fi_endpoint(3)), so a receive takes
//! those of the endpoint its message arrived at, and what ends without a
//! message (a failed peek, a cancel, close) reports on the first bound
//! endpoint's.
//!
//! A held message ([`Held`]) and its sender ([`Sender`]) name the
//! endpoint they arrived at; the provider supplies the rest through
//! [`SrxEp`]: its AV's lookup, and how it completes a receive with a
//! held message.
// A refused receive hands the whole request back, as at the provider
// boundary (`provider.rs`): boxing it would cost an allocation per post.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bytes::BytesMut;

use crate::addr::FiAddr;
use crate::attr::RxAttr;
use crate::completion::{CqErrEntry, CqShared, Returned};
use crate::counter::CounterShared;
use crate::credits::Credits;
use crate::flags::OpFlags;
use crate::multi_recv;
use crate::provider::{EpStats, ProviderSrx, RecvReq, Rejected};
use crate::recv_completion::{cancel_recv, complete_peek, copy_and_deliver, RecvCtx};
use crate::soft_rx::{spec_of, Charge};
use crate::sync::{lock, FastMutex, Lock};
use crate::tagmatch::{Matcher, MsgInfo, PostOutcome};
use crate::Error;

/// The receive side of an endpoint: posted receives and held messages
/// (`U`, each kept with its sender `S`), the receive credits
/// (`rx_attr.size`) and the unexpected budget. A lone endpoint has its
/// own; the endpoints bound to a shared context share the context's.
#[derive(Debug)]
pub struct RxSide<U, S> {
    /// Posted receives and held messages.
    pub matcher: FastMutex<Matcher<RecvReq, U, S>>,
    /// Receives that can still be posted.
    pub rx: Credits,
    /// Unexpected bytes held now (payload plus the fixed overhead of each).
    pub unexp: Arc<AtomicUsize>,
    /// `rx_attr.total_buffered_recv`.
    pub limit: usize,
}

impl<U, S> RxSide<U, S> {
    /// An empty side of `size` receive credits and a budget of `limit`
    /// bytes.
    pub fn new(size: usize, limit: usize) -> Arc<RxSide<U, S>> {
        Arc::new(RxSide {
            matcher: FastMutex::new(Matcher::new()),
            rx: Credits::new(size),
            unexp: Arc::new(AtomicUsize::new(0)),
            limit,
        })
    }
}

/// A receive CQ and counter.
pub type Queues = (Option<Arc<CqShared>>, Option<Arc<CounterShared>>);

/// What a provider's endpoint lends to the receive side it places into
/// (its own, or the shared context it is bound to).
pub trait SrxEp: RecvCtx + Debug + Send + Sync + Sized + 'static {
    /// A sender's address, as the endpoint's AV holds it.
    type Addr: Debug + Send + Sync + 'static;
    /// This endpoint, as the messages held for it name it.
    fn this(&self) -> Weak<Self>;
    /// The endpoint's receive CQ and counter.
    fn rx_queues(&self) -> Queues;
    /// Whether it is bound to a shared context.
    fn shared(&self) -> bool;
    /// The AV handle of `addr` in this endpoint's AV.
    fn handle_of(&self, addr: &Self::Addr) -> FiAddr;
    /// Completes `req` with `held`, which arrived here.
    fn deliver_held(&self, req: RecvReq, info: MsgInfo, held: Held<Self>);
    /// A receive was posted to the context, or budget came back: a
    /// message waiting for either may be placed now.
    fn wake(&self) {}
    /// Whether a message waits at this endpoint for a receive or budget.
    fn parked(&self) -> bool {
        false
    }

    /// Points a receive that a message arriving here takes at this
    /// endpoint's queues when it is a shared context's (which has none);
    /// a lone endpoint's receives carry them already. Inlined: every
    /// arrival asks, and a lone endpoint's answer is one test.
    #[inline]
    fn report_here(&self, req: &mut RecvReq) {
        if self.shared() {
            report_to(req, self.rx_queues());
        }
    }

    /// The sender at `addr` of a message arriving here.
    fn sender(&self, addr: Self::Addr) -> Sender<Self> {
        Sender {
            addr,
            at: self.this(),
        }
    }
}

/// A held message's sender, as the matcher keeps it: its address (so a
/// sender inserted into the AV later is still found) and the endpoint it
/// arrived at, whose AV that is (on a shared context, not the same for
/// every held message).
#[derive(Debug)]
pub struct Sender<E: SrxEp> {
    /// Where it came from.
    pub addr: E::Addr,
    /// The endpoint it arrived at.
    pub at: Weak<E>,
}

impl<E: SrxEp> Sender<E> {
    /// The sender's AV handle in the AV of the endpoint it arrived at.
    pub fn resolve(&self) -> FiAddr {
        self.at
            .upgrade()
            .map_or(crate::addr::FI_ADDR_NOTAVAIL, |e| e.handle_of(&self.addr))
    }
}

/// A message held for a later receive, with its share of the budget.
#[derive(Debug)]
pub struct Held<E: SrxEp> {
    /// Its bytes.
    pub data: BytesMut,
    /// Its sender's address (for `FI_SOURCE_ERR`).
    pub from: E::Addr,
    /// The endpoint it arrived at, which completes its receive.
    pub at: Weak<E>,
    _charge: Charge,
}

impl<E: SrxEp> Held<E> {
    /// `data` from `from`, arrived at `at`, charged `charge`.
    pub fn new(at: &E, data: BytesMut, from: E::Addr, charge: Charge) -> Held<E> {
        Held {
            data,
            from,
            at: at.this(),
            _charge: charge,
        }
    }
}

/// The receive side of an endpoint of type `E`.
pub type SoftSide<E> = RxSide<Held<E>, Sender<E>>;

/// Endpoint `ep` closes: a lone endpoint's posted receives and held
/// messages are discarded without completions (as everything it had
/// outstanding); a bound one leaves its context `srx`, whose receives and
/// held messages stay for the other endpoints.
pub fn close_side<E: SrxEp>(ep: &E, side: &SoftSide<E>, srx: Option<&SoftSrx<E>>) {
    match srx {
        Some(c) => c.leave(ep),
        None => {
            let posted = lock(&side.matcher).drain_posted();
            drop(posted);
            let held = lock(&side.matcher).drain_unexpected();
            drop(held);
        }
    }
}

/// Points `req`'s completion at `queues`.
pub fn report_to(req: &mut RecvReq, queues: Queues) {
    (req.done.cq, req.done.cntr) = queues;
}

/// The endpoints bound to a shared context, held weakly (a context
/// keeps no endpoint alive), with the rules for where what a context
/// ends reports, which every provider's context shares.
#[derive(Debug)]
pub struct Members<E>(Mutex<Vec<Weak<E>>>);

impl<E> Default for Members<E> {
    fn default() -> Self {
        Members(Mutex::new(Vec::new()))
    }
}

impl<E> Members<E> {
    /// Registers a bound endpoint.
    pub fn join(&self, ep: Weak<E>) {
        let mut v = lock(&self.0);
        v.retain(|w| w.strong_count() > 0);
        v.push(ep);
    }

    /// A bound endpoint closed: it reports nothing more.
    pub fn leave(&self, ep: &E) {
        lock(&self.0).retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), ep));
    }

    /// The bound endpoints still open, in bind order.
    pub fn live(&self) -> Vec<Arc<E>> {
        lock(&self.0).iter().filter_map(Weak::upgrade).collect()
    }

    /// Where what ends without a message reports: the first bound
    /// endpoint's queues (`queues` of it), unless `req` reports
    /// somewhere already (an awaited receive reports to its future). A
    /// multi-receive buffer, given this as it is posted, reports its
    /// completions without a message there (`multi_recv::release_to`).
    pub fn fallback(&self, req: &mut RecvReq, queues: impl Fn(&E) -> Queues) {
        if req.done.cq.is_some() || req.done.waiter.is_some() {
            return;
        }
        if let Some(m) = self.live().first() {
            let q = queues(m);
            if multi_recv::is_buffer(req) {
                multi_recv::release_to(req, q.clone());
            }
            report_to(req, q);
        }
    }

    /// The bound endpoint a returned message was reported on (found by
    /// its receive CQ, `queues` of each), else the first: the one that
    /// takes it back.
    pub fn reported_on(&self, r: &Returned, queues: impl Fn(&E) -> Queues) -> Option<Arc<E>> {
        let members = self.live();
        let found = members
            .iter()
            .position(|m| match (&queues(m).0, &r.origin.cq) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (None, None) => true,
                _ => false,
            });
        members.into_iter().nth(found.unwrap_or(0))
    }

    /// Withdraws the receive with `context` posted to a context's
    /// `matcher`, ending it with `Canceled` through `ctx` (the context),
    /// on the first bound endpoint's queues; false when none is posted.
    /// `matcher` is any lock of one (verbs RDM keeps a `std` mutex).
    pub fn cancel_in<U, S>(
        &self,
        matcher: &(impl Lock<Target = Matcher<RecvReq, U, S>> + ?Sized),
        context: u64,
        ctx: &dyn RecvCtx,
        queues: impl Fn(&E) -> Queues,
    ) -> bool {
        let r = lock(matcher).cancel(context);
        match r {
            Some((_, mut req)) => {
                self.fallback(&mut req, queues);
                cancel_recv(ctx, req);
                true
            }
            None => false,
        }
    }

    /// A context closes: its posted receives end with `Canceled` through
    /// `ctx` (buffers handed back), its held messages are dropped.
    pub fn close_in<U, S>(
        &self,
        matcher: &(impl Lock<Target = Matcher<RecvReq, U, S>> + ?Sized),
        ctx: &dyn RecvCtx,
        queues: impl Fn(&E) -> Queues,
    ) {
        let (posted, held) = {
            let mut m = lock(matcher);
            (m.drain_posted(), m.drain_unexpected())
        };
        for (_, mut req) in posted {
            self.fallback(&mut req, &queues);
            cancel_recv(ctx, req);
        }
        drop(held);
    }
}

/// A shared receive context of endpoints of type `E`.
#[derive(Debug)]
pub struct SoftSrx<E: SrxEp> {
    /// The side every bound endpoint places into.
    pub side: Arc<SoftSide<E>>,
    /// Buffers one receive may have.
    iov_limit: usize,
    members: Members<E>,
    closed: AtomicBool,
}

impl<E: SrxEp> SoftSrx<E> {
    /// A context with `attr`'s `size` receives and `total_buffered_recv`
    /// bytes of budget (`limit` where 0).
    pub fn open(attr: &RxAttr, limit: usize, iov_limit: usize) -> Arc<SoftSrx<E>> {
        let limit = match attr.total_buffered_recv {
            0 => limit,
            n => n,
        };
        Arc::new(SoftSrx {
            side: RxSide::new(attr.size.max(1), limit),
            iov_limit: attr.iov_limit.clamp(1, iov_limit.max(1)),
            members: Members::default(),
            closed: AtomicBool::new(false),
        })
    }

    /// The context `srx` names, if it is one of these: `Inval` for
    /// another provider's (or another endpoint type's).
    pub fn of(srx: &Option<Arc<dyn ProviderSrx>>) -> crate::Result<Option<Arc<SoftSrx<E>>>> {
        match srx {
            None => Ok(None),
            Some(s) => s
                .as_any()
                .downcast_ref::<SrxHandle<E>>()
                .map(|h| Some(h.0.clone()))
                .ok_or(Error::Inval),
        }
    }

    /// Closed: it takes no receives.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Registers a bound endpoint.
    pub fn join(&self, ep: Weak<E>) {
        self.members.join(ep);
    }

    /// A bound endpoint closed: it reports nothing more. Messages that
    /// arrived at it stay held for the context's receives.
    pub fn leave(&self, ep: &E) {
        self.members.leave(ep);
    }

    fn members(&self) -> Vec<Arc<E>> {
        self.members.live()
    }

    /// Where what ends without a message reports: the first bound
    /// endpoint's queues (an awaited receive reports to its future).
    fn fallback(&self, req: &mut RecvReq) {
        self.members.fallback(req, E::rx_queues);
    }

    /// Completes `req` with `held`: through the endpoint it arrived at,
    /// or, that one closed, through the context.
    fn deliver(&self, mut req: RecvReq, info: MsgInfo, held: Held<E>) {
        match held.at.upgrade() {
            Some(ep) => ep.deliver_held(req, info, held),
            None => {
                self.fallback(&mut req);
                copy_and_deliver(self, req, info, &held.data);
            }
        }
    }

    /// A receive's end through the endpoint `held` arrived at (on its
    /// queues), else through the context.
    fn end_at(&self, mut req: RecvReq, at: Option<Arc<E>>, f: impl FnOnce(&dyn RecvCtx, RecvReq)) {
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

    fn wake_members(&self) {
        for m in self.members() {
            m.wake();
        }
    }

    fn post(&self, mut req: RecvReq) -> std::result::Result<(), Rejected<RecvReq>> {
        let reject = |err, req| Err(Rejected { err, req });
        if let Some(err) = refused_post(self.is_closed(), &req, self.iov_limit) {
            return reject(err, req);
        }
        let spec = spec_of(&req);
        let resolve = Sender::<E>::resolve;
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
            // Taken whole even for a discard: its queues are the
            // endpoint's it arrived at.
            let r = lock(&self.side.matcher).claim(spec.context, false);
            match r {
                Ok((info, Some(held))) if req.flags.contains(OpFlags::DISCARD) => {
                    let at = held.at.upgrade();
                    drop(held);
                    self.end_at(req, at, |ctx, req| complete_peek(ctx, req, info));
                    self.wake_members();
                }
                Ok((info, Some(held))) => {
                    // Delivered through the normal path, which gives back
                    // one credit.
                    self.side.rx.take();
                    self.deliver(req, info, held);
                    self.wake_members();
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
            self.post_buffer(req);
            return Ok(());
        }
        let out = lock(&self.side.matcher).post(spec, req, &resolve);
        if let PostOutcome::Matched {
            recv,
            info,
            payload,
            ..
        } = out
        {
            self.deliver(recv, info, payload);
        }
        // A message waiting for this receive, or for the budget the one
        // just taken gave back.
        self.wake_members();
        Ok(())
    }

    /// Posts a multi-receive buffer holding its credit: it takes every
    /// held message it accepts that fits, whichever bound endpoint each
    /// arrived at (under one hold of the lock, so none arriving meanwhile
    /// passes them), and stays posted while it has room. Its completions
    /// without a message report on the first bound endpoint's queues.
    fn post_buffer(&self, mut req: RecvReq) {
        self.fallback(&mut req);
        let spec = spec_of(&req);
        let resolve = Sender::<E>::resolve;
        let out =
            lock(&self.side.matcher).post_by(spec, req, &resolve, &mut multi_recv::take, false);
        for (recv, info, held) in out.matched {
            self.deliver(recv, info, held);
        }
        if let Some(r) = out.ended {
            multi_recv::end(self, r, false);
        }
        self.wake_members();
    }

    /// Hands a message whose receive's future was dropped to the endpoint
    /// it was reported on (found by its CQ; else the first bound one),
    /// which holds it ahead of later arrivals.
    fn route_back(&self, r: Returned, after: bool) {
        if self.is_closed() {
            return;
        }
        if let Some(m) = self.members.reported_on(&r, E::rx_queues) {
            if after {
                m.give_back_after(r);
            } else {
                m.give_back(r);
            }
        }
    }
}

impl<E: SrxEp> RecvCtx for SoftSrx<E> {
    fn rx_credits(&self) -> &Credits {
        &self.side.rx
    }

    /// The context has no AV: reached only for a message whose endpoint
    /// closed, whose handle is reported as it was found.
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

/// The `ProviderSrx` handle of a [`SoftSrx`].
#[derive(Debug)]
pub struct SrxHandle<E: SrxEp>(pub Arc<SoftSrx<E>>);

impl<E: SrxEp> ProviderSrx for SrxHandle<E> {
    fn post_recv(&self, req: RecvReq) -> std::result::Result<(), Rejected<RecvReq>> {
        self.0.post(req)
    }

    fn cancel(&self, context: u64) -> bool {
        self.0.cancel(context)
    }

    fn give_back(&self, r: Returned) {
        self.0.route_back(r, false);
    }

    fn give_back_after(&self, r: Returned) {
        self.0.route_back(r, true);
    }

    fn rx_size_left(&self) -> usize {
        self.0.side.rx.left()
    }

    fn close(&self) {
        self.0.close();
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn matches(&self) -> bool {
        true
    }

    fn stats(&self) -> EpStats {
        EpStats {
            unexpected_bytes: self.0.side.unexp.load(Ordering::Acquire),
            parked: self.0.members().iter().filter(|m| m.parked()).count(),
            ..EpStats::default()
        }
    }
}

impl<E: SrxEp> SoftSrx<E> {
    /// Withdraws the posted receive with `context`, ending it with
    /// `Canceled`; false when none is posted.
    pub fn cancel(&self, context: u64) -> bool {
        self.members
            .cancel_in(&self.side.matcher, context, self, E::rx_queues)
    }

    /// Stops taking receives; pending ones end with `Canceled`, held
    /// messages are dropped.
    pub fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.members
            .close_in(&self.side.matcher, self, E::rx_queues);
        self.wake_members();
    }
}

#[cfg(test)]
#[path = "soft_srx_tests.rs"]
mod tests;

/// What a shared receive context refuses before it matches anything: a
/// post once it is closed (`OpBadState`), receives directed by key
/// (`BadFlags`: keys are the endpoints' AVs'), and more buffers than its
/// `iov_limit` (`Inval`). Multi-receive buffers are taken: their parts
/// are disjoint ranges, so several endpoints may fill one at once.
pub fn refused_post(closed: bool, req: &RecvReq, iov_limit: usize) -> Option<Error> {
    if closed {
        Some(Error::OpBadState)
    } else if req.flags.contains(OpFlags::AUTH_KEY) {
        Some(Error::BadFlags)
    } else if req.bufs.len() > iov_limit {
        Some(Error::Inval)
    } else {
        None
    }
}
