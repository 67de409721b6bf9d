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

const RW: MrAccess = MrAccess::REMOTE_READ.union(MrAccess::REMOTE_WRITE);

fn harness() -> Harness {
    let p = Provider::named("shm");
    Harness::with_info(&p, p.rma_info(EpType::Rdm))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_and_long_transfers_in_every_mode() {
    for mode in [WaitMode::Interrupt, WaitMode::BusyPoll, WaitMode::Inline] {
        let h = harness();
        let (aav, bav) = (h.av(), h.av());
        let (a, _acq) = enabled_endpoint(&h.domain, &h.info, &aav, mode);
        let (b, _bcq) = enabled_endpoint(&h.domain, &h.info, &bav, mode);
        let to_b = aav
            .insert_sync(&[b.local_addr().unwrap()], Default::default())
            .unwrap()
            .fi_addrs[0];
        let mr = h
            .domain
            .mr_regattr(MrAttr::alloc(4 << 20, RW).requested_key(5))
            .unwrap();
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
/// process of the same user could): the channel is freed and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_answer_frees_the_channel() {
    let h = harness();
    let (b, _bcq) = enabled_endpoint(&h.domain, &h.info, &h.av(), WaitMode::BusyPoll);
    let name = String::from_utf8(b.local_addr().unwrap()).unwrap();
    let seg_name = weft_shm::name::seg_name(name.trim_start_matches("fi_shm://"));
    let g = Geometry::OURS;
    let seg = Segment::open(&seg_name, g.bytes(), g.bytes()).unwrap();
    let c = Chan { g, i: 3 };
    let me = weft_shm::live::me();
    use Ordering::Release;
    assert!(seg.cas32(c.ctl(C_STATE), FREE, CLAIMING | me.0));
    seg.store32(c.ctl(C_PID), me.0, Release);
    seg.store64(c.ctl(C_START), me.1, Release);
    seg.store32(c.ctl(C_NAME_LEN), 6, Release);
    seg.write(c.ctl(C_NAME), b"forger");
    let gen = seg.load32(c.ctl(C_GEN), Ordering::Acquire).unwrap() + 1;
    seg.store32(c.ctl(C_GEN), gen, Release);
    seg.store64(c.ctl(C_TAIL), 0, Release);
    seg.store32(c.ctl(C_STATE), ACTIVE, Release);
    let h0 = RecHead {
        word: K_RESP | F_LAST,
        ..RecHead::default()
    };
    let (_, tail) = c.write_head(&seg, 0, &h0);
    c.publish(&seg, tail);
    let start = Instant::now();
    while b.stats().unwrap().rx_malformed == 0 {
        assert!(start.elapsed() < TIMEOUT, "the forged answer was taken");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(seg.load32(c.ctl(C_STATE), Ordering::Acquire), Some(FREE));
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
    let pid = peer.0.id().to_string();
    let stopped = std::process::Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap();
    assert!(stopped.success());
    // kill(2) returns before the target's threads have all stopped: one
    // still running could answer the read below. Wait until each is.
    within("the target stops", async {
        while !all_stopped(&pid) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
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
    seg.store64(mine.ctl(C_TAIL), 0, Ordering::Release);
    seg.store32(mine.ctl(C_STATE), FREE, Ordering::Release);
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

/// Whether every thread of process `pid` is stopped (state `T` in
/// `/proc/<pid>/task/*/stat`).
fn all_stopped(pid: &str) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|t| {
        std::fs::read_to_string(t.path().join("stat")).is_ok_and(|st| {
            st.rfind(')')
                .and_then(|i| st[i + 1..].split_whitespace().next())
                .is_some_and(|state| state == "T" || state == "t")
        })
    })
}
