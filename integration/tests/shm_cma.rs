//! shm's large messages by cross-memory attach (`process_vm_readv`):
//! getinfo names how large messages move; messages of `CMA_MIN` to
//! `cma::max_len()` bytes go direct, larger ones too on an idle channel
//! (smaller ones through the ring; in the spinning modes only with
//! `cma::set_when_spinning`, which the tests here set), and arrive whole
//! in every shape (tagged with data, unexpected, delivery-complete;
//! gathers and truncation are in `shm.rs`); and a hostile
//! sender's announcements (longer than the receive, unmapped, lengths
//! that do not add up) never write outside the posted buffer and free
//! the sender's channel, counted, without stopping the endpoint.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use bytes::BytesMut;
use weft::{EpType, Error, Info, OpFlags, SendMsg, WaitMode};
use weft_integration::child::{spawn_peer, Reap};
use weft_integration::{enabled_endpoint, next_cq, payload, within, Harness, Provider, TIMEOUT};
use weft_shm::cma::{self, Announce, Mode, CMA_MAX, CMA_MIN};
use weft_shm::layout::*;
use weft_shm::ring::RecHead;

mod shm_common;
use shm_common::chan_word;

fn harness() -> Harness {
    Harness::new(&Provider::named("shm"), EpType::Rdm)
}

struct Pair {
    a: weft::Endpoint,
    acq: weft::CompletionQueue,
    b: weft::Endpoint,
    bcq: weft::CompletionQueue,
    b_in_a: weft::FiAddr,
    _h: Harness,
}

fn pair(mode: WaitMode) -> Pair {
    pair_of(harness(), mode)
}

fn pair_of(h: Harness, mode: WaitMode) -> Pair {
    let (a, acq, b, bcq, b_in_a) = shm_common::two(&h, &h.info, mode);
    Pair {
        a,
        acq,
        b,
        bcq,
        b_in_a,
        _h: h,
    }
}

fn direct(ep: &weft::Endpoint) -> u64 {
    ep.stats().unwrap().rx_direct
}

#[tokio::test]
async fn getinfo_names_how_large_messages_move() {
    let mut h = Info::default();
    h.fabric_attr.prov_name = Some("shm".into());
    let o = &weft::getinfo(Some(&h)).unwrap()[0];
    let name = o.fabric_attr.name.clone().unwrap();
    assert_eq!(name, weft_shm::fabric_name());
    assert!(
        ["shm-cma", "shm-cma-restricted", "shm-copy"].contains(&name.as_str()),
        "{name}"
    );
    assert_eq!(o.domain_attr.name.as_deref(), Some("shm"));
}

/// Every shape of large message arrives whole; where CMA is permitted,
/// each went direct (one CMA record).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_messages_arrive_whole_in_every_shape() {
    // The CMA path in the spinning modes too (they take the ring by
    // default while both sides spin; `shm.rs` checks that).
    cma::set_when_spinning(true);
    for mode in [WaitMode::Interrupt, WaitMode::BusyPoll, WaitMode::Inline] {
        shapes(mode).await;
    }
}

async fn shapes(mode: WaitMode) {
    let p = pair(mode);
    let on = cma::mode() != Mode::Denied;
    // Sent one at a time, each waited for: the channel is idle at every
    // send, so messages past `max_len()` go direct as well.
    let direct_len = |n: usize| u64::from(on && n >= CMA_MIN);
    let mut expect = 0;
    // Tagged with remote CQ data and delivery-complete, at the bounds
    // (and just below the lower one: the copy path).
    let sizes = [CMA_MIN - 1, CMA_MIN, CMA_MAX, CMA_MAX + 1, 3 << 20];
    for (i, len) in sizes.into_iter().enumerate() {
        let msg = payload(len, i as u8);
        p.b.post_trecv(BytesMut::zeroed(len), weft::FI_ADDR_UNSPEC, 7, 0, 1)
            .unwrap();
        let m = SendMsg {
            dest: p.b_in_a,
            iov: vec![msg.clone()],
            tag: Some(7),
            data: Some(0xABCD),
            context: 2,
        };
        within(
            "send",
            p.a.sendmsg(m, OpFlags::REMOTE_CQ_DATA | OpFlags::DELIVERY_COMPLETE),
        )
        .await
        .unwrap();
        let r = within("receive", next_cq(&p.bcq)).await.unwrap();
        assert_eq!((r.tag, r.data, r.len), (7, 0xABCD, len));
        assert!(r.into_bytes()[..] == msg[..], "{len} B arrived whole");
        expect += direct_len(len);
        assert_eq!(direct(&p.b), expect, "{len} B went direct: {on}");
    }
    // Unexpected: read into a held buffer before any receive, in order.
    for i in 0..3u8 {
        p.a.post_send(p.b_in_a, payload(200_000, i), u64::from(i))
            .unwrap();
    }
    for i in 0..3u8 {
        let s = within("send", next_cq(&p.acq)).await.unwrap();
        assert_eq!(s.context, u64::from(i));
    }
    for i in 0..3u8 {
        let got = within("held", p.b.recv(BytesMut::zeroed(200_000)))
            .await
            .unwrap();
        assert!(got.into_bytes()[..] == payload(200_000, i)[..], "#{i}");
    }
    let s = p.b.stats().unwrap();
    assert_eq!((s.rx_malformed, s.unexpected_bytes), (0, 0));
    expect += 3 * direct_len(200_000);
    assert_eq!(s.rx_direct, expect);
}

/// A hostile process of the same user (here: this test, writing the
/// segment as a sender would) claims a channel of `b`, passes the probe
/// with this process's real probe word, and publishes one CMA record.
fn hostile_record(b: &weft::Endpoint, i: usize, total: u64, ann: &[u8]) {
    let (seg, c) = shm_common::hostile_claim(b, i, true);
    let h = RecHead {
        word: K_CMA | F_LAST,
        len: ann.len() as u32,
        tag: 0,
        data: 0,
        total,
    };
    let (at, _) = c.write_head(&seg, 0, &h);
    seg.write(at, ann);
    c.publish(&seg, 0, h.word);
}

async fn malformed_until(ep: &weft::Endpoint, n: u64) {
    let start = Instant::now();
    while ep.stats().unwrap().rx_malformed < n {
        assert!(start.elapsed() < TIMEOUT, "malformed never counted");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_announcements_stay_in_the_posted_buffer() {
    if cma::mode() != Mode::Permitted {
        eprintln!("CMA not permitted here: nothing to attack");
        return;
    }
    let p = pair(WaitMode::BusyPoll);
    // 1 MiB announced into a 10-byte receive whose allocation goes on:
    // the rest of the allocation stays untouched.
    let src = payload(1 << 20, 3);
    let mut whole = BytesMut::zeroed(4096);
    let guard = whole.split_off(10);
    p.b.post_recv(whole, 1).unwrap();
    let ann = Announce {
        ranges: [(src.as_ptr() as u64, 1u64 << 20)].into_iter().collect(),
        pool: None,
    };
    hostile_record(&p.b, 5, 1 << 20, &ann.encode());
    let e = within("truncated", next_cq(&p.bcq)).await.unwrap_err();
    assert_eq!((e.err, e.len), (Error::Trunc, 10));
    assert_eq!(&e.bufs[0][..10], &src[..10]);
    assert!(guard.iter().all(|&b| b == 0), "written past the receive");
    assert_eq!(direct(&p.b), 1);

    // Memory that is not there: the receive fails, the channel is freed.
    p.b.post_recv(BytesMut::zeroed(100), 2).unwrap();
    let bad = Announce {
        ranges: [(0x1000u64, 100u64)].into_iter().collect(),
        pool: None,
    };
    hostile_record(&p.b, 6, 100, &bad.encode());
    let e = within("unmapped", next_cq(&p.bcq)).await.unwrap_err();
    assert_eq!(e.err, Error::ConnAborted);
    malformed_until(&p.b, 1).await;

    // Lengths that do not add up to the total, and a record too short
    // for its count: freed before anything is read.
    hostile_record(&p.b, 7, 99, &bad.encode());
    malformed_until(&p.b, 2).await;
    hostile_record(&p.b, 8, 100, &bad.encode()[..16]);
    malformed_until(&p.b, 3).await;

    // The endpoint goes on.
    let recv = p.b.recv(BytesMut::zeroed(1 << 20));
    let (got, sent) = within("after", async {
        tokio::join!(recv, p.a.send(p.b_in_a, src.clone()))
    })
    .await;
    sent.unwrap();
    assert!(got.is_ok_and(|g| g.into_bytes()[..] == src[..]), "after");
}

/// Starts `shm-peer send ADDR N SIZE` and waits for its `posted`.
async fn sender_process(to: &weft::Endpoint, n: u64, size: usize) -> Reap {
    let addr = String::from_utf8(to.local_addr().unwrap()).unwrap();
    let (n, size) = (n.to_string(), size.to_string());
    let (child, line) =
        spawn_peer(env!("CARGO_BIN_EXE_shm-peer"), &["send", &addr, &n, &size]).await;
    assert_eq!(line, "posted");
    child
}

/// Another process's messages are read from its memory (the per-sender
/// probe passes between processes of one user where Yama allows it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_is_read_directly() {
    let h = harness();
    let (b, _bcq) = enabled_endpoint(&h.domain, &h.info, &h.av(), WaitMode::Interrupt);
    let (n, size) = (8u64, 200_000usize);
    let _peer = sender_process(&b, n, size).await;
    let warm = within("warm-up", b.recv(BytesMut::zeroed(1))).await;
    assert!(warm.is_ok_and(|w| w.len == 1));
    for i in 0..n {
        let got = within("receive", b.recv(BytesMut::zeroed(size))).await;
        let ok = got.is_ok_and(|g| g.into_bytes()[..] == payload(size, i as u8)[..]);
        assert!(ok, "message #{i} arrived whole");
    }
    let s = b.stats().unwrap();
    let expect = match cma::mode() {
        Mode::Permitted => n,
        // Yama 1: a child may not read its parent; the probe said so.
        Mode::Restricted | Mode::Denied => 0,
    };
    assert_eq!((s.rx_direct, s.rx_malformed), (expect, 0));
}

/// A sender killed while its CMA message waits in the ring (no receive,
/// no budget): the receive posted afterwards fails, it never gets the
/// dead process's bytes half read or someone else's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_cma_sender_fails_the_receive() {
    if cma::mode() != Mode::Permitted {
        eprintln!("CMA not permitted here");
        return;
    }
    let h = harness();
    let mut info = h.info.clone();
    info.rx_attr.total_buffered_recv = 4096;
    let (b, _bcq) = enabled_endpoint(&h.domain, &info, &h.av(), WaitMode::Interrupt);
    let mut peer = sender_process(&b, 1, 100_000).await;
    // The record is there, parked for want of budget.
    let start = Instant::now();
    while b.stats().unwrap().conns == 0 {
        assert!(start.elapsed() < TIMEOUT, "the sender never claimed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(b.stats().unwrap().rx_direct, 0);
    peer.0.kill().unwrap();
    peer.0.wait().unwrap();
    let warm = within("warm-up", b.recv(BytesMut::zeroed(1))).await;
    assert!(warm.is_ok_and(|w| w.len == 1));
    let r = within("the receive", b.recv(BytesMut::zeroed(100_000))).await;
    match r {
        Ok(_) => panic!("a dead sender's CMA message completed a receive"),
        Err(e) => assert_eq!(e.err, Error::ConnAborted),
    }
    assert_eq!(b.stats().unwrap().conns, 0, "the channel is free again");
}

/// A CMA send waits for its receiver to read it; past the receiver's
/// unexpected budget, until a receive is posted. A sender whose driver
/// sleeps (interrupt and inline modes, nobody awaiting) asks to be rung
/// before it sleeps, and is rung once the late receive reads the
/// message; a busy-poll sender, whose thread never sleeps, never asks
/// (the receiver's `write` per large message in spinning modes, counted
/// in `docs/benchmarks.md`). Every send completes and arrives whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_cma_send_asks_to_be_rung_only_when_its_driver_sleeps() {
    if shm_common::cma_denied("skipped (sends take the ring and end at once)") {
        return;
    }
    cma::set_when_spinning(true);
    for mode in [WaitMode::Interrupt, WaitMode::Inline, WaitMode::BusyPoll] {
        let mut info = harness().info.clone();
        info.rx_attr.total_buffered_recv = 1000;
        let p = pair_of(Harness::with_info(&Provider::named("shm"), info), mode);
        // The channel claimed and its CMA probe read first: a first send
        // to a peer takes the ring.
        p.a.post_send(p.b_in_a, payload(8, 9), 9).unwrap();
        within("first", p.b.recv(BytesMut::zeroed(8)))
            .await
            .unwrap();
        within("first send", next_cq(&p.acq)).await.unwrap();
        for round in 0..3u8 {
            let msg = payload(CMA_MIN * 2, round);
            p.a.post_send(p.b_in_a, msg.clone(), u64::from(round))
                .unwrap();
            if mode == WaitMode::BusyPoll {
                tokio::time::sleep(weft_integration::QUIET).await;
                assert_eq!(chan_word(&p.b, C_TX_WAIT), Some(0), "{mode:?}: never asks");
            } else {
                let start = Instant::now();
                while chan_word(&p.b, C_TX_WAIT) != Some(1) {
                    assert!(start.elapsed() < TIMEOUT, "{mode:?}: asked before sleeping");
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
            // The sender is not rung while undelivered: nothing ends.
            let got = within("late receive", p.b.recv(BytesMut::zeroed(CMA_MIN * 2)))
                .await
                .unwrap();
            assert!(got.into_bytes()[..] == msg[..], "{mode:?} #{round} whole");
            let s = within("send", next_cq(&p.acq)).await.unwrap();
            assert_eq!(s.context, u64::from(round), "{mode:?}");
        }
        assert_eq!(direct(&p.b), 3, "{mode:?}: each went direct");
    }
}

/// A CMA send of 4 buffers (a 72-byte announcement, a record never split)
/// when 96 bytes remain before the ring's end, the receiver drained: the
/// largest record that fits there holds 64 bytes, so it goes after
/// padding at the ring's start. Before, it waited for room the drained
/// receiver never made, forever. (Where CMA is denied it is copied.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cma_send_of_four_buffers_near_the_rings_end_goes() {
    let p = pair(WaitMode::Interrupt);
    let g = Geometry::OURS;
    // 31 records of 8224 bytes and one of 7104: the tail 96 bytes before
    // the end. Each message is consumed before the next is sent (its
    // receive may complete before the head moves), so each goes as one
    // record.
    let seg = shm_common::segment_of(&p.b);
    let sizes = std::iter::repeat_n(8192, 31).chain([7072]);
    let mut at = 0u64;
    for (i, len) in sizes.enumerate() {
        let (got, sent) = within("a copied message", async {
            tokio::join!(
                p.b.recv(BytesMut::zeroed(len)),
                p.a.send(p.b_in_a, payload(len, i as u8))
            )
        })
        .await;
        sent.unwrap();
        assert_eq!(got.unwrap().len, len);
        at += weft_shm::layout::rec_len(len) as u64;
        let c = (0..g.channels)
            .map(|i| weft_shm::ring::Chan { g, i })
            .find(|c| c.state(&seg) == Some(ACTIVE))
            .expect("the sender's channel");
        within("the message consumed", async {
            while c.head(&seg) != at {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await;
    }
    assert_eq!(at, (g.ring - 96) as u64);
    let parts: Vec<_> = (0..4u8).map(|k| payload(8192, 40 + k)).collect();
    let whole: Vec<u8> = parts.iter().flat_map(|b| b.iter().copied()).collect();
    let before = direct(&p.b);
    let m = SendMsg {
        dest: p.b_in_a,
        iov: parts,
        tag: None,
        data: None,
        context: 9,
    };
    let (got, sent) = within("the 4-buffer send", async {
        tokio::join!(
            p.b.recv(BytesMut::zeroed(whole.len())),
            p.a.sendmsg(m, OpFlags::empty())
        )
    })
    .await;
    sent.unwrap();
    assert!(got.unwrap().into_bytes()[..] == whole[..]);
    if cma::mode() != Mode::Denied {
        assert_eq!(direct(&p.b), before + 1, "it went by CMA");
    }
}
