//! The receive side of providers that match in software with one matcher
//! per endpoint and hold unexpected messages themselves (udp, shm): the
//! posting rules of fi_msg(3) and fi_tagged(3) — peek, claim, discard,
//! the receive credit, a held message taken at once — and the charge a
//! held message makes against the unexpected budget, written once.
//! Multi-receive buffers (`FI_MULTI_RECV`, `crate::multi_recv`) are
//! placed here too: a post takes as many held messages as fit, and an
//! arrival is given a part of the oldest buffer that accepts it.
// A refused receive hands the whole request back, as at the provider
// boundary (`provider.rs`): boxing it would cost an allocation per post.
#![allow(clippy::result_large_err)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::addr::FiAddr;
use crate::completion::CqErrEntry;
use crate::flags::OpFlags;
use crate::multi_recv;
use crate::provider::{RecvReq, Rejected};
use crate::recv_completion::{cancel_recv, complete_peek, RecvCtx};
use crate::sync::{lock, FastGuard, FastMutex};
use crate::tagmatch::{Matcher, MsgInfo, PostOutcome, RecvSpec};
use crate::Error;

/// Bytes charged against an endpoint's unexpected budget, given back on
/// drop, so no path that frees a held message can forget to.
#[derive(Debug)]
pub struct Charge {
    n: usize,
    on: Arc<AtomicUsize>,
}

impl Charge {
    /// Charges `n` to `on` if the total stays within `limit`.
    pub fn try_new(on: &Arc<AtomicUsize>, n: usize, limit: usize) -> Option<Charge> {
        on.fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
            c.checked_add(n).filter(|&t| t <= limit)
        })
        .ok()
        .map(|_| Charge { n, on: on.clone() })
    }

    /// Charges `n` whatever the total (a message admitted once already,
    /// given back by a dropped receive future).
    pub fn force(on: &Arc<AtomicUsize>, n: usize) -> Charge {
        on.fetch_add(n, Ordering::AcqRel);
        Charge { n, on: on.clone() }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.on.fetch_sub(self.n, Ordering::AcqRel);
    }
}

/// The matching criteria of a receive: by key with `FI_AUTH_KEY`, which
/// only [`post_recv_keyed`]'s callers let through.
pub fn spec_of(req: &RecvReq) -> RecvSpec {
    RecvSpec {
        by_key: req.flags.contains(OpFlags::AUTH_KEY),
        src: req.src,
        tagged: req.tagged,
        tag: req.tag,
        ignore: req.ignore,
        context: req.done.context,
    }
}

/// Posts `req` to `matcher`. Refused first, the request handed back:
/// `FI_AUTH_KEY` (`BadFlags`: these providers take no keys) and more
/// than `iov_limit` buffers (`Inval`). Then a peek (`FI_PEEK`, with
/// `FI_CLAIM` or `FI_DISCARD`) reports a held message; a claim takes the
/// message its peek claimed (or discards it); any other receive takes a
/// receive credit (`Again` without one) and the oldest held message it
/// accepts, or waits posted; a multi-receive buffer takes every held
/// message it accepts that fits, each into a part of its own, and waits
/// posted while it has room. `resolve` gives the AV handle of a held
/// message's sender; `deliver` completes a receive with a held message
/// (giving back the credit, as every delivery does).
pub fn post_recv<U, S>(
    ep: &dyn RecvCtx,
    matcher: &FastMutex<Matcher<RecvReq, U, S>>,
    req: RecvReq,
    iov_limit: usize,
    resolve: &dyn Fn(&S) -> FiAddr,
    deliver: &dyn Fn(RecvReq, MsgInfo, U),
) -> std::result::Result<(), Rejected<RecvReq>> {
    post_recv_keyed(ep, matcher, req, iov_limit, None, resolve, deliver)
}

/// [`post_recv`] for an endpoint that may take keys from its AV
/// (`FI_AV_AUTH_KEY`): with `holds` (`Some` on such an endpoint), a
/// receive with `FI_AUTH_KEY` takes only messages whose sender proved
/// the key handle in its `src`, and is `Inval` when `holds` says the
/// endpoint was not enabled with that key; without `holds` the flag is
/// `BadFlags`, as in [`post_recv`].
#[inline]
pub fn post_recv_keyed<U, S>(
    ep: &dyn RecvCtx,
    matcher: &FastMutex<Matcher<RecvReq, U, S>>,
    req: RecvReq,
    iov_limit: usize,
    holds: Option<&dyn Fn(FiAddr) -> bool>,
    resolve: &dyn Fn(&S) -> FiAddr,
    deliver: &dyn Fn(RecvReq, MsgInfo, U),
) -> std::result::Result<(), Rejected<RecvReq>> {
    match lock_plain(ep, matcher, &req, iov_limit) {
        Some(m) => {
            post_locked(m, req, resolve, deliver);
            Ok(())
        }
        None => post_recv_other(ep, matcher, req, iov_limit, holds, resolve, deliver),
    }
}

/// The first half of posting a plain receive (the usual one: no key,
/// peek or claim, not a multi-receive buffer, within `iov_limit`), done
/// on the request where it lies: its receive credit taken and the
/// matcher locked, for [`post_locked`]. `None` for every other receive,
/// and for one without a credit: [`post_recv_keyed`] sorts those out.
///
/// Apart so that a provider moves the request only once the lock is
/// held: moved into a callee before the lock's atomic operations, it
/// was copied onto the stack first (the compiler does not carry a
/// request's bytes across them) and from there into the queue, about 16
/// instructions a receive more.
#[inline(always)]
pub fn lock_plain<'m, U, S>(
    ep: &dyn RecvCtx,
    matcher: &'m FastMutex<Matcher<RecvReq, U, S>>,
    req: &RecvReq,
    iov_limit: usize,
) -> Option<PlainLocked<'m, U, S>> {
    let rare = OpFlags::AUTH_KEY | OpFlags::PEEK | OpFlags::CLAIM;
    if req.flags.intersects(rare)
        || req.bufs.len() > iov_limit
        || multi_recv::is_buffer(req)
        || !ep.rx_credits().try_take()
    {
        return None;
    }
    Some(PlainLocked(lock(matcher)))
}

/// What [`lock_plain`] gives [`post_locked`]: the matcher, locked, with a
/// receive credit taken for the request. Dropped without
/// [`post_locked`], that credit would be lost.
#[must_use = "the receive credit taken is lost unless post_locked queues the request"]
pub struct PlainLocked<'m, U, S>(FastGuard<'m, Matcher<RecvReq, U, S>>);

impl<U, S> std::fmt::Debug for PlainLocked<'_, U, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PlainLocked")
    }
}

/// Posts a plain receive (its credit taken) into the matcher `m`,
/// locked, and delivers the held message it matches, if one does, once
/// the lock is let go.
#[inline(always)]
pub fn post_locked<U, S>(
    PlainLocked(mut m): PlainLocked<'_, U, S>,
    req: RecvReq,
    resolve: &dyn Fn(&S) -> FiAddr,
    deliver: &dyn Fn(RecvReq, MsgInfo, U),
) {
    let spec = spec_of(&req);
    // Nothing held (the usual case): queued, with no outcome to carry
    // the request (through one it was copied twice more).
    if m.unexpected_len() == 0 {
        m.queue(spec, req);
        return;
    }
    let out = m.post_at(spec, req, resolve, false);
    drop(m);
    if let PostOutcome::Matched {
        recv,
        info,
        payload,
        ..
    } = out
    {
        deliver(recv, info, payload);
    }
}

/// [`post_recv_keyed`] of every receive but a plain one with a credit
/// free: a key, a peek or claim, too many buffers, a multi-receive
/// buffer, or no credit.
#[cold]
#[inline(never)]
fn post_recv_other<U, S>(
    ep: &dyn RecvCtx,
    matcher: &FastMutex<Matcher<RecvReq, U, S>>,
    req: RecvReq,
    iov_limit: usize,
    holds: Option<&dyn Fn(FiAddr) -> bool>,
    resolve: &dyn Fn(&S) -> FiAddr,
    deliver: &dyn Fn(RecvReq, MsgInfo, U),
) -> std::result::Result<(), Rejected<RecvReq>> {
    if req.flags.contains(OpFlags::AUTH_KEY) {
        let err = match holds {
            None => Some(Error::BadFlags),
            Some(h) if !h(req.src) => Some(Error::Inval),
            Some(_) => None,
        };
        if let Some(err) = err {
            return Err(Rejected { err, req });
        }
    }
    if req.bufs.len() > iov_limit {
        return Err(Rejected {
            err: Error::Inval,
            req,
        });
    }
    let spec = spec_of(&req);
    if req.flags.contains(OpFlags::PEEK) {
        let r = lock(matcher).peek(&spec, req.flags, resolve);
        match r {
            Ok(info) => complete_peek(ep, req, info),
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
        let r = lock(matcher).claim(spec.context, discard);
        match r {
            Ok((info, Some(held))) => {
                // Delivered through the normal path, which gives back
                // one receive credit.
                ep.rx_credits().take();
                deliver(req, info, held);
            }
            Ok((info, None)) => complete_peek(ep, req, info),
            Err(e) => req.done.fail(CqErrEntry::new(0, OpFlags::RECV, e)),
        }
        return Ok(());
    }
    if !ep.rx_credits().try_take() {
        return Err(Rejected {
            err: Error::Again,
            req,
        });
    }
    if !multi_recv::is_buffer(&req) {
        post_locked(PlainLocked(lock(matcher)), req, resolve, deliver);
        return Ok(());
    }
    // All the held messages a buffer takes are taken under one hold of
    // the lock, so none that arrives meanwhile can pass them.
    let out = lock(matcher).post_by(spec, req, resolve, &mut multi_recv::take, false);
    for (recv, info, payload) in out.matched {
        deliver(recv, info, payload);
    }
    Ended(out.ended.into_iter().collect()).report(ep);
    Ok(())
}

/// Multi-receive buffers that left the matcher without the message they
/// were offered (it did not fit what was left, or nobody reads their
/// stream any more): their release is reported by [`Ended::report`],
/// once the matcher's lock is let go.
#[derive(Debug, Default)]
#[must_use = "an ended buffer must be reported, or its receive credit is lost"]
pub struct Ended(Vec<RecvReq>);

impl Ended {
    /// Reports the releases. Call with no lock of the endpoint held.
    #[inline]
    pub fn report(self, ep: &dyn RecvCtx) {
        // Almost always none: every arrival carries one of these.
        if !self.0.is_empty() {
            self.report_all(ep);
        } else if self.0.capacity() == 0 {
            // Nothing to free: skip the out-of-line drop of the list.
            std::mem::forget(self);
        }
    }

    fn report_all(self, ep: &dyn RecvCtx) {
        for r in self.0 {
            multi_recv::end(ep, r, false);
        }
    }
}

/// An arriving message of `info`: the receive that takes it (a plain
/// receive whole, or the part of a multi-receive buffer cut for it), or
/// `None` to hold it. Called with the matcher locked; the buffers it
/// ended are reported once that lock is let go.
#[inline(always)]
pub fn arrival<U, S>(m: &mut Matcher<RecvReq, U, S>, info: &MsgInfo) -> (Option<RecvReq>, Ended) {
    let mut ended = Vec::new();
    let got = m.arrival_by(info, &mut multi_recv::take, &mut ended);
    (got, Ended(ended))
}

/// [`arrival`] that adds the buffers it ended to `ended`: the receive
/// comes back alone, not in a pair, which spares the caller a move of it.
#[inline(always)]
pub fn arrival_into<U, S>(
    m: &mut Matcher<RecvReq, U, S>,
    info: &MsgInfo,
    ended: &mut Ended,
) -> Option<RecvReq> {
    m.arrival_by(info, &mut multi_recv::take, &mut ended.0)
}

/// Holds a message given back by a receive whose future was dropped:
/// ahead of every held message, or with `after` (a dropped
/// multi-receive stream's, handed back in order) behind those given
/// back before it.
pub fn hold_given_back<U, S>(
    m: &mut Matcher<RecvReq, U, S>,
    src: S,
    info: MsgInfo,
    payload: U,
    after: bool,
) {
    if after {
        m.push_unexpected_front_after(src, info, payload);
    } else {
        m.push_unexpected_front(src, info, payload);
    }
}

/// Withdraws the posted receive with `context` from `matcher`, ending it
/// with `Canceled`; false when none is posted.
pub fn cancel<U, S>(
    ep: &dyn RecvCtx,
    matcher: &FastMutex<Matcher<RecvReq, U, S>>,
    context: u64,
) -> bool {
    let r = lock(matcher).cancel(context);
    match r {
        Some((_, req)) => {
            cancel_recv(ep, req);
            true
        }
        None => false,
    }
}

#[cfg(test)]
#[path = "soft_rx_tests.rs"]
mod multi_tests;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn charges_stop_at_the_limit_and_come_back_on_drop() {
        let on = Arc::new(AtomicUsize::new(0));
        let a = Charge::try_new(&on, 600, 1000).unwrap();
        assert!(Charge::try_new(&on, 600, 1000).is_none());
        let b = Charge::try_new(&on, 400, 1000).unwrap();
        assert_eq!(on.load(Ordering::Acquire), 1000);
        // A message given back is charged past the limit.
        let c = Charge::force(&on, 512);
        assert_eq!(on.load(Ordering::Acquire), 1512);
        drop((a, b, c));
        assert_eq!(on.load(Ordering::Acquire), 0);
        assert!(Charge::try_new(&on, usize::MAX, usize::MAX).is_some());
    }
}
