//! shm peers restarted under their name (issue #21): a peer record
//! names one endpoint instance (pid, start time, serial), and its
//! liveness is that instance's, not that of whoever holds the name now.
//!
//! - A target process killed with SIGKILL while reads and a
//!   delivery-complete send wait for it, a new process already holding
//!   its name: they fail (within a sweep or two when the machine is
//!   idle; no speed is asserted) (`FI_ECONNRESET`, as for any dead target), its record goes, and the
//!   next read reaches the new process. Before, the new process's lock
//!   on the name kept the dead one's record "alive": they waited
//!   forever, and later ones went into the orphaned segment.
//! - An initiator process killed the same way, a new one under its name
//!   reading from us: the new one gets its answer (before, our record
//!   for the name still mapped the dead one, and the answer was dropped
//!   as another instance's), and the dead one's channel in our segment
//!   is freed. Its request comes at once, mostly before our sweep saw
//!   the old one die: the look at its claim (`forget_if_gone`) is what
//!   answers it then (made certain in `shm_restart_nosweep.rs`).
//! - An answer on a channel claimed under a name we keep no record for,
//!   by an instance gone from that name — replaced, crashed, or closed
//!   in a process that runs on — is dropped: the messages behind it on
//!   the channel are delivered.
//! - A segment file under a name without a header (which a creator now
//!   never leaves there: it links its file under the name whole) is
//!   taken over at once unless somebody holds its lock; creators'
//!   private files never block an open and go, unlocked, at the sweep;
//!   of two endpoints opening under one name at once, one wins.
//!
//! The new process takes the name while the old one is stopped (its
//! segment file removed by the test), and the old one is killed after:
//! so the name is never free between the two, whatever the timing of
//! our sweeps — a restart racing a sweep, made certain.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::BytesMut;
use weft::{EpType, Error, WaitMode};
use weft_integration::child::START_LIMIT;
use weft_integration::{enabled_endpoint, next_cq, payload, within, within_for, Harness, Provider};
use weft_shm::layout::*;
use weft_shm::ring::{Chan, RecHead};
use weft_shm::segment::Segment;

mod shm_common;
mod shm_restart_common;

use shm_common::fifo::{without_waiting_on, Fifo};
use shm_restart_common::{fresh_name, unlink, Child, KEY};

/// How long a dead peer's waiting operations may take to fail: no
/// speed is asserted (it is `SWEEP_EVERY`, 100 ms, when the machine is
/// idle), only that they fail, on a loaded machine too.
const FAILS_WITHIN: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_killed_and_restarted_under_its_name_fails_what_waited() {
    let p = Provider::named("shm");
    let h = Harness::with_info(&p, p.rma_info(EpType::Rdm));
    let av = h.av();
    let (a, acq) = enabled_endpoint(&h.domain, &h.info, &av, WaitMode::Interrupt);
    let name = fresh_name();
    let mut old = Child::start(&["named", &name, "7"]);
    let addr = old.line(START_LIMIT, "the old target's address").await;
    assert_eq!(addr, format!("fi_shm://{name}"));
    let to = av
        .insert_sync(&[addr.clone().into_bytes()], Default::default())
        .unwrap()
        .fi_addrs[0];
    let first = within("the first read", a.read(to, BytesMut::zeroed(8), 0, KEY))
        .await
        .unwrap();
    assert_eq!(first.into_bytes()[..], payload(4096, 7)[..8]);

    // Stopped, it answers nothing and consumes nothing: a ring read, a
    // large one (direct where CMA is permitted) and a delivery-complete
    // send wait.
    shm_common::stop(old.pid()).await;
    a.post_read(to, BytesMut::zeroed(8), 8, KEY, 1).unwrap();
    a.post_read(to, BytesMut::zeroed(4096), 0, KEY, 2).unwrap();
    let dc = weft::SendMsg {
        dest: to,
        iov: vec![payload(64, 3)],
        tag: None,
        data: None,
        context: 3,
    };
    a.post_sendmsg(dc, weft::OpFlags::DELIVERY_COMPLETE)
        .unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), next_cq(&acq))
            .await
            .is_err(),
        "a read completed while the target is stopped"
    );
    // A new process takes the name, then the old one dies.
    unlink(&name);
    let mut new = Child::start(&["named", &name, "9"]);
    let again = new.line(START_LIMIT, "the new target's address").await;
    assert_eq!(again, addr);
    old.kill9();
    let mut failed = Vec::new();
    for _ in 0..3 {
        let e = within_for(FAILS_WITHIN, "a waiting operation to end", next_cq(&acq))
            .await
            .expect_err("an operation waiting for a dead target failed");
        failed.push((e.context, e.err));
    }
    failed.sort_by_key(|f| f.0);
    assert_eq!(
        failed,
        [
            (1, Error::ConnReset),
            (2, Error::ConnReset),
            (3, Error::ConnReset)
        ]
    );
    assert_eq!(a.stats().unwrap().peers, 0, "the dead one's record went");
    // The name now resolves to the new process.
    let r = within(
        "a read of the new target",
        a.read(to, BytesMut::zeroed(4096), 0, KEY),
    )
    .await
    .unwrap();
    assert_eq!(r.into_bytes()[..], payload(4096, 9)[..]);
    let s = within("a send to the new target", a.send(to, payload(64, 1))).await;
    assert!(s.is_ok(), "{:?}", s.err().map(|e| e.err));
    assert_eq!(a.stats().unwrap().peers, 1);
    new.kill9();
}

/// Before, the new initiator got no answer. Its request comes at once,
/// mostly before our sweep saw the old one die — but not always: here
/// either path may answer it. `shm_restart_nosweep.rs` runs it with no
/// periodic sweep, so that only the look at the claim can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_initiator_killed_and_restarted_under_its_name_gets_its_answers() {
    shm_restart_common::restarted_initiator_is_answered(true).await;
}

/// Writes record `h` with `payload` at `tail` of `c` and publishes it;
/// returns the new tail.
fn put(seg: &Segment, c: &Chan, tail: u64, h: &RecHead, payload: &[u8]) -> u64 {
    let (at, next) = c.write_head(seg, tail, h);
    seg.write(at, payload);
    c.publish(seg, tail, h.word);
    next
}

/// Claims the first free channel of `a`'s segment under `name` as the
/// instance `inst`, its records `recs` already in the ring when the claim
/// shows: `a` reads them in the pass that sees it, before any sweep could
/// free the channel of a claimer that does not run.
fn claim_with(
    a: &weft::Endpoint,
    name: &[u8],
    inst: weft_shm::live::Instance,
    recs: &[(RecHead, &[u8])],
) -> (Segment, Chan) {
    use Ordering::Release;
    let g = Geometry::OURS;
    let seg = shm_common::segment_of(a);
    let (c, gen) = (0..g.channels)
        .map(|i| Chan { g, i })
        .find_map(|c| Some((c, c.begin_claim(&seg, inst.0)?)))
        .expect("a free channel in our segment");
    seg.store32(c.ctl(C_PID), inst.0, Release);
    seg.store64(c.ctl(C_START), inst.1, Release);
    seg.store64(c.ctl(C_SERIAL), inst.2, Release);
    seg.store32(c.ctl(C_NAME_LEN), name.len() as u32, Release);
    seg.write(c.ctl(C_NAME), name);
    seg.store64(c.ctl(C_CMA_PROBE), 0, Release);
    c.clear_start(&seg);
    let mut tail = 0;
    for (h, payload) in recs {
        tail = put(&seg, &c, tail, h, payload);
    }
    assert!(c.move_state(&seg, gen, claiming(inst.0), ACTIVE));
    (seg, c)
}

/// An answer on a channel claimed under a name we keep no record for,
/// by an instance gone from that name — another instance of it than the
/// one holding it now (the one before), or a process that no longer
/// runs, its segment gone — is dropped, and the message queued behind it
/// on that channel is delivered; before, the answer broke the rules, its
/// channel was freed as broken and the message lost. From the instance
/// holding the name, whom we never sent anything, it still breaks them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_from_an_instance_gone_from_its_name_is_dropped() {
    let p = Provider::named("shm");
    let h = Harness::with_info(&p, p.rma_info(EpType::Rdm));
    let (a, acq) = enabled_endpoint(&h.domain, &h.info, &h.av(), WaitMode::Interrupt);
    // An endpoint holding a name `a` never sends to.
    let (held, _c, _ccq) = under_a_fresh_name(&h);
    let now = shm_common::instance_of(&held);
    let name = held.trim_start_matches("fi_shm://").as_bytes();
    // Above any pid the kernel gives (`pid_max` is at most 2^22).
    let dead = ((1 << 22) + 1, 1, 1);
    let (answer, message) = answer_and_message();
    let gone: [(&[u8], weft_shm::live::Instance); 2] = [
        (name, (now.0, now.1, now.2.wrapping_add(1))),
        (b"rs-gone-for-good", dead),
    ];
    for (ctx, (from, inst)) in gone.into_iter().enumerate() {
        a.post_recv(BytesMut::zeroed(8), ctx as u64).unwrap();
        claim_with(&a, from, inst, &[(answer, b""), (message, b"behind!!")]);
        let got = the_message_behind(&a, &acq, "the message behind the answer").await;
        assert_eq!(got, ctx as u64);
    }
    // The holder of the name answering what we never asked.
    claim_with(&a, name, now, &[(answer, b"")]);
    within("the holder's answer breaking its channel", async {
        while a.stats().unwrap().rx_malformed != 1 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
}

/// An endpoint that closed while its process runs on — the common case —
/// with answers it had queued on its channel into our segment: they are
/// dropped, and the message queued behind them is delivered, the channel
/// not broken. Its record in our endpoint (none here) went at its close;
/// its file is unlinked, so the name's segment names nobody. Before,
/// the pid and start time said the closer still ran (they ignore the
/// serial), the answer broke the rules, and the message was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_of_an_endpoint_closed_in_a_running_process_are_dropped() {
    let p = Provider::named("shm");
    let h = Harness::with_info(&p, p.rma_info(EpType::Rdm));
    let (a, acq) = enabled_endpoint(&h.domain, &h.info, &h.av(), WaitMode::Interrupt);
    let (closed, c, _ccq) = under_a_fresh_name(&h);
    let inst = shm_common::instance_of(&closed);
    c.close().unwrap();
    assert_eq!(weft_shm::live::me(), (inst.0, inst.1), "its process runs");
    let (answer, message) = answer_and_message();
    a.post_recv(BytesMut::zeroed(8), 1).unwrap();
    let name = closed.trim_start_matches("fi_shm://").as_bytes();
    let (seg, ch) = claim_with(
        &a,
        name,
        inst,
        &[(answer, b""), (answer, b""), (message, b"behind!!")],
    );
    the_message_behind(&a, &acq, "the message behind the answers").await;
    assert_eq!(
        ch.state(&seg),
        Some(ACTIVE),
        "the channel is not freed as broken"
    );
}

/// A segment file under a name with no valid header — which no creator
/// of this version leaves there (it links its file under the name
/// whole): an older version's creator between its create and its
/// header, or a damaged file — is taken over at once by an endpoint
/// opening under the name, whatever its age, unless somebody holds its
/// lock (that older creator, which locked its file before writing its
/// header): then `FI_EADDRINUSE`, and the file stays. Before, a file
/// without a header younger than a minute (by its mtime) was never
/// taken, so a creator killed between its create and its header kept
/// its name from restarts for that long, and one older was taken even
/// if its creator still ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_headerless_segment_is_taken_over_at_once_unless_held() {
    /// The header-less file goes whatever the test's outcome (no sweep
    /// of this build removes it), under either of its names: only while
    /// it is the file there (device and inode), not the endpoint's file
    /// that took the name over.
    struct Planted([String; 2], (u64, u64));
    fn id(p: &str) -> Option<(u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        std::fs::symlink_metadata(p)
            .ok()
            .map(|m| (m.dev(), m.ino()))
    }
    impl Drop for Planted {
        fn drop(&mut self) {
            for p in &self.0 {
                if id(p) == Some(self.1) {
                    let _ = std::fs::remove_file(p);
                }
            }
        }
    }
    let p = Provider::named("shm");
    let h = Harness::with_info(&p, p.rma_info(EpType::Rdm));
    let name = fresh_name();
    let path = format!("/dev/shm/weft-shm.{name}");
    // Locked before it takes the name: the sweep of another test
    // binary of an older build (before issue #21's, which leaves a
    // header-less file to a take-over) would otherwise remove it at once.
    let made = format!("/dev/shm/weft-restart-test-{name}");
    std::fs::write(&made, vec![0u8; 4096]).unwrap();
    let _planted = Planted([made.clone(), path.clone()], id(&made).unwrap());
    let creator = std::fs::File::open(&made).unwrap();
    rustix::fs::flock(&creator, rustix::fs::FlockOperation::NonBlockingLockShared).unwrap();
    std::fs::rename(&made, &path).unwrap();
    let addr = format!("fi_shm://{name}");
    let info = info_under(&h, &addr);
    let ep = h.domain.endpoint(&info).unwrap();
    ep.bind_av(&h.av()).unwrap();
    ep.bind_cq(&h.cq(), weft::BindFlags::TRANSMIT | weft::BindFlags::RECV)
        .unwrap();
    assert_eq!(ep.enable().unwrap_err(), Error::AddrInUse);
    assert!(std::path::Path::new(&path).exists(), "the held file stays");
    assert!(
        private_files(&name).is_empty(),
        "the loser's private file went"
    );
    drop(creator);
    let (taken, _tcq) = enabled_endpoint(&h.domain, &info, &h.av(), WaitMode::Interrupt);
    assert_eq!(taken.local_addr().unwrap(), addr.as_bytes());
    assert_eq!(
        shm_common::instance_of(&addr).0,
        std::process::id(),
        "ours now"
    );
}

/// The private files of segments being made (`weft-shmtmp.<name>.*`)
/// never keep an endpoint from opening under the name. One left behind
/// by a creator that died (made by hand here, unlocked) is removed by
/// the sweep at once, whatever its age; one whose lock is held (a
/// creator still making it) stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_files_go_only_when_unlocked_and_never_block() {
    let p = Provider::named("shm");
    let h = Harness::with_info(&p, p.rma_info(EpType::Rdm));
    let name = fresh_name();
    let private = |tag: &str| format!("/dev/shm/{}{name}.{tag}", weft_shm::name::TMP_PREFIX);
    let (dead, making) = (private("dead"), private("making"));
    std::fs::write(&dead, vec![0u8; 4096]).unwrap();
    // Locked before it takes its private name, as a creator's is but
    // for an instant: the sweep must not find it unlocked.
    let made = format!("/dev/shm/weft-restart-test-{name}");
    std::fs::write(&made, vec![0u8; 4096]).unwrap();
    let creator = std::fs::File::open(&made).unwrap();
    rustix::fs::flock(&creator, rustix::fs::FlockOperation::NonBlockingLockShared).unwrap();
    std::fs::rename(&made, &making).unwrap();
    let addr = format!("fi_shm://{name}");
    let info = info_under(&h, &addr);
    let (ep, _cq) = enabled_endpoint(&h.domain, &info, &h.av(), WaitMode::Interrupt);
    assert_eq!(ep.local_addr().unwrap(), addr.as_bytes());
    weft_shm::live::reclaim_stale();
    assert!(
        !std::path::Path::new(&dead).exists(),
        "an unlocked one goes"
    );
    assert!(std::path::Path::new(&making).exists(), "a locked one stays");
    assert!(
        std::path::Path::new(&format!("/dev/shm/weft-shm.{name}")).exists(),
        "the endpoint's segment stays"
    );
    drop(creator);
    weft_shm::live::reclaim_stale();
    assert!(private_files(&name).is_empty());
    ep.close().unwrap();
}

/// Two endpoints opening under one name at once: exactly one gets it,
/// the other `FI_EADDRINUSE`, and neither leaves a file behind once the
/// winner closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_concurrent_opens_under_one_name_one_wins() {
    let p = Provider::named("shm");
    let h = Harness::with_info(&p, p.rma_info(EpType::Rdm));
    for _ in 0..10 {
        let name = fresh_name();
        let info = info_under(&h, &format!("fi_shm://{name}"));
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
        let mut opens = Vec::new();
        for _ in 0..2 {
            let ep = h.domain.endpoint(&info).unwrap();
            let cq = h.cq();
            ep.bind_av(&h.av()).unwrap();
            ep.bind_cq(&cq, weft::BindFlags::TRANSMIT | weft::BindFlags::RECV)
                .unwrap();
            let b = barrier.clone();
            opens.push(tokio::task::spawn_blocking(move || {
                b.wait();
                let r = ep.enable();
                (ep, cq, r)
            }));
        }
        let mut won = Vec::new();
        let mut lost = Vec::new();
        for o in opens {
            let (ep, cq, r) = o.await.unwrap();
            match r {
                Ok(()) => won.push((ep, cq)),
                Err(e) => lost.push(e),
            }
        }
        assert_eq!(won.len(), 1, "one winner");
        assert_eq!(lost, [Error::AddrInUse]);
        assert!(private_files(&name).is_empty());
        for (ep, _) in won {
            ep.close().unwrap();
        }
        for f in ["weft-shm.", "weft-shmbell."] {
            assert!(
                !std::path::Path::new(&format!("/dev/shm/{f}{name}")).exists(),
                "{f}{name} left behind"
            );
        }
    }
}

/// A FIFO planted under a creator's private name or under a segment's
/// name (`weft-shmtmp.<name>.*`, `weft-shm.<name>`), by hand or by
/// another process of the user, hangs neither a sweep, nor an AV
/// insert's look, nor an endpoint's open: each opened the file for
/// reading without `O_NONBLOCK`, which waits for a writer. It is none of
/// ours and stays: under the segment's name it keeps the name
/// (`FI_EADDRINUSE`); under a private name it keeps nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planted_fifo_hangs_no_sweep_nor_open() {
    let p = Provider::named("shm");
    let h = Harness::with_info(&p, p.rma_info(EpType::Rdm));
    let name = fresh_name();
    let addr = format!("fi_shm://{name}");
    let seg = format!("/dev/shm/weft-shm.{name}");
    let private = format!("/dev/shm/{}{name}.planted", weft_shm::name::TMP_PREFIX);
    let seg_fifo = Fifo::make(&seg);
    let private_fifo = Fifo::make(&private);
    let info = info_under(&h, &addr);
    without_waiting_on(&[&seg_fifo, &private_fifo], || {
        weft_shm::live::reclaim_stale();
        assert_eq!(
            h.av()
                .insert_sync(&[addr.clone().into_bytes()], Default::default())
                .unwrap_err(),
            Error::Again
        );
        let ep = h.domain.endpoint(&info).unwrap();
        ep.bind_av(&h.av()).unwrap();
        ep.bind_cq(&h.cq(), weft::BindFlags::TRANSMIT | weft::BindFlags::RECV)
            .unwrap();
        assert_eq!(ep.enable().unwrap_err(), Error::AddrInUse);
        assert!(std::fs::symlink_metadata(&seg).is_ok(), "left there");
        seg_fifo.remove();
        assert!(std::fs::symlink_metadata(&seg).is_err());
        let (ep, _cq) = enabled_endpoint(&h.domain, &info, &h.av(), WaitMode::Interrupt);
        assert_eq!(ep.local_addr().unwrap(), addr.as_bytes());
        weft_shm::live::reclaim_stale();
        ep.close().unwrap();
    });
    assert_eq!(
        private_files(&name),
        [format!("{}{name}.planted", weft_shm::name::TMP_PREFIX)]
    );
    drop(private_fifo);
    assert!(private_files(&name).is_empty());
}

/// A peer gone, and under its segment's name a FIFO or a directory (by
/// hand, or by another process of the user): a send to it fails
/// `FI_ECONNREFUSED` at once, as to no endpoint, without waiting on the
/// FIFO. Before, the FIFO failed it `FI_EINVAL` and the directory with
/// an I/O error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_to_a_name_whose_file_is_no_segment_is_refused() {
    /// The directory goes whatever the test's outcome.
    struct Dir(String);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir(&self.0);
        }
    }
    let p = Provider::named("shm");
    let h = Harness::new(&p, EpType::Rdm);
    for fifo in [true, false] {
        let a = h.rdm_ep();
        let b = h.rdm_ep();
        let to = a.insert(&b);
        let b_addr = b.addr();
        let name = weft_shm::name::parse(&b_addr).unwrap();
        let seg = format!(
            "{}{}",
            weft_shm::name::SHM_DIR,
            weft_shm::name::seg_name(name)
        );
        b.ep.close().unwrap();
        assert!(std::fs::symlink_metadata(&seg).is_err(), "closed: gone");
        let send = || {
            tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current()
                    .block_on(within("a send to no segment", a.ep.send(to, payload(8, 0))))
            })
        };
        let e = if fifo {
            let f = Fifo::make(&seg);
            let mut r = None;
            without_waiting_on(&[&f], || r = Some(send()));
            r.unwrap().unwrap_err()
        } else {
            std::fs::create_dir(&seg).unwrap();
            let _dir = Dir(seg.clone());
            send().unwrap_err()
        };
        assert_eq!(e.err, Error::ConnRefused, "a FIFO: {fifo}");
        a.ep.close().unwrap();
    }
}

/// The private files of `name`'s segments being made.
fn private_files(name: &str) -> Vec<String> {
    let prefix = format!("{}{name}.", weft_shm::name::TMP_PREFIX);
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|f| f.starts_with(&prefix))
        .collect()
}

/// An initiator whose name a new instance took while the old one still
/// runs (the old one's file unlinked by hand, both in this process): at
/// the new one's claim, the old one looks alive, so our record for the
/// name still maps it when its request comes. The answer to the new one
/// renews the record (`enqueue_renewed`) — the new one holds the name,
/// so the old one certainly left it — instead of being dropped, which
/// left the new one's read waiting forever; and the old one's clean-up
/// there does not remove the new one's segment (same pid and start, its
/// own serial).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_to_a_new_instance_renews_a_record_of_a_live_old_one() {
    let p = Provider::named("shm");
    let h = Harness::with_info(&p, p.rma_info(EpType::Rdm));
    let (b, _bcq) = enabled_endpoint(&h.domain, &h.info, &h.av(), WaitMode::Interrupt);
    let rw = weft::MrAccess::REMOTE_READ | weft::MrAccess::REMOTE_WRITE;
    let mr = h
        .domain
        .mr_regattr(weft::MrAttr::alloc(4096, rw).requested_key(KEY))
        .map_err(|r| r.error)
        .unwrap();
    mr.write_at(0, &payload(4096, 4)).unwrap();
    let baddr = b.local_addr().unwrap();
    let name = fresh_name();
    let addr = format!("fi_shm://{name}");
    let info = info_under(&h, &addr);
    let old_av = h.av();
    let (old, _ocq) = enabled_endpoint(&h.domain, &info, &old_av, WaitMode::Interrupt);
    reads_b(&old, &old_av, &baddr, "the old instance's read").await;
    assert_eq!(b.stats().unwrap().peers, 1, "we answered it");
    let old_inst = shm_common::instance_of(&addr);

    unlink(&name);
    let new_av = h.av();
    let (new, _ncq) = enabled_endpoint(&h.domain, &info, &new_av, WaitMode::Interrupt);
    let new_inst = shm_common::instance_of(&addr);
    assert_ne!(new_inst, old_inst);
    assert_eq!((new_inst.0, new_inst.1), (old_inst.0, old_inst.1));
    reads_b(&new, &new_av, &baddr, "the new instance's read").await;
    assert_eq!(b.stats().unwrap().peers, 1, "one record, renewed");
    assert!(
        std::path::Path::new(&format!("/dev/shm/weft-shm.{name}")).exists(),
        "the new instance's segment stays"
    );
    assert_eq!(shm_common::instance_of(&addr), new_inst);
    // The new one first: the old one's close unlinks whatever file is
    // under the name.
    new.close().unwrap();
    old.close().unwrap();
}

/// `ep` inserts `b` into `av` and reads the first 8 bytes of its region
/// (`payload(4096, 4)` under `KEY`).
async fn reads_b(ep: &weft::Endpoint, av: &weft::AddressVector, b: &[u8], what: &str) {
    let to = av
        .insert_sync(&[b.to_vec()], Default::default())
        .unwrap()
        .fi_addrs[0];
    let got = within(what, ep.read(to, BytesMut::zeroed(8), 0, KEY))
        .await
        .unwrap();
    assert_eq!(got.into_bytes()[..], payload(4096, 4)[..8]);
}

/// `h`'s info with the endpoint address `addr`.
fn info_under(h: &Harness, addr: &str) -> weft::Info {
    let mut info = h.info.clone();
    info.src_addr = Some(addr.as_bytes().to_vec());
    info
}

/// An enabled endpoint of `h` under a name no other test uses: its
/// address, the endpoint and its CQ.
fn under_a_fresh_name(h: &Harness) -> (String, weft::Endpoint, weft::CompletionQueue) {
    let addr = format!("fi_shm://{}", fresh_name());
    let (ep, cq) = enabled_endpoint(
        &h.domain,
        &info_under(h, &addr),
        &h.av(),
        WaitMode::Interrupt,
    );
    (addr, ep, cq)
}

/// An answer record (no payload) and the head of an 8-byte message.
fn answer_and_message() -> (RecHead, RecHead) {
    let answer = RecHead {
        word: K_RESP | F_LAST,
        ..RecHead::default()
    };
    let message = RecHead {
        word: K_FIRST | F_LAST,
        len: 8,
        total: 8,
        ..RecHead::default()
    };
    (answer, message)
}

/// The message `behind!!` queued behind dropped answers reaches `a`'s
/// posted receive, nothing counted malformed; its receive's context.
async fn the_message_behind(a: &weft::Endpoint, acq: &weft::CompletionQueue, what: &str) -> u64 {
    let got = within(what, next_cq(acq))
        .await
        .unwrap_or_else(|e| panic!("the receive failed: {:?}", e.err));
    let bytes: Vec<u8> = got.bufs.iter().flat_map(|b| b.iter().copied()).collect();
    assert_eq!(bytes, b"behind!!");
    assert_eq!(a.stats().unwrap().rx_malformed, 0);
    got.context
}
