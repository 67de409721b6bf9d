//! Completion counters (`fi_cntr`): a success count and an error count,
//! with waiters on a threshold.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use crate::error::{Error, Result};
use crate::sync::{lock, wake_all};

/// The shared state of a counter.
#[derive(Debug)]
pub struct CounterShared {
    id: u64,
    value: AtomicU64,
    err: AtomicU64,
    waiters: Mutex<Vec<Waker>>,
}

impl CounterShared {
    /// A counter at zero.
    pub fn new(id: u64) -> Arc<CounterShared> {
        Arc::new(CounterShared {
            id,
            value: AtomicU64::new(0),
            err: AtomicU64::new(0),
            waiters: Mutex::new(Vec::new()),
        })
    }

    /// The object id (fid).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// `fi_cntr_read`.
    pub fn read(&self) -> u64 {
        self.value.load(Ordering::Acquire)
    }

    /// `fi_cntr_readerr`.
    pub fn read_err(&self) -> u64 {
        self.err.load(Ordering::Acquire)
    }

    /// `fi_cntr_add`.
    pub fn add(&self, n: u64) {
        self.value.fetch_add(n, Ordering::AcqRel);
        self.wake();
    }

    /// `fi_cntr_set`.
    pub fn set(&self, v: u64) {
        self.value.store(v, Ordering::Release);
        self.wake();
    }

    /// `fi_cntr_adderr`.
    pub fn add_err(&self, n: u64) {
        self.err.fetch_add(n, Ordering::AcqRel);
        self.wake();
    }

    /// `fi_cntr_seterr`.
    pub fn set_err(&self, v: u64) {
        self.err.store(v, Ordering::Release);
        self.wake();
    }

    fn wake(&self) {
        let ws = std::mem::take(&mut *lock(&self.waiters));
        wake_all(ws);
    }

    /// Polls for a change: ready with `(count, errors)` once either differs
    /// from `seen`. Changes between two polls coalesce into one.
    pub fn poll_change(&self, seen: (u64, u64), cx: &mut Context<'_>) -> Poll<(u64, u64)> {
        let now = |s: &Self| (s.read(), s.read_err());
        if now(self) != seen {
            return Poll::Ready(now(self));
        }
        {
            let mut g = lock(&self.waiters);
            if !g.iter().any(|w| w.will_wake(cx.waker())) {
                g.push(cx.waker().clone());
            }
        }
        match now(self) {
            n if n != seen => Poll::Ready(n),
            _ => Poll::Pending,
        }
    }

    /// Polls `fi_cntr_wait(threshold)`: ready with `Ok(value)` once the
    /// count reaches `threshold`, or with `Err(Avail)` if the error count
    /// moved past `err_seen` (libfabric's wait returns on errors too).
    pub fn poll_wait(
        &self,
        threshold: u64,
        err_seen: u64,
        cx: &mut Context<'_>,
    ) -> Poll<Result<u64>> {
        let check = |s: &Self| {
            let v = s.read();
            if v >= threshold {
                Some(Ok(v))
            } else if s.read_err() != err_seen {
                Some(Err(Error::Avail))
            } else {
                None
            }
        };
        if let Some(r) = check(self) {
            return Poll::Ready(r);
        }
        {
            let mut g = lock(&self.waiters);
            if !g.iter().any(|w| w.will_wake(cx.waker())) {
                g.push(cx.waker().clone());
            }
        }
        // Re-check after registering: an add between the first check and
        // the registration would otherwise be a lost wake-up.
        match check(self) {
            Some(r) => Poll::Ready(r),
            None => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::task::noop_waker;

    #[test]
    fn set_add_err_visible_immediately() {
        let c = CounterShared::new(1);
        c.add(3);
        assert_eq!(c.read(), 3);
        c.set(10);
        assert_eq!(c.read(), 10);
        c.add_err(2);
        c.set_err(5);
        assert_eq!(c.read_err(), 5);
    }

    #[test]
    fn changes_coalesce_and_wake() {
        let c = CounterShared::new(1);
        let w = noop_waker();
        let mut cx = Context::from_waker(&w);
        assert!(c.poll_change((0, 0), &mut cx).is_pending());
        c.add(1);
        c.add(2);
        assert_eq!(c.poll_change((0, 0), &mut cx), Poll::Ready((3, 0)));
        assert!(c.poll_change((3, 0), &mut cx).is_pending());
        c.add_err(1);
        assert_eq!(c.poll_change((3, 0), &mut cx), Poll::Ready((3, 1)));
    }

    #[test]
    fn wait_threshold_and_error() {
        let c = CounterShared::new(1);
        let w = noop_waker();
        let mut cx = Context::from_waker(&w);
        assert!(c.poll_wait(2, 0, &mut cx).is_pending());
        c.add(2);
        assert_eq!(c.poll_wait(2, 0, &mut cx), Poll::Ready(Ok(2)));
        assert!(c.poll_wait(5, 0, &mut cx).is_pending());
        c.add_err(1);
        assert_eq!(c.poll_wait(5, 0, &mut cx), Poll::Ready(Err(Error::Avail)));
    }
}
