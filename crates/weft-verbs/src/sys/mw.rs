//! Memory windows (type 2): a remote key over part of a region, bound to
//! one queue pair by a work request and revoked by the peer's send with
//! invalidate (or a local invalidate).
//!
//! A window exposes memory of a registration, so it is bound only through
//! [`QueuePair::post_bind_then_send`](super::QueuePair::post_bind_then_send),
//! which borrows the [`OwnedMr`](super::OwnedMr) it names. Whatever the
//! order of drops, memory stays fenced off: a region with windows still
//! bound cannot be deregistered (the provider refuses, and the region's
//! memory is then leaked rather than freed, see [`super::mr`]), and
//! deallocating a window revokes its key.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::{ibv_mw, ibv_mw_type};
use weft_core::Error;

use super::pd::ProtectionDomain;
use super::{check_ret, last_error_or};

/// A type 2 memory window (`ibv_alloc_mw(IBV_MW_TYPE_2)`). Holds its PD.
pub struct MemoryWindow {
    mw: NonNull<ibv_mw>,
    /// The key of the current (or, while unbound, the last) binding: a
    /// bind must change its low byte.
    rkey: u32,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: the window is only handed to thread-safe verbs (post_send,
// dealloc_mw); its fields are not touched by the provider after creation
// except through those calls.
unsafe impl Send for MemoryWindow {}
// SAFETY: `&MemoryWindow` only reads the cached key and pointers.
unsafe impl Sync for MemoryWindow {}

impl fmt::Debug for MemoryWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryWindow")
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .finish()
    }
}

impl MemoryWindow {
    /// Allocates an unbound type 2 window on `pd`. `NoSys`/`OpNotSupp`
    /// where the device has none.
    pub fn new(pd: &Arc<ProtectionDomain>) -> Result<MemoryWindow, Error> {
        // SAFETY: the PD is alive (we hold an Arc); the op table of an
        // open context is immutable.
        let op = unsafe { (*(*pd.as_ptr()).context).ops.alloc_mw };
        let op = op.ok_or(Error::NoSys)?;
        // SAFETY: calling the provider's alloc_mw on its own PD, as the
        // inline ibv_alloc_mw does.
        let mw = unsafe { op(pd.as_ptr(), ibv_mw_type::IBV_MW_TYPE_2) };
        let mw = NonNull::new(mw).ok_or_else(|| last_error_or(Error::NoMem))?;
        // SAFETY: a freshly allocated window; its rkey is set at creation.
        let rkey = unsafe { (*mw.as_ptr()).rkey };
        Ok(MemoryWindow {
            mw,
            rkey,
            pd: Arc::clone(pd),
        })
    }

    pub(super) fn as_ptr(&self) -> *mut ibv_mw {
        self.mw.as_ptr()
    }

    /// The key of the current (or last) binding.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The key the next binding takes: the same window index, the next key
    /// byte (a bind that keeps the byte is refused, so a peer holding an
    /// old key cannot use a new binding).
    pub fn next_rkey(&self) -> u32 {
        (self.rkey & !0xff) | (self.rkey.wrapping_add(1) & 0xff)
    }

    /// Records the key of a binding that was posted, in the `ibv_mw`
    /// too: providers name a window in the next bind by the key it holds
    /// there (rxe refuses a bind whose window key is not the current
    /// one), and none updates it for a bind posted as a work request.
    pub(super) fn set_rkey(&mut self, rkey: u32) {
        self.rkey = rkey;
        // SAFETY: the window is alive and exclusively borrowed; the
        // provider reads this field only in calls made through `&mut
        // self` (binds), never concurrently.
        unsafe { (*self.mw.as_ptr()).rkey = rkey };
    }

    /// The PD it was allocated on.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        // SAFETY: the window is alive; the op table of an open context is
        // immutable.
        let op = unsafe { (*(*self.mw.as_ptr()).context).ops.dealloc_mw };
        let Some(op) = op else { return };
        // SAFETY: allocated by `new` and deallocated once, here; a bound
        // window is revoked by deallocation.
        if let Err(e) = check_ret(unsafe { op(self.mw.as_ptr()) }) {
            tracing::warn!(%e, "ibv_dealloc_mw failed");
        }
    }
}
