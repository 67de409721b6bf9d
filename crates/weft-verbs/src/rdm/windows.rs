//! Rendezvous sources through memory windows.
//!
//! A rendezvous send's payload has to be readable by the peer until it
//! says it is done. Registering the caller's buffer for that costs two
//! system calls per message that pin and unpin its pages (a cached
//! registration saves them only for buffers the caller sends again).
//! Up to [`STAGE_MAX`](super::lanes::STAGE_MAX) bytes, the payload is
//! instead copied into a slot registered once, and the peer reads the
//! slot through a type 2 memory window bound, in the same post as the
//! request-to-send, to that connection's queue pair only: a region's own
//! key would let any queue pair of the lane's protection domain (every
//! peer under the same key) read it. The peer's "finished" revokes the
//! window (a send with invalidate), so the slot and window go back to the
//! pool with nobody able to read them. A loan whose window was not
//! revoked that way (a peer that answered without it, a transfer cut
//! off) stays parked on its connection until the connection, and so its
//! queue pair, is gone.
//!
//! Each slot is a region of its own because soft-RoCE bounds a window's
//! reads by its region, not by the window: a window over part of a larger
//! region would expose the rest. For the same reason the tail of a slot
//! beyond a shorter transfer is zeroed, so that only this transfer's
//! bytes can be read.

use std::sync::{Arc, Weak};

use bytes::Bytes;
use weft_core::sync::{lock, FastMutex};
use weft_core::wire::rdm::{Header, Op as WireOp, HDR};
use weft_core::{Error, Result};

use super::lanes::STAGE_MAX;
use super::Conn;
use crate::sys::{AccessFlags, MemoryWindow, OwnedMr, Payload, ProtectionDomain, SendFlags};
use crate::sys::{SendOp, SendRequest};

/// Source slots per lane, made on first use: 512 KiB pinned at most.
/// Sends that find none free register their buffers.
const SOURCE_SLOTS: usize = 4;

/// Zeros for clearing a slot's stale tail.
static ZEROS: [u8; 4096] = [0; 4096];

/// A slot and its window. The window is declared first so that it is
/// deallocated before the region is deregistered (a region with a window
/// bound cannot be).
struct Held {
    window: Option<MemoryWindow>,
    mr: OwnedMr,
    /// Bytes at the start of the slot that may hold an earlier payload.
    dirty: usize,
}

/// A lane's source slots.
pub(crate) struct SourceSlots {
    pd: Arc<ProtectionDomain>,
    inner: FastMutex<Pool>,
}

struct Pool {
    free: Vec<Held>,
    /// Slots made so far; `SOURCE_SLOTS` also once making one failed.
    made: usize,
}

impl std::fmt::Debug for SourceSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = lock(&self.inner);
        f.debug_struct("SourceSlots")
            .field("free", &g.free.len())
            .field("made", &g.made)
            .finish()
    }
}

impl SourceSlots {
    pub(crate) fn new(pd: &Arc<ProtectionDomain>) -> Arc<SourceSlots> {
        Arc::new(SourceSlots {
            pd: pd.clone(),
            inner: FastMutex::new(Pool {
                free: Vec::with_capacity(SOURCE_SLOTS),
                made: 0,
            }),
        })
    }

    /// A free slot (made if fewer than [`SOURCE_SLOTS`] exist), if any.
    pub(crate) fn take(self: &Arc<Self>) -> Option<SourceLoan> {
        let mut g = lock(&self.inner);
        let held = match g.free.pop() {
            Some(h) => h,
            None => self.make(&mut g)?,
        };
        Some(SourceLoan {
            held: Some(held),
            home: self.clone(),
            bound: None,
        })
    }

    /// A new slot, unless [`SOURCE_SLOTS`] exist or making one failed
    /// before.
    fn make(&self, pool: &mut Pool) -> Option<Held> {
        if pool.made >= SOURCE_SLOTS {
            return None;
        }
        match OwnedMr::new(&self.pd, STAGE_MAX, AccessFlags::MW_BIND) {
            Ok(mr) => {
                pool.made += 1;
                Some(Held {
                    window: None,
                    mr,
                    dirty: 0,
                })
            }
            Err(e) => {
                // The locked-memory limit, most likely: sends register
                // their buffers from now on.
                pool.made = SOURCE_SLOTS;
                tracing::debug!(error = %e, "no source slot: rendezvous sends register");
                None
            }
        }
    }

    fn put(&self, held: Held) {
        lock(&self.inner).free.push(held);
    }
}

/// Whether a rendezvous payload of `len` bytes can go through a window on
/// `c`: small enough for a slot, the lane has slots, the peer revokes
/// windows, and the request-to-send goes inline (the bind is posted with
/// it, and the announcing send must not need a slot of its own).
pub(crate) fn fits(c: &Conn, len: usize) -> bool {
    len <= STAGE_MAX && c.lane.sources.is_some() && c.takes_windows() && c.inline_max() >= HDR
}

/// A source slot lent to one rendezvous send.
pub(crate) struct SourceLoan {
    held: Option<Held>,
    home: Arc<SourceSlots>,
    /// The key the window was bound under and the connection it is bound
    /// to, once posted.
    bound: Option<(u32, Arc<Conn>)>,
}

impl SourceLoan {
    /// Copies `iov` into the slot (clearing what an earlier, longer
    /// payload left past it); returns the payload's length.
    pub(crate) fn fill(&mut self, iov: &[Bytes]) -> Result<usize> {
        let held = self.held.as_mut().ok_or(Error::Inval)?;
        let len: usize = iov.iter().map(Bytes::len).sum();
        if len == 0 || len > STAGE_MAX {
            return Err(Error::Inval);
        }
        let mut at = 0;
        for b in iov {
            held.mr.write_at(at, b)?;
            at += b.len();
        }
        while at < held.dirty {
            let n = (held.dirty - at).min(ZEROS.len());
            held.mr.write_at(at, &ZEROS[..n])?;
            at += n;
        }
        held.dirty = len;
        Ok(len)
    }

    /// Binds the window over the payload [`fill`](Self::fill) copied for
    /// `c`'s peer and posts the request-to-send `h` (whose address, key
    /// and window flag are set here) behind the bind, in one post. On
    /// failure nothing was announced and the window is deallocated (a
    /// bind that went without its send is revoked so).
    pub(crate) fn post(
        &mut self,
        c: &Arc<Conn>,
        h: &mut Header,
        (wr_id, flags): (u64, SendFlags),
    ) -> Result<()> {
        let held = self.held.as_mut().ok_or(Error::Inval)?;
        // What `fill` wrote: the payload.
        let len = held.dirty;
        let mut window = match held.window.take() {
            Some(w) => w,
            None => MemoryWindow::new(&c.lane.pd)?,
        };
        let rkey = window.next_rkey();
        h.op = WireOp::Rts;
        h.addr = held.mr.addr();
        h.rkey = rkey;
        h.window = true;
        let enc = h.encode();
        let send = SendRequest::new(wr_id, SendOp::Send, Payload::Inline(&enc)).flags(flags);
        c.qp.post_bind_then_send((&mut window, rkey), (&held.mr, 0, len), &send)?;
        held.window = Some(window);
        self.bound = Some((rkey, c.clone()));
        Ok(())
    }

    /// The peer said it is done, revoking `invalidated` with its answer:
    /// when that is the window's key, slot and window go back to the
    /// pool; otherwise the loan parks on its connection.
    pub(crate) fn settle(mut self, invalidated: Option<u32>) {
        if matches!((&self.bound, invalidated), (Some((k, _)), Some(i)) if *k == i) {
            self.bound = None;
        }
    }
}

impl Drop for SourceLoan {
    fn drop(&mut self) {
        let Some(held) = self.held.take() else { return };
        match self.bound.take() {
            None => self.home.put(held),
            Some((_, conn)) => conn.park(Parked {
                held: Some(held),
                home: Arc::downgrade(&self.home),
            }),
        }
    }
}

/// A slot whose window may still be readable by the peer: kept until its
/// connection goes, then given back with the window deallocated.
pub(crate) struct Parked {
    held: Option<Held>,
    home: Weak<SourceSlots>,
}

impl Drop for Parked {
    fn drop(&mut self) {
        let Some(mut held) = self.held.take() else {
            return;
        };
        held.window = None;
        if let Some(home) = self.home.upgrade() {
            home.put(held);
        }
    }
}
