//! The send side: a datagram is the header and the caller's buffers,
//! written with one vectored `sendmsg` from the posting thread (no copy,
//! no task hop). When the socket's send buffer is full the datagram waits
//! in a queue, in order, until a driver finds room; a send completes once
//! the kernel has taken its datagram. Nothing is retransmitted. A keyed
//! endpoint's datagrams end with a trailer (`weft_core::dgram_auth`): the
//! MAC is computed over the caller's buffers in place, so this still
//! copies nothing.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use smallvec::SmallVec;
use socket2::{SockAddr, SockRef};
use weft_core::completion::{CqEntry, CqErrEntry, OpDone};
use weft_core::dgram_auth::addr_bytes;
use weft_core::flags::OpFlags;
use weft_core::provider::{Iov, Rejected, SendReq};
use weft_core::sync::lock;
use weft_core::Error;

use crate::endpoint::EpShared;
use crate::keys::Seal;
use crate::wire::{Header, HEADER_LEN, NAMED_TRAILER_LEN};

/// A datagram waiting for room in the socket.
#[derive(Debug)]
pub struct Queued {
    /// `None` on `FI_EP_SOCK_DGRAM` endpoints (the payload alone).
    hdr: Option<[u8; HEADER_LEN]>,
    iov: Iov,
    /// A keyed endpoint's proof of its key: the bytes, and how many of
    /// them are the trailer (`TRAILER_LEN`, or `NAMED_TRAILER_LEN` when
    /// it names the key).
    trailer: Option<([u8; NAMED_TRAILER_LEN], usize)>,
    dest: SocketAddr,
    len: usize,
    done: OpDone,
}

/// Datagrams waiting, oldest first.
pub type TxQueue = VecDeque<Queued>;

/// Sends one datagram: the header, the buffers, then the trailer.
fn send_now(sock: &std::net::UdpSocket, d: &Queued) -> io::Result<()> {
    let mut parts: SmallVec<[IoSlice<'_>; 2 + crate::IOV_LIMIT]> = SmallVec::new();
    if let Some(h) = &d.hdr {
        parts.push(IoSlice::new(h));
    }
    parts.extend(
        d.iov
            .iter()
            .filter(|b| !b.is_empty())
            .map(|b| IoSlice::new(b)),
    );
    if let Some((t, n)) = &d.trailer {
        parts.push(IoSlice::new(t.get(..*n).unwrap_or(t)));
    }
    let dest = d.dest;
    let to = SockAddr::from(dest);
    let s = SockRef::from(sock);
    loop {
        match s.send_to_vectored(&parts, &to) {
            // UDP takes a datagram whole or not at all.
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Ends a send: its credit back first (so whoever it wakes can post
/// again), then its completion.
fn finish(ep: &EpShared, done: OpDone, len: usize, r: io::Result<()>) {
    ep.tx.release(1);
    match r {
        Ok(()) => done.complete(CqEntry {
            len,
            ..CqEntry::default()
        }),
        Err(e) => {
            let err = Error::from(e);
            tracing::debug!(error = %err, "udp: send failed");
            done.fail(CqErrEntry::new(0, OpFlags::empty(), err));
        }
    }
}

impl EpShared {
    /// Posts a send. Checks happen here, before anything is taken: a
    /// message longer than one datagram carries is `MsgSize`, an
    /// address not in the AV `AddrNotAvail`, a full queue `Again`.
    pub fn send(&self, req: SendReq) -> std::result::Result<(), Rejected<SendReq>> {
        let len = req.len();
        let reject = |err, req| Err(Rejected { err, req });
        if len > self.max_msg {
            return reject(Error::MsgSize, req);
        }
        if req.flags.contains(OpFlags::INJECT) && len > self.inject {
            return reject(Error::MsgSize, req);
        }
        if req.iov.len() > self.iov_limit {
            return reject(Error::Inval, req);
        }
        let (dest, seal) = match self
            .dest_addr(req.dest)
            .and_then(|(d, k)| Ok((d, self.keys.for_dest(k)?)))
        {
            Ok(d) => d,
            Err(e) => return reject(e, req),
        };
        if !self.tx.try_take() {
            return reject(Error::Again, req);
        }
        // `FI_FENCE` asks nothing more: datagrams leave in posting order
        // (the queue below) and a send completes as the kernel takes it,
        // so every send posted before a fenced one has completed when it
        // begins.
        // `len` fits: it is at most one datagram.
        let hdr = if self.raw {
            if req.tag.is_some() || req.data.is_some() {
                // Nothing but the payload goes out; the offer has neither.
                self.tx.release(1);
                return reject(Error::NoSys, req);
            }
            None
        } else {
            let h = Header::new(req.tag, req.data, len as u32);
            let h = match seal {
                Seal::None => h,
                Seal::Own(_) => h.with_key(true),
                Seal::Named(_) => h.with_named_key(),
            };
            Some(h.encode())
        };
        // The MAC covers the header as sent, so it is sealed after it.
        let trailer = match (seal, &hdr) {
            (Seal::Own(k) | Seal::Named(k), Some(h)) => {
                let seq = self.seq.fetch_add(1, Ordering::Relaxed);
                let to = addr_bytes(&dest);
                let body = req.iov.iter().map(|b| &b[..]);
                let mut t = [0u8; NAMED_TRAILER_LEN];
                let n = if matches!(seal, Seal::Named(_)) {
                    t = k.seal_with_id(&self.src_bytes, &to, h, seq, body);
                    NAMED_TRAILER_LEN
                } else {
                    let short = k.seal(&self.src_bytes, &to, h, seq, body);
                    t[..short.len()].copy_from_slice(&short);
                    short.len()
                };
                Some((t, n))
            }
            _ => None,
        };
        let d = Queued {
            hdr,
            iov: req.iov,
            trailer,
            dest,
            len,
            done: req.done,
        };
        let mut q = lock(&self.txq);
        if q.is_empty() {
            match send_now(&self.sock, &d) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                r => {
                    drop(q);
                    finish(self, d.done, len, r);
                    return Ok(());
                }
            }
        }
        // Behind earlier datagrams, or the socket is full: in order.
        q.push_back(d);
        drop(q);
        self.tx_pending.store(true, Ordering::Release);
        self.tx_kick.notify_one();
        Ok(())
    }

    /// Sends queued datagrams while the socket takes them. Returns how
    /// many left the queue, and whether it is empty now.
    pub fn flush(&self) -> (usize, bool) {
        if !self.tx_pending.load(Ordering::Acquire) {
            return (0, true);
        }
        let mut done: SmallVec<[(OpDone, usize, io::Result<()>); 8]> = SmallVec::new();
        let empty = {
            let mut q = lock(&self.txq);
            while let Some(d) = q.front() {
                let r = send_now(&self.sock, d);
                if matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
                    break;
                }
                if let Some(d) = q.pop_front() {
                    done.push((d.done, d.len, r));
                }
                if done.len() == done.inline_size() {
                    break;
                }
            }
            let empty = q.is_empty();
            self.tx_pending.store(!empty, Ordering::Release);
            empty
        };
        let n = done.len();
        // Completions outside the queue's lock: they wake tasks that may
        // post again at once.
        for (d, len, r) in done {
            finish(self, d, len, r);
        }
        (n, empty)
    }
}
