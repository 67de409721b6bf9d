//! A device's asynchronous events, and who hears them.
//!
//! The device reports some things through its context's async event fd,
//! not on a CQ: a queue pair on a shared receive queue that has reached
//! its last work request after the move to the error state
//! (`IBV_EVENT_QP_LAST_WQE_REACHED`), queue pair and device errors, port
//! state. [`Router`] is what is done with each one, apart from reading
//! them (`crate::async_reader` reads, `crate::sys::async_event` calls C):
//!
//! * Last WQE reached wakes whoever waits for that queue pair ([`LastWqe`],
//!   registered by its number before the move to the error state): the
//!   close of a MSG endpoint bound to a shared receive context, which
//!   then polls the CQ one last time (see `msg::closing`). An event for a
//!   queue pair nobody waits for is logged at debug level.
//! * Every other event is logged with `tracing`: errors of a queue pair
//!   (fatal, request, access), of a shared receive queue or CQ, and a
//!   device fatal error at `warn`; port and path changes and the SRQ
//!   limit at `info`; communication established and SQ drained at
//!   `debug`. None of them changes an endpoint's state: a queue pair
//!   error also fails the work request that caused it (or flushes what
//!   is posted), and that completion is what disables the endpoint and
//!   reports on its EQ (`msg::complete`'s `fatal`), so the event would
//!   say the same thing a second time.
//!
//! The router is routed to before the event is acknowledged (see
//! `crate::sys::async_event`): until then the queue pair it names cannot
//! be destroyed, so its number cannot name a newer queue pair yet.
//!
//! Also the pure logic around them, unit-tested without a device:
//! [`QpEnd`], which makes the end of a connection and its close register
//! one last-WQE wait between them, and [`Backoff`], the reader's answer
//! to a failing async fd (retry what may pass, give up on the rest).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use weft_core::sync::{lock, FastMutex};

/// What an asynchronous event reports (`enum ibv_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEventKind {
    CqErr,
    QpFatal,
    QpReqErr,
    QpAccessErr,
    CommEst,
    SqDrained,
    PathMig,
    PathMigErr,
    DeviceFatal,
    PortActive,
    PortErr,
    LidChange,
    PkeyChange,
    SmChange,
    SrqErr,
    SrqLimitReached,
    QpLastWqeReached,
    ClientReregister,
    GidChange,
    WqFatal,
    /// A value this build does not know.
    Other(u32),
}

impl AsyncEventKind {
    /// The kind of `ibv_event_type` value `v` (the values are the
    /// positions in that enum, from 0).
    pub fn from_raw(v: u32) -> AsyncEventKind {
        use AsyncEventKind::*;
        const KINDS: [AsyncEventKind; 20] = [
            CqErr,
            QpFatal,
            QpReqErr,
            QpAccessErr,
            CommEst,
            SqDrained,
            PathMig,
            PathMigErr,
            DeviceFatal,
            PortActive,
            PortErr,
            LidChange,
            PkeyChange,
            SmChange,
            SrqErr,
            SrqLimitReached,
            QpLastWqeReached,
            ClientReregister,
            GidChange,
            WqFatal,
        ];
        usize::try_from(v)
            .ok()
            .and_then(|i| KINDS.get(i).copied())
            .unwrap_or(Other(v))
    }

    /// What the event's element is.
    pub fn element(self) -> ElementKind {
        use AsyncEventKind::*;
        match self {
            CqErr => ElementKind::Cq,
            QpFatal | QpReqErr | QpAccessErr | CommEst | SqDrained | PathMig | PathMigErr
            | QpLastWqeReached => ElementKind::Qp,
            SrqErr | SrqLimitReached => ElementKind::Srq,
            PortActive | PortErr | LidChange | PkeyChange | SmChange | ClientReregister
            | GidChange => ElementKind::Port,
            WqFatal => ElementKind::Wq,
            DeviceFatal | Other(_) => ElementKind::Device,
        }
    }
}

/// Which member of `ibv_async_event::element` an event fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElementKind {
    Qp,
    Srq,
    Cq,
    Wq,
    Port,
    Device,
}

/// One asynchronous event, read out of the device's `ibv_async_event`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    pub kind: AsyncEventKind,
    /// The queue pair's number, for a queue pair's event.
    pub qp_num: Option<u32>,
    /// The port, for a port's event.
    pub port: Option<u32>,
}

/// What [`Router::route`] did with an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routed {
    /// Woke the waiter for the queue pair's last WQE.
    Woke,
    /// Logged only.
    Logged,
}

/// Per queue pair number: which wait (a number of [`Router::next`]) and
/// its sender.
type Waiters = FastMutex<HashMap<u32, (u64, oneshot::Sender<()>)>>;

/// The queue pairs waiting for their last-WQE event, and the logging of
/// everything else, for one device.
#[derive(Debug)]
pub struct Router {
    device: String,
    waiters: Arc<Waiters>,
    next: AtomicU64,
}

impl Router {
    /// The router of the device called `device` (for the logs).
    pub fn new(device: &str) -> Router {
        Router {
            device: device.to_owned(),
            waiters: Arc::default(),
            next: AtomicU64::new(0),
        }
    }

    /// Waits for the last-WQE event of queue pair `qp_num`. Registered
    /// before the queue pair moves to the error state, so the event
    /// cannot come first. A second wait for the same number replaces the
    /// first (which then never resolves): the number reused by a newer
    /// queue pair. One queue pair registers once ([`QpEnd`]).
    pub fn last_wqe(&self, qp_num: u32) -> LastWqe {
        let (tx, rx) = oneshot::channel();
        let wait = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.waiters).insert(qp_num, (wait, tx));
        LastWqe {
            rx: Some(rx),
            heard: false,
            qp_num,
            wait,
            waiters: self.waiters.clone(),
        }
    }

    /// Queue pairs waited for.
    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        lock(&self.waiters).len()
    }

    /// Hands `ev` to whoever waits for it, or logs it.
    pub fn route(&self, ev: &AsyncEvent) -> Routed {
        use AsyncEventKind::*;
        let dev = self.device.as_str();
        let (qp, port) = (ev.qp_num, ev.port);
        match ev.kind {
            QpLastWqeReached => {
                let tx = qp.and_then(|n| lock(&self.waiters).remove(&n));
                if let Some((_, tx)) = tx {
                    // A waiter that gave up meanwhile (its bound passed)
                    // does not need it.
                    let _ = tx.send(());
                    return Routed::Woke;
                }
                tracing::debug!(device = dev, ?qp, "verbs: last WQE reached, nobody waits");
            }
            QpFatal | QpReqErr | QpAccessErr | PathMigErr => {
                tracing::warn!(device = dev, ?qp, kind = ?ev.kind, "verbs: queue pair error event");
            }
            SrqErr | CqErr | WqFatal | DeviceFatal | Other(_) => {
                tracing::warn!(device = dev, kind = ?ev.kind, "verbs: device async error event");
            }
            PortActive | PortErr | LidChange | PkeyChange | SmChange | ClientReregister
            | GidChange => {
                tracing::info!(device = dev, ?port, kind = ?ev.kind, "verbs: port event");
            }
            SrqLimitReached | PathMig => {
                tracing::info!(device = dev, ?qp, kind = ?ev.kind, "verbs: async event");
            }
            CommEst | SqDrained => {
                tracing::debug!(device = dev, ?qp, kind = ?ev.kind, "verbs: async event");
            }
        }
        Routed::Logged
    }
}

/// The last-WQE event of one queue pair: resolves when it comes, never
/// otherwise (await it under a bound). Dropping it withdraws the wait.
#[derive(Debug)]
pub struct LastWqe {
    rx: Option<oneshot::Receiver<()>>,
    heard: bool,
    qp_num: u32,
    wait: u64,
    waiters: Arc<Waiters>,
}

impl Future for LastWqe {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.heard {
            return Poll::Ready(());
        }
        // A receiver that has answered is not polled again (Tokio's
        // oneshot panics then).
        let Some(rx) = self.rx.as_mut() else {
            return Poll::Pending;
        };
        match Pin::new(rx).poll(cx) {
            Poll::Ready(Ok(())) => {
                self.rx = None;
                self.heard = true;
                Poll::Ready(())
            }
            // Replaced by a later wait for the same number: not this
            // queue pair's event any more.
            Poll::Ready(Err(_)) => {
                self.rx = None;
                Poll::Pending
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for LastWqe {
    fn drop(&mut self) {
        let mut w = lock(&self.waiters);
        // Only our own entry: a later wait for a reused number stays.
        if w.get(&self.qp_num).is_some_and(|(k, _)| *k == self.wait) {
            w.remove(&self.qp_num);
        }
    }
}

/// Who moves a queue pair on a shared receive queue to the error state,
/// and so owns the wait for its last-WQE event: the end of its
/// connection (the peer's disconnect, a critical error) or its close,
/// whichever comes first. Both go through this one value under one lock
/// (the endpoint's), deciding, registering the wait and (the end) moving
/// the queue pair while holding it: so the queue pair's wait is
/// registered once, before the first move, and the one close task gets
/// it. Were the two to check and register apart, a close racing the
/// peer's disconnect could have its wait replaced by the end's (or find
/// no end yet and register after the end's move) and wait its whole
/// bound for an event gone elsewhere.
#[derive(Debug, Default)]
pub enum QpEnd {
    /// Neither has come yet.
    #[default]
    Live,
    /// The connection ended first: the queue pair went to the error
    /// state at `at`, with `last_wqe` registered before.
    Ended {
        at: Instant,
        last_wqe: Option<LastWqe>,
    },
    /// The close came: nothing more to register or move here.
    Closed,
}

/// What the close takes over from [`QpEnd::close`].
#[derive(Debug, Default)]
pub struct Closing {
    /// The wait for the last WQE, if one could be registered.
    pub last_wqe: Option<LastWqe>,
    /// When the end moved the queue pair to the error state; `None`: the
    /// close moves it, after this.
    pub moved_at: Option<Instant>,
}

impl QpEnd {
    /// The connection ended before its close: unless the close (or an
    /// earlier end) came first, registers the wait (`register`), then
    /// moves the queue pair to the error state (`to_error`), both under
    /// the caller's lock of `self`. False when it did neither.
    pub fn end(
        &mut self,
        register: impl FnOnce() -> Option<LastWqe>,
        to_error: impl FnOnce(),
    ) -> bool {
        if !matches!(self, QpEnd::Live) {
            return false;
        }
        let last_wqe = register();
        to_error();
        // After the move: the bound counts from it, never from before.
        *self = QpEnd::Ended {
            at: Instant::now(),
            last_wqe,
        };
        true
    }

    /// The close: takes the end's wait and time, or, if the connection
    /// has not ended, registers the wait now (`register`, under the
    /// caller's lock; the caller moves the queue pair after). From then
    /// on [`end`](Self::end) does nothing. `None` for a second close.
    pub fn close(&mut self, register: impl FnOnce() -> Option<LastWqe>) -> Option<Closing> {
        match std::mem::replace(self, QpEnd::Closed) {
            QpEnd::Live => Some(Closing {
                last_wqe: register(),
                moved_at: None,
            }),
            QpEnd::Ended { at, last_wqe } => Some(Closing {
                last_wqe,
                moved_at: Some(at),
            }),
            QpEnd::Closed => None,
        }
    }
}

impl QpEnd {
    /// A connect or accept that failed after building its queue pair
    /// gives it up without a close (which then finds no queue pair): takes
    /// the end's wait and time if the connection ended (then `Live` again,
    /// for the next connection's queue pair), else registers the wait and
    /// moves the queue pair as the end does, leaving the state as it was
    /// (a close that came meanwhile found no queue pair, and registered
    /// nothing). The caller owns the queue pair: it took it from the
    /// endpoint, under the lock the close takes it with.
    pub fn abandon(
        &mut self,
        register: impl FnOnce() -> Option<LastWqe>,
        to_error: impl FnOnce(),
    ) -> Closing {
        match std::mem::take(self) {
            QpEnd::Ended { at, last_wqe } => Closing {
                last_wqe,
                moved_at: Some(at),
            },
            kept => {
                *self = kept;
                let last_wqe = register();
                to_error();
                Closing {
                    last_wqe,
                    moved_at: Some(Instant::now()),
                }
            }
        }
    }
}

/// Why the async fd could not be waited on or read.
#[derive(Debug)]
pub enum FdFault {
    /// `poll(2)` or the read failed with this error.
    Os(io::Error),
    /// `poll(2)` found an error, hang-up or invalid fd on it (its
    /// `revents`): the device is gone.
    Hangup(i16),
}

impl fmt::Display for FdFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FdFault::Os(e) => write!(f, "{e}"),
            FdFault::Hangup(ev) => write!(f, "error or hang-up on the fd (revents {ev:#x})"),
        }
    }
}

impl FdFault {
    /// Whether the same call may succeed later: the kernel was short of
    /// memory (`ENOMEM`), the call was interrupted (`EINTR`) or would
    /// have blocked (`EAGAIN`). Anything else is the fd's end: `EIO` (the
    /// device removed: the kernel's answer to a read once its events are
    /// gone), `EBADF`, `EINVAL`, `EFAULT`, an error or hang-up `poll`
    /// reports, and any error this build does not know.
    pub fn is_transient(&self) -> bool {
        match self {
            FdFault::Os(e) => matches!(
                e.kind(),
                io::ErrorKind::OutOfMemory | io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
            ),
            FdFault::Hangup(_) => false,
        }
    }
}

/// The reader's retries of a failing async fd: a transient failure
/// ([`FdFault::is_transient`]) is retried after a pause that doubles from
/// [`FIRST`](Self::FIRST) up to [`MAX_DELAY`](Self::MAX_DELAY), at most
/// [`MAX_RETRIES`](Self::MAX_RETRIES) times in a row (about four seconds
/// in all); a read that returns an event starts the count again (one
/// that finds none proves nothing). Past that, or at
/// once for any other failure, the reader gives up for good.
///
/// Giving up costs little and loses nothing (the closes on that context
/// wait their 500 ms bound instead of the event), but it is for the
/// process's life; so a shortage of memory that passes within seconds
/// does not end the reader, while an error that only looks transient
/// and persists still ends it, logged, instead of looping unseen.
#[derive(Debug, Default)]
pub struct Backoff {
    /// Transient failures since the last event read.
    failures: u32,
}

impl Backoff {
    /// The first pause.
    pub const FIRST: Duration = Duration::from_millis(1);
    /// The longest pause: one close's bound (`msg::closing`), the most
    /// a close waits without the reader anyway.
    pub const MAX_DELAY: Duration = Duration::from_millis(500);
    /// Transient failures in a row that are retried.
    pub const MAX_RETRIES: u32 = 16;

    /// After `fault`: how long to pause before trying again, or `None`
    /// to give up.
    pub fn after(&mut self, fault: &FdFault) -> Option<Duration> {
        if !fault.is_transient() || self.failures >= Self::MAX_RETRIES {
            return None;
        }
        let delay = Self::FIRST
            .checked_mul(1u32 << self.failures.min(31))
            .map_or(Self::MAX_DELAY, |d| d.min(Self::MAX_DELAY));
        self.failures += 1;
        Some(delay)
    }

    /// A read returned an event: the fd works again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
#[path = "device_events_tests.rs"]
mod tests;
