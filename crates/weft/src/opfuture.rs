//! The future of one `async` operation, and how posting waits out a full
//! queue.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::channel::oneshot;
use weft_core::completion::{CqEntry, CqErrEntry, CqItem};
use weft_core::flags::OpFlags;
use weft_core::provider::ProviderEndpoint;
use weft_core::Error;

/// Waits out a full queue: yield first, then sleep a little longer each
/// time, so a stalled peer costs no CPU.
pub(crate) async fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        tokio::task::yield_now().await;
    } else {
        let us = (*spins as u64).min(1000);
        tokio::time::sleep(std::time::Duration::from_micros(us)).await;
    }
}

/// The completion of one `async` operation. Dropping it cancels a receive
/// that has not matched yet.
pub(crate) struct OpFuture {
    pub(crate) rx: oneshot::Receiver<CqItem>,
    pub(crate) ep: Option<Arc<dyn ProviderEndpoint>>,
    pub(crate) context: u64,
}

impl Future for OpFuture {
    type Output = std::result::Result<CqEntry, CqErrEntry>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match Pin::new(&mut self.rx).poll(cx) {
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
