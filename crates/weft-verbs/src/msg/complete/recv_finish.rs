//! The completion entry that ends a receive.

use bytes::BytesMut;
use weft_core::addr::FI_ADDR_NOTAVAIL;
use weft_core::completion::{trim_bufs, CqEntry, CqErrEntry, OpDone};
use weft_core::flags::OpFlags;
use weft_core::Error;

use crate::sys::{WcOpcode, WcStatus, WorkCompletion};

/// `OpDone::complete`, except that a completion whose awaiting future is
/// gone comes back rather than being dropped.
// Inlined: out of line the completion and the entry (about 160 bytes)
// were copied into its parameters.
#[inline]
pub(super) fn hand_over(done: OpDone, entry: CqEntry) -> Option<CqEntry> {
    done.complete_from(entry, FI_ADDR_NOTAVAIL).map(|r| r.entry)
}

/// Whether a receive was consumed by the peer's RDMA write with
/// immediate (`fi_writedata`) rather than by a message. Only a successful
/// completion says which: a flushed one carries no opcode.
pub(super) fn is_remote_write(wc: &WorkCompletion) -> bool {
    wc.is_ok() && wc.opcode == WcOpcode::RecvRdmaWithImm
}

/// Ends a receive consumed by a write with remote CQ data: the write's
/// target completion, reported as the RDM endpoint reports
/// `fi_writedata`'s (the flags of a remote write, not of a message; the
/// data; `len` the bytes written into the region), with the receive's
/// context and its buffers handed back untouched (empty). The entry
/// comes back if the receive's future is gone.
pub(super) fn finish_remote_write(
    mut done: OpDone,
    mut bufs: Vec<BytesMut>,
    len: usize,
    imm: Option<u32>,
) -> Option<CqEntry> {
    done.flags = OpFlags::empty();
    trim_bufs(&mut bufs, 0);
    hand_over(
        done,
        CqEntry {
            context: 0,
            flags: OpFlags::RMA | OpFlags::REMOTE_WRITE | OpFlags::REMOTE_CQ_DATA,
            len,
            bufs,
            data: u64::from(imm.unwrap_or(0)),
            tag: 0,
            src: weft_core::addr::FI_ADDR_NOTAVAIL,
        },
    )
}

/// The error of a receive completion. A message longer than the posted
/// buffers ends the receive with a length error (rxe reports it as a local
/// QP operation error): to the application that is truncation.
pub(super) fn recv_error(wc: &WorkCompletion) -> Option<Error> {
    match wc.status {
        WcStatus::LocLenErr | WcStatus::LocQpOpErr => Some(Error::Trunc),
        _ => wc.to_error(),
    }
}

pub(super) fn recv_flags(imm: Option<u32>) -> OpFlags {
    let mut flags = OpFlags::RECV | OpFlags::MSG;
    if imm.is_some() {
        flags |= OpFlags::REMOTE_CQ_DATA;
    }
    flags
}

/// Completes a receive of `placed` bytes (buffers cut to what they
/// hold). A successful entry comes back if the receive's future is gone.
#[inline]
pub(super) fn finish_recv(
    done: OpDone,
    mut bufs: Vec<BytesMut>,
    placed: usize,
    err: Option<Error>,
    imm: Option<u32>,
) -> Option<CqEntry> {
    let flags = recv_flags(imm);
    trim_bufs(&mut bufs, placed);
    match err {
        None => hand_over(
            done,
            CqEntry {
                context: 0,
                flags,
                len: placed,
                bufs,
                data: u64::from(imm.unwrap_or(0)),
                tag: 0,
                src: weft_core::addr::FI_ADDR_NOTAVAIL,
            },
        ),
        Some(e) => {
            done.fail(CqErrEntry::new(0, flags, e).with_bufs(bufs));
            None
        }
    }
}
