//! Posting sends and receives: each picks where its bytes live (inline in
//! the work request, a bounce slot, or the caller's registered buffers)
//! and posts with the in-flight table locked, so that the completion —
//! which another thread may poll the moment the post returns — finds its
//! entry.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use weft_core::completion::OpDone;
use weft_core::flags::Mode;
use weft_core::provider::{iov1, PoolSend, RecvReq, Rejected, RmaOp, RmaReq, SendReq};
use weft_core::sync::lock;
use weft_core::{Error, Result};

use super::complete::{deliver, Held, Inflight, RecvMem, RecvSide, Waiting, RECV_WR_BIT};
use super::{Link, MsgShared};
use crate::local_mem::{all_pooled, Dst, RecvTargets, Src};
use crate::slot_pool::{SlotPool, SLOT};
use crate::sys::{
    AccessFlags, Payload, PoolMr, ProtectionDomain, RecvRequest, SendFlags, SendOp, SendRequest,
    Sge,
};
use crate::user_bufs::unregister_before;
use crate::user_bufs::{cached_source, gather, imm_data, post_rma, register_source, wr_flags};

/// The sends and RMA operations on the device, in the order they were
/// posted (each is added with the table locked across its post).
pub(super) type InflightQueue = super::post_order::PostOrder<Inflight>;

impl MsgShared {
    /// The checks every post shares: the endpoint is open and connected,
    /// and `len` bytes in `iovs` buffers fit its limits.
    // Always inlined: a call per send for a few comparisons and a clone.
    #[inline(always)]
    fn admit(&self, len: usize, iovs: usize) -> Result<Arc<Link>> {
        if self.is_closed() {
            return Err(Error::OpBadState);
        }
        let link = lock(&self.link).clone().ok_or(Error::NotConn)?;
        if len > self.cfg.info.ep_attr.max_msg_size {
            return Err(Error::MsgSize);
        }
        if iovs > self.cfg.info.tx_attr.iov_limit.max(1) {
            return Err(Error::Inval);
        }
        Ok(link)
    }

    pub(super) fn post_send(&self, mut req: SendReq) -> std::result::Result<(), Rejected<SendReq>> {
        let reject = |err, req| Err(Rejected { err, req });
        // Summed once: a pool buffer of another domain, turned into bytes
        // below, keeps its length.
        let len = req.len();
        let link = match self.admit(len, req.iov.len()) {
            Ok(l) => l,
            Err(e) => return reject(e, req),
        };
        let op = match imm_data(req.data) {
            Ok(None) => SendOp::Send,
            Ok(Some(imm)) => SendOp::SendWithImm(imm),
            Err(e) => return reject(e, req),
        };
        if !self.tx.try_take() {
            return reject(Error::Again, req);
        }
        // A pool of another protection domain (an endpoint with its own
        // authorization key): its key does not apply here, so its buffer
        // goes as the bytes of any other send (a bounce slot, or
        // registered), not as a copy made first.
        if req
            .pool
            .as_ref()
            .is_some_and(|b| pool_mr_on(b, &link.pd).is_none())
        {
            if let Some(b) = req.pool.take() {
                req.iov = iov1(b.into_bytes());
            }
        }
        let wr_id = self.wr_id();
        let Some(mut g) = super::give_up::open_table(&self.inflight, &link.retired) else {
            // Given up since `admit`: its operations were taken already.
            self.tx.release(1);
            return reject(Error::NotConn, req);
        };
        // Under the table's lock: the run of quiet sends is counted in
        // the order they are posted.
        let quiet = self.quiet_turn(&req.done, len, &link);
        let flags = if quiet {
            wr_flags(req.flags).unsignaled()
        } else {
            wr_flags(req.flags)
        };
        match send_on(&link, &req, len, op, (wr_id, flags)) {
            Ok(op) => {
                self.quiet_posted(quiet);
                // A pool buffer posted as it is stays with the operation.
                let op = match op {
                    Held::SendPool { len, .. } => Held::SendPool {
                        len,
                        _buf: req.pool,
                    },
                    Held::SendInline { len } if quiet => Held::SendQuiet { len },
                    op => op,
                };
                g.insert(wr_id, Inflight { done: req.done, op });
                Ok(())
            }
            Err(e) => {
                drop(g);
                self.tx.release(1);
                reject(e, req)
            }
        }
    }

    pub(super) fn post_rma(&self, req: RmaReq) -> std::result::Result<(), Rejected<RmaReq>> {
        let reject = |err, req| Err(Rejected { err, req });
        let (n, data) = match &req.op {
            RmaOp::Write { iov, data } => (iov.len(), *data),
            RmaOp::Read { bufs } => (bufs.len(), None),
            RmaOp::Atomic(_) => (1, None),
        };
        let link = match self.admit(req.len(), n) {
            Ok(l) => l,
            Err(e) => return reject(e, req),
        };
        // Remote CQ data travels as the write's 32-bit immediate, which
        // completes the receive at the head of the peer's queue (see the
        // module docs of `msg`): only an application that accepted
        // FI_RX_CQ_DATA expects that, for others it is not offered.
        let rx_cq_data = self.cfg.info.mode.contains(Mode::RX_CQ_DATA)
            || self.cfg.info.rx_attr.mode.contains(Mode::RX_CQ_DATA);
        if data.is_some() && !rx_cq_data {
            return reject(Error::NoSys, req);
        }
        let imm = match imm_data(data) {
            Ok(imm) => imm,
            Err(e) => return reject(e, req),
        };
        let Ok(rkey) = u32::try_from(req.key) else {
            // Verbs keys are 32 bits: no region has this key.
            return reject(Error::Access, req);
        };
        if !self.tx.try_take() {
            return reject(Error::Again, req);
        }
        let wr_id = self.wr_id();
        let Some(mut g) = super::give_up::open_table(&self.inflight, &link.retired) else {
            self.tx.release(1);
            return reject(Error::NotConn, req);
        };
        let kind = req.op.flags();
        let len = req.len();
        let inline_max = link.qp.caps().max_inline_data as usize;
        match post_rma(
            &link.qp,
            (&link.pd, link.cache.as_ref(), Some(&link.read_pool)),
            inline_max,
            req.op,
            (req.addr, rkey),
            imm,
            (wr_id, wr_flags(req.flags)),
        ) {
            Ok(local) => {
                self.quiet_posted(false);
                let op = Held::Rma { len, kind, local };
                g.insert(wr_id, Inflight { done: req.done, op });
                Ok(())
            }
            Err((err, op)) => {
                drop(g);
                self.tx.release(1);
                reject(err, RmaReq { op, ..req })
            }
        }
    }

    /// Whether the send `req` goes unsignaled (the caller holds the
    /// in-flight table's lock). Only a send copied inline whose success
    /// nothing takes — no entry (an inject, or no `FI_COMPLETION` under
    /// selective completion), no counter, no future — on an established
    /// connection (a give-up, before it, waits for every work request to
    /// report), and not more than [`MsgShared::quiet_max`] in a row: the
    /// credits of quiet sends come back with the next signaled
    /// completion, so a run of them is closed by a signaled one before
    /// it can hold the queue's credits.
    #[inline(always)]
    fn quiet_turn(&self, done: &OpDone, len: usize, link: &Link) -> bool {
        !done.wants_entry()
            && done.cntr.is_none()
            && fits_inline(link, len)
            && self.quiet_ok.load(Ordering::Relaxed)
            && self.quiet_run.load(Ordering::Relaxed) < self.quiet_max
    }

    /// Counts a posted send or RMA operation into the run of quiet sends
    /// (the caller holds the in-flight table's lock).
    #[inline(always)]
    fn quiet_posted(&self, quiet: bool) {
        // Loads and stores, not read-modify-writes: the lock orders them,
        // and a locked add per send is what this path saves elsewhere.
        let run = if quiet {
            let sent = self.quiet_sent.load(Ordering::Relaxed);
            self.quiet_sent.store(sent + 1, Ordering::Relaxed);
            self.quiet_run.load(Ordering::Relaxed) + 1
        } else {
            0
        };
        self.quiet_run.store(run, Ordering::Relaxed);
    }

    /// Posts `req` on the connection's receive queue (the caller took
    /// its credit).
    // Inlined, as `RecvSide::post` is: a receive request passed on by
    // value out of line is copied (a `memcpy` per receive).
    #[inline]
    pub(super) fn post_recv_on(
        &self,
        link: &Link,
        req: RecvReq,
    ) -> std::result::Result<(), Rejected<RecvReq>> {
        let target = RecvTarget {
            pool: &link.recv_pool,
            pd: &link.pd,
            post: &|wr| link.qp.post_recv(wr),
        };
        let id = self.wr_id() | RECV_WR_BIT;
        self.recv_side(&link.recv_pool).post(&target, req, id)
    }

    /// The connection's receive queue, whose slots come from `pool`.
    pub(super) fn recv_side<'a>(&'a self, pool: &'a SlotPool) -> RecvSide<'a> {
        RecvSide {
            q: &self.rxq,
            credits: &self.rx,
            pool,
        }
    }
}

impl RecvSide<'_> {
    /// Posts a receive whose credit is taken: it takes a held message at
    /// once; else it waits, posting a work request of its own unless a
    /// posted one is spare (that one's message will be copied in). On
    /// failure the request comes back (its credit is the caller's).
    // Always inlined, and only the completion and the buffers go on: the
    // request passed on whole (128 bytes) was a `memcpy` per receive.
    #[inline(always)]
    pub(super) fn post(
        &self,
        target: &RecvTarget<'_>,
        req: RecvReq,
        id: u64,
    ) -> std::result::Result<(), Rejected<RecvReq>> {
        let RecvReq { done, bufs, .. } = req;
        match self.post_parts(target, done, bufs, id) {
            Ok(()) => Ok(()),
            Err((err, done, bufs)) => Err(Rejected {
                err,
                req: RecvReq { done, bufs, ..req },
            }),
        }
    }

    // Not inlined: inlined into the connection's post (tried in the
    // fourth round), `post_recv` went from 654.5 to 676.5 instructions.
    fn post_parts(
        &self,
        target: &RecvTarget<'_>,
        done: OpDone,
        bufs: Vec<BytesMut>,
        id: u64,
    ) -> std::result::Result<(), (Error, OpDone, Vec<BytesMut>)> {
        // Locked across the post, so that the completion (which another
        // thread may poll the moment the post returns) finds the receive.
        let mut q = lock(self.q);
        if let Some(a) = q.take_held() {
            drop(q);
            self.credits.release(1);
            let w = Waiting::new(id, done, Some(bufs));
            if let Some(back) = deliver(w, a) {
                self.reroute(back, true);
            }
            return Ok(());
        }
        if !q.needs_wr() {
            q.push(id, done, Some(bufs), None);
            return Ok(());
        }
        match target.post(bufs, id) {
            Ok((mem, bufs)) => {
                q.push(id, done, bufs, Some(mem));
                Ok(())
            }
            Err((err, bufs)) => Err((err, done, bufs)),
        }
    }
}

/// Whether a message of `len` bytes goes inline in the work request (the
/// device copies it during the post). An empty one never does: it has
/// nothing to copy.
#[inline(always)]
fn fits_inline(link: &Link, len: usize) -> bool {
    len > 0 && len <= link.qp.caps().max_inline_data as usize
}

/// Posts the send of `req` (`len` bytes) as `op` and says what now holds its bytes
/// (`Held::SendPool` without its buffer: the caller moves the request's
/// pool buffer in).
fn send_on(
    link: &Link,
    req: &SendReq,
    len: usize,
    op: SendOp,
    (wr_id, flags): (u64, SendFlags),
) -> Result<Held> {
    let post = |payload: Payload<'_>| {
        link.qp
            .post_send(&SendRequest::new(wr_id, op, payload).flags(flags))
    };
    match (&req.pool, req.iov.as_slice()) {
        (Some(buf), _) => send_pool_buf(link, buf, len, post),
        // The usual small send, one buffer copied inline, without the
        // call of the general path.
        (None, [one]) if fits_inline(link, len) => {
            post(Payload::Inline(one))?;
            Ok(Held::SendInline { len })
        }
        (None, iov) => send_iov(link, iov, len, post),
    }
}

/// Posts a send of the buffers `iov`, `len` bytes in all.
fn send_iov(
    link: &Link,
    iov: &[Bytes],
    len: usize,
    post: impl Fn(Payload<'_>) -> Result<()>,
) -> Result<Held> {
    if fits_inline(link, len) {
        // The device copies inline data during the post: one buffer is
        // handed over as it is, several are gathered first.
        match iov {
            [one] => post(Payload::Inline(one))?,
            many => post(Payload::Inline(&gather(many, len)))?,
        }
        return Ok(Held::SendInline { len });
    }
    // One buffer, the usual case: its pool looked up once, and its
    // element on the stack. A pool buffer goes as it is: copying it into
    // a slot would only add a copy.
    let single = match iov {
        [one] if !one.is_empty() => Some(one),
        _ => None,
    };
    if let Some(src) = single.and_then(|b| Src::pooled(&link.pd, b)) {
        post(Payload::Sges(&[src.sge()?]))?;
        return Ok(Held::SendOne { len, _src: src });
    }
    if len > 0 && len <= SLOT && (single.is_some() || !all_pooled(&link.pd, iov)) {
        if let Some(slot) = link.send_pool.take() {
            let parts = iov.iter().map(|b| &b[..]);
            link.send_pool
                .post_from(slot, parts, |sge| post(Payload::Sges(&[sge])))?;
            return Ok(Held::SendSlot { len, slot });
        }
    }
    if let Some(b) = single {
        let src = Src::Mr(cached_source(
            link.cache.as_ref(),
            &link.pd,
            b,
            AccessFlags::NONE,
        )?);
        post(Payload::Sges(&[src.sge()?]))?;
        return Ok(Held::SendOne { len, _src: src });
    }
    let mrs = iov
        .iter()
        .filter(|b| !b.is_empty())
        .map(|b| register_source(link.cache.as_ref(), &link.pd, b))
        .collect::<Result<Vec<_>>>()?;
    let sges = mrs
        .iter()
        .map(|m| m.sge())
        .collect::<Result<Vec<Sge<'_>>>>()?;
    post(Payload::Sges(&sges))?;
    drop(sges);
    Ok(Held::SendRegistered { len, _mrs: mrs })
}

/// Posts a send whose message is a pool buffer the request carries
/// (`SendReq::pool`): inline when it fits (the buffer goes back to its
/// pool with the request), else under the key of the pool's
/// registration, read from the buffer itself (no lookup by address).
/// `post_send` has turned a pool of another protection domain into bytes
/// before; an empty message goes as one.
fn send_pool_buf(
    link: &Link,
    buf: &PoolSend,
    len: usize,
    post: impl Fn(Payload<'_>) -> Result<()>,
) -> Result<Held> {
    if fits_inline(link, len) {
        post(Payload::Inline(buf.bytes()))?;
        return Ok(Held::SendInline { len });
    }
    match pool_mr_on(buf, &link.pd).filter(|_| len > 0) {
        Some(mr) => {
            post(Payload::Sges(&[mr.sge_of(buf.bytes())?]))?;
            Ok(Held::SendPool { len, _buf: None })
        }
        None => send_iov(link, &[Bytes::new()], 0, post),
    }
}

/// The registration of `buf`'s pool, if it is on `pd`.
fn pool_mr_on<'a>(buf: &'a PoolSend, pd: &Arc<ProtectionDomain>) -> Option<&'a Arc<PoolMr>> {
    buf.registration()
        .downcast_ref::<Arc<PoolMr>>()
        .filter(|mr| mr.is_on(pd))
}

/// A receive post that failed: the error, and the buffers back.
pub(super) type RecvPostErr = (Error, Vec<BytesMut>);

/// Where receives are posted: a connection's queue pair, or the shared
/// receive queue of a shared receive context, each with its slots.
pub(super) struct RecvTarget<'a> {
    pub pool: &'a SlotPool,
    pub pd: &'a Arc<ProtectionDomain>,
    pub post: &'a dyn Fn(&RecvRequest<'_>) -> Result<()>,
}

impl RecvTarget<'_> {
    /// Posts a receive work request for `bufs`: into a bounce slot when
    /// they fit one (the buffers come back beside the memory), else into
    /// the buffers themselves, registered. On failure the buffers come
    /// back.
    pub(super) fn post(
        &self,
        bufs: Vec<BytesMut>,
        wr_id: u64,
    ) -> std::result::Result<(RecvMem, Option<Vec<BytesMut>>), RecvPostErr> {
        // One buffer, the usual case: its pool looked up once, for the
        // choice of memory and for its key.
        let pooled = match bufs.as_slice() {
            [one] => self.pd.pool_for(one.as_ptr() as usize, one.len()),
            _ => None,
        };
        if let Some(pool) = pooled {
            return self.post_pooled(bufs, pool, wr_id);
        }
        let cap: usize = bufs.iter().map(|b| b.len()).sum();
        if cap > 0 && cap <= SLOT && (bufs.len() == 1 || !all_pooled(self.pd, &bufs)) {
            let posted = self.pool.take_post(cap, |sge| {
                (self.post)(&RecvRequest {
                    wr_id,
                    sges: &[sge],
                })
            });
            match posted {
                Some(Ok(slot)) => return Ok((RecvMem::Slot(slot), Some(bufs))),
                Some(Err(e)) => return Err((e, bufs)),
                None => {}
            }
        }
        self.post_registered(bufs, wr_id)
    }

    /// Posts the one buffer of `bufs`, a buffer of `pool`, under the
    /// pool's key; its `Vec` carries it back at the completion.
    fn post_pooled(
        &self,
        mut bufs: Vec<BytesMut>,
        pool: Arc<PoolMr>,
        wr_id: u64,
    ) -> std::result::Result<(RecvMem, Option<Vec<BytesMut>>), RecvPostErr> {
        let Some(b) = bufs.pop() else {
            return Err((Error::Inval, bufs));
        };
        let dst = Dst::Pool(pool, b);
        let posted = dst.sge().and_then(|sge| {
            (self.post)(&RecvRequest {
                wr_id,
                sges: &[sge],
            })
        });
        let mrs = smallvec::smallvec![dst];
        match posted {
            Ok(()) => Ok((RecvMem::Registered { mrs, empty: bufs }, None)),
            Err(e) => Err((e, unregister_before(mrs, bufs))),
        }
    }

    fn post_registered(
        &self,
        bufs: Vec<BytesMut>,
        wr_id: u64,
    ) -> std::result::Result<(RecvMem, Option<Vec<BytesMut>>), RecvPostErr> {
        let mut mrs = RecvTargets::default();
        // The receive's own `Vec` carries the buffers back at the
        // completion (emptied here, zero-length buffers put back in it):
        // a receive into one pool buffer allocates no other.
        let mut carrier = bufs;
        let mut empty = Vec::new();
        let mut failed = None;
        for b in carrier.drain(..) {
            if b.is_empty() || failed.is_some() {
                empty.push(b);
                continue;
            }
            match Dst::new(self.pd, b, AccessFlags::LOCAL_WRITE) {
                Ok(mr) => mrs.push(mr),
                Err(e) => failed = Some(e),
            }
        }
        carrier.append(&mut empty);
        let posted = match (failed, mrs.as_slice()) {
            (Some(e), _) => Err(e),
            // One buffer, the usual case: its element on the stack.
            (None, [one]) => one.sge().and_then(|sge| {
                (self.post)(&RecvRequest {
                    wr_id,
                    sges: &[sge],
                })
            }),
            (None, many) => many
                .iter()
                .map(|m| m.sge())
                .collect::<Result<Vec<Sge<'_>>>>()
                .and_then(|sges| (self.post)(&RecvRequest { wr_id, sges: &sges })),
        };
        match posted {
            Ok(()) => Ok((
                RecvMem::Registered {
                    mrs,
                    empty: carrier,
                },
                None,
            )),
            Err(e) => Err((e, unregister_before(mrs, carrier))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_core::completion::OpDone;
    use weft_core::flags::OpFlags;

    fn op(len: usize) -> Inflight {
        let done = OpDone {
            context: len as u64,
            flags: OpFlags::SEND | OpFlags::MSG,
            report: false,
            cq: None,
            cntr: None,
            waiter: None,
        };
        Inflight {
            done,
            op: Held::SendInline { len },
        }
    }

    fn len_of(i: Option<Inflight>) -> Option<usize> {
        match i?.op {
            Held::SendInline { len } => Some(len),
            _ => None,
        }
    }

    fn quiet(len: usize) -> Inflight {
        Inflight {
            op: Held::SendQuiet { len },
            ..op(len)
        }
    }

    #[test]
    fn a_completion_ends_the_quiet_sends_before_it_and_no_other() {
        use super::super::complete::end_quiet_before;
        let mut q = InflightQueue::default();
        q.insert(1, quiet(1));
        q.insert(2, quiet(2));
        q.insert(3, op(3));
        q.insert(4, quiet(4));
        q.insert(5, op(5));
        assert_eq!(end_quiet_before(&mut q, 3), 2, "the two quiet sends ahead");
        assert_eq!(len_of(q.remove(3)), Some(3));
        // A quiet send that fails is reported by its own id: nothing
        // ahead of it is ended, and it is found.
        assert_eq!(end_quiet_before(&mut q, 4), 0);
        assert!(matches!(
            q.remove(4).map(|i| i.op),
            Some(Held::SendQuiet { len: 4 })
        ));
        // A signaled send at the front stops the sweep even for a later id.
        q.insert(6, quiet(6));
        assert_eq!(end_quiet_before(&mut q, 6), 0, "5 is ahead, unreported");
        assert_eq!(q.len(), 2);
        assert_eq!(len_of(q.remove(5)), Some(5));
        // A quiet send left at the back waits for the next completion.
        q.insert(7, op(7));
        assert_eq!(end_quiet_before(&mut q, 7), 1);
        assert_eq!(len_of(q.remove(7)), Some(7));
        assert!(q.is_empty());
    }

    #[test]
    fn inflight_queue_takes_the_oldest_and_finds_any_other() {
        let mut q = InflightQueue::default();
        for id in 1..=4 {
            q.insert(id, op(id as usize * 10));
        }
        assert_eq!(len_of(q.remove(1)), Some(10), "in post order");
        assert_eq!(len_of(q.remove(3)), Some(30), "out of order still found");
        assert_eq!(len_of(q.remove(3)), None, "once");
        assert_eq!(len_of(q.remove(9)), None, "never posted");
        assert_eq!(len_of(q.remove(2)), Some(20));
        assert_eq!(len_of(q.remove(4)), Some(40));
        assert!(q.is_empty());
    }
}
