//! Messages off the ring: a record matched to a posted receive and
//! placed into its buffers, or held within the unexpected budget, and
//! the message completed once its last record is in.

use std::sync::Arc;

use bytes::BytesMut;
use weft_core::addr::{FiAddr, FI_ADDR_NOTAVAIL};
use weft_core::limits::UNEXPECTED_OVERHEAD;
use weft_core::provider::RecvReq;
use weft_core::recv_completion::{deliver_in, KnownSource, RecvCtx as _};
use weft_core::soft_rx::{self, Charge, Ended};
use weft_core::soft_srx::SrxEp;
use weft_core::sync::lock;
use weft_core::tagmatch::MsgInfo;

use super::cma_in::cma_record;
use super::rma_in::rma_record;
use super::{Held, RxChan};
use crate::endpoint::EpShared;
use crate::layout::*;
use crate::ring::Rec;
use crate::rx_done::{complete, unknown};
use crate::segment::Segment;

/// Where a message being received goes.
#[derive(Debug)]
pub(super) enum Sink {
    /// A posted receive took it at its first record.
    Recv(RecvReq),
    /// No receive yet: buffered, charged.
    Buf(BytesMut, Charge),
    /// An RMA write at the target: into a region, or read past.
    Write(crate::rma::WriteIn),
    /// A read's answer at the initiator.
    Answer(crate::rma::Pending),
    /// An answer no operation waits for (`rma::AnswerStart::Skip`): its
    /// bytes are read past.
    Skip,
    /// An atomic's arrays at the target.
    Atomic(crate::atomic::AtomicIn),
}

/// What a partial RMA transfer of `total` bytes shares with a message:
/// its length (the rest is unused).
pub(super) fn rma_info(total: usize) -> MsgInfo {
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
pub(super) struct Partial {
    pub(super) info: MsgInfo,
    pub(super) sink: Sink,
    /// Bytes of it read so far.
    pub(super) got: usize,
}

/// The AV handle of the channel's sender, looked up again only after the
/// AV changed. Inlined into the one-record message's path: called, it
/// cost a call's saving and restoring of registers.
#[inline(always)]
fn source(ep: &EpShared, lc: &mut RxChan) -> FiAddr {
    let (Some(av), Some(who)) = (&ep.cfg.av, &lc.who) else {
        return FI_ADDR_NOTAVAIL;
    };
    let v = ep.av_version(av);
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
/// (or only) record has header `h`. Inlined: one call per message.
#[inline]
pub(super) fn msg_info(
    ep: &EpShared,
    lc: &mut RxChan,
    h: &crate::ring::RecHead,
    total: usize,
) -> MsgInfo {
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
/// `Err`: the sender broke the rules. The record comes by value, and so
/// goes to the out-of-line paths: handed on by reference, it had to lie
/// in memory, and the reader's loop stored each one found onto the
/// stack (eight stores a message) for paths a one-record message never
/// takes.
pub(super) fn record(ep: &EpShared, lc: &mut RxChan, r: Rec) -> Result<bool, ()> {
    let h = &r.head;
    let len = h.len as usize;
    let last = h.has(F_LAST);
    let p = match h.kind() {
        K_FIRST => {
            if lc.partial.is_some() {
                return Err(());
            }
            let total = crate::ring::check_first(h, ep.max_msg).ok_or(())?;
            let info = msg_info(ep, lc, h, total);
            if lc.who.is_none() || lc.from.is_none() {
                return Err(());
            }
            let mut m = lock(&ep.side.matcher);
            let mut ended = Ended::default();
            // The request is placed and completed where the matcher put
            // it, through references: a receive request is large, and
            // every move of one copies it.
            let mut got = soft_rx::arrival_into(&mut m, &info, &mut ended);
            let Some(req) = got.as_mut() else {
                let from = lc.who.clone().ok_or(())?;
                let r = hold_first(ep, &mut m, lc, r, info, total, from);
                drop(m);
                ended.report(ep);
                return r;
            };
            drop(m);
            ended.report(ep);
            if last {
                // A message of one record (any up to a quarter ring) is
                // placed and completed here: no partial message built and
                // moved to `finish`, no clone of the sender's names.
                // `check_first` held it to exactly its total.
                let who = match lc.who.as_ref() {
                    Some(who) if place(&ep.seg, req, 0, r.payload, len) => who,
                    _ => {
                        // The sender broke the rules: the receive goes
                        // to the channel, whose freeing fails it.
                        lc.partial = got.map(|req| Partial {
                            info,
                            sink: Sink::Recv(req),
                            got: 0,
                        });
                        return Err(());
                    }
                };
                let placed = total.min(req.capacity());
                // `complete`'s usual case written out here: handing the
                // request to its parameter copies it. The channel's known
                // source is read where it is compared: built as `complete`'s
                // `Option` first, it went onto the stack on this path too.
                match lc.src {
                    Some((_, handle, shown)) if handle == info.src && !unknown(ep, &info) => {
                        ep.report_here(req);
                        deliver_in(&KnownSource { ep, handle, shown }, req, &info, placed);
                        // What `deliver_in` left owns nothing.
                        debug_assert!(got.as_ref().is_none_or(|r| r.owns_nothing()));
                        std::mem::forget(got);
                    }
                    _ => {
                        let known = lc.src.map(|(_, h, shown)| (h, shown));
                        if let Some(req) = got.take() {
                            complete(ep, req, info, placed, who, known);
                        }
                    }
                }
                return Ok(true);
            }
            got.map(|req| Partial {
                info,
                sink: Sink::Recv(req),
                got: 0,
            })
            .ok_or(())?
        }
        _ => return record_rest(ep, lc, r),
    };
    more(ep, lc, r, p)
}

/// [`record`] of every record but a message's first: a continuation,
/// CMA and RMA. Out of line: inlined, their code made the reader's loop
/// keep more of its state on the stack for the one-record message.
#[inline(never)]
fn record_rest(ep: &EpShared, lc: &mut RxChan, r: Rec) -> Result<bool, ()> {
    match r.head.kind() {
        K_CONT => {
            let p = lc.partial.take().ok_or(())?;
            more(ep, lc, r, p)
        }
        K_CMA => cma_record(ep, lc, &r),
        K_RMA_W | K_RMA_R | K_RESP | K_ATOMIC | K_RMA_WD | K_RMA_RD => rma_record(ep, lc, &r),
        _ => Err(()),
    }
}

/// The bytes of record `r` added to the message `p` it continues (or
/// begins), which ends with its last record.
#[inline(never)]
fn more(ep: &EpShared, lc: &mut RxChan, r: Rec, mut p: Partial) -> Result<bool, ()> {
    let last = r.head.has(F_LAST);
    let names = match feed(ep, &r, &mut p) {
        Some(now) if !last => {
            p.got = now;
            lc.partial = Some(p);
            return Ok(true);
        }
        Some(now) => {
            p.got = now;
            lc.from.clone().zip(lc.who.clone())
        }
        None => None,
    };
    let Some((from, who)) = names else {
        // The sender broke the rules mid-message: the message goes back
        // to the channel, whose freeing (`Stop::Corrupt`) fails its
        // receive, RMA operation or answer and clears what waits on it.
        // Dropped here, a receive would never complete and a fence
        // behind an answer would wait for good.
        lc.partial = Some(p);
        return Err(());
    };
    let known = lc.src.map(|(_, h, shown)| (h, shown));
    finish(ep, p, from, who, known);
    Ok(true)
}

/// Record `r`'s bytes into the message `p`: what `p` will have got
/// with them, or `None` when the record breaks the rules.
fn feed(ep: &EpShared, r: &Rec, p: &mut Partial) -> Option<usize> {
    let len = r.head.len as usize;
    let now = crate::ring::check_next(&r.head, p.got, p.info.len)?;
    let ok = match &mut p.sink {
        Sink::Recv(req) => place(&ep.seg, req, p.got, r.payload, len),
        Sink::Buf(b, _) => {
            let at = b.len();
            b.resize(at + len, 0);
            ep.seg.read(r.payload, &mut b[at..])
        }
        Sink::Write(w) => crate::rma::write_feed(ep, w, p.got, r.payload, len),
        Sink::Answer(pending) => pending.place(&ep.seg, r.payload, len),
        Sink::Skip => true,
        Sink::Atomic(a) => crate::atomic::feed(ep, a, r.payload, len),
    };
    ok.then_some(now)
}

/// The first record of a message no receive takes: held (whole, or
/// begun as a partial message) within the budget. `Ok(false)`: it waits
/// for budget or a receive. Called with the matcher locked, so a receive
/// posted meanwhile cannot miss it.
#[inline(never)]
fn hold_first(
    ep: &EpShared,
    m: &mut crate::endpoint::ShmMatcher,
    lc: &mut RxChan,
    r: Rec,
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

/// A message whose last record arrived on the channel of the sender at
/// `from`, `who` as messages name it (`keys::ident`).
/// `known`: the channel's sender as an AV handle and the source its
/// completions report, looked up with the message's first record.
#[inline(never)]
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
        Sink::Skip => {}
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
