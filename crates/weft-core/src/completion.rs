//! Completion queue entries, the completion queue's shared state, and the
//! rules that decide where an operation's completion goes.
//!
//! An operation ends exactly once, through its [`OpDone`]: success feeds the
//! bound counter and, unless selective completion suppresses it, the CQ (or
//! the future that awaits this one operation); failure feeds the counter's
//! error count and always produces an error entry.
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64};

use bytes::BytesMut;

use crate::progress::ProgressHooks;
use crate::sync::WakerSet;

mod entry;
mod finished;
mod op_done;
mod queue;
mod wait;
pub use entry::{CqEntry, CqErrEntry, CqFormat, CqItem};
pub use finished::{Finished, Origin, Returned, Waiter};
pub use op_done::OpDone;

/// How a CQ reader waits when the queue is empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WaitMode {
    /// Sleep until woken (reactor / eventfd style); no CPU while idle.
    #[default]
    Interrupt,
    /// Progress never waits for the reactor: a waiter drives the bound
    /// endpoints itself for its spin budget, as in `Inline`, and otherwise
    /// a dedicated thread per endpoint spins on its sockets or CQ (parked
    /// while a waiter spins, so one process spins on one core).
    BusyPoll,
    /// Readers poll for a bounded budget before sleeping; the endpoint is
    /// driven by the reactor.
    Inline,
}

impl WaitMode {
    /// Parses `interrupt`, `busy-poll` (or `busy`), `inline`.
    pub fn parse(s: &str) -> Option<WaitMode> {
        match s.trim().to_ascii_lowercase().as_str() {
            "interrupt" | "irq" => Some(WaitMode::Interrupt),
            "busy-poll" | "busypoll" | "busy_poll" | "busy" => Some(WaitMode::BusyPoll),
            "inline" => Some(WaitMode::Inline),
            _ => None,
        }
    }
}

/// The smallest batch buffer a read trades for the queue's (see
/// `CqShared::take`): a smaller one is filled item by item.
const LEND_MIN: usize = 32;

/// The largest batch buffer the queue takes in a trade, unless its own
/// is larger already.
const LEND_MAX: usize = 4096;

/// Length checks a busy-poll reader makes before it sleeps (a few
/// microseconds).
const SPIN_POLLS: u32 = 4096;

#[derive(Debug, Default)]
struct CqInner {
    items: VecDeque<CqItem>,
    readers: WakerSet,
    signaled: bool,
    closed: bool,
}

/// The shared state of a completion queue. Providers push into it; the
/// public `CompletionQueue` reads from it.
#[derive(Debug)]
pub struct CqShared {
    id: u64,
    format: CqFormat,
    wait: WaitMode,
    inner: crate::sync::FastMutex<CqInner>,
    // Length mirror so empty checks on the busy path take no lock.
    len: AtomicU64,
    // `inner.closed` mirrored, so a spinning reader's poll takes no lock.
    closed: AtomicBool,
    // Inline mode: the bound endpoints, driven by readers of an empty queue.
    hooks: ProgressHooks,
    // Inline mode: how long its readers' waits last, for their spin budget.
    spin_hint: crate::progress::SpinHint,
    /// Endpoints bound to the queue.
    pub bound: crate::sync::BindCount,
}

/// Cuts each buffer to the bytes it holds, `placed` in total, in order.
#[inline]
pub fn trim_bufs(bufs: &mut [BytesMut], placed: usize) {
    // Most receives have one buffer.
    if let [b] = bufs {
        b.truncate(placed);
        return;
    }
    let mut left = placed;
    for b in bufs.iter_mut() {
        let n = b.len().min(left);
        b.truncate(n);
        left -= n;
    }
}

#[cfg(test)]
#[path = "completion_tests.rs"]
mod tests;
