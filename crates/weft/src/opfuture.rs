//! The future of one `async` operation, and how posting waits out a full
//! queue.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::channel::oneshot;
use weft_core::completion::{CqEntry, CqErrEntry, CqItem};
use weft_core::flags::OpFlags;
use weft_core::progress::{InlineWait, Progress};
use weft_core::provider::{ProviderEndpoint, Rejected};
use weft_core::Error;

/// Posts `req`, waiting out a full queue (`Again`): yield first, then
/// sleep a little longer each time, so a stalled peer costs no CPU. Any
/// other refusal hands the request back.
pub(crate) async fn post_when_room<T>(
    mut req: T,
    post: impl Fn(T) -> Result<(), Rejected<T>>,
) -> Result<(), Rejected<T>> {
    let mut spins = 0u32;
    loop {
        match post(req) {
            Err(Rejected {
                err: Error::Again,
                req: r,
            }) => {
                req = r;
                spins += 1;
                if spins < 64 {
                    tokio::task::yield_now().await;
                } else {
                    let us = u64::from(spins).min(1000);
                    tokio::time::sleep(std::time::Duration::from_micros(us)).await;
                }
            }
            done => return done,
        }
    }
}

/// The completion of one `async` operation. Dropping it cancels a receive
/// that has not matched yet.
pub(crate) struct OpFuture {
    rx: oneshot::Receiver<CqItem>,
    ep: Option<Arc<dyn ProviderEndpoint>>,
    context: u64,
    /// Inline mode: the endpoint's progress, driven while waiting.
    progress: Option<Arc<dyn Progress>>,
    wait: InlineWait,
}

impl OpFuture {
    /// The future of the operation posted with `context`, completing
    /// through `rx`. `ep`: the endpoint that withdraws it if the future is
    /// dropped first (receives); `progress`: what an inline waiter drives.
    pub(crate) fn new(
        rx: oneshot::Receiver<CqItem>,
        context: u64,
        ep: Option<Arc<dyn ProviderEndpoint>>,
        progress: Option<Arc<dyn Progress>>,
    ) -> OpFuture {
        OpFuture {
            rx,
            ep,
            context,
            progress,
            wait: InlineWait::new(),
        }
    }
}

impl Future for OpFuture {
    type Output = std::result::Result<CqEntry, CqErrEntry>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut polled = Pin::new(&mut self.rx).poll(cx);
        if polled.is_pending() {
            let this = &mut *self;
            if let Some(p) = &this.progress {
                let rx = &mut this.rx;
                if let Some(r) = this.wait.poll(
                    cx,
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
        }
        match polled {
            Poll::Ready(Ok(item)) => {
                self.ep = None;
                Poll::Ready(item)
            }
            Poll::Ready(Err(_)) => {
                self.ep = None;
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
        if let Some(ep) = self.ep.take() {
            ep.cancel(self.context);
        }
    }
}
