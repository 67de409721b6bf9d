//! Memory registration.
//!
//! Three kinds of registration, all of which own the memory they register
//! for as long as the registration exists, so safe code can neither free
//! nor (for device-writable memory) access it while the device may:
//!
//! * [`OwnedMr`]: a zeroed, page-aligned allocation, an application
//!   [`BytesMut`] registered in place, or part of another `OwnedMr`'s
//!   memory (a sub-region with keys of its own). Its contents are only
//!   reachable through copies ([`OwnedMr::read_at`], [`OwnedMr::write_at`]),
//!   never through `&[u8]`/`&mut [u8]`, because the device may write it at
//!   any time (receives, RDMA reads landing here, and, with remote access,
//!   RDMA writes and atomics from the peer). Treat it like memory shared with
//!   another process.
//! * [`BytesMr`]: a [`Bytes`] (immutable, shareable) registered read-only
//!   for the device, for zero-copy sends and RDMA-write sources.
//! * [`BytesMutMr`]: a [`BytesMut`] the device may write, for zero-copy
//!   receives and RDMA-read targets; the buffer is only handed back by
//!   [`BytesMutMr::into_inner`], after deregistration.
//!
//! Work requests name memory only through an [`Sge`], which only these types
//! create, borrowing them. The provider keeps the registration alive (in its
//! in-flight table) until the completion arrives; if a registration is
//! dropped earlier, `ibv_dereg_mr` fences the device off the memory before
//! it is freed, and the operation completes with a protection error.

use std::alloc::{self, Layout};
use std::fmt;
use std::marker::PhantomData;
use std::ops::{BitOr, BitOrAssign};
use std::ptr::NonNull;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use rdma_sys::{ibv_access_flags, ibv_dereg_mr, ibv_mr, ibv_reg_mr, ibv_sge};
use weft_core::Error;

use super::pd::ProtectionDomain;
use super::{errno_error, last_error_or};

/// Access rights of a memory region (and of a QP's remote access).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AccessFlags(u32);

impl AccessFlags {
    /// Local read only.
    pub const NONE: AccessFlags = AccessFlags(0);
    /// The local device may write (receives, RDMA read targets, atomic
    /// results). Required by the remote write/atomic flags.
    pub const LOCAL_WRITE: AccessFlags = AccessFlags(ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0);
    /// Peers may RDMA-write.
    pub const REMOTE_WRITE: AccessFlags = AccessFlags(ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0);
    /// Peers may RDMA-read.
    pub const REMOTE_READ: AccessFlags = AccessFlags(ibv_access_flags::IBV_ACCESS_REMOTE_READ.0);
    /// Peers may perform atomics.
    pub const REMOTE_ATOMIC: AccessFlags =
        AccessFlags(ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0);
    /// Memory windows may be bound over the region
    /// ([`super::MemoryWindow`]).
    pub const MW_BIND: AccessFlags = AccessFlags(ibv_access_flags::IBV_ACCESS_MW_BIND.0);

    /// The raw `IBV_ACCESS_*` bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// True if every flag of `other` is set.
    pub const fn contains(self, other: AccessFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// True if the device may write memory with these rights.
    pub const fn device_writable(self) -> bool {
        self.0 & (Self::LOCAL_WRITE.0 | Self::REMOTE_WRITE.0 | Self::REMOTE_ATOMIC.0) != 0
    }
}

impl BitOr for AccessFlags {
    type Output = AccessFlags;
    fn bitor(self, rhs: AccessFlags) -> AccessFlags {
        AccessFlags(self.0 | rhs.0)
    }
}

impl BitOrAssign for AccessFlags {
    fn bitor_assign(&mut self, rhs: AccessFlags) {
        self.0 |= rhs.0;
    }
}

impl fmt::Debug for AccessFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (Self::LOCAL_WRITE, "LOCAL_WRITE"),
            (Self::REMOTE_WRITE, "REMOTE_WRITE"),
            (Self::REMOTE_READ, "REMOTE_READ"),
            (Self::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
            (Self::MW_BIND, "MW_BIND"),
        ];
        let set: Vec<&str> = names
            .iter()
            .filter(|(flag, _)| self.contains(*flag))
            .map(|(_, n)| *n)
            .collect();
        if set.is_empty() {
            f.write_str("AccessFlags(NONE)")
        } else {
            write!(f, "AccessFlags({})", set.join(" | "))
        }
    }
}

/// One scatter/gather element: a range of a live registration.
///
/// Only the registration types create these (borrowing the registration),
/// so a work request can only name registered memory that is owned by a
/// registration the caller holds.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Sge<'a> {
    addr: u64,
    len: u32,
    lkey: u32,
    _mr: PhantomData<&'a ()>,
}

impl<'a> Sge<'a> {
    /// Start address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// True for a zero-length element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Local key of the registration.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// A sub-range of this element. `Inval` if out of bounds.
    pub fn slice(&self, offset: u32, len: u32) -> Result<Sge<'a>, Error> {
        let end = offset.checked_add(len).ok_or(Error::Inval)?;
        if end > self.len {
            return Err(Error::Inval);
        }
        Ok(Sge {
            addr: self.addr + u64::from(offset),
            len,
            lkey: self.lkey,
            _mr: PhantomData,
        })
    }

    pub(crate) fn to_raw(self) -> ibv_sge {
        ibv_sge {
            addr: self.addr,
            length: self.len,
            lkey: self.lkey,
        }
    }
}

impl fmt::Debug for Sge<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Sge {{ addr: {:#x}, len: {}, lkey: {:#x} }}",
            self.addr, self.len, self.lkey
        )
    }
}

/// An `ibv_mr` with its keys cached. Has no `Drop`: its owners deregister
/// it explicitly so they can leak their memory if deregistration fails.
pub(super) struct RawMr {
    /// `None` once deregistered (or leaked after a failed deregistration).
    mr: Option<NonNull<ibv_mr>>,
    pub(super) addr: u64,
    pub(super) len: usize,
    pub(super) lkey: u32,
    rkey: u32,
    _pd: Arc<ProtectionDomain>,
}

impl RawMr {
    /// Whether this region was registered on `pd`.
    pub(super) fn is_on(&self, pd: &ProtectionDomain) -> bool {
        std::ptr::eq(&*self._pd, pd)
    }

    /// `ibv_reg_mr`.
    ///
    /// # Safety
    /// `addr..addr + len` must stay allocated until [`RawMr::deregister`]
    /// has returned `Ok`, and nothing may access it through Rust
    /// references in ways that conflict with what `access` lets the device
    /// do (reads always; writes if [`AccessFlags::device_writable`]).
    pub(super) unsafe fn register(
        pd: &Arc<ProtectionDomain>,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<RawMr, Error> {
        if len == 0 {
            return Err(Error::Inval);
        }
        let access_bits = i32::try_from(access.bits()).map_err(|_| Error::Inval)?;
        // SAFETY: the PD is alive (we hold an Arc); the caller guarantees
        // the memory contract above.
        let mr = unsafe { ibv_reg_mr(pd.as_ptr(), addr.cast(), len, access_bits) };
        let mr = NonNull::new(mr).ok_or_else(|| last_error_or(Error::NoMem))?;
        // SAFETY: a successful registration returns a valid ibv_mr whose
        // fields are immutable until deregistration.
        let (lkey, rkey) = unsafe { ((*mr.as_ptr()).lkey, (*mr.as_ptr()).rkey) };
        Ok(RawMr {
            mr: Some(mr),
            addr: addr as u64,
            len,
            lkey,
            rkey,
            _pd: Arc::clone(pd),
        })
    }

    /// `ibv_dereg_mr` (idempotent). After `Ok` the device no longer
    /// accesses the memory. On error the `ibv_mr` is leaked and the owner
    /// must leak the memory too.
    pub(super) fn deregister(&mut self) -> Result<(), Error> {
        let Some(mr) = self.mr.take() else {
            return Ok(());
        };
        // SAFETY: registered by `register` and deregistered once (the
        // pointer was taken out above).
        let ret = unsafe { ibv_dereg_mr(mr.as_ptr()) };
        if ret == 0 {
            Ok(())
        } else {
            let err = errno_error(super::ret_errno(ret));
            tracing::error!(%err, "ibv_dereg_mr failed; leaking the region");
            Err(err)
        }
    }

    /// The `ibv_mr`, while registered.
    pub(super) fn ptr(&self) -> Option<NonNull<ibv_mr>> {
        self.mr
    }

    pub(super) fn sge(&self, offset: usize, len: usize) -> Result<Sge<'_>, Error> {
        let end = offset.checked_add(len).ok_or(Error::Inval)?;
        if end > self.len || self.mr.is_none() {
            return Err(Error::Inval);
        }
        Ok(Sge {
            addr: self.addr + offset as u64,
            len: u32::try_from(len).map_err(|_| Error::MsgSize)?,
            lkey: self.lkey,
            _mr: PhantomData,
        })
    }
}

// SAFETY: an ibv_mr is only read (its cached keys) and deregistered, which
// is thread-safe; the memory contract is upheld by the owning types.
unsafe impl Send for RawMr {}
// SAFETY: `&RawMr` only exposes copies of immutable fields.
unsafe impl Sync for RawMr {}

/// A zeroed, page-aligned heap allocation.
struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl AlignedBuf {
    fn zeroed(len: usize) -> Result<AlignedBuf, Error> {
        if len == 0 {
            return Err(Error::Inval);
        }
        let layout = Layout::from_size_align(len, page_size()).map_err(|_| Error::Inval)?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or(Error::NoMem)?;
        Ok(AlignedBuf { ptr, layout })
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by alloc_zeroed with this layout, freed once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let ps = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(ps)
        .ok()
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096)
}

/// The memory under one or more [`OwnedMr`]s: a zeroed page-aligned
/// allocation, or an application buffer registered where it is. It is
/// freed (or handed back) only when no registration covers it any more:
/// each registration holds an `Arc` and drops it only after a successful
/// deregistration.
struct Backing {
    base: NonNull<u8>,
    len: usize,
    /// `None` once taken back by [`OwnedMr::into_buffer`].
    memory: Option<Memory>,
    /// Serialises CPU copies in and out, which the registrations of one
    /// backing (a region and its sub-regions) would otherwise race on.
    /// Taken for every bounce-slot copy: a lock without poisoning (a copy
    /// cannot leave the memory half-updated in a way a poison flag would
    /// tell anyone about, and the flag was ignored anyway).
    cpu: weft_core::sync::FastMutex<()>,
}

enum Memory {
    Aligned(AlignedBuf),
    Buffer(BytesMut),
}

// SAFETY: the memory is owned by the Backing and only touched through raw
// copies made under `cpu` (or by the device).
unsafe impl Send for Backing {}
// SAFETY: as above: shared access is serialised by `cpu`.
unsafe impl Sync for Backing {}

impl Backing {
    /// Runs `f` with CPU copies of this memory excluded elsewhere.
    fn with_cpu<R>(&self, f: impl FnOnce() -> R) -> R {
        let _g = self.cpu.lock();
        f()
    }
}

/// A registered region that owns its memory: zeroed page-aligned memory
/// it allocated, or an application buffer, or a part of another
/// region's memory (a sub-region, with its own keys and rights).
///
/// The contents are accessed only by copying ([`read_at`](Self::read_at),
/// [`write_at`](Self::write_at)): no `&[u8]` is ever handed out, since the
/// device may write the memory concurrently (local write, remote write,
/// atomics). Reads racing with device writes may observe partially
/// written data, exactly as with memory shared with another process.
/// CPU copies of one memory (a region and its sub-regions) are
/// serialised by a lock.
pub struct OwnedMr {
    mr: RawMr,
    /// `None` only after `into_buffer` or if leaked in Drop.
    backing: Option<Arc<Backing>>,
    /// Where the registration starts in the backing.
    offset: usize,
    access: AccessFlags,
}

// SAFETY: the memory is owned (through the Backing) and only accessed
// through raw copies under the Backing's lock; the ibv_mr is thread-safe.
unsafe impl Send for OwnedMr {}
// SAFETY: `&OwnedMr` only copies in and out under the Backing's lock.
unsafe impl Sync for OwnedMr {}

impl fmt::Debug for OwnedMr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedMr")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("lkey", &self.lkey())
            .field("rkey", &self.rkey())
            .field("access", &self.access)
            .finish()
    }
}

impl OwnedMr {
    /// Allocates `len` zeroed bytes (page-aligned) and registers them.
    /// `Inval` for `len == 0` or rights the device refuses (e.g. remote
    /// write without local write).
    pub fn new(pd: &Arc<ProtectionDomain>, len: usize, access: AccessFlags) -> Result<Self, Error> {
        let buf = AlignedBuf::zeroed(len)?;
        let backing = Arc::new(Backing {
            base: buf.ptr,
            len,
            memory: Some(Memory::Aligned(buf)),
            cpu: weft_core::sync::FastMutex::new(()),
        });
        Self::over(pd, backing, 0, len, access)
    }

    /// Registers the application's buffer where it is (its `len()` bytes,
    /// not the spare capacity). The buffer comes back with the error if
    /// registration fails, and through [`into_buffer`](Self::into_buffer)
    /// afterwards. `Inval` for an empty buffer.
    pub fn from_buffer(
        pd: &Arc<ProtectionDomain>,
        mut buf: BytesMut,
        access: AccessFlags,
    ) -> Result<Self, (Error, BytesMut)> {
        let len = buf.len();
        let Some(base) = NonNull::new(buf.as_mut_ptr()).filter(|_| len > 0) else {
            return Err((Error::Inval, buf));
        };
        // SAFETY: `buf` moves into the Backing of the returned OwnedMr
        // (moving a BytesMut does not move its heap buffer), which keeps it
        // until a successful deregistration (see Drop and into_buffer); it
        // is only accessed through raw copies. On failure nothing is
        // registered and the buffer goes back as it was.
        let mr = match unsafe { RawMr::register(pd, base.as_ptr(), len, access) } {
            Ok(mr) => mr,
            Err(e) => return Err((e, buf)),
        };
        Ok(OwnedMr {
            mr,
            backing: Some(Arc::new(Backing {
                base,
                len,
                memory: Some(Memory::Buffer(buf)),
                cpu: weft_core::sync::FastMutex::new(()),
            })),
            offset: 0,
            access,
        })
    }

    /// Registers `offset..offset + len` of this region's memory again,
    /// with its own keys and `access`. The sub-region keeps the memory
    /// alive however long this region lives. `Inval` if the range is not
    /// inside this region.
    pub fn sub(
        &self,
        pd: &Arc<ProtectionDomain>,
        offset: usize,
        len: usize,
        access: AccessFlags,
    ) -> Result<OwnedMr, Error> {
        let end = offset.checked_add(len).ok_or(Error::Inval)?;
        let backing = self.backing.as_ref().ok_or(Error::Inval)?;
        if end > self.mr.len || len == 0 {
            return Err(Error::Inval);
        }
        Self::over(pd, backing.clone(), self.offset + offset, len, access)
    }

    fn over(
        pd: &Arc<ProtectionDomain>,
        backing: Arc<Backing>,
        offset: usize,
        len: usize,
        access: AccessFlags,
    ) -> Result<OwnedMr, Error> {
        let end = offset.checked_add(len).ok_or(Error::Inval)?;
        if end > backing.len {
            return Err(Error::Inval);
        }
        // SAFETY: offset <= the backing's length, checked above.
        let ptr = unsafe { backing.base.as_ptr().add(offset) };
        // SAFETY: the range lies inside the backing, which the returned
        // OwnedMr keeps alive (through its Arc) until a successful
        // deregistration (see Drop and into_buffer); the memory is never
        // accessed through references, only through raw copies.
        let mr = unsafe { RawMr::register(pd, ptr, len, access)? };
        Ok(OwnedMr {
            mr,
            backing: Some(backing),
            offset,
            access,
        })
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.mr.lkey
    }

    /// Whether this region was registered on `pd`.
    pub fn is_on(&self, pd: &ProtectionDomain) -> bool {
        self.mr.is_on(pd)
    }

    /// The `ibv_mr` and device address of `offset..offset + len`, for a
    /// window binding: `Inval` outside the region or without
    /// [`AccessFlags::MW_BIND`].
    pub(super) fn bind_range(
        &self,
        offset: usize,
        len: usize,
    ) -> Result<(NonNull<ibv_mr>, u64), Error> {
        let end = offset.checked_add(len).ok_or(Error::Inval)?;
        if end > self.mr.len || len == 0 || !self.access.contains(AccessFlags::MW_BIND) {
            return Err(Error::Inval);
        }
        let mr = self.mr.ptr().ok_or(Error::Inval)?;
        Ok((mr, self.mr.addr + offset as u64))
    }

    /// Remote key (give it to peers for RDMA/atomics).
    pub fn rkey(&self) -> u32 {
        self.mr.rkey
    }

    /// Start address (the remote address peers use).
    pub fn addr(&self) -> u64 {
        self.mr.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mr.len
    }

    /// Never true (zero-length regions are refused).
    pub fn is_empty(&self) -> bool {
        self.mr.len == 0
    }

    /// The access rights it was registered with.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// A scatter/gather element for `offset..offset + len`.
    pub fn sge(&self, offset: usize, len: usize) -> Result<Sge<'_>, Error> {
        self.mr.sge(offset, len)
    }

    /// The backing and a pointer to `offset..offset + len` of this
    /// registration in it.
    fn range_ptr(&self, offset: usize, len: usize) -> Result<(&Backing, *mut u8), Error> {
        let end = offset.checked_add(len).ok_or(Error::Inval)?;
        let backing = self.backing.as_deref().ok_or(Error::Canceled)?;
        if end > self.mr.len {
            return Err(Error::Inval);
        }
        // SAFETY: self.offset + offset + len <= self.offset + mr.len <=
        // backing.len (checked here and at registration).
        Ok((backing, unsafe {
            backing.base.as_ptr().add(self.offset + offset)
        }))
    }

    /// Copies `out.len()` bytes starting at `offset` into `out`.
    /// `Inval` if the range is out of bounds.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<(), Error> {
        let (backing, src) = self.range_ptr(offset, out.len())?;
        backing.with_cpu(|| {
            // SAFETY: `src..src + out.len()` lies inside the live backing
            // (checked); `out` is a distinct Rust buffer; other CPU copies
            // of this memory are excluded by the lock. The device may write
            // the source concurrently; that only affects the bytes copied.
            unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) }
        });
        Ok(())
    }

    /// Copies `data` into the region at `offset`. `Inval` if the range is
    /// out of bounds.
    pub fn write_at(&mut self, offset: usize, data: &[u8]) -> Result<(), Error> {
        let (backing, dst) = self.range_ptr(offset, data.len())?;
        backing.with_cpu(|| {
            // SAFETY: `dst..dst + data.len()` lies inside the live backing
            // (checked); `data` is a distinct Rust buffer; other CPU copies
            // of this memory are excluded by the lock.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) }
        });
        Ok(())
    }

    /// Reads a native-endian `u64` at `offset` (atomics operate on these).
    pub fn read_u64_at(&self, offset: usize) -> Result<u64, Error> {
        let mut b = [0u8; 8];
        self.read_at(offset, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }

    /// Writes a native-endian `u64` at `offset`.
    pub fn write_u64_at(&mut self, offset: usize, v: u64) -> Result<(), Error> {
        self.write_at(offset, &v.to_ne_bytes())
    }

    /// Deregisters and hands back the application buffer the region was
    /// registered on ([`from_buffer`](Self::from_buffer)). `Inval` for
    /// allocated memory or a sub-region's (which is deregistered all the
    /// same), `Busy` while sub-regions still cover the memory (they keep
    /// it). If deregistration fails the memory is leaked and the error
    /// returned.
    pub fn into_buffer(mut self) -> Result<BytesMut, Error> {
        if let Err(e) = self.mr.deregister() {
            // The device may still access the memory: never free it.
            std::mem::forget(self.backing.take());
            return Err(e);
        }
        let backing = self.backing.take().ok_or(Error::Inval)?;
        if self.offset != 0 || self.mr.len != backing.len {
            return Err(Error::Inval);
        }
        let mut backing = Arc::try_unwrap(backing).map_err(|_| Error::Busy)?;
        match backing.memory.take() {
            Some(Memory::Buffer(b)) => Ok(b),
            Some(Memory::Aligned(a)) => {
                drop(a);
                Err(Error::Inval)
            }
            None => Err(Error::Inval),
        }
    }
}

impl Drop for OwnedMr {
    fn drop(&mut self) {
        if self.mr.deregister().is_err() {
            // The device may still access the memory: never free it.
            std::mem::forget(self.backing.take());
        }
    }
}

/// The accessors, `into_inner` and `Drop` shared by the registrations
/// that own a `bytes` buffer (`$buf`): the buffer is handed back, or
/// dropped, only after a successful deregistration; if deregistration
/// fails it is leaked, since the device might still `$access` it.
macro_rules! owning_registration {
    ($ty:ident, $buf:ty, $access:literal) => {
        impl $ty {
            /// Local key.
            pub fn lkey(&self) -> u32 {
                self.mr.lkey
            }

            /// Remote key (meaningful with remote rights).
            pub fn rkey(&self) -> u32 {
                self.mr.rkey
            }

            /// Start address.
            pub fn addr(&self) -> u64 {
                self.mr.addr
            }

            /// Length in bytes.
            pub fn len(&self) -> usize {
                self.mr.len
            }

            /// Never true.
            pub fn is_empty(&self) -> bool {
                self.mr.len == 0
            }

            /// The whole buffer as one element (`MsgSize` beyond 4 GiB).
            pub fn sge(&self) -> Result<Sge<'_>, Error> {
                self.mr.sge(0, self.mr.len)
            }

            /// `offset..offset + len` as one element.
            pub fn sge_range(&self, offset: usize, len: usize) -> Result<Sge<'_>, Error> {
                self.mr.sge(offset, len)
            }

            #[doc = concat!("Deregisters and gives the buffer back. If deregistration fails the buffer is leaked (the device might still ", $access, " it) and the error is returned.")]
            pub fn into_inner(mut self) -> Result<$buf, Error> {
                let res = self.mr.deregister();
                let buf = std::mem::take(&mut self.buf);
                match res {
                    Ok(()) => Ok(buf),
                    Err(e) => {
                        std::mem::forget(buf);
                        Err(e)
                    }
                }
            }
        }

        impl Drop for $ty {
            fn drop(&mut self) {
                if self.mr.deregister().is_err() {
                    std::mem::forget(std::mem::take(&mut self.buf));
                }
            }
        }
    };
}

/// A [`Bytes`] registered for the device to read: zero-copy sends and RDMA
/// write sources. Never device-writable, so the shared, immutable `Bytes`
/// (and its clones elsewhere) stays immutable; it may also be exposed for
/// remote reads.
pub struct BytesMr {
    mr: RawMr,
    /// Empty after `into_inner`.
    buf: Bytes,
}

impl fmt::Debug for BytesMr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BytesMr")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("lkey", &self.lkey())
            .finish()
    }
}

impl BytesMr {
    /// Registers `buf`. `access` may only be [`AccessFlags::NONE`] or
    /// [`AccessFlags::REMOTE_READ`] (`Inval` otherwise); `Inval` for an
    /// empty buffer (zero-length sends need no SGE).
    pub fn new(pd: &Arc<ProtectionDomain>, buf: Bytes, access: AccessFlags) -> Result<Self, Error> {
        if !AccessFlags::REMOTE_READ.contains(access) {
            return Err(Error::Inval);
        }
        let ptr = buf.as_ptr().cast_mut();
        // SAFETY: the Bytes is owned by the returned BytesMr and dropped
        // only after a successful deregistration; its memory cannot be
        // freed or mutated while we hold this handle (Bytes is immutable,
        // and `try_into_mut` fails while we hold a clone), and the device
        // only reads it (no write rights, checked above).
        let mr = unsafe { RawMr::register(pd, ptr, buf.len(), access)? };
        Ok(BytesMr { mr, buf })
    }

    /// The registered bytes (the device only reads them).
    pub fn bytes(&self) -> &Bytes {
        &self.buf
    }
}

owning_registration!(BytesMr, Bytes, "read");

/// A [`BytesMut`] the device may write: zero-copy receives and RDMA read
/// targets. The registration owns the buffer; it is not accessible at all
/// until [`into_inner`](Self::into_inner) has deregistered it.
pub struct BytesMutMr {
    mr: RawMr,
    /// Empty after `into_inner`. Never accessed while registered.
    buf: BytesMut,
}

impl fmt::Debug for BytesMutMr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BytesMutMr")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("lkey", &self.lkey())
            .finish()
    }
}

impl BytesMutMr {
    /// Registers the initialised part (`buf.len()` bytes, not the spare
    /// capacity) of `buf` with `access` (normally at least
    /// [`AccessFlags::LOCAL_WRITE`]). `Inval` for an empty buffer.
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        mut buf: BytesMut,
        access: AccessFlags,
    ) -> Result<Self, Error> {
        let ptr = buf.as_mut_ptr();
        let len = buf.len();
        // SAFETY: the BytesMut is moved into the returned BytesMutMr (moving
        // it does not move its heap buffer) and is neither accessed nor
        // dropped before a successful deregistration (see into_inner/Drop).
        let mr = unsafe { RawMr::register(pd, ptr, len, access)? };
        Ok(BytesMutMr { mr, buf })
    }
}

owning_registration!(BytesMutMr, BytesMut, "write");
