//! Ending a matched receive: the completion entry (flags, source, tag,
//! data, truncation) is the same for every provider that matches in
//! software; only the receive credits and the AV that reports sources
//! are the endpoint's own.

use bytes::BytesMut;

use crate::addr::{FiAddr, FI_ADDR_NOTAVAIL};
use crate::completion::{trim_bufs, CqEntry, CqErrEntry, OpDone, Returned};
use crate::credits::Credits;
use crate::flags::OpFlags;
use crate::multi_recv;
use crate::provider::RecvReq;
use crate::tagmatch::MsgInfo;
use crate::Error;

/// What an endpoint lends to the completion of its receives.
pub trait RecvCtx {
    /// The receive credits a completed receive gives back.
    fn rx_credits(&self) -> &Credits;
    /// The handle to report for a known source (user ids, etc.).
    fn reported_addr(&self, a: FiAddr) -> FiAddr;
    /// Takes back a message whose receive's future was dropped as the
    /// message reached it: the next receive that accepts it gets it,
    /// ahead of later messages. Called with no lock of the endpoint held.
    fn give_back(&self, r: Returned);
    /// [`give_back`](Self::give_back) for a message of a multi-receive
    /// buffer whose stream is gone: such messages come back in their
    /// order, so each goes behind the ones given back before it (still
    /// ahead of later arrivals). By default, `give_back`.
    fn give_back_after(&self, r: Returned) {
        self.give_back(r)
    }
}

impl<T: RecvCtx> RecvCtx for std::sync::Arc<T> {
    fn rx_credits(&self) -> &Credits {
        (**self).rx_credits()
    }

    fn reported_addr(&self, a: FiAddr) -> FiAddr {
        (**self).reported_addr(a)
    }

    fn give_back(&self, r: Returned) {
        (**self).give_back(r)
    }

    fn give_back_after(&self, r: Returned) {
        (**self).give_back_after(r)
    }
}

/// An endpoint's [`RecvCtx`] with the source to report for one AV
/// handle already known: a provider that found a sender's handle and
/// its reported form (user id, key) under one AV lock per message
/// passes this instead of `ep`, so completing the receive does not look
/// the same handle up again.
pub struct KnownSource<'a, C: ?Sized> {
    /// The endpoint.
    pub ep: &'a C,
    /// The sender's AV handle.
    pub handle: FiAddr,
    /// What a completion reports for `handle`.
    pub shown: FiAddr,
}

// By hand: the endpoint need not be `Debug`, and the handle and what it
// reports are what tell one wrapper from another.
impl<C: ?Sized> std::fmt::Debug for KnownSource<'_, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KnownSource")
            .field("handle", &self.handle)
            .field("shown", &self.shown)
            .finish_non_exhaustive()
    }
}

impl<C: RecvCtx + ?Sized> RecvCtx for KnownSource<'_, C> {
    fn rx_credits(&self) -> &Credits {
        self.ep.rx_credits()
    }

    fn reported_addr(&self, a: FiAddr) -> FiAddr {
        if a == self.handle {
            self.shown
        } else {
            self.ep.reported_addr(a)
        }
    }

    fn give_back(&self, r: Returned) {
        self.ep.give_back(r)
    }

    fn give_back_after(&self, r: Returned) {
        self.ep.give_back_after(r)
    }
}

/// Hands a message whose receive's future is gone back to `ep`: a
/// multi-receive part's behind the ones given back before it.
fn hand_back(ep: &dyn RecvCtx, r: Returned, piece: bool) {
    if piece {
        ep.give_back_after(r);
    } else {
        ep.give_back(r);
    }
}

/// Completion flags and reported source of a receive of `info`.
fn recv_meta(ep: &dyn RecvCtx, info: &MsgInfo) -> (OpFlags, FiAddr) {
    let mut flags = OpFlags::RECV | OpFlags::msg_or_tagged(info.tagged);
    if info.data.is_some() {
        flags |= OpFlags::REMOTE_CQ_DATA;
    }
    let src = if info.src == FI_ADDR_NOTAVAIL {
        FI_ADDR_NOTAVAIL
    } else {
        ep.reported_addr(info.src)
    };
    (flags, src)
}

/// Copies a fully buffered message into a receive and completes it.
pub fn copy_and_deliver(ep: &dyn RecvCtx, mut req: RecvReq, info: MsgInfo, data: &[u8]) {
    let placed = copy_in(&mut req, data);
    deliver(ep, req, info, placed);
}

/// Copies as much of `data` as the receive's buffers hold into them, in
/// order; returns how much that was.
pub fn copy_in(req: &mut RecvReq, data: &[u8]) -> usize {
    let mut placed = 0;
    for b in req.bufs.iter_mut() {
        let n = b.len().min(data.len() - placed);
        b[..n].copy_from_slice(&data[placed..placed + n]);
        placed += n;
        if placed == data.len() {
            break;
        }
    }
    placed
}

/// Completes a receive into which `placed` bytes of `info.len` went: a
/// message larger than the buffers is a `Trunc` error with `olen` set. A
/// whole message whose receive's future is gone goes back to `ep`. Call
/// with no lock of the endpoint held.
#[inline]
pub fn deliver(ep: &dyn RecvCtx, mut req: RecvReq, info: MsgInfo, placed: usize) {
    let piece = multi_recv::is_piece(&req);
    let after = multi_recv::finishing(ep, &mut req);
    trim_bufs(&mut req.bufs, placed);
    report(ep, req.bufs, &mut req.done, piece, after, &info, placed);
}

/// [`deliver`] of a request the caller keeps: everything it owns (its
/// buffers, its completion, its multi-receive part) is taken out of it,
/// and what is left owns nothing, so the caller may forget it rather
/// than run its drop ([`RecvReq::owns_nothing`] says so). Call with no
/// lock of the endpoint held. A receive request is large, and every
/// hand-over of one by value copies it.
#[inline]
pub fn deliver_in(ep: &dyn RecvCtx, req: &mut RecvReq, info: &MsgInfo, placed: usize) {
    let piece = multi_recv::is_piece(req);
    let after = multi_recv::finishing(ep, req);
    // Every field named, none by `..`: a field added to `RecvReq` fails
    // to compile here until it is either taken below (it owns something
    // the caller's forget would leak) or listed as plain data.
    let RecvReq {
        src: _,
        bufs,
        tagged: _,
        tag: _,
        ignore: _,
        flags: _,
        done,
        multi,
    } = req;
    let _part = multi.take();
    trim_bufs(bufs, placed);
    // The completion stays in the request: `report` takes only its
    // handles out, which leaves it owning nothing.
    report(ep, std::mem::take(bufs), done, piece, after, info, placed);
}

/// The part [`deliver`] and [`deliver_in`] share once the request's
/// buffers are out of it: the entry (or the `Trunc` error) reported
/// through `done`, whose handles are taken out of it (so a request it
/// lies in owns nothing after), a message whose future is gone handed
/// back, and a
/// finished multi-receive buffer's release reported after it. Always
/// inlined: both callers are on the per-message path, and out of line
/// its arguments were copied (about 14 instructions a message).
#[inline(always)]
fn report(
    ep: &dyn RecvCtx,
    bufs: Vec<BytesMut>,
    done: &mut OpDone,
    piece: bool,
    after: Option<multi_recv::After>,
    info: &MsgInfo,
    placed: usize,
) {
    let (flags, src) = recv_meta(ep, info);
    if info.len > placed {
        let mut ee = CqErrEntry::new(0, flags, Error::Trunc);
        ee.len = placed;
        ee.olen = info.len - placed;
        ee.bufs = bufs;
        ee.data = info.data.unwrap_or(0);
        ee.tag = info.tag;
        ee.src = src;
        done.take().fail(ee);
    } else {
        let entry = CqEntry {
            context: 0,
            flags,
            len: placed,
            bufs,
            data: info.data.unwrap_or(0),
            tag: info.tag,
            src,
        };
        if let Some(back) = done.complete_from_in(entry, info.src) {
            hand_back(ep, back, piece);
        }
    }
    if let Some(a) = after {
        a.report();
    }
}

/// [`deliver`] for a message from a sender that is not in the AV on an
/// endpoint with `FI_SOURCE_ERR`: the message is placed as usual and
/// reported as an `AddrNotAvail` error whose `err_data` is the sender's
/// address `raw` and whose `src` is `reported` (fi_cq(3)). A truncated
/// message is a `Trunc` error as in [`deliver`].
pub fn deliver_unknown(
    ep: &dyn RecvCtx,
    mut req: RecvReq,
    info: MsgInfo,
    placed: usize,
    reported: FiAddr,
    raw: Vec<u8>,
) {
    if info.len > placed {
        deliver(ep, req, info, placed);
        return;
    }
    let piece = multi_recv::is_piece(&req);
    let after = multi_recv::finishing(ep, &mut req);
    trim_bufs(&mut req.bufs, placed);
    let (flags, _) = recv_meta(ep, &info);
    let mut ee = CqErrEntry::new(0, flags, Error::AddrNotAvail);
    ee.len = placed;
    ee.bufs = req.bufs;
    ee.data = info.data.unwrap_or(0);
    ee.tag = info.tag;
    ee.src = reported;
    ee.err_data = raw;
    if let Some(back) = req.done.fail_from(ee, info.src) {
        hand_back(ep, back, piece);
    }
    if let Some(a) = after {
        a.report();
    }
}

/// Fails a receive that was matched to a message which did not arrive
/// whole, giving back its credit and whatever bytes it holds.
pub fn fail_recv(ep: &dyn RecvCtx, mut req: RecvReq, info: MsgInfo, placed: usize, err: Error) {
    let after = multi_recv::finishing(ep, &mut req);
    trim_bufs(&mut req.bufs, placed);
    let (flags, src) = recv_meta(ep, &info);
    let mut e = CqErrEntry::new(0, flags, err);
    e.len = placed;
    e.tag = info.tag;
    e.data = info.data.unwrap_or(0);
    e.src = src;
    e.bufs = req.bufs;
    req.done.fail(e);
    if let Some(a) = after {
        a.report();
    }
}

/// Ends a posted receive that will not be filled (cancelled, or its
/// connection is gone) with `Canceled`, giving back its credit. A
/// multi-receive buffer is released with what it holds: its `Canceled`
/// error carries `FI_MULTI_RECV` and comes after the completions of the
/// messages it had taken.
pub fn cancel_recv(ep: &dyn RecvCtx, req: RecvReq) {
    if multi_recv::is_buffer(&req) {
        multi_recv::end(ep, req, true);
        return;
    }
    ep.rx_credits().release(1);
    // The buffers come back with the entry, as on verbs: a pool buffer
    // must find its way home.
    req.done
        .fail(CqErrEntry::new(0, OpFlags::RECV, Error::Canceled).with_bufs(req.bufs));
}

/// Completes a peek (or a discard): the message's length, tag and data are
/// reported, no bytes are placed.
pub fn complete_peek(ep: &dyn RecvCtx, mut req: RecvReq, info: MsgInfo) {
    trim_bufs(&mut req.bufs, 0);
    let (flags, src) = recv_meta(ep, &info);
    req.done.complete(CqEntry {
        context: 0,
        flags,
        len: info.len,
        bufs: req.bufs,
        data: info.data.unwrap_or(0),
        tag: info.tag,
        src,
    });
}
