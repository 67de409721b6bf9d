//! Tag matching hot paths: arrivals against a deep posted-receive queue,
//! wildcard (ignore-mask) receives, and the unexpected-message path.
//!
//! Every matching bench keeps its queue at a fixed depth by re-posting what
//! it matched, so each iteration sees the same steady state.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use weft_core::addr::{FiAddr, FI_ADDR_NOTAVAIL, FI_ADDR_UNSPEC};
use weft_core::flags::OpFlags;
use weft_core::tagmatch::{Matcher, MsgInfo, PostOutcome, RecvSpec};

/// Posted receive payload, unexpected payload, raw source.
type M = Matcher<u64, u64, u32>;

const DEPTH: u64 = 10_000;
/// Sender handle used by arrivals.
const PEER: FiAddr = 3;

fn no_av(_: &u32) -> FiAddr {
    FI_ADDR_NOTAVAIL
}

fn tspec(tag: u64, ignore: u64, context: u64) -> RecvSpec {
    RecvSpec {
        by_key: false,
        src: FI_ADDR_UNSPEC,
        tagged: true,
        tag,
        ignore,
        context,
    }
}

fn tmsg(tag: u64) -> MsgInfo {
    MsgInfo {
        key: None,
        src: PEER,
        tagged: true,
        tag,
        len: 64,
        data: None,
    }
}

/// Deterministic xorshift64 so runs are comparable without a `rand` dep.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// `n` values in `0..bound`.
    fn seq(&mut self, n: usize, bound: u64) -> Vec<u64> {
        (0..n).map(|_| self.next() % bound).collect()
    }
}

/// A matcher with `n` posted receives; receive `i` has spec `mk(i)`.
fn posted(n: u64, mk: impl Fn(u64) -> RecvSpec) -> M {
    let mut m = M::new();
    for i in 0..n {
        let out = m.post(mk(i), i, &no_av);
        assert!(matches!(out, PostOutcome::Queued));
    }
    m
}

/// Matches `info`, then re-posts the receive it took so the depth stays put.
#[inline]
fn match_and_repost(m: &mut M, info: &MsgInfo) {
    let (spec, r) = m.match_arrival(info).expect("a posted receive matches");
    black_box(&spec);
    black_box(m.post(spec, r, &no_av));
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
}

/// (1a) Exact-tag arrivals against 10,000 posted receives with distinct tags.
fn exact(c: &mut Criterion) {
    let mut g = c.benchmark_group("tagmatch/exact");
    g.throughput(Throughput::Elements(1));

    // The matching receive is always the most recently posted one: the
    // tag just re-posted goes to the back of the queue. Swept over the
    // depth to show that exact matching does not depend on it.
    for n in [100u64, DEPTH] {
        let mut m = posted(n, |i| tspec(i, 0, i));
        let last = tmsg(n - 1);
        g.bench_with_input(BenchmarkId::new("last_of", n), &n, |b, _| {
            b.iter(|| match_and_repost(&mut m, black_box(&last)))
        });
    }

    // The matching receive is at a random position.
    let mut m = posted(DEPTH, |i| tspec(i, 0, i));
    let tags = Rng(0x1234_5678).seq(4096, DEPTH);
    let mut k = 0;
    g.bench_function("random_of_10k", |b| {
        b.iter(|| {
            k = (k + 1) & 4095;
            match_and_repost(&mut m, black_box(&tmsg(tags[k])));
        })
    });

    // Directed receives (src = PEER) instead of FI_ADDR_UNSPEC.
    let mut m = posted(DEPTH, |i| RecvSpec {
        src: PEER,
        ..tspec(i, 0, i)
    });
    let mut k = 0;
    g.bench_function("directed_random_of_10k", |b| {
        b.iter(|| {
            k = (k + 1) & 4095;
            match_and_repost(&mut m, black_box(&tmsg(tags[k])));
        })
    });

    // Exact-tag arrival with 10,000 *non-matching* wildcard receives posted
    // before the matching exact one: "first posted wins" forces a scan of
    // the older wildcard receives.
    let mut m = posted(DEPTH, |i| tspec(1 << 40 | i << 8, 0xFF, i));
    m.post(tspec(7, 0, DEPTH), DEPTH, &no_av);
    let exact7 = tmsg(7);
    g.bench_function("behind_10k_wild", |b| {
        b.iter(|| {
            // Re-posting puts the exact receive behind every wildcard again.
            match_and_repost(&mut m, black_box(&exact7));
        })
    });
    g.finish();
}

/// (1b) Wildcard receives (non-zero ignore mask).
fn wildcard(c: &mut Criterion) {
    let mut g = c.benchmark_group("tagmatch/wild");
    g.throughput(Throughput::Elements(1));

    // n wildcard receives, tag = i << 16, low 16 bits ignored; the arrival
    // matches the last-posted one. Swept over n to show the scan length.
    for n in [100u64, 1_000, DEPTH] {
        let mut m = posted(n, |i| tspec(i << 16, 0xFFFF, i));
        let info = tmsg(((n - 1) << 16) | 0x42);
        g.bench_with_input(BenchmarkId::new("last_of", n), &n, |b, _| {
            b.iter(|| match_and_repost(&mut m, black_box(&info)))
        });
    }

    let mut m = posted(DEPTH, |i| tspec(i << 16, 0xFFFF, i));
    let tags = Rng(0x9abc_def0).seq(4096, DEPTH);
    let mut k = 0;
    g.bench_function("random_of_10k", |b| {
        b.iter(|| {
            k = (k + 1) & 4095;
            match_and_repost(&mut m, black_box(&tmsg(tags[k] << 16 | 0x42)));
        })
    });

    // 10,000 exact receives, then one catch-all wildcard; arrivals carry a
    // tag no exact receive wants, so the wildcard takes them.
    let mut m = posted(DEPTH, |i| tspec(i, 0, i));
    m.post(tspec(0, u64::MAX, DEPTH), DEPTH, &no_av);
    let stray = tmsg(1 << 50);
    g.bench_function("catchall_behind_10k_exact", |b| {
        b.iter(|| match_and_repost(&mut m, black_box(&stray)))
    });
    g.finish();
}

/// (1c) Unexpected path: the arrival finds no receive and is buffered, then
/// a post takes it from the unexpected queue.
fn unexpected(c: &mut Criterion) {
    let mut g = c.benchmark_group("tagmatch/unexpected");
    g.throughput(Throughput::Elements(1));

    fn roundtrip(m: &mut M, tag: u64, spec: RecvSpec) {
        let info = tmsg(tag);
        let none = m.match_arrival(black_box(&info));
        debug_assert!(none.is_none());
        black_box(none);
        m.push_unexpected(9, info, tag);
        match m.post(spec, 1, &no_av) {
            PostOutcome::Matched { payload, info, .. } => {
                black_box((payload, info));
            }
            PostOutcome::Queued => unreachable!("the buffered message matches"),
        }
    }

    let mut m = M::new();
    g.bench_function("arrive_then_post/empty", |b| {
        b.iter(|| roundtrip(&mut m, 0x77, tspec(0x77, 0, 1)))
    });

    // Same, with 10,000 unrelated posted receives and 10,000 unrelated
    // buffered messages: exact-tag indexing should make depth irrelevant.
    let mut m = posted(DEPTH, |i| tspec(i, 0, i));
    for i in 0..DEPTH {
        m.push_unexpected(9, tmsg(DEPTH + i), i);
    }
    let tag = 3 * DEPTH;
    g.bench_function("arrive_then_post/10k_posted_10k_unexp", |b| {
        b.iter(|| roundtrip(&mut m, tag, tspec(tag, 0, 1)))
    });

    // A wildcard post against 10,000 older buffered messages it does not
    // accept: the oldest-first search walks all of them.
    let mut m = M::new();
    for i in 0..DEPTH {
        m.push_unexpected(9, tmsg(i), i);
    }
    let tag = 1 << 40;
    g.bench_function("arrive_then_wild_post/10k_unexp", |b| {
        b.iter(|| roundtrip(&mut m, tag | 5, tspec(tag, 0xFF, 1)))
    });

    // fi_trecvmsg(FI_PEEK | FI_CLAIM) then fi_trecvmsg(FI_CLAIM).
    let mut m = M::new();
    let spec = tspec(0x55, 0, 42);
    let flags = OpFlags::PEEK | OpFlags::CLAIM;
    g.bench_function("push_peek_claim", |b| {
        b.iter(|| {
            m.push_unexpected(9, tmsg(0x55), 1);
            black_box(m.peek(&spec, flags, &no_av).unwrap());
            black_box(m.claim(42, false).unwrap());
        })
    });
    g.finish();
}

/// Posting and cancelling a receive with 10,000 others posted.
fn cancel(c: &mut Criterion) {
    let mut g = c.benchmark_group("tagmatch/cancel");
    g.throughput(Throughput::Elements(1));
    let mut m = posted(DEPTH, |i| tspec(i, 0, i));
    g.bench_function("post_cancel/10k_posted", |b| {
        b.iter(|| {
            black_box(m.post(tspec(DEPTH + 1, 0, DEPTH + 1), 0, &no_av));
            black_box(m.cancel(black_box(DEPTH + 1)).unwrap());
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = exact, wildcard, unexpected, cancel
}
criterion_main!(benches);
