//! Counters.

use std::sync::Arc;

use weft_core::counter::CounterShared;
use weft_core::Result;

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
}
