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

use std::fs::File;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use bytes::BytesMut;
use smallvec::SmallVec;
use weft_core::addr::{FiAddr, FI_ADDR_NOTAVAIL};
use weft_core::av::shared::lock_synced;
use weft_core::limits::UNEXPECTED_OVERHEAD;
use weft_core::provider::RecvReq;
use weft_core::recv_completion::{fail_recv, RecvCtx as _};
use weft_core::soft_rx::{self, Charge};
use weft_core::soft_srx::SrxEp;
use weft_core::sync::lock;
use weft_core::tagmatch::MsgInfo;
use weft_core::Error;

use crate::endpoint::EpShared;
use crate::layout::*;
use crate::ring::{Chan, Next, Rec};
use crate::rx_done::complete;
pub use crate::rx_done::deliver_held;
use crate::segment::Segment;

/// Records one pass takes from one channel at most, so one busy sender
/// cannot hold a pass (or starve the other channels).
pub const PASS_LIMIT: usize = 64;

/// A message held for a later receive, with its share of the budget.
pub type Held = weft_core::soft_srx::Held<EpShared>;

/// Where a message being received goes.
#[derive(Debug)]
enum Sink {
    /// A posted receive took it at its first record.
    Recv(RecvReq),
    /// No receive yet: buffered, charged.
    Buf(BytesMut, Charge),
    /// An RMA write at the target: into a region, or read past.
    Write(crate::rma::WriteIn),
    /// A read's answer at the initiator.
    Answer(crate::rma::Pending),
    /// An atomic's arrays at the target.
    Atomic(crate::atomic::AtomicIn),
}

/// What a partial RMA transfer of `total` bytes shares with a message:
/// its length (the rest is unused).
fn rma_info(total: usize) -> MsgInfo {
    MsgInfo {
        key: None,
        src: FI_ADDR_NOTAVAIL,
        tagged: false,
        tag: 0,
        len: total,
        data: None,
    }
}

/// A message whose records are still arriving.
#[derive(Debug)]
struct Partial {
    info: MsgInfo,
    sink: Sink,
    /// Bytes of it read so far.
    got: usize,
}

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
    /// The sender's doorbell, for telling it there is room.
    bell: Option<File>,
    /// A claim in progress seen by the last sweep (the claimer's pid).
    claim_seen: Option<u32>,
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
    let count = st.chans.len().min(ep.g.channels).min(64);
    let mut todo = if full {
        u64::MAX.checked_shr(64 - count as u32).unwrap_or(0)
    } else {
        st.live
    };
    let mut n = 0;
    let mut parked = false;
    while todo != 0 {
        let i = todo.trailing_zeros() as usize;
        todo &= todo - 1;
        let Some(lc) = st.chans.get_mut(i) else {
            break;
        };
        n += channel(ep, &Chan { g: ep.g, i }, lc, sweep, &mut parked);
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

/// One channel's share of a pass: its state, then its records. Returns
/// the records consumed; sets `parked` when its next message waits.
fn channel(ep: &EpShared, c: &Chan, lc: &mut RxChan, sweep: bool, parked: &mut bool) -> usize {
    let state = ep.seg.load32(c.ctl(C_STATE), Ordering::Acquire);
    match state {
        Some(ACTIVE) | Some(CLOSED) => {
            let gen = ep.seg.load32(c.ctl(C_GEN), Ordering::Acquire).unwrap_or(0);
            if lc.active != Some(gen) && !activate(ep, c, lc, gen) {
                free(ep, c, lc, true);
                return 0;
            }
            if lc.refused != 0 {
                // Nothing of it is read. Freed when its sender gives
                // it up, or after a whole sweep interval.
                if state == Some(CLOSED) || (sweep && lc.refused > 1) {
                    free(ep, c, lc, false);
                } else if sweep {
                    lc.refused = 2;
                }
                return 0;
            }
            let (k, stop) = drain(ep, c, lc);
            match stop {
                Stop::Corrupt => free(ep, c, lc, true),
                Stop::Parked => *parked = true,
                Stop::Empty if state == Some(CLOSED) => free(ep, c, lc, false),
                Stop::Empty if sweep && !sender_alive(ep, c, lc) => free(ep, c, lc, false),
                _ => {}
            }
            k
        }
        Some(s) if s & CLAIMING != 0 => {
            // A claimer that died before finishing its claim. A claim
            // takes microseconds; its pid is judged only once the same
            // claim has outlasted a whole sweep interval, because a
            // claimer in another pid namespace has a pid that names
            // nobody here, and the lock that would say it runs is on a
            // segment whose name it has not written yet.
            let pid = s & !CLAIMING;
            if sweep {
                if lc.claim_seen == Some(pid) && !crate::live::alive(pid, 0) {
                    free(ep, c, lc, false);
                } else {
                    lc.claim_seen = Some(pid);
                }
            }
            0
        }
        Some(FREE) => {
            if lc.active.is_some() {
                // Freed under us: only a broken sender does that.
                free(ep, c, lc, true);
            }
            0
        }
        _ => {
            free(ep, c, lc, true);
            0
        }
    }
}

/// Whether the process that claimed the channel still runs: by its pid,
/// or, where that pid means nothing here (another pid namespace), by the
/// lock it holds on its own segment, named by the address it claimed
/// with.
fn sender_alive(ep: &EpShared, c: &Chan, lc: &RxChan) -> bool {
    let pid = ep.seg.load32(c.ctl(C_PID), Ordering::Acquire).unwrap_or(0);
    let start = ep
        .seg
        .load64(c.ctl(C_START), Ordering::Acquire)
        .unwrap_or(0);
    if crate::live::alive(pid, start) {
        return true;
    }
    lc.from
        .as_deref()
        .and_then(|a| crate::name::parse(a).ok())
        .is_some_and(|n| crate::live::held(n) == Some(true))
}

/// A sender claimed the channel: reads its name. False when the name is
/// not one.
fn activate(ep: &EpShared, c: &Chan, lc: &mut RxChan, gen: u32) -> bool {
    if lc.active.is_some() || lc.partial.is_some() {
        // A new claim without our freeing the old one: broken sender.
        return false;
    }
    let len = ep
        .seg
        .load32(c.ctl(C_NAME_LEN), Ordering::Acquire)
        .unwrap_or(0) as usize;
    if len > NAME_MAX {
        return false;
    }
    let mut b = [0u8; NAME_MAX];
    if !ep.seg.read(c.ctl(C_NAME), &mut b[..len]) || !crate::name::valid(&b[..len]) {
        return false;
    }
    let Ok(name) = std::str::from_utf8(&b[..len]) else {
        return false;
    };
    let proven = crate::keyproof::judge(&ep.seg, c, &ep.keys, lc.nonce, &ep.name, name, gen);
    let accepted = proven.is_some();
    // Handles are below MAX_AV_AUTH_KEYS (256).
    let key = proven.flatten().and_then(|h| u16::try_from(h).ok());
    let from = crate::name::addr(name);
    // A refused sender's memory is not probed: nothing of it is read.
    let cma_pid = accepted.then(|| cma_probe(ep, c)).flatten();
    let word = if cma_pid.is_some() { CMA_OK } else { CMA_NO };
    ep.seg.store32(c.ctl(C_CMA), word, Ordering::Release);
    *lc = RxChan {
        active: Some(gen),
        head: 0,
        who: Some(crate::keys::ident(&from, key)),
        key,
        from: Some(from.into()),
        src: None,
        partial: None,
        bell: crate::bell::open_remote(name),
        claim_seen: None,
        cma_pid,
        nonce: lc.nonce,
        refused: u8::from(!accepted),
    };
    if !accepted {
        ep.key_refused(&crate::name::addr(name));
    }
    // A sender waiting for the verdict asked to be rung.
    if ep.seg.swap32(c.ctl(C_TX_WAIT), 0) == Some(1) {
        if let Some(b) = &lc.bell {
            crate::bell::ring(b);
        }
    }
    true
}

/// The sender's pid if we can read its memory: its probe word, at the
/// address it announced, holds the magic.
fn cma_probe(ep: &EpShared, c: &Chan) -> Option<u32> {
    if crate::cma::mode() == crate::cma::Mode::Denied {
        return None;
    }
    let pid = ep.seg.load32(c.ctl(C_PID), Ordering::Acquire)?;
    let addr = ep.seg.load64(c.ctl(C_CMA_PROBE), Ordering::Acquire)?;
    (addr != 0 && crate::cma::probe(pid, addr)).then_some(pid)
}

/// Frees a channel for the next sender: a message it had begun fails
/// its receive; `broken` counts it as malformed.
fn free(ep: &EpShared, c: &Chan, lc: &mut RxChan, broken: bool) {
    if let Some(p) = lc.partial.take() {
        match p.sink {
            Sink::Recv(mut req) => {
                ep.report_here(&mut req);
                let placed = p.got.min(req.capacity());
                fail_recv(ep, req, p.info, placed, Error::ConnAborted);
            }
            Sink::Answer(pending) => {
                pending.fail(ep, Error::ConnAborted);
                if let Some(from) = &lc.from {
                    lock(&ep.peers).set_answering(from, false);
                }
            }
            Sink::Buf(..) | Sink::Write(_) | Sink::Atomic(_) => {}
        }
    }
    if broken {
        ep.malformed.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            channel = c.i,
            "shm: channel broke the layout's rules; freed"
        );
    }
    *lc = RxChan::default();
    if ep.keys.keyed() {
        // A fresh nonce for the next claim: an old proof is worth nothing.
        lc.nonce = crate::keyproof::publish_nonce(&ep.seg, c);
    }
    use Ordering::Release;
    ep.seg.store64(c.ctl(C_HEAD), 0, Release);
    ep.seg.store64(c.ctl(C_TAIL), 0, Release);
    ep.seg.store32(c.ctl(C_TX_WAIT), 0, Release);
    ep.seg.store32(c.ctl(C_CMA), CMA_UNKNOWN, Release);
    ep.seg.store32(c.ctl(C_AUTH), AUTH_UNKNOWN, Release);
    ep.seg.store32(c.ctl(C_STATE), FREE, Release);
}

/// The endpoint closes: a shared context's receive that a message
/// arriving here had begun to fill ends (`ConnAborted`), so its credit
/// goes back to the context, which outlives the endpoint. A lone
/// endpoint's operations are discarded with it.
pub fn abandon(ep: &EpShared, st: RxState) {
    if ep.srx.is_none() {
        return;
    }
    for lc in st.chans {
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

/// Reads a channel's records up to the limit.
fn drain(ep: &EpShared, c: &Chan, lc: &mut RxChan) -> (usize, Stop) {
    let mut n = 0;
    let tail = c.tail(&ep.seg);
    let stop = loop {
        if n == PASS_LIMIT {
            break Stop::Limit;
        }
        let r = match c.next_below(&ep.seg, lc.head, tail) {
            Next::Empty => break Stop::Empty,
            Next::Corrupt => break Stop::Corrupt,
            Next::Rec(r) => r,
        };
        match record(ep, lc, &r) {
            Ok(true) => {
                lc.head = r.next;
                n += 1;
            }
            Ok(false) => break Stop::Parked,
            Err(()) => break Stop::Corrupt,
        }
    };
    if n > 0 {
        c.consume(&ep.seg, lc.head);
        // Pairs with the sender's fence between raising `tx_wait` and
        // reading the head again.
        fence(Ordering::SeqCst);
        if ep.seg.load32(c.ctl(C_TX_WAIT), Ordering::Relaxed) == Some(1)
            && ep.seg.swap32(c.ctl(C_TX_WAIT), 0) == Some(1)
        {
            if let Some(b) = &lc.bell {
                crate::bell::ring(b);
            }
        }
    }
    (n, stop)
}

/// The AV handle of the channel's sender, looked up again only after the
/// AV changed.
fn source(ep: &EpShared, lc: &mut RxChan) -> FiAddr {
    let (Some(av), Some(who)) = (&ep.cfg.av, &lc.who) else {
        return FI_ADDR_NOTAVAIL;
    };
    let v = lock_synced(av).version();
    if let Some((cv, h, _)) = lc.src {
        if cv == v {
            return h;
        }
    }
    let h = ep.resolve_src(who);
    let shown = if h == FI_ADDR_NOTAVAIL {
        FI_ADDR_NOTAVAIL
    } else {
        ep.reported_addr(h)
    };
    lc.src = Some((v, h, shown));
    h
}

/// What the matcher knows of a message of `total` bytes whose first
/// (or only) record has header `h`.
fn msg_info(ep: &EpShared, lc: &mut RxChan, h: &crate::ring::RecHead, total: usize) -> MsgInfo {
    let tagged = h.has(F_TAGGED);
    MsgInfo {
        key: lc.key,
        src: source(ep, lc),
        tagged,
        tag: if tagged { h.tag } else { 0 },
        len: total,
        data: h.has(F_DATA).then_some(h.data),
    }
}

/// Copies `n` bytes at segment offset `off` into the receive's buffers at
/// message offset `at`, as far as they reach. True unless the segment
/// refused the range (it cannot: the ring checked it).
fn place(seg: &Segment, req: &mut RecvReq, at: usize, off: usize, n: usize) -> bool {
    place_into(seg, &mut req.bufs, at, off, n)
}

/// Copies `n` bytes at segment offset `off` into `bufs` at offset `at`
/// of their concatenation, as far as they reach. False when the segment
/// refused a range.
pub fn place_into(
    seg: &Segment,
    bufs: &mut [BytesMut],
    mut at: usize,
    mut off: usize,
    mut n: usize,
) -> bool {
    for b in bufs.iter_mut() {
        if n == 0 {
            break;
        }
        if at >= b.len() {
            at -= b.len();
            continue;
        }
        let k = (b.len() - at).min(n);
        if !seg.read(off, &mut b[at..at + k]) {
            return false;
        }
        at = 0;
        off += k;
        n -= k;
    }
    true
}

/// Handles one record. `Ok(false)`: it must wait (budget or receive);
/// `Err`: the sender broke the rules.
fn record(ep: &EpShared, lc: &mut RxChan, r: &Rec) -> Result<bool, ()> {
    let h = &r.head;
    let len = h.len as usize;
    let last = h.has(F_LAST);
    let mut p = match h.kind() {
        K_FIRST => {
            if lc.partial.is_some() {
                return Err(());
            }
            let total = crate::ring::check_first(h, ep.max_msg).ok_or(())?;
            let info = msg_info(ep, lc, h, total);
            let from = lc.who.clone().ok_or(())?;
            let mut m = lock(&ep.side.matcher);
            let (got, ended) = soft_rx::arrival(&mut m, &info);
            let sink = match got {
                Some(req) => Sink::Recv(req),
                None => {
                    let r = hold_first(ep, &mut m, lc, r, info, total, from);
                    drop(m);
                    ended.report(ep);
                    return r;
                }
            };
            drop(m);
            ended.report(ep);
            Partial { info, sink, got: 0 }
        }
        K_CONT => lc.partial.take().ok_or(())?,
        K_CMA => return cma_record(ep, lc, r),
        K_RMA_W | K_RMA_R | K_RESP | K_ATOMIC | K_RMA_WD | K_RMA_RD => {
            return rma_record(ep, lc, r)
        }
        _ => return Err(()),
    };
    let now = crate::ring::check_next(h, p.got, p.info.len).ok_or(())?;
    match &mut p.sink {
        Sink::Recv(req) => {
            if !place(&ep.seg, req, p.got, r.payload, len) {
                return Err(());
            }
        }
        Sink::Buf(b, _) => {
            let at = b.len();
            b.resize(at + len, 0);
            if !ep.seg.read(r.payload, &mut b[at..]) {
                return Err(());
            }
        }
        Sink::Write(w) => {
            if !crate::rma::write_feed(ep, w, p.got, r.payload, len) {
                return Err(());
            }
        }
        Sink::Answer(pending) => {
            if !pending.place(&ep.seg, r.payload, len) {
                return Err(());
            }
        }
        Sink::Atomic(a) => {
            if !crate::atomic::feed(ep, a, r.payload, len) {
                return Err(());
            }
        }
    }
    p.got = now;
    if !last {
        lc.partial = Some(p);
        return Ok(true);
    }
    let (from, who) = (lc.from.clone().ok_or(())?, lc.who.clone().ok_or(())?);
    let known = lc.src.map(|(_, h, shown)| (h, shown));
    finish(ep, p, from, who, known);
    Ok(true)
}

/// The first record of a message no receive takes: held (whole, or
/// begun as a partial message) within the budget. `Ok(false)`: it waits
/// for budget or a receive. Called with the matcher locked, so a receive
/// posted meanwhile cannot miss it.
fn hold_first(
    ep: &EpShared,
    m: &mut crate::endpoint::ShmMatcher,
    lc: &mut RxChan,
    r: &Rec,
    info: MsgInfo,
    total: usize,
    from: Arc<[u8]>,
) -> Result<bool, ()> {
    let len = r.head.len as usize;
    let charge = UNEXPECTED_OVERHEAD.saturating_add(total);
    let Some(c) = Charge::try_new(&ep.side.unexp, charge, ep.side.limit) else {
        return Ok(false);
    };
    let mut b = BytesMut::zeroed(len);
    if !ep.seg.read(r.payload, &mut b) {
        return Err(());
    }
    if r.head.has(F_LAST) {
        let held = Held::new(ep, b, from.clone(), c);
        m.push_unexpected(ep.sender(from), info, held);
        return Ok(true);
    }
    b.reserve(total - len);
    lc.partial = Some(Partial {
        info,
        sink: Sink::Buf(b, c),
        got: len,
    });
    Ok(true)
}

/// Handles a CMA record: the message is read from the sender's memory
/// into the matching receive's buffers, or into a held buffer within the
/// budget. `Ok(false)`: it waits for budget or a receive; `Err`: the
/// sender broke the rules (a CMA record on a channel that did not pass
/// the probe, an announcement that does not check out, or memory that
/// cannot be read as announced).
fn cma_record(ep: &EpShared, lc: &mut RxChan, r: &Rec) -> Result<bool, ()> {
    let h = &r.head;
    if lc.partial.is_some() || !h.has(F_LAST) {
        return Err(());
    }
    let pid = lc.cma_pid.ok_or(())?;
    let total = usize::try_from(h.total).map_err(|_| ())?;
    if total > ep.max_msg {
        return Err(());
    }
    let mut raw = [0u8; crate::cma::announce_len(crate::cma::MAX_RANGES)];
    let n = (h.len as usize).min(raw.len());
    if h.len as usize != n || !ep.seg.read(r.payload, &mut raw[..n]) {
        return Err(());
    }
    let a = crate::cma::Announce::parse(&raw[..n], total).ok_or(())?;
    let info = msg_info(ep, lc, h, total);
    let from = lc.who.clone().ok_or(())?;
    let mut m = lock(&ep.side.matcher);
    let (got, ended) = soft_rx::arrival(&mut m, &info);
    let Some(mut req) = got else {
        let r = hold_cma(ep, &mut m, pid, &a, info, total, from);
        drop(m);
        ended.report(ep);
        if r == Ok(true) {
            ep.direct.fetch_add(1, Ordering::Relaxed);
        }
        return r;
    };
    drop(m);
    ended.report(ep);
    let placed = total.min(req.capacity());
    let got = {
        let mut local: SmallVec<[&mut [u8]; 4]> = req.bufs.iter_mut().map(|b| &mut b[..]).collect();
        crate::cma::pull(pid, &a.ranges, &mut local)
    };
    if got != Ok(placed) {
        // Failed by `free` as a message begun and broken off.
        lc.partial = Some(Partial {
            info,
            sink: Sink::Recv(req),
            got: 0,
        });
        return Err(());
    }
    complete(ep, req, info, placed, &from, None);
    ep.direct.fetch_add(1, Ordering::Relaxed);
    Ok(true)
}

/// A CMA message no receive takes: read into a held buffer within the
/// budget (`Ok(false)`: it waits). Called with the matcher locked.
fn hold_cma(
    ep: &EpShared,
    m: &mut crate::endpoint::ShmMatcher,
    pid: u32,
    a: &crate::cma::Announce,
    info: MsgInfo,
    total: usize,
    from: Arc<[u8]>,
) -> Result<bool, ()> {
    let charge = UNEXPECTED_OVERHEAD.saturating_add(total);
    let Some(c) = Charge::try_new(&ep.side.unexp, charge, ep.side.limit) else {
        return Ok(false);
    };
    let mut b = BytesMut::zeroed(total);
    if crate::cma::pull(pid, &a.ranges, &mut [&mut b[..]]) != Ok(total) {
        return Err(());
    }
    let held = Held::new(ep, b, from.clone(), c);
    m.push_unexpected(ep.sender(from), info, held);
    Ok(true)
}

/// The first record of an RMA request or answer (`rma`): handled now,
/// or begun as a partial transfer whose bytes follow.
fn rma_record(ep: &EpShared, lc: &mut RxChan, r: &Rec) -> Result<bool, ()> {
    let h = &r.head;
    if lc.partial.is_some() {
        return Err(());
    }
    // The rules the fuzz target checks too.
    crate::scan::check_lead(h, ep.max_msg).ok_or(())?;
    let from = lc.from.clone().ok_or(())?;
    let who = lc.who.clone().ok_or(())?;
    match h.kind() {
        K_RMA_W => {
            let (w, total) = crate::rma::write_start(ep, h, r.payload, &who).ok_or(())?;
            if h.has(F_LAST) != (total == 0) {
                return Err(());
            }
            if total == 0 {
                crate::rma::write_end(ep, w, 0, &who);
            } else {
                lc.partial = Some(Partial {
                    info: rma_info(total),
                    sink: Sink::Write(w),
                    got: 0,
                });
            }
        }
        K_ATOMIC => {
            let a = crate::atomic::start(ep, h, r.payload, &who).ok_or(())?;
            let total = usize::try_from(h.total).map_err(|_| ())?;
            if total == 0 {
                crate::atomic::end(ep, a, &who);
            } else {
                lc.partial = Some(Partial {
                    info: rma_info(total),
                    sink: Sink::Atomic(a),
                    got: 0,
                });
            }
        }
        K_RMA_R | K_RMA_RD => {
            // An initiator that does not drain our answers stops being
            // read (its requests wait in its ring), rather than making
            // us hold copies of region bytes without bound.
            if lock(&ep.peers).backlog(&from) > crate::rma::ANSWER_BACKLOG {
                return Ok(false);
            }
            let ok = if h.kind() == K_RMA_R {
                crate::rma::read(ep, h, r.payload, &who)
            } else {
                crate::rma::direct(ep, lc.cma_pid, h, r.payload, &who)
            };
            if !ok {
                return Err(());
            }
        }
        K_RMA_WD => {
            if !crate::rma::direct(ep, lc.cma_pid, h, r.payload, &who) {
                return Err(());
            }
        }
        _ => {
            if let Some(p) = crate::rma::answer_start(ep, h, &from)? {
                lc.partial = Some(Partial {
                    info: rma_info(p.len),
                    sink: Sink::Answer(p),
                    got: 0,
                });
            }
        }
    }
    Ok(true)
}

/// A message whose last record arrived on the channel of the sender at
/// `from`, `who` as messages name it (`keys::ident`).
/// `known`: the channel's sender as an AV handle and the source its
/// completions report, looked up with the message's first record.
fn finish(
    ep: &EpShared,
    p: Partial,
    from: Arc<[u8]>,
    who: Arc<[u8]>,
    known: Option<(FiAddr, FiAddr)>,
) {
    match p.sink {
        Sink::Write(w) => crate::rma::write_end(ep, w, p.info.len, &who),
        Sink::Answer(pending) => {
            pending.complete(ep);
            // A fence waiting for it may go now (the next flush).
            lock(&ep.peers).set_answering(&from, false);
        }
        Sink::Atomic(a) => crate::atomic::end(ep, a, &who),
        Sink::Recv(req) => {
            let placed = p.info.len.min(req.capacity());
            complete(ep, req, p.info, placed, &who, known);
        }
        Sink::Buf(data, charge) => {
            let mut m = lock(&ep.side.matcher);
            // A receive posted while the records arrived takes it now.
            let (got, ended) = soft_rx::arrival(&mut m, &p.info);
            if let Some(mut req) = got {
                drop(m);
                ended.report(ep);
                let placed = weft_core::recv_completion::copy_in(&mut req, &data);
                drop(charge);
                complete(ep, req, p.info, placed, &who, known);
            } else {
                let held = Held::new(ep, data, who.clone(), charge);
                m.push_unexpected(ep.sender(who), p.info, held);
                drop(m);
                ended.report(ep);
            }
        }
    }
}
