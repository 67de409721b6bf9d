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
use std::sync::MutexGuard;

use rustix::net::SocketAddrAny;
use smallvec::SmallVec;
use weft_core::addr::{decode_sockaddr, FiAddr, FI_ADDR_NOTAVAIL};
use weft_core::av::shared::lock_synced;
use weft_core::av::AvTable;
use weft_core::completion::{CqEntry, CqErrEntry, OpDone};
use weft_core::dgram_auth::addr_bytes;
use weft_core::flags::OpFlags;
use weft_core::provider::{Iov, SendReq};
use weft_core::sync::{lock, FastGuard};
use weft_core::Error;

use crate::endpoint::EpShared;
use crate::keys::Seal;
use crate::sock::send_parts;
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

/// The last destination a send resolved: its AV handle and the AV version
/// the lookup was made in, the address in the form `sendmsg` takes, and
/// the key handle its entry is under. A run of sends to one peer (every
/// ping-pong) reads only the AV's version (under the AV's lock only for a
/// named AV), not the lookup, the address decoding and the conversion.
#[derive(Debug)]
struct LastDest {
    handle: FiAddr,
    version: u64,
    addr: SocketAddr,
    to: SocketAddrAny,
    key: Option<FiAddr>,
}

/// Datagrams waiting, oldest first, and the last destination resolved;
/// one lock for both, which every send takes anyway.
#[derive(Debug, Default)]
pub struct TxQueue {
    q: VecDeque<Queued>,
    last: Option<LastDest>,
}

/// Room for the parts of one datagram: header, buffers, trailer.
const PARTS: usize = 2 + crate::IOV_LIMIT;

/// The parts of one datagram, in order: header, buffers (the empty ones
/// left out), trailer, written to `p`; returns how many there are. An
/// array, not a vector: a 64 B ping-pong builds one per send.
#[inline(always)]
fn parts<'a>(
    p: &mut [IoSlice<'a>; PARTS],
    hdr: Option<&'a [u8]>,
    iov: &'a Iov,
    trailer: Option<&'a [u8]>,
) -> usize {
    let mut n = 0;
    let mut put = |b: &'a [u8]| {
        if let (false, Some(slot)) = (b.is_empty(), p.get_mut(n)) {
            *slot = IoSlice::new(b);
            n += 1;
        }
    };
    if let Some(h) = hdr {
        put(h);
    }
    for b in iov.iter() {
        put(b);
    }
    if let Some(t) = trailer {
        put(t);
    }
    n
}

/// The lookup of [`EpShared::resolve_dest`], in the AV `t` at `version`.
#[cold]
#[inline(never)]
fn look_up(
    t: MutexGuard<'_, AvTable>,
    last: &mut Option<LastDest>,
    dest: FiAddr,
    version: u64,
) -> weft_core::Result<()> {
    let (bytes, key) = t.lookup_keyed(dest).map_err(|_| Error::AddrNotAvail)?;
    let addr = decode_sockaddr(bytes).map_err(|_| Error::AddrNotAvail)?;
    drop(t);
    *last = Some(LastDest {
        handle: dest,
        version,
        addr,
        to: SocketAddrAny::from(addr),
        key,
    });
    Ok(())
}

/// Sends one queued datagram.
fn send_now(sock: &std::net::UdpSocket, d: &Queued) -> io::Result<()> {
    let trailer = d.trailer.as_ref().map(|(t, n)| t.get(..*n).unwrap_or(t));
    let mut p = [IoSlice::new(&[]); PARTS];
    let n = parts(&mut p, d.hdr.as_ref().map(|h| &h[..]), &d.iov, trailer);
    send_parts(sock, p.get(..n).unwrap_or(&p), &d.dest)
}

/// Ends a send: its credit back first (so whoever it wakes can post
/// again), then its completion.
#[inline(always)]
pub fn finish(ep: &EpShared, done: OpDone, len: usize, r: io::Result<()>) {
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

/// What [`EpShared::offer`] made of a send.
pub enum Offered<'a> {
    /// The kernel took the datagram (or refused it for good): the send
    /// ends with this, its length and the outcome.
    Sent(usize, io::Result<()>),
    /// It waits behind earlier datagrams, or for room in the socket: it
    /// goes into the queue still locked, so that no later send passes it.
    Wait(FastGuard<'a, TxQueue>, Waiting),
}

/// A datagram's parts built before it was found to wait: all of a
/// [`Queued`] but the request's buffers and completion.
pub struct Waiting {
    hdr: Option<[u8; HEADER_LEN]>,
    trailer: Option<([u8; NAMED_TRAILER_LEN], usize)>,
    dest: SocketAddr,
    len: usize,
}

impl Waiting {
    /// Queues the datagram, made of these parts and the request's
    /// buffers, under the lock `q` its send attempt held, and wakes the
    /// writer.
    pub fn enqueue(self, ep: &EpShared, mut q: FastGuard<'_, TxQueue>, iov: Iov, done: OpDone) {
        q.q.push_back(Queued {
            hdr: self.hdr,
            iov,
            trailer: self.trailer,
            dest: self.dest,
            len: self.len,
            done,
        });
        drop(q);
        ep.tx_pending.store(true, Ordering::Release);
        ep.tx_kick.notify_one();
    }
}

impl EpShared {
    /// Sends `req`'s datagram if nothing waits and the socket takes it.
    /// Checks happen first, before anything is taken: a closed endpoint
    /// is `OpBadState`, a message longer than one datagram carries is
    /// `MsgSize`, an address not in the AV `AddrNotAvail`, a full queue
    /// `Again`. One body, no struct handed
    /// between parts of it, and the request looked at by reference: on a
    /// 64 B ping-pong, every move of a request or of a part's result was
    /// a copy (`post_send` keeps the request until its end).
    #[inline(always)]
    pub fn offer(&self, req: &SendReq) -> weft_core::Result<Offered<'_>> {
        if self.is_closed() {
            return Err(Error::OpBadState);
        }
        let len = req.len();
        if len > self.max_msg {
            return Err(Error::MsgSize);
        }
        if req.flags.contains(OpFlags::INJECT) && len > self.inject {
            return Err(Error::MsgSize);
        }
        if req.iov.len() > self.iov_limit {
            return Err(Error::Inval);
        }
        let mut guard = lock(&self.txq);
        let q = &mut *guard;
        // A multicast group's address, or the AV entry just resolved.
        let group = self.resolve_dest(&mut q.last, req.dest)?;
        let (entry, to_addr) = match (&group, &q.last) {
            (Some(a), _) => (None, *a),
            (None, Some(l)) => (Some(l), l.addr),
            (None, None) => return Err(Error::AddrNotAvail),
        };
        let seal = self.keys.for_dest(entry.and_then(|l| l.key))?;
        if !self.tx.try_take() {
            return Err(Error::Again);
        }
        // `FI_FENCE` asks nothing more: datagrams leave in posting order
        // (the queue) and a send completes as the kernel takes it, so
        // every send posted before a fenced one has completed when it
        // begins.
        // `len` fits: it is at most one datagram.
        let hdr = if self.raw {
            if req.tag.is_some() || req.data.is_some() {
                // Nothing but the payload goes out; the offer has neither.
                self.tx.release(1);
                return Err(Error::NoSys);
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
                let to = addr_bytes(&to_addr);
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
        if q.q.is_empty() {
            // Straight from the caller's buffers; a `Queued` only if the
            // socket is full.
            let tr = trailer.as_ref().map(|(t, n)| t.get(..*n).unwrap_or(t));
            let mut p = [IoSlice::new(&[]); PARTS];
            let n = parts(&mut p, hdr.as_ref().map(|h| &h[..]), &req.iov, tr);
            let p = p.get(..n).unwrap_or(&p);
            let r = match entry {
                Some(l) => send_parts(&self.sock, p, &l.to),
                None => send_parts(&self.sock, p, &to_addr),
            };
            match r {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                r => return Ok(Offered::Sent(len, r)),
            }
        }
        // Behind earlier datagrams, or the socket is full: in order.
        let w = Waiting {
            hdr,
            trailer,
            dest: to_addr,
            len,
        };
        Ok(Offered::Wait(guard, w))
    }

    /// Resolves AV handle `dest` into `last` (its address, and the key
    /// handle its entry is under): the entry is looked up again only for
    /// another handle or after the AV changed, whose version a private AV
    /// gives without its lock ([`av_version`](Self::av_version)). A multicast group's handle is
    /// answered with the group's address instead (`Some`). Inlined; the
    /// lookup itself is out of line.
    #[inline(always)]
    fn resolve_dest(
        &self,
        last: &mut Option<LastDest>,
        dest: FiAddr,
    ) -> weft_core::Result<Option<SocketAddr>> {
        if dest & crate::multicast::MC_BIT != 0 && dest != FI_ADDR_NOTAVAIL {
            return self.groups.dest(dest).map(Some);
        }
        let av = self.cfg.av.as_ref().ok_or(Error::NoAv)?;
        let now = self.av_version(av);
        if matches!(last, Some(l) if l.handle == dest && l.version == now) {
            return Ok(None);
        }
        // The version read again under the lock: the lookup is valid for
        // that one (the AV may have changed since `now`).
        let t = lock_synced(av);
        let version = t.version();
        look_up(t, last, dest, version).map(|()| None)
    }

    /// [`flush_queued`](Self::flush_queued) when datagrams wait: every
    /// progress pass asks, and the answer is almost always no.
    #[inline]
    pub fn flush(&self) -> (usize, bool) {
        if !self.tx_pending.load(Ordering::Acquire) {
            return (0, true);
        }
        self.flush_queued()
    }

    /// Sends queued datagrams while the socket takes them. Returns how
    /// many left the queue, and whether it is empty now.
    #[cold]
    fn flush_queued(&self) -> (usize, bool) {
        let mut done: SmallVec<[(OpDone, usize, io::Result<()>); 8]> = SmallVec::new();
        let empty = {
            let mut g = lock(&self.txq);
            let q = &mut g.q;
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
