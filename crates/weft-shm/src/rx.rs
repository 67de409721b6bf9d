//! The receive side: one pass over the endpoint's channels reads the
//! records senders published, matches each message to a posted receive
//! (placing it straight from the ring into the receive's buffers) or
//! holds it for a later receive within the unexpected budget. A message
//! that neither finds a receive nor fits the budget stays in its ring:
//! the channel waits (its sender's ring fills, and the sender waits), as
//! reliable delivery demands; nothing is dropped.
//!
//! A channel whose sender breaks the layout's rules is freed and counted
//! (`EpStats::rx_malformed`); a message it had begun fails its receive.
//! A channel whose claim does not prove the endpoint's key (`keyproof`)
//! is never read: it is freed once its sender closes it, or after a
//! sweep interval.

mod cma_in;
mod lifecycle;
mod message;
mod rma_in;
#[cfg(test)]
mod tests;

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use weft_core::addr::FiAddr;
use weft_core::recv_completion::fail_recv;
use weft_core::soft_srx::SrxEp;
use weft_core::{Error, Result};

use crate::endpoint::EpShared;
use crate::layout::*;
use crate::ring::{Chan, Next, Rec};
pub use crate::rx_done::deliver_held;
use crate::segment::{Block, Ring, Segment};
use lifecycle::{activate, free, retire, sender_alive};
pub use message::place_into;
use message::{record, Partial, Sink};

/// Records one pass takes from one channel at most, so one busy sender
/// cannot hold a pass (or starve the other channels).
pub const PASS_LIMIT: usize = 64;

/// A message held for a later receive, with its share of the budget.
pub type Held = weft_core::soft_srx::Held<EpShared>;

/// What the receiver knows of one channel.
#[derive(Debug, Default)]
pub struct RxChan {
    /// Seen active with this claim count.
    active: Option<u32>,
    /// Our consumed position (authoritative; the shared word only tells
    /// the sender).
    head: u64,
    /// The sender's address, and its AV handle as of an AV version.
    from: Option<Arc<[u8]>>,
    /// The sender as messages and requests name it (`keys::ident`: its
    /// address and the AV key handle its claim proved).
    who: Option<Arc<[u8]>>,
    /// `FI_AV_AUTH_KEY`: the AV key handle its claim proved.
    key: Option<u16>,
    /// The sender's AV handle and the source its completions report
    /// (`reported_addr`), as of an AV version.
    src: Option<(u64, FiAddr, FiAddr)>,
    partial: Option<Partial>,
    /// A CMA message whose back part its sender was offered, waiting for
    /// that part (`split`); its record stays at our head meanwhile.
    split: Option<cma_in::Split>,
    /// The sender's doorbell, for telling it there is room.
    bell: Option<File>,
    /// A claim in progress seen by the last sweep (its state word: the
    /// claimer's pid and the claim's count).
    claim_seen: Option<u64>,
    /// The instance that claimed the channel (`C_PID`, `C_START`,
    /// `C_SERIAL`): answers on it are taken only for requests sent to
    /// that instance (`Peers::answered`).
    claimer: Option<crate::live::Instance>,
    /// The sender's pid, when its probe showed we can read its memory
    /// (CMA records are accepted only then).
    cma_pid: Option<u32>,
    /// Keyed endpoints: the nonce published for the channel's next claim,
    /// kept here so that nothing written in the segment can replace it.
    nonce: Option<weft_core::wire::claim::Nonce>,
    /// The claim did not prove the key: 1, and 2 once a sweep saw it so.
    refused: u8,
}

/// Every channel's receiver state.
#[derive(Debug)]
pub struct RxState {
    chans: Vec<RxChan>,
    /// Channels with a sender (bit `i`: channel `i`; at most 64).
    live: u64,
}

impl RxState {
    pub fn new(n: usize) -> RxState {
        RxState {
            chans: (0..n).map(|_| RxChan::default()).collect(),
            live: 0,
        }
    }

    /// Channels with an active sender.
    pub fn active(&self) -> usize {
        self.chans
            .iter()
            .filter(|c| c.active.is_some() && c.refused == 0)
            .count()
    }

    /// A keyed endpoint, before its segment is ready: a nonce in every
    /// channel for its first claim.
    pub fn publish_nonces(&mut self, seg: &Segment, g: Geometry) {
        for (i, lc) in self.chans.iter_mut().enumerate() {
            lc.nonce = crate::keyproof::publish_nonce(seg, &Chan { g, i });
        }
    }
}

/// Why a channel's draining stopped.
enum Stop {
    /// Nothing more published.
    Empty,
    /// The next message waits for budget or a receive.
    Parked,
    /// The pass limit.
    Limit,
    /// The sender broke the rules.
    Corrupt,
}

/// One pass over the channels. `sweep`: also free the channels of dead
/// senders; `full`: every channel, else those in use. Returns the
/// records consumed.
pub fn pass(ep: &EpShared, st: &mut RxState, sweep: bool, full: bool) -> usize {
    let full = full || sweep;
    let mut todo = st.live;
    if full {
        let count = st.chans.len().min(ep.g.channels).min(64);
        let all = u64::MAX.checked_shr(64 - count as u32).unwrap_or(0);
        todo |= claimed(ep, all & !st.live);
    }
    let mut n = 0;
    let mut parked = false;
    while todo != 0 {
        let i = todo.trailing_zeros() as usize;
        todo &= todo - 1;
        let Some(lc) = st.chans.get_mut(i) else {
            break;
        };
        let c = Chan { g: ep.g, i };
        // Control words are read through the block, checked once: a
        // channel in use reads and writes five of them a message.
        let b = c.block(&ep.seg);
        let word = b.and_then(|b| b.load64(C_STATE_GEN, Ordering::Acquire));
        // Free, and nothing of ours in it (`claimed` saw it otherwise a
        // moment ago: only a broken sender frees a channel it holds):
        // `channel` would find nothing to do.
        if lc.active.is_none() && word.map(state_of) == Some(FREE) {
            continue;
        }
        n += match (b, word) {
            (Some(b), Some(word)) => channel(ep, &c, b, word, lc, sweep, &mut parked),
            // Outside the mapping, which a checked geometry rules out.
            _ => {
                free(ep, &c, lc, true);
                0
            }
        };
        if lc.active.is_some() {
            st.live |= 1 << i;
        } else {
            st.live &= !(1 << i);
        }
    }
    ep.parked.store(parked, Ordering::Release);
    ep.live.store(st.live, Ordering::Relaxed);
    n
}

/// Of the channels `idle` (none with a sender we know: `RxState::live`
/// is exactly the channels whose `RxChan::active` is set), those whose
/// state is anything but `FREE`: a claim begun or made, or a word no
/// sender should write there. A full pass visits only these besides the
/// live ones: visiting each of the fifteen idle channels of a spinning
/// full pass, to skip it, cost about 26 instructions.
#[inline(always)]
fn claimed(ep: &EpShared, mut idle: u64) -> u64 {
    let mut found = 0;
    while idle != 0 {
        let i = idle.trailing_zeros() as usize;
        idle &= idle - 1;
        let word = ep.seg.load64(ep.g.ctl(i) + C_STATE_GEN, Ordering::Acquire);
        found |= u64::from(word.is_none_or(|w| state_of(w) != FREE)) << i;
    }
    found
}

/// One channel's share of a pass: its state `word` (read from its
/// control block `b` by the pass: the state and the claim count of one
/// load), then its records. Returns the records consumed; sets `parked`
/// when its next message waits.
fn channel(
    ep: &EpShared,
    c: &Chan,
    b: Block<'_, CTL>,
    word: u64,
    lc: &mut RxChan,
    sweep: bool,
    parked: &mut bool,
) -> usize {
    let state = state_of(word);
    match state {
        ACTIVE | CLOSED => {
            let gen = gen_of(word);
            if lc.active != Some(gen) {
                if lc.active.is_some() {
                    // A newer claim than the one we knew, and we never
                    // freed that one: its sender freed the channel under
                    // us (only a broken one does) and another claimed it
                    // between two of our passes. The old claim goes,
                    // counted; the new one is judged as any.
                    retire(ep, c, lc, true);
                }
                if !activate(ep, c, lc, gen) {
                    free(ep, c, lc, true);
                    return 0;
                }
            }
            if lc.refused != 0 {
                // Nothing of it is read. Freed when its sender gives
                // it up, or after a whole sweep interval.
                if state == CLOSED || (sweep && lc.refused > 1) {
                    free(ep, c, lc, false);
                } else if sweep {
                    lc.refused = 2;
                }
                return 0;
            }
            let (k, stop) = drain(ep, c, &b, lc);
            match stop {
                Stop::Corrupt => free(ep, c, lc, true),
                Stop::Parked
                    if sweep
                        && lc.split.as_ref().is_some_and(|s| s.writing(ep))
                        && !sender_alive(ep, c, lc) =>
                {
                    // Gone while its part of a split was taken: it
                    // writes no more, so the buffers go back. (Done or
                    // given back since the drain: the next pass settles
                    // it as any.)
                    if let Some(s) = lc.split.take() {
                        s.fail(ep, Error::ConnReset, true);
                    }
                    free(ep, c, lc, false);
                }
                Stop::Parked => *parked = true,
                Stop::Empty if state == CLOSED => free(ep, c, lc, false),
                Stop::Empty if sweep && !sender_alive(ep, c, lc) => free(ep, c, lc, false),
                _ => {}
            }
            k
        }
        s if s & CLAIMING != 0 => {
            // A claimer that died before finishing its claim. A claim
            // takes microseconds; it is judged only once the same claim
            // (the same word, pid and count) has outlasted a whole sweep
            // interval, and by the channel's claim lock: held, its
            // claimer runs, whatever its pid says here (another pid
            // namespace); not held, it is gone, whoever has its pid now
            // (`claimer_alive`). Freed only if taken from that word: the
            // claimer may finish its claim while we judge.
            let pid = s & !CLAIMING;
            if lc.active.is_some() {
                // A claim begun over one we knew and never freed: as in
                // the `ACTIVE` arm, the old one goes, counted.
                retire(ep, c, lc, true);
            }
            if sweep
                && sweep_claim(&ep.seg, c, &mut lc.claim_seen, word, || {
                    claimer_alive(ep, c, pid)
                })
            {
                free(ep, c, lc, false);
            }
            0
        }
        // Anything else, `FREE` included: the pass skips a free channel
        // with nothing of ours, so this one was freed under us, which
        // only a broken sender does. Freed only if taken from the word
        // seen; a claim made since is left alone, and only what we knew
        // of the old one goes (the next pass judges the new one).
        _ => {
            if c.take(&ep.seg, word) {
                free(ep, c, lc, true);
            } else {
                retire(ep, c, lc, true);
            }
            0
        }
    }
}

/// A sweep's judgement of the claim in progress on `c` it read as
/// `word`: true when the owner took it to free (`Chan::take`) — the same
/// claim, word for word, as the last sweep's (`seen`), and its claimer
/// not `alive`. Otherwise `seen` records the word, so a claim is judged
/// only after a whole sweep interval; a take that fails (the claimer
/// finished its claim while `alive` looked, or the channel moved on to a
/// newer claim) leaves the channel and `seen` as they are: the next pass
/// reads the new word, and a newer claim is judged from its own first
/// sighting.
pub(crate) fn sweep_claim(
    seg: &Segment,
    c: &Chan,
    seen: &mut Option<u64>,
    word: u64,
    alive: impl FnOnce() -> bool,
) -> bool {
    if *seen == Some(word) && !alive() {
        c.take(seg, word)
    } else {
        *seen = Some(word);
        false
    }
}

/// Whether the claimer `pid` of a claim in progress on `c` runs. The
/// claim lock says it ([`claim_held`]) whenever it can be looked at:
/// every claimer of this layout holds it from before its claim's swap
/// until after its last, so a claim whose word has not moved in a sweep
/// interval and whose lock nobody holds is a dead claimer's — whatever
/// its pid names now (another process may have it: a pid look would
/// keep that claim). Only when the look fails is the pid judged — by
/// its start time too when the claimer wrote its pid (right after the
/// claim), since a claimer that died long ago may have left its pid to
/// another process, which by pid alone looks alive. Read only when a
/// sweep judges a claim.
fn claimer_alive(ep: &EpShared, c: &Chan, pid: u32) -> bool {
    judge(claim_held(ep.held.as_fd(), c), || pid_alive(ep, c, pid))
}

/// The owner's judgement of a claimer from the look at its claim lock
/// (`look`) and, only when that look failed, its pid (`pid_alive`,
/// asked then alone): held, it lives; not held, it is dead, whatever its
/// pid says ([`claimer_alive`]).
pub(crate) fn judge(look: Result<bool>, pid_alive: impl FnOnce() -> bool) -> bool {
    match look {
        Ok(held) => held,
        Err(_) => pid_alive(),
    }
}

/// Whether somebody holds the claim lock of channel `c` (`claim_lock`),
/// seen through the owner's own descriptor `fd` of its segment (the
/// owner takes no claim lock, so whoever holds it is another): a claimer
/// holds it from before its claim's swap until after its last, so a
/// claim whose lock is held is a live claimer's, in whatever pid
/// namespace — never voided (a voided live claimer's late writes would
/// land in the next claimer's channel). Not held: the claimer is gone
/// (its lock went with its claim's open file description), or finished
/// its claim (the word then moved, and the owner's take fails). An
/// error when the look fails (not seen once the endpoint's creation
/// probed the locks: `claim_lock::probe`): [`claimer_alive`] then
/// judges by pid.
pub(crate) fn claim_held(fd: BorrowedFd<'_>, c: &Chan) -> Result<bool> {
    crate::claim_lock::held(fd, c.ctl(C_STATE_GEN) as u64)
}

/// The claimer's liveness by its pid (and start time), as
/// [`claimer_alive`] falls back to: a claimer in another pid namespace
/// has a pid that names nobody here.
fn pid_alive(ep: &EpShared, c: &Chan, pid: u32) -> bool {
    let start = if ep.seg.load32(c.ctl(C_PID), Ordering::Acquire) == Some(pid) {
        ep.seg
            .load64(c.ctl(C_START), Ordering::Acquire)
            .unwrap_or(0)
    } else {
        0
    };
    crate::live::alive(pid, start)
}

/// The endpoint closes: a shared context's receive that a message
/// arriving here had begun to fill ends (`ConnAborted`), so its credit
/// goes back to the context, which outlives the endpoint. A lone
/// endpoint's operations are discarded with it.
pub fn abandon(ep: &EpShared, st: RxState) {
    if ep.srx.is_none() {
        return;
    }
    for mut lc in st.chans {
        if let Some(s) = lc.split.take() {
            let safe = !s.writing(ep);
            s.fail(ep, Error::ConnAborted, safe);
        }
        if let Some(Partial {
            info,
            sink: Sink::Recv(mut req),
            got,
        }) = lc.partial
        {
            ep.report_here(&mut req);
            let placed = got.min(req.capacity());
            fail_recv(ep, req, info, placed, Error::ConnAborted);
        }
    }
}

/// Reads a channel's records up to the limit; `b` is its control block.
fn drain(ep: &EpShared, c: &Chan, b: &Block<'_, CTL>, lc: &mut RxChan) -> (usize, Stop) {
    // The ring checked once for the drain (`Chan::area`), as `next` would
    // at each record.
    let Some(ring) = c.area(&ep.seg) else {
        return (0, Stop::Corrupt);
    };
    let (n, stop) = drain_ring(
        c,
        &ring,
        b,
        lc,
        |lc| &mut lc.head,
        |lc, r| record(ep, lc, r),
    );
    if n > 0 {
        b.store64(C_HEAD, lc.head, Ordering::Release);
        // Pairs with the sender's fence between raising `tx_wait` and
        // reading the head again.
        fence(Ordering::SeqCst);
        if b.load32(C_TX_WAIT, Ordering::Relaxed) == Some(1) && b.swap32(C_TX_WAIT, 0) == Some(1) {
            if let Some(b) = &lc.bell {
                crate::bell::ring(b);
            }
        }
    }
    (n, stop)
}

/// [`drain`]'s loop: the records published at `head`, each handed to
/// `on` (true: taken, `head` moves past it; false: parked), up to
/// [`PASS_LIMIT`] records or one ring's worth of bytes. Once a chunk's
/// worth (a quarter of the ring) has been taken since the head was last
/// published, the head is published at once, before the next record is
/// read: a large message's records (a chunk each, but for one cut short
/// by the ring's end or the room, which gives its room back with the
/// next) give their room back one by one, so a spinning sender refills
/// the ring while we copy out the next record. Published only at the
/// drain's end, the two sides took turns — the sender, its ring full,
/// waited for the whole drain — and a 1 MiB ping-pong through the ring
/// took 1.18x as long (`docs/benchmarks.md`, "shm on a new machine, and
/// the ring's room given back record by record"). Records under a 64th
/// of a chunk (about 1 KiB with the 256 KiB ring: a 64 B message's 96)
/// never make a chunk in one drain, so they publish once, at the end, as
/// before. Refilled as it drains, one drain could copy 64 chunks; the
/// ring's worth bounds it as the ring's size did, so that one sender's
/// stream does not hold the other channels back.
///
/// `head` finds the head in `st`, which `on` is handed with each record:
/// the head moves with each record taken, so a handler that unwound
/// leaves it where the published one is or ahead, never behind (the next
/// pass would read again what the sender may have overwritten).
#[inline(always)]
fn drain_ring<S>(
    c: &Chan,
    ring: &Ring<'_>,
    b: &Block<'_, CTL>,
    st: &mut S,
    head: impl Fn(&mut S) -> &mut u64,
    mut on: impl FnMut(&mut S, Rec) -> std::result::Result<bool, ()>,
) -> (usize, Stop) {
    let mut n = 0;
    let start = *head(st);
    let mut given = start;
    let chunk = c.g.chunk() as u64;
    let stop = loop {
        if n == PASS_LIMIT {
            break Stop::Limit;
        }
        // The word at our head says what is published (in band: no tail
        // word to read first).
        let r = match c.next_in(ring, *head(st)) {
            Next::Empty => break Stop::Empty,
            Next::Corrupt => break Stop::Corrupt,
            Next::Rec(r) => r,
        };
        match on(st, r) {
            Ok(true) => {
                *head(st) = r.next;
                n += 1;
                if r.next.wrapping_sub(given) >= chunk {
                    b.store64(C_HEAD, r.next, Ordering::Release);
                    given = r.next;
                    if r.next.wrapping_sub(start) >= c.g.ring as u64 {
                        break Stop::Limit;
                    }
                }
            }
            Ok(false) => break Stop::Parked,
            Err(()) => break Stop::Corrupt,
        }
    };
    (n, stop)
}
