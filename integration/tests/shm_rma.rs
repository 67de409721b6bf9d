//! shm RMA beyond the conformance suite (`rma::shm`, `mr::shm`): a write
//! not waited for is seen by the read after it, transfers of many records each
//! way, refusals that leave the region untouched in every wait mode,
//! a target that answers what nobody asked (a forged answer frees its
//! channel, counted, and the endpoint goes on), and a target in another
//! process (RMA and atomics across processes; killed, its waiting
//! operations fail).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use weft::{EpType, Error, MrAccess, MrAttr, WaitMode};
use weft_integration::child::spawn_peer;
use weft_integration::{enabled_endpoint, payload, within, Harness, Provider, TIMEOUT};
use weft_shm::layout::*;
use weft_shm::ring::{Chan, RecHead};
use weft_shm::segment::Segment;

mod shm_common;

const RW: MrAccess = MrAccess::REMOTE_READ.union(MrAccess::REMOTE_WRITE);

fn harness() -> Harness {
    let p = Provider::named("shm");
    Harness::with_info(&p, p.rma_info(EpType::Rdm))
}

/// An initiator `a` and a target `b` on one domain in `mode` (with `b`
/// in `a`'s AV as `to_b`), and a region of `len` bytes under `key` in
/// that domain.
struct Pair {
    a: weft::Endpoint,
    b: weft::Endpoint,
    to_b: weft::FiAddr,
    mr: weft::MemoryRegion,
    h: Harness,
    _cqs: (weft::CompletionQueue, weft::CompletionQueue),
}

/// Sets `cma::set_when_spinning`, process-wide, for a test that needs
/// it one way: held until the test ends, so that tests needing it the
/// other way wait (the ones that do not care never take it).
async fn spin_cma(on: bool) -> tokio::sync::MutexGuard<'static, ()> {
    static HELD: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let g = HELD.lock().await;
    weft_shm::cma::set_when_spinning(on);
    g
}

fn pair(mode: WaitMode, len: usize, key: u64) -> Pair {
    let h = harness();
    let (aav, bav) = (h.av(), h.av());
    let (a, acq) = enabled_endpoint(&h.domain, &h.info, &aav, mode);
    let (b, bcq) = enabled_endpoint(&h.domain, &h.info, &bav, mode);
    let to_b = aav
        .insert_sync(&[b.local_addr().unwrap()], Default::default())
        .unwrap()
        .fi_addrs[0];
    let mr = h
        .domain
        .mr_regattr(MrAttr::alloc(len, RW).requested_key(key))
        .unwrap();
    Pair {
        a,
        b,
        to_b,
        mr,
        h,
        _cqs: (acq, bcq),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_and_long_transfers_in_every_mode() {
    // The rings while both sides spin (the default), as in `shm.rs`.
    let _spin = spin_cma(false).await;
    for mode in [WaitMode::Interrupt, WaitMode::BusyPoll, WaitMode::Inline] {
        let Pair {
            a,
            b: _b,
            to_b,
            mr,
            h,
            ..
        } = pair(mode, 4 << 20, 5);
        // A posted write, not waited for: the read after it sees it
        // (one target answers in order).
        a.post_write(to_b, payload(4096, 1), mr.addr() + 8, mr.key(), 1)
            .unwrap();
        let e = within(
            "read",
            a.read(to_b, BytesMut::zeroed(4096), mr.addr() + 8, mr.key()),
        )
        .await
        .unwrap();
        assert!(e.into_bytes()[..] == payload(4096, 1)[..], "{mode:?}");
        // 3 MiB each way: many records through 256 KiB rings.
        let big = payload(3 << 20, 2);
        within(
            "write",
            a.write(to_b, big.clone(), mr.addr() + 4096, mr.key()),
        )
        .await
        .unwrap();
        let mut got = vec![0u8; 3 << 20];
        mr.read_at(4096, &mut got).unwrap();
        assert!(got[..] == big[..], "{mode:?}: the write landed");
        let e = within(
            "read",
            a.read(to_b, BytesMut::zeroed(3 << 20), mr.addr() + 4096, mr.key()),
        )
        .await
        .unwrap();
        assert!(e.into_bytes()[..] == big[..], "{mode:?}: read back");
        // Refusals: past the end, a key nobody has, a right the region
        // lacks. Nothing moves.
        let ro = h
            .domain
            .mr_regattr(MrAttr::alloc(64, MrAccess::REMOTE_READ).requested_key(6))
            .unwrap();
        let refusals = [
            (mr.addr() + (4 << 20) - 10, mr.key()),
            (mr.addr(), 999),
            (ro.addr(), ro.key()),
        ];
        for (at, key) in refusals {
            let w = within("refused write", a.write(to_b, payload(20, 3), at, key)).await;
            assert_eq!(w.unwrap_err().err, Error::Access, "{mode:?} {key}");
        }
        let r = within(
            "refused read",
            a.read(to_b, BytesMut::zeroed(20), mr.addr(), 999),
        )
        .await;
        assert_eq!(r.unwrap_err().err, Error::Access);
        let mut tail = [0u8; 10];
        mr.read_at((4 << 20) - 10, &mut tail).unwrap();
        assert_eq!(tail, [0; 10]);
        let mut ro_bytes = [1u8; 20];
        ro.read_at(0, &mut ro_bytes).unwrap();
        assert_eq!(ro_bytes, [0; 20]);
        // Closed: its key stops working at once.
        mr.close().unwrap();
        let w = within(
            "write to a closed region",
            a.write(to_b, Bytes::from_static(b"x"), 0, 5),
        )
        .await;
        assert_eq!(w.unwrap_err().err, Error::Access);
    }
}

/// An answer nobody asked for (here written by the test, as a hostile
/// process of the same user could), under the name and instance of a
/// live endpoint we never sent anything to: the channel is freed and
/// counted. (Under a name no running instance holds, the answer would be
/// one queued by an instance gone from it, and dropped harmlessly:
/// `shm_restart.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_answer_frees_the_channel() {
    let h = harness();
    let (b, _bcq) = enabled_endpoint(&h.domain, &h.info, &h.av(), WaitMode::BusyPoll);
    // The endpoint whose name and instance the forger claims with.
    let (f, _fcq) = enabled_endpoint(&h.domain, &h.info, &h.av(), WaitMode::BusyPoll);
    let forged = String::from_utf8(f.local_addr().unwrap()).unwrap();
    let forged = forged.trim_start_matches("fi_shm://");
    let inst = weft_shm::live::instance_of_name(forged).unwrap();
    let name = String::from_utf8(b.local_addr().unwrap()).unwrap();
    let seg_name = weft_shm::name::seg_name(name.trim_start_matches("fi_shm://"));
    let g = Geometry::OURS;
    let seg = Segment::open(&seg_name, g.bytes(), g.bytes()).unwrap();
    let c = Chan { g, i: 3 };
    use Ordering::Release;
    let gen = c.begin_claim(&seg, inst.0).expect("channel 3 free");
    seg.store32(c.ctl(C_PID), inst.0, Release);
    seg.store64(c.ctl(C_START), inst.1, Release);
    seg.store64(c.ctl(C_SERIAL), inst.2, Release);
    seg.store32(c.ctl(C_NAME_LEN), forged.len() as u32, Release);
    seg.write(c.ctl(C_NAME), forged.as_bytes());
    c.clear_start(&seg);
    assert!(c.move_state(&seg, gen, claiming(inst.0), ACTIVE));
    let h0 = RecHead {
        word: K_RESP | F_LAST,
        ..RecHead::default()
    };
    c.write_head(&seg, 0, &h0);
    c.publish(&seg, 0, h0.word);
    let start = Instant::now();
    while b.stats().unwrap().rx_malformed == 0 {
        assert!(start.elapsed() < TIMEOUT, "the forged answer was taken");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(c.state(&seg), Some(FREE));
}

/// RMA and atomics against a target in another process; stopped, a
/// read waits; our channel freed under it, it fails (`FI_ECONNABORTED`);
/// killed, the next waiting read fails within a second
/// (`FI_ECONNRESET`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_in_another_process_and_its_death() {
    let p = Provider::named("shm");
    let info = p
        .try_info_with(EpType::Rdm, |h| {
            h.caps = weft::Caps::MSG | weft::Caps::RMA | weft::Caps::ATOMIC
        })
        .expect("an shm offer with RMA and atomics");
    let h = Harness::with_info(&p, info);
    let av = h.av();
    let (a, _acq) = enabled_endpoint(&h.domain, &h.info, &av, WaitMode::Interrupt);
    let (mut peer, addr) = spawn_peer(env!("CARGO_BIN_EXE_shm-peer"), &["target"]).await;
    let to = av
        .insert_sync(&[addr.clone().into_bytes()], Default::default())
        .unwrap()
        .fi_addrs[0];
    let e = within("read", a.read(to, BytesMut::zeroed(4096), 0, 42))
        .await
        .unwrap();
    assert!(
        e.into_bytes()[..] == payload(4096, 7)[..],
        "the peer's region"
    );
    within("write", a.write(to, payload(100, 9), 10, 42))
        .await
        .unwrap();
    let e = within("read back", a.read(to, BytesMut::zeroed(100), 10, 42))
        .await
        .unwrap();
    assert!(e.into_bytes()[..] == payload(100, 9)[..]);
    let old = within(
        "fetch-add",
        a.fetch_atomic(
            to,
            weft::AtomicOp::Sum,
            weft::Datatype::U64,
            1,
            Bytes::copy_from_slice(&5u64.to_ne_bytes()),
            200,
            42,
        ),
    )
    .await
    .unwrap();
    let before = u64::from_ne_bytes(old[..8].try_into().unwrap());
    let e = within("read the sum", a.read(to, BytesMut::zeroed(8), 200, 42))
        .await
        .unwrap();
    let after = u64::from_ne_bytes(e.into_bytes()[..8].try_into().unwrap());
    assert_eq!(after, before.wrapping_add(5));
    // Stopped: a read waits; our channel freed under it (as a broken
    // owner would): it fails; killed: the next one fails too.
    shm_common::stop(peer.0.id()).await;
    let read = a.read(to, BytesMut::zeroed(8), 0, 42);
    tokio::pin!(read);
    if let Ok(r) = tokio::time::timeout(Duration::from_millis(300), &mut read).await {
        panic!("a stopped target answered: {:?}", r.map(|e| e.len));
    }
    let seg_name = weft_shm::name::seg_name(addr.trim_start_matches("fi_shm://"));
    let g = Geometry::OURS;
    let seg = Segment::open(&seg_name, g.bytes(), g.bytes()).unwrap();
    let me = String::from_utf8(a.local_addr().unwrap()).unwrap();
    let me = me.trim_start_matches("fi_shm://").as_bytes();
    let mine = (0..g.channels)
        .map(|i| Chan { g, i })
        .find(|c| {
            let mut n = vec![0u8; me.len()];
            seg.load32(c.ctl(C_NAME_LEN), Ordering::Acquire) == Some(me.len() as u32)
                && seg.read(c.ctl(C_NAME), &mut n)
                && n == me
        })
        .expect("our channel in the target's segment");
    // As the owner's `free` does.
    seg.store64(mine.ctl(C_HEAD), 0, Ordering::Release);
    mine.set_free(&seg);
    let e = within("the read on a freed channel", read)
        .await
        .unwrap_err();
    assert_eq!(e.err, Error::ConnAborted);
    let read = a.read(to, BytesMut::zeroed(8), 0, 42);
    tokio::pin!(read);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut read)
            .await
            .is_err(),
        "a stopped target answered"
    );
    peer.0.kill().unwrap();
    let killed = Instant::now();
    peer.0.wait().unwrap();
    let e = within("the read", read).await.unwrap_err();
    assert_eq!(e.err, Error::ConnReset);
    assert!(
        killed.elapsed() < Duration::from_secs(1),
        "{:?}",
        killed.elapsed()
    );
}

/// Transfers from `cma::rma_min()` up go direct where cross-memory
/// attach is permitted: the target moves the bytes between its region
/// and our buffers (counted in its `rx_direct`), in every shape, and
/// lands exactly where asked; refusals (another key, past the end, a
/// missing right) leave the region untouched and move nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_transfers_go_direct_where_permitted() {
    use weft_shm::cma::{self, Mode};
    let direct_on = cma::mode() != Mode::Denied;
    // Direct in the spinning modes too (while both sides spin they take
    // the ring by default: `shm.rs`).
    let _spin = spin_cma(true).await;
    for mode in [WaitMode::Interrupt, WaitMode::BusyPoll, WaitMode::Inline] {
        let Pair {
            a, b, to_b, mr, h, ..
        } = pair(mode, 8 << 20, 7);
        // A small write first: the target has seen (and probed) our
        // channel before the large ones begin.
        within("warm", a.write(to_b, payload(8, 9), mr.addr(), mr.key()))
            .await
            .unwrap();
        let direct0 = b.stats().unwrap().rx_direct;
        let mut expect = 0;
        for (i, len) in [cma::rma_min(), (1 << 20) + 7, 3 << 20]
            .into_iter()
            .enumerate()
        {
            let at = 4096 + 13 * i as u64;
            let data = payload(len, i as u8 + 1);
            // Written from three buffers, read into two.
            let (x, rest) = (data.slice(..len / 3), data.slice(len / 3..));
            let (y, z) = (rest.slice(..5), rest.slice(5..));
            let w = weft::RmaMsg {
                dest: to_b,
                op: weft::RmaOp::Write {
                    iov: vec![x, y, z],
                    data: None,
                },
                addr: mr.addr() + at,
                key: mr.key(),
                context: 0,
            };
            within("write", a.rmamsg(w, weft::OpFlags::empty()))
                .await
                .unwrap();
            let mut got = vec![0u8; len + 2];
            mr.read_at(at as usize - 1, &mut got).unwrap();
            assert!(got[1..=len] == data[..], "{mode:?} {len}: landed");
            let read = weft::RmaMsg {
                dest: to_b,
                op: weft::RmaOp::Read {
                    bufs: vec![BytesMut::zeroed(len / 2), BytesMut::zeroed(len - len / 2)],
                },
                addr: mr.addr() + at,
                key: mr.key(),
                context: 0,
            };
            let e = within("read", a.rmamsg(read, weft::OpFlags::empty()))
                .await
                .unwrap();
            let back: Vec<u8> = e.bufs.iter().flat_map(|b| b.iter().copied()).collect();
            assert!(back[..] == data[..], "{mode:?} {len}: read back");
            // Nothing around the range was touched.
            let mut edge = [1u8; 1];
            mr.read_at(at as usize + len, &mut edge).unwrap();
            assert_eq!(edge, [0], "{mode:?} {len}: past the end");
            expect += 2;
        }
        let moved = b.stats().unwrap().rx_direct - direct0;
        assert_eq!(moved, if direct_on { expect } else { 0 }, "{mode:?}");
        // Refusals of direct-sized transfers.
        let ro = h
            .domain
            .mr_regattr(MrAttr::alloc(1 << 20, MrAccess::REMOTE_READ).requested_key(8))
            .unwrap();
        let big = payload(1 << 20, 4);
        let refusals = [
            (mr.addr() + (8 << 20) - (1 << 19), mr.key()),
            (mr.addr(), 999),
            (ro.addr(), ro.key()),
        ];
        for (at, key) in refusals {
            let w = within("refused", a.write(to_b, big.clone(), at, key)).await;
            assert_eq!(w.unwrap_err().err, Error::Access, "{mode:?} {key}");
        }
        let r = within(
            "refused read",
            a.read(
                to_b,
                BytesMut::zeroed(1 << 20),
                mr.addr() + (8 << 20) - 10,
                mr.key(),
            ),
        )
        .await;
        assert_eq!(r.unwrap_err().err, Error::Access);
        let mut tail = vec![1u8; 1 << 19];
        mr.read_at((8 << 20) - (1 << 19), &mut tail).unwrap();
        assert!(tail.iter().all(|&b| b == 0), "{mode:?}: past-the-end write");
        let mut ro_bytes = vec![1u8; 1 << 20];
        ro.read_at(0, &mut ro_bytes).unwrap();
        assert!(
            ro_bytes.iter().all(|&b| b == 0),
            "{mode:?}: read-only region"
        );
        assert_eq!(b.stats().unwrap().rx_direct - direct0, moved);
        assert_eq!(b.stats().unwrap().rx_malformed, 0);
    }
}

/// A target in another process, with cross-memory attach (direct) and
/// without it (`copy`: the rings): 1 MiB writes and reads land the same
/// either way. Then, stopped with a large read waiting and killed, the
/// read fails within a second (`FI_ECONNRESET`), never hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_transfers_with_a_target_in_another_process() {
    let h = harness();
    let size = 4usize << 20;
    for path in ["direct", "copy"] {
        let av = h.av();
        let (a, _acq) = enabled_endpoint(&h.domain, &h.info, &av, WaitMode::Interrupt);
        let sz = size.to_string();
        let args: &[&str] = if path == "copy" {
            &["target", &sz, "copy"]
        } else {
            &["target", &sz]
        };
        let (mut peer, addr) = spawn_peer(env!("CARGO_BIN_EXE_shm-peer"), args).await;
        let to = av
            .insert_sync(&[addr.clone().into_bytes()], Default::default())
            .unwrap()
            .fi_addrs[0];
        let initial = payload(size, 7);
        let e = within("read", a.read(to, BytesMut::zeroed(1 << 20), 4096, 42))
            .await
            .unwrap();
        assert!(
            e.into_bytes()[..] == initial[4096..4096 + (1 << 20)],
            "{path}"
        );
        let data = payload((1 << 20) + 3, 11);
        within("write", a.write(to, data.clone(), 100, 42))
            .await
            .unwrap();
        let e = within(
            "read back",
            a.read(to, BytesMut::zeroed(data.len() + 2), 99, 42),
        )
        .await
        .unwrap();
        let got = e.into_bytes();
        assert_eq!(got[0], initial[99], "{path}: before the write");
        assert!(got[1..=data.len()] == data[..], "{path}: the write");
        assert_eq!(
            got[data.len() + 1],
            initial[100 + data.len()],
            "{path}: after it"
        );
        let w = within("refused", a.write(to, data.clone(), 0, 41)).await;
        assert_eq!(w.unwrap_err().err, Error::Access, "{path}");
        if path == "copy" {
            continue;
        }
        shm_common::stop(peer.0.id()).await;
        let read = a.read(to, BytesMut::zeroed(2 << 20), 0, 42);
        tokio::pin!(read);
        assert!(
            tokio::time::timeout(Duration::from_millis(200), &mut read)
                .await
                .is_err(),
            "a stopped target answered"
        );
        peer.0.kill().unwrap();
        let killed = Instant::now();
        peer.0.wait().unwrap();
        let e = within("the read", read).await.unwrap_err();
        assert_eq!(e.err, Error::ConnReset);
        assert!(killed.elapsed() < Duration::from_secs(1));
    }
}

/// Publishes one direct RMA request at `tail` of channel `c`; returns
/// the new tail.
fn hostile_direct(
    seg: &Segment,
    c: &Chan,
    tail: u64,
    word: u32,
    key: u64,
    req: &[u8],
    total: u64,
) -> u64 {
    let h = RecHead {
        word: word | F_LAST,
        len: req.len() as u32,
        tag: key,
        data: 0,
        total,
    };
    let (at, next) = c.write_head(seg, tail, &h);
    seg.write(at, req);
    c.publish(seg, tail, h.word);
    next
}

/// Direct requests written by hand (a hostile initiator): announced
/// memory that is not there, past the region's end, under another key,
/// half there; reads into memory that is not there. The target moves
/// bytes only inside the region it checked, its neighbour stays
/// untouched, and it goes on; a direct request on a channel whose probe
/// did not pass, or an announcement that does not add up, frees the
/// channel (counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_direct_requests_stay_in_the_region() {
    use weft_shm::cma::{self, Announce, DirectReq, Mode};
    if cma::mode() != Mode::Permitted {
        eprintln!("CMA not permitted here: nothing to attack");
        return;
    }
    let n = 64usize << 10;
    let Pair {
        a, b, to_b, mr, h, ..
    } = pair(WaitMode::BusyPoll, n, 9);
    let guard = h
        .domain
        .mr_regattr(MrAttr::alloc(n, RW).requested_key(10))
        .unwrap();
    let src = payload(n, 5);
    let req = |off: u64, ranges: &[(u64, u64)]| {
        DirectReq {
            off,
            ann: Announce {
                ranges: ranges.iter().copied().collect(),
                pool: None,
            },
        }
        .encode()
    };
    let good = src.as_ptr() as u64;
    let (seg, c) = shm_common::hostile_claim(&b, 4, true);
    let mut tail = 0;
    let zeros = |m: &weft::MemoryRegion| {
        let mut v = vec![1u8; n];
        m.read_at(0, &mut v).unwrap();
        v.iter().all(|&x| x == 0)
    };
    // Unmapped source; past the end; another key: nothing written.
    for (off, key, ranges) in [
        (0u64, 9u64, vec![(0x1000u64, n as u64)]),
        (4096, 9, vec![(good, n as u64)]),
        (0, 11, vec![(good, n as u64)]),
    ] {
        tail = hostile_direct(&seg, &c, tail, K_RMA_WD, key, &req(off, &ranges), n as u64);
    }
    // Half there: the first half lands, inside the region.
    let half = (n / 2) as u64;
    tail = hostile_direct(
        &seg,
        &c,
        tail,
        K_RMA_WD,
        9,
        &req(0, &[(good, half), (0x1000, half)]),
        n as u64,
    );
    // A read into memory that is not there.
    tail = hostile_direct(
        &seg,
        &c,
        tail,
        K_RMA_RD,
        9,
        &req(0, &[(0x1000, n as u64)]),
        n as u64,
    );
    let start = Instant::now();
    while c.head(&seg) != tail {
        assert!(start.elapsed() < TIMEOUT, "the requests were not taken");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut got = vec![0u8; n];
    mr.read_at(0, &mut got).unwrap();
    assert!(got[..n / 2] == src[..n / 2], "the part that was there");
    assert!(got[n / 2..].iter().all(|&x| x == 0), "nothing past it");
    assert!(zeros(&guard), "the neighbour region untouched");
    assert_eq!(b.stats().unwrap().rx_malformed, 0);

    // A direct request where the probe did not pass, and lengths that do
    // not add up: the channel is freed, counted.
    let (seg2, c2) = shm_common::hostile_claim(&b, 5, false);
    hostile_direct(&seg2, &c2, 0, K_RMA_WD, 9, &req(0, &[(good, 8)]), 8);
    let (seg3, c3) = shm_common::hostile_claim(&b, 6, true);
    hostile_direct(&seg3, &c3, 0, K_RMA_WD, 9, &req(0, &[(good, 8)]), 9);
    let start = Instant::now();
    while b.stats().unwrap().rx_malformed < 2 {
        assert!(start.elapsed() < TIMEOUT, "freed and counted");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(zeros(&guard));
    // The endpoint goes on.
    within("write", a.write(to_b, src.clone(), mr.addr(), mr.key()))
        .await
        .unwrap();
    mr.read_at(0, &mut got).unwrap();
    assert!(got[..] == src[..]);
}
