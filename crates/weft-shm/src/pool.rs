//! Buffer pools a peer can map (`Domain::buffer_pool` on shm): the one
//! module that puts shared memory under the application's buffers.
//!
//! A pool's buffers are ordinary [`BytesMut`]s, views of one heap
//! allocation, as `weft_core::pool::Carved` makes them; here the
//! page-aligned stretch under them is then replaced, in place, by a
//! shared mapping of a sealed `memfd` (`MAP_FIXED`). The process sees the
//! same addresses and bytes; a peer allowed to look at its descriptors
//! (part of the right cross-memory attach needs) maps the same
//! file and copies a message's bytes with plain loads and stores, no
//! system call per message (`pool_map`, `docs/design.md`, "Shared
//! pools"). The file is sealed against shrinking and growing, so no peer
//! can make our accesses fault by truncating it.
//!
//! When the pool goes with every buffer back (the allocation's last
//! view is the pool's own), the stretch is made private again — fresh
//! anonymous pages mapped over it — before the allocation can go back to
//! the allocator: the heap must never hold shared pages (a `fork` would
//! share them with the child). If a buffer is still out (lent to a
//! posted receive, lost with a closed endpoint, or held in a completion),
//! something may still write it through the file, so the stretch stays
//! shared and the allocation is never given back (leaked, not reused).
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use bytes::BytesMut;
use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};
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
        crate::pool_map::forget(&self.r);
        let Some(keeper) = self.keeper.take() else {
            return;
        };
        let all = keeper.freeze();
        let base = self.r.base as usize as *mut c_void;
        let unique = all.is_unique();
        // `is_unique` reads the count relaxed: the other views' last
        // accesses must be seen before their pages are replaced.
        std::sync::atomic::fence(Ordering::Acquire);
        if !unique || !unshare(base, self.r.len as usize) {
            // A buffer is still out, or the stretch could not be made
            // private: the allocation must never go back to the allocator
            // with shared pages under it.
            std::mem::forget(all);
        }
    }
}

/// Maps fresh private anonymous pages over the stretch at `base` (`len`
/// bytes): what was there, our shared mapping of the pool's file, goes.
fn unshare(base: *mut c_void, len: usize) -> bool {
    // SAFETY: `base..base + len` is the stretch `alloc` mapped, inside an
    // allocation nothing but the caller's last view holds any more (so no
    // buffer reads or writes it); the new pages are zero, as the
    // allocator's own would be after a fresh `mmap`.
    let p = unsafe {
        rustix::mm::mmap_anonymous(
            base,
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::PRIVATE | MapFlags::FIXED,
        )
    };
    matches!(p, Ok(p) if p == base)
}

/// `count` buffers of `size` bytes in one allocation whose buffers a peer
/// can map (see the module). `Inval` for no buffers or empty ones,
/// `NoMem` past `MAX_POOL_BYTES`; an error from the kernel making the
/// file is returned as is, a mapping that could not be made is `NoMem`
/// (either way the caller may fall back to a plain pool).
pub fn alloc(count: usize, size: usize) -> Result<PoolMemory> {
    let len = weft_core::pool::span(count, size)?.next_multiple_of(PAGE);
    let fd = rustix::fs::memfd_create("weft-pool", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .map_err(io)?;
    rustix::fs::ftruncate(&fd, len as u64).map_err(io)?;
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
        .map_err(io)?;
    let ino = rustix::fs::fstat(&fd).map_err(io)?.st_ino;
    // A child forked from now on shares the pool's pages: it must hold
    // our token too, to be taken for us (`split::token`).
    crate::split::token();
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
        _ => {
            // A failed MAP_FIXED may have unmapped the stretch: private
            // pages over it again make the allocation whole (zero, as it
            // was); if even that fails it is leaked, never given back with
            // a hole.
            if !unshare(base as *mut c_void, len) {
                std::mem::forget(all);
            }
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
        let wrap = PoolRef { base: !4095, ..r };
        assert_eq!(PoolRef::parse(&wrap.encode()), None, "wraps");
        let empty = PoolRef { len: 0, ..r };
        assert_eq!(PoolRef::parse(&empty.encode()), None, "empty");
        assert!(r.holds(&[(0x10_0000, 0x1000), (0x10_1000, 0x1000)]));
        assert!(!r.holds(&[(0x10_1000, 0x1001)]));
        assert!(!r.holds(&[(0xf_ffff, 2)]));
    }

    #[test]
    fn a_pool_is_shared_memory_found_by_address_and_stays_shared_while_a_buffer_is_out() {
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
        // A buffer still out when the pool goes: the stretch stays shared
        // (the file sees what it holds), its bytes kept.
        let lent = bufs.pop().expect("buf");
        drop(bufs);
        drop(mem.keep);
        assert_eq!(lookup(&[(a, 1)]), None, "gone from the table");
        let mut lent = lent;
        lent[7] = 9;
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut got[..1], 10007).expect("read");
        assert_eq!(got[0], 9, "still the file's pages");
        assert_eq!(mapped_at(r.base), Some(true));
    }

    #[test]
    fn a_pool_with_every_buffer_back_is_private_again() {
        let mem = alloc(2, 4096).expect("pool");
        let r = lookup(&[(mem.bufs[0].as_ptr() as u64, 1)]).expect("found");
        assert_eq!(mapped_at(r.base), Some(true));
        drop(mem.bufs);
        drop(mem.keep);
        assert_ne!(mapped_at(r.base), Some(true), "still the pool's file");
    }

    /// Whether the page at `addr` is a mapping of a pool's file
    /// (`/proc/self/maps`), `None` if nothing is mapped there.
    fn mapped_at(addr: u64) -> Option<bool> {
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        maps.lines().find_map(|l| {
            let range = l.split_whitespace().next()?;
            let (lo, hi) = range.split_once('-')?;
            let (lo, hi) = (
                u64::from_str_radix(lo, 16).ok()?,
                u64::from_str_radix(hi, 16).ok()?,
            );
            (lo..hi).contains(&addr).then(|| l.contains("weft-pool"))
        })
    }

    #[test]
    fn writes_to_a_lent_buffer_while_the_pool_goes_are_kept() {
        let mem = alloc(1, 16 << 20).expect("pool");
        let mut bufs = mem.bufs;
        let mut lent = bufs.pop().expect("buf");
        let started = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = started.clone();
        let t = std::thread::spawn(move || {
            let pages = lent.len() / 4096;
            for i in 0..pages {
                lent[i * 4096] = 1;
                if i == 16 {
                    s2.store(true, Ordering::Relaxed);
                }
            }
            lent
        });
        while !started.load(Ordering::Relaxed) && !t.is_finished() {
            std::hint::spin_loop();
        }
        drop(mem.keep);
        let lent = t.join().expect("writer");
        let lost = (0..lent.len() / 4096)
            .filter(|&i| lent[i * 4096] != 1)
            .count();
        assert_eq!(lost, 0, "writes lost while the pool went");
    }

    #[test]
    fn a_dropped_pool_of_ours_is_not_kept_mapped() {
        if !enabled() {
            eprintln!("skipped: cross-memory attach is not permitted here");
            return;
        }
        let mem = alloc(1, 8 << 20).expect("pool");
        let a = mem.bufs[0].as_ptr() as u64;
        let r = lookup(&[(a, 8)]).expect("ours");
        let mut out = [0u8; 8];
        let me = std::process::id();
        assert_eq!(
            crate::pool_map::pull(me, Some(&r), &[(a, 8)], &mut [&mut out[..]]),
            Ok(8)
        );
        drop(mem.bufs);
        drop(mem.keep);
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        let ino = r.ino.to_string();
        let held = maps
            .lines()
            .filter(|l| {
                l.contains("weft-pool") && l.split_whitespace().nth(4) == Some(ino.as_str())
            })
            .count();
        assert_eq!(held, 0, "the dropped pool's file is still mapped");
    }

    /// The descriptor the table names (a test of our own pool).
    fn unsafe_fd(fd: u32) -> std::os::fd::BorrowedFd<'static> {
        // SAFETY: the pool, which owns this descriptor, lives until after
        // the `dup` it is borrowed for.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(fd as i32) }
    }
}
