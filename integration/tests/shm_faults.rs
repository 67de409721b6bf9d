//! shm faults with real processes: a peer killed with SIGKILL while sends
//! to it wait (they fail within a second and its segment is removed), a
//! sender killed in the middle of a message (the receive it had begun
//! fails within a second and its channel is freed), a segment left by a
//! killed process (reclaimed), and an insert of a name nobody takes (it
//! fails after `FI_SHM_RESOLVE_TIMEOUT`), and a claimer in another pid
//! namespace descheduled mid-claim (never voided while it holds its
//! claim lock; freed once the lock is gone), and a claim under this
//! process's own live pid freed once its lock is let go (the lock, not
//! the pid, decides). The peer is the `shm-peer` binary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use weft::{CqItem, EpType, Error, WaitMode};
use weft_integration::child::{spawn_peer, Reap};
use weft_integration::{enabled_endpoint, next_cq, payload, within, within_for, Harness, Provider};

/// Within how long a killed peer's operations must fail.
const DETECT: Duration = Duration::from_secs(1);

/// Starts `shm-peer args` and returns it with the first line it prints.
async fn peer(args: &[&str]) -> (Reap, String) {
    spawn_peer(env!("CARGO_BIN_EXE_shm-peer"), args).await
}

/// SIGKILL, and the zombie reaped.
fn kill9(c: &mut Reap) -> Instant {
    c.0.kill().unwrap();
    let t = Instant::now();
    c.0.wait().unwrap();
    t
}

fn segment_path(addr: &str) -> PathBuf {
    PathBuf::from(format!(
        "/dev/shm/weft-shm.{}",
        addr.trim_start_matches("fi_shm://")
    ))
}

fn harness() -> Harness {
    Harness::new(&Provider::named("shm"), EpType::Rdm)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_receiver_fails_waiting_sends_within_a_second() {
    let (mut child, addr) = peer(&["idle"]).await;
    let h = harness();
    let av = h.av();
    let (ep, cq) = enabled_endpoint(&h.domain, &h.info, &av, WaitMode::Interrupt);
    let to = av
        .insert_sync(&[addr.clone().into_bytes()], Default::default())
        .unwrap()
        .fi_addrs[0];
    // 400 x 8 KiB: more than its 64 KiB budget and one 256 KiB ring hold.
    let n = 400u64;
    for i in 0..n {
        ep.post_send(to, payload(8192, i as u8), i).unwrap();
    }
    // What fits completes; the rest waits for room that never comes.
    let mut done = 0u64;
    while let Some(it) = cq.next_timeout(Duration::from_millis(300)).await {
        it.unwrap();
        done += 1;
    }
    assert!(done > 0 && done < n, "{done} of {n} sends completed");
    assert!(segment_path(&addr).exists());
    let killed = kill9(&mut child);
    while done < n {
        let it: CqItem = within("a failed send", next_cq(&cq)).await;
        let e = it.unwrap_err();
        assert_eq!(e.err, Error::ConnReset);
        done += 1;
    }
    assert!(
        killed.elapsed() < DETECT,
        "the last waiting send failed {:?} after the kill",
        killed.elapsed()
    );
    // Its segment is gone, and a new send fails at once.
    assert!(
        !segment_path(&addr).exists(),
        "the dead peer's segment stays"
    );
    let e = within("send to the dead", ep.send(to, payload(8, 0)))
        .await
        .unwrap_err();
    assert_eq!(e.err, Error::ConnRefused);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_killed_mid_message_fails_the_receive_within_a_second() {
    let h = harness();
    let av = h.av();
    let (ep, _cq) = enabled_endpoint(&h.domain, &h.info, &av, WaitMode::Interrupt);
    let me = String::from_utf8(ep.local_addr().unwrap()).unwrap();
    let recv = ep.trecv(BytesMut::zeroed(1 << 20), weft::FI_ADDR_UNSPEC, 7, 0);
    tokio::pin!(recv);
    let (mut child, ready) = peer(&["partial", &me]).await;
    assert_eq!(ready, "ready");
    // The first record is taken; the rest never comes.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut recv)
            .await
            .is_err(),
        "half a message completed a receive"
    );
    assert_eq!(ep.stats().unwrap().conns, 1);
    let killed = kill9(&mut child);
    let e = within("the receive", recv).await.unwrap_err();
    assert!(killed.elapsed() < DETECT, "{:?}", killed.elapsed());
    assert_eq!(e.err, Error::ConnAborted);
    assert_eq!(e.len, 4096, "what arrived is reported");
    // The channel is free again.
    assert_eq!(ep.stats().unwrap().conns, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segments_of_killed_processes_are_reclaimed() {
    let (mut child, addr) = peer(&["idle"]).await;
    kill9(&mut child);
    let path = segment_path(&addr);
    assert!(path.exists(), "nobody has looked yet");
    assert!(weft_shm::live::reclaim_stale() >= 1);
    assert!(!path.exists());
    let bell = format!(
        "/dev/shm/weft-shmbell.{}",
        addr.trim_start_matches("fi_shm://")
    );
    assert!(!std::path::Path::new(&bell).exists());
    // Our own segments are left alone.
    let h = harness();
    let (ep, _cq) = enabled_endpoint(&h.domain, &h.info, &h.av(), WaitMode::Interrupt);
    let mine = segment_path(&String::from_utf8(ep.local_addr().unwrap()).unwrap());
    weft_shm::live::reclaim_stale();
    assert!(mine.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insert_of_a_name_nobody_takes_times_out() {
    // Read when the domain opens.
    std::env::set_var("FI_SHM_RESOLVE_TIMEOUT", "300");
    let h = harness();
    std::env::remove_var("FI_SHM_RESOLVE_TIMEOUT");
    let av = h.av();
    let t = Instant::now();
    let r = within(
        "insert",
        av.insert(&[b"fi_shm://nobody-here".to_vec()], Default::default(), 0)
            .unwrap(),
    )
    .await;
    assert_eq!(r.count, 0);
    assert_eq!(r.results[0], Err(Error::TimedOut));
    assert!(t.elapsed() >= Duration::from_millis(300));
}

/// A claim in progress whose claimer's pid names nobody here (above any
/// pid the kernel gives: another pid namespace's) and which holds its
/// claim lock, as a live claimer descheduled mid-claim does: the owner
/// leaves it alone across many sweep intervals (version 9 freed it after
/// two, and the claimer's late writes could land in the next claim).
/// Once the lock goes with the description its claimer took it through
/// (a claim's own, closed at its exit), the claim is freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimer_holding_its_claim_lock_is_never_voided() {
    use std::os::fd::AsFd;
    use weft_shm::claim_lock::ClaimLock;
    use weft_shm::layout::{state_gen, Geometry, C_STATE_GEN, FREE};
    use weft_shm::ring::Chan;
    use weft_shm::segment::Segment;
    let h = harness();
    let (ep, _cq) = enabled_endpoint(&h.domain, &h.info, &h.av(), WaitMode::Interrupt);
    let (name, seg, file) = claimer_view(&ep);
    let g = Geometry::OURS;
    // The test's own view, to watch the word after the claimer is gone.
    let watch = Segment::open(&name, g.bytes(), g.bytes()).unwrap();
    let c = Chan { g, i: 3 };
    let lock = ClaimLock::try_take(file.as_fd(), c.ctl(C_STATE_GEN) as u64)
        .unwrap()
        .expect("nobody claims this channel");
    let (gen, claimed) = begin_as(&seg, &c, 1 << 23, 1);
    // Ten sweep intervals (100 ms each): judged at every one but the
    // first, never taken.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        watch.load64(c.ctl(C_STATE_GEN), std::sync::atomic::Ordering::Acquire),
        Some(claimed)
    );
    // The claimer dies: its lock goes with its claim's description,
    // never let go by hand.
    std::mem::forget(lock);
    drop(file);
    drop(seg);
    let freed = state_gen(FREE, gen);
    within_for(Duration::from_secs(20), "the dead claim freed", async {
        while watch.load64(c.ctl(C_STATE_GEN), std::sync::atomic::Ordering::Acquire) != Some(freed)
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(
        ep.stats().unwrap().rx_malformed,
        0,
        "a dead claimer is no broken one"
    );
}

/// A claim in progress whose claimer's pid and start time are this very
/// process's (`live::me`: alive by any pid look) is kept while its claim
/// lock is held, and freed within a few sweep intervals once the lock is
/// let go — its pid still alive: the owner's lock look, which worked,
/// decides, not the pid (`rx::claimer_alive`). Judged by pid the claim
/// would be kept for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_lock_is_let_go_is_freed_though_its_pid_lives() {
    use std::os::fd::AsFd;
    use std::sync::atomic::Ordering::Acquire;
    use weft_shm::claim_lock::ClaimLock;
    use weft_shm::layout::{state_gen, Geometry, C_STATE_GEN, FREE};
    use weft_shm::ring::Chan;
    let h = harness();
    let (ep, _cq) = enabled_endpoint(&h.domain, &h.info, &h.av(), WaitMode::Interrupt);
    let (_, seg, file) = claimer_view(&ep);
    let c = Chan {
        g: Geometry::OURS,
        i: 5,
    };
    let lock = ClaimLock::try_take(file.as_fd(), c.ctl(C_STATE_GEN) as u64)
        .unwrap()
        .expect("nobody claims this channel");
    let (pid, start) = weft_shm::live::me();
    assert!(weft_shm::live::alive(pid, start), "this process, alive");
    let (gen, claimed) = begin_as(&seg, &c, pid, start);
    // Held: kept across ten sweep intervals (100 ms each).
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(seg.load64(c.ctl(C_STATE_GEN), Acquire), Some(claimed));
    // Let go by hand (`F_UNLCK`), the description still open and the
    // claimer's pid alive: freed within a few sweep intervals (two looks
    // at the same word, 100 ms apart; generous for a loaded machine).
    drop(lock);
    let freed = state_gen(FREE, gen);
    // The bound is the neighbouring test's: what is checked is who
    // decides, not how fast (the 1 s hold covered ten sweep intervals).
    within_for(Duration::from_secs(20), "the unlocked claim freed", async {
        while seg.load64(c.ctl(C_STATE_GEN), Acquire) != Some(freed) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    drop(file);
    assert_eq!(ep.stats().unwrap().rx_malformed, 0);
}

/// `ep`'s segment as a claimer sees it: its name, a mapping, and the
/// description it locks through (the segment opened again by name for
/// the claim, as `Peer::claim` does).
fn claimer_view(ep: &weft::Endpoint) -> (String, weft_shm::segment::Segment, std::os::fd::OwnedFd) {
    use weft_shm::segment::Segment;
    let addr = String::from_utf8(ep.local_addr().unwrap()).unwrap();
    let name = weft_shm::name::seg_name(addr.trim_start_matches("fi_shm://"));
    let g = weft_shm::layout::Geometry::OURS;
    let seg = Segment::open(&name, g.bytes(), g.bytes()).unwrap();
    let file = Segment::open_fd(&name).unwrap();
    (name, seg, file)
}

/// Begins a claim of `c` under `pid` and `start` as a claimer's first
/// writes do (the claim's swap, its pid and start time): the claim's
/// count and the word it made.
fn begin_as(
    seg: &weft_shm::segment::Segment,
    c: &weft_shm::ring::Chan,
    pid: u32,
    start: u64,
) -> (u32, u64) {
    use std::sync::atomic::Ordering::Release;
    use weft_shm::layout::{claiming, state_gen, C_PID, C_START};
    let gen = c.begin_claim(seg, pid).expect("a free channel");
    seg.store32(c.ctl(C_PID), pid, Release);
    seg.store64(c.ctl(C_START), start, Release);
    (gen, state_gen(claiming(pid), gen))
}
