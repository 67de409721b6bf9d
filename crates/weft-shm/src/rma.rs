//! RMA between shm endpoints (`docs/wire.md` section 16, "RMA records";
//! `docs/design.md`, "The shm provider"). The initiator writes a request
//! into its channel of the target's segment; the target's receive pass
//! checks the key, range and right against its domain's regions and does
//! the access itself, under the region's lock, then answers over its own
//! channel in the initiator's segment. The initiator matches answers to
//! its requests in order (one target answers in the order it read them)
//! and completes them: `FI_EACCES` for a refusal, the region untouched.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use weft_core::completion::{CqEntry, CqErrEntry, OpDone};
use weft_core::flags::{MrAccess, OpFlags};
use weft_core::provider::{Iov, Rejected, RmaOp, RmaReq};
use weft_core::recv_completion::RecvCtx;
use weft_core::sync::lock;
use weft_core::{Error, Result};

use crate::endpoint::EpShared;
use crate::layout::*;
use crate::mr::Region;
use crate::ring::RecHead;

/// Bytes of read answers a target queues for one initiator (past what
/// that initiator's ring holds) before it stops reading the initiator's
/// requests.
pub const ANSWER_BACKLOG: usize = 16 << 20;

/// An RMA operation waiting for its target's answer.
#[derive(Debug)]
pub struct Pending {
    pub done: OpDone,
    /// Bytes moved.
    pub len: usize,
    /// A read's buffers, filled in order from the answer's bytes.
    pub bufs: Vec<BytesMut>,
    pub read: bool,
    /// Bytes of the answer placed so far.
    pub got: usize,
}

impl Pending {
    /// Completes it: its credit back first, then the entry.
    pub fn complete(self, ep: &EpShared) {
        ep.tx.release(1);
        self.done.complete(CqEntry {
            len: self.len,
            bufs: self.bufs,
            ..CqEntry::default()
        });
    }

    /// Fails it, handing a read's buffers back.
    pub fn fail(self, ep: &EpShared, err: Error) {
        ep.tx.release(1);
        let mut e = CqErrEntry::new(0, OpFlags::empty(), err);
        e.bufs = self.bufs;
        self.done.fail(e);
    }

    /// Places `n` answer bytes at segment offset `off` into the read's
    /// buffers (bytes past them, which the length check excludes, are
    /// dropped).
    pub fn place(&mut self, seg: &crate::segment::Segment, off: usize, n: usize) -> bool {
        let ok = crate::rx::place_into(seg, &mut self.bufs, self.got, off, n);
        self.got += n;
        ok
    }
}

impl EpShared {
    /// Posts an RMA write, read or atomic. For atomics, the checks of
    /// `atomic::check` (`OpNotSupp`, `Inval`, `MsgSize`); `MsgSize` past `max_msg_size` (or `inject_size` with
    /// `FI_INJECT`), `Inval` for too many buffers, `AddrNotAvail` for an
    /// address not in the AV, `Again` with the transmit queue full.
    pub fn rma(&self, req: RmaReq) -> std::result::Result<(), Rejected<RmaReq>> {
        let reject = |err, req| Err(Rejected { err, req });
        let len = req.len();
        let nbufs = match &req.op {
            RmaOp::Atomic(a) => match crate::atomic::check(self.max_msg, a) {
                Ok(()) => 1,
                Err(e) => return reject(e, req),
            },
            RmaOp::Write { iov, .. } => iov.len(),
            RmaOp::Read { bufs } => bufs.len(),
        };
        if len > self.max_msg || (req.flags.contains(OpFlags::INJECT) && len > self.inject) {
            return reject(Error::MsgSize, req);
        }
        if nbufs > self.iov_limit {
            return reject(Error::Inval, req);
        }
        let (addr, proves) = match self.dest(req.dest) {
            Ok(d) => d,
            Err(e) => return reject(e, req),
        };
        if !self.tx.try_take() {
            return reject(Error::Again, req);
        }
        let fence = req.flags.contains(OpFlags::FENCE);
        let (out, pending) = match req.op {
            RmaOp::Write { iov, data } => {
                let word = K_RMA_W | if data.is_some() { F_DATA } else { 0 };
                let lead = Lead::new(word, req.key, data.unwrap_or(0), &req.addr.to_ne_bytes());
                let iov: Iov = iov.into_iter().collect();
                let p = Pending {
                    done: req.done,
                    len,
                    bufs: Vec::new(),
                    read: false,
                    got: 0,
                };
                (EpShared::rma_out(lead, iov, len), p)
            }
            RmaOp::Read { bufs } => {
                let lead = Lead::new(K_RMA_R, req.key, len as u64, &req.addr.to_ne_bytes());
                let p = Pending {
                    done: req.done,
                    len,
                    bufs,
                    read: true,
                    got: 0,
                };
                (EpShared::rma_out(lead, Iov::new(), 0), p)
            }
            RmaOp::Atomic(a) => crate::atomic::request(a, req.addr, req.key, req.done),
        };
        self.enqueue(addr, out.fenced(fence).proving(proves), Some(pending));
        Ok(())
    }

    /// Answers the initiator `to` (`keys::ident`: its address, and the
    /// AV key handle its channel proved, which the answer's channel
    /// proves back): `status` 0 or an error's code, and a read's bytes.
    pub fn answer(&self, to: &[u8], status: Result<()>, data: Option<Bytes>) {
        let (to, proves) = crate::keys::split(to);
        let code = match status {
            Ok(()) => 0,
            Err(e) => e.code() as u64,
        };
        let len = data.as_ref().map_or(0, |d| d.len());
        let lead = Lead::new(K_RESP, 0, code, &[]);
        let iov: Iov = data.into_iter().collect();
        let out = EpShared::rma_out(lead, iov, len).proving(proves);
        self.enqueue(to.to_vec(), out, None);
    }

    /// The region under `key` for `len` bytes at `off`, needing `need`,
    /// if the requesting peer `who` (`keys::ident`) proved the region's
    /// authorization key (`Access` otherwise, as for a key that does not
    /// exist).
    pub fn region(
        &self,
        key: u64,
        off: u64,
        len: usize,
        need: MrAccess,
        who: &[u8],
    ) -> Result<Arc<Region>> {
        let r = self
            .regions
            .as_ref()
            .ok_or(Error::Access)?
            .check(key, off, len, need)?;
        let proven = self.keys.key_for(crate::keys::split(who).1);
        if !r.admits_key(proven.map(|k| &k.key)) {
            return Err(Error::Access);
        }
        Ok(r)
    }
}

/// Where a write request's bytes go at the target.
#[derive(Debug)]
pub struct WriteIn {
    /// The region and the offset of the request in it, or why it was
    /// refused (its bytes are then read past).
    pub to: Result<(Arc<Region>, usize)>,
    pub data: Option<u64>,
}

/// The 8-byte argument of a lead record at segment offset `payload` of
/// `len` bytes.
fn arg(seg: &crate::segment::Segment, payload: usize, len: u32) -> Option<u64> {
    let mut b = [0u8; 8];
    (len == 8 && seg.read(payload, &mut b)).then(|| u64::from_ne_bytes(b))
}

/// Target: a write request's first record from `who`. `None`: it
/// breaks the rules.
pub fn write_start(
    ep: &EpShared,
    h: &RecHead,
    payload: usize,
    who: &[u8],
) -> Option<(WriteIn, usize)> {
    let off = arg(&ep.seg, payload, h.len)?;
    let total = usize::try_from(h.total).ok().filter(|&t| t <= ep.max_msg)?;
    let to = ep
        .region(h.tag, off, total, MrAccess::REMOTE_WRITE, who)
        .map(|r| (r, off as usize));
    let data = h.has(F_DATA).then_some(h.data);
    Some((WriteIn { to, data }, total))
}

/// Target: `n` bytes of a write at message offset `at`, from segment
/// offset `off`. False when the segment refused the range.
pub fn write_feed(ep: &EpShared, w: &mut WriteIn, at: usize, off: usize, n: usize) -> bool {
    if let Ok((r, base)) = &w.to {
        let mut ok = true;
        let put = r.fill(base + at, n, |dst, k| {
            ok &= ep.seg.read(off + k, dst);
        });
        if put.is_err() {
            // Closed under the access: the initiator learns `Access`,
            // as for a key that was never there.
            w.to = Err(Error::Access);
        }
        return ok;
    }
    true
}

/// Target: the write's last byte arrived: the target's completion for
/// remote CQ data, then the answer.
pub fn write_end(ep: &EpShared, w: WriteIn, len: usize, from: &Arc<[u8]>) {
    let status = w.to.map(|_| ());
    if let (Ok(()), Some(data), Some(cq)) = (&status, w.data, &ep.cfg.rx_cq) {
        cq.push(Ok(CqEntry {
            context: 0,
            flags: OpFlags::RMA | OpFlags::REMOTE_WRITE | OpFlags::REMOTE_CQ_DATA,
            len,
            bufs: Vec::new(),
            data,
            tag: 0,
            src: ep.reported_addr(ep.resolve_src(from)),
        }));
    }
    ep.answer(from, status, None);
}

/// Target: a read request (one record). False when it breaks the rules.
pub fn read(ep: &EpShared, h: &RecHead, payload: usize, from: &Arc<[u8]>) -> bool {
    let Some(off) = arg(&ep.seg, payload, h.len) else {
        return false;
    };
    let Some(len) = usize::try_from(h.data).ok().filter(|&l| l <= ep.max_msg) else {
        return false;
    };
    if h.total != 0 || !h.has(F_LAST) {
        return false;
    }
    let got = ep
        .region(h.tag, off, len, MrAccess::REMOTE_READ, from)
        .and_then(|r| {
            let mut b = BytesMut::zeroed(len);
            r.get(off as usize, &mut b).map_err(|_| Error::Access)?;
            Ok(b.freeze())
        });
    match got {
        Ok(b) => ep.answer(from, Ok(()), Some(b)),
        Err(e) => ep.answer(from, Err(e), None),
    }
    true
}

/// Initiator: an answer's first record, from the endpoint at `from`:
/// the operation it answers (the oldest sent there), to complete now or
/// once its bytes arrived. `Err`: no operation waits, or the answer
/// does not fit it — the target broke the rules.
pub fn answer_start(
    ep: &EpShared,
    h: &RecHead,
    from: &[u8],
) -> std::result::Result<Option<Pending>, ()> {
    let total = usize::try_from(h.total).map_err(|_| ())?;
    if h.len != 0 || h.has(F_LAST) != (total == 0) {
        return Err(());
    }
    let p = lock(&ep.peers).pending_for(from).ok_or(())?;
    let status = match h.data {
        0 => Ok(()),
        c => Err(i32::try_from(c)
            .ok()
            .and_then(Error::from_code)
            .unwrap_or(Error::Io)),
    };
    match status {
        Err(e) if total == 0 => {
            p.fail(ep, e);
            Ok(None)
        }
        Ok(()) if total == if p.read { p.len } else { 0 } => {
            if total == 0 {
                p.complete(ep);
                return Ok(None);
            }
            lock(&ep.peers).set_answering(from, true);
            Ok(Some(p))
        }
        _ => {
            p.fail(ep, Error::Io);
            Err(())
        }
    }
}

/// The first record of an RMA request or response (`docs/wire.md`
/// section 16, "RMA records"): its kind and flags, its `tag` and `data`
/// words, and its payload (the target offset, or an atomic's prefix).
#[derive(Debug, Clone, Copy)]
pub struct Lead {
    pub word: u32,
    pub tag: u64,
    pub data: u64,
    arg: [u8; LEAD_ARG_MAX],
    arg_len: usize,
}

/// Longest lead payload: an atomic's prefix.
pub const LEAD_ARG_MAX: usize = 32;

impl Lead {
    /// A lead with `arg` (at most [`LEAD_ARG_MAX`] bytes; more is cut)
    /// as its payload.
    pub fn new(word: u32, tag: u64, data: u64, arg: &[u8]) -> Lead {
        let mut a = [0u8; LEAD_ARG_MAX];
        let n = arg.len().min(LEAD_ARG_MAX);
        a[..n].copy_from_slice(&arg[..n]);
        Lead {
            word,
            tag,
            data,
            arg: a,
            arg_len: n,
        }
    }

    /// Its payload.
    pub fn arg(&self) -> &[u8] {
        &self.arg[..self.arg_len]
    }
}
