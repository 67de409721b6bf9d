//! The future of one `async` operation, and how posting waits out a full
//! queue.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::BytesMut;
use futures::channel::oneshot;
use weft_core::addr::FiAddr;
use weft_core::completion::{CqEntry, CqErrEntry, Finished, Origin, Returned};
use weft_core::flags::OpFlags;
use weft_core::progress::{InlineWait, Progress};
use weft_core::provider::{ProviderEndpoint, ProviderSrx, Rejected};
use weft_core::Error;

/// Posts `req`, waiting out a full queue (`Again`): yield first, then
/// sleep a little longer each time, so a stalled peer costs no CPU. Any
/// other refusal hands the request back.
///
/// The first try is made here and the waiting (with its timer) is boxed:
/// a queue with room is the common case, and the futures that embed this
/// one are moved (copied) whole by each combinator that takes them.
pub(crate) async fn post_when_room<T>(
    req: T,
    post: impl Fn(T) -> Result<(), Rejected<T>>,
) -> Result<(), Rejected<T>> {
    match post(req) {
        Err(Rejected {
            err: Error::Again,
            req,
        }) => Box::pin(wait_then_post(req, post)).await,
        done => done,
    }
}

/// [`post_when_room`] once the queue was found full.
pub(crate) async fn wait_then_post<T>(
    mut req: T,
    post: impl Fn(T) -> Result<(), Rejected<T>>,
) -> Result<(), Rejected<T>> {
    let mut spins = 0u32;
    loop {
        wait_for_room(&mut spins).await;
        match post(req) {
            Err(Rejected {
                err: Error::Again,
                req: r,
            }) => req = r,
            done => return done,
        }
    }
}

/// One wait for room in a full queue, the `spins`-th: yield first, then
/// sleep a little longer each time.
pub(crate) async fn wait_for_room(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        tokio::task::yield_now().await;
    } else {
        let us = u64::from(*spins).min(1000);
        tokio::time::sleep(std::time::Duration::from_micros(us)).await;
    }
}

/// The future of an `async` send or receive: nothing happens until it is
/// first polled, which starts the operation (`start`: checks, posts) and
/// then awaits its completion.
///
/// Written out rather than an `async fn` for its size. A generated state
/// machine keeps the arguments, every local alive across an await and the
/// awaited futures side by side — about a kilobyte for a tagged send,
/// which `timeout`, `select!` and `join!` copy whenever they move it
/// (measured: a tenth of the instructions of a 64 B round trip went to
/// `memcpy`). Here the future is the larger of what starts the operation
/// and the [`OpFuture`] that awaits it.
pub(crate) enum Lazy<'a, S> {
    /// Not polled yet: what starts the operation.
    Start(S),
    /// Posted; awaiting the completion.
    Posted(OpFuture),
    /// The uncommon path (a full queue), boxed so that it does not size
    /// the common one.
    Boxed(BoxedOp<'a>),
    /// Resolved.
    Gone,
}

/// A boxed operation future (see [`Lazy::Boxed`]).
pub(crate) type BoxedOp<'a> =
    Pin<Box<dyn Future<Output = std::result::Result<CqEntry, CqErrEntry>> + Send + 'a>>;

/// What starting an operation gave.
pub(crate) enum Started<'a> {
    Posted(OpFuture),
    Failed(CqErrEntry),
    Boxed(BoxedOp<'a>),
}

impl<'a, S: FnOnce() -> Started<'a> + Unpin> Lazy<'a, S> {
    pub(crate) fn new(start: S) -> Self {
        Lazy::Start(start)
    }
}

impl<'a, S: FnOnce() -> Started<'a> + Unpin> Future for Lazy<'a, S> {
    type Output = std::result::Result<CqEntry, CqErrEntry>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if matches!(this, Lazy::Start(_)) {
            if let Lazy::Start(start) = std::mem::replace(this, Lazy::Gone) {
                *this = match start() {
                    Started::Posted(f) => Lazy::Posted(f),
                    Started::Boxed(f) => Lazy::Boxed(f),
                    Started::Failed(e) => return Poll::Ready(Err(e)),
                };
            }
        }
        let polled = match this {
            Lazy::Posted(f) => Pin::new(f).poll(cx),
            Lazy::Boxed(f) => f.as_mut().poll(cx),
            // Polled again after it resolved: an error, not a panic.
            Lazy::Start(_) | Lazy::Gone => {
                return Poll::Ready(Err(CqErrEntry::new(0, OpFlags::empty(), Error::OpBadState)))
            }
        };
        if polled.is_ready() {
            *this = Lazy::Gone;
        }
        polled
    }
}

/// What a dropped receive future reaches: the endpoint it was posted on,
/// or the shared receive context.
pub(crate) enum Owner {
    Ep(Arc<dyn ProviderEndpoint>),
    Srx(Arc<dyn ProviderSrx>),
}

impl Owner {
    pub(crate) fn cancel(&self, context: u64) -> bool {
        match self {
            Owner::Ep(ep) => ep.cancel(context),
            Owner::Srx(srx) => srx.cancel(context),
        }
    }

    fn give_back(&self, r: Returned) {
        match self {
            Owner::Ep(ep) => ep.give_back(r),
            Owner::Srx(srx) => srx.give_back(r),
        }
    }

    /// Gives back a message of a dropped multi-receive stream, behind
    /// those given back before it.
    pub(crate) fn give_back_after(&self, r: Returned) {
        match self {
            Owner::Ep(ep) => ep.give_back_after(r),
            Owner::Srx(srx) => srx.give_back_after(r),
        }
    }
}

/// What dropping a receive's future does besides withdrawing it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnDrop {
    /// Nothing to withdraw (a send, an RMA operation).
    Nothing,
    /// Withdraw; a completion already sent carries no message (a peek or
    /// a discard), so it may go.
    Cancel,
    /// Withdraw; a message that already reached the receive goes back to
    /// the owner for the next receive.
    CancelOrGiveBack,
}

impl OnDrop {
    /// For a receive posted with `flags` (the endpoint's defaults merged).
    pub(crate) fn for_recv(flags: OpFlags) -> OnDrop {
        if flags.intersects(OpFlags::PEEK | OpFlags::DISCARD) {
            OnDrop::Cancel
        } else {
            OnDrop::CancelOrGiveBack
        }
    }
}

/// The completion of one `async` operation. Dropping it withdraws a
/// receive that has not matched yet, and gives back a message that
/// reached the receive but was never read.
pub(crate) struct OpFuture {
    rx: oneshot::Receiver<Finished>,
    owner: Option<Owner>,
    on_drop: OnDrop,
    context: u64,
    /// Inline mode: the endpoint's progress, driven while waiting.
    progress: Option<Arc<dyn Progress>>,
    wait: InlineWait,
    /// Where the message came from, kept when the completion arrives
    /// (only for [`reclaim`](Self::reclaim), which may hand it on).
    origin: Option<(FiAddr, Origin)>,
    keep_origin: bool,
}

impl OpFuture {
    /// The future of the operation posted with `context`, completing
    /// through `rx`. `owner`: what withdraws it if the future is dropped
    /// first (receives); `progress`: what an inline waiter drives.
    pub(crate) fn new(
        rx: oneshot::Receiver<Finished>,
        context: u64,
        owner: Option<Owner>,
        on_drop: OnDrop,
        progress: Option<Arc<dyn Progress>>,
    ) -> OpFuture {
        OpFuture {
            rx,
            owner: owner.filter(|_| on_drop != OnDrop::Nothing),
            on_drop,
            context,
            progress,
            wait: InlineWait::new(),
            origin: None,
            keep_origin: false,
        }
    }

    /// What a future whose operation must give its buffers back (pool
    /// buffers) does instead of being dropped: withdraws a receive that
    /// has not matched, waits for the operation to end, and resolves with
    /// the buffers. A message that reached the receive meanwhile goes to
    /// the endpoint's next receive as a copy, as a dropped future's would
    /// (later, though: after the endpoint may have delivered messages
    /// that arrived after it).
    pub(crate) async fn reclaim(mut self) -> Vec<BytesMut> {
        let owner = self.owner.take();
        if let Some(o) = &owner {
            o.cancel(self.context);
        }
        self.keep_origin = true;
        let done = Pin::new(&mut self).await;
        let give_back = owner.filter(|_| self.on_drop == OnDrop::CancelOrGiveBack);
        // Only a completion that carries a whole message has one to hand
        // on (as for `Returned::from_finished`); any other gives back
        // just its buffers.
        let (item, (src, origin)) = match (done, self.origin.take()) {
            (Ok(e), Some(o)) => (Ok(e), o),
            (Err(e), Some(o)) if e.err == Error::AddrNotAvail => (Err(e), o),
            (Ok(e), None) => return e.bufs,
            (Err(e), _) => return e.bufs,
        };
        let Some(mut back) = Returned::from_parts(item, src, origin) else {
            return Vec::new();
        };
        let bufs = std::mem::take(&mut back.entry.bufs);
        if let Some(o) = give_back {
            back.entry.bufs = bufs.iter().map(|b| BytesMut::from(&b[..])).collect();
            o.give_back(back);
        }
        bufs
    }
}

impl Future for OpFuture {
    type Output = std::result::Result<CqEntry, CqErrEntry>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut polled = Pin::new(&mut self.rx).poll(cx);
        let this = &mut *self;
        if polled.is_pending() {
            if let Some(p) = &this.progress {
                let rx = &mut this.rx;
                if let Some(r) = this.wait.poll(
                    cx,
                    p.spin_hint(),
                    || p.progress(),
                    |cx| match Pin::new(&mut *rx).poll(cx) {
                        Poll::Ready(r) => Some(r),
                        Poll::Pending => None,
                    },
                    || p.idle(),
                ) {
                    polled = Poll::Ready(r);
                }
            }
        } else if let Some(p) = &this.progress {
            // Delivered by another path (the reactor, after a sleep):
            // the wait still tells the hint how long it took.
            this.wait.finish(p.spin_hint());
        }
        match polled {
            Poll::Ready(Ok(done)) => {
                self.owner = None;
                if self.keep_origin {
                    let (item, src, origin) = done.into_parts(self.context);
                    self.origin = Some((src, origin));
                    return Poll::Ready(item);
                }
                Poll::Ready(done.into_result(self.context))
            }
            Poll::Ready(Err(_)) => {
                self.owner = None;
                Poll::Ready(Err(CqErrEntry::new(
                    self.context,
                    OpFlags::empty(),
                    Error::Canceled,
                )))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for OpFuture {
    fn drop(&mut self) {
        let Some(owner) = self.owner.take() else {
            return;
        };
        // Closed first: a completion racing this drop either is already
        // in the channel (taken below) or finds it closed and comes back
        // to its provider, which hands the message on itself.
        self.rx.close();
        if owner.cancel(self.context) {
            return;
        }
        if self.on_drop != OnDrop::CancelOrGiveBack {
            return;
        }
        if let Some(back) = self
            .rx
            .try_recv()
            .ok()
            .flatten()
            .and_then(Returned::from_finished)
        {
            owner.give_back(back);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use std::sync::atomic::{AtomicBool, Ordering};

    use futures::FutureExt;

    use super::*;

    #[test]
    fn nothing_starts_before_the_first_poll_and_a_second_poll_is_an_error() {
        let started = AtomicBool::new(false);
        let mut f = Lazy::new(|| {
            started.store(true, Ordering::Relaxed);
            Started::Failed(CqErrEntry::new(7, OpFlags::SEND, Error::MsgSize))
        });
        assert!(!started.load(Ordering::Relaxed));
        let Some(Err(e)) = (&mut f).now_or_never() else {
            panic!("not resolved with the start's error");
        };
        assert!(started.load(Ordering::Relaxed));
        assert_eq!((e.context, e.err), (7, Error::MsgSize));
        let Some(Err(again)) = f.now_or_never() else {
            panic!("a resolved future polled again did not answer");
        };
        assert_eq!(again.err, Error::OpBadState);
    }

    #[test]
    fn a_boxed_start_is_awaited_through() {
        let f = Lazy::new(|| {
            Started::Boxed(Box::pin(async {
                tokio::task::yield_now().await;
                Ok(CqEntry {
                    context: 3,
                    ..CqEntry::default()
                })
            }))
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert_eq!(rt.block_on(f).unwrap().context, 3);
    }
}
