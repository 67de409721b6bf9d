//! shm RMA answers name their request (`docs/design.md`, "RMA: executed
//! at the target"; `docs/wire.md` section 16, "RMA records"): an answer
//! whose id no operation waits for is dropped without completing
//! another one, and after an answer channel freed as broken the
//! operations it strands end — those whose bytes travel in records fail
//! at once (`FI_ECONNABORTED`), direct ones (cross-memory attach) end by
//! their own answer — while later operations get their own answers; an
//! answer to a later request ends the earlier ones whose answers were
//! lost. Answers on a channel claimed under the target's name by
//! another instance (one that had the name before, its answers to its
//! own requests still in our segment) end and strand nothing; and a
//! target answers a request only to the instance that claimed the
//! channel it came on, not to another that holds its name now.
//! The target is another process, stopped while the test writes records
//! on a channel claimed under its name in the initiator's segment, as a
//! process of the same user could.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::BytesMut;
use weft::{CompletionQueue, CqItem, EpType, Error, WaitMode};
use weft_integration::child::spawn_peer;
use weft_integration::{enabled_endpoint, next_cq, payload, within, Harness, Provider};
use weft_shm::layout::*;
use weft_shm::ring::{Chan, RecHead};
use weft_shm::segment::Segment;

mod shm_common;

/// The target's region: `payload(size, 7)` under key 42.
const KEY: u64 = 42;

/// How long the tests watch for a completion that must not come.
const QUIET: Duration = Duration::from_millis(300);

/// Posts a read of `len` bytes at `off` of the target's region.
fn post_read(a: &weft::Endpoint, to: weft::FiAddr, len: usize, off: u64, context: u64) {
    a.post_read(to, BytesMut::zeroed(len), off, KEY, context)
        .unwrap();
}

/// A read of 8 bytes at `off` posted after the target resumed gets its
/// own bytes of `initial` under `context`, and no late answer completes
/// anything after it.
async fn a_later_read_gets_its_own(
    a: &weft::Endpoint,
    acq: &CompletionQueue,
    to: weft::FiAddr,
    initial: &[u8],
    off: u64,
    context: u64,
) {
    post_read(a, to, 8, off, context);
    let e = within("the later read", next_cq(acq)).await;
    assert_eq!(e.as_ref().map(|e| e.context).ok(), Some(context));
    let at = off as usize;
    assert_eq!(read_bytes(e), initial[at..at + 8]);
    quiet(acq, "a late answer completed something").await;
}

/// Fails the test if a completion arrives within [`QUIET`].
async fn quiet(cq: &CompletionQueue, what: &str) {
    if let Ok(c) = tokio::time::timeout(QUIET, next_cq(cq)).await {
        // Not the entry itself: a read's carries its buffers.
        match c {
            Ok(e) => panic!("{what}: context {} completed", e.context),
            Err(e) => panic!("{what}: context {} failed: {}", e.context, e.err),
        }
    }
}

/// The bytes a read completion handed back.
fn read_bytes(c: CqItem) -> Vec<u8> {
    let e = c.unwrap_or_else(|e| panic!("the read failed: {:?}", e.err));
    e.bufs.iter().flat_map(|b| b.iter().copied()).collect()
}

/// Claims a free channel of `a`'s segment under the endpoint name of
/// `addr` (the target's) as the target instance itself.
fn claim_as_target(a: &weft::Endpoint, addr: &str) -> (Segment, Chan) {
    claim_as_instance(a, addr, shm_common::instance_of(addr))
}

/// Claims a free channel of `a`'s segment under the endpoint name of
/// `addr`, as the endpoint instance `inst`.
fn claim_as_instance(
    a: &weft::Endpoint,
    addr: &str,
    inst: weft_shm::live::Instance,
) -> (Segment, Chan) {
    let name = addr.trim_start_matches("fi_shm://").as_bytes();
    let g = Geometry::OURS;
    let seg = shm_common::segment_of(a);
    let free = (0..g.channels)
        .find(|&i| Chan { g, i }.state(&seg) == Some(FREE))
        .expect("a free channel in our segment");
    shm_common::claim_as_instance(a, free, name, false, inst)
}

/// Whether one of the requests `a` wrote to the (stopped) target at
/// `addr`, not yet read, is a direct read (`K_RMA_RD`): what the
/// initiator did, whatever this process's CMA mode or thresholds.
fn sent_direct_read(a: &weft::Endpoint, addr: &str) -> bool {
    let me = String::from_utf8(a.local_addr().unwrap()).unwrap();
    let me = me.trim_start_matches("fi_shm://").as_bytes();
    let seg = shm_common::segment_named(addr);
    let g = Geometry::OURS;
    let c = (0..g.channels)
        .map(|i| Chan { g, i })
        .find(|c| {
            let len = seg.load32(c.ctl(C_NAME_LEN), Ordering::Acquire).unwrap() as usize;
            let mut name = vec![0u8; len.min(NAME_MAX)];
            seg.read(c.ctl(C_NAME), &mut name);
            c.state(&seg) == Some(ACTIVE) && name == me
        })
        .expect("our channel in the target's segment");
    let mut head = c.head(&seg);
    while let weft_shm::ring::Next::Rec(r) = c.next(&seg, head) {
        if r.head.kind() == K_RMA_RD {
            return true;
        }
        head = r.next;
    }
    false
}

/// Waits (bounded) until `a` has counted `n` malformed channels and
/// channel `c` of `seg` is free again: the count and the state follow
/// the failures the freeing pushes.
async fn freed_as_broken(a: &weft::Endpoint, seg: &Segment, c: &Chan, n: u64) {
    within("the channel freed and counted", async {
        while a.stats().unwrap().rx_malformed != n || c.state(seg) != Some(FREE) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
}

/// Writes record `h` with `payload` at `tail` of `c` and publishes it;
/// returns the new tail.
fn put(seg: &Segment, c: &Chan, tail: u64, h: &RecHead, payload: &[u8]) -> u64 {
    let (at, next) = c.write_head(seg, tail, h);
    seg.write(at, payload);
    c.publish(seg, tail, h.word);
    next
}

/// An initiator in interrupt mode (so transfers from `cma::rma_min()`
/// go direct where CMA is permitted) and a target process with a region
/// of `size` bytes, answered once (the peer known, its channels set up,
/// request id 0 used and answered).
async fn setup(
    size: usize,
) -> (
    Harness,
    weft::Endpoint,
    CompletionQueue,
    weft_integration::child::Reap,
    String,
    weft::FiAddr,
) {
    let (h, a, acq, peer, addr, to, _av) = setup_av(size).await;
    (h, a, acq, peer, addr, to)
}

/// [`setup`], and the initiator's AV.
async fn setup_av(
    size: usize,
) -> (
    Harness,
    weft::Endpoint,
    CompletionQueue,
    weft_integration::child::Reap,
    String,
    weft::FiAddr,
    weft::AddressVector,
) {
    let p = Provider::named("shm");
    let h = Harness::with_info(&p, p.rma_info(EpType::Rdm));
    let av = h.av();
    let (a, acq) = enabled_endpoint(&h.domain, &h.info, &av, WaitMode::Interrupt);
    let sz = size.to_string();
    let (peer, addr) = spawn_peer(env!("CARGO_BIN_EXE_shm-peer"), &["target", &sz]).await;
    let to = av
        .insert_sync(&[addr.clone().into_bytes()], Default::default())
        .unwrap()
        .fi_addrs[0];
    post_read(&a, to, 8, 0, 100);
    let first = within("the first read", next_cq(&acq)).await;
    assert_eq!(read_bytes(first), payload(size, 7)[..8]);
    (h, a, acq, peer, addr, to, av)
}

/// Answers that name no waiting request — the first read's id, answered
/// already, and an id never given, one of them with bytes — are dropped
/// (the channel they came on stays, nothing counted malformed) and
/// complete nothing; the waiting read then gets its own answer. Before
/// ids, the first of them completed the waiting read (by order) and, not
/// fitting it, failed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_naming_no_waiting_request_is_dropped() {
    let size = 4096;
    let (_h, a, acq, mut peer, addr, to) = setup(size).await;
    shm_common::stop(peer.0.id()).await;
    post_read(&a, to, 8, 8, 1);
    quiet(&acq, "a completion while the target is stopped").await;
    let (seg, c) = claim_as_target(&a, &addr);
    // The first read's id (0): a stale answer.
    let stale = RecHead {
        word: K_RESP | F_LAST,
        tag: 0,
        ..RecHead::default()
    };
    let tail = put(&seg, &c, 0, &stale, &[]);
    // An id never given, with 8 bytes of a read's answer.
    let unknown = RecHead {
        word: K_RESP,
        tag: u64::from(ID_MAX),
        total: 8,
        ..RecHead::default()
    };
    let tail = put(&seg, &c, tail, &unknown, &[]);
    let bytes = RecHead {
        word: K_CONT | F_LAST,
        len: 8,
        total: 8,
        ..RecHead::default()
    };
    let tail = put(&seg, &c, tail, &bytes, b"forged!!");
    // And a refusal under an id past any an initiator gives.
    let beyond = RecHead {
        word: K_RESP | F_LAST,
        tag: u64::MAX,
        data: 13,
        ..RecHead::default()
    };
    let tail = put(&seg, &c, tail, &beyond, &[]);
    within("the forged answers read", async {
        while c.head(&seg) != tail && c.state(&seg) == Some(ACTIVE) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    quiet(&acq, "a forged answer completed the waiting read").await;
    assert_eq!(a.stats().unwrap().rx_malformed, 0);
    assert_eq!(c.state(&seg), Some(ACTIVE));
    shm_common::resume(peer.0.id());
    let own = within("the read's own answer", next_cq(&acq)).await;
    assert_eq!(read_bytes(own), payload(size, 7)[8..16]);
    peer.0.kill().unwrap();
    peer.0.wait().unwrap();
}

/// An answer channel freed as broken (a record on a channel under the
/// target's name that breaks the rules), with three operations waiting
/// for a stopped target: the read and write whose bytes travel in
/// records fail at once (`FI_ECONNABORTED`); a large read that went
/// direct waits on — the target, not having read its request yet, will
/// still write its buffers — and, the target resumed, ends with its own
/// answer and the region's bytes. The target's late answers to the
/// failed two are dropped, and a read posted after them gets its own
/// bytes, not the failed read's (same length, other offset).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_answer_channel_ends_what_it_strands() {
    let size = 4usize << 20;
    let big = 1usize << 20;
    let (_h, a, acq, mut peer, addr, to) = setup(size).await;
    let initial = payload(size, 7);
    shm_common::stop(peer.0.id()).await;
    post_read(&a, to, 8, 8, 1);
    a.post_write(to, payload(8, 99), 64, KEY, 2).unwrap();
    post_read(&a, to, big, 4096, 3);
    quiet(&acq, "a completion while the target is stopped").await;
    let direct = sent_direct_read(&a, &addr);
    if !direct {
        eprintln!("the large read took the rings here (CMA mode, threshold): it fails too");
    }
    let (seg, c) = claim_as_target(&a, &addr);
    // An answer carries no payload: this one does.
    let bad = RecHead {
        word: K_RESP | F_LAST,
        len: 8,
        ..RecHead::default()
    };
    put(&seg, &c, 0, &bad, &[0u8; 8]);
    let mut failed = Vec::new();
    let stranded = if direct { 2 } else { 3 };
    for _ in 0..stranded {
        let e = within("a stranded operation", next_cq(&acq))
            .await
            .unwrap_err();
        assert_eq!(e.err, Error::ConnAborted, "context {}", e.context);
        failed.push(e.context);
    }
    failed.sort_unstable();
    let want: &[u64] = if direct { &[1, 2] } else { &[1, 2, 3] };
    assert_eq!(failed, want);
    freed_as_broken(&a, &seg, &c, 1).await;
    if direct {
        quiet(&acq, "the direct read ended while its target is stopped").await;
    }
    shm_common::resume(peer.0.id());
    if direct {
        let e = within("the direct read's own answer", next_cq(&acq)).await;
        assert!(
            read_bytes(e) == initial[4096..4096 + big],
            "the direct read's bytes"
        );
    }
    a_later_read_gets_its_own(&a, &acq, to, &initial, 16, 4).await;
    assert_eq!(a.stats().unwrap().rx_malformed, 1);
    peer.0.kill().unwrap();
    peer.0.wait().unwrap();
}

/// An answer to a later request ends the earlier ones still waiting:
/// the target takes requests in order and answers each once done with
/// it, so their answers were lost (here: the test answers the second
/// of two reads to a stopped target as the target would, the first
/// answer never written). The first read fails (`FI_ECONNABORTED`), the
/// second completes with the answer's bytes; the target, resumed,
/// answers both again, and those answers are dropped; a read after them
/// gets its own bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_to_a_later_request_ends_the_earlier_ones() {
    let size = 4096;
    let (_h, a, acq, mut peer, addr, to) = setup(size).await;
    let initial = payload(size, 7);
    shm_common::stop(peer.0.id()).await;
    post_read(&a, to, 8, 8, 1);
    post_read(&a, to, 8, 16, 2);
    quiet(&acq, "a completion while the target is stopped").await;
    let (seg, c) = claim_as_target(&a, &addr);
    // Request ids 1 and 2 (0 was the first read's): the answer to 2.
    let second = RecHead {
        word: K_RESP,
        tag: 2,
        total: 8,
        ..RecHead::default()
    };
    let tail = put(&seg, &c, 0, &second, &[]);
    let bytes = RecHead {
        word: K_CONT | F_LAST,
        len: 8,
        total: 8,
        ..RecHead::default()
    };
    put(&seg, &c, tail, &bytes, &initial[16..24]);
    let mut got = Vec::new();
    for _ in 0..2 {
        got.push(within("the two reads", next_cq(&acq)).await);
    }
    got.sort_by_key(|c| match c {
        Ok(e) => e.context,
        Err(e) => e.context,
    });
    let second = got.pop().unwrap();
    let first = got.pop().unwrap().unwrap_err();
    assert_eq!((first.context, first.err), (1, Error::ConnAborted));
    assert_eq!(read_bytes(second), initial[16..24]);
    assert_eq!(a.stats().unwrap().rx_malformed, 0);
    shm_common::resume(peer.0.id());
    a_later_read_gets_its_own(&a, &acq, to, &initial, 24, 3).await;
    assert_eq!(a.stats().unwrap().rx_malformed, 0);
    peer.0.kill().unwrap();
    peer.0.wait().unwrap();
}

/// Answers on a channel claimed under the target's name by another
/// instance — as a target that closed, or whose process ended, leaves
/// its answers in a channel we drain later, while a new endpoint took
/// its name — end nothing, even under the id a waiting request holds:
/// the ids are the other instance's. Nor does the later-answer rule
/// fail the waiting ones, nor does that channel, freed as broken,
/// strand them. The target, resumed, answers both reads with their own
/// bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_from_another_instance_of_the_name_end_nothing() {
    let size = 4096;
    let (_h, a, acq, mut peer, addr, to) = setup(size).await;
    let initial = payload(size, 7);
    let target = shm_common::instance_of(&addr);
    shm_common::stop(peer.0.id()).await;
    post_read(&a, to, 8, 8, 1);
    post_read(&a, to, 8, 16, 2);
    quiet(&acq, "a completion while the target is stopped").await;
    // The same process, another endpoint of it under the same name.
    let other = (target.0, target.1, target.2.wrapping_add(1));
    let (seg, c) = claim_as_instance(&a, &addr, other);
    // The answer to request 2 (the second read's id here), as the other
    // instance answered its own request 2.
    let second = RecHead {
        word: K_RESP,
        tag: 2,
        total: 8,
        ..RecHead::default()
    };
    let tail = put(&seg, &c, 0, &second, &[]);
    let bytes = RecHead {
        word: K_CONT | F_LAST,
        len: 8,
        total: 8,
        ..RecHead::default()
    };
    let tail = put(&seg, &c, tail, &bytes, b"forged!!");
    within("the other instance's answer read", async {
        while c.head(&seg) != tail {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    quiet(&acq, "another instance's answer ended a read").await;
    assert_eq!(a.stats().unwrap().rx_malformed, 0);
    // A record breaking the rules frees that channel: nothing of ours
    // was on it, so nothing is stranded.
    let bad = RecHead {
        word: K_RESP | F_LAST,
        len: 8,
        ..RecHead::default()
    };
    put(&seg, &c, tail, &bad, &[0u8; 8]);
    freed_as_broken(&a, &seg, &c, 1).await;
    quiet(&acq, "another instance's broken channel stranded a read").await;
    shm_common::resume(peer.0.id());
    let mut got = Vec::new();
    for _ in 0..2 {
        let e = within("the reads' own answers", next_cq(&acq)).await;
        let ctx = e.as_ref().map(|e| e.context).unwrap_or(0);
        got.push((ctx, read_bytes(e)));
    }
    got.sort();
    assert_eq!(got[0], (1, initial[8..16].to_vec()));
    assert_eq!(got[1], (2, initial[16..24].to_vec()));
    peer.0.kill().unwrap();
    peer.0.wait().unwrap();
}

/// An answer that does not fit its operation (8 bytes asked, 16
/// announced) fails that operation (`FI_EIO`) and frees its channel as
/// broken, but proves nothing of the operations before it: a direct
/// read waiting there is not ended by the later-answer rule — the
/// target, not having read its request yet, will still write its
/// buffers — and, the target resumed, gets its own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_later_answer_ends_no_earlier_operation() {
    let size = 4usize << 20;
    let big = 1usize << 20;
    let (_h, a, acq, mut peer, addr, to) = setup(size).await;
    let initial = payload(size, 7);
    shm_common::stop(peer.0.id()).await;
    post_read(&a, to, big, 4096, 1);
    post_read(&a, to, 8, 8, 2);
    quiet(&acq, "a completion while the target is stopped").await;
    let direct = sent_direct_read(&a, &addr);
    let (seg, c) = claim_as_target(&a, &addr);
    // Request 2 read 8 bytes; its answer announces 16.
    let wrong = RecHead {
        word: K_RESP,
        tag: 2,
        total: 16,
        ..RecHead::default()
    };
    put(&seg, &c, 0, &wrong, &[]);
    let e = within("the badly answered read", next_cq(&acq))
        .await
        .unwrap_err();
    assert_eq!((e.context, e.err), (2, Error::Io));
    freed_as_broken(&a, &seg, &c, 1).await;
    if direct {
        quiet(&acq, "the direct read ended while its target is stopped").await;
        shm_common::resume(peer.0.id());
        let e = within("the direct read's own answer", next_cq(&acq)).await;
        assert!(
            read_bytes(e) == initial[4096..4096 + big],
            "the direct read's bytes"
        );
    } else {
        eprintln!("the large read took the rings here (CMA mode, threshold): stranded");
        let e = within("the stranded read", next_cq(&acq))
            .await
            .unwrap_err();
        assert_eq!((e.context, e.err), (1, Error::ConnAborted));
        shm_common::resume(peer.0.id());
    }
    quiet(&acq, "a late answer completed something").await;
    peer.0.kill().unwrap();
    peer.0.wait().unwrap();
}

/// Two spellings of one address — with and without the trailing NUL C
/// callers pass — are one peer: reads through either, interleaved, get
/// their own bytes and nothing breaks. (The API strips the NUL on string
/// domains; the provider, keying its peer records by address, takes the
/// plain spelling too: `name::canonical`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_spellings_of_an_address_are_one_peer() {
    let size = 4096;
    let (_h, a, acq, mut peer, addr, to, av) = setup_av(size).await;
    let initial = payload(size, 7);
    let nul = av
        .insert_sync(&[format!("{addr}\0").into_bytes()], Default::default())
        .unwrap()
        .fi_addrs[0];
    for (i, dest) in [nul, to, nul, to].into_iter().enumerate() {
        let off = 8 * (i as u64 + 1);
        post_read(&a, dest, 8, off, i as u64 + 1);
    }
    let mut got = Vec::new();
    for _ in 0..4 {
        let e = within("the reads", next_cq(&acq)).await;
        let ctx = e.as_ref().map(|e| e.context).unwrap_or(0);
        got.push((ctx, read_bytes(e)));
    }
    got.sort();
    for (i, (ctx, b)) in got.into_iter().enumerate() {
        assert_eq!(ctx, i as u64 + 1);
        assert_eq!(b, initial[8 * (i + 1)..8 * (i + 2)]);
    }
    assert_eq!(a.stats().unwrap().rx_malformed, 0);
    peer.0.kill().unwrap();
    peer.0.wait().unwrap();
}

/// A free channel of `seg`, claimed under the name `name` as the
/// instance `inst`.
fn claim_free_in(seg: Segment, name: &[u8], inst: weft_shm::live::Instance) -> (Segment, Chan) {
    let g = Geometry::OURS;
    let free = (0..g.channels)
        .find(|&i| Chan { g, i }.state(&seg) == Some(FREE))
        .expect("a free channel");
    shm_common::claim_in(seg, free, name, false, inst)
}

/// The tail of the channel the endpoint named `from` claimed in `seg`:
/// where the records published past its head end (in band: the word
/// there is 0).
fn tail_from(seg: &Segment, from: &str) -> u64 {
    let from = from.trim_start_matches("fi_shm://").as_bytes();
    let g = Geometry::OURS;
    let c = (0..g.channels)
        .map(|i| Chan { g, i })
        .find(|c| {
            let len = seg.load32(c.ctl(C_NAME_LEN), Ordering::Acquire).unwrap() as usize;
            let mut name = vec![0u8; len.min(NAME_MAX)];
            seg.read(c.ctl(C_NAME), &mut name);
            c.state(seg) == Some(ACTIVE) && name == from
        })
        .expect("the sender's channel");
    let mut head = c.head(seg);
    for _ in 0..g.ring / REC_HDR {
        match c.next(seg, head) {
            weft_shm::ring::Next::Rec(r) => head = r.next,
            weft_shm::ring::Next::Empty => return head,
            weft_shm::ring::Next::Corrupt => panic!("the channel's records break the rules"),
        }
    }
    panic!("more records than a ring holds")
}

/// A target answers a request only to the instance that claimed the
/// channel it came on. A read request on a channel claimed under our
/// name by another instance (as an endpoint that closed leaves its
/// requests in a channel the target still drains, while a new endpoint
/// — here: us — took its name and restarted its ids) gets no answer
/// into our segment: it would have ended our operation holding its id.
/// The same request on a channel our own instance claimed is answered
/// (an id nothing waits for: dropped here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_goes_only_to_the_requesting_instance() {
    let size = 4096;
    let (_h, a, acq, mut peer, addr, _to) = setup(size).await;
    let me = String::from_utf8(a.local_addr().unwrap()).unwrap();
    let name = me.trim_start_matches("fi_shm://").as_bytes().to_vec();
    let mine = shm_common::instance_of(&me);
    let ours = shm_common::segment_of(&a);
    let before = tail_from(&ours, &addr);
    let request = RecHead {
        word: K_RMA_R | F_LAST | (ID_MAX << ID_SHIFT),
        tag: KEY,
        data: 8,
        len: 8,
        ..RecHead::default()
    };
    let sent = |inst| {
        let (seg, c) = claim_free_in(shm_common::segment_named(&addr), &name, inst);
        let tail = put(&seg, &c, 0, &request, &0u64.to_ne_bytes());
        (seg, c, tail)
    };
    let other = (mine.0, mine.1, mine.2.wrapping_add(1));
    let (seg, c, tail) = sent(other);
    within("the other instance's request read", async {
        while c.head(&seg) != tail {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    tokio::time::sleep(QUIET).await;
    assert_eq!(
        tail_from(&ours, &addr),
        before,
        "an answer to another instance's request came to us"
    );
    let (seg, c, tail) = sent(mine);
    within("our instance's request answered", async {
        while c.head(&seg) != tail || tail_from(&ours, &addr) == before {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    quiet(&acq, "a dropped answer completed something").await;
    assert_eq!(a.stats().unwrap().rx_malformed, 0);
    peer.0.kill().unwrap();
    peer.0.wait().unwrap();
}
