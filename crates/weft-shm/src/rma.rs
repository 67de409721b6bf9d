//! RMA between shm endpoints (`docs/wire.md` section 16, "RMA records";
//! `docs/design.md`, "The shm provider"). The initiator writes a request
//! into its channel of the target's segment; the target's receive pass
//! checks the key, range and right against its domain's regions and does
//! the access itself, under the region's lock, then answers over its own
//! channel in the initiator's segment. Each request carries an id its
//! answer echoes; the initiator matches answers to its requests by it
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
    /// Went direct (`K_RMA_WD`/`K_RMA_RD`): the target moves the bytes
    /// from or into our buffers, which stay exposed until it answers.
    pub direct: Option<Exposed>,
    /// Its request's id (`ID_MASK`), given when the request begins and
    /// echoed by the answer, and the endpoint-wide sequence number it
    /// was taken from (`tx::answers::fresh_id`).
    pub id: u32,
    pub seq: u64,
}

/// Buffers a target moves bytes from or into by CMA (`docs/design.md`,
/// "RMA through cross-memory attach"): given back only once the target
/// answered, since after that it touches them no more. Dropped before
/// (the endpoint closed, the target's channel went away, the operation
/// failed without an answer), they are leaked rather than freed: a target
/// still at work would otherwise write into memory the allocator has
/// handed to someone else.
#[derive(Debug, Default)]
pub struct Exposed {
    read: Vec<BytesMut>,
    write: Iov,
}

impl Exposed {
    /// Takes the buffers back: the target answered.
    fn release(mut self) -> (Vec<BytesMut>, Iov) {
        (
            std::mem::take(&mut self.read),
            std::mem::take(&mut self.write),
        )
    }
}

impl Drop for Exposed {
    fn drop(&mut self) {
        for b in self.read.drain(..) {
            std::mem::forget(b);
        }
        for b in self.write.drain(..) {
            std::mem::forget(b);
        }
    }
}

impl Pending {
    /// An operation of `len` bytes completing `done`; a read fills `bufs`.
    pub fn new(done: OpDone, len: usize, bufs: Vec<BytesMut>, read: bool) -> Pending {
        Pending {
            done,
            len,
            bufs,
            read,
            got: 0,
            direct: None,
            id: 0,
            seq: 0,
        }
    }

    /// The operation goes direct: a read's buffers, or `write` (the
    /// bytes a write's target reads), stay exposed until the answer.
    pub fn go_direct(&mut self, write: Iov) {
        self.direct = Some(Exposed {
            read: std::mem::take(&mut self.bufs),
            write,
        });
    }

    /// The target answered: a direct operation's buffers are ours again.
    fn answered(&mut self) {
        if let Some(x) = self.direct.take() {
            let (read, _write) = x.release();
            self.bufs = read;
        }
    }

    /// Completes it: its credit back first, then the entry.
    pub fn complete(mut self, ep: &EpShared) {
        self.answered();
        ep.tx.release(1);
        self.done.complete(CqEntry {
            len: self.len,
            bufs: self.bufs,
            ..CqEntry::default()
        });
    }

    /// Fails it on the target's answer, handing a read's buffers back.
    pub fn fail(mut self, ep: &EpShared, err: Error) {
        self.answered();
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
        let inject = req.flags.contains(OpFlags::INJECT);
        let (addr, proves) = match self.admit(len, inject, nbufs, req.dest) {
            Ok(d) => d,
            Err(e) => return reject(e, req),
        };
        let fence = req.flags.contains(OpFlags::FENCE);
        let (out, pending) = match req.op {
            RmaOp::Write { iov, data } => {
                let flags = if data.is_some() { F_DATA } else { 0 };
                let (key, cq, off) = (req.key, data.unwrap_or(0), req.addr);
                let lead = Lead::new(K_RMA_W | flags, key, cq, &off.to_ne_bytes());
                let iov: Iov = iov.into_iter().collect();
                let ranges = iov.iter().map(|b| (b.as_ptr(), b.len()));
                let direct = direct_lead(K_RMA_WD | flags, key, cq, off, len, ranges);
                let p = Pending::new(req.done, len, Vec::new(), false);
                (EpShared::rma_out(lead, iov, len).or_direct(direct), p)
            }
            RmaOp::Read { bufs } => {
                let (key, off) = (req.key, req.addr);
                let lead = Lead::new(K_RMA_R, key, len as u64, &off.to_ne_bytes());
                let ranges = bufs.iter().map(|b| (b.as_ptr(), b.len()));
                let direct = direct_lead(K_RMA_RD, key, 0, off, len, ranges);
                let p = Pending::new(req.done, len, bufs, true);
                (EpShared::rma_out(lead, Iov::new(), 0).or_direct(direct), p)
            }
            RmaOp::Atomic(a) => crate::atomic::request(a, req.addr, req.key, req.done),
        };
        self.enqueue(&addr, out.fenced(fence).proving(proves), Some(pending));
        Ok(())
    }

    /// Answers the initiator `to` (`keys::ident`: its address, and the
    /// AV key handle its channel proved, which the answer's channel
    /// proves back) for its request `id` (echoed in the answer's `tag`):
    /// `status` 0 or an error's code, and a read's bytes. The request
    /// came on a channel claimed by the instance `by`: the answer goes
    /// only to that instance, and is dropped if the name `to` is now
    /// another's (the channel, closed, was drained after its claimer
    /// left; the new holder of the name restarted its ids, and would take
    /// the answer for one of its own operations).
    pub fn answer(
        &self,
        to: &[u8],
        by: Option<crate::live::Instance>,
        id: u32,
        status: Result<()>,
        data: Option<Bytes>,
    ) {
        let (to, proves) = crate::keys::split(to);
        let code = match status {
            Ok(()) => 0,
            Err(e) => e.code() as u64,
        };
        let len = data.as_ref().map_or(0, |d| d.len());
        let lead = Lead::new(K_RESP, u64::from(id), code, &[]);
        let iov: Iov = data.into_iter().collect();
        let out = EpShared::rma_out(lead, iov, len).proving(proves);
        self.enqueue_answer(to, out, by);
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
    /// The request's id, for its answer.
    pub id: u32,
    /// The instance that claimed the request's channel, the only one
    /// its answer may go to (`EpShared::answer`).
    pub by: Option<crate::live::Instance>,
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
    by: Option<crate::live::Instance>,
) -> Option<(WriteIn, usize)> {
    let off = arg(&ep.seg, payload, h.len)?;
    let total = usize::try_from(h.total).ok().filter(|&t| t <= ep.max_msg)?;
    let to = ep
        .region(h.tag, off, total, MrAccess::REMOTE_WRITE, who)
        .map(|r| (r, off as usize));
    let data = h.has(F_DATA).then_some(h.data);
    let id = h.id();
    Some((WriteIn { to, data, id, by }, total))
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
    write_done(ep, (w.id, w.by), w.to.map(|_| ()), w.data, len, from);
}

/// Target: the write request `id` (on a channel claimed by `by`) of `len`
/// bytes ended with `status`: the completion for remote CQ data `data` if
/// it succeeded, then the answer.
fn write_done(
    ep: &EpShared,
    (id, by): (u32, Option<crate::live::Instance>),
    status: Result<()>,
    data: Option<u64>,
    len: usize,
    from: &[u8],
) {
    if let (Ok(()), Some(data), Some(cq)) = (&status, data, &ep.cfg.rx_cq) {
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
    ep.answer(from, by, id, status, None);
}

/// Target: a read request (one record), on a channel claimed by `by`.
/// False when it breaks the rules.
pub fn read(
    ep: &EpShared,
    h: &RecHead,
    payload: usize,
    from: &Arc<[u8]>,
    by: Option<crate::live::Instance>,
) -> bool {
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
        Ok(b) => ep.answer(from, by, h.id(), Ok(()), Some(b)),
        Err(e) => ep.answer(from, by, h.id(), Err(e), None),
    }
    true
}

/// What an answer's first record leaves to come.
#[derive(Debug)]
pub enum AnswerStart {
    /// Nothing: the answer is whole (its operation ended, or the answer
    /// was dropped).
    Done,
    /// Its bytes follow, into this operation.
    Bytes(Pending),
    /// Its `usize` bytes follow, to be read past: no operation waits for
    /// its id.
    Skip(usize),
}

/// Initiator: an answer's first record, from the endpoint at `from`
/// over a channel the instance `by` claimed (`RxChan::claimer`): the
/// operation it answers (the one whose request carried the id its `tag`
/// echoes), to complete now or once its bytes arrived. An answer whose
/// id no waiting operation holds is dropped: its operation failed
/// already (`Peers::strand`, `Answered::lost`), or it is not ours; so is
/// one from another instance than our requests' target (one that had
/// the name before). Neither must complete another operation, which
/// would hand back buffers a target may still write (`docs/design.md`,
/// "RMA: executed at the target"). So is one on a channel of an instance
/// gone from its name, for which we keep no record
/// (`Peers::gone_from_name`). `Err`: we send nothing to `from` and the
/// answer comes from the instance holding the name, or
/// the answer does not fit its operation — the target broke the rules;
/// the operations before it then stay (a broken answer says nothing of
/// them) for the channel's freeing to strand.
pub fn answer_start(
    ep: &EpShared,
    h: &RecHead,
    from: &[u8],
    by: Option<crate::live::Instance>,
) -> std::result::Result<AnswerStart, ()> {
    let total = usize::try_from(h.total).map_err(|_| ())?;
    if h.len != 0 || h.has(F_LAST) != (total == 0) {
        return Err(());
    }
    // A direct read's bytes are in already; a target that could not
    // write them sends them through the ring instead.
    let fits = |p: &Pending| {
        if p.read {
            total == p.len || (total == 0 && p.direct.is_some())
        } else {
            total == 0
        }
    };
    let well_formed = |p: &Pending| if h.data == 0 { fits(p) } else { total == 0 };
    let found = lock(&ep.peers).answered(from, h.tag, by, well_formed);
    let found = match found {
        Ok(f) => f,
        // No record for `from`: looked at without the peers' lock.
        Err(()) if crate::tx::Peers::gone_from_name(from, by) => None,
        Err(()) => return Err(()),
    };
    let Some(crate::tx::Answered { op: mut p, lost }) = found else {
        tracing::debug!(id = h.tag, "shm: an answer no operation waits for; dropped");
        return Ok(if total == 0 {
            AnswerStart::Done
        } else {
            AnswerStart::Skip(total)
        });
    };
    for l in lost {
        l.fail(ep, Error::ConnAborted);
    }
    let fits = fits(&p);
    p.answered();
    let status = match h.data {
        0 => Ok(()),
        c => Err(i32::try_from(c)
            .ok()
            .and_then(Error::from_code)
            .unwrap_or(Error::Io)),
    };
    // `answered` marked the peer answering; the mark is cleared once the
    // operation has ended, here or when its bytes are in.
    let ended = |ep: &EpShared| lock(&ep.peers).set_answering(from, false);
    match status {
        Err(e) if total == 0 => {
            p.fail(ep, e);
            ended(ep);
            Ok(AnswerStart::Done)
        }
        Ok(()) if fits => {
            if total == 0 {
                p.complete(ep);
                ended(ep);
                return Ok(AnswerStart::Done);
            }
            Ok(AnswerStart::Bytes(p))
        }
        _ => {
            p.fail(ep, Error::Io);
            ended(ep);
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
    /// The record's `total` when it is not the bytes that follow (a
    /// direct request: the bytes the target moves).
    pub total: Option<u64>,
}

/// Longest lead payload: a direct request's offset and announcement.
pub const LEAD_ARG_MAX: usize = crate::cma::DIRECT_MAX;

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
            total: None,
        }
    }

    /// Its payload.
    pub fn arg(&self) -> &[u8] {
        &self.arg[..self.arg_len]
    }
}

/// The direct form of an RMA request of `len` bytes (kind and flags
/// `word`, `key`, `data`, target offset `off`) whose initiator buffers
/// are `ranges` (address, length), when its size goes by CMA here
/// (`cma::rma_min`); `None` keeps it on the ring. Used only if the
/// target's probe of us passed when the request begins.
fn direct_lead(
    word: u32,
    key: u64,
    data: u64,
    off: u64,
    len: usize,
    ranges: impl Iterator<Item = (*const u8, usize)>,
) -> Option<Lead> {
    if crate::cma::mode() == crate::cma::Mode::Denied || len < crate::cma::rma_min() {
        return None;
    }
    let ranges: smallvec::SmallVec<[(u64, u64); crate::cma::MAX_RANGES]> = ranges
        .filter(|r| r.1 > 0)
        .map(|(a, l)| (a as usize as u64, l as u64))
        .collect();
    if ranges.is_empty() || ranges.len() > crate::cma::MAX_RANGES {
        return None;
    }
    let req = crate::cma::DirectReq {
        off,
        ann: crate::cma::Announce { ranges, pool: None },
    };
    let mut l = Lead::new(word | F_LAST, key, data, &req.encode());
    l.total = Some(len as u64);
    Some(l)
}

/// Target: a direct request (`K_RMA_WD`, `K_RMA_RD`) from `who`, whose
/// process `pid` passed our probe (`None`: it did not, and a direct
/// request on its channel breaks the rules). Checks key, range and right
/// as the ring path does, then moves the bytes between the region, under
/// its lock, and the initiator's announced buffers — the kernel writes
/// only into the region's slices (a write) or into the initiator (a
/// read) — and answers. A read the kernel refuses (`EPERM`, `ENOSYS`)
/// is answered through the ring with the bytes. False when the request
/// breaks the rules.
pub fn direct(
    ep: &EpShared,
    (pid, by): (Option<u32>, Option<crate::live::Instance>),
    h: &RecHead,
    payload: usize,
    who: &[u8],
) -> bool {
    use crate::cma::{PullError, DIRECT_MAX};
    let Some(pid) = pid else {
        return false;
    };
    let Ok(total) = usize::try_from(h.total) else {
        return false;
    };
    let n = h.len as usize;
    let mut raw = [0u8; DIRECT_MAX];
    if n > DIRECT_MAX || !ep.seg.read(payload, &mut raw[..n]) {
        return false;
    }
    let Some(req) = crate::cma::DirectReq::parse(&raw[..n], total) else {
        return false;
    };
    let write = h.kind() == K_RMA_WD;
    let need = if write {
        MrAccess::REMOTE_WRITE
    } else {
        MrAccess::REMOTE_READ
    };
    let ranges = &req.ann.ranges;
    let region = ep.region(h.tag, req.off, total, need, who);
    let moved = region.as_ref().map_err(|e| *e).and_then(|r| {
        r.with_slices(req.off as usize, total, |s| {
            if write {
                crate::cma::pull(pid, ranges, s)
            } else {
                let src: smallvec::SmallVec<[&[u8]; 4]> = s.iter().map(|b| &b[..]).collect();
                crate::cma::push(pid, ranges, &src)
            }
        })
        // Closed under the access: as for a key that was never there.
        .map_err(|_| Error::Access)
    });
    let status = match moved {
        Ok(Ok(k)) if k == total => {
            ep.direct.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        }
        Ok(Ok(_)) | Ok(Err(PullError::Short)) | Ok(Err(PullError::Bad)) => Err(Error::Fault),
        Ok(Err(PullError::Sys(e))) => Err(match e {
            nix::errno::Errno::EFAULT => Error::Fault,
            nix::errno::Errno::ESRCH => Error::ConnReset,
            nix::errno::Errno::EPERM | nix::errno::Errno::ENOSYS => Error::Access,
            _ => Error::Io,
        }),
        Err(e) => Err(e),
    };
    if write {
        let data = h.has(F_DATA).then_some(h.data);
        write_done(ep, (h.id(), by), status, data, total, who);
        return true;
    }
    if let (Err(Error::Access), Ok(r)) = (status, &region) {
        // The kernel would not let us write into the initiator (seccomp
        // may allow reading it but not writing): the bytes go back the
        // ring's way.
        let mut b = BytesMut::zeroed(total);
        if r.get(req.off as usize, &mut b).is_ok() {
            ep.answer(who, by, h.id(), Ok(()), Some(b.freeze()));
            return true;
        }
    }
    ep.answer(who, by, h.id(), status, None);
    true
}
