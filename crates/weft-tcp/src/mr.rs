//! Memory regions of a tcp domain: memory the domain allocates, or the
//! application's buffers held where they are, reachable by peers'
//! RMA requests through the key the application asked for.
//!
//! Regions are owned `Vec<u8>` / `BytesMut` behind a lock: a peer's
//! write is a copy under that lock, never a pointer. The domain's
//! `mr_mode` has neither `FI_MR_PROV_KEY` nor `FI_MR_VIRT_ADDR`
//! (`docs/design.md`, "tcp memory regions"): keys are the requested ones,
//! unique in the domain, and target addresses are offsets into the
//! region.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use weft_core::auth::AuthKey;
use weft_core::flags::MrAccess;
use weft_core::hash::{fast_map, FastMap};
use weft_core::provider::{MrMemory, MrRequest, ProviderDomain, ProviderMr, Rejected};
use weft_core::sync::lock;
use weft_core::wire::rma::range_in;
use weft_core::{Error, Result};

/// Regions one domain holds at once (`mr_cnt`): each is a map entry a
/// registration loop could otherwise grow without end.
pub const MR_CNT: usize = 1 << 16;

/// The tcp provider's domain: the keys of its regions, and the TLS
/// configuration its endpoints run (loaded once, when it opened).
#[derive(Debug, Default)]
pub struct TcpDomain {
    pub regions: Arc<Regions>,
    pub tls: Option<Arc<crate::tls::TlsContext>>,
}

impl ProviderDomain for TcpDomain {
    fn mr_reg(
        &self,
        req: MrRequest,
    ) -> std::result::Result<Arc<dyn ProviderMr>, Rejected<MrRequest>> {
        // Single-use keys and the like would need per-access bookkeeping
        // the domain does not keep.
        if !req.flags.is_empty() {
            return Err(Rejected {
                err: Error::BadFlags,
                req,
            });
        }
        let MrRequest {
            memory,
            access,
            requested_key,
            flags,
            auth_key,
        } = req;
        let (store, buffers) = match memory {
            MrMemory::Alloc(len) => match zeroed(len) {
                Ok(v) => (Store::Owned(v), false),
                Err(err) => {
                    return Err(Rejected {
                        err,
                        req: MrRequest {
                            memory: MrMemory::Alloc(len),
                            access,
                            requested_key,
                            flags,
                            auth_key,
                        },
                    })
                }
            },
            MrMemory::Buffers(b) => (Store::App(b), true),
        };
        let len = store.len();
        let mem = Arc::new(Memory {
            store: Mutex::new(Some(store)),
        });
        let region = Arc::new(Region {
            mem,
            start: 0,
            len,
            access,
            open: AtomicBool::new(true),
            auth: auth_key.clone(),
        });
        match self.regions.insert(requested_key, &region) {
            Ok(()) => Ok(Arc::new(TcpMr {
                key: requested_key,
                region,
                regions: self.regions.clone(),
                buffers,
            })),
            Err(err) => {
                // Nobody else saw the region: its memory goes back whole.
                let memory = match lock(&region.mem.store).take() {
                    Some(Store::App(b)) => MrMemory::Buffers(b),
                    _ => MrMemory::Alloc(len),
                };
                Err(Rejected {
                    err,
                    req: MrRequest {
                        memory,
                        access,
                        requested_key,
                        flags,
                        auth_key,
                    },
                })
            }
        }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// `len` zeroed bytes, or `NoMem` when the allocator has none (a
/// registration must not abort the process).
fn zeroed(len: usize) -> Result<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| Error::NoMem)?;
    v.resize(len, 0);
    Ok(v)
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
    fn insert(&self, key: u64, r: &Arc<Region>) -> Result<()> {
        let mut m = lock(&self.map);
        if m.contains_key(&key) {
            return Err(Error::NoKey);
        }
        if m.len() >= MR_CNT {
            return Err(Error::NoSpc);
        }
        m.insert(key, r.clone());
        Ok(())
    }

    /// The region registered under `key`, if any.
    pub fn get(&self, key: u64) -> Option<Arc<Region>> {
        lock(&self.map).get(&key).cloned()
    }

    fn remove(&self, key: u64, r: &Arc<Region>) {
        let mut m = lock(&self.map);
        if m.get(&key).is_some_and(|x| Arc::ptr_eq(x, r)) {
            m.remove(&key);
        }
    }
}

/// Where a region's bytes live.
#[derive(Debug)]
enum Store {
    /// Allocated by the domain.
    Owned(Vec<u8>),
    /// The application's buffers, addressed as their concatenation.
    App(Vec<BytesMut>),
}

impl Store {
    fn len(&self) -> usize {
        match self {
            Store::Owned(v) => v.len(),
            Store::App(b) => b.iter().map(|x| x.len()).sum(),
        }
    }

    /// Copies `data` in at `off`; the caller checked the range.
    fn copy_in(&mut self, mut off: usize, mut data: &[u8]) {
        match self {
            Store::Owned(v) => v[off..off + data.len()].copy_from_slice(data),
            Store::App(bufs) => {
                for b in bufs.iter_mut() {
                    if data.is_empty() {
                        break;
                    }
                    if off >= b.len() {
                        off -= b.len();
                        continue;
                    }
                    let n = (b.len() - off).min(data.len());
                    b[off..off + n].copy_from_slice(&data[..n]);
                    data = &data[n..];
                    off = 0;
                }
            }
        }
    }

    /// Copies `out.len()` bytes from `off`; the caller checked the range.
    fn copy_out(&self, mut off: usize, out: &mut [u8]) {
        match self {
            Store::Owned(v) => out.copy_from_slice(&v[off..off + out.len()]),
            Store::App(bufs) => {
                let mut done = 0;
                for b in bufs {
                    if done == out.len() {
                        break;
                    }
                    if off >= b.len() {
                        off -= b.len();
                        continue;
                    }
                    let n = (b.len() - off).min(out.len() - done);
                    out[done..done + n].copy_from_slice(&b[off..off + n]);
                    done += n;
                    off = 0;
                }
            }
        }
    }
}

/// Memory a region shares with its sub-regions: it lives as long as any
/// of them does. `None` once its buffers went back to the application.
#[derive(Debug)]
struct Memory {
    store: Mutex<Option<Store>>,
}

/// A registered range of some memory, with its rights: what a key
/// stands for.
#[derive(Debug)]
pub struct Region {
    mem: Arc<Memory>,
    /// First byte in the memory.
    start: usize,
    len: usize,
    access: MrAccess,
    /// Cleared, under the memory's lock, when the region is closed: a
    /// peer's access either finished before `close` returned or finds it.
    open: AtomicBool,
    /// The key a connection must have proven to reach the region.
    auth: Option<AuthKey>,
}

impl Region {
    /// Where a peer's access of `len` bytes at `addr` falls, if this
    /// region allows it (`need` is `REMOTE_READ` or `REMOTE_WRITE`).
    /// Every refusal is `Access`: a peer learns nothing more from it.
    /// `proven` is the key the peer's connection proved: a region with a
    /// key of its own takes only connections that proved that one.
    pub fn check(
        &self,
        addr: u64,
        len: u64,
        need: MrAccess,
        proven: Option<&AuthKey>,
    ) -> Result<usize> {
        if !self.access.contains(need) || !self.open.load(Ordering::Acquire) {
            return Err(Error::Access);
        }
        if self.auth.is_some() && self.auth.as_ref() != proven {
            return Err(Error::Access);
        }
        range_in(0, self.len, addr, len).ok_or(Error::Access)
    }

    /// A peer's write of `data` at `off` (checked with [`check`]).
    /// `Access` if the region closed since.
    ///
    /// [`check`]: Self::check
    pub fn put(&self, off: usize, data: &[u8]) -> Result<()> {
        let end = off.checked_add(data.len()).ok_or(Error::Access)?;
        if end > self.len {
            return Err(Error::Access);
        }
        let mut g = lock(&self.mem.store);
        match g.as_mut() {
            Some(s) if self.open.load(Ordering::Acquire) => {
                s.copy_in(self.start + off, data);
                Ok(())
            }
            _ => Err(Error::Access),
        }
    }

    /// A peer's read of `out.len()` bytes at `off` (checked with
    /// [`check`](Self::check)). `Access` if the region closed since.
    pub fn get(&self, off: usize, out: &mut [u8]) -> Result<()> {
        let end = off.checked_add(out.len()).ok_or(Error::Access)?;
        if end > self.len {
            return Err(Error::Access);
        }
        let g = lock(&self.mem.store);
        match g.as_ref() {
            Some(s) if self.open.load(Ordering::Acquire) => {
                s.copy_out(self.start + off, out);
                Ok(())
            }
            _ => Err(Error::Access),
        }
    }

    /// A peer's atomic on `len` bytes at `off` (checked with
    /// [`check`](Self::check)): `f` gets a copy of them and changes it,
    /// and the copy goes back, all under the memory's lock, so no other
    /// access of this memory (any key onto it) sees it half done. What
    /// `f` returns comes back; on its error the memory is untouched.
    /// `Access` if the region closed since.
    pub fn update<T>(
        &self,
        off: usize,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> Result<T>,
    ) -> Result<T> {
        let end = off.checked_add(len).ok_or(Error::Access)?;
        if end > self.len {
            return Err(Error::Access);
        }
        let mut g = lock(&self.mem.store);
        match g.as_mut() {
            Some(s) if self.open.load(Ordering::Acquire) => {
                let mut copy = vec![0u8; len];
                s.copy_out(self.start + off, &mut copy);
                let r = f(&mut copy)?;
                s.copy_in(self.start + off, &copy);
                Ok(r)
            }
            _ => Err(Error::Access),
        }
    }

    fn close(&self) {
        let _g = lock(&self.mem.store);
        self.open.store(false, Ordering::Release);
    }
}

/// A region as the API holds it.
#[derive(Debug)]
struct TcpMr {
    key: u64,
    region: Arc<Region>,
    regions: Arc<Regions>,
    /// Registered on application buffers (`take_buffers` applies).
    buffers: bool,
}

impl TcpMr {
    /// The local copies' range check: `Inval` out of range (the API's
    /// documented error for its own copies), `Canceled` once closed.
    fn local(&self, off: usize, len: usize) -> Result<()> {
        if !self.region.open.load(Ordering::Acquire) {
            return Err(Error::Canceled);
        }
        match off.checked_add(len) {
            Some(end) if end <= self.region.len => Ok(()),
            _ => Err(Error::Inval),
        }
    }
}

impl ProviderMr for TcpMr {
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
        // No FI_MR_LOCAL: descriptors are never needed; the key is as
        // good a name for the region as any.
        self.key
    }

    fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.local(offset, out.len())?;
        self.region.get(offset, out).map_err(|_| Error::Canceled)
    }

    fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.local(offset, data.len())?;
        self.region.put(offset, data).map_err(|_| Error::Canceled)
    }

    fn close(&self) {
        self.regions.remove(self.key, &self.region);
        self.region.close();
    }

    fn sub_region(
        &self,
        offset: usize,
        len: usize,
        access: MrAccess,
        requested_key: u64,
    ) -> Result<Arc<dyn ProviderMr>> {
        if !self.region.open.load(Ordering::Acquire) {
            return Err(Error::Canceled);
        }
        if range_in(0, self.region.len, offset as u64, len as u64).is_none() {
            return Err(Error::Inval);
        }
        let region = Arc::new(Region {
            mem: self.region.mem.clone(),
            start: self.region.start + offset,
            len,
            access,
            open: AtomicBool::new(true),
            // The memory's key goes with it into every sub-region.
            auth: self.region.auth.clone(),
        });
        self.regions.insert(requested_key, &region)?;
        Ok(Arc::new(TcpMr {
            key: requested_key,
            region,
            regions: self.regions.clone(),
            buffers: false,
        }))
    }

    fn take_buffers(&self) -> Result<Vec<BytesMut>> {
        if !self.buffers {
            return Err(Error::Inval);
        }
        if !self.region.open.load(Ordering::Acquire) {
            return Err(Error::Canceled);
        }
        self.close();
        match lock(&self.region.mem.store).take() {
            Some(Store::App(b)) => Ok(b),
            Some(other) => {
                // Not reached: only regions on application buffers get
                // here. Kept rather than lost if it ever is.
                *lock(&self.region.mem.store) = Some(other);
                Err(Error::Inval)
            }
            None => Err(Error::Canceled),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use weft_core::flags::MrRegFlags;

    fn req(memory: MrMemory, access: MrAccess, key: u64) -> MrRequest {
        MrRequest {
            memory,
            access,
            requested_key: key,
            flags: MrRegFlags::empty(),
            auth_key: None,
        }
    }

    #[test]
    fn keys_are_the_requested_ones_and_unique() {
        let d = TcpDomain::default();
        let rw = MrAccess::REMOTE_READ | MrAccess::REMOTE_WRITE;
        let a = d.mr_reg(req(MrMemory::Alloc(8), rw, 7)).unwrap();
        assert_eq!((a.key(), a.addr(), a.len()), (7, 0, 8));
        let b = BytesMut::from(&b"abc"[..]);
        let e = d
            .mr_reg(req(MrMemory::Buffers(vec![b.clone()]), rw, 7))
            .unwrap_err();
        assert_eq!(e.err, Error::NoKey);
        assert_eq!(e.req.memory.into_buffers(), vec![b], "buffer back");
        let s = a.sub_region(2, 4, MrAccess::REMOTE_READ, 7);
        assert_eq!(s.unwrap_err(), Error::NoKey);
        a.close();
        let again = d.mr_reg(req(MrMemory::Alloc(8), rw, 7)).unwrap();
        assert!(d.regions.get(7).is_some());
        again.close();
        assert!(d.regions.get(7).is_none());
    }

    #[test]
    fn regions_span_their_buffers() {
        let d = TcpDomain::default();
        let bufs = vec![
            BytesMut::from(&b"0123"[..]),
            BytesMut::from(&b"45"[..]),
            BytesMut::from(&b"6789"[..]),
        ];
        let mr = d
            .mr_reg(req(MrMemory::Buffers(bufs), MrAccess::REMOTE_WRITE, 1))
            .unwrap();
        assert_eq!(mr.len(), 10);
        let r = d.regions.get(1).unwrap();
        let off = r.check(3, 5, MrAccess::REMOTE_WRITE, None).unwrap();
        r.put(off, b"abcde").unwrap();
        let mut all = [0u8; 10];
        mr.read_at(0, &mut all).unwrap();
        assert_eq!(&all, b"012abcde89");
        assert_eq!(
            r.check(0, 1, MrAccess::REMOTE_READ, None),
            Err(Error::Access)
        );
        assert_eq!(
            r.check(6, 5, MrAccess::REMOTE_WRITE, None),
            Err(Error::Access)
        );
        let sub = mr.sub_region(2, 6, MrAccess::REMOTE_READ, 2).unwrap();
        let s = d.regions.get(2).unwrap();
        let mut got = [0u8; 6];
        s.get(
            s.check(0, 6, MrAccess::REMOTE_READ, None).unwrap(),
            &mut got,
        )
        .unwrap();
        assert_eq!(&got, b"2abcde");
        sub.close();
        assert_eq!(
            s.check(0, 1, MrAccess::REMOTE_READ, None),
            Err(Error::Access)
        );
        let back = mr.take_buffers().unwrap();
        assert_eq!((&back[1][..], &back[2][..]), (&b"bc"[..], &b"de89"[..]));
        assert_eq!(r.put(0, b"x"), Err(Error::Access), "closed");
    }

    #[test]
    fn updates_are_all_or_nothing_and_span_buffers() {
        let d = TcpDomain::default();
        let bufs = vec![BytesMut::from(&b"0123"[..]), BytesMut::from(&b"4567"[..])];
        let mr = d
            .mr_reg(req(MrMemory::Buffers(bufs), MrAccess::REMOTE_WRITE, 1))
            .unwrap();
        let r = d.regions.get(1).unwrap();
        let old = r
            .update(2, 4, |m| {
                let was = m.to_vec();
                m.copy_from_slice(b"abcd");
                Ok(was)
            })
            .unwrap();
        assert_eq!(&old, b"2345");
        let failed = r.update(0, 8, |m| {
            m.fill(b'x');
            Err::<(), _>(Error::OpNotSupp)
        });
        assert_eq!(failed, Err(Error::OpNotSupp));
        let mut all = [0u8; 8];
        mr.read_at(0, &mut all).unwrap();
        assert_eq!(&all, b"01abcd67", "a failed update wrote nothing");
        assert_eq!(
            r.update(4, 5, |_| Ok(())),
            Err(Error::Access),
            "past the end"
        );
        mr.close();
        assert_eq!(r.update(0, 1, |_| Ok(())), Err(Error::Access), "closed");
    }
}
