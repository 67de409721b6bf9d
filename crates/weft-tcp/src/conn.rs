//! One TCP connection: the transmit queue (direct non-blocking writes from
//! the posting thread, a writer task for the rest) and the receive state.
//!
//! The socket is held twice: as a `std` stream for direct syscalls (the
//! posting thread's fast path, the busy-poll thread) and as a duplicate
//! registered with Tokio for readiness in interrupt mode. Both name the
//! same open file, so bytes are never split between two streams.
//!
//! A connection of an endpoint that runs TLS also holds its session
//! (`tls::Session`): reads and writes go through it instead of the
//! socket. Plain connections pay one predictable branch for it.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use weft_core::completion::{CqEntry, CqErrEntry, OpDone};
use weft_core::hash::{fast_map, FastMap};
use weft_core::sync::lock;
use weft_core::wire::{FrameKind, Header, FLAG_ACK_REQ};
use weft_core::{Error, Result};

use crate::endpoint::EpShared;
use crate::frame::TxFrame;
use crate::keys::{ConnAuth, Source};
use crate::rma::PendingRead;
use crate::rx::RxMachine;
use crate::tls::{HsStream, Session};
use weft_core::limits::ConnSlot;

/// Most I/O slices handed to one `writev` (header + the iov limit, with
/// room to spare; a longer list is written in several calls).
pub const MAX_IOV: usize = 16;

#[derive(Debug, Default)]
struct TxState {
    queue: VecDeque<TxFrame>,
    /// The writer task owns the head of the stream (a frame is partly out).
    writer_active: bool,
    closed: Option<Error>,
    seq: u64,
    /// Encoded `Ack` frames waiting to ride with the next frame to the
    /// peer (see [`Conn::answer`]).
    acks_out: Vec<u8>,
    /// RDM: this end sends no more requests here: it queued a `Shutdown`
    /// (it retired the connection while idle), or read the peer's.
    /// Requests posted after that go over a new connection.
    retired: bool,
    /// RDM: the peer retired the connection. Once what is queued is out
    /// (a request part-way out included), this end half-closes; it reads
    /// on until the peer closes, for the acks and answers still owed.
    fin: bool,
    fin_sent: bool,
    /// RDM: the peer half-closed a connection this end retired: close
    /// once what is queued (acks, read answers) is out.
    close_when_out: bool,
}

/// A connection to one peer.
#[derive(Debug)]
pub struct Conn {
    pub peer: SocketAddr,
    /// The identity used for matching and AV lookups: the peer's listening
    /// address (RDM) or its socket address (MSG).
    pub peer_key: SocketAddr,
    /// What the connection proved at set-up.
    pub auth: ConnAuth,
    pub ep: Weak<EpShared>,
    std: std::net::TcpStream,
    pub tio: tokio::net::TcpStream,
    /// The TLS session, when the endpoint runs TLS.
    tls: Option<Box<Session>>,
    tx: Mutex<TxState>,
    tx_kick: Notify,
    pub rx: Mutex<RxMachine>,
    /// Completions waiting for the peer's `Ack`, with the length they
    /// report.
    acks: Mutex<FastMap<u64, (OpDone, usize)>>,
    /// RMA reads and atomics waiting for their answer, by request sequence
    /// number.
    reads: Mutex<FastMap<u64, Box<PendingRead>>>,
    dead: AtomicBool,
    /// `TxState::acks_out` holds acks (read without the lock by drivers).
    acks_pending: AtomicBool,
    /// Bytes read, and writes made: the sweeper compares them between
    /// passes instead of the data path reading a clock.
    rx_bytes: AtomicU64,
    tx_ops: AtomicU64,
    /// Unexpected-message bytes this connection holds buffered.
    pub charged: Arc<AtomicUsize>,
    /// Its share of its endpoint's shared receive context's budget, when
    /// the endpoint is bound to one (read under the context's parked
    /// list's lock, where the endpoint may not be reached).
    pub srx_cap: usize,
    /// In the endpoint's parked list (see `parked.rs`).
    pub parked: AtomicBool,
    /// Wakes the reader of a parked connection, or one that was failed.
    pub kick: Notify,
    /// Closing after an idle spell: `Shutdown` sent, reading until the
    /// peer closes too.
    pub retiring: AtomicBool,
    /// Of an RDM endpoint: connections are retired while idle and made
    /// again on demand (MSG connections end for good).
    rdm: bool,
    /// Notified (all waiters) once the connection is dead: a new
    /// connection to the same peer waits for a retiring one to end.
    ended: Notify,
    /// The reader and writer tasks, stopped with the endpoint.
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
    /// The sweeper's view: activity seen, since when, and since when the
    /// peer has been gone.
    sweep: Mutex<SweepMark>,
    _slot: ConnSlot,
}

#[derive(Debug)]
struct SweepMark {
    /// `rx_bytes + tx_ops` when last looked at, and since when unchanged.
    seen: u64,
    since: Instant,
    /// Since when a frame has been seen part-way in, and `rx_bytes` then.
    mid_since: Option<(Instant, u64)>,
    gone_since: Option<Instant>,
}

/// Bytes a connection must deliver per stall window while a frame is
/// part-way in: a peer trickling a byte now and then is as stalled as one
/// sending nothing (at the default window, 1.6 KB/s; loopback and any
/// real network are far above it).
pub const STALL_MIN_BYTES: u64 = 16 * 1024;

impl Conn {
    /// The peer as matching and AV lookups know it.
    pub fn source(&self) -> Source {
        Source {
            addr: self.peer_key,
            key: self.auth.av_key,
        }
    }

    /// Wraps an established stream. Must run inside the runtime.
    pub fn new(
        stream: HsStream,
        peer_key: SocketAddr,
        ep: &Arc<EpShared>,
        slot: ConnSlot,
        auth: ConnAuth,
    ) -> Result<Arc<Conn>> {
        let (stream, tls) = stream.into_parts();
        stream.set_nodelay(true)?;
        mark(&stream, ep.dscp)?;
        let peer = stream.peer_addr()?;
        let std = stream.into_std()?;
        std.set_nonblocking(true)?;
        let dup = std.try_clone()?;
        let tio = tokio::net::TcpStream::from_std(dup)?;
        Ok(Arc::new(Conn {
            peer,
            peer_key,
            auth,
            ep: Arc::downgrade(ep),
            std,
            tio,
            tls: tls.map(|c| Box::new(Session::new(c))),
            tx: Mutex::new(TxState::default()),
            tx_kick: Notify::new(),
            rx: Mutex::new(RxMachine::new(ep.max_msg as u64)),
            acks: Mutex::new(fast_map()),
            reads: Mutex::new(fast_map()),
            dead: AtomicBool::new(false),
            acks_pending: AtomicBool::new(false),
            rx_bytes: AtomicU64::new(0),
            tx_ops: AtomicU64::new(0),
            charged: Arc::new(AtomicUsize::new(0)),
            srx_cap: ep.srx.as_ref().map_or(0, |l| l.peer_cap),
            parked: AtomicBool::new(false),
            kick: Notify::new(),
            retiring: AtomicBool::new(false),
            rdm: ep.ep_type == weft_core::attr::EpType::Rdm,
            ended: Notify::new(),
            tasks: Mutex::new(Vec::new()),
            sweep: Mutex::new(SweepMark {
                seen: 0,
                since: Instant::now(),
                mid_since: None,
                gone_since: None,
            }),
            _slot: slot,
        }))
    }

    /// Keeps a driver task's handle so closing the endpoint stops it.
    pub fn add_task(&self, t: tokio::task::AbortHandle) {
        lock(&self.tasks).push(t);
    }

    fn touch_tx(&self) {
        self.tx_ops.fetch_add(1, Ordering::Relaxed);
    }

    fn touch_rx(&self, n: usize) {
        self.rx_bytes.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// How long nothing has moved either way, as of `now` (the sweeper's
    /// clock).
    pub fn quiet_for(&self, now: Instant) -> Duration {
        let a = self
            .rx_bytes
            .load(Ordering::Relaxed)
            .wrapping_add(self.tx_ops.load(Ordering::Relaxed));
        let mut m = lock(&self.sweep);
        if m.seen != a {
            m.seen = a;
            m.since = now;
        }
        now.saturating_duration_since(m.since)
    }

    /// Whether a frame part-way in (`mid`) has been so for a whole
    /// `window` while fewer than [`STALL_MIN_BYTES`] arrived.
    pub fn stalled(&self, now: Instant, mid: bool, window: Duration) -> bool {
        let rx = self.rx_bytes.load(Ordering::Relaxed);
        let mut m = lock(&self.sweep);
        if !mid {
            m.mid_since = None;
            return false;
        }
        let (t0, b0) = *m.mid_since.get_or_insert((now, rx));
        if now.saturating_duration_since(t0) < window {
            return false;
        }
        if rx.wrapping_sub(b0) < STALL_MIN_BYTES {
            return true;
        }
        // Enough came in this window: judge the next one afresh.
        m.mid_since = Some((now, rx));
        false
    }

    /// How long the peer has been seen gone (its end closed), as of `now`;
    /// `None` while it is there. Read from the reactor's readiness without
    /// a read, since a parked connection must leave its bytes unread.
    pub fn gone_for(&self, now: Instant) -> Option<Duration> {
        use futures::FutureExt;
        let closed = self
            .tio
            .ready(tokio::io::Interest::READABLE)
            .now_or_never()
            .is_some_and(|r| r.map_or(true, |r| r.is_read_closed()));
        let mut m = lock(&self.sweep);
        if !closed {
            m.gone_since = None;
            return None;
        }
        let since = *m.gone_since.get_or_insert(now);
        Some(now.saturating_duration_since(since))
    }

    /// Nothing queued to send and no acknowledgement awaited.
    pub fn tx_idle(&self) -> bool {
        let idle = {
            let g = lock(&self.tx);
            g.queue.is_empty() && !g.writer_active && g.acks_out.is_empty()
        };
        idle && lock(&self.acks).is_empty() && lock(&self.reads).is_empty()
    }

    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Resolves once the connection is dead, or after `limit`.
    pub async fn ended(&self, limit: Duration) {
        let wait = async {
            loop {
                let n = self.ended.notified();
                tokio::pin!(n);
                // Registered before the check: a `fail` between the two
                // still wakes it.
                n.as_mut().enable();
                if self.is_dead() {
                    return;
                }
                n.await;
            }
        };
        let _ = tokio::time::timeout(limit, wait).await;
    }

    /// Queues a frame (assigning its sequence number) and writes as much as
    /// the socket takes right now. On a dead connection the frame fails.
    pub fn send(self: &Arc<Self>, mut f: TxFrame) {
        let mut g = lock(&self.tx);
        // A sender that picked this connection just before it was retired
        // (by either end): the request goes over the next connection,
        // after any requeued there before it. Checked first: a retired
        // connection may since have been closed for another reason.
        if g.retired && f.credit.held() {
            drop(g);
            self.resend(f);
            return;
        }
        if let Some(err) = g.closed {
            drop(g);
            if err == Error::Shutdown {
                self.resend(f);
            } else {
                self.fail_frame(f, err);
            }
            return;
        }
        if g.fin_sent {
            // Half-closed: nothing more may be written (the peer wants
            // nothing from this end but what was already queued).
            drop(g);
            self.fail_frame(f, Error::Shutdown);
            return;
        }
        if self.rdm && f.hdr.kind == Some(FrameKind::Shutdown) {
            g.retired = true;
        }
        if f.hdr.kind.is_some_and(FrameKind::is_data) {
            g.seq += 1;
            f.hdr.seq = g.seq;
        }
        f.enc = f.hdr.encode();
        if !g.acks_out.is_empty() {
            let acks = std::mem::take(&mut g.acks_out);
            f.pre = Some(match f.pre.take() {
                None => acks.into_boxed_slice(),
                Some(p) => [&p[..], &acks[..]].concat().into_boxed_slice(),
            });
            self.acks_pending.store(false, Ordering::Release);
        }
        if f.wait_ack {
            // Registered before the first byte goes out: the peer's Ack can
            // be read (by another thread) before this call returns, and an
            // Ack that finds no entry would leave the send pending forever.
            if let Some(done) = f.done.take() {
                lock(&self.acks).insert(f.hdr.seq, (done, f.op_len()));
            }
        }
        if let Some(r) = f.read.take() {
            // As for acks: the answer may be read before this returns.
            lock(&self.reads).insert(f.hdr.seq, r);
        }
        if g.queue.is_empty() && !g.writer_active {
            self.touch_tx();
            match self.write_some(&mut f) {
                Ok(true) => {
                    drop(g);
                    self.frame_written(f);
                    return;
                }
                Ok(false) => {}
                // The writer task meets the same error and fails the
                // connection. Failing here could not be done safely: the
                // caller may hold the peers lock (`attach`) or this
                // connection's receive state (an Ack sent while delivering),
                // both of which failing takes.
                Err(_) => {}
            }
            g.queue.push_back(f);
            g.writer_active = true;
            drop(g);
            self.tx_kick.notify_one();
            return;
        }
        g.queue.push_back(f);
        if !g.writer_active {
            g.writer_active = true;
            drop(g);
            self.tx_kick.notify_one();
        }
    }

    fn release_credit(&self, f: &TxFrame) {
        if f.credit.held() {
            if let Some(ep) = self.ep.upgrade() {
                f.credit.give_back(&ep);
            }
        }
    }

    /// A frame that will not be (fully) written. A delivery-complete
    /// frame's completion sits in `acks` and fails with the connection.
    fn fail_frame(&self, f: TxFrame, err: Error) {
        self.release_credit(&f);
        fail_frame_done(f, err);
    }

    fn frame_written(&self, f: TxFrame) {
        self.release_credit(&f);
        let len = f.op_len();
        let TxFrame { payload, done, .. } = f;
        // The caller's buffers are let go before the completion is
        // delivered: an application that reuses a buffer on completion
        // (`Bytes::try_into_mut`) must find itself its only owner.
        drop(payload);
        // Delivery-complete frames have no `done` here: it waits in `acks`.
        let Some(done) = done else { return };
        done.complete(CqEntry {
            len,
            ..CqEntry::default()
        });
    }

    /// The peer acknowledged delivery of `seq` (`status` 0 or an error code).
    pub fn on_ack(&self, seq: u64, status: u64) {
        let done = lock(&self.acks).remove(&seq);
        if let Some((d, len)) = done {
            match Error::from_code(status as i32) {
                None if status == 0 => d.complete(CqEntry {
                    len,
                    ..CqEntry::default()
                }),
                Some(e) => d.fail_with(e),
                None => d.fail_with(Error::RemoteIo),
            }
        }
    }

    /// Sends an acknowledgement for a delivered frame.
    pub fn send_ack(self: &Arc<Self>, hdr: &Header, status: u64) {
        if hdr.flags & FLAG_ACK_REQ == 0 {
            return;
        }
        self.answer(hdr.seq, status);
    }

    /// Answers `seq` with an `Ack` carrying `status` (an RMA write's
    /// answer, which every write gets, or a delivery-complete send's).
    ///
    /// The ack is not written at once: it waits for the next frame to the
    /// peer and goes out in the same `writev`. In a request/response
    /// exchange (a write answered by a write) that halves the system calls
    /// on both sides. Only receive progress calls this, and every driver
    /// of it sends what waits soon after (see [`Conn::flush_acks`]): the
    /// reader task at the end of its pass, a spinning or inline pass at
    /// the start of the next one, and the endpoint's ack timer once an
    /// inline waiter has let go.
    pub fn answer(&self, seq: u64, status: u64) {
        let mut h = Header::new(FrameKind::Ack);
        h.seq = seq;
        h.data = status;
        let mut g = lock(&self.tx);
        if g.closed.is_none() {
            g.acks_out.extend_from_slice(&h.encode());
            self.acks_pending.store(true, Ordering::Release);
        }
    }

    /// Whether acks wait for a frame to ride with (a hint: the transmit
    /// state is what counts).
    #[inline]
    pub fn acks_waiting(&self) -> bool {
        self.acks_pending.load(Ordering::Acquire)
    }

    /// Sends the acks that wait, on their own. Returns whether there were
    /// any. Inlined: every pass of every driver asks, and mostly there
    /// are none.
    #[inline]
    pub fn flush_acks(self: &Arc<Self>) -> bool {
        self.acks_waiting() && self.send_waiting_acks()
    }

    #[inline(never)]
    fn send_waiting_acks(self: &Arc<Self>) -> bool {
        let pre = {
            let mut g = lock(&self.tx);
            self.acks_pending.store(false, Ordering::Release);
            if g.acks_out.is_empty() {
                return false;
            }
            std::mem::take(&mut g.acks_out)
        };
        self.send(TxFrame::acks_only(pre));
        true
    }

    /// Takes the read that request `seq` made, while its answer arrives.
    pub fn take_read(&self, seq: u64) -> Option<Box<PendingRead>> {
        lock(&self.reads).remove(&seq)
    }

    /// Puts back a read whose answer has more to come. On a connection
    /// that died meanwhile it fails instead, as the others did.
    pub fn put_read(&self, seq: u64, r: Box<PendingRead>) {
        if self.is_dead() {
            (*r).fail(Error::ConnReset);
            return;
        }
        lock(&self.reads).insert(seq, r);
    }

    /// Writes queued frames, in order, while the socket takes them; the
    /// frame being written stays at the head of the queue, so whoever
    /// flushes next (the writer task, or an inline waiter) continues it.
    /// `Ok(true)` when the queue is empty, `Ok(false)` when the socket is
    /// full.
    pub fn flush(&self) -> Result<bool> {
        let mut done = Vec::new();
        let mut close = false;
        let r = {
            let mut g = lock(&self.tx);
            if let Some(e) = g.closed {
                return Err(e);
            }
            loop {
                let Some(f) = g.queue.front_mut() else {
                    if (g.fin || g.close_when_out) && !g.fin_sent && !g.acks_out.is_empty() {
                        // Acks owed go out before the half-close or close:
                        // the peer reads on for them.
                        let acks = std::mem::take(&mut g.acks_out);
                        self.acks_pending.store(false, Ordering::Release);
                        g.queue.push_back(TxFrame::acks_only(acks));
                        continue;
                    }
                    // Records the receive side sealed (a key update's
                    // answer) go out before the writer rests; not after a
                    // half-close, when they could only fail the write.
                    if let Some(t) = self.tls.as_ref().filter(|_| !g.fin_sent) {
                        match t.drain(&self.std) {
                            Ok(true) => {}
                            Ok(false) => break Ok(false),
                            Err(e) => break Err(e),
                        }
                    }
                    g.writer_active = false;
                    if g.fin && !g.fin_sent {
                        g.fin_sent = true;
                        let _ = self.std.shutdown(std::net::Shutdown::Write);
                    }
                    close = g.close_when_out;
                    break Ok(true);
                };
                // Counted as activity only when bytes move: inline and
                // busy-poll passes call this on every pass, and a peer that
                // stopped reading must still look quiet to the sweeper.
                let before = f.written;
                let wrote = self.write_some(f);
                if f.written != before {
                    self.touch_tx();
                }
                match wrote {
                    Ok(true) => {
                        if let Some(f) = g.queue.pop_front() {
                            done.push(f);
                        }
                    }
                    Ok(false) => break Ok(false),
                    Err(e) => break Err(e),
                }
            }
        };
        for f in done {
            self.frame_written(f);
        }
        if close {
            self.fail(Error::Shutdown);
        }
        r
    }

    /// Bytes read so far (a retiring connection still receiving is not
    /// waited out as if it had stalled).
    pub fn rx_total(&self) -> u64 {
        self.rx_bytes.load(Ordering::Relaxed)
    }

    /// Inline progress: flushes what the writer task would, if anything is
    /// queued. A failure is left to the writer task, which fails the
    /// connection (see `send` for why not here).
    pub fn flush_if_queued(&self) -> usize {
        if !lock(&self.tx).writer_active {
            return 0;
        }
        usize::from(self.flush().is_ok())
    }

    /// The writer task: writes what the fast path could not.
    pub async fn writer(self: Arc<Self>) {
        loop {
            self.tx_kick.notified().await;
            loop {
                // A full socket must come back as `WouldBlock` so that
                // Tokio clears the readiness; otherwise `writable()` keeps
                // returning at once and this task spins.
                let r = self
                    .tio
                    .try_io(tokio::io::Interest::WRITABLE, || match self.flush() {
                        Ok(true) => Ok(true),
                        Ok(false) => Err(io::ErrorKind::WouldBlock.into()),
                        Err(e) => Err(io::Error::from_raw_os_error(e.code())),
                    });
                match r {
                    Ok(_) => break,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        if self.tio.writable().await.is_err() {
                            self.fail(Error::ConnReset);
                            return;
                        }
                    }
                    Err(_) => {
                        if lock(&self.tx).closed.is_some() {
                            return;
                        }
                        self.fail(Error::ConnReset);
                        return;
                    }
                }
            }
        }
    }

    /// Ends the connection: queued frames and pending acks fail with `err`.
    /// Idempotent. When an RDM connection ends in order (`Shutdown`: the
    /// peer's end of the stream), requests not yet begun go to the peer
    /// again over a new connection.
    pub fn fail(&self, err: Error) {
        let ep = self.ep.upgrade();
        let requeue_to = ep
            .as_ref()
            .filter(|e| self.rdm && err == Error::Shutdown && !e.is_closed());
        // The peers lock is held from the moment this connection reads as
        // dead until what it had not begun is queued for the next one: a
        // send racing with this (it finds the connection dead and queues
        // for a new one) comes after them, never before.
        let mut peers = requeue_to.map(|e| lock(&e.peers));
        if self.dead.swap(true, Ordering::AcqRel) {
            return;
        }
        let frames: Vec<TxFrame> = {
            let mut g = lock(&self.tx);
            g.closed = Some(err);
            g.queue.drain(..).collect()
        };
        let mut again = Vec::new();
        let mut failed = Vec::new();
        for f in frames {
            if peers.is_some() && f.written == 0 && f.credit.held() {
                again.push(self.unqueued(f));
            } else {
                failed.push(f);
            }
        }
        if let (Some(peers), Some(ep)) = (peers.as_mut(), requeue_to) {
            failed.extend(crate::connect::rdm_requeue(ep, peers, self, again));
        }
        drop(peers);
        for f in failed {
            self.fail_frame(f, err);
        }
        let acks: Vec<OpDone> = lock(&self.acks).drain().map(|(_, (d, _))| d).collect();
        for d in acks {
            d.fail_with(err);
        }
        let reads: Vec<Box<PendingRead>> = lock(&self.reads).drain().map(|(_, r)| r).collect();
        for r in reads {
            (*r).fail(err);
        }
        let _ = self.std.shutdown(std::net::Shutdown::Both);
        self.tx_kick.notify_one();
        self.kick.notify_one();
        self.ended.notify_waiters();
        if let Some(ep) = ep {
            ep.parked.unpark(self);
            if let Some(l) = &ep.srx {
                l.core.parked.unpark(self);
            }
            for c in ep.ctxs.rx_open() {
                c.parked.unpark(self);
            }
            // If a driver holds the receive state it finds `dead` set once
            // it lets go, and aborts it then (see `abort_rx_if_dead`).
            if let Ok(mut rx) = self.rx.try_lock() {
                rx.abort(&ep, Error::ConnReset);
            }
            ep.conn_failed(self, err);
        }
    }

    /// Called by a driver after releasing the receive state.
    pub fn abort_rx_if_dead(&self, ep: &EpShared) -> bool {
        if !self.is_dead() {
            return false;
        }
        lock(&self.rx).abort(ep, Error::ConnReset);
        true
    }

    /// Closes without completing anything (endpoint close discards).
    pub fn abort(&self) {
        self.dead.store(true, Ordering::Release);
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
        {
            let mut g = lock(&self.tx);
            g.closed = Some(Error::Canceled);
            g.queue.clear();
        }
        lock(&self.acks).clear();
        lock(&self.reads).clear();
        let _ = self.std.shutdown(std::net::Shutdown::Both);
        self.tx_kick.notify_one();
        self.kick.notify_one();
    }

    /// Non-blocking read through the `std` handle (busy-poll thread).
    pub fn read_direct(&self, buf: &mut [u8]) -> io::Result<usize> {
        use std::io::Read;
        let r = match &self.tls {
            None => (&self.std).read(buf),
            Some(t) => self.read_tls(t, buf, &mut &self.std),
        };
        if let Ok(n) = r {
            self.touch_rx(n);
        }
        r
    }

    /// Non-blocking read through the reactor's handle (interrupt mode).
    pub fn read_reactor(&self, buf: &mut [u8]) -> io::Result<usize> {
        let r = match &self.tls {
            None => self.tio.try_read(buf),
            Some(t) => self.read_tls(t, buf, &mut crate::tls::ReactorRead(&self.tio)),
        };
        if let Ok(n) = r {
            self.touch_rx(n);
        }
        r
    }

    /// Plaintext through the session. Records it sealed that the socket
    /// did not take are the writer's to send.
    fn read_tls(&self, t: &Session, buf: &mut [u8], sock: &mut dyn io::Read) -> io::Result<usize> {
        let r = t.read(buf, sock, &self.std);
        if t.take_out_pending() {
            self.kick_writer();
        }
        r
    }

    /// Lets go of the TLS session's read buffer while the connection is
    /// quiet (the sweeper's call, beside `RxMachine::shrink`).
    pub fn shrink_tls(&self) {
        if let Some(t) = &self.tls {
            t.shrink();
        }
    }

    /// Has the writer task run a flush even with nothing queued.
    fn kick_writer(&self) {
        let mut g = lock(&self.tx);
        if g.writer_active || g.closed.is_some() {
            return;
        }
        g.writer_active = true;
        drop(g);
        self.tx_kick.notify_one();
    }

    /// Writes as much of `f` as the socket takes (through the session on
    /// TLS). `Ok(true)` once the whole frame is out.
    fn write_some(&self, f: &mut TxFrame) -> Result<bool> {
        match &self.tls {
            None => write_some(&self.std, f),
            Some(t) => t.write_frame(&self.std, f),
        }
    }
}

/// Marks a connection's packets with `dscp` (the endpoint's traffic
/// class): `IP_TOS` or `IPV6_TCLASS`, whose upper six bits are the DSCP.
pub fn mark(stream: &tokio::net::TcpStream, dscp: Option<u8>) -> Result<()> {
    let Some(d) = dscp else { return Ok(()) };
    let s = socket2::SockRef::from(stream);
    let v = u32::from(d) << 2;
    if stream.local_addr()?.is_ipv4() {
        s.set_tos_v4(v)?;
    } else {
        s.set_tclass_v6(v)?;
    }
    Ok(())
}

/// What a connection's packets are marked with (`IP_TOS`/`IPV6_TCLASS`).
#[cfg(test)]
pub fn marked(stream: &std::net::TcpStream) -> Result<u32> {
    let s = socket2::SockRef::from(stream);
    Ok(if stream.local_addr()?.is_ipv4() {
        s.tos_v4()?
    } else {
        s.tclass_v6()?
    })
}

/// Fails a frame's completion (a read request's read, if it was never
/// queued on a connection). The caller accounts for its credit.
pub fn fail_frame_done(f: TxFrame, err: Error) {
    if let Some(d) = f.done {
        d.fail(CqErrEntry::new(0, Default::default(), err));
    }
    if let Some(r) = f.read {
        (*r).fail(err);
    }
}

/// Writes as much of `f` as the socket takes. `Ok(true)` once the whole
/// frame is out, `Ok(false)` when the socket is full.
fn write_some(s: &std::net::TcpStream, f: &mut TxFrame) -> Result<bool> {
    let total = f.total_len();
    let mut w = s;
    while f.written < total {
        // On the stack: no allocation per write.
        let mut iov = [io::IoSlice::new(&[]); MAX_IOV];
        let n = f.slices(&mut iov);
        match w.write_vectored(&iov[..n]) {
            Ok(0) => return Err(Error::ConnReset),
            Ok(n) => f.written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::from(e)),
        }
    }
    Ok(true)
}

#[path = "conn_retire.rs"]
mod retire;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[tokio::test]
    async fn connections_carry_the_traffic_class() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        mark(
            &a,
            weft_core::tclass::to_dscp(weft_core::tclass::LOW_LATENCY).unwrap(),
        )
        .unwrap();
        let std = a.into_std().unwrap();
        assert_eq!(marked(&std).unwrap(), 46 << 2, "EF");
        let b = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        mark(&b, None).unwrap();
        assert_eq!(marked(&b.into_std().unwrap()).unwrap(), 0, "left alone");
    }
}
