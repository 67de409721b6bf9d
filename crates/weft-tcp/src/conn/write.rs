//! The transmit side: queueing a frame, direct non-blocking writes from
//! the posting thread, and the writer task for what the socket did not take.

use std::io::{self, Write};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use weft_core::completion::{CqEntry, CqErrEntry};
use weft_core::sync::lock;
use weft_core::wire::FrameKind;
use weft_core::{Error, Result};

use super::Conn;
use crate::frame::TxFrame;

/// Most I/O slices handed to one `writev` (header + the iov limit, with
/// room to spare; a longer list is written in several calls).
pub const MAX_IOV: usize = 16;

impl Conn {
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
    pub(super) fn fail_frame(&self, f: TxFrame, err: Error) {
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

    /// Has the writer task run a flush even with nothing queued.
    pub(super) fn kick_writer(&self) {
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
