//! Connections whose next message matched no receive and did not fit the
//! unexpected budget: their readers sleep until a receive that could take
//! that message is posted, or until enough budget comes back for it.
//! Only those are woken, so a receive posted beside thousands of parked
//! connections costs one wake-up, not thousands.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use weft_core::limits::UNEXPECTED_OVERHEAD;
use weft_core::sync::lock;
use weft_core::tagmatch::{MsgInfo, RecvSpec};

use crate::conn::Conn;
use crate::endpoint::EpShared;

/// How many parked connections one release of budget looks at: the scan
/// runs on every freed message, so it must not grow with the number of
/// parked peers.
const BUDGET_SCAN: usize = 64;

/// The parked connections of one endpoint, oldest first. Lock order: the
/// matcher's lock may be held when this one is taken, never the reverse.
#[derive(Debug, Default)]
pub struct Parked {
    q: Mutex<VecDeque<(Arc<Conn>, MsgInfo)>>,
}

impl Parked {
    /// Parks `conn` with the header it could not place.
    pub fn park(&self, conn: &Arc<Conn>, info: MsgInfo) {
        let mut q = lock(&self.q);
        if !conn.parked.swap(true, Ordering::AcqRel) {
            q.push_back((conn.clone(), info));
        }
    }

    /// Takes `conn` out (it found room after all, or it died).
    pub fn unpark(&self, conn: &Conn) {
        // Dropped after the lock is let go: the last reference to a
        // connection frees its messages, whose charges take this lock.
        let mut gone = Vec::new();
        {
            let mut q = lock(&self.q);
            let mut i = 0;
            while i < q.len() {
                if std::ptr::eq(q[i].0.as_ref(), conn) {
                    gone.extend(q.remove(i));
                } else {
                    i += 1;
                }
            }
            conn.parked.store(false, Ordering::Release);
            let len = q.len();
            if q.capacity() > 64 && len * 4 < q.capacity() {
                q.shrink_to(len * 2);
            }
        }
        drop(gone);
    }

    /// A receive was queued: wakes the oldest parked connection whose
    /// message it would take.
    pub fn wake_for_recv(&self, spec: &RecvSpec) {
        let woken = {
            let mut q = lock(&self.q);
            match q.iter().position(|(_, info)| spec.accepts(info)) {
                Some(i) => q.remove(i),
                None => None,
            }
        };
        if let Some((c, _)) = woken {
            wake(&c);
        }
    }

    /// Budget came back: wakes, oldest first, the parked connections whose
    /// messages now fit, as far as the freed room goes.
    pub fn wake_for_budget(&self, ep: &EpShared) {
        let room = ep
            .buffered_limit
            .saturating_sub(ep.unexp_charged.load(Ordering::Acquire));
        self.wake_for_budget_in(room, &|c, charge| ep.peer_fits(c, charge));
    }

    /// [`wake_for_budget`](Self::wake_for_budget) with `room` left in the
    /// budget and `peer_fits` saying whether a charge fits a connection's
    /// share (a shared receive context's budget, over several endpoints).
    pub fn wake_for_budget_in(&self, room: usize, peer_fits: &dyn Fn(&Conn, usize) -> bool) {
        let mut woken = Vec::new();
        {
            let mut q = lock(&self.q);
            if q.is_empty() {
                return;
            }
            let mut room = room;
            let mut i = 0;
            let mut looked = 0;
            while i < q.len() && looked < BUDGET_SCAN {
                looked += 1;
                let (c, info) = &q[i];
                let charge = UNEXPECTED_OVERHEAD.saturating_add(info.len);
                if charge <= room && peer_fits(c, charge) {
                    room -= charge;
                    if let Some(e) = q.remove(i) {
                        woken.push(e.0);
                    }
                    continue;
                }
                i += 1;
            }
        }
        for c in woken {
            wake(&c);
        }
    }

    /// Endpoint close: every parked reader wakes to see it.
    pub fn wake_all(&self) {
        let all: Vec<_> = lock(&self.q).drain(..).collect();
        for (c, _) in all {
            wake(&c);
        }
    }

    /// Parked connections now.
    pub fn len(&self) -> usize {
        lock(&self.q).len()
    }
}

fn wake(c: &Conn) {
    c.parked.store(false, Ordering::Release);
    c.kick.notify_one();
}
