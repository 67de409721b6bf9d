//! Sends wholly in the ring: ended at once, or (delivery-complete)
//! once the receiver's head passes them; asking the receiver to ring us
//! when it consumes, and waiting at closing for CMA sends to be read.

use std::sync::atomic::{AtomicU64, Ordering};

use smallvec::SmallVec;

use super::{Delivering, EndedList, Out, Peer};
use crate::layout::*;

/// How long closing waits for a receiver to read CMA sends out: a
/// receiver that takes longer reads freed memory (its receive gets
/// garbage or fails; our memory is not written).
const CMA_SETTLE: std::time::Duration = std::time::Duration::from_millis(200);

/// Stamps CMA sends in the order they are written, across the process's
/// endpoints and peers (a peer record made again starts no count of its
/// own): a newer unread send has a higher stamp.
pub(crate) static CMA_STAMP: AtomicU64 = AtomicU64::new(1);

impl Peer {
    /// Waits (a bounded time) for the receiver to have read the CMA sends
    /// still out: their buffers are freed after this.
    pub(super) fn settle_cma(&self) {
        let Some((c, _)) = self.chan else {
            return;
        };
        let Some((end, _)) = self.newest_cma() else {
            return;
        };
        let until = std::time::Instant::now() + CMA_SETTLE;
        while std::time::Instant::now() < until && self.alive() {
            let head = c.head(&self.seg);
            if self.tail.wrapping_sub(head) <= self.tail.wrapping_sub(end) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }

    /// The stamp of our newest CMA send the receiver has not read yet
    /// (`None`: none unread).
    pub(crate) fn cma_out(&self) -> Option<u64> {
        self.newest_cma().map(|(_, stamp)| stamp)
    }

    /// Our newest CMA send the receiver has not read yet: where it ends
    /// in the ring, and its stamp.
    fn newest_cma(&self) -> Option<(u64, u64)> {
        self.delivering
            .iter()
            .rev()
            .find_map(|d| d.keep.as_ref().map(|(_, stamp)| (d.end, *stamp)))
    }

    /// A send is wholly in the ring: it ends now, or (delivery-complete)
    /// once the receiver's head passes it.
    pub(super) fn written(&mut self, o: Out, ended: &mut EndedList) {
        if !o.waits() {
            ended.push((o.done, o.len, Ok(())));
            return;
        }
        let split = o.cma && self.offers_split(o.len);
        let keep = o
            .cma
            .then(|| (o.iov, CMA_STAMP.fetch_add(1, Ordering::Relaxed)));
        self.splits += usize::from(split);
        self.delivering.push_back(Delivering {
            end: self.tail,
            len: o.len,
            done: o.done,
            keep,
            split,
        });
        // No ask to be rung here: whoever drives us polls the head while
        // it spins, and asks (`ask_ring`) only before it sleeps. Asked
        // here, the receiver rang once a large message in spinning modes
        // too (`docs/benchmarks.md`, "shm RDM").
        self.delivered(ended);
    }

    /// Ends the delivery-complete sends the receiver's head has passed.
    pub(super) fn delivered(&mut self, ended: &mut EndedList) {
        let Some((c, _)) = self.chan else {
            return;
        };
        if self.splits > 0 {
            self.write_offered(c.i);
        }
        let head = c.head(&self.seg);
        self.delivered_to(head, ended);
    }

    /// [`delivered`](Self::delivered) against a head already read.
    pub(super) fn delivered_to(&mut self, head: u64, ended: &mut EndedList) {
        while let Some(d) = self.delivering.front() {
            // Within one ring behind the tail: a head elsewhere is the
            // receiver resetting a freed channel, not progress.
            let behind = self.tail.wrapping_sub(head);
            let passed = behind <= self.tail.wrapping_sub(d.end);
            if !passed {
                return;
            }
            if let Some(d) = self.delivering.pop_front() {
                self.splits -= usize::from(d.split);
                ended.push((d.done, d.len, Ok(())));
            }
        }
    }

    /// The driver is about to sleep: if a send waits for the receiver's
    /// head (for delivery, or for room: a spinning endpoint does not ask
    /// when it finds the ring full), the receiver is asked to ring us
    /// when it consumes. The caller fences and polls once more after
    /// asking (pairing with the receiver's fence between consuming and
    /// reading the ask), so a head that moved before the ask was seen is
    /// found by that poll.
    pub(crate) fn ask_ring(&self) {
        let waits = !self.delivering.is_empty() || !self.queue.is_empty();
        if let (Some((c, _)), true) = (self.chan, waits) {
            self.seg.store32(c.ctl(C_TX_WAIT), 1, Ordering::Relaxed);
        }
    }
}

impl Peer {
    /// Whether a CMA send of `len` bytes offers to write a part of its
    /// message (`F_SPLIT`).
    pub(super) fn offers_split(&self, len: usize) -> bool {
        self.split_ok && len >= crate::split::split_min()
    }

    /// Writes the part of a CMA send the owner offered us on channel
    /// `i`, if it offered one for a send of ours that waits, and says
    /// so. A write the kernel refuses (seccomp, a changed ptrace right)
    /// is given back to the owner to copy, and we offer no more.
    fn write_offered(&mut self, i: usize) {
        let Some(end) = crate::split::offered(&self.seg, self.g, i) else {
            return;
        };
        let Some(d) = self.delivering.iter().find(|d| d.split && d.end == end) else {
            return;
        };
        let Some((iov, _)) = &d.keep else {
            return;
        };
        let Some(offer) = crate::split::take(&self.seg, self.g, i, end, d.len) else {
            return;
        };
        // An owner that shares our memory: only an offer it stands for,
        // marked while we write it (a forged one would have us write our
        // own memory; `split::LOCAL`).
        let owner = self.mine.then_some((self.serial, self.file));
        let mut mark = None;
        let offer = offer.filter(|o| {
            owner.is_none_or(|w| {
                mark = crate::split::begin_write(w, i, end, o);
                mark.is_some()
            })
        });
        let wrote = offer.map(|o| {
            let lens: SmallVec<[usize; 4]> = iov.iter().map(|b| b.len()).collect();
            let local: SmallVec<[&[u8]; 4]> =
                crate::cma::pieces(&lens, o.at as usize, o.bytes() as usize)
                    .into_iter()
                    .map(|(k, at, n)| &iov[k][at..at + n])
                    .collect();
            let pushed = crate::pool_map::push(self.owner.0, o.pool.as_ref(), &o.ranges, &local);
            (pushed, o.bytes())
        });
        drop(mark);
        let ok = matches!(wrote, Some((Ok(n), len)) if n as u64 == len);
        if let Some((Err(crate::cma::PullError::Sys(e)), _)) = wrote {
            if matches!(e, nix::errno::Errno::EPERM | nix::errno::Errno::ENOSYS) {
                self.split_ok = false;
            }
        }
        crate::split::finish(&self.seg, self.g, i, end, ok);
        self.wake();
    }
}
