//! The receive side: datagrams are read whole into one staging buffer,
//! checked, and matched to a posted receive (copied into its buffers) or
//! held for a later receive within the unexpected budget; past the budget
//! they are dropped and counted. Malformed datagrams are dropped and
//! counted; nothing a datagram says can make the endpoint panic or hold
//! more than the budget. A keyed endpoint takes only datagrams that
//! prove its key, once each; an unkeyed one takes none that claim a key
//! (`weft_core::dgram_auth`). Refused ones are counted, never delivered.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Weak;

use bytes::BytesMut;
use weft_core::addr::{decode_sockaddr, FiAddr, FI_ADDR_NOTAVAIL};
use weft_core::av::shared::lock_synced;
use weft_core::completion::Returned;
use weft_core::dgram_auth::{addr_bytes, Replay};
use weft_core::limits::UNEXPECTED_OVERHEAD;
use weft_core::provider::RecvReq;
use weft_core::recv_completion::{copy_in, deliver, deliver_in, deliver_unknown, KnownSource};
use weft_core::soft_rx::{self, Charge, Ended};
use weft_core::soft_srx::{Queues, SrxEp};
use weft_core::sync::lock;
use weft_core::tagmatch::MsgInfo;

use crate::endpoint::{EpShared, Peer};
use crate::wire::Header;

/// Staging room: the largest datagram UDP carries fits, so no datagram is
/// ever cut short by the kernel (one longer than the header says is then
/// refused by the length check, not silently shortened).
const STAGING: usize = 1 << 16;

/// Datagrams one pass reads at most, so a flood cannot keep a waiter (or
/// the reader task) in one pass forever.
pub const PASS_LIMIT: usize = 64;

/// The receive staging buffer and the last sender looked up.
#[derive(Debug)]
pub struct RxState {
    buf: Box<[u8]>,
    /// The last sender, the AV version its handle was found in, the
    /// handle and the source its completions report (`reported_addr`):
    /// both are looked up again only for another sender or after the AV
    /// changed.
    src: Option<(Peer, u64, Source)>,
    /// Keyed endpoints: the senders' anti-replay windows.
    replay: Replay,
}

impl RxState {
    pub fn new() -> RxState {
        RxState {
            buf: vec![0u8; STAGING].into_boxed_slice(),
            src: None,
            replay: Replay::default(),
        }
    }
}

/// A sender's AV handle and what completions report as its source (its
/// user id, or the handle), as found together in one look at the AV.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source {
    pub handle: FiAddr,
    pub shown: FiAddr,
}

/// A datagram held for a later receive, with its share of the budget.
pub type Held = weft_core::soft_srx::Held<EpShared>;

/// What a pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassOutcome {
    /// Datagrams read.
    pub read: usize,
    /// The socket said it was empty.
    pub drained: bool,
    /// A posted receive completed: whoever waits for it should run before
    /// the next read (which would most likely find the socket empty).
    pub delivered: bool,
}

/// One pass over the socket: reads datagrams with `read` (one datagram
/// into the buffer: its length and sender) until it is
/// empty, a posted receive completes, or [`PASS_LIMIT`] were read. `to`
/// is the address they were sent to (the endpoint's, or a multicast
/// group's), as keyed datagrams' MACs name it. The caller holds `st`
/// (one reader at a time).
/// Generic over `read`, so that the socket's read is inlined into the
/// pass.
pub fn pass<R>(ep: &EpShared, st: &mut RxState, to: SocketAddr, mut read: R) -> PassOutcome
where
    R: FnMut(&mut [u8]) -> io::Result<(usize, SocketAddr)>,
{
    let mut out = PassOutcome::default();
    while out.read < PASS_LIMIT && !ep.is_closed() {
        let (n, from) = match read(&mut st.buf) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                out.drained = true;
                break;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // Read, but with a sender address that says nothing.
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                out.read += 1;
                ep.malformed.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            // A pending socket error (reported once) or a resource
            // shortage: nothing to read now. The next pass reads again.
            Err(e) => {
                tracing::debug!(error = %e, "udp: receive failed");
                out.drained = true;
                break;
            }
        };
        out.read += 1;
        if arrived(ep, st, n, from, to) {
            out.delivered = true;
            break;
        }
    }
    out
}

/// One datagram of `n` bytes from `from` in the staging buffer. True when
/// it completed a posted receive. Inlined: its one caller is the pass.
#[inline(always)]
fn arrived(ep: &EpShared, st: &mut RxState, n: usize, from: SocketAddr, to: SocketAddr) -> bool {
    let Some(d) = st.buf.get(..n) else {
        return false;
    };
    let (h, payload, key) = if ep.raw {
        // A plain UDP payload: every datagram is a message.
        (Header::new(None, None, 0), d, None)
    } else {
        match Header::decode(d) {
            // The key check out of line: most endpoints have none.
            Ok((h, payload, _)) if !h.keyed && !ep.keys.keyed() => (h, payload, None),
            Ok((h, payload, trailer)) => {
                let ends = (from, to);
                match proven(ep, &mut st.replay, d, &h, (payload, trailer), ends) {
                    Some(key) => (h, payload, key),
                    None => return false,
                }
            }
            Err(_) => {
                ep.malformed.fetch_add(1, Ordering::Relaxed);
                return false;
            }
        }
    };
    let from = Peer { addr: from, key };
    let src = source_cached(ep, &mut st.src, &from);
    let info = MsgInfo {
        // Key handles are below `MAX_AV_AUTH_KEYS`.
        key: key.and_then(|k| u16::try_from(k).ok()),
        src: src.handle,
        tagged: h.tag.is_some(),
        tag: h.tag.unwrap_or(0),
        len: payload.len(),
        data: h.data,
    };
    let mut m = lock(&ep.side.matcher);
    let mut ended = Ended::default();
    // The request is completed where the matcher put it, through
    // references: a receive request is large, and every move of one
    // copies it.
    let mut got = soft_rx::arrival_into(&mut m, &info, &mut ended);
    if let Some(req) = got.as_mut() {
        drop(m);
        ended.report(ep);
        ep.report_here(req);
        let placed = copy_in(req, payload);
        let unknown = if ep.source_err {
            ep.unknown_sender(info.src, &from)
        } else {
            None
        };
        match unknown {
            Some((reported, raw)) => {
                if let Some(req) = got.take() {
                    deliver_unknown(ep, req, info, placed, reported, raw);
                }
            }
            None if src.handle == info.src => deliver_in(
                &KnownSource {
                    ep,
                    handle: src.handle,
                    shown: src.shown,
                },
                req,
                &info,
                placed,
            ),
            None => deliver_in(ep, req, &info, placed),
        }
        // What `deliver_in` left owns nothing: dropping it would only
        // run the fields' empty drops.
        debug_assert!(got.as_ref().is_none_or(|r| r.owns_nothing()));
        std::mem::forget(got);
        return true;
    }
    // Every datagram costs something, a zero-length one included.
    let charge = UNEXPECTED_OVERHEAD.saturating_add(payload.len());
    match Charge::try_new(&ep.side.unexp, charge, ep.side.limit) {
        Some(c) => {
            let held = Held::new(ep, BytesMut::from(payload), from, c);
            m.push_unexpected(ep.sender(from), info, held);
            drop(m);
        }
        None => {
            drop(m);
            ep.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
    ended.report(ep);
    false
}

/// Whether a well-formed datagram `d` from `from` to `to` may be
/// delivered, and the AV key handle it proved: on a keyed endpoint, one
/// whose trailer proves a key held here (checked in constant time) with a
/// sequence number not seen before from `from`; on an unkeyed one, one
/// that claims no key. Anything else is counted and dropped (`None`).
#[inline(never)]
fn proven(
    ep: &EpShared,
    replay: &mut Replay,
    d: &[u8],
    h: &Header,
    (payload, trailer): (&[u8], &[u8]),
    (from, to): (SocketAddr, SocketAddr),
) -> Option<Option<FiAddr>> {
    if !h.keyed && !ep.keys.keyed() {
        return Some(None);
    }
    let header = d.get(..crate::wire::HEADER_LEN).unwrap_or(&[]);
    let ends = (&addr_bytes(&from), &addr_bytes(&to));
    match ep.keys.check(h, ends, header, payload, trailer) {
        Ok(None) => Some(None),
        Ok(Some(p)) if replay.accept(from, p.seq) => Some(p.key),
        Ok(Some(_)) => {
            ep.replayed.fetch_add(1, Ordering::Relaxed);
            None
        }
        Err(_) => {
            ep.key_rejected.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// The AV handle of `from` and the source its completions report, looked
/// up again only when the sender or the AV changed since the last
/// datagram; a private AV's version is read without its lock.
#[inline(always)]
fn source_cached(ep: &EpShared, cache: &mut Option<(Peer, u64, Source)>, from: &Peer) -> Source {
    let Some(av) = &ep.cfg.av else {
        return Source {
            handle: FI_ADDR_NOTAVAIL,
            shown: FI_ADDR_NOTAVAIL,
        };
    };
    let now = ep.av_version(av);
    if let Some((a, cv, s)) = cache.as_ref() {
        if a == from && *cv == now {
            return *s;
        }
    }
    // The version read again under the lock: the lookup is valid for
    // that one (the AV may have changed since `now`).
    let t = lock_synced(av);
    let v = t.version();
    let handle = t
        .find_keyed(&weft_core::addr::sockaddr_bytes(&from.addr), from.key)
        .unwrap_or(FI_ADDR_NOTAVAIL);
    let shown = if handle == FI_ADDR_NOTAVAIL {
        FI_ADDR_NOTAVAIL
    } else {
        t.reported_addr(handle)
    };
    let s = Source { handle, shown };
    *cache = Some((*from, v, s));
    s
}

/// Copies a datagram into a receive and completes it: as usual, or for a
/// sender not in the AV on an `FI_SOURCE_ERR` endpoint as the error entry
/// that carries the datagram and the sender's address. A datagram longer
/// than the receive's buffers completes it with `FI_ETRUNC`.
pub fn copy_and_deliver(ep: &EpShared, mut req: RecvReq, info: MsgInfo, data: &[u8], from: &Peer) {
    ep.report_here(&mut req);
    let placed = copy_in(&mut req, data);
    match ep.unknown_sender(info.src, from) {
        Some((reported, raw)) => deliver_unknown(ep, req, info, placed, reported, raw),
        None => deliver(ep, req, info, placed),
    }
}

/// Completes a receive with a held datagram (which frees its budget).
pub fn deliver_held(ep: &EpShared, req: RecvReq, info: MsgInfo, held: Held) {
    copy_and_deliver(ep, req, info, &held.data, &held.from);
}

impl EpShared {
    /// Takes back a datagram whose receive's future was dropped as the
    /// datagram reached it: the oldest posted receive that accepts it
    /// gets it, else it goes to the head of the held datagrams, charged
    /// even past the budget (it was admitted once; refusing it now could
    /// only drop it). `after`: a datagram of a dropped multi-receive
    /// stream, held behind the ones given back before it.
    pub fn take_back(&self, mut r: Returned, after: bool) {
        if self.is_closed() {
            return;
        }
        let info = r.info();
        let data = r.take_bytes();
        let from = Peer {
            addr: self.source_of(info.src, &r.raw),
            key: info.key.map(FiAddr::from),
        };
        let mut m = lock(&self.side.matcher);
        let (got, ended) = soft_rx::arrival(&mut m, &info);
        if let Some(req) = got {
            drop(m);
            ended.report(self);
            copy_and_deliver(self, req, info, &data, &from);
            return;
        }
        let charge = Charge::force(
            &self.side.unexp,
            UNEXPECTED_OVERHEAD.saturating_add(info.len),
        );
        let held = Held::new(self, data, from, charge);
        soft_rx::hold_given_back(&mut m, self.sender(from), info, held, after);
        drop(m);
        ended.report(self);
    }

    /// The address of the sender with AV handle `src`, or for a sender
    /// unknown at arrival the address it came from (`raw`, kept for
    /// `FI_SOURCE_ERR`), or an unspecified one that resolves to nothing.
    fn source_of(&self, src: FiAddr, raw: &[u8]) -> SocketAddr {
        let unknown = decode_sockaddr(raw).unwrap_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)));
        if src == FI_ADDR_NOTAVAIL {
            return unknown;
        }
        self.dest_addr(src).map_or(unknown, |(a, _)| a)
    }
}

impl SrxEp for EpShared {
    type Addr = Peer;

    fn this(&self) -> Weak<EpShared> {
        self.this.clone()
    }

    fn rx_queues(&self) -> Queues {
        (self.cfg.rx_cq.clone(), self.cfg.rx_cntr.clone())
    }

    fn shared(&self) -> bool {
        self.srx.is_some()
    }

    fn handle_of(&self, addr: &Peer) -> FiAddr {
        self.resolve_src(addr)
    }

    fn deliver_held(&self, req: RecvReq, info: MsgInfo, held: Held) {
        deliver_held(self, req, info, held);
    }
}
