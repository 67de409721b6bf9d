//! Completion queues as streams.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use weft_core::completion::{CqEntry, CqErrEntry, CqFormat, CqItem, CqShared};
use weft_core::progress::InlineWait;
use weft_core::Result;

/// A completion queue. As a [`Stream`] it yields every completion and
/// every error entry in order; none is ever dropped. Batch and
/// libfabric-style reads are available for throughput.
#[derive(Debug, Clone)]
pub struct CompletionQueue {
    pub(crate) shared: Arc<CqShared>,
    pub(crate) domain: u64,
    // The spin budget of this handle's stream reads (inline mode).
    wait: InlineWait,
}

impl CompletionQueue {
    pub(crate) fn new(shared: Arc<CqShared>, domain: u64) -> CompletionQueue {
        CompletionQueue {
            shared,
            domain,
            wait: InlineWait::reader(),
        }
    }

    /// The object id.
    pub fn fid(&self) -> u64 {
        self.shared.id()
    }

    /// The entry format.
    pub fn format(&self) -> CqFormat {
        self.shared.format()
    }

    /// `fi_cq_read`: up to `max` successful entries. `Avail` when an error
    /// entry is at the head, `Again` when empty.
    pub fn read(&self, max: usize) -> Result<Vec<CqEntry>> {
        self.shared.read(max)
    }

    /// `fi_cq_readerr`: the error entry at the head, or `Again`.
    pub fn read_err(&self) -> Result<CqErrEntry> {
        self.shared.read_err()
    }

    /// Takes up to `max` items (completions and errors, in order) without
    /// waiting; returns how many were appended to `out`. An empty `out`
    /// with room for `max` items may come back holding another buffer
    /// (it trades with the queue's instead of moving every item).
    pub fn try_read_batch(&self, out: &mut Vec<CqItem>, max: usize) -> usize {
        self.shared.pop_batch(out, max)
    }

    /// Waits for at least one item, then takes up to `max`.
    /// Returns 0 only once the queue is closed and drained. `out` as in
    /// [`try_read_batch`](Self::try_read_batch).
    pub async fn read_batch(&self, out: &mut Vec<CqItem>, max: usize) -> usize {
        let mut wait = InlineWait::reader();
        // One call for the whole batch: the queue is locked once for what
        // is queued already, not once for the first item and again for
        // the rest.
        std::future::poll_fn(|cx| self.shared.poll_batch(cx, &mut wait, out, max)).await
    }

    /// `fi_cq_sread` with a timeout: the next item, or `None` on timeout or
    /// when [`CompletionQueue::signal`] woke the reader.
    pub async fn next_timeout(&self, timeout: std::time::Duration) -> Option<CqItem> {
        let fut = std::future::poll_fn(|cx| self.shared.poll_item_or_signal(cx));
        tokio::time::timeout(timeout, fut).await.ok().flatten()
    }

    /// `fi_close`: readers take what is queued, then the stream ends
    /// (`None`) for every handle of the queue. `Busy` while an endpoint
    /// that is not closed is bound to it.
    pub fn close(&self) -> Result<()> {
        if self.shared.bound.count() > 0 {
            return Err(weft_core::Error::Busy);
        }
        self.shared.close();
        Ok(())
    }

    /// `fi_cq_signal`: wakes a reader blocked in `next_timeout`.
    pub fn signal(&self) {
        self.shared.signal()
    }

    /// Number of queued items.
    pub fn len(&self) -> usize {
        self.shared.len()
    }

    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.shared.is_empty()
    }
}

impl Stream for CompletionQueue {
    type Item = CqItem;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<CqItem>> {
        let this = self.get_mut();
        this.shared.poll_next(cx, &mut this.wait)
    }
}
