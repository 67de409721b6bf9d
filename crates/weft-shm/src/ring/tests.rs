//! The ring's tests (`super`): records in and out, laps, two threads,
//! the claim's clear word, the boundaries of padding.
#![allow(clippy::unwrap_used, clippy::panic)]

use super::*;

fn small() -> (Segment, Chan) {
    let g = Geometry::check(2, 4096).unwrap();
    let mut seg = Segment::anonymous(&vec![0u8; g.bytes()]).unwrap();
    // As an endpoint and its senders do (the fuzz target's and
    // `scan`'s segments check each ring at its use instead).
    assert!(seg.set_rings(g.rings(), g.channels, g.ring));
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
    c.publish(seg, *tail, word);
    *tail = t;
    true
}

fn word(seg: &Segment, c: &Chan, at: u64) -> u32 {
    seg.load32(c.word_at(at), Acquire).unwrap()
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
            let word =
                if off == 0 { K_FIRST | F_TAGGED } else { K_CONT } | if last { F_LAST } else { 0 };
            let h = RecHead {
                word,
                len: n as u32,
                tag: 9,
                data: 8,
                total: p.len() as u64,
            };
            let (at, t) = c.write_head(&seg, tail, &h);
            seg.write(at, &p[off..off + n]);
            // Written but not published: nothing to read yet, however
            // many laps the ring made.
            assert_eq!(c.next(&seg, head), Next::Empty, "record {i}");
            c.publish(&seg, tail, word);
            tail = t;
            off += n;
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

/// The word after the last record is 0 whatever an earlier lap left
/// there: records of one lap whose boundaries fall inside the last
/// lap's records (and on their old first words, still set) are read
/// exactly as written, and nothing past the last.
#[test]
fn an_earlier_laps_words_are_never_published() {
    let (seg, c) = small();
    let (mut tail, mut head) = (0u64, 0u64);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut sent = std::collections::VecDeque::new();
    for n in 0..4000u32 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = (x % 700) as usize;
        let p = vec![n as u8; len];
        // The receiver lags by a few records (and at times drains).
        if put(&c, &seg, &mut tail, &p, K_FIRST | F_LAST) {
            sent.push_back(p);
        }
        // The word after the last record is always 0.
        assert_eq!(word(&seg, &c, tail), 0, "message {n}");
        let keep = if x % 5 == 0 { 0 } else { (x % 4) as usize };
        while sent.len() > keep {
            let Next::Rec(r) = c.next(&seg, head) else {
                panic!("message {n}: no record")
            };
            let want = sent.pop_front().unwrap();
            let mut b = vec![0u8; r.head.len as usize];
            assert!(seg.read(r.payload, &mut b));
            assert_eq!(b, want, "message {n}");
            head = r.next;
            c.consume(&seg, head);
        }
        if sent.is_empty() {
            assert_eq!(c.next(&seg, head), Next::Empty, "message {n}");
        }
    }
    assert!(tail > 100 * c.g.ring as u64, "many laps");
}

/// A full ring keeps the word after its last record free: the 0
/// written ahead never lands on the record at the head, unread.
#[test]
fn a_full_ring_keeps_the_head_record() {
    let (seg, c) = small();
    for first in [0u64, 8, 96, 4000] {
        // Start anywhere in the ring, as after earlier laps.
        let mut tail = first;
        c.consume(&seg, first);
        // As a claim clears position 0: the word at the tail is 0.
        seg.store32(c.word_at(first), 0, Release);
        let mut n = 0;
        let mut p = vec![1u8; 1000];
        while put(&c, &seg, &mut tail, &p, K_FIRST | F_LAST) {
            n += 1;
        }
        // Then smaller records, down to empty ones.
        for len in [200, 64, 8, 0] {
            p.truncate(len);
            while put(&c, &seg, &mut tail, &p, K_FIRST | F_LAST) {
                n += 1;
            }
        }
        let used = tail - first;
        assert!(used <= (c.g.ring - WORD_AHEAD) as u64, "{used}");
        assert!(n >= 3);
        let mut head = first;
        let mut read = 0;
        while let Next::Rec(r) = c.next(&seg, head) {
            head = r.next;
            read += 1;
        }
        assert_eq!((read, head), (n, tail), "from {first}");
        // What was written stays readable until it is consumed.
        assert!(matches!(c.next(&seg, first), Next::Rec(_)));
    }
}

/// A producer and a consumer on two threads, the consumer polling
/// only the word at its head: every message arrives whole and in
/// order over many laps of the ring (records of varied sizes, so
/// positions fall on an earlier lap's words), and the consumer never
/// sees a record before its bytes.
#[test]
fn two_threads_in_band() {
    let (seg, c) = small();
    const N: u32 = 20_000;
    let len = |i: u32| (i as usize * 37) % 600;
    let (t0, limit) = (
        std::time::Instant::now(),
        std::time::Duration::from_secs(60),
    );
    std::thread::scope(|s| {
        s.spawn(|| {
            // Split where the ring's end or the room says, as a
            // sender does.
            let mut tail = 0u64;
            for i in 0..N {
                let p: Vec<u8> = (0..len(i)).map(|k| (i as usize + k) as u8).collect();
                let mut off = 0;
                loop {
                    let free = c.room(&seg, tail).unwrap();
                    let fit = c.fit(tail, free);
                    let n = fit.map_or(0, |(_, max)| max.min(p.len() - off));
                    let Some((pad, _)) = fit.filter(|_| n > 0 || p.len() == off) else {
                        // A consumer that failed consumes no more.
                        assert!(t0.elapsed() < limit, "no room for ever");
                        std::thread::yield_now();
                        continue;
                    };
                    tail = c.write_pad(&seg, tail, pad);
                    let last = off + n == p.len();
                    let word =
                        if off == 0 { K_FIRST } else { K_CONT } | if last { F_LAST } else { 0 };
                    let h = RecHead {
                        word,
                        len: n as u32,
                        tag: i as u64,
                        data: 0,
                        total: p.len() as u64,
                    };
                    let (at, t) = c.write_head(&seg, tail, &h);
                    seg.write(at, &p[off..off + n]);
                    c.publish(&seg, tail, word);
                    tail = t;
                    off += n;
                    if last {
                        break;
                    }
                }
            }
        });
        s.spawn(|| {
            let mut head = 0u64;
            let mut b = vec![0u8; 1024];
            for i in 0..N {
                let mut got = Vec::new();
                loop {
                    let r = match c.next(&seg, head) {
                        Next::Rec(r) => r,
                        Next::Empty => {
                            assert!(t0.elapsed() < limit, "message {i} never came");
                            std::thread::yield_now();
                            continue;
                        }
                        Next::Corrupt => panic!("message {i}: corrupt"),
                    };
                    assert_eq!(r.head.tag, i as u64, "message {i}");
                    let n = r.head.len as usize;
                    assert!(seg.read(r.payload, &mut b[..n]));
                    got.extend_from_slice(&b[..n]);
                    head = r.next;
                    c.consume(&seg, head);
                    if r.head.has(F_LAST) {
                        break;
                    }
                }
                assert_eq!(got.len(), len(i), "message {i}");
                assert!(
                    got.iter()
                        .enumerate()
                        .all(|(k, &x)| x == (i as usize + k) as u8),
                    "message {i}"
                );
            }
            assert_eq!(c.next(&seg, head), Next::Empty);
        });
    });
}

/// A claim clears the word at position 0, where the consumer starts:
/// an earlier claim's records there are not read as this one's.
#[test]
fn a_claim_starts_at_a_clear_word() {
    let (seg, c) = small();
    let mut tail = 0;
    assert!(put(&c, &seg, &mut tail, &[7u8; 64], K_FIRST | F_LAST));
    assert!(matches!(c.next(&seg, 0), Next::Rec(_)));
    c.clear_start(&seg);
    assert_eq!(c.next(&seg, 0), Next::Empty);
    assert_eq!(c.published_at(&seg, 0), Some(false));
    let mut tail = 0;
    assert!(put(&c, &seg, &mut tail, &[8u8; 8], K_FIRST | F_LAST));
    assert_eq!(c.published_at(&seg, 0), Some(true));
    let Next::Rec(r) = c.next(&seg, 0) else {
        panic!("the new record")
    };
    assert_eq!(r.head.len, 8);
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
    // An unknown kind.
    seg.store32(c.g.ring_at(1), 11, Release);
    assert_eq!(c.next(&seg, 0), Next::Corrupt);
    // A length past the ring's end, or past the chunk.
    seg.store32(c.g.ring_at(1), K_FIRST | F_LAST, Release);
    assert!(matches!(c.next(&seg, 0), Next::Rec(_)));
    seg.store32(c.g.ring_at(1) + 3584, K_FIRST | F_LAST, Release);
    seg.write(c.g.ring_at(1) + 3588, &1000u32.to_ne_bytes());
    assert_eq!(c.next(&seg, 3584), Next::Corrupt, "past the end");
    seg.write(c.g.ring_at(1) + 4, &1025u32.to_ne_bytes());
    assert_eq!(c.next(&seg, 0), Next::Corrupt, "past the chunk");
    // A record header that would cross the ring's end.
    seg.store32(c.g.ring_at(1) + 4088, K_FIRST | F_LAST, Release);
    assert_eq!(c.next(&seg, 4088), Next::Corrupt);
    // Padding, then padding again.
    seg.store32(c.g.ring_at(1) + 4088, K_PAD, Release);
    seg.store32(c.g.ring_at(1), K_PAD, Release);
    assert_eq!(c.next(&seg, 4088), Next::Corrupt);
    // Padding with flags is no padding.
    seg.store32(c.g.ring_at(1) + 4088, K_PAD | F_LAST, Release);
    assert_eq!(c.next(&seg, 4088), Next::Corrupt);
    // A head the consumer published beyond the ring is a broken one,
    // as is one that leaves less than the word ahead.
    c.consume(&seg, 1 << 40);
    assert_eq!(c.room(&seg, 0), None);
    c.consume(&seg, 0);
    assert_eq!(c.room(&seg, 4096), None);
    assert_eq!(c.room(&seg, 4088), Some(0));
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
    // 10: the version before split offers (a version-10 owner refuses
    // a record with `F_SPLIT`, and its header names no probe word); 11:
    // before shared pools (a version-11 owner refuses an announcement
    // naming a pool).
    assert_eq!(VERSION, 12);
    for other in [9, 10, 11, VERSION + 1] {
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

/// A record that may not be split (a lead or CMA record, up to 80 bytes)
/// at every position near the ring's end, the consumer drained: it goes
/// whole, before the end or after padding at the beginning, never waits
/// for room. `fit` pads only below 96 bytes, so with 96..112 left a 72
/// or 80 byte payload did not fit there, and the room it waited for
/// never came.
#[test]
fn a_record_not_split_goes_whole_at_any_position() {
    let (seg, c) = small();
    let ring = c.g.ring;
    for len in [8, 64, 72, 80, 88] {
        for to_end in (8..=160).step_by(8) {
            // A drained ring whose tail is `to_end` before the end, a lap
            // on.
            let tail = (2 * ring - to_end) as u64;
            c.consume(&seg, tail);
            let free = c.room(&seg, tail).unwrap();
            let (pad, max) = c.fit(tail, free).unwrap();
            let pad = if max >= len {
                pad
            } else {
                assert_eq!(pad, 0, "len {len}, {to_end} to the end");
                c.pad_whole(tail, free, len).unwrap()
            };
            assert!(pad + rec_len(len) <= free);
            assert!(pad == 0 || pad == to_end);
            let t = c.write_pad(&seg, tail, pad);
            let h = RecHead {
                word: K_FIRST | F_LAST,
                len: len as u32,
                total: len as u64,
                ..RecHead::default()
            };
            let (off, next) = c.write_head(&seg, t, &h);
            seg.write(off, &vec![len as u8; len]);
            c.publish(&seg, t, h.word);
            let Next::Rec(r) = c.next(&seg, tail) else {
                panic!("len {len}, {to_end} to the end");
            };
            assert_eq!((r.head.len as usize, r.next), (len, next));
            assert_eq!(c.next(&seg, next), Next::Empty);
            let mut got = vec![0u8; len];
            assert!(seg.read(r.payload, &mut got));
            assert!(got.iter().all(|&x| x == len as u8));
            // Cleared for the next position: the records of this one
            // are not read as its.
            seg.write(c.word_at(0), &[0u8; 4]);
            seg.write(c.word_at(tail), &[0u8; 4]);
        }
    }
    // Without room for the padding and the record both, it waits.
    let tail = (ring - 104) as u64;
    assert_eq!(c.pad_whole(tail, 104 + rec_len(80) - 8, 80), None);
    assert_eq!(c.pad_whole(tail, 104 + rec_len(80), 80), Some(104));
    // One that fits before the end needs no padding from it.
    assert_eq!(c.pad_whole(tail, ring, 64), None);
}
