//! Memory regions of an shm domain: memory the domain allocates, or the
//! application's buffers held where they are, reachable by peers' RMA
//! requests through the key the application asked for (requested keys,
//! offset addressing: `mr_mode` without `FI_MR_PROV_KEY` or
//! `FI_MR_VIRT_ADDR`, as on tcp).
//!
//! A region's bytes are owned buffers behind a lock; a peer's access is a
//! copy made by the target's own receive pass under that lock, after the
//! key, the range and the right were checked (`docs/design.md`, "The shm
//! provider") — through the ring, or for large transfers by the target's
//! own `process_vm_readv`/`process_vm_writev` call whose local side is
//! the checked slices ([`Region::with_slices`]). No other process ever
//! writes or reads a region's memory on its own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use smallvec::SmallVec;
use weft_core::flags::{MrAccess, MrRegFlags};
use weft_core::hash::{fast_map, FastMap};
use weft_core::provider::{MrMemory, MrRequest, ProviderMr, Rejected};
use weft_core::sync::lock;
use weft_core::{Error, Result};

/// Regions one domain holds at once (`mr_cnt`).
pub const MR_CNT: usize = 1 << 16;

/// A region's memory, shared by the region and its sub-regions; `None`
/// once its buffers were taken back.
type Memory = Arc<Mutex<Option<Vec<BytesMut>>>>;

/// A registered region: `len` bytes at `start` of its memory.
pub struct Region {
    access: MrAccess,
    start: usize,
    len: usize,
    mem: Memory,
    /// Cleared when the region closes (its memory may live on in
    /// sub-regions).
    open: AtomicBool,
    /// `fi_mr_attr::auth_key` (else the domain's): only peers that
    /// proved this key reach the region. Sub-regions keep their base's.
    auth: Option<weft_core::auth::AuthKey>,
}

impl std::fmt::Debug for Region {
    /// Never the bytes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("access", &self.access)
            .field("start", &self.start)
            .field("len", &self.len)
            .field("open", &self.open)
            .finish_non_exhaustive()
    }
}

/// Calls `f` on each piece of `bufs` covering `off..off + n`: the
/// buffer, the start in it, and the piece's length.
fn span(bufs: &mut [BytesMut], mut off: usize, mut n: usize, mut f: impl FnMut(&mut [u8], usize)) {
    let mut done = 0;
    for b in bufs.iter_mut() {
        if n == 0 {
            return;
        }
        if off >= b.len() {
            off -= b.len();
            continue;
        }
        let k = (b.len() - off).min(n);
        f(&mut b[off..off + k], done);
        done += k;
        n -= k;
        off = 0;
    }
}

impl Region {
    /// Whether a peer that proved `proven` (the key of the endpoint it
    /// reached: every channel of a keyed endpoint proved it, none of an
    /// unkeyed one proved anything) may reach the region.
    pub fn admits_key(&self, proven: Option<&weft_core::auth::AuthKey>) -> bool {
        self.auth.is_none() || self.auth.as_ref() == proven
    }

    /// Whether `len` bytes at `off` lie inside the region.
    pub fn holds(&self, off: u64, len: usize) -> bool {
        usize::try_from(off)
            .ok()
            .and_then(|o| o.checked_add(len))
            .is_some_and(|end| end <= self.len)
    }

    /// Whether the region admits remote accesses that need `need`.
    pub fn admits(&self, need: MrAccess) -> bool {
        self.access.contains(need)
    }

    /// Copies `data` in at `off`. `Inval` out of range, `Canceled` once
    /// closed.
    pub fn put(&self, off: usize, data: &[u8]) -> Result<()> {
        self.fill(off, data.len(), |dst, at| {
            dst.copy_from_slice(&data[at..at + dst.len()]);
        })
    }

    /// Lets `f` fill `n` bytes at `off`, piece by piece (each with its
    /// offset from `off`), under the region's lock. `Inval` out of range,
    /// `Canceled` once closed.
    pub fn fill(&self, off: usize, n: usize, f: impl FnMut(&mut [u8], usize)) -> Result<()> {
        self.locked(off, n, |bufs, at| {
            span(bufs, at, n, f);
            Ok(())
        })
    }

    /// Runs `f` on the memory, under its lock, with the offset in it of
    /// `off`, once `n` bytes there are known to lie in the region.
    fn locked<T>(
        &self,
        off: usize,
        n: usize,
        f: impl FnOnce(&mut [BytesMut], usize) -> Result<T>,
    ) -> Result<T> {
        if !self.open.load(Ordering::Acquire) {
            return Err(Error::Canceled);
        }
        if !self.holds(off as u64, n) {
            return Err(Error::Inval);
        }
        let mut g = lock(&self.mem);
        let bufs = g.as_mut().ok_or(Error::Canceled)?;
        f(bufs, self.start + off)
    }

    /// Runs `f` on the `n` bytes at `off` as the slices of memory they
    /// lie in, in order, under the region's lock (a direct RMA transfer:
    /// the kernel moves bytes in or out of exactly these). `Inval` out of
    /// range, `Canceled` once closed.
    pub fn with_slices<T>(
        &self,
        off: usize,
        n: usize,
        f: impl FnOnce(&mut [&mut [u8]]) -> T,
    ) -> Result<T> {
        self.locked(off, n, |bufs, at| {
            let lens: SmallVec<[usize; 4]> = bufs.iter().map(|b| b.len()).collect();
            // Pieces come in buffer order, each buffer at most once.
            let mut ps = crate::cma::pieces(&lens, at, n).into_iter().peekable();
            let mut v: SmallVec<[&mut [u8]; 4]> = SmallVec::new();
            for (i, b) in bufs.iter_mut().enumerate() {
                if let Some((_, s, k)) = ps.next_if(|p| p.0 == i) {
                    v.push(&mut b[s..s + k]);
                }
            }
            Ok(f(&mut v))
        })
    }

    /// Copies `n` bytes at `off` out, lets `f` change them and copies
    /// them back (only if `f` succeeds), all under the region's lock:
    /// what `f` returns, or `Inval` out of range, `Canceled` once closed.
    pub fn update<T>(
        &self,
        off: usize,
        n: usize,
        f: impl FnOnce(&mut [u8]) -> Result<T>,
    ) -> Result<T> {
        self.locked(off, n, |bufs, start| {
            let mut tmp = vec![0u8; n];
            span(bufs, start, n, |src, at| {
                tmp[at..at + src.len()].copy_from_slice(src);
            });
            let r = f(&mut tmp)?;
            span(bufs, start, n, |dst, at| {
                dst.copy_from_slice(&tmp[at..at + dst.len()]);
            });
            Ok(r)
        })
    }

    /// Copies `out.len()` bytes out from `off`. `Inval` out of range,
    /// `Canceled` once closed.
    pub fn get(&self, off: usize, out: &mut [u8]) -> Result<()> {
        let n = out.len();
        self.fill(off, n, |src, at| {
            out[at..at + src.len()].copy_from_slice(src);
        })
    }
}

/// The keys of a domain's live regions.
#[derive(Debug)]
pub struct Regions {
    map: Mutex<FastMap<u64, Arc<Region>>>,
}

impl Default for Regions {
    fn default() -> Self {
        Regions {
            map: Mutex::new(fast_map()),
        }
    }
}

impl Regions {
    /// The region under `key` if it admits an access needing `need` to
    /// `len` bytes at `off`; `Access` otherwise (no such key, a range
    /// outside it, a right it lacks: the initiator learns no more).
    pub fn check(&self, key: u64, off: u64, len: usize, need: MrAccess) -> Result<Arc<Region>> {
        let r = lock(&self.map).get(&key).cloned().ok_or(Error::Access)?;
        if r.admits(need) && r.holds(off, len) {
            Ok(r)
        } else {
            Err(Error::Access)
        }
    }

    /// Registers `req`'s memory under its requested key: `NoKey` when the
    /// key is taken, `NoSpc` past [`MR_CNT`], `BadFlags` for any
    /// registration flag (no RMA events on shm), `NoMem` when an
    /// allocation fails.
    pub fn register(
        self: &Arc<Self>,
        req: MrRequest,
    ) -> std::result::Result<Arc<dyn ProviderMr>, Rejected<MrRequest>> {
        if req.flags != MrRegFlags::empty() {
            return Err(Rejected {
                err: Error::BadFlags,
                req,
            });
        }
        let (bufs, app) = match &req.memory {
            MrMemory::Alloc(len) => {
                let mut v = Vec::new();
                if v.try_reserve_exact(*len).is_err() {
                    return Err(Rejected {
                        err: Error::NoMem,
                        req,
                    });
                }
                v.resize(*len, 0u8);
                (vec![BytesMut::from(bytes::Bytes::from(v))], false)
            }
            MrMemory::Buffers(_) => (Vec::new(), true),
        };
        let key = req.requested_key;
        let auth = req.auth_key.clone();
        let mut m = lock(&self.map);
        if let Err(err) = Self::room(&m, key) {
            return Err(Rejected { err, req });
        }
        let bufs = match req.memory {
            MrMemory::Buffers(b) => b,
            MrMemory::Alloc(_) => bufs,
        };
        let len = bufs.iter().map(|b| b.len()).sum();
        let region = Arc::new(Region {
            access: req.access,
            start: 0,
            len,
            mem: Arc::new(Mutex::new(Some(bufs))),
            open: AtomicBool::new(true),
            auth,
        });
        m.insert(key, region.clone());
        Ok(Arc::new(ShmMr {
            key,
            region,
            regions: self.clone(),
            app,
        }))
    }

    /// Whether `key` can be registered now: `NoKey` when taken, `NoSpc`
    /// past [`MR_CNT`].
    fn room(m: &FastMap<u64, Arc<Region>>, key: u64) -> Result<()> {
        if m.contains_key(&key) {
            Err(Error::NoKey)
        } else if m.len() >= MR_CNT {
            Err(Error::NoSpc)
        } else {
            Ok(())
        }
    }

    fn remove(&self, key: u64, r: &Arc<Region>) {
        let mut m = lock(&self.map);
        if m.get(&key).is_some_and(|x| Arc::ptr_eq(x, r)) {
            m.remove(&key);
        }
    }
}

/// The application's handle on a region.
#[derive(Debug)]
pub struct ShmMr {
    key: u64,
    region: Arc<Region>,
    regions: Arc<Regions>,
    /// Registered on the application's buffers (which `take_buffers`
    /// hands back).
    app: bool,
}

impl ProviderMr for ShmMr {
    fn key(&self) -> u64 {
        self.key
    }

    fn addr(&self) -> u64 {
        0
    }

    fn len(&self) -> usize {
        self.region.len
    }

    fn desc(&self) -> u64 {
        self.key
    }

    fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.region.get(offset, out)
    }

    fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.region.put(offset, data)
    }

    fn close(&self) {
        self.regions.remove(self.key, &self.region);
        self.region.open.store(false, Ordering::Release);
    }

    fn sub_region(
        &self,
        offset: usize,
        len: usize,
        access: MrAccess,
        requested_key: u64,
    ) -> Result<Arc<dyn ProviderMr>> {
        let r = &self.region;
        if !r.open.load(Ordering::Acquire) {
            return Err(Error::Canceled);
        }
        if len == 0 || !r.holds(offset as u64, len) {
            return Err(Error::Inval);
        }
        let region = Arc::new(Region {
            access,
            start: r.start + offset,
            len,
            mem: r.mem.clone(),
            open: AtomicBool::new(true),
            auth: r.auth.clone(),
        });
        let mut m = lock(&self.regions.map);
        Regions::room(&m, requested_key)?;
        m.insert(requested_key, region.clone());
        Ok(Arc::new(ShmMr {
            key: requested_key,
            region,
            regions: self.regions.clone(),
            app: false,
        }))
    }

    fn take_buffers(&self) -> Result<Vec<BytesMut>> {
        if !self.app {
            return Err(Error::Inval);
        }
        if !self.region.open.load(Ordering::Acquire) {
            return Err(Error::Canceled);
        }
        self.close();
        lock(&self.region.mem).take().ok_or(Error::Canceled)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn req(memory: MrMemory, key: u64, access: MrAccess) -> MrRequest {
        MrRequest {
            memory,
            access,
            requested_key: key,
            flags: MrRegFlags::empty(),
            auth_key: None,
        }
    }

    #[test]
    fn keys_ranges_and_rights_are_checked() {
        let rs = Arc::new(Regions::default());
        let rw = MrAccess::REMOTE_READ | MrAccess::REMOTE_WRITE;
        let a = rs.register(req(MrMemory::Alloc(100), 7, rw)).unwrap();
        assert_eq!(
            rs.register(req(MrMemory::Alloc(1), 7, rw))
                .err()
                .map(|r| r.err),
            Some(Error::NoKey)
        );
        let bufs = vec![BytesMut::zeroed(3), BytesMut::zeroed(5)];
        let b = rs
            .register(req(MrMemory::Buffers(bufs), 8, MrAccess::REMOTE_READ))
            .unwrap();
        assert!(rs.check(7, 90, 10, MrAccess::REMOTE_WRITE).is_ok());
        assert_eq!(
            rs.check(7, 91, 10, MrAccess::REMOTE_WRITE).err(),
            Some(Error::Access)
        );
        assert_eq!(
            rs.check(7, u64::MAX, 2, MrAccess::REMOTE_READ).err(),
            Some(Error::Access)
        );
        assert_eq!(
            rs.check(9, 0, 1, MrAccess::REMOTE_READ).err(),
            Some(Error::Access)
        );
        assert_eq!(
            rs.check(8, 0, 1, MrAccess::REMOTE_WRITE).err(),
            Some(Error::Access)
        );
        // Across the buffers of one region.
        b.write_at(1, b"abcdef").unwrap();
        let mut out = [0u8; 8];
        b.read_at(0, &mut out).unwrap();
        assert_eq!(&out, b"\0abcdef\0");
        assert_eq!(b.write_at(4, b"xyzw5").err(), Some(Error::Inval));
        let back = b.take_buffers().unwrap();
        assert_eq!((&back[0][..], &back[1][..]), (&b"\0ab"[..], &b"cdef\0"[..]));
        assert_eq!(
            rs.check(8, 0, 1, MrAccess::REMOTE_READ).err(),
            Some(Error::Access)
        );
        a.close();
        assert_eq!(
            rs.check(7, 0, 1, MrAccess::REMOTE_READ).err(),
            Some(Error::Access)
        );
        assert_eq!(a.read_at(0, &mut out).err(), Some(Error::Canceled));
        assert_eq!(a.take_buffers().err(), Some(Error::Inval));
    }
}
