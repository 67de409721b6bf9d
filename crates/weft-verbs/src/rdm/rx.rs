//! The completion side: arrivals in receive slots (matched, buffered, or
//! the end of a rendezvous), and the ends of sends and reads.
//!
//! An arrival is matched and, if nothing takes it, buffered under one hold
//! of the matcher lock, so a receive posted meanwhile cannot miss it.

use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use weft_core::completion::{CqEntry, CqErrEntry};
use weft_core::flags::OpFlags;
use weft_core::limits::UNEXPECTED_OVERHEAD;
use weft_core::provider::RecvReq;
pub(crate) use weft_core::recv_completion::{complete_peek, deliver, fail_recv};
use weft_core::soft_rx::Charge;
use weft_core::sync::lock;
use weft_core::tagmatch::MsgInfo;
use weft_core::{Error, Result};

use super::RDM_SLOT;
use super::{Conn, Deferred, Op, RdmShared, ReadJob, Sender, Unexp};
use crate::cq_poller::CqSink;
use crate::sys::{RecvRequest, WorkCompletion};
use weft_core::addr::{encode_sockaddr, FI_ADDR_NOTAVAIL};
use weft_core::recv_completion::{copy_in, deliver_unknown, RecvCtx};
use weft_core::wire::rdm::{Header, Op as WireOp, HDR};

/// [`deliver`], or for a sender not in the AV on an `FI_SOURCE_ERR`
/// endpoint the `AddrNotAvail` error entry that carries the message and
/// the sender's address (and as its source the handle, or user id, of the
/// key its connection proved). A sender inserted since the message
/// arrived is known by now.
pub(crate) fn deliver_from(
    ep: &RdmShared,
    req: RecvReq,
    info: MsgInfo,
    placed: usize,
    from: Sender,
) {
    deliver_from_via(ep, ep, req, info, placed, from);
}

/// [`deliver_from`] completing through `ctx` (`ep` as a delivery into a
/// registered part sees it, [`super::arriving::deliver_registered`]).
fn deliver_from_via(
    ep: &RdmShared,
    ctx: &dyn RecvCtx,
    req: RecvReq,
    mut info: MsgInfo,
    placed: usize,
    from: Sender,
) {
    if ep.source_err && info.src == FI_ADDR_NOTAVAIL {
        info.src = ep.resolve_src(&from.addr, from.key);
        if info.src == FI_ADDR_NOTAVAIL {
            let reported = ep.key_reported(from.key);
            deliver_unknown(
                ctx,
                req,
                info,
                placed,
                reported,
                encode_sockaddr(&from.addr),
            );
            return;
        }
    }
    deliver(ctx, req, info, placed);
}

/// Copies a whole message into a receive and completes it as
/// [`deliver_from`] does.
pub(crate) fn copy_and_deliver_from(
    ep: &RdmShared,
    req: RecvReq,
    info: MsgInfo,
    data: &[u8],
    from: Sender,
) {
    copy_and_deliver_registered(ep, req, info, data, from, None);
}

/// The error a receive fails with when its message could not be had
/// for `e`: never `AddrNotAvail`, which on a receive's entry means a
/// message from a sender not in the AV (`FI_SOURCE_ERR`) — a dropped
/// future or stream would give such an entry back as a message.
fn recv_error(e: Error) -> Error {
    match e {
        Error::AddrNotAvail => Error::ConnReset,
        e => e,
    }
}

/// Fails a receive (`arriving` may register it) that took a message it
/// will not have, for `e` ([`recv_error`]), unregistering it as its
/// error goes into its stream. Gives nothing back (a failure whose slot
/// is closed is dropped), so it may run under the peers' lock.
pub(crate) fn fail_registered(
    ep: &RdmShared,
    arriving: Option<super::arriving::Guard>,
    req: RecvReq,
    info: MsgInfo,
    e: Error,
) {
    let e = recv_error(e);
    super::arriving::deliver_registered(ep, arriving, |ctx| fail_recv(ctx, req, info, 0, e));
}

/// [`copy_and_deliver_from`] into a receive `arriving` may register, as
/// [`super::arriving::deliver_registered`] delivers.
pub(crate) fn copy_and_deliver_registered(
    ep: &RdmShared,
    mut req: RecvReq,
    info: MsgInfo,
    data: &[u8],
    from: Sender,
    arriving: Option<super::arriving::Guard>,
) {
    let placed = copy_in(&mut req, data);
    super::arriving::deliver_registered(ep, arriving, |ctx| {
        deliver_from_via(ep, ctx, req, info, placed, from);
    });
}

/// Most bytes pulled for one unexpected delivery-complete message; a
/// larger one waits at the sender for its receive (its send then
/// completes when it is matched, later but never falsely).
const PULL_MAX: u64 = 64 << 20;

/// An unexpected message being pulled from its sender.
#[derive(Debug)]
pub(crate) struct Pull {
    st: Mutex<PullState>,
    from: Sender,
    /// The receive context it is held on, if a scalable endpoint's:
    /// where it ends, whoever sees its read finish.
    pub(crate) owner: std::sync::OnceLock<std::sync::Weak<RdmShared>>,
}

#[derive(Debug, Default)]
struct PullState {
    /// The payload once read (or why it could not be).
    data: Option<std::result::Result<BytesMut, Error>>,
    /// A receive that matched it before the read finished.
    waiter: Option<Waiting>,
}

/// A receive waiting for a pulled message's bytes.
#[derive(Debug)]
struct Waiting {
    req: RecvReq,
    info: MsgInfo,
    claimed: bool,
    /// Registers it while it waits, if it is a part of an awaited
    /// multi-receive buffer (`super::arriving`).
    arriving: Option<super::arriving::Guard>,
}

impl Pull {
    /// A pull of a message `from` sent.
    pub(crate) fn new(from: Sender) -> Pull {
        Pull {
            st: Mutex::new(PullState::default()),
            from,
            owner: std::sync::OnceLock::new(),
        }
    }

    /// A pull of a message `from` sent, held on `ep`: a receive
    /// context's is owned by it, so it ends there whoever sees its read
    /// finish (the scalable endpoint's CQ driver, a close).
    pub(crate) fn held_on(ep: &RdmShared, from: Sender) -> Arc<Pull> {
        let pull = Arc::new(Pull::new(from));
        if ep.rxc_closed.is_some() {
            let _ = pull.owner.set(ep.me.clone());
        }
        pull
    }

    /// The read ended. Takes the matcher's lock (and, through a receive
    /// going back to it, the peers'), and the registry of arriving parts'
    /// (delivering into a waiting part): never call it holding any.
    pub(crate) fn finish(&self, ep: &RdmShared, r: std::result::Result<BytesMut, Error>) {
        let owner = self.owner.get().and_then(std::sync::Weak::upgrade);
        let ep = owner.as_deref().unwrap_or(ep);
        let failed = r.is_err();
        let waiter = {
            let mut g = lock(&self.st);
            match g.waiter.take() {
                Some(w) => Some((w, r)),
                None => {
                    g.data = Some(r);
                    None
                }
            }
        };
        match waiter {
            Some((w, r)) => self.hand(ep, w.req, w.info, w.claimed, r, w.arriving),
            None if failed => {
                // Nobody matched it and it will never arrive: it leaves
                // the unexpected queue rather than wait there for a
                // receive to reject it. One matched meanwhile finds the
                // error instead (and its receive goes on).
                let me: *const Pull = self;
                let gone = lock(&ep.side.matcher).remove_unexpected(
                    |h| matches!(&h.u, Unexp::Pull(p) if std::ptr::eq(Arc::as_ptr(p), me)),
                );
                drop(gone);
            }
            None => {}
        }
    }

    /// A receive matched it. Takes the registry of arriving parts', the
    /// matcher's and (a receive going back to the matcher, a read
    /// started) the peers' locks: never call it holding any.
    pub(crate) fn matched(&self, ep: &RdmShared, req: RecvReq, info: MsgInfo, claimed: bool) {
        // Registered before the look: a part never waits unregistered.
        let arriving = ep.register_arriving(&req, info, self.from.addr);
        self.matched_as(ep, req, info, claimed, arriving);
    }

    /// [`matched`](Self::matched) of a receive that `arriving` registers
    /// already, if it is a part of an awaited buffer.
    pub(crate) fn matched_as(
        &self,
        ep: &RdmShared,
        req: RecvReq,
        info: MsgInfo,
        claimed: bool,
        arriving: Option<super::arriving::Guard>,
    ) {
        let r = {
            let mut g = lock(&self.st);
            match g.data.take() {
                Some(r) => r,
                None => {
                    g.waiter = Some(Waiting {
                        req,
                        info,
                        claimed,
                        arriving,
                    });
                    return;
                }
            }
        };
        self.hand(ep, req, info, claimed, r, arriving);
    }

    /// Ends the receive that took it; its part, if `arriving` registers
    /// one, is unregistered as the message goes into its stream.
    fn hand(
        &self,
        ep: &RdmShared,
        req: RecvReq,
        info: MsgInfo,
        claimed: bool,
        r: std::result::Result<BytesMut, Error>,
        arriving: Option<super::arriving::Guard>,
    ) {
        match r {
            Ok(d) => copy_and_deliver_registered(ep, req, info, &d, self.from, arriving),
            Err(e) if claimed => fail_registered(ep, arriving, req, info, e),
            // Never delivered: the receive goes on to the next message,
            // ahead of those posted after it (a part leaves its range
            // unused, and the registry first).
            Err(_) => {
                drop(arriving);
                ep.repost_front(req);
            }
        }
    }
}

impl RdmShared {
    /// Puts receive slot `slot` (back) on its lane's shared receive
    /// queue.
    pub(crate) fn post_slot(&self, slot: u32) -> Result<()> {
        let (lane, local) = self.slot_lane(slot).ok_or(Error::Inval)?;
        let wr_id = self.wr_id();
        let mut g = lock(&self.inflight);
        lane.recv_pool.with(|mr| {
            let sge = mr.sge(lane.recv_pool.offset(local), RDM_SLOT)?;
            lane.srq.post_recv(&RecvRequest {
                wr_id,
                sges: &[sge],
            })
        })?;
        g.insert(wr_id, Op::Slot { slot });
        Ok(())
    }

    pub(crate) fn repost_slot(&self, slot: u32) {
        // The endpoint's, not a receive context's state: slots are shared.
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        if let Err(e) = self.post_slot(slot) {
            tracing::warn!(error = %e, "cannot repost a receive slot");
        }
    }

    fn on_arrival(&self, wc: &WorkCompletion, slot: u32) {
        if !wc.is_ok() {
            self.repost_slot(slot);
            return;
        }
        let n = wc.byte_len as usize;
        let base = self.slot_offset(slot);
        // A bare eager message (immediate data, no header) is all payload:
        // `head` is where the payload starts.
        let (hdr, head) = match wc.imm_data {
            Some(imm) => (Header::from_bare(imm, n as u64), 0),
            None if n >= HDR => {
                let mut hb = [0u8; HDR];
                let h = self
                    .read_slots(base, &mut hb)
                    .and_then(|()| Header::decode(&hb));
                (h, HDR)
            }
            None => (Err(Error::Io), HDR),
        };
        let conn = lock(&self.by_qp).get(&wc.qp_num).cloned();
        let (hdr, conn) = match (hdr, conn) {
            (Ok(h), Some(c)) => {
                c.probe.heard();
                (h, c)
            }
            (Err(e), _) => {
                tracing::warn!(qp = wc.qp_num, len = n, error = %e, "malformed message dropped");
                self.repost_slot(slot);
                return;
            }
            (Ok(_), None) => {
                // Its connection was torn down after the message landed.
                self.repost_slot(slot);
                return;
            }
        };
        let rxc = match hdr.op {
            WireOp::Eager | WireOp::Rts => match self.target(&hdr) {
                super::scalable::Target::Here => None,
                super::scalable::Target::Ctx(l) => Some(l),
                super::scalable::Target::Drop => {
                    self.repost_slot(slot);
                    self.bad_ctx(&hdr, &conn);
                    return;
                }
            },
            _ => None,
        };
        let at: &RdmShared = rxc.as_deref().unwrap_or(self);
        match hdr.op {
            WireOp::Eager => at.on_eager(slot, base + head, n - head, hdr, conn),
            WireOp::Rts => at.on_rts(slot, hdr, conn),
            WireOp::Fin => {
                self.repost_slot(slot);
                self.on_fin(&hdr, &conn, wc.invalidated_rkey);
            }
            WireOp::WriteData => {
                self.repost_slot(slot);
                self.on_write_data(&hdr, &conn);
            }
        }
    }

    /// A message of `plen` bytes whole in `slot`, its payload at region
    /// offset `data`: to the receive it matches, or buffered.
    fn on_eager(&self, slot: u32, data: usize, plen: usize, hdr: Header, conn: Arc<Conn>) {
        if hdr.len != plen as u64 {
            tracing::warn!(peer = %conn.peer, "eager message length mismatch; dropped");
            self.repost_slot(slot);
            return;
        }
        let info = self.info_of(&conn, &hdr, plen);
        // Multi-receive buffers it did not fit are released once the
        // matcher's lock is let go, before the message completes.
        let mut ended = Vec::new();
        let mut m = lock(&self.side.matcher);
        match super::multi::match_arrival(&mut m, &info, &mut ended) {
            Some(mut req) => {
                drop(m);
                self.report_here(&mut req);
                self.end_buffers(ended);
                let req = self.copy_from_slot(req, data, plen);
                self.repost_slot(slot);
                let placed = plen.min(req.capacity());
                deliver_from(self, req, info, placed, conn.sender());
            }
            None => {
                let charge = Charge::try_new(
                    &self.side.unexp,
                    plen + UNEXPECTED_OVERHEAD,
                    self.side.limit,
                );
                let Some(charge) = charge else {
                    // Past the context's budget: the message stays in its
                    // slot, which is not reposted. Once every slot is
                    // held, the peers' sends wait (RNR retries) until
                    // receives free slots.
                    let hold = super::srx::SlotHold::new(self, slot, data, plen);
                    let held = self.held(Unexp::Slot(hold, conn.sender()), None);
                    m.push_unexpected(self.src(conn.peer, conn.key()), info, held);
                    drop(m);
                    self.end_buffers(ended);
                    if hdr.ack {
                        self.send_fin(&conn, &hdr, false);
                    }
                    return;
                };
                let mut copy = vec![0u8; plen];
                let ok = self.read_slots(data, &mut copy);
                if ok.is_ok() {
                    let held = self.held(Unexp::Eager(copy.into(), conn.sender()), Some(charge));
                    m.push_unexpected(self.src(conn.peer, conn.key()), info, held);
                }
                drop(m);
                self.end_buffers(ended);
                self.repost_slot(slot);
            }
        }
        if hdr.ack {
            self.send_fin(&conn, &hdr, false);
        }
    }

    /// A request-to-send (in `slot`): read now for the receive it
    /// matches, pull at once for a delivery-complete send, or remember
    /// the announcement. A held announcement is charged its header and a
    /// pull its payload too, against a shared context's budget as a
    /// copied message is: one that does not fit keeps its slot (not
    /// reposted) until a receive takes it, so that, as for eager
    /// messages, the peers' sends wait in RNR retries once every slot is
    /// held, rather than the context holding more than its budget.
    fn on_rts(&self, slot: u32, hdr: Header, conn: Arc<Conn>) {
        let info = self.info_of(&conn, &hdr, hdr.len as usize);
        let mut ended = Vec::new();
        let mut m = lock(&self.side.matcher);
        let matched = super::multi::match_arrival(&mut m, &info, &mut ended);
        let pulled = hdr.ack && hdr.len <= PULL_MAX;
        let charge = matched.is_none().then(|| {
            let n = if pulled { info.len } else { 0 };
            Charge::try_new(
                &self.side.unexp,
                n.saturating_add(UNEXPECTED_OVERHEAD),
                self.side.limit,
            )
        });
        match (matched, charge) {
            (Some(mut req), _) => {
                drop(m);
                self.repost_slot(slot);
                self.report_here(&mut req);
                self.end_buffers(ended);
                self.start_read(ReadJob {
                    seq: self.wr_id(),
                    req,
                    info,
                    hdr,
                    conn,
                    arriving: None,
                    rxc: None,
                });
            }
            (None, Some(Some(charge))) if pulled => {
                // Delivery-complete: fetch it now, answer once here.
                let pull = Pull::held_on(self, conn.sender());
                let held = self.held(Unexp::Pull(pull.clone()), Some(charge));
                m.push_unexpected(self.src(conn.peer, conn.key()), info, held);
                drop(m);
                self.repost_slot(slot);
                self.end_buffers(ended);
                let mut peers = lock(&self.peers);
                match peers.get_mut(&conn.peer) {
                    Some(p) => self.submit_locked(p, Deferred::Pull(pull, hdr, conn)),
                    None => {
                        drop(peers);
                        pull.finish(self, Err(Error::ConnReset));
                    }
                }
            }
            (None, Some(Some(charge))) => {
                let src = self.src(conn.peer, conn.key());
                m.push_unexpected(src, info, self.held(Unexp::Rts { conn, hdr }, Some(charge)));
                drop(m);
                self.repost_slot(slot);
                self.end_buffers(ended);
            }
            (None, _) => {
                // Past the budget: held uncharged, in its slot.
                let src = self.src(conn.peer, conn.key());
                let hold = super::srx::SlotHold::new(self, slot, 0, 0);
                m.push_unexpected(src, info, self.held_in_slot(Unexp::Rts { conn, hdr }, hold));
                drop(m);
                self.end_buffers(ended);
            }
        }
    }

    /// The peer is done with one of our announced buffers: the send ends.
    /// A window it revoked with the answer (`invalidated`) goes back to
    /// the pool with its slot.
    fn on_fin(&self, hdr: &Header, conn: &Conn, invalidated: Option<u32>) {
        let r = lock(&self.rndv).remove(&hdr.cookie);
        match r {
            Some(mut r) if r.conn.peer == conn.peer => {
                if let Some(loan) = r.loan.take() {
                    loan.settle(invalidated);
                }
                self.tx.release(1);
                if hdr.failed {
                    // Nothing took it: the receiver has no such context.
                    let e = if hdr.no_ctx {
                        Error::AddrNotAvail
                    } else {
                        Error::RemoteIo
                    };
                    r.done.fail(CqErrEntry::new(0, OpFlags::SEND, e));
                } else {
                    r.done.complete(CqEntry {
                        len: r.len,
                        ..CqEntry::default()
                    });
                }
            }
            Some(r) => {
                // Not this peer's transfer: put it back untouched.
                lock(&self.rndv).insert(hdr.cookie, r);
                tracing::warn!(peer = %conn.peer, "finished note for another peer's transfer");
            }
            None => {}
        }
    }

    /// The write this note follows landed (RC order): report it on the
    /// receive CQ, as fi_writedata's target completion.
    fn on_write_data(&self, hdr: &Header, conn: &Conn) {
        if let Some(cq) = &self.cfg.rx_cq {
            cq.push(Ok(CqEntry {
                context: 0,
                flags: OpFlags::RMA | OpFlags::REMOTE_WRITE | OpFlags::REMOTE_CQ_DATA,
                len: hdr.len as usize,
                bufs: Vec::new(),
                data: hdr.data.unwrap_or(0),
                tag: 0,
                src: self.reported_addr(self.resolve_src(&conn.peer, conn.key())),
            }));
        }
    }

    fn info_of(&self, conn: &Conn, h: &Header, len: usize) -> MsgInfo {
        MsgInfo {
            key: conn.key(),
            src: self.resolve_src(&conn.peer, conn.key()),
            tagged: h.tagged,
            tag: h.tag,
            len,
            data: h.data,
        }
    }

    /// Copies up to `len` bytes at `off` of the receive region into the
    /// receive's buffers.
    pub(crate) fn copy_from_slot(&self, mut req: RecvReq, off: usize, len: usize) -> RecvReq {
        // A copy cut short leaves the receive short of bytes; its length
        // check reports that.
        if let Ok((lane, at)) = self.slot_region(off) {
            let _ = lane.recv_pool.scatter(at, len, &mut req.bufs);
        }
        req
    }

    fn on_read_done(
        &self,
        wc: &WorkCompletion,
        mut job: ReadJob,
        into: super::ReadInto,
        placed: usize,
    ) {
        let mut lost = false;
        match into {
            super::ReadInto::Registered(mrs) => {
                let mut bufs: Vec<BytesMut> = Vec::with_capacity(mrs.len() + job.req.bufs.len());
                for m in mrs {
                    match m.into_inner() {
                        Ok(b) => bufs.push(b),
                        Err(_) => lost = true,
                    }
                }
                bufs.append(&mut job.req.bufs);
                job.req.bufs = bufs;
            }
            // A failed read lands nothing (the error below decides).
            super::ReadInto::Staged(loan) => {
                lost = !loan.land(wc.to_error().is_none(), placed, &mut job.req.bufs);
            }
        }
        let from = job.conn.sender();
        let (conn, hdr) = (job.conn.clone(), job.hdr);
        match (wc.to_error(), lost) {
            (None, false) => {
                let (req, info) = (job.req, job.info);
                super::arriving::deliver_registered(self, job.arriving.take(), |ctx| {
                    deliver_from_via(self, ctx, req, info, placed, from);
                });
                self.send_fin(&conn, &hdr, false);
            }
            // The connection is dead (the failed completion killed it):
            // the message is gone with it, the receive goes on.
            (Some(_), _) => self.orphan(job),
            (None, true) => {
                fail_registered(self, job.arriving.take(), job.req, job.info, Error::Io);
                self.send_fin(&conn, &hdr, true);
            }
        }
    }
}

impl CqSink for RdmShared {
    fn on_completion(&self, wc: &WorkCompletion) {
        let Some(op) = lock(&self.inflight).remove(&wc.wr_id) else {
            return;
        };
        // An RC queue pair is in the error state after its first failed
        // completion (everything after it is flushed): the connection is
        // dead, whoever is at fault (a peer that left, a bad key from
        // either side). It goes before the operation completes, so that
        // whatever the application posts on seeing the error finds no
        // connection and the next operation to the peer connects anew.
        if let Some(c) = op.conn() {
            c.probe.heard();
        }
        if wc.to_error().is_some() {
            if let (Some(c), Some(ep)) = (op.conn(), self.me.upgrade()) {
                super::peers::kill(&ep, c, Error::ConnReset);
            }
        }
        match op {
            Op::Slot { slot } => return self.on_arrival(wc, slot),
            Op::Send {
                done,
                len,
                held,
                conn,
            } => {
                self.release_wr(&conn, held);
                self.tx.release(1);
                match wc.to_error() {
                    None => done.complete(CqEntry {
                        len,
                        ..CqEntry::default()
                    }),
                    Some(e) => done.fail(CqErrEntry::new(0, OpFlags::SEND, e)),
                }
            }
            Op::Rts { cookie, held, conn } => {
                self.release_wr(&conn, held);
                if let Some(e) = wc.to_error() {
                    let r = lock(&self.rndv).remove(&cookie);
                    if let Some(r) = r {
                        self.tx.release(1);
                        r.done.fail(CqErrEntry::new(0, OpFlags::SEND, e));
                    }
                }
            }
            Op::Fin { held, conn } => self.release_wr(&conn, held),
            Op::Probe { conn } => {
                self.release_wr(&conn, super::TxHeld::Inline);
                conn.probe.landed();
            }
            Op::Pull {
                pull,
                hdr,
                into,
                conn,
            } => {
                self.release_wr(&conn, super::TxHeld::Inline);
                let r = match (wc.to_error(), into) {
                    (None, super::PullInto::Registered(mr)) => mr.into_inner(),
                    (err, super::PullInto::Staged(loan)) => {
                        let mut b = [BytesMut::zeroed(hdr.len as usize)];
                        let len = b[0].len();
                        match (loan.land(err.is_none(), len, &mut b), err) {
                            (_, Some(e)) => Err(e),
                            (true, None) => Ok(std::mem::take(&mut b[0])),
                            (false, None) => Err(Error::Io),
                        }
                    }
                    (Some(e), super::PullInto::Registered(_)) => Err(e),
                };
                let failed = r.is_err();
                pull.finish(self, r);
                self.send_fin(&conn, &hdr, failed);
            }
            Op::Read {
                job,
                into,
                placed,
                conn,
            } => {
                self.release_wr(&conn, super::TxHeld::Inline);
                conn.reads.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                let rxc = job.rxc.clone();
                rxc.as_deref()
                    .unwrap_or(self)
                    .on_read_done(wc, job, into, placed);
                if conn.is_dead() {
                    self.settle_orphans(&conn);
                }
            }
            Op::Rma(op) => self.on_rma_done(wc, op),
            Op::RmaPart { held, conn, then } => {
                self.on_rma_part_done(wc, &conn, then);
                drop(held);
            }
        }
        self.flush_backlogs();
    }
}
