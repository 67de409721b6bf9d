//! RMA over a connection (`docs/wire.md` section 9.4): the initiator's
//! requests and their completions, and the target's side, which checks
//! every request against the domain's regions.
//!
//! A write travels as one `RmaWrite` frame and completes when the
//! target's `Ack` says whether it landed. A read is one `RmaReadReq`;
//! the target answers in `RmaReadResp` pieces of at most
//! [`READ_CHUNK`] bytes, each charged against the connection's share of
//! the receive budget until it is written, so a peer asking for more than
//! it reads stops being read (TCP back-pressure) instead of making the
//! target hold copies without bound. A request that fails its checks is
//! answered with `FI_EACCES` (or `FI_EMSGSIZE`), and the connection goes
//! on: one bad key costs the peer that operation, not its connection.
//! An access to a watched region (or through an endpoint with remote
//! counters) carries its `rma_events::Ticket` until it completes.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use weft_core::completion::{CqEntry, CqErrEntry, OpDone};
use weft_core::credits::Credits;
use weft_core::flags::OpFlags;
use weft_core::limits::UNEXPECTED_OVERHEAD;
use weft_core::provider::{Iov, Rejected, RmaOp, RmaReq};
use weft_core::sync::lock;
use weft_core::tagmatch::MsgInfo;
use weft_core::wire::rma::{ReadReq, Target, READ_CHUNK};
use weft_core::wire::{FrameKind, Header, FLAG_ACK_REQ, FLAG_CQ_DATA};
use weft_core::{Error, Result};

use crate::admission::Charge;
use crate::conn::Conn;
use crate::endpoint::EpShared;
use crate::frame::TxFrame;
use crate::mr::Region;
use crate::rma_events::{AccessKind, Ticket};

/// An initiator's read (or atomic) waiting for its answer: the buffers
/// it fills in order, how far the answer has come, and its completion.
#[derive(Debug)]
pub struct PendingRead {
    pub bufs: Vec<BytesMut>,
    /// Bytes asked for: the buffers' total length.
    pub len: usize,
    /// Bytes placed so far.
    pub got: usize,
    /// Where the next byte goes: buffer index and offset in it.
    pub seg: usize,
    pub off: usize,
    pub done: OpDone,
    /// An atomic's answer (elements of this type, little-endian on the
    /// wire) rather than a read's.
    pub atomic: Option<weft_core::atomic::Datatype>,
}

impl PendingRead {
    /// An answer of `bufs`' total length still to come, ending `done`;
    /// `atomic`: the element type of an atomic's answer.
    pub fn new(
        bufs: Vec<BytesMut>,
        done: OpDone,
        atomic: Option<weft_core::atomic::Datatype>,
    ) -> Box<PendingRead> {
        let len = bufs.iter().map(|b| b.len()).sum();
        Box::new(PendingRead {
            bufs,
            len,
            got: 0,
            seg: 0,
            off: 0,
            done,
            atomic,
        })
    }

    /// Where the next bytes go, at most `max` of them.
    pub fn slot(&mut self, max: usize) -> Option<&mut [u8]> {
        while self.seg < self.bufs.len() && self.off >= self.bufs[self.seg].len() {
            self.seg += 1;
            self.off = 0;
        }
        let b = self.bufs.get_mut(self.seg)?;
        let end = (self.off + max).min(b.len());
        Some(&mut b[self.off..end])
    }

    pub fn advance(&mut self, n: usize) {
        self.off += n;
        self.got += n;
    }

    /// Places `data`; the caller checked that it fits.
    pub fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let Some(slot) = self.slot(data.len()) else {
                return;
            };
            let n = slot.len().min(data.len());
            slot[..n].copy_from_slice(&data[..n]);
            self.advance(n);
            data = &data[n..];
        }
    }

    pub fn complete(mut self) {
        if let Some(dt) = self.atomic {
            for b in &mut self.bufs {
                weft_core::atomic::from_wire(dt, b);
            }
        }
        let entry = CqEntry {
            len: self.len,
            bufs: self.bufs,
            ..CqEntry::default()
        };
        self.done.complete(entry);
    }

    /// Fails, handing the buffers back.
    pub fn fail(self, err: Error) {
        let mut e = CqErrEntry::new(0, OpFlags::empty(), err);
        e.bufs = self.bufs;
        self.done.fail(e);
    }
}

impl EpShared {
    /// Posts an RMA write, read or atomic.
    pub fn rma(self: &Arc<Self>, req: RmaReq) -> std::result::Result<(), Rejected<RmaReq>> {
        self.rma_from(req, None)
    }

    /// [`rma`](Self::rma) taking its room from `queue` (a scalable
    /// endpoint's transmit context) instead of the endpoint's.
    pub fn rma_from(
        self: &Arc<Self>,
        req: RmaReq,
        queue: Option<&Arc<Credits>>,
    ) -> std::result::Result<(), Rejected<RmaReq>> {
        if req.len() > self.max_msg {
            return Err(Rejected {
                err: Error::MsgSize,
                req,
            });
        }
        if let RmaOp::Atomic(a) = &req.op {
            if let Err(err) = crate::atomic::check(self.max_msg, a) {
                return Err(Rejected { err, req });
            }
        }
        let route = match self.route(req.dest) {
            Ok(r) => r,
            Err(err) => return Err(Rejected { err, req }),
        };
        if !self.take_room(queue) {
            return Err(Rejected {
                err: Error::Again,
                req,
            });
        }
        let target = Target {
            addr: req.addr,
            key: req.key,
        };
        let frame = match req.op {
            RmaOp::Write { iov, data } => {
                let mut h = Header::new(FrameKind::RmaWrite);
                // Every write is answered, so the initiator learns of a
                // refused key or range.
                h.flags = FLAG_ACK_REQ;
                if let Some(d) = data {
                    h.flags |= FLAG_CQ_DATA;
                    h.data = d;
                }
                let mut payload = Iov::with_capacity(iov.len() + 1);
                payload.push(Bytes::copy_from_slice(&target.encode()));
                payload.extend(iov);
                h.len = payload.iter().map(|b| b.len() as u64).sum();
                TxFrame::new(h, payload, Some(req.done))
            }
            RmaOp::Read { bufs } => {
                let len: usize = bufs.iter().map(|b| b.len()).sum();
                let mut h = Header::new(FrameKind::RmaReadReq);
                let rr = ReadReq {
                    target,
                    len: len as u64,
                };
                let payload = weft_core::provider::iov1(Bytes::copy_from_slice(&rr.encode()));
                h.len = payload[0].len() as u64;
                let mut f = TxFrame::new(h, payload, None);
                f.read = Some(PendingRead::new(bufs, req.done, None));
                f
            }
            RmaOp::Atomic(a) => crate::atomic::request(a, target, req.done),
        };
        let mut frame = frame;
        frame.charge_to(queue);
        self.dispatch(route, frame);
        Ok(())
    }

    /// Charges `charge` bytes of a read answer against `conn`'s share and
    /// the endpoint's budget, as a buffered message would be. A charge
    /// larger than the whole budget is cut to it, so an answer piece
    /// still goes out, alone, when a small budget is otherwise free.
    /// `None` when it does not fit now: the connection is parked (and
    /// woken when budget comes back).
    pub fn admit_answer(self: &Arc<Self>, conn: &Arc<Conn>, charge: usize) -> Option<Charge> {
        let charge = charge.min(self.peer_cap).min(self.buffered_limit);
        let _m = lock(&self.matcher);
        if !self.fits(conn, charge) {
            // A pseudo-message no receive takes: only budget wakes it.
            let info = MsgInfo {
                key: None,
                src: weft_core::addr::FI_ADDR_NOTAVAIL,
                tagged: true,
                tag: u64::MAX,
                len: charge.saturating_sub(UNEXPECTED_OVERHEAD),
                data: None,
            };
            self.parked.park(conn, info);
            if !self.fits(conn, charge) {
                return None;
            }
            self.parked.unpark(conn);
        }
        Some(Charge::new(self, &conn.charged, charge))
    }
}

/// Where an arriving write's bytes go.
#[derive(Debug)]
pub enum WriteSink {
    /// Into `region` from offset `off`; `ticket` for a watched access.
    Region {
        region: Arc<Region>,
        off: usize,
        ticket: Option<Ticket>,
    },
    /// Nowhere: the request was refused with this error (or the region
    /// closed part-way).
    Refused(Error),
}

impl WriteSink {
    /// The target's checks of a write of `len` bytes at `t`.
    pub fn open(ep: &EpShared, conn: &Conn, t: Target, len: usize) -> WriteSink {
        match lookup(ep, conn, t, len as u64, AccessKind::Write) {
            Ok((region, off, ticket)) => WriteSink::Region {
                region,
                off,
                ticket,
            },
            Err(e) => WriteSink::Refused(e),
        }
    }

    pub fn feed(&mut self, data: &[u8]) {
        if let WriteSink::Region { region, off, .. } = self {
            match region.put(*off, data) {
                Ok(()) => *off += data.len(),
                Err(e) => *self = WriteSink::Refused(e),
            }
        }
    }

    /// The whole payload arrived: the answer, and the target's
    /// completion for remote CQ data.
    pub fn finish(self, conn: &Arc<Conn>, ep: &EpShared, hdr: &Header, len: usize) {
        let status = match self {
            WriteSink::Region { region, ticket, .. } => {
                // Counted once the bytes are in place, before the target
                // completion and the answer.
                if let Some(t) = ticket {
                    t.complete(&region, &ep.cfg.remote_cntrs);
                }
                0
            }
            WriteSink::Refused(e) => e.code() as u64,
        };
        if status == 0 && hdr.flags & FLAG_CQ_DATA != 0 {
            if let Some(cq) = &ep.cfg.rx_cq {
                cq.push(Ok(CqEntry {
                    context: 0,
                    flags: OpFlags::RMA | OpFlags::REMOTE_WRITE | OpFlags::REMOTE_CQ_DATA,
                    len,
                    bufs: Vec::new(),
                    data: hdr.data,
                    tag: 0,
                    src: ep.reported_addr(ep.resolve_src(&conn.source())),
                }));
            }
        }
        conn.answer(hdr.seq, status);
    }
}

/// The region under `t.key`, the offset of `len` bytes at `t.addr` in
/// it and the access's ticket, if the region admits an access of `kind`
/// at this endpoint over `conn`. Inlined into its three callers: on
/// every access, a call here cost more than all its checks.
#[inline(always)]
pub fn lookup(
    ep: &EpShared,
    conn: &Conn,
    t: Target,
    len: u64,
    kind: AccessKind,
) -> Result<(Arc<Region>, usize, Option<Ticket>)> {
    let region = ep
        .regions
        .as_ref()
        .and_then(|r| r.get(t.key))
        .ok_or(Error::Access)?;
    let (off, watched) = region.admit(ep.watch, conn.auth.key.as_ref(), t.addr, len, kind)?;
    let ticket = if watched {
        Some(crate::rma_events::admit_watched(&region, ep.cfg.fid, kind)?)
    } else {
        None
    };
    Ok((region, off, ticket))
}

/// A read being answered: the target's side, one piece at a time.
#[derive(Debug)]
pub struct ReadJob {
    seq: u64,
    region: Arc<Region>,
    off: usize,
    len: usize,
    sent: usize,
    /// A watched access's ticket, presented once the last piece is
    /// copied out of the region.
    ticket: Option<Ticket>,
}

/// What a read request starts: an answer to send piece by piece, or
/// nothing more (refused, answered at once).
pub fn read_request(conn: &Arc<Conn>, ep: &EpShared, hdr: &Header, rr: ReadReq) -> Option<ReadJob> {
    let checked = if rr.len > ep.max_msg as u64 {
        Err(Error::MsgSize)
    } else {
        lookup(ep, conn, rr.target, rr.len, AccessKind::Read)
    };
    match checked {
        Ok((region, off, ticket)) => Some(ReadJob {
            seq: hdr.seq,
            region,
            off,
            len: rr.len as usize,
            sent: 0,
            ticket,
        }),
        Err(e) => {
            refuse_read(conn, hdr.seq, 0, e);
            None
        }
    }
}

fn refuse_read(conn: &Arc<Conn>, seq: u64, at: usize, e: Error) {
    let mut h = Header::new(FrameKind::RmaReadResp);
    h.seq = seq;
    h.tag = at as u64;
    h.data = e.code() as u64;
    conn.send(TxFrame::new(h, Iov::new(), None));
}

impl ReadJob {
    /// Sends pieces while the budget takes them. `true` once the whole
    /// answer is queued; `false` when the connection parked for budget
    /// (call again when woken).
    pub fn serve(&mut self, conn: &Arc<Conn>, ep: &Arc<EpShared>) -> bool {
        loop {
            let n = (self.len - self.sent).min(READ_CHUNK);
            let Some(charge) = ep.admit_answer(conn, UNEXPECTED_OVERHEAD + n) else {
                return false;
            };
            let mut b = BytesMut::zeroed(n);
            if let Err(e) = self.region.get(self.off + self.sent, &mut b) {
                // Closed since the request was checked.
                refuse_read(conn, self.seq, self.sent, e);
                return true;
            }
            let mut h = Header::new(FrameKind::RmaReadResp);
            h.seq = self.seq;
            h.tag = self.sent as u64;
            h.len = n as u64;
            let mut f = TxFrame::new(h, weft_core::provider::iov1(b.freeze()), None);
            f.charge = Some(charge);
            conn.send(f);
            self.sent += n;
            if self.sent == self.len {
                // The whole answer is copied out of the region (and
                // queued): at the target, the read is complete.
                if let Some(t) = self.ticket {
                    t.complete(&self.region, &ep.cfg.remote_cntrs);
                }
                return true;
            }
        }
    }
}

/// What an arriving piece of a read answer does.
pub enum Answer {
    /// Its bytes go into this read (taken out of the connection's table
    /// while they arrive).
    Place(Box<PendingRead>),
    /// It failed the read (an error status): nothing more to read.
    Done,
}

/// Checks a read answer's (or an atomic answer's) header against the
/// operation it answers. `Err`: a protocol error (no such operation, an
/// answer of the other kind, a piece out of order or past the end, an
/// atomic answer not whole, an error with a payload), which ends the
/// connection.
pub fn answer_piece(conn: &Conn, hdr: &Header) -> Result<Answer> {
    let Some(read) = conn.take_read(hdr.seq) else {
        return Err(Error::Io);
    };
    // An atomic's answer comes whole, as one `AtomicResp`; a read's as
    // `RmaReadResp` pieces.
    let atomic = hdr.kind == Some(FrameKind::AtomicResp);
    if atomic != read.atomic.is_some() {
        read.fail(Error::Io);
        return Err(Error::Io);
    }
    if hdr.data != 0 {
        if hdr.len != 0 {
            read.fail(Error::Io);
            return Err(Error::Io);
        }
        let e = Error::from_code(hdr.data as i32).unwrap_or(Error::RemoteIo);
        read.fail(e);
        return Ok(Answer::Done);
    }
    let whole = !atomic || hdr.len == read.len as u64;
    let fits = whole
        && hdr.tag == read.got as u64
        && (read.got as u64)
            .checked_add(hdr.len)
            .is_some_and(|end| end <= read.len as u64);
    if !fits {
        read.fail(Error::Io);
        return Err(Error::Io);
    }
    Ok(Answer::Place(read))
}

/// A piece of a read answer has arrived whole: the read completes, or
/// waits for the next piece.
pub fn piece_done(conn: &Conn, seq: u64, read: Box<PendingRead>) {
    if read.got == read.len {
        (*read).complete();
    } else {
        conn.put_read(seq, read);
    }
}
