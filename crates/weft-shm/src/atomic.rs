//! Atomics between shm endpoints, executed at the target by
//! `weft_core::atomic` (`docs/wire.md` section 16, "RMA records"). The
//! request is a lead record whose payload is weft-core's 32-byte atomic
//! prefix (key, address, operation, datatype, form, count) followed by
//! the operand and compare arrays as continuation records, in host byte
//! order (both sides are on one host). The target holds the arrays (at
//! most 2 × `ATOMIC_MAX` bytes) until they have arrived, checks key,
//! range and rights (`FI_REMOTE_WRITE` for what may change memory,
//! `FI_REMOTE_READ` for what returns it), and applies the operation
//! under the region's lock — the lock every RMA access and atomic of that
//! memory takes — so each atomic is atomic as a whole with respect to
//! all of them. The answer carries the old values for the fetching and
//! compare forms; a refusal is `FI_EACCES` (or `FI_EOPNOTSUPP`), the
//! memory untouched.

use std::sync::Arc;

use bytes::BytesMut;
use weft_core::atomic::{self, AtomicKind, AtomicOp, Datatype};
use weft_core::completion::OpDone;
use weft_core::flags::MrAccess;
use weft_core::provider::{Atomic, Iov};
use weft_core::wire::atomic::{AtomicHdr, ATOMIC_HDR_LEN, ATOMIC_MAX};
use weft_core::wire::rma::Target;
use weft_core::{Error, Result};

use crate::endpoint::EpShared;
use crate::layout::*;
use crate::mr::Region;
use crate::ring::RecHead;
use crate::rma::Lead;
use crate::rma::Pending;
use crate::tx::Out;

/// `fi_atomicvalid` on shm: every combination `weft_core::atomic`
/// computes, up to [`ATOMIC_MAX`] bytes and `max_msg_size`.
pub fn valid(max_msg: usize, kind: AtomicKind, op: AtomicOp, dt: Datatype) -> Result<usize> {
    atomic::supported(kind, op, dt)?;
    Ok(ATOMIC_MAX.min(max_msg) / dt.size())
}

/// The initiator's check of `a`: a supported combination (`OpNotSupp`)
/// of the right shape (`Atomic::check_shape`).
pub fn check(max_msg: usize, a: &Atomic) -> Result<()> {
    a.check_shape(valid(max_msg, a.kind, a.op, a.datatype)?)
}

/// The request for `a` at `addr` under `key`, and the operation its
/// answer completes (with a buffer for the old values when it fetches).
pub fn request(a: Atomic, addr: u64, key: u64, done: OpDone) -> (Out, Pending) {
    let hdr = AtomicHdr {
        target: Target { addr, key },
        op: a.op,
        datatype: a.datatype,
        kind: a.kind,
        count: a.count as u64,
    };
    let mut iov = Iov::new();
    if a.op != AtomicOp::Read {
        iov.push(a.operand);
    }
    if a.kind == AtomicKind::Compare {
        iov.push(a.compare);
    }
    let len = iov.iter().map(|b| b.len()).sum();
    let answer = hdr.answer_len();
    let bufs = if answer > 0 {
        vec![BytesMut::zeroed(answer)]
    } else {
        Vec::new()
    };
    let p = Pending::new(done, answer, bufs, answer > 0);
    let lead = Lead::new(K_ATOMIC, 0, 0, &hdr.encode());
    (EpShared::rma_out(lead, iov, len), p)
}

/// An atomic request arriving at the target.
#[derive(Debug)]
pub struct AtomicIn {
    hdr: AtomicHdr,
    /// The region and the offset of the elements, or why not.
    to: Result<(Arc<Region>, usize)>,
    /// Operand then compare array, as they arrive.
    data: Vec<u8>,
    /// Bytes of arrays to come in all.
    total: usize,
    /// The request's id, for its answer.
    id: u32,
    /// The instance that claimed its channel, the only one the answer
    /// may go to (`EpShared::answer`).
    by: Option<crate::live::Instance>,
}

/// Target: an atomic request's lead record. `None`: it breaks the rules
/// (a prefix that does not decode, or arrays of another length).
pub fn start(
    ep: &EpShared,
    h: &RecHead,
    payload: usize,
    who: &[u8],
    by: Option<crate::live::Instance>,
) -> Option<AtomicIn> {
    let mut b = [0u8; ATOMIC_HDR_LEN];
    if h.len as usize != ATOMIC_HDR_LEN || !ep.seg.read(payload, &mut b) {
        return None;
    }
    let total = usize::try_from(h.total).ok()?;
    let hdr = AtomicHdr::decode(&b, (ATOMIC_HDR_LEN + total) as u64).ok()?;
    let n = hdr.bytes()?;
    let mut need = MrAccess::empty();
    if hdr.op != AtomicOp::Read {
        need |= MrAccess::REMOTE_WRITE;
    }
    if hdr.kind.fetches() {
        need |= MrAccess::REMOTE_READ;
    }
    let to = atomic::supported(hdr.kind, hdr.op, hdr.datatype).and_then(|()| {
        let off = hdr.target.addr;
        ep.region(hdr.target.key, off, n, need, who)
            .map(|r| (r, off as usize))
    });
    Some(AtomicIn {
        hdr,
        to,
        data: Vec::with_capacity(total),
        total,
        id: h.id(),
        by,
    })
}

/// Target: `n` more array bytes at segment offset `off`. False when they
/// pass the total or the segment refused the range.
pub fn feed(ep: &EpShared, a: &mut AtomicIn, off: usize, n: usize) -> bool {
    let at = a.data.len();
    if at + n > a.total {
        return false;
    }
    a.data.resize(at + n, 0);
    ep.seg.read(off, &mut a.data[at..])
}

/// Target: the arrays arrived: apply and answer.
pub fn end(ep: &EpShared, a: AtomicIn, from: &[u8]) {
    let hdr = a.hdr;
    let n = hdr.bytes().unwrap_or(0);
    let (operand, compare) = if hdr.op == AtomicOp::Read {
        (&a.data[..0], &a.data[..])
    } else {
        a.data.split_at(n.min(a.data.len()))
    };
    let old = a.to.and_then(|(r, off)| {
        r.update(off, n, |t| {
            atomic::apply(hdr.op, hdr.datatype, t, operand, compare)
        })
        .map_err(|e| match e {
            Error::Canceled => Error::Access,
            e => e,
        })
    });
    match old {
        Ok(v) if hdr.kind.fetches() => ep.answer(from, a.by, a.id, Ok(()), Some(v.into())),
        Ok(_) => ep.answer(from, a.by, a.id, Ok(()), None),
        Err(e) => ep.answer(from, a.by, a.id, Err(e), None),
    }
}
