//! Memory regions of a tcp domain: memory the domain allocates, or the
//! application's buffers held where they are, reachable by peers'
//! RMA requests through the key the application asked for.
//!
//! Regions are owned `Vec<u8>` / `BytesMut` behind a lock: a peer's
//! write is a copy under that lock, never a pointer. The domain's
//! `mr_mode` has neither `FI_MR_PROV_KEY` nor `FI_MR_VIRT_ADDR`
//! (`docs/design.md`, "tcp memory regions"): keys are the requested ones,
//! unique in the domain, and target addresses are offsets into the
//! region. What a region does beyond that (bindings, counters, single
//! use) is in `rma_events`.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use weft_core::auth::AuthKey;
use weft_core::counter::CounterShared;
use weft_core::flags::{BindFlags, MrAccess, MrMode, MrRegFlags};
use weft_core::hash::{fast_map, FastMap};
use weft_core::provider::{MrMemory, MrRequest, ProviderDomain, ProviderMr, Rejected};
use weft_core::sync::lock;
use weft_core::wire::rma::range_in;
use weft_core::{Error, Result};

use crate::rma_events::{self, AccessKind, RegionEvents, Setup, CLOSED};

/// Regions one domain holds at once (`mr_cnt`): each is a map entry a
/// registration loop could otherwise grow without end.
pub const MR_CNT: usize = 1 << 16;

/// Registration flags the tcp domain honours (the API layer refuses
/// `FI_RMA_EVENT` without the capability); anything else is `BadFlags`.
const REG_FLAGS: MrRegFlags = MrRegFlags::RMA_EVENT.union(MrRegFlags::SINGLE_USE);

/// The tcp provider's domain: the keys of its regions, and the TLS
/// configuration its endpoints run (loaded once, when it opened).
#[derive(Debug, Default)]
pub struct TcpDomain {
    pub regions: Arc<Regions>,
    pub tls: Option<Arc<crate::tls::TlsContext>>,
}

impl TcpDomain {
    /// A domain opened with `mr_mode`, whose `FI_MR_ENDPOINT` and
    /// `FI_MR_RMA_EVENT` bits decide which regions wait for
    /// `fi_mr_enable`, running `tls` on its endpoints' connections.
    pub fn new(mr_mode: MrMode, tls: Option<Arc<crate::tls::TlsContext>>) -> TcpDomain {
        TcpDomain {
            regions: Arc::new(Regions {
                mr_mode,
                ..Regions::default()
            }),
            tls,
        }
    }
}

impl ProviderDomain for TcpDomain {
    fn srx_open(&self, size: usize) -> Result<Arc<dyn weft_core::provider::ProviderSrx>> {
        let attr = weft_core::attr::RxAttr {
            size,
            total_buffered_recv: crate::BUFFERED_RECV,
            ..weft_core::attr::RxAttr::default()
        };
        self.srx_open_attr(&attr)
    }

    fn stx_open(
        &self,
        attr: &weft_core::attr::TxAttr,
    ) -> Result<Arc<dyn weft_core::provider::ProviderStx>> {
        Ok(crate::stx::TcpStx::open(attr))
    }

    fn srx_open_attr(
        &self,
        attr: &weft_core::attr::RxAttr,
    ) -> Result<Arc<dyn weft_core::provider::ProviderSrx>> {
        Ok(crate::srx::TcpSrx::open(attr))
    }

    fn mr_reg(
        &self,
        req: MrRequest,
    ) -> std::result::Result<Arc<dyn ProviderMr>, Rejected<MrRequest>> {
        if !REG_FLAGS.contains(req.flags) {
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
        let setup = self.regions.setup(flags);
        let region = Region::new(
            mem,
            (0, len),
            access,
            auth_key.clone(),
            RegionEvents::new(setup, requested_key, &self.regions),
        );
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
    /// The domain's `mr_mode` (its `FI_MR_ENDPOINT` and
    /// `FI_MR_RMA_EVENT` bits matter here).
    mr_mode: MrMode,
}

impl Default for Regions {
    fn default() -> Self {
        Regions {
            map: Mutex::new(fast_map()),
            mr_mode: MrMode::empty(),
        }
    }
}

impl Regions {
    /// How a region registered with `flags` in this domain starts.
    fn setup(&self, flags: MrRegFlags) -> Setup {
        Setup {
            counts: flags.contains(MrRegFlags::RMA_EVENT),
            single_use: flags.contains(MrRegFlags::SINGLE_USE),
            endpoint_mode: self.mr_mode.contains(MrMode::ENDPOINT),
            event_mode: self.mr_mode.contains(MrMode::RMA_EVENT),
        }
    }

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

    /// Forgets `key` if it still names `r` (a key closed or retired may
    /// name a newer region already).
    pub fn remove(&self, key: u64, r: &Arc<Region>) {
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
    /// `rma_events`' bits: `CLOSED` (set under the memory's lock at
    /// close, so a peer's access either finished before `close` returned
    /// or finds it), `DISABLED`, `WATCHED`. 0 for the common region.
    pub state: AtomicU8,
    /// The key a connection must have proven to reach the region.
    auth: Option<AuthKey>,
    /// Bindings and registration flags (`rma_events`).
    pub ev: RegionEvents,
}

impl Region {
    fn new(
        mem: Arc<Memory>,
        (start, len): (usize, usize),
        access: MrAccess,
        auth: Option<AuthKey>,
        (ev, state): (RegionEvents, u8),
    ) -> Arc<Region> {
        Arc::new(Region {
            mem,
            start,
            len,
            access,
            state: AtomicU8::new(state),
            auth,
            ev,
        })
    }

    #[inline]
    fn is_open(&self) -> bool {
        self.state.load(Ordering::Acquire) & CLOSED == 0
    }

    /// Where a peer's access of `len` bytes at `addr` falls, if this
    /// region allows it (`kind` says which rights it needs), and whether
    /// it must go on to `rma_events::admit_watched` (the region is not
    /// the common one, or `watch` says the endpoint counts). Every
    /// refusal is `Access`: a peer learns nothing more from it. `proven`
    /// is the key the peer's connection proved: a region with a key of
    /// its own takes only connections that proved that one.
    #[inline]
    pub fn admit(
        &self,
        watch: u8,
        proven: Option<&AuthKey>,
        addr: u64,
        len: u64,
        kind: AccessKind,
    ) -> Result<(usize, bool)> {
        if !self.access.contains(kind.needs()) {
            return Err(Error::Access);
        }
        if self.auth.is_some() && self.auth.as_ref() != proven {
            return Err(Error::Access);
        }
        let off = range_in(0, self.len, addr, len).ok_or(Error::Access)?;
        // The one test the common access pays (it replaces the test of the
        // open flag): an open region nobody watches, reached through an
        // endpoint without remote counters.
        Ok((off, self.state.load(Ordering::Acquire) | watch != 0))
    }

    /// A peer's write of `data` at `off` (checked with [`admit`]).
    /// `Access` if the region closed since.
    ///
    /// [`admit`]: Self::admit
    #[inline]
    pub fn put(&self, off: usize, data: &[u8]) -> Result<()> {
        let end = off.checked_add(data.len()).ok_or(Error::Access)?;
        if end > self.len {
            return Err(Error::Access);
        }
        let mut g = lock(&self.mem.store);
        match g.as_mut() {
            Some(s) if self.is_open() => {
                s.copy_in(self.start + off, data);
                Ok(())
            }
            _ => Err(Error::Access),
        }
    }

    /// A peer's read of `out.len()` bytes at `off` (checked with
    /// [`admit`](Self::admit)). `Access` if the region closed since.
    #[inline]
    pub fn get(&self, off: usize, out: &mut [u8]) -> Result<()> {
        let end = off.checked_add(out.len()).ok_or(Error::Access)?;
        if end > self.len {
            return Err(Error::Access);
        }
        let g = lock(&self.mem.store);
        match g.as_ref() {
            Some(s) if self.is_open() => {
                s.copy_out(self.start + off, out);
                Ok(())
            }
            _ => Err(Error::Access),
        }
    }

    /// A peer's atomic on `len` bytes at `off` (checked with
    /// [`admit`](Self::admit)): `f` gets a copy of them and changes it,
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
            Some(s) if self.is_open() => {
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
        self.state.fetch_or(CLOSED, Ordering::Release);
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
        if !self.region.is_open() {
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
        if !self.region.is_open() {
            return Err(Error::Canceled);
        }
        if range_in(0, self.region.len, offset as u64, len as u64).is_none() {
            return Err(Error::Inval);
        }
        // A sub-region has no flags of its own, but waits for its
        // bindings like any region of an `FI_MR_ENDPOINT` domain.
        let setup = self.regions.setup(MrRegFlags::empty());
        let region = Region::new(
            self.region.mem.clone(),
            (self.region.start + offset, len),
            access,
            // The memory's key goes with it into every sub-region.
            self.region.auth.clone(),
            RegionEvents::new(setup, requested_key, &self.regions),
        );
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
        if !self.region.is_open() {
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

    fn bind_ep(&self, ep: u64) -> Result<()> {
        rma_events::bind_ep(&self.region, ep)
    }

    fn bind_cntr(&self, cntr: Arc<CounterShared>, flags: BindFlags) -> Result<()> {
        rma_events::bind_cntr(&self.region, cntr, flags)
    }

    fn enable(&self) -> Result<()> {
        rma_events::enable(&self.region)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use weft_core::flags::MrRegFlags;

    /// Where an access of `len` bytes at `addr` falls, through an
    /// endpoint without counters and a connection without a key.
    fn check(r: &Arc<Region>, addr: u64, len: u64, kind: AccessKind) -> Result<usize> {
        let (off, watched) = r.admit(0, None, addr, len, kind)?;
        // A closed region is not the common one any more: its access
        // goes on to the checks that refuse it.
        if watched {
            crate::rma_events::admit_watched(r, 1, kind)?;
        }
        Ok(off)
    }

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
        let off = check(&r, 3, 5, AccessKind::Write).unwrap();
        r.put(off, b"abcde").unwrap();
        let mut all = [0u8; 10];
        mr.read_at(0, &mut all).unwrap();
        assert_eq!(&all, b"012abcde89");
        assert_eq!(check(&r, 0, 1, AccessKind::Read), Err(Error::Access));
        assert_eq!(check(&r, 6, 5, AccessKind::Write), Err(Error::Access));
        let sub = mr.sub_region(2, 6, MrAccess::REMOTE_READ, 2).unwrap();
        let s = d.regions.get(2).unwrap();
        let mut got = [0u8; 6];
        s.get(check(&s, 0, 6, AccessKind::Read).unwrap(), &mut got)
            .unwrap();
        assert_eq!(&got, b"2abcde");
        sub.close();
        assert_eq!(check(&s, 0, 1, AccessKind::Read), Err(Error::Access));
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
