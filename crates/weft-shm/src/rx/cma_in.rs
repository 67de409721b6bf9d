//! CMA records at the receiver: the message read from the sender's
//! memory into the matching receive or a held buffer.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::BytesMut;
use smallvec::SmallVec;
use weft_core::limits::UNEXPECTED_OVERHEAD;
use weft_core::provider::RecvReq;
use weft_core::recv_completion::fail_recv;
use weft_core::soft_rx::{self, Charge};
use weft_core::soft_srx::SrxEp;
use weft_core::sync::lock;
use weft_core::tagmatch::MsgInfo;
use weft_core::Error;

use super::message::{msg_info, Partial, Sink};
use super::{Held, RxChan};
use crate::endpoint::EpShared;
use crate::layout::*;
use crate::ring::Rec;
use crate::rx_done::complete;
use crate::split::{self, Offer, Outcome};

/// Handles a CMA record: the message is read from the sender's memory
/// into the matching receive's buffers, or into a held buffer within the
/// budget. `Ok(false)`: it waits for budget or a receive; `Err`: the
/// sender broke the rules (a CMA record on a channel that did not pass
/// the probe, an announcement that does not check out, or memory that
/// cannot be read as announced).
#[inline(never)]
pub(super) fn cma_record(ep: &EpShared, lc: &mut RxChan, r: &Rec) -> Result<bool, ()> {
    if let Some(s) = lc.split.take() {
        // The head has not moved since the split was parked: this is
        // its record.
        let same = r.next == s.end;
        return settle(ep, lc, s, same);
    }
    let h = &r.head;
    if lc.partial.is_some() || !h.has(F_LAST) {
        return Err(());
    }
    let pid = lc.cma_pid.ok_or(())?;
    let total = usize::try_from(h.total).map_err(|_| ())?;
    if total > ep.max_msg {
        return Err(());
    }
    let mut raw = [0u8; crate::cma::ANNOUNCE_MAX];
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
    if h.has(F_SPLIT) && placed >= split::split_min() && req.multi.is_none() {
        let at = split::cut(placed);
        if let Some(offer) = Offer::of(&req.bufs, at, placed) {
            let s = Split {
                owner: ep.seg_id.map(|f| (ep.serial, f)),
                req: Some(req),
                info,
                placed,
                from,
                end: r.next,
                chan: chan_of(ep, r),
                at,
                pid,
                ranges: a.ranges,
                pool: a.pool,
                front: false,
            };
            return begin(ep, lc, s, &offer);
        }
    }
    let got = {
        let mut local: SmallVec<[&mut [u8]; 4]> = req.bufs.iter_mut().map(|b| &mut b[..]).collect();
        crate::pool_map::pull(pid, a.pool.as_ref(), &a.ranges, &mut local)
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
    if crate::pool_map::pull(pid, a.pool.as_ref(), &a.ranges, &mut [&mut b[..]]) != Ok(total) {
        return Err(());
    }
    let held = Held::new(ep, b, from.clone(), c);
    m.push_unexpected(ep.sender(from), info, held);
    Ok(true)
}

/// A CMA message whose back part its sender was offered (`split`): the
/// receive is held here until that part is written, or copied by us
/// once the sender gave it back (or never took it), or the sender is
/// gone. Dropped unsettled (the endpoint closes), the receive's buffers
/// are leaked, not freed: the sender may still be writing them.
#[derive(Debug)]
pub(crate) struct Split {
    /// Our endpoint as this process vouches for its offers
    /// (`split::vouch`): `None` when our segment's file could not be
    /// looked at (then nothing is vouched, and a sender of this process
    /// leaves its part to us).
    owner: Option<split::Owner>,
    /// `None` once settled.
    req: Option<RecvReq>,
    info: MsgInfo,
    placed: usize,
    from: Arc<[u8]>,
    /// Where the record ends in the ring: the offer's name.
    end: u64,
    /// The channel (its offer block).
    chan: usize,
    /// Where the sender's part begins.
    at: usize,
    pid: u32,
    /// The sender's announcement (what we copy from).
    ranges: SmallVec<[(u64, u64); crate::cma::MAX_RANGES]>,
    /// The sender's shared pool holding them, if it named one.
    pool: Option<crate::pool::PoolRef>,
    /// Our part read whole.
    front: bool,
}

impl Drop for Split {
    fn drop(&mut self) {
        self.settled();
        if let Some(mut req) = self.req.take() {
            std::mem::forget(std::mem::take(&mut req.bufs));
        }
    }
}

impl Split {
    /// The offer stands no more (before the receive ends either way).
    fn settled(&mut self) {
        if let Some(o) = self.owner.take() {
            split::unvouch(o, self.chan, self.end);
        }
    }

    /// The receive ends in error `e`, unsettled. `safe`: the sender
    /// writes no more (it is gone, or its part is done or given back),
    /// so the buffers go back with the error; else they are leaked.
    pub(crate) fn fail(mut self, ep: &EpShared, e: Error, safe: bool) {
        self.settled();
        let Some(mut req) = self.req.take() else {
            return;
        };
        if !safe {
            std::mem::forget(std::mem::take(&mut req.bufs));
        }
        ep.report_here(&mut req);
        fail_recv(ep, req, self.info, 0, e);
    }

    /// Whether the sender may still write: its part taken and not done.
    pub(crate) fn writing(&self, ep: &EpShared) -> bool {
        split::outcome(split::state(&ep.seg, ep.g, self.chan), self.end) == Outcome::Taken
    }
}

/// The channel whose ring holds record `r`: its payload lies in that
/// ring (a CMA record's is never empty), `Chan::area` having checked
/// the ring against the mapping.
fn chan_of(ep: &EpShared, r: &Rec) -> usize {
    r.payload.saturating_sub(ep.g.rings()) / ep.g.ring
}

/// Offers the sender its part, reads ours, then settles.
fn begin(ep: &EpShared, lc: &mut RxChan, mut s: Split, offer: &Offer) -> Result<bool, ()> {
    if let Some(o) = s.owner {
        split::vouch(o, s.chan, s.end, offer);
    }
    split::publish(&ep.seg, ep.g, s.chan, s.end, offer);
    split::await_take(&ep.seg, ep.g, s.chan, s.end);
    let at = s.at;
    s.front = copy(&mut s, 0, at);
    match split::revoke(&ep.seg, ep.g, s.chan, s.end) {
        Ok(()) => own_part(ep, lc, s),
        Err(w) => settle_word(ep, lc, s, w, true),
    }
}

/// A parked split looked at again (`same`: its record is still the one
/// at our head).
fn settle(ep: &EpShared, lc: &mut RxChan, s: Split, same: bool) -> Result<bool, ()> {
    if !same {
        return broken(lc, s);
    }
    let w = split::state(&ep.seg, ep.g, s.chan);
    settle_word(ep, lc, s, w, false)
}

/// Settles the split by the state word `w`; `spin`: a taken part is
/// waited for a while ([`split::SPIN`]) before the channel parks.
fn settle_word(
    ep: &EpShared,
    lc: &mut RxChan,
    s: Split,
    mut w: Option<u64>,
    spin: bool,
) -> Result<bool, ()> {
    let mut until = None;
    loop {
        match split::outcome(w, s.end) {
            Outcome::Done => return finish(ep, lc, s, true, true),
            Outcome::Own => return own_part(ep, lc, s),
            Outcome::Offered | Outcome::Broken => return broken(lc, s),
            Outcome::Taken => {}
        }
        let now = std::time::Instant::now();
        let until = *until.get_or_insert(now + split::SPIN);
        if !spin || now >= until {
            lc.split = Some(s);
            return Ok(false);
        }
        std::hint::spin_loop();
        w = split::state(&ep.seg, ep.g, s.chan);
    }
}

/// The sender's part is ours to copy.
fn own_part(ep: &EpShared, lc: &mut RxChan, mut s: Split) -> Result<bool, ()> {
    let (at, placed) = (s.at, s.placed);
    let back = copy(&mut s, at, placed);
    finish(ep, lc, s, back, false)
}

/// Reads bytes `from..to` of the message into the receive.
fn copy(s: &mut Split, from: usize, to: usize) -> bool {
    let Some(req) = s.req.as_mut() else {
        return false;
    };
    let lens: SmallVec<[usize; 4]> = req.bufs.iter().map(|b| b.len()).collect();
    let rl: SmallVec<[usize; 4]> = s.ranges.iter().map(|r| r.1 as usize).collect();
    let remote: SmallVec<[(u64, u64); 4]> = crate::cma::pieces(&rl, from, to - from)
        .into_iter()
        .map(|(i, at, k)| (s.ranges[i].0 + at as u64, k as u64))
        .collect();
    let parts = crate::cma::pieces(&lens, from, to - from);
    let mut local: SmallVec<[&mut [u8]; 4]> = SmallVec::new();
    let mut p = parts.iter().peekable();
    for (i, b) in req.bufs.iter_mut().enumerate() {
        if let Some(&(_, at, k)) = p.next_if(|q| q.0 == i) {
            local.push(&mut b[at..at + k]);
        }
    }
    crate::pool_map::pull(s.pid, s.pool.as_ref(), &remote, &mut local) == Ok(to - from)
}

/// Both parts settled: the receive completes if both arrived whole
/// (`back`: the sender's part; `theirs`: written by the sender);
/// otherwise it fails as a message broken off, the channel freed.
fn finish(
    ep: &EpShared,
    lc: &mut RxChan,
    mut s: Split,
    back: bool,
    theirs: bool,
) -> Result<bool, ()> {
    s.settled();
    let Some(req) = s.req.take() else {
        return Err(());
    };
    if !(s.front && back) {
        lc.partial = Some(Partial {
            info: s.info,
            sink: Sink::Recv(req),
            got: 0,
        });
        return Err(());
    }
    complete(ep, req, s.info, s.placed, &s.from, None);
    ep.direct.fetch_add(1, Ordering::Relaxed);
    if theirs {
        ep.split.fetch_add(1, Ordering::Relaxed);
    }
    Ok(true)
}

/// The sender wrote a state word no side of the offer writes: it broke
/// the rules. Its receive fails with the channel; its buffers are given
/// back, as for any broken message (a sender that writes our memory
/// against the rules could write any of it).
fn broken(lc: &mut RxChan, mut s: Split) -> Result<bool, ()> {
    s.settled();
    if let Some(req) = s.req.take() {
        lc.partial = Some(Partial {
            info: s.info,
            sink: Sink::Recv(req),
            got: 0,
        });
    }
    Err(())
}
