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
    mr: FastMutex<OwnedMr>,
    free: FastMutex<Vec<u32>>,
}

impl std::fmt::Debug for SlotPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotPool")
            .field("free", &lock(&self.free).len())
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
            mr: FastMutex::new(mr),
            free: FastMutex::new((0..count as u32).rev().collect()),
        })
    }

    /// A free slot, if any.
    pub fn take(&self) -> Option<u32> {
        lock(&self.free).pop()
    }

    /// Gives a slot back (after its work request completed).
    pub fn put(&self, slot: u32) {
        lock(&self.free).push(slot);
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
        mut at: usize,
        len: usize,
        bufs: &mut [BytesMut],
    ) -> std::result::Result<usize, (Error, usize)> {
        let mut placed = 0;
        self.with(|mr| {
            for b in bufs.iter_mut() {
                let n = b.len().min(len - placed);
                if n > 0 {
                    mr.read_at(at, &mut b[..n]).map_err(|e| (e, placed))?;
                }
                placed += n;
                at += n;
            }
            Ok(placed)
        })
    }

    /// Runs `f` with the region locked (copies in, scatter/gather elements
    /// for a post).
    pub fn with<R>(&self, f: impl FnOnce(&mut OwnedMr) -> R) -> R {
        f(&mut lock(&self.mr))
    }
}
