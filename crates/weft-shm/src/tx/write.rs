//! Writing into a claimed channel's ring: a message record by record
//! (or whole, or as one CMA or lead record) where the receiver's head
//! leaves room, and the receiver woken when it sleeps.

use std::sync::atomic::{fence, Ordering};

use smallvec::SmallVec;
use weft_core::provider::Iov;
use weft_core::{Error, Result};

use super::{Out, Peer};
use crate::keyproof::Verdict;
use crate::layout::*;
use crate::ring::{Chan, RecHead};

impl Peer {
    /// Writes as much of `o` as the ring takes. `Ok(true)`: all of it is
    /// in; `Ok(false)`: it waits for room; `Err`: the receiver broke the
    /// rules.
    pub(super) fn advance(&mut self, o: &mut Out) -> Result<bool> {
        let Some((c, gen)) = self.chan else {
            return Ok(false);
        };
        if !self.still_ours(&c, gen) {
            self.chan = None;
            return Err(Error::ConnAborted);
        }
        if let Some(w) = &self.awaiting {
            match crate::keyproof::verdict(&self.seg, &c, w) {
                Verdict::Pending => return Ok(false),
                Verdict::Accepted => self.awaiting = None,
                Verdict::Refused => {
                    // Given back unused; the owner frees it.
                    c.give_back(&self.seg, gen);
                    self.chan = None;
                    self.awaiting = None;
                    self.refused = true;
                    return Err(Error::KeyRejected);
                }
            }
        }
        let start = self.tail;
        let mut asked = false;
        let r = loop {
            if o.started && o.off == o.len {
                break Ok(true);
            }
            // Looked at again before each record after the first: an
            // owner may free the channel (a broken read, a sweep) while
            // this loop writes, and a new claimer's records then lie
            // where our tail points; the word each record zeroes ahead
            // of itself would unpublish one of theirs, which nothing
            // reports (`docs/design.md`, "Publishing in band").
            if self.tail != start && !self.still_ours(&c, gen) {
                self.chan = None;
                break Err(Error::ConnAborted);
            }
            if !o.started && (o.lead.is_some() || self.cma_ok(&c, o)) {
                match self.write_one(&c, o) {
                    Some(true) => continue,
                    Some(false) if o.lead.is_some() => break Err(Error::Io),
                    Some(false) => {}
                    None if asked || self.spins => break Ok(false),
                    None => {
                        self.seg.store32(c.ctl(C_TX_WAIT), 1, Ordering::Relaxed);
                        fence(Ordering::SeqCst);
                        asked = true;
                        continue;
                    }
                }
            }
            let (_, fit) = self.fit_for(&c, o.len - o.off).ok_or(Error::Io)?;
            let n = fit.map_or(0, |(_, max)| max.min(o.len - o.off));
            if fit.is_none() || (n == 0 && o.len > o.off) {
                // A spinning endpoint looks again on its next pass; its
                // driver asks before it sleeps (`ask_ring`). Asked here,
                // the receiver rang it 1.6 times a 1 MiB message.
                if asked || self.spins {
                    break Ok(false);
                }
                // Ask the receiver to ring us when it consumes, then look
                // once more: it may have consumed before seeing the ask.
                self.seg.store32(c.ctl(C_TX_WAIT), 1, Ordering::Relaxed);
                fence(Ordering::SeqCst);
                asked = true;
                continue;
            }
            let Some((pad, _)) = fit else {
                break Ok(false);
            };
            let last = o.off + n == o.len;
            let word =
                if o.started { K_CONT } else { K_FIRST | o.flags } | if last { F_LAST } else { 0 };
            let h = RecHead {
                word,
                len: n as u32,
                tag: o.tag,
                data: o.data,
                total: o.len as u64,
            };
            // Published record by record (`put_record`): the receiver
            // drains while the rest is written.
            self.put_record(&c, pad, &h, &o.iov, o.off, n);
            o.off += n;
            o.started = true;
        };
        if self.tail != start {
            self.wake();
        }
        r
    }

    /// Writes a message of `len` bytes as one record and publishes it, if
    /// the channel is ours, accepted, and has room now. False: nothing
    /// written. Always inlined into its one caller, the send's direct
    /// path (`EpShared::offer`): called, it cost a send the call's
    /// saving and restoring of registers and the hand-over of its six
    /// arguments.
    #[inline(always)]
    pub(super) fn write_whole(
        &mut self,
        flags: u32,
        tag: u64,
        data: u64,
        iov: &Iov,
        len: usize,
    ) -> bool {
        let (Some((c, gen)), None) = (self.chan, &self.awaiting) else {
            return false;
        };
        if !self.still_ours(&c, gen) || len > self.g.chunk() {
            return false;
        }
        let Some((_, Some((pad, max)))) = self.fit_for(&c, len) else {
            return false;
        };
        if max < len {
            return false;
        }
        let h = RecHead {
            word: K_FIRST | flags | F_LAST,
            len: len as u32,
            tag,
            data,
            total: len as u64,
        };
        self.put_record(&c, pad, &h, iov, 0, len);
        self.wake();
        true
    }

    /// Writes the padding `pad` (to the ring's end), the record header
    /// `h` and `n` bytes of `iov` from `off`, publishes the record (its
    /// first word, last) and moves the tail past it; ringing the
    /// receiver is the caller's. Always inlined: with the one-buffer
    /// copy inlined into it, the compiler kept it out of line, a call
    /// on every send.
    #[inline(always)]
    fn put_record(&mut self, c: &Chan, pad: usize, h: &RecHead, iov: &Iov, off: usize, n: usize) {
        // The ring taken once for the padding, the header, the word ahead
        // and the record's word: each then a mask and an alignment test.
        let Some(ring) = c.area(&self.seg) else {
            // Not reached: the peer's geometry was checked against its
            // mapping (`header_geometry`), and its rings lie inside.
            return;
        };
        self.tail = crate::ring::write_pad_in(&ring, self.tail, pad);
        let (at, next) = crate::ring::write_head_in(&ring, self.tail, h);
        crate::ring::copy_out(&self.seg, at, iov, off, n);
        crate::ring::publish_in(&ring, self.tail, h.word);
        self.tail = next;
    }

    /// Where the next record of up to `want` payload bytes goes:
    /// `Some((free, fit))`, `fit` as [`Chan::fit`] says with `free` bytes
    /// free, against the head last read and, when that leaves too little
    /// room, the head read again; `None` when the head read lies (more
    /// than a ring behind the tail). Inlined: called, with the room in
    /// its answer, it cost a 64 B round trip about 36 instructions more
    /// (callgrind, `docs/benchmarks.md`, "shm state word").
    #[inline(always)]
    fn fit_for(&mut self, c: &Chan, want: usize) -> Option<(usize, Option<(usize, usize)>)> {
        let want = want.min(self.g.chunk());
        if let Some(free) = c.room_after(self.head_seen, self.tail) {
            let fit = c.fit(self.tail, free);
            if fit.is_some_and(|(_, max)| max >= want) {
                return Some((free, fit));
            }
        }
        self.head_seen = c.head(&self.seg);
        let free = c.room_after(self.head_seen, self.tail)?;
        Some((free, c.fit(self.tail, free)))
    }

    /// Whether `o` goes as a CMA record: of the sizes where it pays, few
    /// enough buffers, and the receiver said it can read us. Above
    /// `cma::max_len()` only when the channel is idle — the receiver has
    /// consumed all we wrote and nothing waits behind `o` — as in a
    /// ping-pong, where one copy on the receiver's core beats two; while
    /// messages stream, the ring's two copies on two cores pipeline and
    /// win (`docs/benchmarks.md`, "Where CMA pays") — unless the copy is
    /// split between both cores (`offers_split`), which wins streamed
    /// too (`docs/benchmarks.md`, "Split copies").
    fn cma_ok(&self, c: &Chan, o: &Out) -> bool {
        let size_ok = o.len >= crate::cma::CMA_MIN
            && (o.len <= crate::cma::max_len()
                || self.offers_split(o.len)
                || (crate::cma::idle_large()
                    && self.queue.is_empty()
                    && c.head(&self.seg) == self.tail));
        size_ok
            && o.iov.len() <= crate::cma::MAX_RANGES
            && (self.cma_pays() || self.split_pays(o.len))
            && self.seg.load32(c.ctl(C_CMA), Ordering::Acquire) == Some(CMA_OK)
    }

    /// Whether a large transfer to this peer pays by CMA rather than the
    /// ring: not while both sides spin ([`crate::cma::pays`]).
    pub(super) fn cma_pays(&self) -> bool {
        crate::cma::pays(self.spins, self.receiver_sleeps())
    }

    /// Whether a CMA send of `len` bytes pays although both sides spin:
    /// the owner and we each copy half (`split`), which beats the ring's
    /// pipelined two copies from [`crate::split::spin_min`] up.
    fn split_pays(&self, len: usize) -> bool {
        len >= crate::split::spin_min() && self.offers_split(len)
    }

    /// The receiver's header says its task sleeps (`H_SLEEPING`).
    #[inline]
    fn receiver_sleeps(&self) -> bool {
        self.seg.load32(H_SLEEPING, Ordering::Relaxed) == Some(1)
    }

    /// Writes `o`'s lead record (an RMA request or response), or all of
    /// `o` as one CMA record, if the ring has room: `Some(true)` written,
    /// `None` no room now, `Some(false)` not possible (a CMA send takes
    /// the copy path; a lead fails).
    fn write_one(&mut self, c: &Chan, o: &mut Out) -> Option<bool> {
        let (word, tag, data, p) = match o.lead.as_deref() {
            Some(l) => {
                let last = if o.len == 0 { F_LAST } else { 0 };
                let p: SmallVec<[u8; crate::cma::ANNOUNCE_MAX]> = l.arg().iter().copied().collect();
                (l.word | last, l.tag, l.data, p)
            }
            None => {
                let ranges: SmallVec<[(u64, u64); crate::cma::MAX_RANGES]> = o
                    .iov
                    .iter()
                    .map(|b| (b.as_ptr() as usize as u64, b.len() as u64))
                    .collect();
                // From one of our shared pools: the receiver may map it.
                let pool = crate::pool::lookup(&ranges);
                let a = crate::cma::Announce { ranges, pool };
                let split = if self.offers_split(o.len) { F_SPLIT } else { 0 };
                (
                    K_CMA | o.flags | F_LAST | split,
                    o.tag,
                    o.data,
                    a.encode().into_iter().collect(),
                )
            }
        };
        let Some((free, fit)) = self.fit_for(c, p.len()) else {
            // A broken head: the copy path fails the send.
            return Some(false);
        };
        let (mut pad, max) = fit?;
        if max < p.len() {
            if p.len() > self.g.chunk() {
                return Some(false);
            }
            // Not split, so it goes whole: at the ring's beginning when it
            // does not fit before the end (`fit` pads only when less than
            // a small record's room is left), else when there is room, in
            // the room `fit_for` found (with the head read again).
            pad = c.pad_whole(self.tail, free, p.len())?;
        }
        // The ring taken once, as `put_record` does.
        let Some(ring) = c.area(&self.seg) else {
            // Not reached: the peer's rings were checked against its
            // mapping (`header_geometry`).
            return Some(false);
        };
        self.tail = crate::ring::write_pad_in(&ring, self.tail, pad);
        let h = RecHead {
            word,
            len: p.len() as u32,
            tag,
            data,
            total: o
                .lead
                .as_ref()
                .and_then(|l| l.total)
                .unwrap_or(o.len as u64),
        };
        let (at, next) = crate::ring::write_head_in(&ring, self.tail, &h);
        self.seg.write(at, &p);
        crate::ring::publish_in(&ring, self.tail, h.word);
        self.tail = next;
        o.started = true;
        if o.lead.is_none() {
            o.off = o.len;
            o.cma = true;
        }
        Some(true)
    }

    /// Rings the receiver's doorbell if it said it sleeps.
    pub(super) fn wake(&self) {
        // Pairs with the receiver's fence between announcing its sleep
        // and looking at the rings once more.
        fence(Ordering::SeqCst);
        if self.receiver_sleeps() && self.seg.swap32(H_SLEEPING, 0) == Some(1) {
            if let Some(b) = &self.bell {
                crate::bell::ring(b);
            }
        }
    }
}
