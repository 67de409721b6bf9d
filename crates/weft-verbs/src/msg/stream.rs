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
//!   [`RETURN_AT`](crate::stream_wire::RETURN_AT) data buffers are to be
//!   returned and no data is going the other way to carry them; returns
//!   of credit-only buffers ride only on messages sent anyway, so credit
//!   messages never answer each other. (A side out of credit-only
//!   credits has returned at least one data buffer since the peer last
//!   sent, so the peer has a data credit and its next message carries
//!   the credit-only returns back.)
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
//! * A peer gone without a disconnect is found by the liveness probe
//!   (`crate::liveness`): a stream someone waits on that has seen no
//!   completion for a tick posts a zero-length RDMA write, which a dead
//!   peer never acknowledges; once the retries are spent it fails, and
//!   the stream is reset.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use weft_core::attr::Info;
use weft_core::flags::Mode;
use weft_core::provider::ByteStream;
use weft_core::sync::lock;
use weft_core::{Error, Result};

use super::MsgShared;
use crate::info::DeviceReport;
use crate::liveness::{self, Probe};
use crate::slot_pool::SlotPool;
use crate::stream_wire::window;
use crate::stream_wire::{Credits, Imm, BUF, CTL_BUFS, RX_BUFS, TX_BUFS};
use crate::sys::{
    AccessFlags, Payload, ProtectionDomain, QpCaps, QueuePair, RecvRequest, SendOp, SendRequest,
    WcStatus, WorkCompletion,
};

/// Work request ids of the stream carry this bit (apart from MSG's).
pub(super) const STREAM_WR_BIT: u64 = 1 << 60;
const RECV: u64 = 1 << 40;
const CTL: u64 = 1 << 41;
/// The liveness probe (with `CTL`: it holds no buffer).
const PROBE: u64 = 1 << 42;
const SLOT_MASK: u64 = 0xffff_ffff;

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
    /// A reader, or a writer out of credits, has no send of its own out
    /// for a silent peer to fail.
    probe: Probe,
}

impl StreamCore {
    /// Whether it holds a reference to `qp`.
    pub(super) fn holds(&self, qp: &Arc<QueuePair>) -> bool {
        Arc::ptr_eq(&self.qp, qp)
    }
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
        // Besides the buffers: `FIN` and the liveness probe.
        max_send_wr: (TX_BUFS + CTL_BUFS + 2) as u32,
        max_recv_wr: (RX_BUFS + CTL_BUFS) as u32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

/// Completion queue entries a stream's queue pair may need at once.
pub(super) fn cq_depth() -> u32 {
    (TX_BUFS + CTL_BUFS + 2 + RX_BUFS + CTL_BUFS) as u32
}

/// The `FI_EP_SOCK_STREAM` offer of one port: MSG's connection
/// management, no data operations of its own (data moves through
/// `weft::SockStream`), nothing to register.
pub fn offer(r: &DeviceReport) -> Info {
    let mut i = weft_core::getinfo::sock_stream_offer(crate::info::msg_offer(r));
    // What verbs MSG offers besides tcp's: its modes and RMA.
    i.mode = Mode::empty();
    i.rx_attr.mode = Mode::empty();
    i.tx_attr.rma_iov_limit = 0;
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
            probe: Probe::default(),
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

    /// One tick of the liveness probe (`crate::liveness`), probing while
    /// someone waits on the stream; its failure resets the stream like
    /// any other failed send. `false` once the stream has ended.
    fn probe_tick(&self) -> bool {
        let mut st = lock(&self.st);
        if st.closing || st.ended || st.reset {
            return false;
        }
        let waited = st.read_waker.is_some() || st.write_waker.is_some();
        if self.probe.due(waited)
            && self
                .probe
                .post(&self.qp, STREAM_WR_BIT | CTL | PROBE)
                .is_ok()
        {
            st.sends_out += 1;
        }
        true
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
        self.probe.heard();
        let slot = (wc.wr_id & SLOT_MASK) as u32;
        if wc.wr_id & RECV == 0 {
            st.sends_out = st.sends_out.saturating_sub(1);
            if wc.wr_id & PROBE != 0 {
                self.probe.landed();
            }
            if wc.wr_id & CTL == 0 {
                self.tx.put(slot);
            }
            if !matches!(wc.status, WcStatus::Success | WcStatus::WrFlushErr) {
                // The connection is broken (the queue pair is in error):
                // a waiting reader learns it too.
                st.reset = true;
                wake(&mut st.read_waker);
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
            liveness::every_tick(&ep.rt, Arc::downgrade(&c), StreamCore::probe_tick);
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
