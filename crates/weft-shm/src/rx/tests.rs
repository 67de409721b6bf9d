//! The owner's sweep of a claim in progress against a claimer that
//! moves between the owner's load of the word and its take: each
//! interleaving driven step by step (no timing), the claimer's moves run
//! inside the owner's liveness look, where a real claimer's may fall (a
//! `/proc` read).
#![allow(clippy::unwrap_used)]

use std::cell::Cell;
use std::sync::atomic::Ordering::{Acquire, Release};

use super::sweep_claim;
use crate::layout::*;
use crate::ring::Chan;
use crate::segment::Segment;

fn seg() -> (Segment, Chan) {
    let g = Geometry::check(2, RING_MIN as u32).unwrap();
    let seg = Segment::anonymous(&vec![0u8; g.bytes()]).unwrap();
    (seg, Chan { g, i: 1 })
}

/// A claim begun by process `pid`, with the first fields `Peer::claim`
/// writes after its claim's swap: its count.
fn begin(seg: &Segment, c: &Chan, pid: u32) -> u32 {
    let gen = c.begin_claim(seg, pid).unwrap();
    assert!(seg.store32(c.ctl(C_PID), pid, Release));
    assert!(seg.store64(c.ctl(C_START), u64::from(pid) + 1000, Release));
    assert!(seg.store64(c.ctl(C_SERIAL), 1, Release));
    gen
}

/// One sweep of the owner over the claim in progress on `c`: it loads
/// the word, and if it judges it (the same word as the last sweep's),
/// `between` runs while it looks whether the claimer lives, and the
/// claimer is found alive or not as `alive` says. Whether the owner took
/// the channel.
fn sweep(
    seg: &Segment,
    c: &Chan,
    seen: &mut Option<u64>,
    alive: bool,
    between: impl FnOnce(),
) -> bool {
    let word = c.state_word(seg).unwrap();
    assert_ne!(state_of(word) & CLAIMING, 0, "the sweep's arm: a claim");
    sweep_claim(seg, c, seen, word, || {
        between();
        alive
    })
}

/// A claim is judged only at the second sweep that sees it, word for
/// word; the first only records it.
#[test]
fn a_claim_is_judged_only_after_a_whole_sweep_interval() {
    let (seg, c) = seg();
    let gen = begin(&seg, &c, 7);
    let mut seen = None;
    let looked = Cell::new(false);
    assert!(!sweep(&seg, &c, &mut seen, false, || looked.set(true)));
    assert!(!looked.get(), "a claim first seen is not judged");
    assert_eq!(seen, Some(state_gen(claiming(7), gen)));
    assert!(c.still_claiming(&seg, 7, gen));
}

/// A claim judged while its claimer lives is kept, sweep after sweep,
/// with nothing of it changed (the word, the owner's record, the
/// claimer's re-check); once its claimer is found gone, the next sweep
/// takes it.
#[test]
fn a_claim_whose_claimer_lives_is_kept_until_it_is_gone() {
    let (seg, c) = seg();
    let gen = begin(&seg, &c, 7);
    let word = state_gen(claiming(7), gen);
    let mut seen = None;
    assert!(!sweep(&seg, &c, &mut seen, true, || {}));
    for _ in 0..3 {
        let looked = Cell::new(false);
        assert!(!sweep(&seg, &c, &mut seen, true, || looked.set(true)));
        assert!(looked.get(), "a claim seen twice is judged");
        assert_eq!(c.state_word(&seg), Some(word));
        assert_eq!(seen, Some(word));
        assert!(c.still_claiming(&seg, 7, gen));
    }
    assert!(sweep(&seg, &c, &mut seen, false, || {}));
    assert_eq!(c.state_word(&seg), Some(state_gen(CLOSED, gen)));
    assert!(!c.still_claiming(&seg, 7, gen));
}

/// The claimer finishes its claim while the owner judges it: the take,
/// from the word judged, fails; the channel stays active, the claimer's
/// fields as it wrote them, and its claim is its own to give back. The
/// owner's record of the judged word stays as it was: the next pass
/// reads an active word and activates it as any claim (which clears the
/// record), and no later claim's word equals it before the count wraps.
#[test]
fn a_claim_finished_while_the_owner_judges_it_is_kept() {
    let (seg, c) = seg();
    let gen = begin(&seg, &c, 7);
    let mut seen = None;
    assert!(!sweep(&seg, &c, &mut seen, false, || {}));
    let judged = seen;
    assert!(!sweep(&seg, &c, &mut seen, false, || {
        assert!(c.move_state(&seg, gen, claiming(7), ACTIVE));
    }));
    assert_eq!(c.state_word(&seg), Some(state_gen(ACTIVE, gen)));
    assert_eq!(seg.load32(c.ctl(C_PID), Acquire), Some(7));
    assert_eq!(seen, judged, "nothing recorded of a word not judged");
    // The sender's moves on its claim still work: the channel is its.
    assert!(c.give_back(&seg, gen));
    assert_eq!(c.state_word(&seg), Some(state_gen(CLOSED, gen)));
}

/// The claimer finishes its claim and closes it (its endpoint closed at
/// once) while the owner judges it: the take fails, and the channel is
/// left `CLOSED` at the claim's count, for the owner to drain and free
/// as any closed channel, not as a dead claimer's.
#[test]
fn a_claim_finished_and_given_back_while_judged_is_not_taken() {
    let (seg, c) = seg();
    let gen = begin(&seg, &c, 7);
    let mut seen = None;
    assert!(!sweep(&seg, &c, &mut seen, false, || {}));
    assert!(!sweep(&seg, &c, &mut seen, false, || {
        assert!(c.move_state(&seg, gen, claiming(7), ACTIVE));
        assert!(c.give_back(&seg, gen));
    }));
    assert_eq!(c.state_word(&seg), Some(state_gen(CLOSED, gen)));
}

/// While the owner judges a claim, the channel is freed under it (only a
/// broken sender does) and claimed anew at a newer count — by another
/// process, or by the same pid: the take from the judged word fails, and
/// the new claim is judged from its own first sighting, a whole sweep
/// interval later, not on the old claim's record; a take then voids it.
#[test]
fn a_claim_made_anew_while_the_owner_judges_is_judged_afresh() {
    for pid in [8, 7] {
        let (seg, c) = seg();
        let gen = begin(&seg, &c, 7);
        let mut seen = None;
        assert!(!sweep(&seg, &c, &mut seen, false, || {}));
        let mut next = 0;
        assert!(!sweep(&seg, &c, &mut seen, false, || {
            c.set_free(&seg);
            next = begin(&seg, &c, pid);
        }));
        assert_eq!(next, gen.wrapping_add(1));
        let word = state_gen(claiming(pid), next);
        assert_eq!(c.state_word(&seg), Some(word));
        assert!(c.still_claiming(&seg, pid, next));
        // The next sweep sees a word it never judged: recorded only.
        let looked = Cell::new(false);
        assert!(!sweep(&seg, &c, &mut seen, false, || looked.set(true)));
        assert!(!looked.get());
        assert_eq!(seen, Some(word));
        assert!(c.still_claiming(&seg, pid, next));
        // The old claimer's re-check fails: its count is gone, even when
        // the new claim is under its pid.
        assert!(!c.still_claiming(&seg, 7, gen));
        assert!(!c.move_state(&seg, gen, claiming(7), ACTIVE));
        // The sweep after judges it.
        assert!(sweep(&seg, &c, &mut seen, false, || {}));
        assert_eq!(c.state_word(&seg), Some(state_gen(CLOSED, next)));
        assert!(!c.still_claiming(&seg, pid, next));
    }
}

/// The take from the word still there voids the claim: every re-check
/// of its claimer (`Chan::still_claiming`, before each group of its
/// writes) fails from then on — after the owner's free and after a new
/// claim at the next count too, under the same pid or another — and so
/// does its activation, so it writes nothing more into the channel.
#[test]
fn a_taken_claim_fails_its_claimers_re_checks() {
    for pid in [8, 7] {
        let (seg, c) = seg();
        let gen = begin(&seg, &c, 7);
        let mut seen = None;
        assert!(!sweep(&seg, &c, &mut seen, false, || {}));
        assert!(sweep(&seg, &c, &mut seen, false, || {}));
        assert_eq!(c.state_word(&seg), Some(state_gen(CLOSED, gen)));
        assert!(!c.still_claiming(&seg, 7, gen));
        // The owner frees it (`lifecycle::free`).
        c.set_free(&seg);
        assert!(!c.still_claiming(&seg, 7, gen));
        let next = begin(&seg, &c, pid);
        assert!(!c.still_claiming(&seg, 7, gen));
        assert!(!c.move_state(&seg, gen, claiming(7), ACTIVE));
        assert!(!c.give_back(&seg, gen));
        assert_eq!(c.state_word(&seg), Some(state_gen(claiming(pid), next)));
    }
}

/// The owner's judgement of a claimer (`judge`, as `claimer_alive`
/// makes it): a lock look that worked decides alone — held alive, not
/// held dead even where the pid says alive (a reused pid) — and the pid
/// is asked only when the look failed.
#[test]
fn a_lock_look_decides_and_the_pid_only_when_it_fails() {
    let asked = Cell::new(0);
    let pid = |says: bool| {
        let asked = &asked;
        move || {
            asked.set(asked.get() + 1);
            says
        }
    };
    assert!(super::judge(Ok(true), pid(false)));
    assert!(!super::judge(Ok(false), pid(true)));
    assert_eq!(asked.get(), 0, "a look that worked asks no pid");
    assert!(super::judge(Err(weft_core::Error::Inval), pid(true)));
    assert!(!super::judge(Err(weft_core::Error::Inval), pid(false)));
    assert_eq!(asked.get(), 2);
}

/// Writes a record of up to `len` payload bytes at `tail` (less where
/// the room or the ring's end cuts it, as a sender splits), if there is
/// room for any; the tail after it.
fn put(seg: &Segment, c: &Chan, tail: u64, len: usize, word: u32) -> Option<u64> {
    let free = c.room(seg, tail).unwrap();
    let (pad, max) = c.fit(tail, free)?;
    let len = len.min(max);
    if len == 0 {
        return None;
    }
    let tail = c.write_pad(seg, tail, pad);
    let h = crate::ring::RecHead {
        word,
        len: len as u32,
        tag: 0,
        data: 0,
        total: 1 << 30,
    };
    let (off, next) = c.write_head(seg, tail, &h);
    assert!(seg.write(off, &vec![7u8; len]));
    c.publish(seg, tail, word);
    Some(next)
}

fn ringed() -> (Segment, Chan) {
    let (mut seg, c) = seg();
    assert!(seg.set_rings(c.g.rings(), c.g.channels, c.g.ring));
    (seg, c)
}

/// One drain of `c` from `head`, every record taken; `at_each` runs as
/// each is handed over, with the head the sender sees then.
fn drain_taking(
    seg: &Segment,
    c: &Chan,
    head: &mut u64,
    mut at_each: impl FnMut(u64),
) -> (usize, super::Stop) {
    let (ring, b) = (c.area(seg).unwrap(), c.block(seg).unwrap());
    super::drain_ring(
        c,
        &ring,
        &b,
        head,
        |h| h,
        |_, _| {
            at_each(b.load64(C_HEAD, Acquire).unwrap());
            Ok(true)
        },
    )
}

/// A drain gives a large message's room back record by record: reading
/// each record after the first, the head the sender sees is already past
/// the record before it (with the head published only at the drain's
/// end, a sender with a full ring waited for the whole drain). Records
/// that together make less than a chunk publish nothing during the drain.
#[test]
fn a_drain_gives_large_records_room_back_one_by_one() {
    let (seg, c) = ringed();
    let chunk = c.g.chunk();
    // Three records of a chunk each (a sender's split of a large message).
    let mut tail = 0;
    let mut ends = Vec::new();
    for word in [K_FIRST, K_CONT, K_CONT | F_LAST] {
        let next = put(&seg, &c, tail, chunk, word).unwrap();
        assert_eq!(next - tail, (chunk + REC_HDR) as u64, "a whole chunk");
        tail = next;
        ends.push(tail);
    }
    let mut head = 0;
    let mut seen = Vec::new();
    let (n, stop) = drain_taking(&seg, &c, &mut head, |h| seen.push(h));
    assert_eq!((n, matches!(stop, super::Stop::Empty)), (3, true));
    assert_eq!(head, tail);
    assert_eq!(
        seen,
        vec![0, ends[0], ends[1]],
        "published before each next record"
    );

    // Small records, less than a chunk in all (8 of 96 bytes, no padding
    // before them): nothing published during the drain.
    assert!(c.block(&seg).unwrap().store64(C_HEAD, head, Release));
    let start = head;
    for _ in 0..8 {
        tail = put(&seg, &c, tail, 64, K_FIRST | F_LAST).unwrap();
    }
    assert!(tail - start < chunk as u64);
    let mut seen = Vec::new();
    let (n, _) = drain_taking(&seg, &c, &mut head, |h| seen.push(h));
    assert_eq!((n, head), (8, tail));
    assert!(seen.iter().all(|&h| h == start), "{seen:?}");
    assert_eq!(c.block(&seg).unwrap().load64(C_HEAD, Acquire), Some(start));
}

/// A sender that refills the ring as the drain gives room back does not
/// keep one drain going: it stops once a ring's worth is taken, well
/// before the record limit, so the pass moves on to the other channels.
#[test]
fn a_refilled_drain_stops_after_a_rings_worth() {
    let (seg, c) = ringed();
    let chunk = c.g.chunk();
    let mut tail = 0;
    while let Some(t) = put(&seg, &c, tail, chunk, K_CONT) {
        tail = t;
    }
    let mut head = 0;
    let mut refills = 0;
    let (n, stop) = drain_taking(&seg, &c, &mut head, |_| {
        // The sender, at each record: whatever room the published head
        // gives.
        while let Some(t) = put(&seg, &c, tail, chunk, K_CONT) {
            tail = t;
            refills += 1;
        }
    });
    assert!(matches!(stop, super::Stop::Limit), "{n} records");
    assert!(refills > 0, "the sender refilled during the drain");
    assert!(n < super::PASS_LIMIT);
    assert!(head >= c.g.ring as u64 && head < (c.g.ring + 2 * (chunk + REC_HDR)) as u64);
}
