//! Atomics over a connection (`docs/wire.md` section 9.5), executed at
//! the target by `weft_core::atomic`.
//!
//! The initiator sends one `AtomicReq` (prefix, operand array, compare
//! array) and waits for one `AtomicResp` (status, and the old values for
//! the fetching forms), tracked like a read by sequence number.
//!
//! At the target a request's whole payload is held until it has arrived,
//! then applied under the lock of the region's memory: the lock every
//! other atomic, RMA write and RMA read of that memory (through any key,
//! sub-regions included) also takes, so each atomic is atomic, as a
//! whole, with respect to all of them, from any peer. What a request
//! makes the target hold (its payload, then its answer) is charged
//! against the connection's share of the receive budget before the
//! payload is read, as read answers are, and given back when the answer
//! is written: a peer flooding atomics stops being read. Elements are
//! bounded by [`ATOMIC_MAX`] bytes per request, and by `max_msg_size`.
//!
//! A request for a key that does not exist, a range outside the region,
//! or rights it lacks (`FI_REMOTE_WRITE` for anything that may change
//! memory, `FI_REMOTE_READ` for anything that returns it) is answered
//! `FI_EACCES` without touching memory; a combination the provider does
//! not compute, `FI_EOPNOTSUPP`; too many elements, `FI_EMSGSIZE`. The
//! connection goes on.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use weft_core::atomic::{self, AtomicKind, Datatype};
use weft_core::limits::UNEXPECTED_OVERHEAD;
use weft_core::provider::{iov1, Atomic, Iov};
use weft_core::wire::atomic::{AtomicHdr, ATOMIC_HDR_LEN, ATOMIC_MAX};
use weft_core::wire::rma::Target;
use weft_core::wire::{FrameKind, Header};
use weft_core::{Error, Result};

use crate::admission::Charge;
use crate::conn::Conn;
use crate::endpoint::EpShared;
use crate::frame::TxFrame;
use crate::rma::PendingRead;
use crate::rma_events::AccessKind;

/// `fi_atomicvalid` on this provider: every combination
/// `weft_core::atomic` computes, up to [`ATOMIC_MAX`] bytes and
/// `max_msg_size`.
pub fn valid(
    max_msg: usize,
    kind: AtomicKind,
    op: atomic::AtomicOp,
    dt: Datatype,
) -> Result<usize> {
    atomic::supported(kind, op, dt)?;
    Ok(ATOMIC_MAX.min(max_msg) / dt.size())
}

/// The initiator's own check of `a` (the API checks the same before
/// posting; this keeps a frame the target would have to close the
/// connection over from ever being sent): a supported combination
/// (`OpNotSupp`) of the right shape (`Atomic::check_shape`).
pub fn check(max_msg: usize, a: &Atomic) -> Result<()> {
    a.check_shape(valid(max_msg, a.kind, a.op, a.datatype)?)
}

/// The request frame for `a` at `target`, with the pending operation its
/// answer completes. The operands go out little-endian.
pub fn request(a: Atomic, target: Target, done: weft_core::completion::OpDone) -> TxFrame {
    let hdr = AtomicHdr {
        target,
        op: a.op,
        datatype: a.datatype,
        kind: a.kind,
        count: a.count as u64,
    };
    let mut payload = Iov::with_capacity(3);
    payload.push(Bytes::copy_from_slice(&hdr.encode()));
    for (arr, present) in [
        (a.operand, a.op != atomic::AtomicOp::Read),
        (a.compare, a.kind == AtomicKind::Compare),
    ] {
        if present {
            payload.push(wire_order(a.datatype, arr));
        }
    }
    let mut h = Header::new(FrameKind::AtomicReq);
    h.len = payload.iter().map(|b| b.len() as u64).sum();
    let len = hdr.answer_len();
    let bufs = if len > 0 {
        vec![BytesMut::zeroed(len)]
    } else {
        Vec::new()
    };
    let mut f = TxFrame::new(h, payload, None);
    f.read = Some(PendingRead::new(bufs, done, Some(a.datatype)));
    f
}

/// `b` with its elements little-endian (the same bytes on a
/// little-endian host).
fn wire_order(dt: Datatype, b: Bytes) -> Bytes {
    if cfg!(target_endian = "little") {
        return b;
    }
    let mut m = BytesMut::from(&b[..]);
    atomic::to_wire(dt, &mut m);
    m.freeze()
}

/// A request arriving at the target: its prefix, its payload so far,
/// and its charge against the budget.
#[derive(Debug)]
pub struct AtomicSink {
    hdr: AtomicHdr,
    seq: u64,
    /// Operand then compare array, as they arrive.
    data: Vec<u8>,
    charge: Charge,
}

impl AtomicSink {
    /// Admits request `seq` with prefix `hdr`: charges what it will hold
    /// (payload and answer) against the budget, or `None` when that does
    /// not fit now (the connection parked, to come back to the header).
    pub fn admit(conn: &Arc<Conn>, ep: &Arc<EpShared>, seq: u64, hdr: AtomicHdr) -> Option<Self> {
        let arrays = hdr.payload_len().unwrap_or(ATOMIC_HDR_LEN) - ATOMIC_HDR_LEN;
        let charge = ep.admit_answer(conn, UNEXPECTED_OVERHEAD + arrays + hdr.answer_len())?;
        Some(AtomicSink {
            hdr,
            seq,
            data: Vec::with_capacity(arrays),
            charge,
        })
    }

    pub fn feed(&mut self, data: &[u8]) {
        let room = self.data.capacity() - self.data.len();
        self.data.extend_from_slice(&data[..data.len().min(room)]);
    }

    /// The whole payload arrived: execute and answer.
    pub fn finish(self, conn: &Arc<Conn>, ep: &EpShared) {
        let mut h = Header::new(FrameKind::AtomicResp);
        h.seq = self.seq;
        let payload = match execute(ep, conn, &self.hdr, self.data) {
            Ok(old) => iov1(old),
            Err(e) => {
                h.data = e.code() as u64;
                Iov::new()
            }
        };
        h.len = payload.iter().map(|b| b.len() as u64).sum();
        let mut f = TxFrame::new(h, payload, None);
        f.charge = Some(self.charge);
        conn.send(f);
    }
}

/// Checks and applies one request; the old values to answer with (empty
/// for the plain form).
fn execute(ep: &EpShared, conn: &Conn, hdr: &AtomicHdr, mut data: Vec<u8>) -> Result<Bytes> {
    atomic::supported(hdr.kind, hdr.op, hdr.datatype)?;
    let n = hdr.bytes().ok_or(Error::MsgSize)?;
    if n > ep.max_msg {
        return Err(Error::MsgSize);
    }
    let kind = AccessKind::Atomic {
        writes: hdr.op.writes(),
        fetches: hdr.kind.fetches(),
    };
    let (region, off, ticket) = crate::rma::lookup(ep, conn, hdr.target, n as u64, kind)?;
    atomic::from_wire(hdr.datatype, &mut data);
    let (operand, compare) = if hdr.op == atomic::AtomicOp::Read {
        (&data[..0], &data[..0])
    } else if hdr.kind == AtomicKind::Compare {
        data.split_at(n)
    } else {
        (&data[..], &data[..0])
    };
    let mut old = region.update(off, n, |mem| {
        atomic::apply(hdr.op, hdr.datatype, mem, operand, compare)
    })?;
    // Counted once applied, before the answer goes out.
    if let Some(t) = ticket {
        t.complete(&region, &ep.cfg.remote_cntrs);
    }
    if !hdr.kind.fetches() {
        return Ok(Bytes::new());
    }
    atomic::to_wire(hdr.datatype, &mut old);
    Ok(Bytes::from(old))
}
