//! Multi-receive buffers (`FI_MULTI_RECV`, fi_msg(3)): one posted buffer
//! takes many untagged messages, packed one after another from its
//! start, each reported by a completion of its own; once the space left
//! falls below the endpoint's `FI_OPT_MIN_MULTI_RECV` the buffer is
//! released, and the last completion of it carries `FI_MULTI_RECV`.
//!
//! A buffer sits in the matcher as one posted receive ([`MultiPart::Buffer`]).
//! A message it accepts is given a part of it cut off the front of the
//! free space (`BytesMut::split_to`: the part owns its bytes, so messages
//! from several connections are read in at once and none can write into
//! another's part), completed like any receive ([`MultiPart::Piece`]).
//! Messages never straddle: one that does not fit the space left releases
//! the buffer (a completion without a message carries the flag) and goes
//! on to the next receive, or waits for one; only a message larger than a
//! whole unused buffer is truncated into it, as into any receive.
//!
//! The release is reported by the last completion of the buffer, not the
//! last message matched: parts still arriving when the buffer is released
//! (from other senders) complete first, and whichever is the last to
//! complete carries the flag. It is reported even under selective
//! completion (fi_msg(3): the application must learn its buffer is back).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use bytes::BytesMut;
use futures::channel::oneshot;

use crate::completion::{CqEntry, CqErrEntry, CqShared, Finished, OpDone, Waiter};
use crate::counter::CounterShared;
use crate::error::Error;
use crate::flags::OpFlags;
use crate::provider::RecvReq;
use crate::recv_completion::RecvCtx;
use crate::sync::lock;
use crate::tagmatch::Take;

/// `FI_OPT_MIN_MULTI_RECV` of a new endpoint (libfabric's tcp provider
/// uses the same 16 KiB).
pub const DEFAULT_MIN_MULTI_RECV: usize = 16 * 1024;

/// What a receive request is beyond a plain receive.
#[derive(Debug)]
pub enum MultiPart {
    /// The posted buffer: its free space is `bufs[0]` of the request.
    Buffer(Box<MultiBuf>),
    /// The part of a buffer that one message was matched to.
    Piece(Arc<MultiShared>),
}

/// A posted multi-receive buffer's progress.
#[derive(Debug)]
pub struct MultiBuf {
    /// Bytes given to messages so far.
    used: usize,
    /// Release once less than this is free.
    min: usize,
    shared: Arc<MultiShared>,
}

/// Why a buffer was released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Full (below the minimum, or a message did not fit).
    Full,
    /// `fi_cancel`, or its connection went (MSG).
    Canceled,
}

/// What the parts of one buffer share: where their completions go, and
/// the release.
#[derive(Debug)]
pub struct MultiShared {
    context: u64,
    kind: OpFlags,
    report: bool,
    cq: Option<Arc<CqShared>>,
    cntr: Option<Arc<CounterShared>>,
    /// The awaited form: each completion gets a slot of the stream.
    sink: Option<Arc<MultiSink>>,
    /// Where the buffer lies (start, length), set when its first part is
    /// cut (its parts are cut from it): which buffer a given-back message
    /// was in.
    span: std::sync::OnceLock<(usize, usize)>,
    st: Mutex<ReleaseState>,
}

#[derive(Debug, Default)]
struct ReleaseState {
    /// Parts matched and not yet completed.
    outstanding: usize,
    end: Option<End>,
    /// The free space left at the release, handed back with it.
    tail: Option<BytesMut>,
}

impl MultiShared {
    /// A completion sink like the buffer's, flagged `extra`.
    fn done(&self, extra: OpFlags) -> OpDone {
        self.done_into(extra, self.sink.as_ref().map(|s| s.waiter()))
    }

    fn done_into(&self, extra: OpFlags, waiter: Option<Waiter>) -> OpDone {
        OpDone {
            context: self.context,
            flags: self.kind | extra,
            report: self.report,
            cq: self.cq.clone(),
            cntr: self.cntr.clone(),
            waiter,
        }
    }

    /// [`done`](Self::done) for a part that is to take a message: `None`
    /// once the stream is dropped. Its slot is handed out under the same
    /// lock the drop closes the stream with, so a part either has its
    /// slot among those the drop gives back in order, or is not cut at
    /// all; a part cut after the drop would hand its message back on its
    /// own, racing (and possibly passing) the earlier ones the drop still
    /// holds.
    fn part_done(&self) -> Option<OpDone> {
        let waiter = match &self.sink {
            Some(s) => Some(s.slot()?),
            None => None,
        };
        Some(self.done_into(OpFlags::empty(), waiter))
    }

    /// Nobody reads the awaited form any more.
    fn abandoned(&self) -> bool {
        self.sink.as_ref().is_some_and(|s| s.is_closed())
    }

    /// Whether the buffer is awaited as a stream (its completions go to
    /// the stream's slots, and come back to the provider once it is
    /// dropped).
    pub fn is_awaited(&self) -> bool {
        self.sink.is_some()
    }

    /// Whether its stream was dropped: its parts' messages that complete
    /// from now on come back to their provider
    /// (`ProviderEndpoint::give_back_after`).
    pub fn is_abandoned(&self) -> bool {
        self.abandoned()
    }

    /// Whether its stream was dropped and the drop has given back every
    /// message its slots held ([`MultiSink::given_back`]): every part not
    /// yet completed then finds its slot closed.
    pub fn is_drained(&self) -> bool {
        self.sink.as_ref().is_some_and(|s| s.is_drained())
    }

    /// Whether `addr` lies in this buffer (always false before a part
    /// was cut from it).
    pub fn holds(&self, addr: usize) -> bool {
        self.span
            .get()
            .is_some_and(|&(start, len)| addr >= start && addr - start < len)
    }

    /// The buffer is released with `tail` unused; `Some` when no part is
    /// outstanding, so the release is reported now (by the caller).
    fn release(&self, end: End, tail: BytesMut) -> Option<(End, BytesMut)> {
        let mut g = lock(&self.st);
        if g.end.is_some() {
            return None;
        }
        g.end = Some(end);
        if g.outstanding == 0 {
            return Some((end, tail));
        }
        g.tail = Some(tail);
        None
    }

    /// Reports a release that no message completion carries: a
    /// completion without a message, or the `Canceled` error of a
    /// cancel, both flagged `FI_MULTI_RECV`, handing back the space left.
    /// (The caller gives back the buffer's receive credit.)
    fn report_release(&self, end: End, tail: BytesMut) {
        let mut done = self.done(OpFlags::MULTI_RECV);
        // Reported even under selective completion (fi_msg(3)).
        done.report = true;
        let mut tail = tail;
        match end {
            End::Full => {
                // No message: FI_RECV | FI_MULTI_RECV, without FI_MSG.
                done.flags -= OpFlags::MSG;
                tail.truncate(0);
                done.complete(CqEntry {
                    bufs: vec![tail],
                    src: crate::addr::FI_ADDR_NOTAVAIL,
                    ..CqEntry::default()
                });
            }
            End::Canceled => {
                done.fail(CqErrEntry::new(0, OpFlags::RECV, Error::Canceled).with_bufs(vec![tail]))
            }
        }
    }
}

impl Drop for MultiShared {
    fn drop(&mut self) {
        // Neither the buffer nor any part of it is left (released, or its
        // endpoint closed): the stream has seen everything it will see.
        if let Some(s) = &self.sink {
            s.producer_gone();
        }
    }
}

/// Makes `req` (one buffer, untagged, its flags holding `MULTI_RECV`) a
/// multi-receive buffer released below `min` free bytes. Its completions
/// go where `req.done` says, or, with `sink`, each to a slot of that
/// stream (the awaited form: `req.done.waiter` is then unused).
pub fn attach(req: &mut RecvReq, min: usize, sink: Option<Arc<MultiSink>>) {
    req.multi = Some(buffer(&req.done, min, sink));
}

/// The [`MultiPart`] that [`attach`] gives a receive completing through
/// `done`: for a request built with it in place, which is not copied
/// again to be changed afterwards.
pub fn buffer(done: &OpDone, min: usize, sink: Option<Arc<MultiSink>>) -> MultiPart {
    let shared = Arc::new(MultiShared {
        context: done.context,
        kind: done.flags,
        report: done.report,
        cq: done.cq.clone(),
        cntr: done.cntr.clone(),
        sink,
        span: std::sync::OnceLock::new(),
        st: Mutex::new(ReleaseState::default()),
    });
    MultiPart::Buffer(Box::new(MultiBuf {
        used: 0,
        min,
        shared,
    }))
}

/// Points the completions of a buffer that carry no message (a release
/// without one, a cancel) at `queues`: a shared receive context has no
/// queues of its own, so such completions of a buffer posted to one go
/// to a bound endpoint's, while each message's completion goes where its
/// part is pointed when the message arrives. For a buffer not yet posted
/// (no part cut); anything else is left as it is.
pub fn release_to(req: &mut RecvReq, queues: (Option<Arc<CqShared>>, Option<Arc<CounterShared>>)) {
    if let Some(MultiPart::Buffer(mb)) = &mut req.multi {
        if let Some(s) = Arc::get_mut(&mut mb.shared) {
            (s.cq, s.cntr) = queues;
        }
    }
}

/// True for a posted multi-receive buffer.
#[inline]
pub fn is_buffer(req: &RecvReq) -> bool {
    matches!(req.multi, Some(MultiPart::Buffer(_)))
}

/// What a posted receive gives a message of `info.len` bytes: a plain
/// receive is taken whole; a multi-receive buffer cuts a part for it off
/// its free space (the last part when the space left then falls below
/// the minimum), or ends when the message does not fit what is left (or
/// nobody reads its stream any more). Called with the buffer in place in
/// the matcher; a buffer that ends is reported by [`end`] once the
/// matcher's lock is let go.
#[inline]
pub fn take(req: &mut RecvReq, info: &crate::tagmatch::MsgInfo) -> Take<RecvReq> {
    // Every arrival asks; almost every receive is a plain one.
    if !is_buffer(req) {
        return Take::Whole;
    }
    take_part(req, info)
}

/// [`take`] of a multi-receive buffer.
fn take_part(req: &mut RecvReq, info: &crate::tagmatch::MsgInfo) -> Take<RecvReq> {
    let Some(MultiPart::Buffer(mb)) = &mut req.multi else {
        return Take::Whole;
    };
    let len = info.len;
    let Some(free) = req.bufs.first_mut() else {
        return Take::End;
    };
    if len > free.len() && mb.used > 0 {
        return Take::End;
    }
    let Some(done) = mb.shared.part_done() else {
        return Take::End;
    };
    if mb.used == 0 {
        // Nothing cut yet: the free space is the whole buffer.
        let _ = mb.shared.span.set((free.as_ptr() as usize, free.len()));
    }
    // A message larger than the whole unused buffer takes all of it and
    // is truncated, as in any receive: skipping it would let later
    // messages from its sender overtake it.
    let piece = free.split_to(len.min(free.len()));
    mb.used += piece.len();
    let last = len > piece.len() || free.len() < mb.min;
    lock(&mb.shared.st).outstanding += 1;
    let part = RecvReq {
        src: req.src,
        bufs: vec![piece],
        tagged: false,
        tag: 0,
        ignore: 0,
        flags: req.flags,
        done,
        multi: Some(MultiPart::Piece(mb.shared.clone())),
    };
    if last {
        let tail = std::mem::take(free);
        // A part is outstanding: the release waits for it.
        let now = mb.shared.release(End::Full, tail);
        debug_assert!(now.is_none());
        Take::Last(part)
    } else {
        Take::Part(part)
    }
}

/// Ends a buffer that left the matcher without a message: full (a
/// message did not fit), withdrawn by `fi_cancel` or a flush (`canceled`),
/// or abandoned. Reported now, or by the last of its parts still
/// arriving. Call with no lock of the endpoint held.
pub fn end(ep: &dyn RecvCtx, mut req: RecvReq, canceled: bool) {
    let Some(MultiPart::Buffer(mb)) = req.multi.take() else {
        return;
    };
    let why = if canceled { End::Canceled } else { End::Full };
    let tail = req.bufs.pop().unwrap_or_default();
    if let Some((end, tail)) = mb.shared.release(why, tail) {
        ep.rx_credits().release(1);
        mb.shared.report_release(end, tail);
    }
}

/// A cancel's release that must follow the completion of the last part
/// (its credit is back already, as a plain receive's is before its
/// completion: whoever that completion wakes sees the credit).
#[derive(Debug)]
pub struct After(Arc<MultiShared>, BytesMut);

impl After {
    /// Reports it. Call with no lock of the endpoint held.
    pub fn report(self) {
        self.0.report_release(End::Canceled, self.1);
    }
}

/// Bookkeeping of a receive about to complete (called by every path that
/// ends a matched receive): a plain receive gives back its credit; a part
/// of a buffer does so only as the buffer's last completion, which then
/// carries `FI_MULTI_RECV` and the unused space (an empty last buffer) —
/// or, for a cancelled buffer, is followed by the cancel's error, which
/// `After` reports.
#[inline]
pub fn finishing(ep: &dyn RecvCtx, req: &mut RecvReq) -> Option<After> {
    // Every completed receive comes here; almost all are plain ones.
    if req.multi.is_none() {
        ep.rx_credits().release(1);
        return None;
    }
    finishing_part(ep, req)
}

/// [`finishing`] of a receive that belongs to a multi-receive buffer.
fn finishing_part(ep: &dyn RecvCtx, req: &mut RecvReq) -> Option<After> {
    let Some(MultiPart::Piece(shared)) = req.multi.take() else {
        ep.rx_credits().release(1);
        return None;
    };
    let (end, tail) = {
        let mut g = lock(&shared.st);
        g.outstanding = g.outstanding.saturating_sub(1);
        if g.outstanding > 0 || g.end.is_none() {
            return None;
        }
        (g.end, g.tail.take().unwrap_or_default())
    };
    // The buffer's credit, before its last part's completion is reported.
    ep.rx_credits().release(1);
    match end {
        Some(End::Canceled) => Some(After(shared, tail)),
        _ => {
            req.done.flags |= OpFlags::MULTI_RECV;
            // The release is reported even where selective completion
            // suppresses the other completions (fi_msg(3)).
            req.done.report = true;
            let mut tail = tail;
            tail.truncate(0);
            req.bufs.push(tail);
            None
        }
    }
}

/// True for the part of a buffer that a message was matched to.
pub fn is_piece(req: &RecvReq) -> bool {
    matches!(req.multi, Some(MultiPart::Piece(_)))
}

/// A receive going back to be placed again after its message died: a
/// part of a buffer cannot take another message (it is a fixed range of
/// the buffer), so it ends here ([`drop_piece`]; after the endpoint's
/// close, `closed`, nothing completes); any other receive is returned,
/// to be placed. Call with no lock of the endpoint held.
pub fn unless_piece(ep: &dyn RecvCtx, req: RecvReq, closed: bool) -> Option<RecvReq> {
    if !is_piece(&req) {
        return Some(req);
    }
    if !closed {
        drop_piece(ep, req);
    }
    None
}

/// The buffer that `req`, a part of one, belongs to (`None` for any
/// other receive): for providers that keep track of parts whose messages
/// are still arriving.
pub fn buffer_of(req: &RecvReq) -> Option<Arc<MultiShared>> {
    match &req.multi {
        Some(MultiPart::Piece(s)) => Some(s.clone()),
        _ => None,
    }
}

/// A part whose message died before it was whole (its sender's
/// connection ended): unlike a plain receive it cannot take another
/// message (it is a fixed range of the buffer), so its range stays
/// unused. If it was the buffer's last outstanding completion, the
/// release is reported without a message. Call with no lock of the
/// endpoint held.
pub fn drop_piece(ep: &dyn RecvCtx, mut req: RecvReq) {
    let shared = match &req.multi {
        Some(MultiPart::Piece(s)) => s.clone(),
        _ => return,
    };
    let after = finishing(ep, &mut req);
    if let Some(a) = after {
        a.report();
    } else if req.done.flags.contains(OpFlags::MULTI_RECV) {
        // `finishing` gave the buffer's credit back already.
        let tail = req.bufs.pop().unwrap_or_default();
        shared.report_release(End::Full, tail);
    }
}

/// The completions of one awaited multi-receive, in the order its
/// messages matched (the order of their places in the buffer): each
/// part's completion comes through a slot of its own.
#[derive(Debug, Default)]
pub struct MultiSink {
    st: Mutex<SinkState>,
}

#[derive(Debug, Default)]
struct SinkState {
    slots: VecDeque<oneshot::Receiver<Finished>>,
    waker: Option<Waker>,
    /// The reader is gone: completions find their slot closed and hand
    /// their messages back to the endpoint.
    closed: bool,
    /// Nothing will add a slot any more.
    gone: bool,
    /// The reader's drop gave back what its slots held.
    drained: bool,
}

impl MultiSink {
    /// A sink for a new awaited multi-receive.
    pub fn new() -> Arc<MultiSink> {
        Arc::new(MultiSink::default())
    }

    fn is_closed(&self) -> bool {
        lock(&self.st).closed
    }

    /// A slot for the next completion; after the stream's drop, one
    /// whose completion goes nowhere (a release's: nothing to give back).
    fn waiter(&self) -> Waiter {
        self.slot().unwrap_or_else(|| oneshot::channel().0)
    }

    /// A slot for the next completion, `None` once the stream is dropped
    /// (checked and handed out under one hold of the lock that
    /// [`close`](Self::close) takes).
    pub(crate) fn slot(&self) -> Option<Waiter> {
        let (tx, rx) = oneshot::channel();
        let woken = {
            let mut g = lock(&self.st);
            if g.closed {
                return None;
            }
            g.slots.push_back(rx);
            g.waker.take()
        };
        if let Some(w) = woken {
            w.wake();
        }
        Some(tx)
    }

    fn producer_gone(&self) {
        let woken = {
            let mut g = lock(&self.st);
            g.gone = true;
            g.waker.take()
        };
        if let Some(w) = woken {
            w.wake();
        }
    }

    /// The next completion in order: `Ready(None)` once the buffer and
    /// all its parts are gone and every slot was read. A slot whose part
    /// ended without a completion (its message died) is skipped.
    pub fn poll_next(&self, cx: &mut Context<'_>) -> Poll<Option<Finished>> {
        let mut g = lock(&self.st);
        loop {
            let Some(head) = g.slots.front_mut() else {
                if g.gone {
                    return Poll::Ready(None);
                }
                g.waker = Some(cx.waker().clone());
                return Poll::Pending;
            };
            match Pin::new(head).poll(cx) {
                Poll::Ready(Ok(f)) => {
                    g.slots.pop_front();
                    return Poll::Ready(Some(f));
                }
                Poll::Ready(Err(_)) => {
                    g.slots.pop_front();
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// The reader's drop has given back every message its slots held
    /// (after [`close`](Self::close)): a provider may now take the places
    /// of the buffer's parts still arriving without passing one of them.
    pub fn given_back(&self) {
        lock(&self.st).drained = true;
    }

    fn is_drained(&self) -> bool {
        lock(&self.st).drained
    }

    /// The reader goes: later completions find their slots closed (and
    /// their messages go back to the endpoint); the completions already
    /// sent, or still to come into the slots handed out, are returned in
    /// order for the reader to give back.
    pub fn close(&self) -> Vec<oneshot::Receiver<Finished>> {
        let mut g = lock(&self.st);
        g.closed = true;
        g.waker = None;
        g.slots.drain(..).collect()
    }
}

#[cfg(test)]
#[path = "multi_recv_tests.rs"]
pub(crate) mod tests;
