//! shm's split copies: a large CMA message whose sender writes its back
//! part into the receive (`process_vm_writev`) while the receiver reads
//! the front. Messages arrive whole in every wait mode and receive
//! shape (one buffer, four across the cut, truncated, tagged with
//! data), and the sender's part is written by the sender (counted in
//! `rx_split`). A hostile sender that takes its part and does not
//! finish holds only its own receive and channel; one that gives the
//! part back has it copied by the receiver; one that writes garbage in
//! the offer's state breaks its channel; one that dies with its part
//! taken fails that receive, buffers handed back.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use weft::{EpType, Error, OpFlags, RecvMsg, SendMsg, WaitMode};
use weft_integration::{next_cq, payload, within, Harness, Provider, TIMEOUT};
use weft_shm::cma::{self, Announce, Mode};
use weft_shm::layout::*;
use weft_shm::ring::{Chan, RecHead};
use weft_shm::segment::Segment;

mod shm_common;

struct Pair {
    a: weft::Endpoint,
    b: weft::Endpoint,
    bcq: weft::CompletionQueue,
    b_in_a: weft::FiAddr,
    _h: Harness,
}

fn pair(mode: WaitMode) -> Pair {
    let h = Harness::new(&Provider::named("shm"), EpType::Rdm);
    pair_with(h.info.clone(), h, mode)
}

/// A pair made with `info` (a changed copy of `h.info`).
fn pair_with(info: weft::Info, h: Harness, mode: WaitMode) -> Pair {
    let (a, _acq, b, bcq, b_in_a) = shm_common::two(&h, &info, mode);
    Pair {
        a,
        b,
        bcq,
        b_in_a,
        _h: h,
    }
}

/// Whether this process can split at all (CMA permitted: it reads and
/// writes its own memory, both endpoints being here), said when not.
fn can_split() -> bool {
    let ok = cma::mode() == Mode::Permitted;
    if !ok {
        eprintln!("CMA not permitted here: no split copies to look at");
    }
    ok
}

/// Sends `msg` from `a` to `b` into the receive `r` (tagged 7 with
/// remote CQ data) and returns what arrived, or the receive's error.
async fn one(
    p: &Pair,
    msg: Bytes,
    r: RecvMsg,
) -> Result<(usize, Vec<u8>), (Error, usize, Vec<u8>)> {
    let m = SendMsg {
        dest: p.b_in_a,
        iov: vec![msg],
        tag: Some(7),
        data: Some(0xD47A),
        context: 1,
    };
    // The send in a task of its own: in inline mode the task that awaits
    // an operation drives its endpoint, and the sender must be driven
    // (on the other worker) while the receiver reads its half.
    let a = p.a.clone();
    let send = tokio::spawn(async move { a.sendmsg(m, OpFlags::REMOTE_CQ_DATA).await });
    let (got, sent) = within("split", async {
        tokio::join!(p.b.recvmsg(r, OpFlags::empty()), send)
    })
    .await;
    sent.unwrap().unwrap();
    match got {
        Ok(c) => {
            assert_eq!((c.tag, c.data), (7, 0xD47A));
            let len = c.len;
            Ok((len, c.into_bytes().to_vec()))
        }
        Err(e) => {
            let bytes = e.bufs.iter().flat_map(|b| b.iter().copied()).collect();
            Err((e.err, e.len, bytes))
        }
    }
}

/// One small message, so that the channel is claimed and its probe
/// made before the messages a test counts.
async fn warm_up(p: &Pair) {
    let recv = p.b.recv(BytesMut::zeroed(8));
    let (got, sent) = within("warm-up", async {
        tokio::join!(recv, p.a.send(p.b_in_a, payload(8, 0)))
    })
    .await;
    sent.unwrap();
    assert!(got.is_ok());
}

fn trecv(bufs: Vec<BytesMut>) -> RecvMsg {
    RecvMsg {
        src: weft::FI_ADDR_UNSPEC,
        bufs,
        tagged: true,
        tag: 7,
        ignore: 0,
        context: 2,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_copies_arrive_whole_in_every_mode_and_shape() {
    if !can_split() {
        return;
    }
    for mode in [WaitMode::BusyPoll, WaitMode::Inline, WaitMode::Interrupt] {
        let p = pair(mode);
        warm_up(&p).await;
        let big = (1 << 20) + 12_345;
        // Sent one at a time and each awaited: in the spinning modes the
        // sender is awake while its message is read, so it takes the
        // offer (a message of 1 MiB goes by CMA there to be split).
        for round in 0..4u8 {
            let msg = payload(big, round);
            let got = one(&p, msg.clone(), trecv(vec![BytesMut::zeroed(big)])).await;
            assert!(
                got.is_ok_and(|(n, b)| n == big && b == msg[..]),
                "{mode:?} one buffer"
            );
            // Four buffers, the cut (half, at a page) inside the third.
            let bufs = [100_000, 300_000, 300_000, big - 700_000]
                .map(BytesMut::zeroed)
                .to_vec();
            let got = one(&p, msg.clone(), trecv(bufs)).await;
            assert!(
                got.is_ok_and(|(n, b)| n == big && b == msg[..]),
                "{mode:?} four buffers"
            );
            // Truncated: the receive's 700 KiB are split, the rest dropped.
            let cap = 700 << 10;
            let got = one(&p, msg.clone(), trecv(vec![BytesMut::zeroed(cap)])).await;
            match got {
                Err((Error::Trunc, n, b)) => {
                    assert!(n == cap && b == msg[..cap], "{mode:?} truncated")
                }
                other => panic!("{mode:?} truncated: {:?}", other.map(|o| o.0)),
            }
        }
        let s = p.b.stats().unwrap();
        assert_eq!(s.rx_malformed, 0);
        assert_eq!(s.rx_direct, 12, "{mode:?}: every message went by CMA");
        if mode == WaitMode::BusyPoll {
            // A sender asleep when the offer comes leaves its part to
            // the receiver; a busy-poll sender's thread spins, awake for
            // it, unless the machine's load keeps it off a core for the
            // whole of the receiver's half (a few tens of microseconds),
            // round after round: the receiver waits for the take
            // (bounded), and more rounds, bounded, until one part is
            // written by the sender. (An inline sender is driven by the
            // task awaiting its send, which a loaded machine may not run
            // in time.)
            weft_shm::split::set_take_grace(Duration::from_millis(200));
            let msg = payload(big, 9);
            for round in 0.. {
                if p.b.stats().unwrap().rx_split > 0 {
                    weft_shm::split::set_take_grace(Duration::ZERO);
                    break;
                }
                assert!(round < 1000, "{mode:?}: no part written by the sender");
                let got = one(&p, msg.clone(), trecv(vec![BytesMut::zeroed(big)])).await;
                assert!(got.is_ok_and(|(_, b)| b == msg[..]));
            }
        }
    }
}

/// Below the split threshold, and for messages no receive takes yet, the
/// receiver copies the whole message as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_and_unexpected_messages_are_not_split() {
    if !can_split() {
        return;
    }
    let p = pair(WaitMode::BusyPoll);
    warm_up(&p).await;
    // Below the threshold: the ring's, while both spin.
    let small = weft_shm::split::split_min() - 1;
    let msg = payload(small, 1);
    let got = one(&p, msg.clone(), trecv(vec![BytesMut::zeroed(small)])).await;
    assert!(got.is_ok_and(|(_, b)| b == msg[..]));
    // Unexpected: read whole into a held buffer before the receive.
    let msg = payload(1 << 20, 2);
    p.a.post_tsend(p.b_in_a, msg.clone(), 7, 3).unwrap();
    let start = Instant::now();
    while p.b.stats().unwrap().rx_direct < 1 {
        assert!(start.elapsed() < TIMEOUT, "never held");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let got = within(
        "held",
        p.b.recvmsg(trecv(vec![BytesMut::zeroed(1 << 20)]), OpFlags::empty()),
    )
    .await
    .unwrap();
    assert!(got.into_bytes()[..] == msg[..]);
    let s = p.b.stats().unwrap();
    assert_eq!((s.rx_direct, s.rx_split, s.rx_malformed), (1, 0, 0));
}

/// A hostile sender's channel `i` of `b`, carrying one CMA record with
/// `F_SPLIT` that announces `src` (in this process: the probe passes).
/// With `take`, a thread spinning from before the record is published
/// tries to take the owner's offer as its sender would; the offer stands
/// only while the owner reads its own part, so the thread may miss it
/// on a loaded machine (`taken` is `None` then, and the owner copies the
/// whole message). Returns the segment, the channel, the record's end
/// (the offer's name) and what was taken: where the part begins, and
/// the ranges it goes to.
fn split_record(b: &weft::Endpoint, i: usize, src: &Bytes, take: bool) -> Hostile {
    let (seg, c) = shm_common::hostile_claim(b, i, true);
    let ann = Announce {
        ranges: [(src.as_ptr() as u64, src.len() as u64)]
            .into_iter()
            .collect(),
        pool: None,
    }
    .encode();
    let h = RecHead {
        word: K_CMA | F_LAST | F_SPLIT,
        len: ann.len() as u32,
        tag: 0,
        data: 0,
        total: src.len() as u64,
    };
    let (at, end) = c.write_head(&seg, 0, &h);
    seg.write(at, &ann);
    let addr = String::from_utf8(b.local_addr().unwrap()).unwrap();
    let taker = take
        .then(|| std::thread::spawn(move || take_offer(&shm_common::segment_named(&addr), i, end)));
    c.publish(&seg, 0, h.word);
    let taken = taker.and_then(|t| t.join().unwrap());
    Hostile { seg, c, end, taken }
}

struct Hostile {
    seg: Segment,
    c: Chan,
    end: u64,
    taken: Option<(u64, Vec<(u64, u64)>)>,
}

/// The messages of the tests that take an offer: the offer stands while
/// the owner reads its half, a few milliseconds at this size, so the
/// taking thread finds it even on a loaded machine.
const BIG: usize = 32 << 20;

/// A hostile record on one of `b`'s free channels from `first` up whose
/// offer the test took: a posted 1 MiB receive and a record announcing
/// `src` per attempt; an attempt whose offer the owner took back first
/// completes that receive whole (checked) and the next channel is tried.
async fn split_taken(
    b: &weft::Endpoint,
    cq: &weft::CompletionQueue,
    first: usize,
    src: &Bytes,
) -> (usize, Hostile) {
    for i in first..Geometry::OURS.channels {
        b.post_recv(BytesMut::zeroed(src.len()), 1).unwrap();
        let h = split_record(b, i, src, true);
        if h.taken.is_some() {
            return (i, h);
        }
        let got = within("an offer missed", next_cq(cq)).await.unwrap();
        assert!(got.into_bytes()[..] == src[..], "copied whole by the owner");
    }
    panic!("no offer taken on any channel");
}

/// Waits for the owner's offer about the record ending at `end` on
/// channel `i`, and takes it: where the part begins, and its ranges.
/// `None` once the owner took it back.
fn take_offer(seg: &Segment, i: usize, end: u64) -> Option<(u64, Vec<(u64, u64)>)> {
    let off = Geometry::OURS.offer(i);
    let start = Instant::now();
    while !seg.cas64(
        off + O_STATE,
        split_word(end, O_OFFERED),
        split_word(end, O_TAKEN),
    ) {
        if seg.load64(off + O_STATE, Ordering::Acquire) == Some(split_word(end, O_REVOKED)) {
            return None;
        }
        assert!(start.elapsed() < TIMEOUT, "never offered");
        std::hint::spin_loop();
    }
    let word = |f: usize| seg.load64(off + f, Ordering::Acquire).unwrap();
    let n = word(O_N) as usize;
    let ranges = (0..n)
        .map(|k| (word(O_RANGES + 16 * k), word(O_RANGES + 16 * k + 8)))
        .collect();
    Some((word(O_AT), ranges))
}

fn set_state(seg: &Segment, i: usize, end: u64, state: u64) {
    let off = Geometry::OURS.offer(i) + O_STATE;
    seg.store64(off, split_word(end, state), Ordering::Release);
}

/// An offer nobody takes (the record said `F_SPLIT`, its sender never
/// looked): the receiver takes it back and copies the whole message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offer_nobody_takes_is_copied_by_the_receiver() {
    if !can_split() {
        return;
    }
    let p = pair(WaitMode::BusyPoll);
    let src = payload(1 << 20, 4);
    p.b.post_recv(BytesMut::zeroed(1 << 20), 1).unwrap();
    let h = split_record(&p.b, 5, &src, false);
    let got = within("receive", next_cq(&p.bcq)).await.unwrap();
    assert!(got.into_bytes()[..] == src[..]);
    let w = h
        .seg
        .load64(Geometry::OURS.offer(5) + O_STATE, Ordering::Acquire);
    assert_eq!(w, Some(split_word(h.end, O_REVOKED)));
    let s = p.b.stats().unwrap();
    assert_eq!((s.rx_direct, s.rx_split, s.rx_malformed), (1, 0, 0));
}

/// A sender that takes its part holds its own receive and channel until
/// it says done (or gives the part back); every other channel goes on
/// meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_part_holds_only_its_own_receive() {
    if !can_split() {
        return;
    }
    // Interrupt mode: no thread of the endpoints spins, so the taker has
    // a core while the owner reads its part.
    let p = pair(WaitMode::Interrupt);
    let mut next = 2;
    for (round, give_back) in [(0u8, false), (1, true)] {
        let src = payload(BIG, 10 + round);
        let (i, h) = split_taken(&p.b, &p.bcq, next, &src).await;
        next = i + 1;
        let (seg, end) = (&h.seg, h.end);
        let (at, ranges) = h.taken.clone().unwrap();
        assert_eq!(at as usize, BIG / 2, "cut at half");
        assert_eq!(ranges.iter().map(|r| r.1).sum::<u64>() as usize, BIG / 2);
        // Held: nothing completes, while another sender's messages do.
        let other = payload(1000, 9);
        let recv =
            p.b.trecv(BytesMut::zeroed(1000), weft::FI_ADDR_UNSPEC, 1, 0);
        let (got, sent) = within("another channel", async {
            tokio::join!(recv, p.a.tsend(p.b_in_a, other.clone(), 1))
        })
        .await;
        sent.unwrap();
        assert!(got.is_ok_and(|g| g.into_bytes()[..] == other[..]));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            p.bcq.read(1).unwrap_err(),
            Error::Again,
            "completed before its part"
        );
        if give_back {
            set_state(seg, i, end, O_FAILED);
        } else {
            let me = std::process::id();
            let wrote = cma::push(me, &ranges, &[&src[at as usize..]]).unwrap();
            assert_eq!(wrote, BIG / 2);
            set_state(seg, i, end, O_DONE);
        }
        let got = within("the held receive", next_cq(&p.bcq)).await.unwrap();
        assert!(got.into_bytes()[..] == src[..], "round {round}");
    }
    let s = p.b.stats().unwrap();
    assert_eq!((s.rx_split, s.rx_malformed), (1, 0));
}

/// A state word no side of the offer writes: the sender broke the
/// rules; its receive fails, its channel is freed and counted, and the
/// endpoint goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbage_offer_state_breaks_only_its_channel() {
    if !can_split() {
        return;
    }
    let p = pair(WaitMode::Interrupt);
    let src = payload(BIG, 5);
    let (i, h) = split_taken(&p.b, &p.bcq, 2, &src).await;
    set_state(&h.seg, i, h.end + 8, O_DONE);
    let e = within("broken", next_cq(&p.bcq)).await.unwrap_err();
    assert_eq!(e.err, Error::ConnAborted);
    assert_eq!(
        e.bufs.iter().map(|b| b.capacity()).sum::<usize>(),
        BIG,
        "buffers back"
    );
    assert_eq!(p.b.stats().unwrap().rx_malformed, 1);
    let msg = payload(1 << 20, 6);
    let recv = p.b.recv(BytesMut::zeroed(1 << 20));
    let (got, sent) = within("after", async {
        tokio::join!(recv, p.a.send(p.b_in_a, msg.clone()))
    })
    .await;
    sent.unwrap();
    assert!(got.is_ok_and(|g| g.into_bytes()[..] == msg[..]));
}

/// A sender gone with its part taken (here: its channel made to name a
/// process that has exited) writes no more: the sweep fails the receive
/// with its buffers and frees the channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_gone_with_its_part_taken_fails_the_receive() {
    if !can_split() {
        return;
    }
    let p = pair(WaitMode::Interrupt);
    let src = payload(BIG, 7);
    let (_, Hostile { seg, c, .. }) = split_taken(&p.b, &p.bcq, 2, &src).await;
    let conns = p.b.stats().unwrap().conns;
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let pid = gone.id();
    gone.wait().unwrap();
    seg.store32(c.ctl(C_PID), pid, Ordering::Release);
    seg.store64(c.ctl(C_START), 1, Ordering::Release);
    let e = within("gone", next_cq(&p.bcq)).await.unwrap_err();
    assert_eq!(e.err, Error::ConnReset);
    assert_eq!(
        e.bufs.iter().map(|b| b.capacity()).sum::<usize>(),
        BIG,
        "buffers back"
    );
    let start = Instant::now();
    while p.b.stats().unwrap().conns != conns - 1 {
        assert!(start.elapsed() < TIMEOUT, "the channel never freed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// An owner in this very process: its sender writes only an offer the
/// owner stands for. A process of the same user forges one in the
/// owner's offer block while a split-able CMA send waits there (parked:
/// no receive, no budget), naming a buffer of ours: the sender takes it,
/// writes nothing, and answers it failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_offer_in_our_own_process_is_not_written() {
    if !can_split() {
        return;
    }
    let h = Harness::new(&Provider::named("shm"), EpType::Rdm);
    let mut info = h.info.clone();
    info.rx_attr.total_buffered_recv = 4096;
    let p = pair_with(info, h, WaitMode::BusyPoll);
    warm_up(&p).await;
    let msg = payload(1 << 20, 8);
    p.a.post_send(p.b_in_a, msg.clone(), 3).unwrap();
    // The CMA record at the head of a's channel in b, parked.
    let seg = shm_common::segment_of(&p.b);
    let g = Geometry::OURS;
    let start = Instant::now();
    let (c, end) = loop {
        assert!(start.elapsed() < TIMEOUT, "no CMA record");
        let found = (0..g.channels).map(|i| Chan { g, i }).find_map(|c| {
            if c.state(&seg) != Some(ACTIVE) {
                return None;
            }
            match c.next(&seg, c.head(&seg)) {
                weft_shm::ring::Next::Rec(r) if r.head.kind() == K_CMA => Some((c, r.next)),
                _ => None,
            }
        });
        if let Some(f) = found {
            break f;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let victim = BytesMut::zeroed(4096);
    let off = g.offer(c.i);
    seg.store64(off + O_AT, 0, Ordering::Relaxed);
    seg.store64(off + O_N, 1, Ordering::Relaxed);
    seg.store64(off + O_RANGES, victim.as_ptr() as u64, Ordering::Relaxed);
    seg.store64(off + O_RANGES + 8, 4096, Ordering::Relaxed);
    seg.store64(off + O_STATE, split_word(end, O_OFFERED), Ordering::Release);
    let start = Instant::now();
    while seg.load64(off + O_STATE, Ordering::Acquire) != Some(split_word(end, O_FAILED)) {
        assert!(start.elapsed() < TIMEOUT, "the forged offer never answered");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(
        victim.iter().all(|&x| x == 0),
        "wrote where a forged offer said"
    );
    // The message still arrives whole once a receive is posted.
    let got = within("the parked message", p.b.recv(BytesMut::zeroed(1 << 20)))
        .await
        .unwrap();
    assert!(got.into_bytes()[..] == msg[..]);
}
