//! The one module that touches mapped memory. A [`Segment`] is a shared
//! mapping of a file in `/dev/shm` (or an anonymous one, for tests and
//! fuzzing). Other processes may write any byte of it at any time, so:
//!
//! - nothing here hands out a Rust reference to the mapped bytes
//!   (`&[u8]`/`&T` to memory another process mutates would be undefined
//!   behaviour); bytes are copied in and out through raw pointers,
//! - control words are read and written as atomics,
//! - every offset and length is checked against the mapping, so no value
//!   read from the segment can make an access leave it.
//!
//! A copy out may observe a peer's concurrent writes (torn bytes): the
//! caller checks what it copied, it never trusts it.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::marker::PhantomData;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use rustix::fs::{FileType, Mode, OFlags};
use rustix::mm::{MapFlags, ProtFlags};
use rustix::shm;
use weft_core::{Error, Result};

/// A mapped segment.
#[derive(Debug)]
pub struct Segment {
    ptr: NonNull<u8>,
    len: usize,
    /// Where its rings lie, once known and checked against the mapping
    /// ([`set_rings`](Segment::set_rings)): `count` rings of `size`
    /// bytes from `first` (`count` 0 until then).
    rings: Rings,
}

/// A segment's rings, as [`Segment::rings_at`] checked them against its
/// mapping (the default holds none). Nothing in the type ties it to the
/// mapping it was checked against, so [`Segment::ring_in`], which builds
/// a ring on it, is `unsafe`: its callers vouch for where it came from.
#[derive(Debug, Clone, Copy, Default)]
struct Rings {
    first: usize,
    count: usize,
    /// A power of two of at least 8 (0 in the default, which holds no
    /// ring).
    size: usize,
}

// SAFETY: the mapping is plain shared memory, reached only through the
// bounds-checked raw-pointer copies and atomics below; nothing in it is
// tied to a thread.
unsafe impl Send for Segment {}
// SAFETY: as above; concurrent use from several threads is what the
// atomics and the copy discipline are for.
unsafe impl Sync for Segment {}

fn io(e: rustix::io::Errno) -> Error {
    Error::from(std::io::Error::from(e))
}

/// Whether an open by path (`O_NOFOLLOW | O_NONBLOCK`) failed because
/// what is under the path is not a regular file: a symbolic link
/// (`ELOOP`, not followed), a socket (`ENXIO`), a directory opened for
/// writing (`EISDIR`). None of ours, whoever put it there: every open of
/// a segment or private file by its path (`Segment::open`,
/// `live::open_regular`) takes it so.
pub(crate) fn not_a_file(e: rustix::io::Errno) -> bool {
    use rustix::io::Errno;
    matches!(e, Errno::LOOP | Errno::NXIO | Errno::ISDIR)
}

/// Which file a descriptor holds: its device and inode (`fstat`). Not
/// unique on tmpfs: without `inode64` its inode numbers wrap at 32 bits
/// (before Linux 5.9 from one counter shared by every tmpfs), so a newer
/// file under a name may repeat an older one's identity. A check that
/// must tell two segments apart compares their headers' owner instance
/// too (`Peer::claim_fd`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    /// The identity in `st`.
    pub fn of(st: &rustix::fs::Stat) -> FileId {
        FileId {
            dev: st.st_dev,
            ino: st.st_ino,
        }
    }

    /// The identity of the file `fd` holds.
    pub fn of_fd(fd: impl AsFd) -> Result<FileId> {
        rustix::fs::fstat(fd).map(|st| FileId::of(&st)).map_err(io)
    }
}

impl Segment {
    /// Maps the existing `/dev/shm/<name>` if it is a regular file whose
    /// size is between `min` and `max` bytes. `NoEnt` when there is no
    /// such segment; `Inval` when something else is under the name (a
    /// FIFO, a symbolic link, a directory: not a segment, whoever put it
    /// there), which is neither followed nor waited on.
    pub fn open(name: &str, min: usize, max: usize) -> Result<Segment> {
        Segment::open_id(name, min, max).map(|(seg, _)| seg)
    }

    /// [`open`](Self::open), with the identity of the file mapped: a
    /// sender opening the segment again by name for a claim's lock
    /// (`Peer::claim`) checks that it is the very file it mapped, not a
    /// newer segment under the name. The descriptor is closed.
    pub fn open_id(name: &str, min: usize, max: usize) -> Result<(Segment, FileId)> {
        let fd = Segment::open_fd(name)?;
        let st = rustix::fs::fstat(&fd).map_err(io)?;
        let seg = Segment::map_stat(&fd, &st, min, max)?;
        Ok((seg, FileId::of(&st)))
    }

    /// The identity of the file now under `/dev/shm/<name>`, looked up
    /// without opening it (a symbolic link not followed): `NoEnt` when
    /// nothing is there.
    pub fn id_by_name(name: &str) -> Result<FileId> {
        let path = shm_path(name)?;
        rustix::fs::statat(
            rustix::fs::CWD,
            path.as_str(),
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        )
        .map(|st| FileId::of(&st))
        .map_err(|e| match e {
            rustix::io::Errno::NOENT => Error::NoEnt,
            e => io(e),
        })
    }

    /// Opens the existing `/dev/shm/<name>` for reading and writing, as
    /// every open of a segment by name: never following a symbolic link
    /// nor waiting on a FIFO (`O_NONBLOCK`, which does nothing to a
    /// regular file), closed at `exec`. `NoEnt` when nothing is under the
    /// name; `Inval` when what is there cannot be a segment; `MFile` out
    /// of descriptors (the process's or the system's).
    pub fn open_fd(name: &str) -> Result<OwnedFd> {
        let path = shm_path(name)?;
        let flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        rustix::fs::open(path.as_str(), flags, Mode::empty()).map_err(|e| match e {
            rustix::io::Errno::NOENT => Error::NoEnt,
            // Out of descriptors, the system's rather than the process's:
            // the same shortage to a caller (`Io` would hide it).
            rustix::io::Errno::NFILE => Error::MFile,
            e if not_a_file(e) => Error::Inval,
            e => io(e),
        })
    }

    /// Maps the whole of the open file `f`, whose size is taken from the
    /// file itself (`fstat`) and must be at least `min` bytes (`Inval`
    /// otherwise): no byte of the mapping lies past its end when mapped.
    /// For a segment its creator made and sized under a private name
    /// (`create::create_segment`), mapped through the descriptor that
    /// holds its lock rather than by a name that may change hands.
    pub fn map_file(f: &std::fs::File, min: usize) -> Result<Segment> {
        Segment::map_regular(f, min, usize::MAX)
    }

    /// Maps the whole of the open file `fd` if it is a regular file
    /// (`Inval` otherwise) whose size, as `fstat` says now, is between
    /// `min` and `max` bytes (and not 0): the one check of what a
    /// descriptor holds before it is mapped, whoever opened it.
    fn map_regular(fd: impl AsFd, min: usize, max: usize) -> Result<Segment> {
        let st = rustix::fs::fstat(&fd).map_err(io)?;
        Segment::map_stat(fd, &st, min, max)
    }

    /// [`map_regular`](Self::map_regular) by the `fstat` `st` of `fd`.
    fn map_stat(fd: impl AsFd, st: &rustix::fs::Stat, min: usize, max: usize) -> Result<Segment> {
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(Error::Inval);
        }
        let len = usize::try_from(st.st_size).map_err(|_| Error::Inval)?;
        if len < min || len > max {
            return Err(Error::Inval);
        }
        Segment::map(fd, len)
    }

    /// Maps a peer's shared pool (`pool_map`): `fd` must be a file on
    /// tmpfs (hugetlbfs, whose pages can run out under a mapping, is
    /// refused) sealed against shrinking (so that no access of ours can
    /// fault past its end, whatever its owner does later: only a
    /// `memfd` carries that seal), a regular file of inode `ino` and
    /// exactly `len` bytes. `Inval` otherwise.
    pub fn map_sealed(fd: &OwnedFd, ino: u64, len: usize) -> Result<Segment> {
        /// `TMPFS_MAGIC` (linux/magic.h): shmem, where a `memfd` lives.
        const TMPFS_MAGIC: i64 = 0x0102_1994;
        let seals = rustix::fs::fcntl_get_seals(fd).map_err(|_| Error::Inval)?;
        if !seals.contains(rustix::fs::SealFlags::SHRINK) {
            return Err(Error::Inval);
        }
        let fs = rustix::fs::fstatfs(fd).map_err(io)?;
        #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
        if i64::from(fs.f_type) != TMPFS_MAGIC {
            return Err(Error::Inval);
        }
        let st = rustix::fs::fstat(fd).map_err(io)?;
        if st.st_ino != ino {
            return Err(Error::Inval);
        }
        Segment::map_stat(fd, &st, len, len)
    }

    /// An anonymous shared mapping holding `bytes` (tests and fuzzing:
    /// the same accessors over contents nobody vouches for).
    pub fn anonymous(bytes: &[u8]) -> Result<Segment> {
        let len = bytes.len().max(8);
        // SAFETY: a fresh anonymous mapping at an address the kernel
        // chooses; it overlaps nothing of ours.
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
            )
        }
        .map_err(io)?;
        let ptr = NonNull::new(p.cast::<u8>()).ok_or(Error::NoMem)?;
        let s = Segment {
            ptr,
            len,
            rings: Rings::default(),
        };
        s.write(0, bytes);
        Ok(s)
    }

    fn map(fd: impl AsFd, len: usize) -> Result<Segment> {
        if len == 0 {
            return Err(Error::Inval);
        }
        // SAFETY: a new shared mapping of `len` bytes of `fd` at an
        // address the kernel chooses; it overlaps nothing of ours. The
        // fd may be closed afterwards: the mapping keeps the file.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )
        }
        .map_err(io)?;
        let ptr = NonNull::new(p.cast::<u8>()).ok_or(Error::NoMem)?;
        Ok(Segment {
            ptr,
            len,
            rings: Rings::default(),
        })
    }

    /// Removes `/dev/shm/<name>` (mappings stay valid).
    pub fn unlink(name: &str) {
        let _ = shm::unlink(name);
    }

    /// Bytes mapped.
    pub fn size(&self) -> usize {
        self.len
    }

    /// Whether `off..off + n` lies inside the mapping.
    fn within(&self, off: usize, n: usize) -> bool {
        off.checked_add(n).is_some_and(|end| end <= self.len)
    }

    fn u32_at(&self, off: usize) -> Option<&AtomicU32> {
        // SAFETY: the whole mapping, page aligned, mapped while `self` is.
        unsafe { atomic_at(self.ptr, self.len, off) }
    }

    fn u64_at(&self, off: usize) -> Option<&AtomicU64> {
        // SAFETY: as in `u32_at`.
        unsafe { atomic_at(self.ptr, self.len, off) }
    }

    /// The u32 at `off` (`None`: outside or misaligned).
    pub fn load32(&self, off: usize, o: Ordering) -> Option<u32> {
        self.u32_at(off).map(|a| a.load(o))
    }

    /// The u64 at `off`.
    pub fn load64(&self, off: usize, o: Ordering) -> Option<u64> {
        self.u64_at(off).map(|a| a.load(o))
    }

    /// Stores a u32; false when outside.
    pub fn store32(&self, off: usize, v: u32, o: Ordering) -> bool {
        self.u32_at(off).map(|a| a.store(v, o)).is_some()
    }

    /// Stores a u64; false when outside.
    pub fn store64(&self, off: usize, v: u64, o: Ordering) -> bool {
        self.u64_at(off).map(|a| a.store(v, o)).is_some()
    }

    /// Swaps a u32, returning the old value.
    pub fn swap32(&self, off: usize, v: u32) -> Option<u32> {
        self.u32_at(off).map(|a| a.swap(v, Ordering::AcqRel))
    }

    /// Compare-and-swap of a u32; true when it was `old`.
    pub fn cas32(&self, off: usize, old: u32, new: u32) -> bool {
        self.u32_at(off).is_some_and(|a| {
            a.compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        })
    }

    /// Compare-and-swap of a u64; true when it was `old`.
    pub fn cas64(&self, off: usize, old: u64, new: u64) -> bool {
        self.u64_at(off).is_some_and(|a| {
            a.compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        })
    }

    /// Keeps only the bits of the u64 at `off` that `mask` has, in one
    /// atomic step; the old value.
    pub fn and64(&self, off: usize, mask: u64) -> Option<u64> {
        self.u64_at(off)
            .map(|a| a.fetch_and(mask, Ordering::AcqRel))
    }

    /// The `N` bytes at `off` as a [`Block`], if they lie inside the
    /// mapping and `off` is 8-aligned.
    #[inline]
    pub fn block<const N: usize>(&self, off: usize) -> Option<Block<'_, N>> {
        if off % 8 != 0 || !self.within(off, N) {
            return None;
        }
        // SAFETY: `off + N <= len` (`within`, checked above): the pointer
        // and the `N` bytes after it, which `Block`'s reads and writes
        // stay inside, lie in the mapping (one past its end when `N` is
        // 0); `off` is 8-aligned and the mapping page-aligned, so its
        // words are aligned.
        let ptr = unsafe { self.ptr.add(off) };
        Some(Block {
            ptr,
            _seg: PhantomData,
        })
    }

    /// Records where the segment's rings lie: `count` rings of `size`
    /// bytes each from `first`, if `size` is a power of two of at least
    /// 8, `first` is 8-aligned and all of them lie inside the mapping
    /// (false, nothing recorded, otherwise). Then
    /// [`ring_of`](Self::ring_of) reaches ring `i` by an index test alone:
    /// its send and receive paths take a channel's ring once a message,
    /// and its quiet look once a pass.
    pub fn set_rings(&mut self, first: usize, count: usize, size: usize) -> bool {
        match self.rings_at(first, count, size) {
            Some(r) => {
                self.rings = r;
                true
            }
            None => false,
        }
    }

    /// Ring `i` of those [`set_rings`](Self::set_rings) recorded (`None`:
    /// past them, or none recorded).
    #[inline(always)]
    pub fn ring_of(&self, i: usize) -> Option<Ring<'_>> {
        // SAFETY: `self.rings` is the default (no ring) or what
        // `rings_at` of this segment returned (`set_rings`).
        unsafe { self.ring_in(self.rings, i) }
    }

    /// The `size` bytes at `off` as a [`Ring`], if `size` is a power of
    /// two of at least 8, `off` is 8-aligned and the bytes lie inside the
    /// mapping: the one check a channel's ring needs, made once for a
    /// drain or a send rather than at every word.
    #[inline]
    pub fn ring(&self, off: usize, size: usize) -> Option<Ring<'_>> {
        let r = self.rings_at(off, 1, size)?;
        // SAFETY: `r` is what `rings_at` of this segment just returned.
        unsafe { self.ring_in(r, 0) }
    }

    /// `count` rings of `size` bytes from `first`, if `size` is a power of
    /// two of at least 8, `first` is 8-aligned and all of them lie inside
    /// the mapping: the one check of a ring's shape, whose result alone
    /// [`ring_in`](Self::ring_in) takes.
    fn rings_at(&self, first: usize, count: usize, size: usize) -> Option<Rings> {
        let span = count.checked_mul(size)?;
        let ok = first % 8 == 0 && size >= 8 && size.is_power_of_two() && self.within(first, span);
        ok.then_some(Rings { first, count, size })
    }

    /// Ring `i` of `r`, rings of this mapping that
    /// [`rings_at`](Self::rings_at) checked (`None`: past them; none in
    /// the default, empty `Rings`).
    ///
    /// # Safety
    ///
    /// `r` is `Rings::default()` or was returned by `rings_at` of this
    /// very segment (`self`): a `Rings` built otherwise, or checked
    /// against another mapping, would give a ring outside this one.
    #[inline(always)]
    unsafe fn ring_in(&self, r: Rings, i: usize) -> Option<Ring<'_>> {
        if i >= r.count {
            return None;
        }
        let off = r.first + i * r.size;
        // SAFETY: a `Rings` that holds any ring comes from `rings_at` of
        // this segment (the caller's contract: `self.rings`, or made by
        // the caller just now), which checked that its `count` rings of `size` bytes from
        // `first` (8-aligned) lie inside the mapping; `i < count`, so ring
        // `i`'s bytes are inside, 8-aligned (the mapping is page-aligned,
        // `first` 8-aligned, the size a power of two of at least 8).
        let ptr = unsafe { self.ptr.add(off) };
        Some(Ring {
            ptr,
            off,
            mask: r.size - 1,
            _seg: PhantomData,
        })
    }

    /// Copies `out.len()` bytes from `off`; false (nothing copied) when
    /// the range leaves the mapping.
    #[inline]
    pub fn read(&self, off: usize, out: &mut [u8]) -> bool {
        if !self.within(off, out.len()) {
            return false;
        }
        // SAFETY: the source range is inside the mapping and the
        // destination is our own buffer, which cannot overlap it. No
        // reference to the shared bytes is formed: a peer writing them
        // meanwhile changes what we copy, nothing else.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), out.as_mut_ptr(), out.len())
        };
        true
    }

    /// Copies `data` in at `off`; false (nothing written) when the range
    /// leaves the mapping.
    pub fn write(&self, off: usize, data: &[u8]) -> bool {
        if !self.within(off, data.len()) {
            return false;
        }
        // SAFETY: the destination range is inside the mapping, the
        // source is a buffer of ours outside it.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(off), data.len())
        };
        true
    }
}

/// `N` bytes of a segment, checked to lie inside its mapping once, when
/// made ([`Segment::block`]): a word at an offset within them is reached
/// without checking the mapping again; the check of a constant offset
/// against `N` is still made at run time, and folded away by the
/// compiler (the control block's offsets are also asserted when the
/// crate builds, in `layout`). A channel's control block is read and
/// written several times a message.
#[derive(Debug, Clone, Copy)]
pub struct Block<'a, const N: usize> {
    /// The block's first byte, 8-aligned.
    ptr: NonNull<u8>,
    /// The mapping stays mapped while the block is used.
    _seg: PhantomData<&'a Segment>,
}

impl<'a, const N: usize> Block<'a, N> {
    #[inline]
    fn u32_at(&self, off: usize) -> Option<&'a AtomicU32> {
        // SAFETY: the block's `N` bytes lie inside the mapping
        // (`Segment::block`), mapped for `'a`, and start 8-aligned.
        unsafe { atomic_at(self.ptr, N, off) }
    }

    #[inline]
    fn u64_at(&self, off: usize) -> Option<&'a AtomicU64> {
        // SAFETY: as in `u32_at`.
        unsafe { atomic_at(self.ptr, N, off) }
    }

    /// The u32 at `off` within the block (`None`: outside or misaligned).
    #[inline]
    pub fn load32(&self, off: usize, o: Ordering) -> Option<u32> {
        self.u32_at(off).map(|a| a.load(o))
    }

    /// The u64 at `off` within the block.
    #[inline]
    pub fn load64(&self, off: usize, o: Ordering) -> Option<u64> {
        self.u64_at(off).map(|a| a.load(o))
    }

    /// Stores a u64; false when outside.
    #[inline]
    pub fn store64(&self, off: usize, v: u64, o: Ordering) -> bool {
        self.u64_at(off).map(|a| a.store(v, o)).is_some()
    }

    /// Swaps a u32, returning the old value.
    #[inline]
    pub fn swap32(&self, off: usize, v: u32) -> Option<u32> {
        self.u32_at(off).map(|a| a.swap(v, Ordering::AcqRel))
    }
}

/// A ring's bytes, checked to lie inside the mapping once, when made
/// ([`Segment::ring`]), and reached by ring position: a position (any
/// `u64`, read from shared memory or not) is masked to an offset below
/// the ring's size, so only its alignment is left to check per access.
#[derive(Debug, Clone, Copy)]
pub struct Ring<'a> {
    /// The ring's first byte, 8-aligned.
    ptr: NonNull<u8>,
    /// The segment offset of that byte.
    off: usize,
    /// The ring's size less one; the size is a power of two, at least 8.
    mask: usize,
    /// The mapping stays mapped while the ring is used.
    _seg: PhantomData<&'a Segment>,
}

impl<'a> Ring<'a> {
    /// The ring offset of position `at`.
    #[inline(always)]
    pub fn pos(&self, at: u64) -> usize {
        at as usize & self.mask
    }

    /// The segment offset of ring offset `pos`.
    #[inline(always)]
    pub fn seg_off(&self, pos: usize) -> usize {
        self.off + pos
    }

    /// The ring's size.
    #[inline(always)]
    pub fn size(&self) -> usize {
        self.mask + 1
    }

    /// The u32 at position `at` (`None`: not 4-aligned). No bound to
    /// check: the offset is at most `size - 1` and a multiple of 4, and
    /// `size` is a multiple of 8, so its word ends inside the ring.
    #[inline(always)]
    fn u32_at(&self, at: u64) -> Option<&'a AtomicU32> {
        let off = self.pos(at);
        if off % 4 != 0 {
            return None;
        }
        // SAFETY: `off + 4 <= size` (above) and the ring's `size` bytes
        // lie inside the mapping (`Segment::ring_in`), mapped for `'a`; the
        // ring starts 8-aligned, so `off` 4-aligned is an aligned word.
        Some(unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU32>() })
    }

    /// The u32 at position `at` (`None`: misaligned).
    #[inline(always)]
    pub fn load32(&self, at: u64, o: Ordering) -> Option<u32> {
        self.u32_at(at).map(|a| a.load(o))
    }

    /// Stores a u32 at position `at`; false when misaligned.
    #[inline(always)]
    pub fn store32(&self, at: u64, v: u32, o: Ordering) -> bool {
        self.u32_at(at).map(|a| a.store(v, o)).is_some()
    }

    /// Whether `n` bytes from ring offset `pos` stay inside the ring.
    #[inline(always)]
    fn fits(&self, pos: usize, n: usize) -> bool {
        pos <= self.mask && n <= self.mask + 1 - pos
    }

    /// Copies `out.len()` bytes from ring offset `pos`; false (nothing
    /// copied) when they would pass the ring's end.
    #[inline(always)]
    pub fn read(&self, pos: usize, out: &mut [u8]) -> bool {
        if !self.fits(pos, out.len()) {
            return false;
        }
        // SAFETY: `pos..pos + len` lies inside the ring (checked above),
        // which lies inside the mapping; the destination is our own
        // buffer. No reference to the shared bytes is formed.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(pos), out.as_mut_ptr(), out.len())
        };
        true
    }

    /// Copies `data` in at ring offset `pos`; false (nothing written) when
    /// it would pass the ring's end.
    #[inline(always)]
    pub fn write(&self, pos: usize, data: &[u8]) -> bool {
        if !self.fits(pos, data.len()) {
            return false;
        }
        // SAFETY: as in `read`, the other way round.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(pos), data.len())
        };
        true
    }
}

/// The atomic `T` (`AtomicU32`, `AtomicU64`) at `base + off`, when it
/// lies within the `limit` bytes from `base` and `off` is aligned to it
/// (`None` otherwise: no offset read from shared memory reaches past
/// them).
///
/// # Safety
/// `base..base + limit` is mapped for `'a` and `base` is 8-aligned.
#[inline(always)]
unsafe fn atomic_at<'a, T>(base: NonNull<u8>, limit: usize, off: usize) -> Option<&'a T> {
    let size = std::mem::size_of::<T>();
    if off % size != 0 || off.checked_add(size).is_none_or(|end| end > limit) {
        return None;
    }
    // SAFETY: `off..off + size` lies inside the mapped range (checked
    // above, and the caller's promise), aligned to `size` as `base` is
    // 8-aligned; an atomic is what memory other processes write may be
    // reached through, and the range stays mapped for `'a`.
    Some(unsafe { &*base.as_ptr().add(off).cast::<T>() })
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `map`/`anonymous` with this
        // length and is unmapped once; no reference into it outlives the
        // accessors above (each borrow ends with the call).
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast::<c_void>(), self.len) };
    }
}

/// `/dev/shm/<name>` for a segment name taken as `shm_open(3)` takes it:
/// leading slashes, then one file name (`Inval` for anything else).
fn shm_path(name: &str) -> Result<String> {
    let name = name.trim_start_matches('/');
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(Error::Inval);
    }
    Ok(format!("{}/{name}", crate::name::SHM_DIR))
}

#[cfg(test)]
#[path = "segment_tests.rs"]
mod tests;
