//! What the shm tests share: a channel claimed by hand, as a hostile
//! process of the same user could claim it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use weft_integration::{enabled_endpoint, within, Harness, TIMEOUT};
use weft_shm::layout::*;
use weft_shm::ring::Chan;
use weft_shm::segment::Segment;

// One source for weft-shm's unit tests and these: its test module is
// out of reach of another crate, so it is compiled here by path.
#[path = "../../../crates/weft-shm/src/test_fifo.rs"]
pub mod fifo;

/// Claims channel `i` of `b`'s segment as a hostile process of the same
/// user could (this test), with this process's real probe word when
/// `probe`, and waits for the owner's look at it.
pub fn hostile_claim(b: &weft::Endpoint, i: usize, probe: bool) -> (Segment, Chan) {
    claim_as(b, i, b"hostile", probe)
}

/// As [`hostile_claim`], under the sender name `name` (another
/// endpoint's, as a process of the same user could forge it).
pub fn claim_as(b: &weft::Endpoint, i: usize, name: &[u8], probe: bool) -> (Segment, Chan) {
    let me = weft_shm::live::me();
    // Serial 0: no endpoint's.
    claim_as_instance(b, i, name, probe, (me.0, me.1, 0))
}

/// As [`claim_as`], naming the claimer instance `inst` (pid, start time,
/// endpoint serial: `C_PID`, `C_START`, `C_SERIAL`) — another process's,
/// as a process of the same user could forge it.
pub fn claim_as_instance(
    b: &weft::Endpoint,
    i: usize,
    name: &[u8],
    probe: bool,
    inst: weft_shm::live::Instance,
) -> (Segment, Chan) {
    claim_in(segment_of(b), i, name, probe, inst)
}

/// As [`claim_as_instance`], in the segment `seg` (any endpoint's, this
/// process's or another's).
pub fn claim_in(
    seg: Segment,
    i: usize,
    name: &[u8],
    probe: bool,
    inst: weft_shm::live::Instance,
) -> (Segment, Chan) {
    let g = Geometry::OURS;
    let c = Chan { g, i };
    let me = inst;
    use Ordering::Release;
    let gen = c.begin_claim(&seg, me.0).expect("a free channel");
    seg.store32(c.ctl(C_PID), me.0, Release);
    seg.store64(c.ctl(C_START), me.1, Release);
    seg.store64(c.ctl(C_SERIAL), me.2, Release);
    seg.store32(c.ctl(C_NAME_LEN), name.len() as u32, Release);
    seg.write(c.ctl(C_NAME), name);
    c.clear_start(&seg);
    let addr = if probe {
        weft_shm::cma::probe_addr()
    } else {
        0
    };
    seg.store64(c.ctl(C_CMA_PROBE), addr, Release);
    assert!(c.move_state(&seg, gen, claiming(me.0), ACTIVE));
    let want = if probe { CMA_OK } else { CMA_NO };
    let start = Instant::now();
    while seg.load32(c.ctl(C_CMA), Ordering::Acquire) != Some(want) {
        assert!(start.elapsed() < TIMEOUT, "the owner never looked");
        std::thread::sleep(Duration::from_millis(2));
    }
    (seg, c)
}

/// `a`'s channel in `b`'s segment (the only one claimed): its word `off`.
pub fn chan_word(b: &weft::Endpoint, off: usize) -> Option<u32> {
    let g = Geometry::OURS;
    let seg = segment_of(b);
    (0..g.channels)
        .map(|i| Chan { g, i })
        .find(|c| c.state(&seg) == Some(ACTIVE))
        .and_then(|c| seg.load32(c.ctl(off), Ordering::Acquire))
}

/// The endpoint instance that owns the segment of `addr`
/// (`fi_shm://<name>`), as its header says.
pub fn instance_of(addr: &str) -> weft_shm::live::Instance {
    let seg = segment_named(addr);
    let pid = seg.load32(H_PID, Ordering::Acquire).unwrap();
    let start = seg.load64(H_START, Ordering::Acquire).unwrap();
    (pid, start, seg.load64(H_SERIAL, Ordering::Acquire).unwrap())
}

/// The segment of the endpoint at `addr` (`fi_shm://<name>`).
pub fn segment_named(addr: &str) -> Segment {
    let seg_name = weft_shm::name::seg_name(addr.trim_start_matches("fi_shm://"));
    let g = Geometry::OURS;
    Segment::open(&seg_name, g.bytes(), g.bytes()).unwrap()
}

/// `b`'s segment, mapped by its name as any process of the same user
/// could map it.
pub fn segment_of(b: &weft::Endpoint) -> Segment {
    let name = String::from_utf8(b.local_addr().unwrap()).unwrap();
    let seg_name = weft_shm::name::seg_name(name.trim_start_matches("fi_shm://"));
    let g = Geometry::OURS;
    Segment::open(&seg_name, g.bytes(), g.bytes()).unwrap()
}

/// Whether CMA is denied in this process, said on stderr with what that
/// means for the test (`then`): nothing goes by CMA whatever the wait
/// modes.
pub fn cma_denied(then: &str) -> bool {
    let denied = weft_shm::cma::mode() == weft_shm::cma::Mode::Denied;
    if denied {
        eprintln!("CMA denied here: {then}");
    }
    denied
}

/// Stops process `pid` (SIGSTOP) and waits until every thread of it is
/// stopped: kill(2) returns before they all are, and one still running
/// could answer what the test expects to wait.
pub async fn stop(pid: u32) {
    let pid = pid.to_string();
    let stopped = std::process::Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap();
    assert!(stopped.success());
    within("the target stops", async {
        while !all_stopped(&pid) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
}

/// Lets process `pid`, stopped by [`stop`], run again (SIGCONT).
pub fn resume(pid: u32) {
    let resumed = std::process::Command::new("kill")
        .args(["-CONT", &pid.to_string()])
        .status()
        .unwrap();
    assert!(resumed.success());
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

/// Two endpoints of `h`'s domain made with `info` in wait mode `mode`,
/// each in the other's AV: `a`, its CQ, `b`, its CQ, and `b`'s handle in
/// `a`'s AV.
pub fn two(
    h: &Harness,
    info: &weft::Info,
    mode: weft::WaitMode,
) -> (
    weft::Endpoint,
    weft::CompletionQueue,
    weft::Endpoint,
    weft::CompletionQueue,
    weft::FiAddr,
) {
    let (aav, bav) = (h.av(), h.av());
    let (a, acq) = enabled_endpoint(&h.domain, info, &aav, mode);
    let (b, bcq) = enabled_endpoint(&h.domain, info, &bav, mode);
    let b_in_a = aav
        .insert_sync(&[b.local_addr().unwrap()], Default::default())
        .unwrap()
        .fi_addrs[0];
    bav.insert_sync(&[a.local_addr().unwrap()], Default::default())
        .unwrap();
    (a, acq, b, bcq, b_in_a)
}
