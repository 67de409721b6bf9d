//! The first record of an RMA request, answer or atomic at the
//! receiver, handed to `rma` and `atomic`.

use weft_core::sync::lock;

use super::message::{rma_info, Partial, Sink};
use super::RxChan;
use crate::endpoint::EpShared;
use crate::layout::*;
use crate::ring::Rec;

/// The first record of an RMA request or answer (`rma`): handled now,
/// or begun as a partial transfer whose bytes follow.
#[inline(never)]
pub(super) fn rma_record(ep: &EpShared, lc: &mut RxChan, r: &Rec) -> Result<bool, ()> {
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
            let (w, total) =
                crate::rma::write_start(ep, h, r.payload, &who, lc.claimer).ok_or(())?;
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
            let a = crate::atomic::start(ep, h, r.payload, &who, lc.claimer).ok_or(())?;
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
                crate::rma::read(ep, h, r.payload, &who, lc.claimer)
            } else {
                crate::rma::direct(ep, (lc.cma_pid, lc.claimer), h, r.payload, &who)
            };
            if !ok {
                return Err(());
            }
        }
        K_RMA_WD => {
            if !crate::rma::direct(ep, (lc.cma_pid, lc.claimer), h, r.payload, &who) {
                return Err(());
            }
        }
        _ => {
            use crate::rma::AnswerStart;
            let (len, sink) = match crate::rma::answer_start(ep, h, &from, lc.claimer)? {
                AnswerStart::Done => return Ok(true),
                AnswerStart::Bytes(p) => (p.len, Sink::Answer(p)),
                AnswerStart::Skip(n) => (n, Sink::Skip),
            };
            lc.partial = Some(Partial {
                info: rma_info(len),
                sink,
                got: 0,
            });
        }
    }
    Ok(true)
}
