//! A channel's life as its receiver sees it: a sender's claim read
//! (its name, its key proof, whether we can read its memory), whether
//! that sender still runs, and the channel freed for the next one.

use std::sync::atomic::Ordering;

use weft_core::recv_completion::fail_recv;
use weft_core::soft_srx::SrxEp;
use weft_core::sync::lock;
use weft_core::Error;

use super::message::Sink;
use super::RxChan;
use crate::endpoint::EpShared;
use crate::layout::*;
use crate::ring::Chan;

/// Whether the process that claimed the channel still runs: by its pid,
/// or, where that pid means nothing here (another pid namespace), by the
/// lock it holds on its own segment, named by the address it claimed
/// with — while that segment is still the claimer's (`live::held_by`): a
/// new endpoint under the name does not keep a dead claimer's channel.
pub(super) fn sender_alive(ep: &EpShared, c: &Chan, lc: &RxChan) -> bool {
    let pid = ep.seg.load32(c.ctl(C_PID), Ordering::Acquire).unwrap_or(0);
    let start = ep
        .seg
        .load64(c.ctl(C_START), Ordering::Acquire)
        .unwrap_or(0);
    if crate::live::alive(pid, start) {
        return true;
    }
    let name = lc.from.as_deref().and_then(|a| crate::name::parse(a).ok());
    match (name, lc.claimer) {
        // Not known (a failed test): kept this round.
        (Some(n), Some(by)) => crate::live::held_by(n, by) != crate::live::Held::No,
        _ => false,
    }
}

/// A sender claimed the channel: reads its name. False when the name is
/// not one.
#[inline(never)]
pub(super) fn activate(ep: &EpShared, c: &Chan, lc: &mut RxChan, gen: u32) -> bool {
    if lc.active.is_some() || lc.partial.is_some() || lc.split.is_some() {
        // A new claim without our freeing the old one: broken sender
        // (the pass retires such a claim first; kept as a guard).
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
    let claimer = claimer(ep, c);
    forget_if_gone(ep, &from, claimer);
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
        split: None,
        bell: crate::bell::open_remote(name),
        claim_seen: None,
        claimer,
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

/// A channel under the name of `from` is claimed by the instance `by`:
/// if our record for `from` maps another instance that is gone (it died,
/// and `by` took its name before our sweep saw it), the sweep runs now —
/// what waited for the gone one fails, as it would at the sweep — so
/// that our answers to `by`'s requests, about to come on this channel,
/// find a record made anew for it instead of being dropped as the gone
/// one's (`enqueue_answer`): `by`'s operations would wait for them
/// forever. Every new instance claims before it asks anything, so this
/// one look per claim covers it unless the old one still looked alive
/// then (it died or closed just after): the answer that would be dropped
/// looks again (`EpShared::enqueue_renewed`). Answers to a record's own
/// instance pay nothing for either.
fn forget_if_gone(ep: &EpShared, from: &[u8], by: Option<crate::live::Instance>) {
    let Some(by) = by else {
        return;
    };
    let stale = lock(&ep.peers)
        .map
        .get_mut(from)
        .is_some_and(|p| p.instance() != by && !p.alive());
    if stale {
        ep.sweep_peers();
    }
}

/// The instance that claimed channel `c`, as it wrote itself there.
fn claimer(ep: &EpShared, c: &Chan) -> Option<crate::live::Instance> {
    use Ordering::Acquire;
    let pid = ep.seg.load32(c.ctl(C_PID), Acquire)?;
    let start = ep.seg.load64(c.ctl(C_START), Acquire)?;
    Some((pid, start, ep.seg.load64(c.ctl(C_SERIAL), Acquire)?))
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

/// Frees a channel for the next sender: what we knew of its claim goes
/// ([`retire`]), then the shared words are reset and the channel set
/// free at its count.
pub(super) fn free(ep: &EpShared, c: &Chan, lc: &mut RxChan, broken: bool) {
    retire(ep, c, lc, broken);
    if ep.keys.keyed() {
        // A fresh nonce for the next claim: an old proof is worth nothing.
        lc.nonce = crate::keyproof::publish_nonce(&ep.seg, c);
    }
    use Ordering::Release;
    ep.seg.store64(c.ctl(C_HEAD), 0, Release);
    ep.seg.store32(c.ctl(C_TX_WAIT), 0, Release);
    ep.seg.store32(c.ctl(C_CMA), CMA_UNKNOWN, Release);
    ep.seg.store32(c.ctl(C_AUTH), AUTH_UNKNOWN, Release);
    crate::split::clear(&ep.seg, ep.g, c.i);
    // The count kept: a sender's move on its claim, which compares it,
    // fails from now on (`state.rs`).
    c.set_free(&ep.seg);
}

/// Forgets the claim we knew on channel `c`, touching nothing shared: a
/// message it had begun fails its receive; `broken` counts it as
/// malformed. Alone (without [`free`]) where the channel's word already
/// names a newer claim than the one we knew (its sender freed it under
/// us, which only a broken one does, and another claimed it since): the
/// words are the new claimer's then, and the nonce it may have read for
/// its proof is kept.
pub(super) fn retire(ep: &EpShared, c: &Chan, lc: &mut RxChan, broken: bool) {
    if let Some(s) = lc.split.take() {
        // Its sender lives (a dead one's split was failed before the
        // free): a part it took and has not finished may still be
        // written, so those buffers are leaked, not handed back.
        let safe = !s.writing(ep);
        s.fail(ep, Error::ConnAborted, safe);
    }
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
            Sink::Buf(..) | Sink::Write(_) | Sink::Atomic(_) | Sink::Skip => {}
        }
    }
    if let (true, Some(from)) = (broken, &lc.from) {
        // Answers of its sender's may have been queued behind the bad
        // record: what waits for them and can fail safely does now
        // (`Peers::strand`).
        let stranded = lock(&ep.peers).strand(from, lc.claimer);
        for p in stranded {
            p.fail(ep, Error::ConnAborted);
        }
    }
    if broken {
        ep.malformed.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            channel = c.i,
            "shm: channel broke the layout's rules; freed"
        );
    }
    *lc = RxChan {
        nonce: lc.nonce,
        ..RxChan::default()
    };
}
