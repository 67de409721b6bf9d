//! Everything that goes on a send queue: eager sends, requests-to-send,
//! "finished" notes and rendezvous reads. Each takes a send-queue credit
//! of its connection and of the endpoint (the shared CQ's room); without
//! them, or without a connection, it waits in the peer's backlog, in
//! order.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use bytes::{Bytes, BytesMut};
use weft_core::completion::CqErrEntry;
use weft_core::flags::OpFlags;
use weft_core::provider::SendReq;
use weft_core::sync::lock;
use weft_core::{Error, Result};

use super::RDM_SLOT;
use super::{rx, Conn, Deferred, Op, PeerState, RdmShared, ReadJob, RndvSend, TxHeld, QP_INLINE};
use crate::local_mem::{all_pooled, Dst};
use crate::slot_pool::{Loan, SlotPool};
use crate::sys::{AccessFlags, BytesMr, BytesMutMr, Payload, SendFlags, SendOp, SendRequest, Sge};
use crate::user_bufs::wr_flags;
use weft_core::wire::rdm::{Header, Op as WireOp, HDR};

/// Largest payload sent eagerly: what fits a receive slot beside the header.
pub const EAGER_MAX: usize = RDM_SLOT - HDR;

/// The inject size an RDM endpoint offers for a device whose QPs take
/// `max_inline` bytes inline.
pub fn inject_size(max_inline: usize) -> usize {
    max_inline.min(QP_INLINE).saturating_sub(HDR)
}

/// A post that did not happen: `None` means "no room yet, keep it".
type NotPosted = (Deferred, Option<Error>);

impl RdmShared {
    /// Sends or queues `item` (a send or RMA operation whose credit is
    /// taken) to the peer at `dest` under the key of `lane`, connecting
    /// first if needed. While the peer's connection (or the one being
    /// made) is under another key, the item fails with `KeyRejected`
    /// instead of crossing jobs.
    pub(crate) fn submit_to(&self, dest: SocketAddr, lane: usize, item: Deferred) {
        let mut peers = lock(&self.peers);
        let p = peers.entry(dest).or_default();
        if p.lane != lane {
            if !p.is_empty() {
                drop(peers);
                self.fail_item(item, Error::KeyRejected);
                return;
            }
            p.lane = lane;
        }
        self.submit_locked(p, item);
        if p.conn.is_none() && !p.connecting && !p.accepting {
            p.connecting = true;
            drop(peers);
            super::peers::connect(self, dest, lane);
        }
    }

    /// Posts `item` to the peer's connection if nothing waits before it,
    /// else queues it.
    pub(crate) fn submit_locked(&self, p: &mut PeerState, item: Deferred) {
        let item = match (&p.conn, p.pending.is_empty()) {
            (Some(c), true) => match self.try_post(c, item) {
                Ok(()) => return,
                Err((item, None)) => item,
                Err((item, Some(e))) => {
                    self.fail_item(item, e);
                    return;
                }
            },
            _ => item,
        };
        p.pending.push_back(item);
        self.backlogged.fetch_add(1, Ordering::AcqRel);
    }

    /// Posts as much of the peer's backlog as fits.
    pub(crate) fn flush_locked(&self, p: &mut PeerState) {
        let Some(c) = p.conn.clone() else { return };
        while let Some(item) = p.pending.pop_front() {
            match self.try_post(&c, item) {
                Ok(()) => {}
                Err((item, None)) => {
                    p.pending.push_front(item);
                    return;
                }
                Err((item, Some(e))) => self.fail_item(item, e),
            }
            self.backlogged.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// After a send-side completion gave credits back: anything waiting
    /// for room goes out now.
    pub(crate) fn flush_backlogs(&self) {
        if self.backlogged.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut peers = lock(&self.peers);
        for p in peers.values_mut() {
            if !p.pending.is_empty() {
                self.flush_locked(p);
            }
        }
    }

    /// Ends an item that cannot be posted. Safe under the peers' lock:
    /// what would take it again (a receive going back to the matcher)
    /// happens in a task.
    pub(crate) fn fail_item(&self, item: Deferred, err: Error) {
        match item {
            Deferred::Send(req) => {
                self.tx.release(1);
                let kind = OpFlags::SEND | OpFlags::msg_or_tagged(req.tag.is_some());
                let mut e = CqErrEntry::new(0, kind, err);
                e.tag = req.tag.unwrap_or(0);
                req.done.fail(e);
            }
            // The peer is unreachable: nobody is left to tell.
            Deferred::Fin(..) => {}
            // Its connection is gone: the message with it.
            Deferred::Read(job) if job.conn.is_dead() => {
                let c = job.conn.clone();
                self.orphan(*job);
                self.settle_orphans_soon(&c);
            }
            // The receive's buffers could not be registered, or the like.
            Deferred::Read(job) => {
                // Never `AddrNotAvail` (`fail_registered`): a drop of the
                // stream or future would give such an entry back as a
                // message. Nothing is given back here, under the peers'
                // lock, as it must not be (a give-back may start a read,
                // which takes that lock).
                let ReadJob {
                    req,
                    info,
                    arriving,
                    rxc,
                    ..
                } = *job;
                let at = rxc.as_deref().unwrap_or(self);
                rx::fail_registered(at, arriving, req, info, err);
            }
            Deferred::Pull(pull, ..) => {
                if let Some(ep) = self.me.upgrade() {
                    self.rt.spawn(async move { pull.finish(&ep, Err(err)) });
                }
            }
            Deferred::Rma(req) => self.fail_rma(req, err),
        }
    }

    pub(super) fn take_credits(&self, c: &Conn) -> bool {
        if !c.sq.try_take() {
            return false;
        }
        if !self.ep_sq.try_take() {
            c.sq.release(1);
            return false;
        }
        true
    }

    /// Gives back the send-queue credits of one completed work request.
    pub(crate) fn release_wr(&self, c: &Conn, held: TxHeld) {
        if let TxHeld::Slot(s) = held {
            c.lane.send_pool.put(s);
        }
        c.sq.release(1);
        self.ep_sq.release(1);
    }

    fn try_post(&self, c: &Arc<Conn>, item: Deferred) -> std::result::Result<(), NotPosted> {
        if c.is_dead() {
            return Err((item, Some(Error::ConnReset)));
        }
        // A read of a message announced on another connection: that one
        // is dead or about to be killed (only the peer's current
        // connection lives on), its sender fails the send with it, and
        // the data cannot be read through this one.
        let cut_off = match &item {
            Deferred::Read(job) => !Arc::ptr_eq(&job.conn, c) || job.conn.is_dead(),
            Deferred::Pull(_, _, from) => !Arc::ptr_eq(from, c) || from.is_dead(),
            _ => false,
        };
        if cut_off {
            match item {
                Deferred::Read(job) => {
                    let from = job.conn.clone();
                    self.orphan(*job);
                    self.settle_orphans_soon(&from);
                }
                other => self.fail_item(other, Error::ConnReset),
            }
            return Ok(());
        }
        if !self.take_credits(c) {
            return Err((item, None));
        }
        let r = match item {
            Deferred::Send(req) => self
                .post_send_on(c, req)
                .map_err(|(e, r)| (Deferred::Send(r), e)),
            Deferred::Fin(h, from) => self
                .post_fin_on(c, h, &from)
                .map_err(|e| (Deferred::Fin(h, from), e)),
            Deferred::Read(job) => self
                .post_read_on(c, *job)
                .map_err(|(e, j)| (Deferred::Read(Box::new(j)), e)),
            Deferred::Pull(pull, h, from) => self
                .post_pull_on(c, &pull, h)
                .map_err(|e| (Deferred::Pull(pull, h, from), e)),
            Deferred::Rma(req) => self
                .post_rma_on(c, req)
                .map_err(|(e, r)| (Deferred::Rma(r), e)),
        };
        r.map_err(|(item, e)| {
            c.sq.release(1);
            self.ep_sq.release(1);
            (item, Some(e))
        })
    }

    /// Posts the header (and payload) as one send: inline when it fits,
    /// else through a bounce slot, else from a registered copy. A header
    /// the peer takes bare goes as the send's immediate data instead.
    fn post_msg(
        &self,
        c: &Conn,
        (wr_id, flags): (u64, SendFlags),
        h: &Header,
        payload: &[Bytes],
    ) -> Result<TxHeld> {
        let bare = if c.takes_bare() { h.bare_imm() } else { None };
        let enc;
        let (head, op): (&[u8], SendOp) = match bare {
            Some(imm) => (&[], SendOp::SendWithImm(imm)),
            None => {
                enc = h.encode();
                // A window's "finished" revokes it as it arrives.
                let op = if h.op == WireOp::Fin && h.window {
                    SendOp::SendWithInv(h.rkey)
                } else {
                    SendOp::Send
                };
                (&enc, op)
            }
        };
        let len = head.len() + payload.iter().map(|b| b.len()).sum::<usize>();
        let post = |p: Payload<'_>| c.qp.post_send(&SendRequest::new(wr_id, op, p).flags(flags));
        if len <= c.inline_max().min(QP_INLINE) {
            let mut buf = [0u8; QP_INLINE];
            buf[..head.len()].copy_from_slice(head);
            let mut off = head.len();
            for b in payload {
                buf[off..off + b.len()].copy_from_slice(b);
                off += b.len();
            }
            post(Payload::Inline(&buf[..len]))?;
            return Ok(TxHeld::Inline);
        }
        if len <= RDM_SLOT {
            if let Some(slot) = c.lane.send_pool.take() {
                let parts = std::iter::once(head).chain(payload.iter().map(|b| &b[..]));
                c.lane
                    .send_pool
                    .post_from(slot, parts, |sge| post(Payload::Sges(&[sge])))?;
                return Ok(TxHeld::Slot(slot));
            }
        }
        let mut v = BytesMut::with_capacity(len);
        v.extend_from_slice(head);
        for b in payload {
            v.extend_from_slice(b);
        }
        let mr = BytesMr::new(&c.lane.pd, v.freeze(), AccessFlags::NONE)?;
        post(Payload::Sges(&[mr.sge()?]))?;
        Ok(TxHeld::Registered(mr))
    }

    fn post_send_on(
        &self,
        c: &Arc<Conn>,
        mut req: SendReq,
    ) -> std::result::Result<(), (Error, SendReq)> {
        let len = req.len();
        let mut h = Header::new(WireOp::Eager);
        h.tagged = req.tag.is_some();
        h.tag = req.tag.unwrap_or(0);
        h.data = req.data;
        h.len = len as u64;
        h.rx_ctx = self.rx_ctx_of(req.dest);
        let wr_id = self.wr_id();
        // Delivery-complete: done when the receiver says the message is
        // matched or buffered, not when the device acknowledges it.
        h.ack = req.flags.contains(OpFlags::DELIVERY_COMPLETE);
        if len <= EAGER_MAX && h.ack {
            h.cookie = wr_id;
            let iov = std::mem::take(&mut req.iov);
            let payload = iov.clone();
            return self.post_announced(c, &h, &payload, req, iov, None);
        }
        if len <= EAGER_MAX {
            let mut g = lock(&self.inflight);
            return match self.post_msg(c, (wr_id, wr_flags(req.flags)), &h, &req.iov) {
                Ok(held) => {
                    // The device has what it needs (copied or registered):
                    // the caller's buffers go now, not at completion.
                    g.insert(
                        wr_id,
                        Op::Send {
                            done: req.done,
                            len,
                            held,
                            conn: c.clone(),
                        },
                    );
                    Ok(())
                }
                Err(e) => Err((e, req)),
            };
        }
        h.cookie = wr_id;
        // Rendezvous. A buffer the registration cache holds goes from
        // there: no copy, no system call. Any other payload that fits a
        // source slot is copied there and read through a window, as rxm
        // copies through bounce buffers at these sizes: registering it
        // would cost two system calls that pin and unpin its pages.
        let windowed = super::windows::fits(c, len);
        let hit = match &req.iov[..] {
            [b] if windowed => {
                crate::user_bufs::cached_hit(c.lane.cache.as_ref(), b, AccessFlags::REMOTE_READ)
            }
            _ => None,
        };
        if windowed && hit.is_none() {
            if let Some(loan) = c.lane.sources.as_ref().and_then(|s| s.take()) {
                return self.post_windowed(c, h, req, loan);
            }
        }
        // Otherwise the peer reads the payload from our registered copy
        // of the caller's bytes (one buffer, gathered if need be).
        let mr = match hit {
            Some(m) => m,
            None => {
                let data = crate::user_bufs::gather(&req.iov, len);
                match crate::user_bufs::cached_source(
                    c.lane.cache.as_ref(),
                    &c.lane.pd,
                    &data,
                    AccessFlags::REMOTE_READ,
                ) {
                    Ok(m) => m,
                    Err(e) => return Err((e, req)),
                }
            }
        };
        h.op = WireOp::Rts;
        h.addr = mr.addr();
        h.rkey = mr.rkey();
        let iov = std::mem::take(&mut req.iov);
        self.post_announced(c, &h, &[], req, iov, Some(mr))
    }

    /// Posts a request-to-send `h` whose payload, `req`'s bytes, is copied
    /// into the source slot `loan` and read through its window. The
    /// transfer's entry is made before the in-flight lock is let go, so
    /// the answer (whose completion takes that lock first) finds it.
    fn post_windowed(
        &self,
        c: &Arc<Conn>,
        mut h: Header,
        req: SendReq,
        mut loan: super::windows::SourceLoan,
    ) -> std::result::Result<(), (Error, SendReq)> {
        let wr_id = h.cookie;
        // The copy is made before the in-flight lock is taken: completions
        // wait for that lock.
        let len = match loan.fill(&req.iov) {
            Ok(n) => n,
            Err(e) => return Err((e, req)),
        };
        let mut g = lock(&self.inflight);
        if let Err(e) = loan.post(c, &mut h, (wr_id, wr_flags(req.flags))) {
            return Err((e, req));
        }
        // The caller's bytes are copied: they go now.
        let SendReq { done, .. } = req;
        lock(&self.rndv).insert(
            wr_id,
            RndvSend {
                done,
                len,
                _mr: None,
                loan: Some(loan),
                conn: c.clone(),
            },
        );
        g.insert(
            wr_id,
            Op::Rts {
                cookie: wr_id,
                held: TxHeld::Inline,
                conn: c.clone(),
            },
        );
        self.tx_windowed.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Posts a message whose send ends with the peer's "finished": `req`
    /// (without its payload, in `payload` or registered) goes to the
    /// rendezvous table first, so the answer always finds it; on failure
    /// the request comes back whole, with `iov` as its payload.
    fn post_announced(
        &self,
        c: &Arc<Conn>,
        h: &Header,
        payload: &[Bytes],
        req: SendReq,
        iov: weft_core::provider::Iov,
        mr: Option<Arc<BytesMr>>,
    ) -> std::result::Result<(), (Error, SendReq)> {
        let wr_id = h.cookie;
        // RDM takes frozen bytes (`takes_pool_sends` is false): nothing
        // the `..` below drops is a pool buffer the device may still read.
        debug_assert!(req.pool.is_none());
        let SendReq {
            dest,
            tag,
            data,
            flags,
            done,
            ..
        } = req;
        let len = iov.iter().map(|b| b.len()).sum();
        lock(&self.rndv).insert(
            wr_id,
            RndvSend {
                done,
                len,
                _mr: mr,
                loan: None,
                conn: c.clone(),
            },
        );
        let mut g = lock(&self.inflight);
        match self.post_msg(c, (wr_id, wr_flags(flags)), h, payload) {
            Ok(held) => {
                g.insert(
                    wr_id,
                    Op::Rts {
                        cookie: wr_id,
                        held,
                        conn: c.clone(),
                    },
                );
                Ok(())
            }
            Err(e) => {
                drop(g);
                let back = lock(&self.rndv).remove(&wr_id);
                match back {
                    Some(r) => Err((
                        e,
                        SendReq {
                            dest,
                            iov,
                            pool: None,
                            tag,
                            data,
                            flags,
                            done: r.done,
                        },
                    )),
                    // Unreachable in practice: nothing else removes an
                    // entry whose message was never posted.
                    None => Ok(()),
                }
            }
        }
    }

    /// Posts a "finished" on `c`; one for a window announced on another
    /// connection (`from`, now replaced) goes plain, since only the
    /// connection it is bound to can revoke it.
    fn post_fin_on(&self, c: &Arc<Conn>, mut h: Header, from: &Weak<Conn>) -> Result<()> {
        if h.window && !std::ptr::eq(from.as_ptr(), Arc::as_ptr(c)) {
            h.window = false;
            h.rkey = 0;
        }
        let wr_id = self.wr_id();
        let mut g = lock(&self.inflight);
        let held = self.post_msg(c, (wr_id, SendFlags::SIGNALED), &h, &[])?;
        g.insert(
            wr_id,
            Op::Fin {
                held,
                conn: c.clone(),
            },
        );
        Ok(())
    }

    /// Reads the announced payload into the receive's buffers (as much as
    /// they hold), registered for the read and owned by the in-flight
    /// table until it completes.
    fn post_read_on(
        &self,
        c: &Arc<Conn>,
        mut job: ReadJob,
    ) -> std::result::Result<(), (Error, ReadJob)> {
        let want = (job.hdr.len as usize).min(job.req.capacity());
        // Pool buffers need no registration: read into them directly.
        if want <= super::lanes::STAGE_MAX && !all_pooled(&c.lane.pd, &job.req.bufs) {
            if let Some(pool) = c.lane.stage_pool() {
                match self.post_staged_read(c, pool, job, want) {
                    Ok(()) => return Ok(()),
                    Err((Some(e), job)) => return Err((e, job)),
                    // No slot free: the receive's buffers are registered.
                    Err((None, j)) => job = j,
                }
            }
        }
        let bufs = std::mem::take(&mut job.req.bufs);
        let mut mrs = Vec::with_capacity(bufs.len());
        let mut failed = None;
        for b in bufs {
            if b.is_empty() || failed.is_some() {
                job.req.bufs.push(b);
                continue;
            }
            match Dst::new(&c.lane.pd, b, AccessFlags::LOCAL_WRITE) {
                Ok(m) => mrs.push(m),
                Err(e) => failed = Some(e),
            }
        }
        let give_back = |mrs: Vec<Dst>, mut job: ReadJob| {
            let mut v: Vec<BytesMut> = mrs
                .into_iter()
                .filter_map(|m| m.into_inner().ok())
                .collect();
            v.append(&mut job.req.bufs);
            job.req.bufs = v;
            job
        };
        if let Some(e) = failed {
            return Err((e, give_back(mrs, job)));
        }
        let wr_id = self.wr_id();
        let mut g = lock(&self.inflight);
        let posted = (|| {
            let mut sges: Vec<Sge<'_>> = Vec::with_capacity(mrs.len());
            let mut left = want;
            for m in &mrs {
                if left == 0 {
                    break;
                }
                let n = m.len().min(left);
                sges.push(m.sge_range(0, n)?);
                left -= n;
            }
            read_announced(c, &job.hdr, wr_id, &sges)
        })();
        match posted {
            Ok(()) => {
                c.reads.fetch_add(1, Ordering::AcqRel);
                g.insert(
                    wr_id,
                    Op::Read {
                        job,
                        into: super::ReadInto::Registered(mrs),
                        placed: want,
                        conn: c.clone(),
                    },
                );
                Ok(())
            }
            Err(e) => {
                drop(g);
                Err((e, give_back(mrs, job)))
            }
        }
    }

    /// Reads `want` bytes of the announced payload into a staging slot of
    /// `pool` (copied into the receive's buffers at completion). Gives the
    /// job back with no error when no slot is free.
    fn post_staged_read(
        &self,
        c: &Arc<Conn>,
        pool: &Arc<SlotPool>,
        job: ReadJob,
        want: usize,
    ) -> std::result::Result<(), (Option<Error>, ReadJob)> {
        let wr_id = self.wr_id();
        let mut g = lock(&self.inflight);
        let posted = pool.take_post(want, |sge| read_announced(c, &job.hdr, wr_id, &[sge]));
        match posted {
            None => Err((None, job)),
            Some(Err(e)) => Err((Some(e), job)),
            Some(Ok(slot)) => {
                c.reads.fetch_add(1, Ordering::AcqRel);
                g.insert(
                    wr_id,
                    Op::Read {
                        job,
                        into: super::ReadInto::Staged(Loan {
                            pool: pool.clone(),
                            slot,
                        }),
                        placed: want,
                        conn: c.clone(),
                    },
                );
                Ok(())
            }
        }
    }

    /// Reads an announced payload into a buffer of our own: through a
    /// staging slot up to [`super::lanes::STAGE_MAX`] when one is free,
    /// else into the buffer registered for the read.
    fn post_pull_on(&self, c: &Arc<Conn>, pull: &Arc<rx::Pull>, h: Header) -> Result<()> {
        let len = h.len as usize;
        let op = |into| Op::Pull {
            pull: pull.clone(),
            hdr: h,
            into,
            conn: c.clone(),
        };
        if len <= super::lanes::STAGE_MAX {
            if let Some(pool) = c.lane.stage_pool() {
                let wr_id = self.wr_id();
                let mut g = lock(&self.inflight);
                if let Some(slot) = pool.take_post(len, |sge| read_announced(c, &h, wr_id, &[sge]))
                {
                    let loan = Loan {
                        pool: pool.clone(),
                        slot: slot?,
                    };
                    g.insert(wr_id, op(super::PullInto::Staged(loan)));
                    return Ok(());
                }
            }
        }
        let buf = BytesMut::zeroed(len);
        let mr = BytesMutMr::new(&c.lane.pd, buf, AccessFlags::LOCAL_WRITE)?;
        let wr_id = self.wr_id();
        let mut g = lock(&self.inflight);
        read_announced(c, &h, wr_id, &[mr.sge()?])?;
        g.insert(wr_id, op(super::PullInto::Registered(mr)));
        Ok(())
    }

    /// A receive matched a request-to-send: read the payload (or, when the
    /// receive holds nothing, finish at once).
    pub(crate) fn start_read(&self, mut job: ReadJob) {
        // Its completion comes to the endpoint's CQ driver: a context's
        // read ends on the context (`scalable`).
        job.rxc = self.as_rxc();
        if job.hdr.len == 0 || job.req.capacity() == 0 {
            rx::deliver_from(self, job.req, job.info, 0, job.conn.sender());
            self.send_fin(&job.conn, &job.hdr, false);
            return;
        }
        let peer = job.conn.peer;
        job.arriving = self.register_arriving(&job.req, job.info, peer);
        let mut peers = lock(&self.peers);
        match peers.get_mut(&peer) {
            Some(p) if p.conn.is_some() || p.connecting || p.accepting => {
                self.submit_locked(p, Deferred::Read(Box::new(job)));
            }
            _ => {
                // The connection went (and the peer's entry with it).
                drop(peers);
                let from = job.conn.clone();
                self.orphan(job);
                self.settle_orphans_soon(&from);
            }
        }
    }

    /// The "finished" answering `of`: it revokes the window `of`
    /// announced, when windows are answered here.
    pub(crate) fn fin_of(&self, of: &Header, failed: bool) -> Header {
        let mut h = Header::new(WireOp::Fin);
        h.cookie = of.cookie;
        h.failed = failed;
        if of.window && of.op == WireOp::Rts && self.res.lanes.windows() {
            h.window = true;
            h.rkey = of.rkey;
        }
        h
    }

    /// Tells the peer a transfer announced (by `of`) on `from` is over:
    /// its buffer is free, its window revoked.
    pub(crate) fn send_fin(&self, from: &Arc<Conn>, of: &Header, failed: bool) {
        let h = self.fin_of(of, failed);
        self.send_note(from, h);
    }

    /// Queues the "finished" `h` for the transfer announced on `from`.
    pub(crate) fn send_note(&self, from: &Arc<Conn>, h: Header) {
        let mut peers = lock(&self.peers);
        if let Some(p) = peers.get_mut(&from.peer) {
            if p.conn.is_some() || p.connecting || p.accepting {
                self.submit_locked(p, Deferred::Fin(h, Arc::downgrade(from)));
            }
        }
    }
}

/// Posts the RDMA read of the payload announced by `h` into `sges`.
fn read_announced(c: &Conn, h: &Header, wr_id: u64, sges: &[Sge<'_>]) -> Result<()> {
    c.qp.post_send(&SendRequest::new(
        wr_id,
        SendOp::RdmaRead {
            remote_addr: h.addr,
            rkey: h.rkey,
        },
        Payload::Sges(sges),
    ))
}
