//! `FI_EP_SOCK_STREAM` over an MSG endpoint's RC connection.
//!
//! The connection is made exactly as an MSG endpoint's (passive endpoint,
//! rdma_cm connect/accept, CM data, keys); only the queue pair's use
//! differs. The byte stream is carried by sends with immediate data into
//! a ring of registered receive buffers:
//!
//! * Writes copy into registered send buffers ([`TX_BUFS`] of [`BUF`]
//!   bytes) and post one send per buffer; a write waits while all are in
//!   flight.
//! * Reads copy out of the receive buffer at the head of the ring, from an
//!   offset, so a read may take part of a message; a buffer goes back on
//!   the receive queue once it is read to its end.
//! * Credits: RC answers a send that finds no posted receive with
//!   receiver-not-ready retries and, once they run out, an error that
//!   ends the connection, so a sender here never sends without a credit
//!   for a posted buffer. Each side posts [`RX_BUFS`] buffers for data
//!   and [`CTL_BUFS`] more for credit-only messages, and counts the two
//!   kinds of credit apart. The immediate of every message returns the
//!   buffers freed since the last one (see [`Imm`]; `docs/wire.md`).
//!   Data buffers come back when the application has read them, so a
//!   reader that stops reading stops its writer, as a socket's window
//!   does; a buffer a credit-only message used is posted again as soon
//!   as its completion is seen. A credit-only message is sent when
//!   [`RETURN_AT`] data buffers are to be returned and no data is going
//!   the other way to carry them; returns of credit-only buffers ride
//!   only on messages sent anyway, so credit messages never answer each
//!   other. (A side out of credit-only credits has returned at least one
//!   data buffer since the peer last sent, so the peer has a data credit
//!   and its next message carries the credit-only returns back.)
//! * The end of writing (`shutdown`) is a message flagged `FIN`, sent
//!   behind everything written and taking a data credit: the peer reads
//!   the end of the stream after the last byte. Dropping the stream sends
//!   it too, waits (at most the handshake timeout) until the device has
//!   delivered every send, and then disconnects, so nothing written is
//!   lost to the disconnect's flush. A disconnect without `FIN` also
//!   reads as the end of the stream, after every byte that arrived; a
//!   connection that failed (a work request error, rdma_cm reporting it
//!   broken) reads and writes as `ConnectionReset` once the bytes that
//!   arrived are read.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use weft_core::attr::{EpType, Info};
use weft_core::flags::{Caps, CompOrder, Mode, MrMode, MsgOrder, OpFlags};
use weft_core::provider::ByteStream;
use weft_core::sync::lock;
use weft_core::{Error, Result};

use super::MsgShared;
use crate::info::DeviceReport;
use crate::slot_pool::SlotPool;
use crate::sys::{
    AccessFlags, Payload, ProtectionDomain, QpCaps, QueuePair, RecvRequest, SendOp, SendRequest,
    WcStatus, WorkCompletion,
};

/// Bytes per stream buffer, send and receive.
pub const BUF: usize = 64 * 1024;
/// Receive buffers posted for data (the peer's data credits).
pub const RX_BUFS: usize = 16;
/// Receive buffers posted for credit-only messages.
pub const CTL_BUFS: usize = 4;
/// Send buffers: data messages in flight.
pub const TX_BUFS: usize = 8;
/// Data buffers read before a credit-only message returns them (when
/// no data goes the other way). At most [`RX_BUFS`], or a writer that
/// filled every buffer would wait for ever.
pub const RETURN_AT: u32 = 4;

/// Work request ids of the stream carry this bit (apart from MSG's).
pub(super) const STREAM_WR_BIT: u64 = 1 << 60;
const RECV: u64 = 1 << 40;
const CTL: u64 = 1 << 41;
const SLOT_MASK: u64 = 0xffff_ffff;

/// The immediate data of a stream message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Imm {
    /// The sender ends its writing (no payload).
    pub fin: bool,
    /// A credit-only message (no payload): it took one of the receiver's
    /// credit-only buffers.
    pub ctl: bool,
    /// Credit-only buffers returned.
    pub ctl_ret: u8,
    /// Data buffers returned.
    pub data_ret: u16,
}

impl Imm {
    const FIN: u32 = 1 << 31;
    const CTL: u32 = 1 << 30;

    /// The 32-bit immediate (host order; verbs sends it big-endian).
    pub fn encode(self) -> u32 {
        let mut v = u32::from(self.data_ret) | (u32::from(self.ctl_ret) << 16);
        if self.fin {
            v |= Self::FIN;
        }
        if self.ctl {
            v |= Self::CTL;
        }
        v
    }

    /// Reads an immediate; `None` for bits this version does not define.
    pub fn decode(v: u32) -> Option<Imm> {
        if v & 0x3f00_0000 != 0 || (v & Self::FIN != 0 && v & Self::CTL != 0) {
            return None;
        }
        Some(Imm {
            fin: v & Self::FIN != 0,
            ctl: v & Self::CTL != 0,
            ctl_ret: ((v >> 16) & 0xff) as u8,
            data_ret: (v & 0xffff) as u16,
        })
    }
}

/// Both directions' buffer accounting, apart from the device (the
/// decisions the completions and the application's calls make).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credits {
    /// Data messages we may still send.
    pub data: u32,
    /// Credit-only messages we may still send.
    pub ctl: u32,
    /// Data buffers read and posted again, not yet returned.
    pub ret_data: u32,
    /// Credit-only buffers posted again, not yet returned.
    pub ret_ctl: u32,
}

impl Default for Credits {
    fn default() -> Credits {
        Credits {
            data: RX_BUFS as u32,
            ctl: CTL_BUFS as u32,
            ret_data: 0,
            ret_ctl: 0,
        }
    }
}

impl Credits {
    /// What the next message returns (all that is due), counted as sent.
    pub fn take_returns(&mut self) -> (u16, u8) {
        // Never more than the buffers posted, which fit the fields.
        let d = self.ret_data.min(u32::from(u16::MAX));
        let c = self.ret_ctl.min(u32::from(u8::MAX));
        self.ret_data -= d;
        self.ret_ctl -= c;
        (d as u16, c as u8)
    }

    /// A message arrived returning these.
    pub fn returned(&mut self, imm: &Imm) {
        self.data += u32::from(imm.data_ret);
        self.ctl += u32::from(imm.ctl_ret);
    }

    /// Whether to send a credit-only message now.
    pub fn wants_ctl(&self) -> bool {
        self.ret_data >= RETURN_AT && self.ctl > 0
    }
}

/// How the write side stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shut {
    Open,
    /// `FIN` posted.
    Sent,
}

/// What the completions and the application share.
#[derive(Debug)]
struct St {
    /// Received data: (buffer, length), in order; `off` into the first.
    ready: VecDeque<(u32, usize)>,
    off: usize,
    credits: Credits,
    /// The peer's `FIN` arrived.
    eof: bool,
    /// The connection ended in order (disconnect): after what arrived,
    /// the end of the stream.
    ended: bool,
    /// The connection failed.
    reset: bool,
    shut: Shut,
    /// Sends (data, credit-only, `FIN`) on the device.
    sends_out: usize,
    /// The stream was dropped: buffers are no longer posted again.
    closing: bool,
    read_waker: Option<Waker>,
    write_waker: Option<Waker>,
}

/// The stream's queue pair use: its buffers and state.
pub(super) struct StreamCore {
    qp: Arc<QueuePair>,
    rx: SlotPool,
    tx: SlotPool,
    st: Mutex<St>,
}

impl std::fmt::Debug for StreamCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamCore")
            .field("qp", &self.qp.qp_num())
            .finish()
    }
}

/// Where an endpoint's stream is.
#[derive(Debug, Default)]
pub(super) enum Slot {
    #[default]
    None,
    /// Buffers posted, connection not established yet.
    Built(Arc<StreamCore>),
    /// Connected, not handed out.
    Ready(Arc<StreamCore>),
    /// Handed to the application.
    Taken(Arc<StreamCore>),
}

impl Slot {
    pub(super) fn core(&self) -> Option<&Arc<StreamCore>> {
        match self {
            Slot::None => None,
            Slot::Built(c) | Slot::Ready(c) | Slot::Taken(c) => Some(c),
        }
    }
}

/// The queue pair's sizes for a stream: every buffer can be on it at
/// once, and every send is signalled.
pub(super) fn qp_caps() -> QpCaps {
    QpCaps {
        max_send_wr: (TX_BUFS + CTL_BUFS + 1) as u32,
        max_recv_wr: (RX_BUFS + CTL_BUFS) as u32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

/// Completion queue entries a stream's queue pair may need at once.
pub(super) fn cq_depth() -> u32 {
    (TX_BUFS + CTL_BUFS + 1 + RX_BUFS + CTL_BUFS) as u32
}

/// The `FI_EP_SOCK_STREAM` offer of one port: MSG's connection
/// management, no data operations of its own (data moves through
/// `weft::SockStream`), nothing to register.
pub fn offer(r: &DeviceReport) -> Info {
    let mut i = crate::info::msg_offer(r);
    i.caps = Caps::LOCAL_COMM | Caps::REMOTE_COMM;
    i.mode = Mode::empty();
    i.tx_attr.caps = Caps::empty();
    i.rx_attr.caps = Caps::empty();
    i.rx_attr.mode = Mode::empty();
    i.tx_attr.op_flags_supported = OpFlags::empty();
    i.rx_attr.op_flags_supported = OpFlags::empty();
    // A byte stream keeps the order of its bytes, nothing more to say.
    i.tx_attr.msg_order = MsgOrder::empty();
    i.rx_attr.msg_order = MsgOrder::empty();
    i.rx_attr.comp_order = CompOrder::empty();
    i.tx_attr.inject_size = 0;
    i.tx_attr.rma_iov_limit = 0;
    i.ep_attr.ep_type = EpType::SockStream;
    i.domain_attr.mr_mode = MrMode::empty();
    // Shared receive contexts are MSG's.
    i.domain_attr.max_ep_srx_ctx = 0;
    i
}

impl StreamCore {
    /// Registers the stream's buffers on `pd` and posts every receive
    /// buffer on `qp` (before the connection exists, so the peer's first
    /// message finds one).
    pub(super) fn new(pd: &Arc<ProtectionDomain>, qp: Arc<QueuePair>) -> Result<Arc<StreamCore>> {
        let rx = SlotPool::with_slot(pd, RX_BUFS + CTL_BUFS, BUF, AccessFlags::LOCAL_WRITE)?;
        let tx = SlotPool::with_slot(pd, TX_BUFS, BUF, AccessFlags::NONE)?;
        let core = Arc::new(StreamCore {
            qp,
            rx,
            tx,
            st: Mutex::new(St {
                ready: VecDeque::new(),
                off: 0,
                credits: Credits::default(),
                eof: false,
                ended: false,
                reset: false,
                shut: Shut::Open,
                sends_out: 0,
                closing: false,
                read_waker: None,
                write_waker: None,
            }),
        });
        while let Some(s) = core.rx.take() {
            core.post_recv(s)?;
        }
        Ok(core)
    }

    fn post_recv(&self, slot: u32) -> Result<()> {
        let r = self.rx.with(|mr| {
            let sge = mr.sge(self.rx.offset(slot), BUF)?;
            self.qp.post_recv(&RecvRequest {
                wr_id: STREAM_WR_BIT | RECV | u64::from(slot),
                sges: &[sge],
            })
        });
        if r.is_err() {
            self.rx.put(slot);
        }
        r
    }

    /// Posts a message without payload (`FIN` or credit-only) carrying
    /// every return due.
    fn post_bare(&self, st: &mut St, fin: bool) -> Result<()> {
        let (data_ret, ctl_ret) = st.credits.take_returns();
        let imm = Imm {
            fin,
            ctl: !fin,
            ctl_ret,
            data_ret,
        };
        let wr = SendRequest::new(
            STREAM_WR_BIT | CTL,
            SendOp::SendWithImm(imm.encode()),
            Payload::Sges(&[]),
        );
        match self.qp.post_send(&wr) {
            Ok(()) => {
                st.sends_out += 1;
                Ok(())
            }
            Err(e) => {
                st.credits.ret_data += u32::from(data_ret);
                st.credits.ret_ctl += u32::from(ctl_ret);
                Err(e)
            }
        }
    }

    /// Sends a credit-only message if returns are due and nothing else
    /// carries them.
    fn maybe_return(&self, st: &mut St) {
        if st.closing || st.ended || st.reset || !st.credits.wants_ctl() {
            return;
        }
        st.credits.ctl -= 1;
        if self.post_bare(st, false).is_err() {
            st.credits.ctl += 1;
        }
    }

    /// A work completion of the stream.
    pub(super) fn on_completion(&self, wc: &WorkCompletion) {
        let mut st = lock(&self.st);
        let slot = (wc.wr_id & SLOT_MASK) as u32;
        if wc.wr_id & RECV == 0 {
            st.sends_out = st.sends_out.saturating_sub(1);
            if wc.wr_id & CTL == 0 {
                self.tx.put(slot);
            }
            if !matches!(wc.status, WcStatus::Success | WcStatus::WrFlushErr) {
                st.reset = true;
            }
            wake(&mut st.write_waker);
            return;
        }
        if !wc.is_ok() {
            // A flush (the connection ended) or an error: the buffer is
            // no longer the device's.
            self.rx.put(slot);
            if wc.status != WcStatus::WrFlushErr {
                st.reset = true;
            }
            wake(&mut st.read_waker);
            wake(&mut st.write_waker);
            return;
        }
        let Some(imm) = wc.imm_data.and_then(Imm::decode) else {
            // Not a Weft stream peer: nothing it says can be trusted.
            self.rx.put(slot);
            st.reset = true;
            let _ = self.qp.to_error();
            wake(&mut st.read_waker);
            wake(&mut st.write_waker);
            return;
        };
        st.credits.returned(&imm);
        if imm.fin {
            self.rx.put(slot);
            st.eof = true;
        } else if imm.ctl || wc.byte_len == 0 {
            let posted = !st.closing && self.post_recv(slot).is_ok();
            if posted && imm.ctl {
                st.credits.ret_ctl += 1;
            } else if posted {
                st.credits.ret_data += 1;
            }
        } else {
            st.ready.push_back((slot, wc.byte_len as usize));
        }
        self.maybe_return(&mut st);
        wake(&mut st.read_waker);
        wake(&mut st.write_waker);
    }

    /// The connection ended: in order (`reset` false: the end of the
    /// stream after what arrived), or broken.
    pub(super) fn ended(&self, reset: bool) {
        let mut st = lock(&self.st);
        st.ended = true;
        st.reset |= reset;
        wake(&mut st.read_waker);
        wake(&mut st.write_waker);
    }
}

fn wake(w: &mut Option<Waker>) {
    if let Some(w) = w.take() {
        w.wake();
    }
}

fn reset_err() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionReset,
        "verbs stream: connection failed",
    )
}

fn pipe_err() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "verbs stream: writing has ended")
}

/// Moves a connected endpoint's stream to `Ready`.
pub(super) fn established(ep: &MsgShared) {
    let mut g = lock(&ep.stream);
    if let Slot::Built(c) = std::mem::take(&mut *g) {
        *g = Slot::Ready(c);
    }
}

/// Hands the stream out, once.
pub(super) fn take(ep: &Arc<MsgShared>) -> Result<Box<dyn ByteStream>> {
    let mut g = lock(&ep.stream);
    match std::mem::take(&mut *g) {
        Slot::Ready(c) => {
            *g = Slot::Taken(c.clone());
            ep.stream_taken.store(true, Ordering::Release);
            Ok(Box::new(VerbsByteStream {
                ep: ep.clone(),
                core: c,
            }))
        }
        s @ Slot::Taken(_) => {
            *g = s;
            Err(Error::OpBadState)
        }
        s => {
            *g = s;
            Err(Error::NotConn)
        }
    }
}

/// The application's end of the stream. It keeps the endpoint's state
/// alive: the endpoint may be closed first.
#[derive(Debug)]
struct VerbsByteStream {
    ep: Arc<MsgShared>,
    core: Arc<StreamCore>,
}

impl VerbsByteStream {
    fn write_parts(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let c = &self.core;
        let mut st = lock(&c.st);
        if st.reset {
            return Poll::Ready(Err(reset_err()));
        }
        if st.shut != Shut::Open || st.ended {
            return Poll::Ready(Err(pipe_err()));
        }
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut sent = 0;
        while sent < total && st.credits.data > 0 {
            let Some(slot) = c.tx.take() else { break };
            let n = (total - sent).min(BUF);
            let parts = window(bufs, sent, n);
            let (data_ret, ctl_ret) = st.credits.take_returns();
            let imm = Imm {
                data_ret,
                ctl_ret,
                ..Imm::default()
            };
            let wr_id = STREAM_WR_BIT | u64::from(slot);
            let posted = c.tx.post_from(slot, parts, |sge| {
                c.qp.post_send(&SendRequest::new(
                    wr_id,
                    SendOp::SendWithImm(imm.encode()),
                    Payload::Sges(&[sge]),
                ))
            });
            if let Err(e) = posted {
                st.credits.ret_data += u32::from(data_ret);
                st.credits.ret_ctl += u32::from(ctl_ret);
                if sent > 0 {
                    break;
                }
                return Poll::Ready(Err(io::Error::other(e)));
            }
            st.credits.data -= 1;
            st.sends_out += 1;
            sent += n;
        }
        if sent > 0 || total == 0 {
            return Poll::Ready(Ok(sent));
        }
        st.write_waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// The `len` bytes of `bufs` from `skip` on, as slices.
fn window<'a>(bufs: &'a [IoSlice<'_>], mut skip: usize, mut len: usize) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    for b in bufs {
        if len == 0 {
            break;
        }
        if skip >= b.len() {
            skip -= b.len();
            continue;
        }
        let n = (b.len() - skip).min(len);
        out.push(&b[skip..skip + n]);
        len -= n;
        skip = 0;
    }
    out
}

impl ByteStream for VerbsByteStream {
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        let c = &self.core;
        let mut st = lock(&c.st);
        let mut got = 0;
        while got < buf.len() {
            let Some(&(slot, len)) = st.ready.front() else {
                break;
            };
            let n = (len - st.off).min(buf.len() - got);
            let at = c.rx.offset(slot) + st.off;
            c.rx.with(|mr| mr.read_at(at, &mut buf[got..got + n]))
                .map_err(io::Error::other)?;
            got += n;
            st.off += n;
            if st.off == len {
                st.ready.pop_front();
                st.off = 0;
                // A buffer that cannot go back (the connection ended) is
                // not returned either.
                if !st.closing && !st.ended && c.post_recv(slot).is_ok() {
                    st.credits.ret_data += 1;
                } else {
                    c.rx.put(slot);
                }
            }
        }
        if got > 0 || buf.is_empty() {
            c.maybe_return(&mut st);
            return Poll::Ready(Ok(got));
        }
        if st.eof || (st.ended && !st.reset) {
            return Poll::Ready(Ok(0));
        }
        if st.reset {
            return Poll::Ready(Err(reset_err()));
        }
        st.read_waker = Some(cx.waker().clone());
        Poll::Pending
    }

    fn poll_write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.write_parts(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.write_parts(cx, bufs)
    }

    /// Written bytes are on the device once `poll_write` returns, which
    /// delivers them in order behind the ones before: nothing to wait for.
    fn poll_flush(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if lock(&self.core.st).reset {
            return Poll::Ready(Err(reset_err()));
        }
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let c = &self.core;
        let mut st = lock(&c.st);
        if st.shut == Shut::Sent || st.ended {
            return Poll::Ready(Ok(()));
        }
        if st.reset {
            return Poll::Ready(Err(reset_err()));
        }
        if st.credits.data == 0 {
            st.write_waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        st.credits.data -= 1;
        if let Err(e) = c.post_bare(&mut st, true) {
            st.credits.data += 1;
            return Poll::Ready(Err(io::Error::other(e)));
        }
        st.shut = Shut::Sent;
        Poll::Ready(Ok(()))
    }
}

impl Drop for VerbsByteStream {
    fn drop(&mut self) {
        let (ep, core) = (self.ep.clone(), self.core.clone());
        let linger = ep.cfg.limits.handshake_timeout;
        {
            let mut st = lock(&core.st);
            if st.shut == Shut::Open && !st.ended && !st.reset && st.credits.data > 0 {
                st.credits.data -= 1;
                if core.post_bare(&mut st, true).is_ok() {
                    st.shut = Shut::Sent;
                }
            }
            st.closing = true;
        }
        // The disconnect flushes what the device has not sent yet: wait
        // for the sends first, off the dropping thread.
        let rt = ep.rt.clone();
        rt.spawn(async move {
            let t = tokio::time::Instant::now();
            while lock(&core.st).sends_out > 0 && t.elapsed() < linger {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            ep.close_now();
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn immediates_round_trip_and_unknown_bits_are_refused() {
        for imm in [
            Imm::default(),
            Imm {
                fin: true,
                ctl_ret: 3,
                data_ret: 16,
                ..Imm::default()
            },
            Imm {
                ctl: true,
                ctl_ret: 255,
                data_ret: u16::MAX,
                ..Imm::default()
            },
        ] {
            assert_eq!(Imm::decode(imm.encode()), Some(imm));
        }
        assert_eq!(Imm::decode(1 << 24), None);
        assert_eq!(Imm::decode(Imm::FIN | Imm::CTL), None);
    }

    /// A reader that read everything returns it even when no data goes
    /// back; credit-only returns only ride along.
    #[test]
    fn returns_go_back_by_threshold_and_ride_along() {
        let mut c = Credits {
            ret_ctl: 2,
            ..Credits::default()
        };
        assert!(!c.wants_ctl(), "credit-only returns alone send nothing");
        c.ret_data = RETURN_AT - 1;
        assert!(!c.wants_ctl());
        c.ret_data = RETURN_AT;
        assert!(c.wants_ctl());
        assert_eq!(c.take_returns(), (RETURN_AT as u16, 2));
        assert_eq!((c.ret_data, c.ret_ctl), (0, 0));
        c.ret_data = RETURN_AT;
        c.ctl = 0;
        assert!(!c.wants_ctl(), "no credit-only buffer at the peer");
        c.returned(&Imm {
            ctl_ret: 1,
            data_ret: 5,
            ..Imm::default()
        });
        assert_eq!((c.data, c.ctl), (RX_BUFS as u32 + 5, 1));
        assert!(c.wants_ctl());
    }

    /// A writer that filled every buffer of a reader that then read
    /// them all gets them back: the reader's returns reach the
    /// threshold.
    #[test]
    fn a_full_ring_read_to_its_end_is_returned() {
        assert!(RETURN_AT as usize <= RX_BUFS);
        let mut reader = Credits {
            ret_data: RX_BUFS as u32,
            ..Credits::default()
        };
        assert!(reader.wants_ctl());
        let (d, _) = reader.take_returns();
        assert_eq!(usize::from(d), RX_BUFS);
    }

    #[test]
    fn windows_cut_across_slices() {
        let a = [1u8, 2, 3];
        let b = [4u8, 5];
        let bufs = [IoSlice::new(&a), IoSlice::new(&[]), IoSlice::new(&b)];
        let w: Vec<u8> = window(&bufs, 2, 2).concat();
        assert_eq!(w, [3, 4]);
        assert_eq!(window(&bufs, 0, 5).concat(), [1, 2, 3, 4, 5]);
        assert!(window(&bufs, 5, 0).is_empty());
    }
}
