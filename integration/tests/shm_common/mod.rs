//! What the shm tests share: a channel claimed by hand, as a hostile
//! process of the same user could claim it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use weft_integration::TIMEOUT;
use weft_shm::layout::*;
use weft_shm::ring::Chan;
use weft_shm::segment::Segment;

/// Claims channel `i` of `b`'s segment as a hostile process of the same
/// user could (this test), with this process's real probe word when
/// `probe`, and waits for the owner's look at it.
pub fn hostile_claim(b: &weft::Endpoint, i: usize, probe: bool) -> (Segment, Chan) {
    let g = Geometry::OURS;
    let seg = segment_of(b);
    let c = Chan { g, i };
    let me = weft_shm::live::me();
    use Ordering::Release;
    assert!(
        seg.cas32(c.ctl(C_STATE), FREE, CLAIMING | me.0),
        "channel {i} free"
    );
    seg.store32(c.ctl(C_PID), me.0, Release);
    seg.store64(c.ctl(C_START), me.1, Release);
    seg.store32(c.ctl(C_NAME_LEN), 7, Release);
    seg.write(c.ctl(C_NAME), b"hostile");
    let gen = seg.load32(c.ctl(C_GEN), Ordering::Acquire).unwrap() + 1;
    seg.store32(c.ctl(C_GEN), gen, Release);
    seg.store64(c.ctl(C_TAIL), 0, Release);
    let addr = if probe {
        weft_shm::cma::probe_addr()
    } else {
        0
    };
    seg.store64(c.ctl(C_CMA_PROBE), addr, Release);
    seg.store32(c.ctl(C_STATE), ACTIVE, Release);
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
        .find(|c| seg.load32(c.ctl(C_STATE), Ordering::Acquire) == Some(ACTIVE))
        .and_then(|c| seg.load32(c.ctl(off), Ordering::Acquire))
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
