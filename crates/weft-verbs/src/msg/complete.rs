//! What the device holds for each posted operation, and how its work
//! completion ends it.

use bytes::BytesMut;
use weft_core::completion::{trim_bufs, CqEntry, CqErrEntry, OpDone};
use weft_core::flags::OpFlags;
use weft_core::sync::lock;
use weft_core::Error;

use super::MsgShared;
use crate::bufs::RmaLocal;
use crate::cqdrive::CqSink;
use crate::pool::SlotPool;
use crate::sys::{BytesMr, BytesMutMr, WcOpcode, WcStatus, WorkCompletion};

/// One posted operation, owned by the in-flight table until its
/// completion: whatever the device may touch lives here until then.
pub(super) struct Inflight {
    pub done: OpDone,
    pub op: Held,
}

/// The memory behind a posted operation.
pub(super) enum Held {
    /// A send of `len` bytes, copied inline into the work request.
    SendInline { len: usize },
    /// A send copied into a bounce slot.
    SendSlot { len: usize, slot: u32 },
    /// A send from the caller's buffers, registered.
    SendRegistered {
        len: usize,
        _mrs: Vec<std::sync::Arc<BytesMr>>,
    },
    /// A receive landing in a bounce slot, copied out at completion.
    RecvSlot { bufs: Vec<BytesMut>, slot: u32 },
    /// A receive into the caller's buffers, registered (zero-length ones
    /// are not registered and are given back as they were).
    RecvRegistered {
        mrs: Vec<BytesMutMr>,
        empty: Vec<BytesMut>,
    },
    /// An RMA write or read of `len` bytes.
    Rma {
        len: usize,
        kind: OpFlags,
        local: RmaLocal,
    },
}

impl CqSink for MsgShared {
    fn on_completion(&self, wc: &WorkCompletion) {
        let Some(Inflight { done, op }) = lock(&self.inflight).remove(&wc.wr_id) else {
            // Not ours: a receive of the shared receive context, taken by
            // a message that arrived here.
            if let Some(srx) = self.srx() {
                srx.on_completion(wc, &self.cfg);
            }
            return;
        };
        let link = lock(&self.link).clone();
        let len = match op {
            Held::Rma { len, kind, local } => return self.finish_rma(wc, done, len, kind, local),
            Held::SendInline { len } | Held::SendRegistered { len, .. } => len,
            Held::SendSlot { len, slot } => {
                if let Some(l) = &link {
                    l.send_pool.put(slot);
                }
                len
            }
            op @ (Held::RecvSlot { .. } | Held::RecvRegistered { .. }) => {
                self.rx.release(1);
                return finish_posted_recv(op, done, wc, link.as_ref().map(|l| &l.recv_pool));
            }
        };
        // A send: its registrations (if any) were dropped with `op`.
        self.tx.release(1);
        match wc.to_error() {
            None => done.complete(CqEntry {
                len,
                ..CqEntry::default()
            }),
            Some(e) => done.fail(CqErrEntry::new(0, OpFlags::SEND | OpFlags::MSG, e)),
        }
    }
}

impl MsgShared {
    /// Ends an RMA operation.
    fn finish_rma(
        &self,
        wc: &WorkCompletion,
        done: OpDone,
        len: usize,
        kind: OpFlags,
        local: RmaLocal,
    ) {
        self.tx.release(1);
        let bufs = local.into_bufs(wc.is_ok());
        match wc.to_error() {
            None => done.complete(CqEntry {
                len,
                bufs,
                ..CqEntry::default()
            }),
            Some(e) => {
                done.fail(CqErrEntry::new(0, kind, e).with_bufs(bufs));
                if e != Error::Canceled {
                    // A bad key or address left the queue pair in the
                    // error state: the connection is over (fi_endpoint(3):
                    // a critical error). The peer hears of it through the
                    // disconnect, this side at once.
                    if let Some(l) = lock(&self.link).clone() {
                        let _ = l.id.disconnect();
                    }
                    self.peer_gone(true);
                }
            }
        }
    }
}

/// Ends a posted receive (`Held::RecvSlot` or `Held::RecvRegistered`;
/// anything else is ignored) with its work completion. `pool`: where its
/// slot came from.
pub(super) fn finish_posted_recv(
    op: Held,
    done: OpDone,
    wc: &WorkCompletion,
    pool: Option<&SlotPool>,
) {
    match op {
        Held::RecvSlot { mut bufs, slot } => {
            if is_remote_write(wc) {
                // Nothing landed in the slot: it is free again.
                if let Some(p) = pool {
                    p.put(slot);
                }
                return finish_remote_write(done, bufs, wc);
            }
            let err = recv_error(wc);
            let mut placed = 0;
            if let Some(p) = pool {
                if err.is_none() {
                    let at = p.offset(slot);
                    placed = p
                        .scatter(at, wc.byte_len as usize, &mut bufs)
                        .unwrap_or_else(|(_, placed)| placed);
                }
                p.put(slot);
            }
            finish_recv(done, bufs, placed, err, wc.imm_data);
        }
        Held::RecvRegistered { mrs, mut empty } => {
            let mut bufs: Vec<BytesMut> = Vec::with_capacity(mrs.len() + empty.len());
            let mut lost = false;
            for m in mrs {
                match m.into_inner() {
                    Ok(b) => bufs.push(b),
                    Err(_) => lost = true,
                }
            }
            bufs.append(&mut empty);
            if is_remote_write(wc) && !lost {
                return finish_remote_write(done, bufs, wc);
            }
            let err = recv_error(wc).or(lost.then_some(Error::Io));
            let placed = if err.is_none() {
                wc.byte_len as usize
            } else {
                0
            };
            finish_recv(done, bufs, placed, err, wc.imm_data);
        }
        Held::SendInline { .. }
        | Held::SendSlot { .. }
        | Held::SendRegistered { .. }
        | Held::Rma { .. } => {}
    }
}

/// Whether a receive was consumed by the peer's RDMA write with
/// immediate (`fi_writedata`) rather than by a message. Only a successful
/// completion says which: a flushed one carries no opcode.
fn is_remote_write(wc: &WorkCompletion) -> bool {
    wc.is_ok() && wc.opcode == WcOpcode::RecvRdmaWithImm
}

/// Ends a receive consumed by a write with remote CQ data: the write's
/// target completion, reported as the RDM endpoint reports
/// `fi_writedata`'s (the flags of a remote write, not of a message; the
/// data; `len` the bytes written into the region), with the receive's
/// context and its buffers handed back untouched (empty).
fn finish_remote_write(mut done: OpDone, mut bufs: Vec<BytesMut>, wc: &WorkCompletion) {
    done.flags = OpFlags::empty();
    trim_bufs(&mut bufs, 0);
    done.complete(CqEntry {
        context: 0,
        flags: OpFlags::RMA | OpFlags::REMOTE_WRITE | OpFlags::REMOTE_CQ_DATA,
        len: wc.byte_len as usize,
        bufs,
        data: u64::from(wc.imm_data.unwrap_or(0)),
        tag: 0,
        src: weft_core::addr::FI_ADDR_NOTAVAIL,
    });
}

/// The error of a receive completion. A message longer than the posted
/// buffers ends the receive with a length error (rxe reports it as a local
/// QP operation error): to the application that is truncation.
fn recv_error(wc: &WorkCompletion) -> Option<Error> {
    match wc.status {
        WcStatus::LocLenErr | WcStatus::LocQpOpErr => Some(Error::Trunc),
        _ => wc.to_error(),
    }
}

/// Completes a receive of `placed` bytes (buffers cut to what they hold).
fn finish_recv(
    done: OpDone,
    mut bufs: Vec<BytesMut>,
    placed: usize,
    err: Option<Error>,
    imm: Option<u32>,
) {
    let mut flags = OpFlags::RECV | OpFlags::MSG;
    if imm.is_some() {
        flags |= OpFlags::REMOTE_CQ_DATA;
    }
    trim_bufs(&mut bufs, placed);
    match err {
        None => done.complete(CqEntry {
            context: 0,
            flags,
            len: placed,
            bufs,
            data: u64::from(imm.unwrap_or(0)),
            tag: 0,
            src: weft_core::addr::FI_ADDR_NOTAVAIL,
        }),
        Some(e) => {
            done.fail(CqErrEntry::new(0, flags, e).with_bufs(bufs));
        }
    }
}
