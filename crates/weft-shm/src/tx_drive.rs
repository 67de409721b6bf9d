//! Driving the peers' queues: writing what waits as rings make room,
//! ending sends, and forgetting peers whose process is gone (split from
//! `tx`, which claims channels and writes records).

use std::sync::atomic::Ordering;

use smallvec::SmallVec;
use weft_core::completion::{CqErrEntry, OpDone};
use weft_core::flags::OpFlags;
use weft_core::sync::lock;
use weft_core::Error;

use crate::endpoint::EpShared;
use crate::tx::{Ended, EndedList};

/// Ends a send that succeeded: [`finish`] without an outcome to look at,
/// inlined into the one send path that takes it.
#[inline(always)]
pub fn finish_ok(ep: &EpShared, done: OpDone, len: usize) {
    ep.tx.release(1);
    complete_ok(done, len);
}

/// The completion of a send of `len` bytes that succeeded; its slot of
/// the transmit queue, if it took one, is the caller's to give back.
#[inline(always)]
pub fn complete_ok(done: OpDone, len: usize) {
    done.complete_len(len);
}

/// Ends a send: its credit back first, then its completion.
pub fn finish(ep: &EpShared, (done, len, r): Ended) {
    // Nothing to end: an RMA request (its response ends it) or a
    // response.
    let Some(done) = done else {
        return;
    };
    match r {
        Ok(()) => finish_ok(ep, done, len),
        Err(e) => {
            ep.tx.release(1);
            tracing::debug!(error = %e, "shm: send failed");
            done.fail(CqErrEntry::new(0, OpFlags::empty(), e));
        }
    }
}

impl EpShared {
    /// Sends what waits in peers' queues while their rings take it.
    /// Returns how many sends ended. Every pass asks, and the answer is
    /// almost always that nothing waits: that much inline.
    #[inline]
    pub fn flush(&self) -> usize {
        if !self.tx_pending.load(Ordering::Acquire) {
            return 0;
        }
        self.flush_queued()
    }

    /// [`flush`](Self::flush) when something waits.
    #[cold]
    #[inline(never)]
    fn flush_queued(&self) -> usize {
        let mut ended = EndedList::new();
        let mut refused: SmallVec<[Vec<u8>; 1]> = SmallVec::new();
        {
            let mut guard = lock(&self.peers);
            let peers = &mut *guard;
            let (me, mut pending) = (self.instance(), false);
            for (addr, p) in peers.map.iter_mut() {
                p.flush(me, &self.name, &self.keys, &mut peers.next_seq, &mut ended);
                pending |= p.busy();
                if std::mem::take(&mut p.refused) {
                    refused.push(addr.clone());
                }
            }
            self.tx_pending.store(pending, Ordering::Release);
        }
        for addr in refused {
            self.key_refused(&addr);
        }
        let n = ended.len();
        for e in ended {
            finish(self, e);
        }
        n
    }

    /// The stamp of our newest CMA send not read yet, over every peer
    /// (`Peer::cma_out`; `None`: none): what the driver stays awake for
    /// before it sleeps.
    pub fn cma_out(&self) -> Option<u64> {
        if !self.tx_pending.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.peers)
            .map
            .iter_mut()
            .filter_map(|(_, p)| p.cma_out())
            .max()
    }

    /// The driver is about to sleep: every peer with a send waiting for
    /// delivery or queued (for room: a spinning endpoint does not ask
    /// when it finds the ring full) asks its receiver to ring us
    /// (`Peer::ask_ring`).
    pub fn ask_rings(&self) {
        if !self.tx_pending.load(Ordering::Acquire) {
            return;
        }
        for (_, p) in lock(&self.peers).map.iter_mut() {
            p.ask_ring();
        }
    }

    /// Fails what waits for peers whose process is gone and forgets them
    /// (removing their segments), and gives up channels whose records
    /// another writer unpublished (`Peer::drop_if_unpublished`); returns
    /// the sends failed.
    pub fn sweep_peers(&self) -> usize {
        let mut ended = EndedList::new();
        let mut gone: SmallVec<[(String, crate::live::Instance); 2]> = SmallVec::new();
        {
            let mut peers = lock(&self.peers);
            peers.map.retain(|p| {
                if p.alive() {
                    p.drop_if_unpublished(&mut ended);
                    return true;
                }
                p.fail_all(Error::ConnReset, &mut ended);
                gone.push((p.name.clone(), p.instance()));
                false
            });
        }
        for (name, inst) in gone {
            tracing::debug!(%name, pid = inst.0, "shm: peer process gone");
            crate::live::remove_if_owned(&name, inst);
        }
        let n = ended.len();
        for e in ended {
            finish(self, e);
        }
        n
    }
}
