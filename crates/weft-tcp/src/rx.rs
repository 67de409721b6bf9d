//! The receive side of a connection as a state machine over non-blocking
//! reads, so the same code serves the reactor task and the busy-poll
//! thread.
//!
//! Small frames are read through a staging buffer (header and payload in
//! one syscall); large payloads are read straight into the posted buffer.

use std::io;
use std::sync::Arc;

use weft_core::addr::FiAddr;
use weft_core::attr::EpType;
use weft_core::provider::RecvReq;
pub use weft_core::recv_completion::{complete_peek, deliver, fail_recv};
use weft_core::recv_completion::{copy_in, deliver_unknown};

/// [`deliver`], or for a sender not in the AV on an endpoint with
/// `FI_SOURCE_ERR`, the `AddrNotAvail` error entry that carries the
/// message and the sender's address.
#[inline]
pub fn deliver_from(ep: &EpShared, req: RecvReq, info: MsgInfo, placed: usize, from: &Source) {
    match ep.unknown_sender(&info, from) {
        Some((reported, raw)) => deliver_unknown(ep, req, info, placed, reported, raw),
        None => deliver(ep, req, info, placed),
    }
}

/// Copies a fully buffered message into a receive and completes it as
/// [`deliver_from`] does.
#[inline]
pub fn copy_and_deliver(
    ep: &EpShared,
    mut req: RecvReq,
    info: MsgInfo,
    data: &[u8],
    from: &Source,
) {
    let placed = copy_in(&mut req, data);
    deliver_from(ep, req, info, placed, from);
}
use weft_core::tagmatch::MsgInfo;
use weft_core::wire::atomic::{AtomicHdr, ATOMIC_HDR_LEN};
use weft_core::wire::rma::{ReadReq, Target, READ_REQ_LEN, TARGET_LEN};
use weft_core::wire::{self, FrameKind, Header, FLAG_CQ_DATA, HEADER_LEN};
use weft_core::Error;

pub use crate::unexpected::Unexpected;

use crate::atomic::AtomicSink;
use crate::conn::Conn;
use crate::endpoint::EpShared;
use crate::keys::Source;
use crate::rma::{Answer, ReadJob, WriteSink};
use crate::scalable::Target as RxTarget;

#[path = "rx_sink.rs"]
mod sink;
use sink::{advance, direct_slot, fail_sink, feed, finish, Sink};

#[cfg(test)]
#[path = "rx_tests.rs"]
pub(crate) mod tests;

/// Largest staging buffer: a read this size takes a burst of small
/// frames in one syscall.
const STAGING: usize = 64 * 1024;
/// First staging buffer: grown to [`STAGING`] once a read fills it, so a
/// peer that trickles bytes (or sends little) holds 4 KiB, not 64.
const STAGING_MIN: usize = 4 * 1024;
/// The first read of a connection without a staging buffer.
const PROBE: usize = 512;
/// Payload bytes still to come above which reads go straight to the target.
const DIRECT_MIN: usize = 16 * 1024;

// One per connection, so its size costs nothing; boxing the sink would
// cost an allocation per message.
#[allow(clippy::large_enum_variant)]
enum Phase {
    Header,
    /// A header that matched nothing while the unexpected budget was full.
    Parked(Header),
    /// Answering a peer's read, piece by piece as the budget allows.
    Serving(ReadJob),
    Payload {
        hdr: Header,
        remaining: usize,
        sink: Sink,
        /// A scalable endpoint's receive context the message is for
        /// (`None`: the endpoint reading).
        at: Option<Arc<EpShared>>,
    },
}

/// The payload state's parts, handed to a step and back.
struct Arriving {
    hdr: Header,
    remaining: usize,
    sink: Sink,
    at: Option<Arc<EpShared>>,
}

/// What a progress call ended with.
#[derive(Debug, PartialEq, Eq)]
pub enum RxStatus {
    /// Nothing more to read now.
    WouldBlock,
    /// The last read was short, so the socket was empty then; no read was
    /// tried after it (a reactor-driven caller may clear the socket's
    /// readiness instead of reading again).
    Drained,
    /// Waiting for receive buffers (flow control); retry when kicked.
    Parked,
    /// The connection ended (cleanly: `None`).
    Closed(Option<Error>),
}

/// Receive state of one connection.
pub struct RxMachine {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    phase: Phase,
    max_msg: u64,
    /// The peer's AV handle and the AV version it was found in: the
    /// reverse lookup runs again only after the AV changed.
    src: Option<(u64, FiAddr)>,
    /// The last read of this pass returned less than it could take: the
    /// socket was empty then, so the pass ends without another read (which
    /// would only say `EAGAIN`: one syscall per message on the latency
    /// path). The next pass reads again.
    drained: bool,
    /// The last staging read filled the buffer: grow it before the next.
    grow: bool,
}

impl std::fmt::Debug for RxMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxMachine")
            .field("buffered", &(self.end - self.start))
            .finish()
    }
}

impl RxMachine {
    pub fn new(max_msg: u64) -> RxMachine {
        RxMachine {
            // Allocated by the first read: a connection that never sends
            // costs no staging buffer.
            buf: Box::default(),
            start: 0,
            end: 0,
            phase: Phase::Header,
            max_msg,
            src: None,
            drained: false,
            grow: false,
        }
    }

    /// Reads and dispatches until the socket has nothing more.
    pub fn progress(
        &mut self,
        conn: &Arc<Conn>,
        ep: &Arc<EpShared>,
        read: &mut dyn FnMut(&mut [u8]) -> io::Result<usize>,
    ) -> RxStatus {
        // A short read says the socket was empty *then*: the word holds for
        // the pass that made it, not the next one. Bytes may have come
        // since (say, while the machine was parked), and a reactor reader
        // that cleared readiness on a stale word would sleep beside them.
        self.drained = false;
        loop {
            // The header state is handled in place: moving the phase out
            // and back copies the whole receive record on every pass.
            if matches!(self.phase, Phase::Header) {
                if let Some(st) = self.header_step(conn, ep, read) {
                    return st;
                }
                continue;
            }
            match std::mem::replace(&mut self.phase, Phase::Header) {
                Phase::Header => {}
                Phase::Parked(hdr) => {
                    if let Some(st) = self.on_header(conn, ep, hdr) {
                        return st;
                    }
                }
                Phase::Serving(mut job) => {
                    if !job.serve(conn, ep) {
                        self.phase = Phase::Serving(job);
                        self.shrink();
                        return RxStatus::Parked;
                    }
                }
                Phase::Payload {
                    hdr,
                    remaining,
                    sink,
                    at,
                } => {
                    let a = Arriving {
                        hdr,
                        remaining,
                        sink,
                        at,
                    };
                    if let Some(st) = self.payload_step(conn, ep, read, a) {
                        return st;
                    }
                }
            }
        }
    }

    /// One step in the payload state: finish a complete message, feed it
    /// staged bytes, read straight into the receive's buffer, or stage
    /// more. `Some` stops progress.
    fn payload_step(
        &mut self,
        conn: &Arc<Conn>,
        ep: &Arc<EpShared>,
        read: &mut dyn FnMut(&mut [u8]) -> io::Result<usize>,
        a: Arriving,
    ) -> Option<RxStatus> {
        let Arriving {
            hdr,
            mut remaining,
            mut sink,
            at,
        } = a;
        let to = at.as_ref().unwrap_or(ep);
        if remaining == 0 {
            finish(conn, to, &hdr, sink);
            return None;
        }
        let avail = self.end - self.start;
        if avail > 0 {
            let n = avail.min(remaining);
            let (s, e) = (self.start, self.start + n);
            feed(&mut sink, &self.buf[s..e]);
            self.start = e;
            self.phase = Phase::Payload {
                hdr,
                remaining: remaining - n,
                sink,
                at,
            };
            return None;
        }
        if remaining >= DIRECT_MIN && !self.drained {
            if let Some(slot) = direct_slot(&mut sink, remaining) {
                let want = slot.len();
                match read_once(read, slot) {
                    Ok(0) => return Some(self.closed_mid_frame(to, sink)),
                    Ok(n) => {
                        self.drained = n < want;
                        advance(&mut sink, n);
                        remaining -= n;
                        self.phase = Phase::Payload {
                            hdr,
                            remaining,
                            sink,
                            at,
                        };
                        return None;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        self.phase = Phase::Payload {
                            hdr,
                            remaining,
                            sink,
                            at,
                        };
                        return Some(RxStatus::WouldBlock);
                    }
                    Err(e) => {
                        fail_sink(to, sink, Error::from(e));
                        return Some(RxStatus::Closed(Some(Error::ConnReset)));
                    }
                }
            }
        }
        self.phase = Phase::Payload {
            hdr,
            remaining,
            sink,
            at,
        };
        let st = self.fill(read, false)?;
        if let RxStatus::Closed(_) = st {
            if let Phase::Payload { sink, at, .. } =
                std::mem::replace(&mut self.phase, Phase::Header)
            {
                return Some(self.closed_mid_frame(at.as_ref().unwrap_or(ep), sink));
            }
        }
        Some(st)
    }

    /// One step in the header state: decode a buffered header, or read
    /// more. `Some` stops progress.
    fn header_step(
        &mut self,
        conn: &Arc<Conn>,
        ep: &Arc<EpShared>,
        read: &mut dyn FnMut(&mut [u8]) -> io::Result<usize>,
    ) -> Option<RxStatus> {
        if self.end - self.start >= HEADER_LEN {
            let hb = &self.buf[self.start..self.start + HEADER_LEN];
            let hdr = match wire::decode(hb, self.max_msg) {
                Ok(h) => h,
                Err(e) => {
                    tracing::warn!(peer = %conn.peer, error = %e, "bad frame; closing connection");
                    return Some(RxStatus::Closed(Some(Error::from(e))));
                }
            };
            // An RMA request's fixed prefix is read with its header.
            let prefix = match hdr.kind {
                Some(FrameKind::RmaWrite) => TARGET_LEN,
                Some(FrameKind::RmaReadReq) => READ_REQ_LEN,
                Some(FrameKind::AtomicReq) => ATOMIC_HDR_LEN,
                _ => 0,
            };
            let short = match hdr.kind {
                Some(FrameKind::RmaWrite) => hdr.len < TARGET_LEN as u64,
                Some(FrameKind::RmaReadReq) => hdr.len != READ_REQ_LEN as u64,
                Some(FrameKind::AtomicReq) => hdr.len < ATOMIC_HDR_LEN as u64,
                _ => false,
            };
            if short {
                tracing::warn!(peer = %conn.peer, len = hdr.len, "RMA frame of a bad length; closing connection");
                return Some(RxStatus::Closed(Some(Error::Io)));
            }
            if self.end - self.start >= HEADER_LEN + prefix {
                self.start += HEADER_LEN;
                return self.on_header(conn, ep, hdr);
            }
        }
        self.fill(read, true)
    }

    /// A frame is part-way in: a partial header is buffered, or a
    /// payload is still arriving. Only then can the peer stall us.
    pub fn mid_frame(&self) -> bool {
        match self.phase {
            Phase::Header => self.end > self.start,
            Phase::Parked(_) | Phase::Serving(_) => false,
            Phase::Payload { .. } => true,
        }
    }

    /// Waiting for a receive or for budget.
    pub fn is_parked(&self) -> bool {
        matches!(self.phase, Phase::Parked(_) | Phase::Serving(_))
    }

    /// Lets go of the staging buffer, keeping only bytes still staged: a
    /// parked or quiet connection should not hold 64 KiB while it waits.
    /// The next read allocates it again.
    pub fn shrink(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        self.buf = self.buf[self.start..self.end].into();
        self.end -= self.start;
        self.start = 0;
    }

    /// A staging buffer of `size` bytes holding what is staged now.
    fn stage_to(&mut self, size: usize) {
        let n = self.end - self.start;
        let mut b = vec![0u8; size.max(n)].into_boxed_slice();
        b[..n].copy_from_slice(&self.buf[self.start..self.end]);
        self.buf = b;
        self.start = 0;
        self.end = n;
    }

    /// The connection was ended from elsewhere (writer error, replaced by
    /// a newer connection): a message half-read must still complete, or its
    /// receive would wait forever.
    pub fn abort(&mut self, ep: &EpShared, err: Error) {
        if let Phase::Payload { sink, at, .. } = std::mem::replace(&mut self.phase, Phase::Header) {
            fail_sink(at.as_deref().unwrap_or(ep), sink, err);
        }
        self.start = 0;
        self.end = 0;
    }

    fn closed_mid_frame(&mut self, ep: &EpShared, sink: Sink) -> RxStatus {
        fail_sink(ep, sink, Error::ConnReset);
        RxStatus::Closed(Some(Error::ConnReset))
    }

    /// Reads into the staging buffer. `None` if bytes arrived.
    fn fill(
        &mut self,
        read: &mut dyn FnMut(&mut [u8]) -> io::Result<usize>,
        at_header: bool,
    ) -> Option<RxStatus> {
        if self.start == self.end && self.buf.is_empty() {
            return self.probe(read, at_header);
        }
        if self.buf.len() < STAGING_MIN {
            self.stage_to(STAGING_MIN);
        } else if self.grow && self.buf.len() < STAGING {
            self.stage_to(STAGING);
        }
        self.grow = false;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.start > self.buf.len() / 2
            || self.buf.len() - self.end < HEADER_LEN + READ_REQ_LEN
        {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if std::mem::take(&mut self.drained) {
            return Some(RxStatus::Drained);
        }
        let space = self.buf.len() - self.end;
        match read_once(read, &mut self.buf[self.end..]) {
            Ok(0) => {
                if at_header && self.start == self.end {
                    Some(RxStatus::Closed(None))
                } else {
                    Some(RxStatus::Closed(Some(Error::ConnReset)))
                }
            }
            Ok(n) => {
                self.end += n;
                self.drained = n < space;
                // A full buffer: more is coming than it holds.
                self.grow = n == space;
                None
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Some(RxStatus::WouldBlock),
            Err(e) => Some(RxStatus::Closed(Some(Error::from(e)))),
        }
    }

    /// A read with no staging buffer (a new connection, or one that gave
    /// its buffer back): into a small buffer on the stack first, so a
    /// connection that has nothing to say never costs 64 KiB. Bytes that
    /// arrive move into a staging buffer allocated then.
    fn probe(
        &mut self,
        read: &mut dyn FnMut(&mut [u8]) -> io::Result<usize>,
        at_header: bool,
    ) -> Option<RxStatus> {
        if std::mem::take(&mut self.drained) {
            return Some(RxStatus::Drained);
        }
        let mut p = [0u8; PROBE];
        match read_once(read, &mut p) {
            Ok(0) if at_header => Some(RxStatus::Closed(None)),
            Ok(0) => Some(RxStatus::Closed(Some(Error::ConnReset))),
            Ok(n) => {
                self.start = 0;
                self.end = 0;
                self.stage_to(STAGING_MIN);
                self.buf[..n].copy_from_slice(&p[..n]);
                self.end = n;
                self.drained = n < PROBE;
                None
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Some(RxStatus::WouldBlock),
            Err(e) => Some(RxStatus::Closed(Some(Error::from(e)))),
        }
    }

    /// Dispatches a decoded header; `Some` stops progress.
    fn on_header(&mut self, conn: &Arc<Conn>, ep: &Arc<EpShared>, hdr: Header) -> Option<RxStatus> {
        let kind = hdr.kind?;
        match kind {
            FrameKind::Msg | FrameKind::Tagged => {
                let at = match ep.ctxs.target(&hdr) {
                    RxTarget::Here => None,
                    RxTarget::Ctx(c) => Some(c),
                    RxTarget::Drop => {
                        ep.bad_ctx(conn);
                        self.payload(conn, ep, hdr, hdr.len as usize, Sink::Discard);
                        return None;
                    }
                };
                let to = at.as_ref().unwrap_or(ep);
                let info = MsgInfo {
                    key: conn.auth.av_key.and_then(|k| u16::try_from(k).ok()),
                    src: ep.resolve_src_cached(&conn.source(), &mut self.src),
                    tagged: kind == FrameKind::Tagged,
                    tag: hdr.tag,
                    len: hdr.len as usize,
                    data: (hdr.flags & FLAG_CQ_DATA != 0).then_some(hdr.data),
                };
                let sink = match to.arrival(conn, info) {
                    Some(s) => s,
                    None => {
                        self.phase = Phase::Parked(hdr);
                        self.shrink();
                        return Some(RxStatus::Parked);
                    }
                };
                let sink = match sink {
                    Arrival::Posted(req) => Sink::Posted {
                        req,
                        info,
                        seg: 0,
                        off: 0,
                        placed: 0,
                    },
                    Arrival::Unexpected(u) => Sink::Unexpected(u),
                };
                // A small message usually arrived whole with its header:
                // deliver it now instead of through the payload state.
                let len = hdr.len as usize;
                if self.end - self.start >= len {
                    let mut sink = sink;
                    let (s, e) = (self.start, self.start + len);
                    feed(&mut sink, &self.buf[s..e]);
                    self.start = e;
                    finish(conn, to, &hdr, sink);
                    return None;
                }
                self.phase = Phase::Payload {
                    remaining: hdr.len as usize,
                    hdr,
                    sink,
                    at,
                };
                None
            }
            FrameKind::RmaWrite => {
                let t = match Target::decode(&self.buf[self.start..self.end]) {
                    Ok(t) => t,
                    Err(_) => return Some(RxStatus::Closed(Some(Error::Io))),
                };
                self.start += TARGET_LEN;
                let len = (hdr.len as usize).saturating_sub(TARGET_LEN);
                let sink = Sink::Write(WriteSink::open(ep, conn, t, len));
                self.payload(conn, ep, hdr, len, sink);
                None
            }
            FrameKind::RmaReadReq => {
                let end = self.start + READ_REQ_LEN;
                let rr = match ReadReq::decode(&self.buf[self.start..end]) {
                    Ok(r) => r,
                    Err(_) => return Some(RxStatus::Closed(Some(Error::Io))),
                };
                self.start = end;
                if let Some(job) = crate::rma::read_request(conn, ep, &hdr, rr) {
                    self.phase = Phase::Serving(job);
                }
                None
            }
            FrameKind::AtomicReq => {
                let end = self.start + ATOMIC_HDR_LEN;
                let ah = match AtomicHdr::decode(&self.buf[self.start..end], hdr.len) {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(peer = %conn.peer, error = %e, "bad atomic request; closing connection");
                        return Some(RxStatus::Closed(Some(Error::Io)));
                    }
                };
                // The prefix stays staged until the request is admitted:
                // a parked connection comes back to this header.
                let Some(sink) = AtomicSink::admit(conn, ep, hdr.seq, ah) else {
                    self.phase = Phase::Parked(hdr);
                    self.shrink();
                    return Some(RxStatus::Parked);
                };
                self.start = end;
                let len = hdr.len as usize - ATOMIC_HDR_LEN;
                self.payload(conn, ep, hdr, len, Sink::Atomic(Box::new(sink)));
                None
            }
            FrameKind::RmaReadResp | FrameKind::AtomicResp => {
                match crate::rma::answer_piece(conn, &hdr) {
                    Ok(Answer::Done) => None,
                    Ok(Answer::Place(read)) => {
                        let sink = Sink::Read { seq: hdr.seq, read };
                        self.payload(conn, ep, hdr, hdr.len as usize, sink);
                        None
                    }
                    Err(e) => {
                        tracing::warn!(peer = %conn.peer, seq = hdr.seq, "read answer that answers nothing; closing connection");
                        Some(RxStatus::Closed(Some(e)))
                    }
                }
            }
            FrameKind::Ack => {
                conn.on_ack(hdr.seq, hdr.data);
                None
            }
            // RDM: the peer retired the connection while idle; it is read
            // on until the peer closes (see `Conn::peer_retired`).
            FrameKind::Shutdown if ep.ep_type == EpType::Rdm => {
                conn.peer_retired(ep);
                None
            }
            FrameKind::Shutdown => Some(RxStatus::Closed(None)),
            FrameKind::Hello
            | FrameKind::HelloAck
            | FrameKind::ConnReq
            | FrameKind::ConnResp
            | FrameKind::Verify
            | FrameKind::VerifyAck
            | FrameKind::KeyedHello
            | FrameKind::KeyChallenge
            | FrameKind::KeyProof
            | FrameKind::KeyedConnReq => {
                tracing::warn!(peer = %conn.peer, ?kind, "handshake frame on an established connection");
                Some(RxStatus::Closed(Some(Error::Io)))
            }
        }
    }
}

impl RxMachine {
    /// Takes `len` payload bytes into `sink`: at once when they are all
    /// staged, else through the payload state.
    fn payload(
        &mut self,
        conn: &Arc<Conn>,
        ep: &Arc<EpShared>,
        hdr: Header,
        len: usize,
        sink: Sink,
    ) {
        let mut sink = sink;
        if self.end - self.start >= len {
            let (s, e) = (self.start, self.start + len);
            feed(&mut sink, &self.buf[s..e]);
            self.start = e;
            finish(conn, ep, &hdr, sink);
            return;
        }
        self.phase = Phase::Payload {
            remaining: len,
            hdr,
            sink,
            at: None,
        };
    }
}

/// Where an arriving message goes.
pub enum Arrival {
    Posted(RecvReq),
    Unexpected(Arc<Unexpected>),
}

fn read_once(
    read: &mut dyn FnMut(&mut [u8]) -> io::Result<usize>,
    b: &mut [u8],
) -> io::Result<usize> {
    loop {
        match read(b) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}
