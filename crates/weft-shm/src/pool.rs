//! Buffer pools a peer can map (`Domain::buffer_pool` on shm): the one
//! module that puts shared memory under the application's buffers.
//!
//! A pool's buffers are ordinary [`BytesMut`]s, views of one heap
//! allocation, as `weft_core::pool::Carved` makes them; here the
//! page-aligned stretch under them is then replaced, in place, by a
//! shared mapping of a sealed `memfd` (`MAP_FIXED`). The process sees the
//! same addresses and bytes; a peer allowed to attach to it
//! (`pidfd_getfd`, the right cross-memory attach needs) maps the same
//! file and copies a message's bytes with plain loads and stores, no
//! system call per message (`pool_map`, `docs/design.md`, "Shared
//! pools"). The file is sealed against shrinking and growing, so no peer
//! can make our accesses fault by truncating it.
//!
//! When the pool goes, the stretch is made private again with its
//! contents (copied to a fresh anonymous mapping moved over it with
//! `mremap`) before the allocation can go back to the allocator: the heap
//! must never hold shared pages (a `fork` would share them with the
//! child), and a buffer still lent out keeps what it holds.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use bytes::BytesMut;
use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, MremapFlags, ProtFlags};
use weft_core::pool::{PoolMemory, MAX_POOL_BYTES};
use weft_core::{Error, Result};

const PAGE: usize = 4096;

/// What a peer needs to map a pool of ours and find an address in it:
/// the descriptor number in our process, the file's inode (checked once
/// the peer holds the file: a number reused for another file is not
/// mapped), and the address range the mapping covers here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PoolRef {
    pub fd: u32,
    pub ino: u64,
    pub base: u64,
    pub len: u64,
}

/// Bytes of a [`PoolRef`] on the wire: fd (u32), zero (u32), inode,
/// base, length (u64 each), host byte order.
pub const POOL_REF_LEN: usize = 32;

impl PoolRef {
    pub fn encode(&self) -> [u8; POOL_REF_LEN] {
        let mut b = [0u8; POOL_REF_LEN];
        b[0..4].copy_from_slice(&self.fd.to_ne_bytes());
        b[8..16].copy_from_slice(&self.ino.to_ne_bytes());
        b[16..24].copy_from_slice(&self.base.to_ne_bytes());
        b[24..32].copy_from_slice(&self.len.to_ne_bytes());
        b
    }

    /// A reference as written, if it keeps the rules: the reserved word
    /// zero, a page-aligned nonzero range that does not wrap, within the
    /// largest pool.
    pub fn parse(b: &[u8]) -> Option<PoolRef> {
        let w4 = |o: usize| Some(u32::from_ne_bytes(b.get(o..o + 4)?.try_into().ok()?));
        let w8 = |o: usize| Some(u64::from_ne_bytes(b.get(o..o + 8)?.try_into().ok()?));
        if b.len() != POOL_REF_LEN || w4(4)? != 0 {
            return None;
        }
        let r = PoolRef {
            fd: w4(0)?,
            ino: w8(8)?,
            base: w8(16)?,
            len: w8(24)?,
        };
        let ok = r.len > 0
            && r.len <= (MAX_POOL_BYTES + PAGE) as u64
            && (r.base | r.len) % PAGE as u64 == 0
            && r.base.checked_add(r.len).is_some();
        ok.then_some(r)
    }

    /// Whether every range (address, length) lies inside the pool.
    pub fn holds(&self, ranges: &[(u64, u64)]) -> bool {
        ranges.iter().all(|&(a, l)| {
            a >= self.base && a.checked_add(l).is_some_and(|e| e <= self.base + self.len)
        })
    }
}

/// The pools of this process, for the message paths to find whether a
/// buffer lies in one. `COUNT` lets them skip the lock when there is
/// none (the usual case).
static POOLS: Mutex<Vec<PoolRef>> = Mutex::new(Vec::new());
static COUNT: AtomicUsize = AtomicUsize::new(0);

fn pools() -> std::sync::MutexGuard<'static, Vec<PoolRef>> {
    POOLS.lock().unwrap_or_else(|p| p.into_inner())
}

/// The pool of ours holding every one of `ranges`, if one does.
pub fn lookup(ranges: &[(u64, u64)]) -> Option<PoolRef> {
    if COUNT.load(Ordering::Relaxed) == 0 {
        return None;
    }
    pools().iter().find(|p| p.holds(ranges)).copied()
}

/// How many copies this process has made through a peer's mapped pool
/// (reads of a sender's, writes of a split part into an owner's) rather
/// than by cross-memory attach: what shows the path is taken.
pub fn mapped_copies() -> u64 {
    crate::pool_map::COPIES.load(Ordering::Relaxed)
}

/// Whether pools are made shared: only where peers could attach anyway
/// (cross-memory attach permitted outright), and not turned off by
/// `WEFT_SHM_SHARED_POOL=0`.
pub fn enabled() -> bool {
    crate::cma::mode() == crate::cma::Mode::Permitted
        && std::env::var("WEFT_SHM_SHARED_POOL").map_or(true, |v| v.trim() != "0")
}

/// What keeps a shared pool: its file, the stretch it is mapped over,
/// and the allocation's last byte (so the allocation outlives the
/// mapping, whatever happens to the buffers).
struct Shared {
    /// Open while the pool lives: the number peers are told.
    _fd: OwnedFd,
    r: PoolRef,
    keeper: Option<BytesMut>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        {
            let mut l = pools();
            l.retain(|p| *p != self.r);
            COUNT.store(l.len(), Ordering::Relaxed);
        }
        let (base, len) = (self.r.base as usize as *mut c_void, self.r.len as usize);
        if !privatize(base, len) {
            // The stretch could not be made private: the allocation must
            // then never go back to the allocator (leaked, not shared).
            std::mem::forget(self.keeper.take());
        }
    }
}

/// Replaces the shared mapping at `base` (`len` bytes) by a private one
/// holding the same bytes.
fn privatize(base: *mut c_void, len: usize) -> bool {
    // SAFETY: a fresh anonymous private mapping at an address the kernel
    // chooses; it overlaps nothing of ours.
    let fresh = unsafe {
        rustix::mm::mmap_anonymous(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::PRIVATE,
        )
    };
    let Ok(fresh) = fresh else {
        return false;
    };
    // SAFETY: `base..base + len` is the stretch `alloc` mapped, inside an
    // allocation the keeper still holds; `fresh` is the new mapping. The
    // two do not overlap. Copied through raw pointers: a buffer's bytes
    // may be changing under us (a peer's late write), which only changes
    // what is copied.
    unsafe { std::ptr::copy_nonoverlapping(base.cast::<u8>(), fresh.cast::<u8>(), len) };
    // SAFETY: moves the fresh mapping over the stretch, atomically
    // replacing the shared pages there (`MREMAP_FIXED` unmaps what was
    // at the target); both ranges are page-aligned, `len` bytes, ours.
    let moved = unsafe { rustix::mm::mremap_fixed(fresh, len, len, MremapFlags::MAYMOVE, base) };
    if moved.is_err() {
        // SAFETY: the fresh mapping is still where mmap put it, ours.
        let _ = unsafe { rustix::mm::munmap(fresh, len) };
        return false;
    }
    true
}

/// `count` buffers of `size` bytes in one allocation whose buffers a peer
/// can map (see the module). `Inval` for no buffers or empty ones,
/// `NoMem` past `MAX_POOL_BYTES`; an error from the kernel making the
/// file or the mapping is returned as is (the caller may fall back to a
/// plain pool).
pub fn alloc(count: usize, size: usize) -> Result<PoolMemory> {
    if count == 0 || size == 0 {
        return Err(Error::Inval);
    }
    let span = count
        .checked_mul(size)
        .filter(|&s| s <= MAX_POOL_BYTES)
        .ok_or(Error::NoMem)?;
    let len = span.next_multiple_of(PAGE);
    let fd = rustix::fs::memfd_create("weft-pool", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .map_err(io)?;
    rustix::fs::ftruncate(&fd, len as u64).map_err(io)?;
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
        .map_err(io)?;
    let ino = rustix::fs::fstat(&fd).map_err(io)?.st_ino;
    // A page of room to align the buffers' start, and the keeper's byte
    // past the stretch.
    let mut all = BytesMut::zeroed(len + PAGE + 1);
    let pad = (all.as_ptr() as usize).next_multiple_of(PAGE) - all.as_ptr() as usize;
    drop(all.split_to(pad));
    let base = all.as_ptr() as usize;
    // SAFETY: `base..base + len` lies inside `all`'s allocation (which
    // has `len + 1` bytes from `base` left), page-aligned, and nothing
    // reads or writes it yet; the allocator's own words lie outside it
    // (before the allocation's start, after its end). The new mapping
    // holds zeroes, as the allocation did.
    let mapped = unsafe {
        rustix::mm::mmap(
            base as *mut c_void,
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED | MapFlags::FIXED,
            &fd,
            0,
        )
    };
    match mapped {
        Ok(p) if p as usize == base => {}
        Ok(_) | Err(_) => {
            // A failed MAP_FIXED may have unmapped the stretch: the
            // allocation is leaked rather than given back with a hole.
            std::mem::forget(all);
            return Err(Error::NoMem);
        }
    }
    let mut bufs = Vec::with_capacity(count);
    for _ in 0..count {
        bufs.push(all.split_to(size));
    }
    let r = PoolRef {
        fd: fd.as_raw_fd() as u32,
        ino,
        base: base as u64,
        len: len as u64,
    };
    {
        let mut l = pools();
        l.push(r);
        COUNT.store(l.len(), Ordering::Relaxed);
    }
    tracing::debug!(count, size, fd = r.fd, "shm shared buffer pool");
    Ok(PoolMemory {
        bufs,
        desc: 0,
        keep: Box::new(Shared {
            _fd: fd,
            r,
            keeper: Some(all),
        }),
    })
}

fn io(e: rustix::io::Errno) -> Error {
    Error::from(std::io::Error::from(e))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_reference_round_trips_and_lies_are_refused() {
        let r = PoolRef {
            fd: 7,
            ino: 99,
            base: 0x10_0000,
            len: 0x2000,
        };
        assert_eq!(PoolRef::parse(&r.encode()), Some(r));
        let mut b = r.encode();
        b[4] = 1;
        assert_eq!(PoolRef::parse(&b), None, "reserved word");
        let odd = PoolRef {
            base: 0x10_0001,
            ..r
        };
        assert_eq!(PoolRef::parse(&odd.encode()), None, "unaligned");
        let wrap = PoolRef {
            base: !4095,
            ..r
        };
        assert_eq!(PoolRef::parse(&wrap.encode()), None, "wraps");
        let empty = PoolRef { len: 0, ..r };
        assert_eq!(PoolRef::parse(&empty.encode()), None, "empty");
        assert!(r.holds(&[(0x10_0000, 0x1000), (0x10_1000, 0x1000)]));
        assert!(!r.holds(&[(0x10_1000, 0x1001)]));
        assert!(!r.holds(&[(0xf_ffff, 2)]));
    }

    #[test]
    fn a_pool_is_shared_memory_found_by_address_and_private_again_after() {
        let mem = alloc(3, 5000).expect("pool");
        let mut bufs = mem.bufs;
        assert_eq!(bufs.len(), 3);
        let a = bufs[1].as_ptr() as u64;
        let r = lookup(&[(a, 5000)]).expect("found");
        assert_eq!(r.len, 16384);
        assert_eq!(r.base, bufs[0].as_ptr() as u64);
        // The buffers' bytes are the file's.
        bufs[1][..4].copy_from_slice(b"weft");
        let f = std::fs::File::from(rustix::io::dup(unsafe_fd(r.fd)).expect("dup"));
        let mut got = [0u8; 4];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut got, 5000).expect("read");
        assert_eq!(&got, b"weft");
        // A lent buffer outlives its pool, with its bytes, in private
        // memory.
        let lent = bufs.pop().expect("buf");
        drop(bufs);
        drop(mem.keep);
        assert_eq!(lookup(&[(a, 1)]), None, "gone from the table");
        let mut lent = lent;
        lent[0] = 1;
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut got[..1], 10000).expect("read");
        assert_eq!(got[0], 0, "the file no longer sees our writes");
    }

    /// The descriptor the table names (a test of our own pool).
    fn unsafe_fd(fd: u32) -> std::os::fd::BorrowedFd<'static> {
        // SAFETY: the pool, which owns this descriptor, lives until after
        // the `dup` it is borrowed for.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(fd as i32) }
    }
}
