//! The send side. Sending to a peer maps its segment (once) and claims
//! one of its channels, a single-producer ring this endpoint alone writes.
//! A message is copied from the caller's buffers into the ring by the
//! posting thread — records of at most a quarter ring, so a long message
//! streams while the receiver drains — and completes once its last byte
//! is in the ring. What does not fit waits in the peer's queue, in order,
//! until the receiver makes room (it rings our doorbell when we ask).
//! Only the owner of a ring's head can free room; a head that lies (more
//! than a ring behind or ahead) fails the peer's sends.
//!
//! A fenced operation (`FI_FENCE`) to a peer waits in its queue, with
//! everything posted after it, until every earlier operation to that
//! peer has completed: sends waiting for delivery, RMA and atomics
//! waiting for their answers (`docs/design.md`, "Ordering and fences on
//! shm").

use std::collections::VecDeque;
use std::fs::File;
use std::sync::atomic::{fence, Ordering};

use smallvec::SmallVec;
use weft_core::addr::FiAddr;
use weft_core::completion::OpDone;
use weft_core::provider::Iov;
use weft_core::{Error, Result};

use crate::endpoint::EpShared;
use crate::keyproof::Verdict;
use crate::keys::EpKeys;
use crate::layout::*;
pub use crate::out::{Addr, AfterEnqueue, Ended, EndedList, Out};
use crate::ring::{Chan, RecHead};
use crate::rma::Lead;
use crate::segment::Segment;
pub use crate::tx_drive::finish;

mod answers;
mod post;
pub use answers::Answered;
pub use post::Offered;

/// A delivery-complete send wholly in the ring, waiting for the
/// receiver's head to pass `end`.
#[derive(Debug)]
struct Delivering {
    end: u64,
    len: usize,
    done: Option<OpDone>,
    /// A CMA send's buffers: the receiver reads them until it consumes
    /// the record.
    keep: Option<Iov>,
}

/// A peer this endpoint sends to.
#[derive(Debug)]
pub struct Peer {
    pub(crate) name: String,
    seg: Segment,
    g: Geometry,
    /// The claimed channel and its claim count; `None` while all are
    /// taken.
    chan: Option<(Chan, u32)>,
    /// Our produced position.
    tail: u64,
    /// The consumer's head as we last read it. Reading the head word
    /// each send cost a cache miss (the receiver writes it at every
    /// record it consumes); it is read again only when the room this
    /// one leaves is too little.
    head_seen: u64,
    /// The segment's owner when mapped.
    pub(crate) owner: (u32, u64),
    /// Its endpoint serial (`H_SERIAL`): with `owner`, the target
    /// instance our requests go to, which an answer channel must name
    /// (`Peers::answered`).
    serial: u64,
    bell: Option<File>,
    queue: VecDeque<Out>,
    delivering: VecDeque<Delivering>,
    /// RMA operations sent to this peer, waiting for its responses, in
    /// the order their requests began (it answers in that order; each
    /// answer names its request by id).
    pub pending: VecDeque<crate::rma::Pending>,
    /// An answer's bytes are arriving (its operation left `pending`
    /// when they began).
    answering: bool,
    /// That operation's request id and sequence number, not to be given
    /// again meanwhile.
    answering_id: u32,
    answering_seq: u64,
    /// Stranded operations' sequence numbers and ids, oldest first,
    /// whose requests the target may still answer (`Peers::strand`):
    /// their ids are not given again until that answer, or one to a
    /// later request, arrives (`answers.rs`).
    ghosts: answers::Ghosts,
    /// The claimed channel waits for the owner's verdict on the key
    /// (`keyproof`): nothing is written before it.
    awaiting: Option<crate::keyproof::Awaiting>,
    /// The owner refused the key (or its proof was not good) since the
    /// endpoint last looked: to be counted and reported once.
    pub(crate) refused: bool,
    /// `FI_AV_AUTH_KEY`: the AV key handle its channel proves (or will,
    /// once claimed). One key per peer at a time: an operation under
    /// another key fails (`KeyRejected`) while the channel lives.
    proves: Option<FiAddr>,
    /// Our endpoint spins (inline or busy-poll progress): large
    /// transfers go through the ring unless the receiver sleeps
    /// (`cma::pays`).
    spins: bool,
}

/// The peers sent to, by address.
#[derive(Debug, Default)]
pub struct Peers {
    pub(crate) map: crate::by_addr::ByAddr<Peer>,
    /// The destination resolved last (`post.rs`).
    last: Option<post::LastDest>,
    /// The sequence number the next RMA request takes, whatever its
    /// peer: endpoint-wide, so a peer record made again for a target
    /// does not give its first ids again (`answers::fresh_id`).
    pub(crate) next_seq: u64,
}

/// How long closing waits for a receiver to read CMA sends out: a
/// receiver that takes longer reads freed memory (its receive gets
/// garbage or fails; our memory is not written).
const CMA_SETTLE: std::time::Duration = std::time::Duration::from_millis(200);

impl EpShared {
    /// Whether this endpoint spins (inline or busy-poll progress), which
    /// decides how its large transfers go (`cma::pays`).
    fn spinning_wait(&self) -> bool {
        self.cfg.wait != weft_core::completion::WaitMode::Interrupt
    }

    /// Maps the segment of the endpoint named `name`, to send to it.
    pub(crate) fn open_peer(&self, name: &str) -> Result<Peer> {
        Peer::open(name, self.spinning_wait())
    }
}

impl Peers {
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Bytes waiting in the queue to the endpoint at `addr` (not yet in
    /// its ring).
    pub fn backlog(&mut self, addr: &[u8]) -> usize {
        self.map
            .get_mut(addr)
            .map_or(0, |p| p.queue.iter().map(|o| o.len - o.off).sum())
    }

    /// Whether the answer to an operation sent to the peer at `addr` is
    /// arriving: its operation has not completed, and a fence waits.
    pub fn set_answering(&mut self, addr: &[u8], on: bool) {
        if let Some(p) = self.map.get_mut(addr) {
            p.answering = on;
        }
    }

    /// The endpoint closes: every claimed channel is handed back
    /// (`CLOSED`: the receiver frees it once drained).
    pub fn release(self) {
        for p in self.map.into_values() {
            p.settle_cma();
            if let Some((c, gen)) = p.chan {
                c.give_back(&p.seg, gen);
            }
        }
    }
}

impl Peer {
    /// Maps `name`'s segment and checks its header, for an endpoint that
    /// `spins` (not interrupt mode). `ConnRefused` when there is no such
    /// endpoint (any more), or what is under its segment's name is no
    /// segment (a FIFO, a directory, a file of no segment's size:
    /// `Segment::open`'s `Inval`, the name being valid).
    fn open(name: &str, spins: bool) -> Result<Peer> {
        let min = Geometry::check(1, RING_MIN as u32)
            .map(|g| g.bytes())
            .unwrap_or(HEADER);
        let max = Geometry::check(CHANNELS_MAX as u32, RING_MAX as u32)
            .map(|g| g.bytes())
            .unwrap_or(HEADER);
        let mut seg =
            Segment::open(&crate::name::seg_name(name), min, max).map_err(|e| match e {
                Error::NoEnt | Error::Inval => Error::ConnRefused,
                e => e,
            })?;
        let owner = crate::live::owner_of(&seg).ok_or(Error::ConnRefused)?;
        let serial = seg
            .load64(H_SERIAL, Ordering::Acquire)
            .ok_or(Error::ConnRefused)?;
        let g = crate::ring::header_geometry(&seg).ok_or(Error::ConnRefused)?;
        // Its rings checked against the mapping once (`Chan::area`); a
        // geometry whose rings would not fit was refused just above.
        seg.set_rings(g.rings(), g.channels, g.ring);
        if !crate::live::owner_runs(name, (owner.0, owner.1, serial)) {
            return Err(Error::ConnRefused);
        }
        Ok(Peer {
            name: name.to_owned(),
            seg,
            g,
            chan: None,
            tail: 0,
            head_seen: 0,
            owner,
            serial,
            bell: crate::bell::open_remote(name),
            queue: VecDeque::new(),
            delivering: VecDeque::new(),
            pending: VecDeque::new(),
            answering: false,
            answering_id: 0,
            answering_seq: 0,
            ghosts: answers::Ghosts::default(),
            awaiting: None,
            refused: false,
            proves: None,
            spins,
        })
    }

    /// Waits (a bounded time) for the receiver to have read the CMA sends
    /// still out: their buffers are freed after this.
    fn settle_cma(&self) {
        let Some((c, _)) = self.chan else {
            return;
        };
        let Some(end) = self
            .delivering
            .iter()
            .rev()
            .find(|d| d.keep.is_some())
            .map(|d| d.end)
        else {
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

    /// Claims a free channel, if there is one, proving the key `keys`
    /// hold for [`proves`](Self::proves).
    fn claim(&mut self, me: crate::live::Instance, my_name: &str, keys: &EpKeys) -> bool {
        if self.chan.is_some() {
            return true;
        }
        use Ordering::Release;
        for i in 0..self.g.channels {
            let c = Chan { g: self.g, i };
            let Some(gen) = c.begin_claim(&self.seg, me.0) else {
                continue;
            };
            let s = &self.seg;
            s.store32(c.ctl(C_PID), me.0, Release);
            s.store64(c.ctl(C_START), me.1, Release);
            s.store64(c.ctl(C_SERIAL), me.2, Release);
            // Each group of writes only while the claim is still ours: a
            // claim the owner voided (it took us for dead) may be the
            // next claimer's channel now. Narrowed, not closed: the owner
            // can void it right after a check (`Chan::still_claiming`).
            if !c.still_claiming(s, me.0, gen) {
                return false;
            }
            s.store32(c.ctl(C_NAME_LEN), my_name.len() as u32, Release);
            s.write(c.ctl(C_NAME), my_name.as_bytes());
            if !c.still_claiming(s, me.0, gen) {
                return false;
            }
            // Before `ACTIVE`: the receiver starts at position 0, whose
            // word must be 0 or a record of this claim's.
            c.clear_start(s);
            // A random source that failed (no nonce): the channel is
            // given straight back and the sends wait for the next try.
            let key = keys.key_for(self.proves);
            let Ok(proof) = crate::keyproof::prepare(s, &c, key, my_name, &self.name, gen) else {
                c.move_state(s, gen, claiming(me.0), CLOSED);
                return false;
            };
            // Checked after the proof's computation (a system call and a
            // MAC), right before its writes.
            if !c.still_claiming(s, me.0, gen) {
                return false;
            }
            let awaiting = proof.write(s, &c);
            if !c.still_claiming(s, me.0, gen) {
                return false;
            }
            // Waiting for the verdict: the owner rings us when it is in.
            s.store32(c.ctl(C_TX_WAIT), u32::from(awaiting.is_some()), Release);
            let probe = match crate::cma::mode() {
                crate::cma::Mode::Denied => 0,
                _ => crate::cma::probe_addr(),
            };
            s.store64(c.ctl(C_CMA_PROBE), probe, Release);
            if !c.move_state(s, gen, claiming(me.0), ACTIVE) {
                // The owner freed the claim, taking us for dead (a claim
                // that outlasted a sweep interval): not ours to finish;
                // the sends wait for the next try.
                return false;
            }
            self.awaiting = awaiting;
            self.chan = Some((c, gen));
            self.tail = 0;
            self.head_seen = 0;
            return true;
        }
        false
    }

    /// Writes as much of `o` as the ring takes. `Ok(true)`: all of it is
    /// in; `Ok(false)`: it waits for room; `Err`: the receiver broke the
    /// rules.
    fn advance(&mut self, o: &mut Out) -> Result<bool> {
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
    /// written.
    fn write_whole(&mut self, flags: u32, tag: u64, data: u64, iov: &Iov, len: usize) -> bool {
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
    /// receiver is the caller's.
    #[inline]
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
    /// win (`docs/benchmarks.md`, "Where CMA pays").
    fn cma_ok(&self, c: &Chan, o: &Out) -> bool {
        let size_ok = o.len >= crate::cma::CMA_MIN
            && (o.len <= crate::cma::max_len()
                || (crate::cma::idle_large()
                    && self.queue.is_empty()
                    && c.head(&self.seg) == self.tail));
        size_ok
            && o.iov.len() <= crate::cma::MAX_RANGES
            && self.cma_pays()
            && self.seg.load32(c.ctl(C_CMA), Ordering::Acquire) == Some(CMA_OK)
    }

    /// Whether a large transfer to this peer pays by CMA rather than the
    /// ring: not while both sides spin ([`crate::cma::pays`]).
    fn cma_pays(&self) -> bool {
        crate::cma::pays(self.spins, self.receiver_sleeps())
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
                let p: SmallVec<[u8; crate::cma::DIRECT_MAX]> = l.arg().iter().copied().collect();
                (l.word | last, l.tag, l.data, p)
            }
            None => {
                let a = crate::cma::Announce {
                    ranges: o
                        .iov
                        .iter()
                        .map(|b| (b.as_ptr() as usize as u64, b.len() as u64))
                        .collect(),
                };
                (
                    K_CMA | o.flags | F_LAST,
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

    /// Whether the claimed channel `c` (claim count `gen`) is still ours:
    /// an owner that freed it (it took us for dead or broken) may have
    /// given it to another sender. Its state word is read through the
    /// control block, checked against the mapping once.
    fn still_ours(&self, c: &Chan, gen: u32) -> bool {
        c.block(&self.seg).is_some_and(|b| {
            b.load64(C_STATE_GEN, Ordering::Acquire) == Some(state_gen(ACTIVE, gen))
        })
    }

    /// Rings the receiver's doorbell if it said it sleeps.
    fn wake(&self) {
        // Pairs with the receiver's fence between announcing its sleep
        // and looking at the rings once more.
        fence(Ordering::SeqCst);
        if self.receiver_sleeps() && self.seg.swap32(H_SLEEPING, 0) == Some(1) {
            if let Some(b) = &self.bell {
                crate::bell::ring(b);
            }
        }
    }

    /// The cheap check of every send: the owner has not closed the
    /// endpoint (it clears the pid in its header).
    fn alive_now(&self) -> bool {
        self.seg.load32(H_PID, Ordering::Relaxed) == Some(self.owner.0)
    }

    /// Whether the instance mapped still owns its segment and runs (not
    /// whoever holds the name now: `live::owner_runs`).
    pub(crate) fn alive(&self) -> bool {
        crate::live::owner_of(&self.seg) == Some(self.owner)
            && crate::live::owner_runs(&self.name, self.instance())
    }

    /// A send is wholly in the ring: it ends now, or (delivery-complete)
    /// once the receiver's head passes it.
    fn written(&mut self, o: Out, ended: &mut EndedList) {
        if !o.waits() {
            ended.push((o.done, o.len, Ok(())));
            return;
        }
        self.delivering.push_back(Delivering {
            end: self.tail,
            len: o.len,
            done: o.done,
            keep: o.cma.then_some(o.iov),
        });
        // No ask to be rung here: whoever drives us polls the head while
        // it spins, and asks (`ask_ring`) only before it sleeps. Asked
        // here, the receiver rang once a large message in spinning modes
        // too (`docs/benchmarks.md`, "shm RDM").
        self.delivered(ended);
    }

    /// Ends the delivery-complete sends the receiver's head has passed.
    fn delivered(&mut self, ended: &mut EndedList) {
        let Some((c, _)) = self.chan else {
            return;
        };
        let head = c.head(&self.seg);
        self.delivered_to(head, ended);
    }

    /// [`delivered`](Self::delivered) against a head already read.
    fn delivered_to(&mut self, head: u64, ended: &mut EndedList) {
        while let Some(d) = self.delivering.front() {
            // Within one ring behind the tail: a head elsewhere is the
            // receiver resetting a freed channel, not progress.
            let behind = self.tail.wrapping_sub(head);
            let passed = behind <= self.tail.wrapping_sub(d.end);
            if !passed {
                return;
            }
            if let Some(d) = self.delivering.pop_front() {
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

    /// Whether sends wait here (queued, or for delivery).
    pub(crate) fn busy(&self) -> bool {
        !self.queue.is_empty() || !self.delivering.is_empty() || !self.pending.is_empty()
    }

    /// Whether an operation to this peer has begun and not completed.
    fn outstanding(&self) -> bool {
        !self.delivering.is_empty() || !self.pending.is_empty() || self.answering
    }

    /// `o` begins: its answer is waited for from now. An RMA request
    /// with a direct form goes direct if the owner read our probe: its
    /// lead is the direct one, nothing follows it, and its buffers stay
    /// exposed in the operation until the answer. The request takes its
    /// id here, in the order requests enter the ring, from the
    /// endpoint's sequence `seq` (`Peers::next_seq`).
    fn begin(&mut self, o: &mut Out, seq: &mut u64) {
        if let Some(mut p) = o.answer.take() {
            if let Some(d) = o.direct.take() {
                if self.direct_ready() && self.cma_pays() {
                    o.lead = Some(d);
                    o.len = 0;
                    p.go_direct(std::mem::take(&mut o.iov));
                }
            }
            (p.seq, p.id) = self.new_id(seq);
            if let Some(l) = o.lead.as_deref_mut() {
                l.word = (l.word & !ID_MASK) | (p.id << ID_SHIFT);
            }
            self.pending.push_back(*p);
        }
    }

    /// Whether the owner accepted our claim and can read our memory.
    fn direct_ready(&self) -> bool {
        self.awaiting.is_none()
            && self.chan.is_some_and(|(c, _)| {
                self.seg.load32(c.ctl(C_CMA), Ordering::Acquire) == Some(CMA_OK)
            })
    }

    /// Sends queued sends while the ring takes them.
    pub(crate) fn flush(
        &mut self,
        me: crate::live::Instance,
        my_name: &str,
        keys: &EpKeys,
        seq: &mut u64,
        ended: &mut EndedList,
    ) {
        if let Some((c, gen)) = self.chan {
            // The owner freed our channel (it found a record of ours
            // broken, or a CMA read of our memory failed): what waits
            // for its head or its answers never comes.
            if !self.still_ours(&c, gen) {
                self.chan = None;
                self.fail_all(Error::ConnAborted, ended);
                return;
            }
        }
        self.delivered(ended);
        if self.queue.is_empty() || !self.claim(me, my_name, keys) {
            return;
        }
        while let Some(mut o) = self.queue.pop_front() {
            if o.fence {
                if self.outstanding() {
                    self.queue.push_front(o);
                    return;
                }
                o.fence = false;
            }
            self.begin(&mut o, seq);
            match self.advance(&mut o) {
                Ok(true) => self.written(o, ended),
                Ok(false) => {
                    self.queue.push_front(o);
                    return;
                }
                Err(e) => {
                    ended.push((o.done, o.len, Err(e)));
                    self.fail_all(e, ended);
                    return;
                }
            }
        }
    }

    /// Gives up a channel a record of ours was unpublished in under us,
    /// failing what waits (`FI_ECONNABORTED`, as when the owner frees a
    /// channel it finds broken); true if it did. Called by the sweep,
    /// off the message path, under the peers lock. The crux: every write
    /// of ours to the ring (records, pads, the 0 after each) happens under
    /// that same lock, so none is half done while we look. Every record
    /// from the owner's head to our tail is ours and published, and the 0
    /// we store after a record lands only at our tail; the one other 0 of
    /// ours is the one at ring offset 0 (`clear_start` at the claim, and
    /// `write_pad` wrapping to the ring's start), and that too is the
    /// word at our tail then, never between the head and it. So a 0 at that
    /// head is another writer's store: a sender that lost the channel
    /// before our claim writing on (`advance` looks before each record,
    /// which narrows that to the record it is writing, but does not close
    /// it: its header or payload stores can still land in our records).
    /// The owner would wait at the word forever and our ring would fill.
    /// Given back `CLOSED`, the owner frees it (drained up to the 0) and
    /// our next send claims anew. The give-back compares the state word
    /// at our claim's count (`Chan::give_back`): should the owner free
    /// the channel and another sender claim it between the re-check and
    /// the give-back, the word is at a later count and nothing moves.
    pub(crate) fn drop_if_unpublished(&mut self, ended: &mut EndedList) -> bool {
        let Some((c, gen)) = self.chan else {
            return false;
        };
        if self.awaiting.is_some() || !self.still_ours(&c, gen) {
            return false;
        }
        let head = c.head(&self.seg);
        let unpublished = head != self.tail
            && c.room_after(head, self.tail).is_some()
            && c.published_at(&self.seg, head) == Some(false);
        // The word's load is Relaxed (it is the receiver's hot-path
        // look); without this fence it could be satisfied after the
        // re-check's load of the state on a weak-memory CPU, and the
        // re-check would not cover a free and a new claim before it.
        fence(Ordering::Acquire);
        // Looked at again: freed meanwhile, the head read may be the
        // next claim's 0 (`flush` ends what waits then).
        let lost = unpublished && self.still_ours(&c, gen);
        if lost {
            tracing::debug!(peer = %self.name, "shm: a record of ours unpublished; channel given back");
            // The sends the head already passed arrived: they complete.
            self.delivered_to(head, ended);
            c.give_back(&self.seg, gen);
            self.chan = None;
            self.fail_all(Error::ConnAborted, ended);
            // A sleeping owner frees the channel now, not at its next
            // wake-up.
            self.wake();
        }
        lost
    }

    pub(crate) fn fail_all(&mut self, e: Error, ended: &mut EndedList) {
        for o in self.queue.drain(..) {
            ended.push((o.done, o.len, Err(e)));
            if let Some(p) = o.answer {
                let p = *p;
                ended.push((Some(p.done), p.len, Err(e)));
            }
        }
        ended.extend(self.delivering.drain(..).map(|d| (d.done, d.len, Err(e))));
        ended.extend(
            self.pending
                .drain(..)
                .map(|p| (Some(p.done), p.len, Err(e))),
        );
    }
}
