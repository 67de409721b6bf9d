//! Pre-registered bounce slots for small messages.
//!
//! Registering a buffer costs a system call and page pinning per
//! operation (and deregistering another); for small messages that is far
//! more than copying the bytes. A receive that fits a slot lands in the
//! slot and is copied into the caller's buffer at completion; a send that
//! fits (and is too large to go inline) is copied into a slot at post
//! time. When the slots run out, operations fall back to registering the
//! caller's buffer.

use std::sync::Arc;

use bytes::BytesMut;
use weft_core::sync::{lock, FastMutex};
use weft_core::{Error, Result};

use crate::sys::{AccessFlags, OwnedMr, ProtectionDomain, Sge};

/// Bytes per slot.
pub const SLOT: usize = 4096;
/// Slots per pool: 1 MiB pinned per direction and endpoint, well inside
/// the usual 8 MiB locked-memory limit.
pub const SLOTS: usize = 256;

/// A registered region cut into equal slots.
pub struct SlotPool {
    slot: usize,
    /// The region and its free slots behind one lock: a receive's post
    /// (a slot taken, its element made) and its completion (the copy out,
    /// the slot given back) each lock once.
    inner: FastMutex<Slots>,
}

struct Slots {
    mr: OwnedMr,
    free: Vec<u32>,
}

impl std::fmt::Debug for SlotPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotPool")
            .field("free", &lock(&self.inner).free.len())
            .finish()
    }
}

impl SlotPool {
    /// `count` slots of [`SLOT`] bytes on `pd`.
    pub fn new(pd: &Arc<ProtectionDomain>, count: usize, access: AccessFlags) -> Result<SlotPool> {
        Self::with_slot(pd, count, SLOT, access)
    }

    /// `count` slots of `slot` bytes on `pd`.
    pub fn with_slot(
        pd: &Arc<ProtectionDomain>,
        count: usize,
        slot: usize,
        access: AccessFlags,
    ) -> Result<SlotPool> {
        let mr = OwnedMr::new(pd, count * slot, access)?;
        Ok(SlotPool {
            slot,
            inner: FastMutex::new(Slots {
                mr,
                free: (0..count as u32).rev().collect(),
            }),
        })
    }

    /// A free slot, if any.
    pub fn take(&self) -> Option<u32> {
        lock(&self.inner).free.pop()
    }

    /// Gives a slot back (after its work request completed).
    pub fn put(&self, slot: u32) {
        lock(&self.inner).free.push(slot);
    }

    /// Takes a free slot and hands `post` the scatter/gather element over
    /// its first `len` bytes, all under one lock. `None` when no slot is
    /// free; on failure the slot is free again.
    pub fn take_post(
        &self,
        len: usize,
        post: impl FnOnce(Sge<'_>) -> Result<()>,
    ) -> Option<Result<u32>> {
        let mut g = lock(&self.inner);
        let slot = g.free.pop()?;
        let posted = g.mr.sge(self.offset(slot), len).and_then(post);
        Some(match posted {
            Ok(()) => Ok(slot),
            Err(e) => {
                g.free.push(slot);
                Err(e)
            }
        })
    }

    /// [`scatter`](Self::scatter) from the start of `slot`, which is then
    /// free again: one lock for both.
    #[inline]
    pub fn scatter_put(
        &self,
        slot: u32,
        len: usize,
        bufs: &mut [BytesMut],
    ) -> std::result::Result<usize, (Error, usize)> {
        let mut g = lock(&self.inner);
        let r = scatter_in(&g.mr, self.offset(slot), len, bufs);
        g.free.push(slot);
        r
    }

    /// Byte offset of `slot` in the region.
    pub fn offset(&self, slot: u32) -> usize {
        slot as usize * self.slot
    }

    /// Copies `parts` back to back into `slot` and hands `post` the
    /// scatter/gather element over them. On failure the slot is free again.
    pub fn post_from<'a>(
        &self,
        slot: u32,
        parts: impl IntoIterator<Item = &'a [u8]>,
        post: impl FnOnce(Sge<'_>) -> Result<()>,
    ) -> Result<()> {
        let base = self.offset(slot);
        let r = self.with(|mr| {
            let mut off = base;
            for p in parts {
                mr.write_at(off, p)?;
                off += p.len();
            }
            post(mr.sge(base, off - base)?)
        });
        if r.is_err() {
            self.put(slot);
        }
        r
    }

    /// Copies up to `len` bytes from region offset `at` into `bufs`, in
    /// order; returns the bytes placed, or the error that stopped the copy
    /// with the bytes placed before it.
    pub fn scatter(
        &self,
        at: usize,
        len: usize,
        bufs: &mut [BytesMut],
    ) -> std::result::Result<usize, (Error, usize)> {
        self.with(|mr| scatter_in(mr, at, len, bufs))
    }

    /// Runs `f` with the region locked (copies in, scatter/gather elements
    /// for a post).
    pub fn with<R>(&self, f: impl FnOnce(&mut OwnedMr) -> R) -> R {
        f(&mut lock(&self.inner).mr)
    }
}

/// A slot taken from `pool` for a read the device writes into. It goes
/// back only once the read's completion is in (the device is done with
/// it); one whose owner is dropped without a completion, at teardown,
/// stays taken.
pub struct Loan {
    pub pool: Arc<SlotPool>,
    pub slot: u32,
}

impl Loan {
    /// At the read's completion: copies the slot's first `len` bytes into
    /// `bufs` if the read succeeded (`ok`), then gives the slot back.
    /// Whether all `len` bytes landed.
    pub fn land(self, ok: bool, len: usize, bufs: &mut [BytesMut]) -> bool {
        if !ok {
            self.pool.put(self.slot);
            return false;
        }
        self.pool.scatter_put(self.slot, len, bufs) == Ok(len)
    }
}

/// Copies up to `len` bytes from `mr` at `at` into `bufs` (see
/// [`SlotPool::scatter`]).
fn scatter_in(
    mr: &OwnedMr,
    mut at: usize,
    len: usize,
    bufs: &mut [BytesMut],
) -> std::result::Result<usize, (Error, usize)> {
    let mut placed = 0;
    for b in bufs.iter_mut() {
        let n = b.len().min(len - placed);
        if n > 0 {
            mr.read_at(at, &mut b[..n]).map_err(|e| (e, placed))?;
        }
        placed += n;
        at += n;
    }
    Ok(placed)
}
