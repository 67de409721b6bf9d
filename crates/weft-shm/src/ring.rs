//! One channel's ring: a single-producer, single-consumer byte ring of
//! records (`docs/wire.md`, "The shm segment"). The producer owns `tail`
//! and the consumer `head`; each keeps its own position and never trusts
//! the other's word beyond what the checks here allow. Records are
//! published in band (layout version 8): a record's first word, written
//! last, says it is there, and the consumer polls the word at its head
//! rather than a tail word in the control block, so a message moves no
//! cache line besides its own. A record is accepted only if it lies
//! inside the ring, with a known kind and flags and a length within the
//! chunk.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use crate::layout::*;
use crate::segment::{Block, Ring, Segment};

/// A record's header, as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecHead {
    /// Kind and flags.
    pub word: u32,
    /// Payload bytes in this record.
    pub len: u32,
    pub tag: u64,
    pub data: u64,
    /// The whole message's length (first records).
    pub total: u64,
}

impl RecHead {
    pub fn kind(&self) -> u32 {
        self.word & 0xff
    }

    pub fn has(&self, f: u32) -> bool {
        self.word & f != 0
    }

    /// A request's id (`ID_MASK`; 0 for other records).
    pub fn id(&self) -> u32 {
        self.word >> ID_SHIFT
    }

    fn encode(&self) -> [u8; REC_HDR] {
        let mut b = [0u8; REC_HDR];
        b[0..4].copy_from_slice(&self.word.to_ne_bytes());
        b[4..8].copy_from_slice(&self.len.to_ne_bytes());
        b[8..16].copy_from_slice(&self.tag.to_ne_bytes());
        b[16..24].copy_from_slice(&self.data.to_ne_bytes());
        b[24..32].copy_from_slice(&self.total.to_ne_bytes());
        b
    }

    fn decode(b: &[u8; REC_HDR]) -> RecHead {
        let w4 = |o: usize| {
            let mut a = [0u8; 4];
            a.copy_from_slice(&b[o..o + 4]);
            u32::from_ne_bytes(a)
        };
        let w8 = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[o..o + 8]);
            u64::from_ne_bytes(a)
        };
        RecHead {
            word: w4(0),
            len: w4(4),
            tag: w8(8),
            data: w8(16),
            total: w8(24),
        }
    }
}

/// A record found at the consumer's head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rec {
    pub head: RecHead,
    /// Segment offset of its payload (`head.len` bytes, inside the ring).
    pub payload: usize,
    /// The consumer's head after it.
    pub next: u64,
}

/// What the consumer finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Nothing published past the head.
    Empty,
    /// A checked record (padding already skipped).
    Rec(Rec),
    /// The producer broke the rules: the channel cannot be trusted.
    Corrupt,
}

/// Whether the bits of `word` past its kind and flags are a request's id
/// (`ID_MASK`, on request kinds only) or a CMA record's `F_SPLIT`: a
/// message's record stops at the test before. Out of line and cold: tested inline, it made the receive
/// pass keep its registers worse, 5.5 instructions more on a 64 B round
/// trip; out of line 3.3 remain (`docs/benchmarks.md`, "shm request
/// ids").
#[cold]
#[inline(never)]
fn request_bits(word: u32) -> bool {
    word & !0xff & !word_bits(word & 0xff) == 0
}

/// The first record of a message: its total length, if the record keeps
/// the rules (the total within `max_msg`, the record within the total,
/// a single record exactly the total).
pub fn check_first(h: &RecHead, max_msg: usize) -> Option<usize> {
    let total = usize::try_from(h.total).ok()?;
    let len = h.len as usize;
    let ok = total <= max_msg && len <= total && (!h.has(F_LAST) || len == total);
    ok.then_some(total)
}

/// A record of a message of `total` bytes of which `got` arrived: the
/// bytes arrived after it, if it keeps the rules (never past the total;
/// the last record ends exactly there).
pub fn check_next(h: &RecHead, got: usize, total: usize) -> Option<usize> {
    let now = got.checked_add(h.len as usize).filter(|&n| n <= total)?;
    (!h.has(F_LAST) || now == total).then_some(now)
}

/// The geometry a segment's header declares, if it is a ready segment of
/// this layout version whose size matches.
pub fn header_geometry(seg: &Segment) -> Option<Geometry> {
    if seg.load64(H_MAGIC, Acquire)? != MAGIC || seg.load32(H_VERSION, Acquire)? != VERSION {
        return None;
    }
    let g = Geometry::check(
        seg.load32(H_CHANNELS, Acquire)?,
        seg.load32(H_RING, Acquire)?,
    )?;
    (g.bytes() == seg.size()).then_some(g)
}

/// One channel of a segment whose geometry is known.
#[derive(Debug, Clone, Copy)]
pub struct Chan {
    pub g: Geometry,
    pub i: usize,
}

impl Chan {
    pub fn ctl(&self, field: usize) -> usize {
        self.g.ctl(self.i) + field
    }

    /// The channel's control block, checked against the mapping once
    /// (`None`: it is not inside, which a checked geometry rules out).
    #[inline]
    pub fn block<'a>(&self, seg: &'a Segment) -> Option<Block<'a, CTL>> {
        seg.block::<CTL>(self.g.ctl(self.i))
    }

    fn ring(&self) -> usize {
        self.g.ring_at(self.i)
    }

    /// The channel's ring, checked against the mapping (`None`: it is
    /// not inside, which a checked geometry rules out). Its words are
    /// then reached by a mask and an alignment test, no bound per word.
    /// The rings a segment's owner and its senders recorded
    /// (`Segment::set_rings`, from the geometry this channel's came from)
    /// take an index test; a segment without (tests, the fuzz target) is
    /// checked here.
    #[inline(always)]
    pub fn area<'a>(&self, seg: &'a Segment) -> Option<Ring<'a>> {
        match seg.ring_of(self.i) {
            Some(r) => Some(r),
            None => seg.ring(self.ring(), self.g.ring),
        }
    }

    /// Where position `at` falls in the ring. A mask, not `%`: the ring
    /// size is a power of two (`Geometry::check`), and a division by a
    /// size known only at run time took a `div` several times a message.
    fn pos(&self, at: u64) -> usize {
        (at & (self.g.ring as u64 - 1)) as usize
    }

    /// Segment offset of the first word of the record or padding at
    /// position `at`.
    #[inline(always)]
    fn word_at(&self, at: u64) -> usize {
        self.ring() + self.pos(at)
    }

    /// The consumer's published head.
    pub fn head(&self, seg: &Segment) -> u64 {
        seg.load64(self.ctl(C_HEAD), Acquire).unwrap_or(0)
    }

    /// Whether the word at `head` is set: a record (or padding) published
    /// there, as far as a look without the checks tells. `None`: the word
    /// is not a word inside the segment (a misaligned head).
    #[inline(always)]
    pub fn published_at(&self, seg: &Segment, head: u64) -> Option<bool> {
        self.area(seg)?.load32(head, Relaxed).map(|w| w != 0)
    }

    /// Producer, at a claim, before the channel goes `ACTIVE`: the word
    /// at position 0, where the consumer starts, reads 0 whatever an
    /// earlier claim left there (the invariant [`next`](Self::next)
    /// relies on: the word at the consumer's head is 0 or published).
    pub fn clear_start(&self, seg: &Segment) {
        seg.store32(self.word_at(0), 0, Release);
    }

    /// Consumer: the record at `head` (the consumer's own position),
    /// skipping padding. Published in band: a record's first word (never
    /// 0) is stored last, with release, after the word at the position
    /// after the record was set to 0; so the word at `head` is 0 (nothing
    /// yet) or a record whose bytes are all written, whatever an earlier
    /// lap of the ring left past it. Inlined into the reader's loop:
    /// called, the record it found was built and copied out once more per
    /// message.
    #[inline]
    pub fn next(&self, seg: &Segment, head: u64) -> Next {
        match self.area(seg) {
            Some(ring) => self.next_in(&ring, head),
            None => Next::Corrupt,
        }
    }

    /// [`next`](Self::next) in the channel's ring checked already
    /// ([`area`](Self::area)): a reader draining several records checks
    /// the ring against the mapping once.
    #[inline]
    pub fn next_in(&self, ring: &Ring<'_>, mut head: u64) -> Next {
        for _ in 0..2 {
            let pos = ring.pos(head);
            let to_end = ring.size() - pos;
            // The acquire pairs with the producer's release of the word:
            // everything the record holds is read after it.
            let Some(word) = ring.load32(head, Acquire) else {
                return Next::Corrupt;
            };
            if word == 0 {
                return Next::Empty;
            }
            if word == K_PAD {
                // The rest of the ring is padding; the next record starts
                // at the ring's beginning.
                head = head.wrapping_add(to_end as u64);
                continue;
            }
            if to_end < REC_HDR {
                // Only padding starts nearer the end.
                return Next::Corrupt;
            }
            let mut hb = [0u8; REC_HDR];
            // A whole header in one fixed-size read (inlined moves, not a
            // call of `memcpy`).
            if !ring.read(pos, &mut hb) {
                return Next::Corrupt;
            }
            let mut h = RecHead::decode(&hb);
            // The word judged is the one whose release the rest was read
            // after, not the copy's.
            h.word = word;
            let len = h.len as usize;
            let kind_ok = matches!(
                h.kind(),
                K_FIRST
                    | K_CONT
                    | K_CMA
                    | K_RMA_W
                    | K_RMA_R
                    | K_RESP
                    | K_ATOMIC
                    | K_RMA_WD
                    | K_RMA_RD
            ) && (h.word & !0xff & !F_ALL == 0 || request_bits(h.word));
            // The chunk, checked before the record's size is reckoned
            // from it: a hostile length would overflow it.
            if !kind_ok || len > self.g.chunk() {
                return Next::Corrupt;
            }
            let size = rec_len(len);
            if size > to_end {
                return Next::Corrupt;
            }
            return Next::Rec(Rec {
                head: h,
                payload: ring.seg_off(pos + REC_HDR),
                next: head.wrapping_add(size as u64),
            });
        }
        // Two paddings in a row.
        Next::Corrupt
    }

    /// Consumer: publishes `head`.
    pub fn consume(&self, seg: &Segment, head: u64) {
        seg.store64(self.ctl(C_HEAD), head, Release);
    }

    /// Producer: the bytes free for writing after `tail`, or `None` when
    /// the consumer's head is not within one ring behind it (a broken
    /// consumer).
    pub fn room(&self, seg: &Segment, tail: u64) -> Option<usize> {
        self.room_after(self.head(seg), tail)
    }

    /// [`room`](Self::room) against a head read earlier (the producer
    /// keeps the last one it read: the head only moves forward, so the
    /// room it gives is never more than there is). The last 8 bytes
    /// before the head are never room: every record written is followed
    /// by the 0 word at the position after it (`write_head`), which must
    /// not land on a record the consumer has not read. So a producer's
    /// tail is never more than `ring - 8` ahead of the head, and a head
    /// that says otherwise is a broken one.
    pub fn room_after(&self, head: u64, tail: u64) -> Option<usize> {
        let used = tail.wrapping_sub(head);
        let cap = self.g.ring - WORD_AHEAD;
        (used <= cap as u64).then(|| cap - used as usize)
    }

    /// Producer: the payload room of the next record at `tail` with
    /// `free` bytes free: `(pad, max payload)` where `pad` bytes of
    /// padding go first. `None`: no room now.
    pub fn fit(&self, tail: u64, free: usize) -> Option<(usize, usize)> {
        let pos = self.pos(tail);
        let to_end = self.g.ring - pos;
        // A record starts where its header fits with some payload;
        // otherwise the end of the ring is padding.
        let (pad, span) = if to_end >= REC_HDR + 64 {
            (0, to_end.min(free))
        } else {
            (to_end, free.saturating_sub(to_end).min(self.g.ring))
        };
        if pad > free || span < REC_HDR {
            return None;
        }
        let payload = ((span - REC_HDR) & !7).min(self.g.chunk());
        Some((pad, payload))
    }

    /// Producer: the padding that puts a record of `len` payload bytes,
    /// which may not be split (a lead or CMA record), whole at the ring's
    /// beginning, when [`fit`](Self::fit) gave no padding yet the record
    /// does not fit before the ring's end, and `free` (the room `fit` was
    /// given) covers both; `None` otherwise (it waits for room). `len` is
    /// at most the chunk: the caller's test, a longer record being never
    /// whole. Without it such a record with 96..112 bytes before the end
    /// waited for room the receiver, already drained, never made.
    pub fn pad_whole(&self, tail: u64, free: usize, len: usize) -> Option<usize> {
        debug_assert!(len <= self.g.chunk(), "a record over the chunk is split");
        let to_end = self.g.ring - self.pos(tail);
        let size = rec_len(len);
        (size > to_end && to_end + size <= free).then_some(to_end)
    }

    /// Producer: writes and publishes padding of `pad` bytes (to the
    /// ring's end) at `tail` and returns the tail after it. The word after
    /// it, at the ring's beginning, is set to 0 first, as after a record:
    /// the caller's room covers it (the record that follows padding
    /// starts there).
    pub fn write_pad(&self, seg: &Segment, tail: u64, pad: usize) -> u64 {
        match self.area(seg) {
            Some(ring) => write_pad_in(&ring, tail, pad),
            None => tail.wrapping_add(pad as u64),
        }
    }

    /// Producer: writes a record's header at `tail` but its first word,
    /// and 0 into the first word at the position after the record, and
    /// returns (payload offset, tail after the record). The caller writes
    /// the payload at the returned offset, then publishes the record with
    /// [`publish`](Self::publish). The caller checked the room with
    /// [`fit`](Self::fit), which keeps the word after the record free.
    pub fn write_head(&self, seg: &Segment, tail: u64, h: &RecHead) -> (usize, u64) {
        match self.area(seg) {
            Some(ring) => write_head_in(&ring, tail, h),
            None => (
                self.word_at(tail) + REC_HDR,
                tail.wrapping_add(rec_len(h.len as usize) as u64),
            ),
        }
    }

    /// Producer: publishes the record written at `tail` (its header by
    /// [`write_head`](Self::write_head), its payload by the caller) by
    /// storing its first word `word`, never 0.
    #[inline(always)]
    pub fn publish(&self, seg: &Segment, tail: u64, word: u32) {
        if let Some(ring) = self.area(seg) {
            publish_in(&ring, tail, word);
        }
    }
}

/// [`Chan::write_pad`] in the channel's ring ([`Chan::area`]).
#[inline(always)]
pub fn write_pad_in(ring: &Ring<'_>, tail: u64, pad: usize) -> u64 {
    if pad == 0 {
        return tail;
    }
    ring.store32(0, 0, Relaxed);
    ring.store32(tail, K_PAD, Release);
    tail.wrapping_add(pad as u64)
}

/// [`Chan::write_head`] in the channel's ring ([`Chan::area`]).
#[inline(always)]
pub fn write_head_in(ring: &Ring<'_>, tail: u64, h: &RecHead) -> (usize, u64) {
    let pos = ring.pos(tail);
    let next = tail.wrapping_add(rec_len(h.len as usize) as u64);
    // Set before the record's word is released, so the consumer that
    // reads the record reads 0 after it until the next is published,
    // not a record of an earlier lap.
    ring.store32(next, 0, Relaxed);
    ring.write(pos + 4, &h.encode()[4..]);
    (ring.seg_off(pos + REC_HDR), next)
}

/// [`Chan::publish`] in the channel's ring ([`Chan::area`]).
#[inline(always)]
pub fn publish_in(ring: &Ring<'_>, tail: u64, word: u32) {
    debug_assert!(word & 0xff != 0, "a record's word is never 0");
    ring.store32(tail, word, Release);
}

/// Bytes the producer keeps free before the consumer's head: the word
/// after its last record (`Chan::room_after`), rounded to the records'
/// alignment.
pub const WORD_AHEAD: usize = 8;

/// Copies bytes `off..off + n` of the message in `iov` to segment offset
/// `at`. The common case, one buffer, is inlined into the writer (one
/// copy, no walk of the list): called, it cost a send the call's saving
/// and restoring of registers.
#[inline(always)]
pub fn copy_out(seg: &Segment, at: usize, iov: &weft_core::provider::Iov, off: usize, n: usize) {
    if let [b] = iov.as_slice() {
        if let Some(part) = b.get(off..off + n) {
            seg.write(at, part);
            return;
        }
    }
    copy_out_walk(seg, at, iov, off, n);
}

/// [`copy_out`] of a message in several buffers (or a range past its
/// one buffer's end).
#[inline(never)]
fn copy_out_walk(
    seg: &Segment,
    mut at: usize,
    iov: &weft_core::provider::Iov,
    mut off: usize,
    mut n: usize,
) {
    for b in iov.iter() {
        if n == 0 {
            break;
        }
        if off >= b.len() {
            off -= b.len();
            continue;
        }
        let k = (b.len() - off).min(n);
        seg.write(at, &b[off..off + k]);
        at += k;
        n -= k;
        off = 0;
    }
}

#[cfg(test)]
mod tests;
