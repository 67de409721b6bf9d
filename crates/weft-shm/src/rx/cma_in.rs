//! CMA records at the receiver: the message read from the sender's
//! memory into the matching receive or a held buffer.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::BytesMut;
use smallvec::SmallVec;
use weft_core::limits::UNEXPECTED_OVERHEAD;
use weft_core::soft_rx::{self, Charge};
use weft_core::soft_srx::SrxEp;
use weft_core::sync::lock;
use weft_core::tagmatch::MsgInfo;

use super::message::{msg_info, Partial, Sink};
use super::{Held, RxChan};
use crate::endpoint::EpShared;
use crate::layout::*;
use crate::ring::Rec;
use crate::rx_done::complete;

/// Handles a CMA record: the message is read from the sender's memory
/// into the matching receive's buffers, or into a held buffer within the
/// budget. `Ok(false)`: it waits for budget or a receive; `Err`: the
/// sender broke the rules (a CMA record on a channel that did not pass
/// the probe, an announcement that does not check out, or memory that
/// cannot be read as announced).
#[inline(never)]
pub(super) fn cma_record(ep: &EpShared, lc: &mut RxChan, r: &Rec) -> Result<bool, ()> {
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
