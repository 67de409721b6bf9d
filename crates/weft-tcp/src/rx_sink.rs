//! Where a frame's payload goes while it arrives (a posted receive, an
//! unexpected message, a region, a read's answer, an atomic's arrays, or
//! nowhere), and what happens when it is whole or never will be.

use std::sync::Arc;

use bytes::BytesMut;
use weft_core::flags::OpFlags;
use weft_core::provider::RecvReq;
use weft_core::sync::lock;
use weft_core::tagmatch::MsgInfo;
use weft_core::wire::rma::TARGET_LEN;
use weft_core::wire::Header;
use weft_core::Error;

use super::{copy_and_deliver, deliver_from, fail_recv, Unexpected};
use crate::atomic::AtomicSink;
use crate::conn::Conn;
use crate::endpoint::EpShared;
use crate::rma::{PendingRead, WriteSink};

/// What a payload feeds.
pub(super) enum Sink {
    Posted {
        req: RecvReq,
        info: MsgInfo,
        seg: usize,
        off: usize,
        placed: usize,
    },
    Unexpected(Arc<Unexpected>),
    /// An RMA write's bytes, going into a region (or refused).
    Write(WriteSink),
    /// A piece of the answer to read request `seq` (or the answer to an
    /// atomic).
    Read {
        seq: u64,
        read: Box<PendingRead>,
    },
    /// An atomic request's arrays, held until they are whole.
    Atomic(Box<AtomicSink>),
    /// A message for a receive context the endpoint does not have: its
    /// bytes are read and thrown away, so the connection carries on.
    Discard,
}

/// Copies staged bytes into the sink.
pub(super) fn feed(sink: &mut Sink, mut data: &[u8]) {
    match sink {
        Sink::Unexpected(u) => {
            feed_unexpected(u, data);
            return;
        }
        Sink::Write(w) => {
            w.feed(data);
            return;
        }
        Sink::Read { read, .. } => {
            read.feed(data);
            return;
        }
        Sink::Atomic(a) => {
            a.feed(data);
            return;
        }
        Sink::Discard => return,
        Sink::Posted { .. } => {}
    }
    while !data.is_empty() {
        let n = match direct_slot(sink, data.len()) {
            Some(slot) => {
                let n = slot.len().min(data.len());
                slot[..n].copy_from_slice(&data[..n]);
                n
            }
            // Past the receive buffer: the rest is truncated away.
            None => data.len(),
        };
        advance(sink, n);
        data = &data[n..];
    }
}

/// The next writable region of the sink (at most `max` bytes), or `None`
/// when the bytes are to be discarded.
pub(super) fn direct_slot(sink: &mut Sink, max: usize) -> Option<&mut [u8]> {
    match sink {
        Sink::Posted { req, seg, off, .. } => {
            while *seg < req.bufs.len() && *off >= req.bufs[*seg].len() {
                *seg += 1;
                *off = 0;
            }
            let b = req.bufs.get_mut(*seg)?;
            let end = (*off + max).min(b.len());
            Some(&mut b[*off..end])
        }
        Sink::Read { read, .. } => read.slot(max),
        // A region is reached only under its lock: through staging.
        Sink::Unexpected(_) | Sink::Write(_) | Sink::Atomic(_) | Sink::Discard => None,
    }
}

pub(super) fn advance(sink: &mut Sink, n: usize) {
    match sink {
        Sink::Posted {
            req,
            seg,
            off,
            placed,
            ..
        } => {
            if *seg < req.bufs.len() {
                *off += n;
                *placed += n;
            }
        }
        Sink::Read { read, .. } => read.advance(n),
        Sink::Unexpected(_) | Sink::Write(_) | Sink::Atomic(_) | Sink::Discard => {}
    }
}

/// Unexpected payloads are appended under their lock: a receive may be
/// matching them concurrently.
fn feed_unexpected(u: &Unexpected, data: &[u8]) {
    let mut g = lock(&u.st);
    let n = data.len().min(g.len.saturating_sub(g.data.len()));
    g.data.extend_from_slice(&data[..n]);
}

/// The message feeding `sink` will not arrive whole. The receive it had
/// matched did not get its message, so it goes back to the head of the
/// posted receives (a claim fails instead: it asked for this very
/// message); a message nobody had matched leaves the unexpected queue.
pub(super) fn fail_sink(ep: &EpShared, sink: Sink, err: Error) {
    match sink {
        Sink::Posted { req, .. } => ep.repost_front(req),
        // Its initiator learns from the connection's end.
        Sink::Write(_) | Sink::Atomic(_) | Sink::Discard => {}
        Sink::Read { read, .. } => (*read).fail(err),
        Sink::Unexpected(u) => {
            let waiter = {
                let mut g = lock(&u.st);
                g.failed = Some(err);
                g.data = BytesMut::new();
                g.waiter.take()
            };
            match waiter {
                Some(w) if w.0.flags.contains(OpFlags::CLAIM) => {
                    let (req, info) = *w;
                    fail_recv(ep, req, info, 0, err)
                }
                Some(w) => ep.repost_front(w.0),
                None => ep.drop_dead_unexpected(&u),
            }
        }
    }
}

/// A whole payload has arrived.
pub(super) fn finish(conn: &Arc<Conn>, ep: &Arc<EpShared>, hdr: &Header, sink: Sink) {
    match sink {
        Sink::Posted {
            req, info, placed, ..
        } => {
            deliver_from(ep, req, info, placed, &conn.source());
            conn.send_ack(hdr, 0);
        }
        Sink::Unexpected(u) => {
            let waiter = {
                let mut g = lock(&u.st);
                g.complete = true;
                g.waiter.take().map(|w| {
                    let (req, info) = *w;
                    (req, info, std::mem::take(&mut g.data))
                })
            };
            if let Some((req, info, data)) = waiter {
                copy_and_deliver(ep, req, info, &data, &u.from);
            }
            conn.send_ack(hdr, 0);
        }
        Sink::Write(w) => {
            let len = (hdr.len as usize).saturating_sub(TARGET_LEN);
            w.finish(conn, ep, hdr, len);
        }
        Sink::Read { seq, read } => crate::rma::piece_done(conn, seq, read),
        Sink::Atomic(a) => a.finish(conn, ep),
        // A delivery-complete sender learns that nothing took it.
        Sink::Discard => conn.send_ack(hdr, Error::AddrNotAvail.code() as u64),
    }
}
