//! RMA: reads and writes of a peer's registered memory (fi_rma(3)),
//! and the checks atomics (`crate::atomic`) share with them.
//!
//! The local side is an ordinary buffer, no registration needed: the
//! provider registers it for the length of the operation. Writes take
//! `Bytes` (shared, read-only while in flight); reads take `BytesMut`,
//! which the completion gives back filled.

use std::future::Future;

use bytes::{Bytes, BytesMut};
use weft_core::addr::FiAddr;
use weft_core::completion::{CqErrEntry, Waiter};
use weft_core::flags::{Caps, OpFlags};
use weft_core::provider::{Rejected, RmaOp, RmaReq};
use weft_core::{Error, Result};

use crate::endpoint::{async_op, op_done, Endpoint, Live, OpResult};
use crate::opfuture::{wait_then_post, Lazy, OnDrop, OpFuture, Started};

/// Flags an RMA operation may carry.
const RMA_FLAGS: OpFlags = OpFlags::COMPLETION
    .union(OpFlags::INJECT)
    .union(OpFlags::REMOTE_CQ_DATA)
    .union(OpFlags::MORE)
    .union(OpFlags::TRANSMIT_COMPLETE)
    .union(OpFlags::DELIVERY_COMPLETE);

/// One RMA operation (`fi_msg_rma` with a single remote segment).
#[derive(Debug)]
pub struct RmaMsg {
    /// The target peer (ignored by connected endpoints).
    pub dest: FiAddr,
    /// Write or read, with the local buffers.
    pub op: RmaOp,
    /// Target address inside the peer's region (its `addr()` + offset).
    pub addr: u64,
    /// The peer region's key.
    pub key: u64,
    /// Completion context.
    pub context: u64,
}

impl Endpoint {
    pub(crate) fn check_rma(&self, msg: &RmaMsg, flags: OpFlags) -> Result<()> {
        let info = self.info();
        // A fence is the provider's to keep, as on sends.
        let fence = info.tx_attr.op_flags_supported & OpFlags::FENCE;
        if !(RMA_FLAGS | fence).contains(flags)
            || (flags & OpFlags::COMPLETION_LEVELS).bits().count_ones() > 1
        {
            return Err(Error::BadFlags);
        }
        // RMA (or ATOMIC) without READ or WRITE means both (fi_getinfo(3)).
        let (primary, dir) = match &msg.op {
            RmaOp::Write { .. } => (Caps::RMA, Caps::WRITE),
            RmaOp::Read { .. } => (Caps::RMA, Caps::READ),
            RmaOp::Atomic(a) if !a.kind.fetches() => (Caps::ATOMIC, Caps::WRITE),
            RmaOp::Atomic(_) => (Caps::ATOMIC, Caps::READ),
        };
        let rw = Caps::READ | Caps::WRITE;
        if !info.caps.contains(primary) || (info.caps.intersects(rw) && !info.caps.contains(dir)) {
            return Err(Error::NoSys);
        }
        let (n, len, data) = match &msg.op {
            RmaOp::Write { iov, data } => (iov.len(), iov.iter().map(|b| b.len()).sum(), *data),
            RmaOp::Read { bufs } => (
                bufs.len(),
                bufs.iter().map(|b| b.len()).sum::<usize>(),
                None,
            ),
            RmaOp::Atomic(a) => {
                self.check_atomic(a, msg.addr)?;
                (1, a.bytes(), None)
            }
        };
        if n == 0 || n > info.tx_attr.iov_limit.max(1) {
            return Err(Error::Inval);
        }
        if len > info.ep_attr.max_msg_size {
            return Err(Error::MsgSize);
        }
        if data.is_some() != flags.contains(OpFlags::REMOTE_CQ_DATA) {
            return Err(Error::BadFlags);
        }
        // fi_inject_write(data): writes only (a read or an atomic has
        // something to return), up to `inject_size` bytes.
        if flags.contains(OpFlags::INJECT) {
            if !matches!(msg.op, RmaOp::Write { .. }) {
                return Err(Error::BadFlags);
            }
            if len > info.tx_attr.inject_size {
                return Err(Error::MsgSize);
            }
        }
        if data.is_some() && info.domain_attr.cq_data_size == 0 {
            return Err(Error::NoSys);
        }
        Ok(())
    }

    pub(crate) fn rma_req(
        &self,
        live: &Live,
        msg: RmaMsg,
        flags: OpFlags,
        waiter: Option<Waiter>,
    ) -> RmaReq {
        let flags = live.tx_flags(flags);
        let kind = msg.op.flags();
        let cntr = if kind.contains(OpFlags::WRITE) {
            live.write_cntr.clone()
        } else {
            live.read_cntr.clone()
        };
        let mut done = op_done(&live.tx_cq, msg.context, kind, flags, cntr, waiter);
        // fi_inject_write: no completion on success (a failure is still
        // reported, as for fi_inject).
        done.report &= !flags.contains(OpFlags::INJECT);
        RmaReq {
            dest: msg.dest,
            done,
            op: msg.op,
            addr: msg.addr,
            key: msg.key,
            flags,
        }
    }

    /// `fi_writemsg` / `fi_readmsg` / `fi_atomicmsg` and its fetching
    /// and compare forms: posts the operation; its completion goes to
    /// the transmit CQ with `msg.context` (a read's entry holds the
    /// filled buffers, a fetching atomic's one buffer with the values
    /// before). `Again` when
    /// the queue is full; on any failure to post, the buffers come back
    /// with the error.
    pub fn post_rmamsg(
        &self,
        msg: RmaMsg,
        flags: OpFlags,
    ) -> std::result::Result<(), (Error, RmaOp)> {
        let live = match self.live() {
            Ok(l) => l,
            Err(e) => return Err((e, msg.op)),
        };
        if let Err(e) = self.check_rma(&msg, flags) {
            return Err((e, msg.op));
        }
        let req = self.rma_req(live, msg, flags, None);
        live.prov
            .post_rma(req)
            .map_err(|Rejected { err, req }| (err, req.op))
    }

    /// `fi_write`: `buf` to the peer's memory at `addr` under `key`.
    pub fn post_write(
        &self,
        dest: FiAddr,
        buf: Bytes,
        addr: u64,
        key: u64,
        context: u64,
    ) -> Result<()> {
        let w = Write {
            dest,
            buf,
            data: None,
            addr,
            key,
        };
        self.post_one_write(w, context, OpFlags::empty())
    }

    /// `fi_writedata`: a write whose completion at the target carries
    /// `data` (up to the domain's `cq_data_size` bytes).
    pub fn post_writedata(
        &self,
        dest: FiAddr,
        buf: Bytes,
        data: u64,
        addr: u64,
        key: u64,
        context: u64,
    ) -> Result<()> {
        let w = Write {
            dest,
            buf,
            data: Some(data),
            addr,
            key,
        };
        self.post_one_write(w, context, OpFlags::empty())
    }

    /// `fi_inject_write`: `buf` (up to `inject_size` bytes) to the peer's
    /// memory at `addr` under `key`; no completion is generated, and the
    /// caller's buffer is its own again at once (a `Bytes` handed over).
    /// A write the target refuses still reports its error entry.
    pub fn inject_write(&self, dest: FiAddr, buf: Bytes, addr: u64, key: u64) -> Result<()> {
        let w = Write {
            dest,
            buf,
            data: None,
            addr,
            key,
        };
        self.post_one_write(w, 0, OpFlags::INJECT)
    }

    /// `fi_inject_writedata`: [`inject_write`](Self::inject_write) whose
    /// completion at the target carries `data`.
    pub fn inject_writedata(
        &self,
        dest: FiAddr,
        buf: Bytes,
        data: u64,
        addr: u64,
        key: u64,
    ) -> Result<()> {
        let w = Write {
            dest,
            buf,
            data: Some(data),
            addr,
            key,
        };
        self.post_one_write(w, 0, OpFlags::INJECT)
    }

    /// The four one-buffer write calls: `REMOTE_CQ_DATA` goes with data.
    fn post_one_write(&self, w: Write, context: u64, flags: OpFlags) -> Result<()> {
        let flags = if w.data.is_some() {
            flags | OpFlags::REMOTE_CQ_DATA
        } else {
            flags
        };
        let op = RmaOp::Write {
            iov: vec![w.buf],
            data: w.data,
        };
        self.post_rmamsg(rma(w.dest, op, w.addr, w.key, context), flags)
            .map_err(|(e, _)| e)
    }

    /// `fi_read`: the peer's memory at `addr` under `key` into `buf`
    /// (`buf.len()` bytes).
    pub fn post_read(
        &self,
        dest: FiAddr,
        buf: BytesMut,
        addr: u64,
        key: u64,
        context: u64,
    ) -> Result<()> {
        let op = RmaOp::Read { bufs: vec![buf] };
        self.post_rmamsg(rma(dest, op, addr, key, context), OpFlags::empty())
            .map_err(|(e, _)| e)
    }

    /// Posts `msg` and resolves with its own completion; a full transmit
    /// queue is waited out.
    pub fn rmamsg(
        &self,
        msg: RmaMsg,
        flags: OpFlags,
    ) -> impl Future<Output = OpResult> + Send + '_ {
        Lazy::new(move || self.start_rma(msg, flags))
    }

    /// Checks and posts an RMA operation for its future.
    fn start_rma(&self, msg: RmaMsg, flags: OpFlags) -> Started<'_> {
        let kind = msg.op.flags();
        let fail = move |e: Error, op: Option<RmaOp>| {
            let mut e = CqErrEntry::new(0, kind, e);
            if let Some(RmaOp::Read { bufs }) = op {
                e.bufs = bufs;
            }
            e
        };
        let live = match self.live() {
            Ok(l) => l,
            Err(e) => return Started::Failed(fail(e, None)),
        };
        if let Err(e) = self.check_rma(&msg, flags) {
            return Started::Failed(fail(e, None));
        }
        let (ctx, tx, rx) = async_op();
        let mut msg = msg;
        msg.context = ctx;
        let req = self.rma_req(live, msg, flags, Some(tx));
        match live.prov.post_rma(req) {
            Ok(()) => Started::Posted(live.op_future(ctx, rx, OnDrop::Nothing)),
            Err(Rejected {
                err: Error::Again,
                req,
            }) => Started::Boxed(Box::pin(async move {
                if let Err(r) = wait_then_post(req, |r| live.prov.post_rma(r)).await {
                    return Err(fail(r.err, Some(r.req.op)));
                }
                live.op_future(ctx, rx, OnDrop::Nothing).await
            })),
            Err(r) => Started::Failed(fail(r.err, Some(r.req.op))),
        }
    }

    /// Posts `msg` once, for the future of its completion (pool
    /// operations, which hold their buffer themselves while they wait
    /// out a full queue). On failure the operation comes back.
    pub(crate) fn rma_once(
        &self,
        msg: RmaMsg,
        flags: OpFlags,
    ) -> std::result::Result<OpFuture, (Error, RmaOp)> {
        let live = match self.live() {
            Ok(l) => l,
            Err(e) => return Err((e, msg.op)),
        };
        if let Err(e) = self.check_rma(&msg, flags) {
            return Err((e, msg.op));
        }
        let (ctx, tx, rx) = async_op();
        let mut msg = msg;
        msg.context = ctx;
        let req = self.rma_req(live, msg, flags, Some(tx));
        match live.prov.post_rma(req) {
            Ok(()) => Ok(live.op_future(ctx, rx, OnDrop::Nothing)),
            Err(r) => Err((r.err, r.req.op)),
        }
    }

    /// `write` resolving with its completion.
    pub fn write(
        &self,
        dest: FiAddr,
        buf: Bytes,
        addr: u64,
        key: u64,
    ) -> impl Future<Output = OpResult> + Send + '_ {
        let op = RmaOp::Write {
            iov: vec![buf],
            data: None,
        };
        self.rmamsg(rma(dest, op, addr, key, 0), OpFlags::empty())
    }

    /// `writedata` resolving with its completion.
    pub fn writedata(
        &self,
        dest: FiAddr,
        buf: Bytes,
        data: u64,
        addr: u64,
        key: u64,
    ) -> impl Future<Output = OpResult> + Send + '_ {
        let op = RmaOp::Write {
            iov: vec![buf],
            data: Some(data),
        };
        self.rmamsg(rma(dest, op, addr, key, 0), OpFlags::REMOTE_CQ_DATA)
    }

    /// `read` resolving with its completion, whose `bufs` hold the bytes
    /// read.
    pub fn read(
        &self,
        dest: FiAddr,
        buf: BytesMut,
        addr: u64,
        key: u64,
    ) -> impl Future<Output = OpResult> + Send + '_ {
        let op = RmaOp::Read { bufs: vec![buf] };
        self.rmamsg(rma(dest, op, addr, key, 0), OpFlags::empty())
    }
}

pub(crate) fn rma(dest: FiAddr, op: RmaOp, addr: u64, key: u64, context: u64) -> RmaMsg {
    RmaMsg {
        dest,
        op,
        addr,
        key,
        context,
    }
}

/// One buffer written to a peer's region (the one-buffer write calls).
struct Write {
    dest: FiAddr,
    buf: Bytes,
    data: Option<u64>,
    addr: u64,
    key: u64,
}
