//! Receives completing: a message placed in a receive's buffers, a held
//! message taken by a receive, and a message given back by a receive
//! whose future was dropped (split from `rx`, which reads the rings).

use std::sync::Arc;

use weft_core::addr::{FiAddr, FI_ADDR_NOTAVAIL};
use weft_core::av::shared::lock_synced;
use weft_core::completion::Returned;
use weft_core::limits::UNEXPECTED_OVERHEAD;
use weft_core::provider::RecvReq;
use weft_core::recv_completion::{deliver, deliver_unknown, KnownSource};
use weft_core::soft_rx::{self, Charge};
use weft_core::soft_srx::SrxEp;
use weft_core::sync::lock;
use weft_core::tagmatch::MsgInfo;

use crate::endpoint::EpShared;
use crate::rx::Held;

/// Completes a receive into which `placed` bytes went from the sender
/// `who` (`keys::ident`): as usual, or for a sender not in the AV on an
/// `FI_SOURCE_ERR` endpoint as the error entry that carries the sender's
/// address (and as its source, the key its channel proved, on an
/// `FI_AV_AUTH_KEY` endpoint). `known`: the sender's AV handle and the
/// source to report for it, when the ring's reader looked both up
/// already (the AV's lock is then not taken again here).
pub(crate) fn complete(
    ep: &EpShared,
    mut req: RecvReq,
    info: MsgInfo,
    placed: usize,
    who: &Arc<[u8]>,
    known: Option<(FiAddr, FiAddr)>,
) {
    ep.report_here(&mut req);
    if unknown(ep, &info) {
        let (addr, key) = crate::keys::split(who);
        let src = match (key, &ep.cfg.av) {
            (Some(k), Some(av)) => {
                let t = lock_synced(av);
                let ids = t.flags().contains(weft_core::flags::AvFlags::AV_USER_ID);
                t.keys().reported(k, ids)
            }
            _ => FI_ADDR_NOTAVAIL,
        };
        deliver_unknown(ep, req, info, placed, src, addr.to_vec());
    } else if let Some((src, shown)) = known.filter(|(h, _)| *h == info.src) {
        deliver(
            &KnownSource {
                ep,
                handle: src,
                shown,
            },
            req,
            info,
            placed,
        );
    } else {
        deliver(ep, req, info, placed);
    }
}

/// Whether a message completes as [`complete`]'s error entry: on an
/// `FI_SOURCE_ERR` endpoint, from a sender not in the AV.
#[inline(always)]
pub(crate) fn unknown(ep: &EpShared, info: &MsgInfo) -> bool {
    ep.source_err && info.src == FI_ADDR_NOTAVAIL
}

/// Completes a receive with a held message (which frees its budget).
pub fn deliver_held(ep: &EpShared, mut req: RecvReq, info: MsgInfo, held: Held) {
    let placed = weft_core::recv_completion::copy_in(&mut req, &held.data);
    complete(ep, req, info, placed, &held.from, None);
}

impl EpShared {
    /// Takes back a message whose receive's future was dropped as the
    /// message reached it: the oldest posted receive that accepts it gets
    /// it, else it goes to the head of the held messages, charged even
    /// past the budget (it was admitted once; refusing it now could only
    /// lose it). `after`: a message of a dropped multi-receive stream,
    /// held behind the ones given back before it.
    pub fn take_back(&self, mut r: Returned, after: bool) {
        if self.is_closed() {
            return;
        }
        let info = r.info();
        let data = r.take_bytes();
        let addr = if r.raw.is_empty() {
            self.addr_of(info.src)
        } else {
            std::mem::take(&mut r.raw)
        };
        let from = crate::keys::ident(&addr, info.key);
        let mut m = lock(&self.side.matcher);
        let (got, ended) = soft_rx::arrival(&mut m, &info);
        if let Some(mut req) = got {
            drop(m);
            ended.report(self);
            let placed = weft_core::recv_completion::copy_in(&mut req, &data);
            complete(self, req, info, placed, &from, None);
            return;
        }
        let charge = Charge::force(
            &self.side.unexp,
            UNEXPECTED_OVERHEAD.saturating_add(info.len),
        );
        let held = Held::new(self, data, from.clone(), charge);
        soft_rx::hold_given_back(&mut m, self.sender(from), info, held, after);
        drop(m);
        ended.report(self);
    }

    /// The address of AV handle `src` (empty when unknown: it resolves
    /// to nothing).
    fn addr_of(&self, src: FiAddr) -> Vec<u8> {
        if src == FI_ADDR_NOTAVAIL {
            return Vec::new();
        }
        self.cfg
            .av
            .as_ref()
            .and_then(|av| lock_synced(av).lookup(src).ok().map(<[u8]>::to_vec))
            .unwrap_or_default()
    }
}
