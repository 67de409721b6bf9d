//! Counters.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use weft_core::counter::CounterShared;
use weft_core::{Error, Result};

/// A completion counter: successes and errors, with `wait(threshold)`.
#[derive(Debug, Clone)]
pub struct Counter {
    pub(crate) shared: Arc<CounterShared>,
    pub(crate) domain: u64,
}

impl Counter {
    pub(crate) fn new(shared: Arc<CounterShared>, domain: u64) -> Counter {
        Counter { shared, domain }
    }

    /// The object id.
    pub fn fid(&self) -> u64 {
        self.shared.id()
    }

    /// Successful completions.
    pub fn read(&self) -> u64 {
        self.shared.read()
    }

    /// Failed completions.
    pub fn read_err(&self) -> u64 {
        self.shared.read_err()
    }

    /// Adds to the success count.
    pub fn add(&self, n: u64) {
        self.shared.add(n)
    }

    /// Sets the success count.
    pub fn set(&self, v: u64) {
        self.shared.set(v)
    }

    /// Adds to the error count.
    pub fn add_err(&self, n: u64) {
        self.shared.add_err(n)
    }

    /// Sets the error count.
    pub fn set_err(&self, v: u64) {
        self.shared.set_err(v)
    }

    /// Waits until the count reaches `threshold`: `Ok(count)`, or
    /// `Err(Avail)` if an error is counted meanwhile (`fi_cntr_wait`).
    pub async fn wait(&self, threshold: u64) -> Result<u64> {
        let err_seen = self.shared.read_err();
        std::future::poll_fn(|cx| self.shared.poll_wait(threshold, err_seen, cx)).await
    }

    /// `fi_cntr_wait` with its timeout: as [`wait`](Self::wait), or
    /// `TimedOut` when the count has not reached `threshold` in time.
    pub async fn wait_timeout(&self, threshold: u64, timeout: Duration) -> Result<u64> {
        tokio::time::timeout(timeout, self.wait(threshold))
            .await
            .map_err(|_| Error::TimedOut)?
    }

    /// The counter's changes as a [`Stream`] of `(count, errors)`, from
    /// the values it has now: each item is the state after one or more
    /// changes (changes between two polls coalesce; nothing is ever
    /// reported that did not happen). The stream never ends by itself.
    pub fn changes(&self) -> CounterChanges {
        CounterChanges {
            shared: self.shared.clone(),
            seen: (self.shared.read(), self.shared.read_err()),
        }
    }
}

/// The changes of a [`Counter`] (see [`Counter::changes`]).
#[derive(Debug)]
pub struct CounterChanges {
    shared: Arc<CounterShared>,
    seen: (u64, u64),
}

impl Stream for CounterChanges {
    type Item = (u64, u64);

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<(u64, u64)>> {
        let this = self.get_mut();
        match this.shared.poll_change(this.seen, cx) {
            Poll::Ready(now) => {
                this.seen = now;
                Poll::Ready(Some(now))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
