//! One channel's ring: a single-producer, single-consumer byte ring of
//! records (`docs/wire.md`, "The shm segment"). The producer owns `tail`
//! and the consumer `head`; each keeps its own position and never trusts
//! the other's word beyond what the checks here allow: a record is
//! accepted only if it lies wholly between the consumer's head and the
//! producer's tail, inside the ring, with a known kind and flags.

use std::sync::atomic::Ordering::{Acquire, Release};

use crate::layout::*;
use crate::segment::{Block, Segment};

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
/// (`ID_MASK`, on request kinds only): a message's record stops at the
/// test before. Out of line and cold: tested inline, it made the receive
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

    /// Where position `at` falls in the ring. A mask, not `%`: the ring
    /// size is a power of two (`Geometry::check`), and a division by a
    /// size known only at run time took a `div` several times a message.
    fn pos(&self, at: u64) -> usize {
        (at & (self.g.ring as u64 - 1)) as usize
    }

    /// The producer's published tail.
    pub fn tail(&self, seg: &Segment) -> u64 {
        seg.load64(self.ctl(C_TAIL), Acquire).unwrap_or(0)
    }

    /// The consumer's published head.
    pub fn head(&self, seg: &Segment) -> u64 {
        seg.load64(self.ctl(C_HEAD), Acquire).unwrap_or(0)
    }

    /// Consumer: the record at `head` (the consumer's own position),
    /// skipping padding.
    pub fn next(&self, seg: &Segment, head: u64) -> Next {
        let tail = self.tail(seg);
        self.next_below(seg, head, tail)
    }

    /// [`next`](Self::next) against a tail read already. Inlined into
    /// the reader's loop: called, the record it found was built and
    /// copied out once more per message.
    #[inline]
    pub fn next_below(&self, seg: &Segment, mut head: u64, tail: u64) -> Next {
        let r = self.g.ring as u64;
        for _ in 0..2 {
            let avail = tail.wrapping_sub(head);
            if avail == 0 {
                return Next::Empty;
            }
            if avail > r || head % 8 != 0 || avail % 8 != 0 {
                return Next::Corrupt;
            }
            let pos = self.pos(head);
            let to_end = self.g.ring - pos;
            let mut hb = [0u8; REC_HDR];
            // A whole header in one fixed-size read (inlined moves, not a
            // call of `memcpy`); only padding can start nearer the end.
            let ok = if to_end >= REC_HDR {
                seg.read(self.ring() + pos, &mut hb)
            } else {
                seg.read(self.ring() + pos, &mut hb[..to_end])
            };
            if !ok {
                return Next::Corrupt;
            }
            let h = RecHead::decode(&hb);
            if h.kind() == K_PAD && h.word & !0xff == 0 {
                // The rest of the ring is padding; the next record starts
                // at the ring's beginning.
                if (to_end as u64) > avail {
                    return Next::Corrupt;
                }
                head = head.wrapping_add(to_end as u64);
                continue;
            }
            let len = h.len as usize;
            let size = rec_len(len);
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
            if !kind_ok || to_end < REC_HDR || len > self.g.chunk() || size > to_end {
                return Next::Corrupt;
            }
            if size as u64 > avail {
                return Next::Corrupt;
            }
            return Next::Rec(Rec {
                head: h,
                payload: self.ring() + pos + REC_HDR,
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
    /// room it gives is never more than there is).
    pub fn room_after(&self, head: u64, tail: u64) -> Option<usize> {
        let used = tail.wrapping_sub(head);
        (used <= self.g.ring as u64).then(|| self.g.ring - used as usize)
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

    /// Producer: writes padding of `pad` bytes (to the ring's end) at
    /// `tail` and returns the tail after it.
    pub fn write_pad(&self, seg: &Segment, tail: u64, pad: usize) -> u64 {
        if pad == 0 {
            return tail;
        }
        let pos = self.pos(tail);
        let h = RecHead {
            word: K_PAD,
            ..RecHead::default()
        };
        let b = h.encode();
        seg.write(self.ring() + pos, &b[..pad.min(REC_HDR)]);
        tail.wrapping_add(pad as u64)
    }

    /// Producer: writes a record's header at `tail` (whose payload the
    /// caller writes at the returned offset) and returns (payload offset,
    /// tail after the record). The caller checked the room with
    /// [`fit`](Self::fit).
    pub fn write_head(&self, seg: &Segment, tail: u64, h: &RecHead) -> (usize, u64) {
        let pos = self.pos(tail);
        seg.write(self.ring() + pos, &h.encode());
        (
            self.ring() + pos + REC_HDR,
            tail.wrapping_add(rec_len(h.len as usize) as u64),
        )
    }

    /// Producer: publishes `tail`.
    pub fn publish(&self, seg: &Segment, tail: u64) {
        seg.store64(self.ctl(C_TAIL), tail, Release);
    }
}

/// Copies bytes `off..off + n` of the message in `iov` to segment offset
/// `at`.
pub fn copy_out(
    seg: &Segment,
    mut at: usize,
    iov: &weft_core::provider::Iov,
    mut off: usize,
    mut n: usize,
) {
    // The common case, one buffer: one copy, no walk of the list.
    if let [b] = iov.as_slice() {
        if let Some(part) = b.get(off..off + n) {
            seg.write(at, part);
            return;
        }
    }
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
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    fn small() -> (Segment, Chan) {
        let g = Geometry::check(2, 4096).unwrap();
        let seg = Segment::anonymous(&vec![0u8; g.bytes()]).unwrap();
        (seg, Chan { g, i: 1 })
    }

    fn put(c: &Chan, seg: &Segment, tail: &mut u64, payload: &[u8], word: u32) -> bool {
        let free = c.room(seg, *tail).unwrap();
        let Some((pad, max)) = c.fit(*tail, free) else {
            return false;
        };
        if max < payload.len() {
            return false;
        }
        *tail = c.write_pad(seg, *tail, pad);
        let h = RecHead {
            word,
            len: payload.len() as u32,
            tag: 9,
            data: 8,
            total: payload.len() as u64,
        };
        let (off, t) = c.write_head(seg, *tail, &h);
        seg.write(off, payload);
        *tail = t;
        c.publish(seg, *tail);
        true
    }

    #[test]
    fn records_go_round_the_ring_in_order() {
        let (seg, c) = small();
        let (mut tail, mut head) = (0u64, 0u64);
        for i in 0..500u32 {
            let p = vec![i as u8; (i as usize * 7) % 3000];
            // The sender splits where the ring's end or the chunk limit
            // says; the receiver reassembles.
            let mut off = 0;
            let mut got = Vec::new();
            loop {
                let free = c.room(&seg, tail).unwrap();
                let (pad, max) = c.fit(tail, free).unwrap();
                let n = max.min(p.len() - off);
                tail = c.write_pad(&seg, tail, pad);
                let last = off + n == p.len();
                let word = if off == 0 { K_FIRST | F_TAGGED } else { K_CONT }
                    | if last { F_LAST } else { 0 };
                let h = RecHead {
                    word,
                    len: n as u32,
                    tag: 9,
                    data: 8,
                    total: p.len() as u64,
                };
                let (at, t) = c.write_head(&seg, tail, &h);
                seg.write(at, &p[off..off + n]);
                tail = t;
                off += n;
                c.publish(&seg, tail);
                let Next::Rec(r) = c.next(&seg, head) else {
                    panic!("record {i}")
                };
                assert_eq!(r.head, h);
                let mut b = vec![0u8; n];
                assert!(seg.read(r.payload, &mut b));
                got.extend_from_slice(&b);
                head = r.next;
                c.consume(&seg, head);
                if last {
                    break;
                }
            }
            assert_eq!(got, p);
            assert_eq!(c.next(&seg, head), Next::Empty);
        }
    }

    #[test]
    fn a_full_ring_refuses_and_lies_are_corrupt() {
        let (seg, c) = small();
        let mut tail = 0;
        let p = vec![1u8; 1000];
        let mut n = 0;
        while put(&c, &seg, &mut tail, &p, K_FIRST | F_LAST) {
            n += 1;
        }
        assert_eq!(n, 3, "three records of 1032 bytes fill 4 KiB");
        // A tail more than a ring ahead of the head.
        assert_eq!(c.next_below(&seg, 0, 8192), Next::Corrupt);
        // A tail behind the head.
        assert_eq!(c.next_below(&seg, 64, 8), Next::Corrupt);
        // An unknown kind.
        seg.write(c.g.ring_at(1), &11u32.to_ne_bytes());
        assert_eq!(c.next(&seg, 0), Next::Corrupt);
        // A length past the published tail.
        seg.write(c.g.ring_at(1), &(K_FIRST | F_LAST).to_ne_bytes());
        seg.write(c.g.ring_at(1) + 4, &2000u32.to_ne_bytes());
        assert_eq!(c.next_below(&seg, 0, 1032), Next::Corrupt);
        // A head the consumer published beyond the ring is a broken one.
        c.consume(&seg, 1 << 40);
        assert_eq!(c.room(&seg, 0), None);
    }

    /// A request's id bits pass on requests only; every other bit past
    /// the kind and flags (bit 11; id bits on a message, an answer, a
    /// continuation) still breaks the rules.
    #[test]
    fn only_requests_carry_an_id() {
        let id = ID_MAX << ID_SHIFT;
        for (word, ok) in [
            (K_RMA_R | F_LAST | id, true),
            (K_RMA_W | (5 << ID_SHIFT), true),
            (K_ATOMIC | id, true),
            (K_RMA_WD | F_LAST | id, true),
            (K_RMA_RD | F_LAST | (1 << ID_SHIFT), true),
            (K_RMA_R | F_LAST | (1 << 11), false),
            (K_FIRST | F_LAST | (1 << ID_SHIFT), false),
            (K_FIRST | F_LAST | (1 << 11), false),
            (K_RESP | F_LAST | (1 << ID_SHIFT), false),
            (K_CONT | F_LAST | id, false),
            (K_CMA | F_LAST | (1 << 31), false),
        ] {
            let (seg, c) = small();
            let mut tail = 0;
            assert!(put(&c, &seg, &mut tail, &[0u8; 8], word));
            let got = c.next(&seg, 0);
            assert_eq!(matches!(got, Next::Rec(_)), ok, "{word:#x}");
            if let Next::Rec(r) = got {
                assert_eq!(r.head.id(), word >> ID_SHIFT);
            }
        }
    }

    /// A segment is ready only once its version is stored, last: with
    /// its magic and geometry but a version of 0 (its doorbell not made
    /// yet) it is refused, as is another version's; the size must match.
    #[test]
    fn a_segment_without_its_version_is_not_ready() {
        let (seg, c) = small();
        seg.store32(H_CHANNELS, c.g.channels as u32, Release);
        seg.store32(H_RING, c.g.ring as u32, Release);
        seg.store64(H_MAGIC, MAGIC, Release);
        assert_eq!(header_geometry(&seg), None, "version 0");
        for other in [VERSION - 1, VERSION + 1] {
            seg.store32(H_VERSION, other, Release);
            assert_eq!(header_geometry(&seg), None, "version {other}");
        }
        seg.store32(H_VERSION, VERSION, Release);
        assert_eq!(header_geometry(&seg), Some(c.g));
        seg.store64(H_MAGIC, 0, Release);
        assert_eq!(header_geometry(&seg), None, "no magic");
        seg.store64(H_MAGIC, MAGIC, Release);
        seg.store32(H_CHANNELS, 1, Release);
        assert_eq!(header_geometry(&seg), None, "a size that does not match");
    }
}
