//! Memory regions: memory registered for RMA, its key handed to peers.
//!
//! A region covers memory the provider allocates ([`Domain::mr_alloc`]),
//! the application's own buffers registered where they are
//! ([`Domain::mr_reg`], [`Domain::mr_regv`]), or part of another region
//! with a key and rights of its own (a sub-region, [`MrAttr::sub`]).
//! While a region is registered the device may write it on a peer's
//! behalf at any moment, so no Rust reference to its bytes is handed out:
//! the application copies in and out, or takes its buffers back
//! ([`MemoryRegion::take_buffers`]), which deregisters first. Closing (or
//! dropping) a region deregisters it: the key stops working at once.
//!
//! Where the provider sees remote accesses at the target (tcp), a region
//! can also be confined to an endpoint ([`MemoryRegion::bind_endpoint`],
//! required by `FI_MR_ENDPOINT`), count the accesses it takes on counters
//! ([`MemoryRegion::bind_counter`], for regions registered with
//! `FI_RMA_EVENT`), wait for those bindings before any peer reaches it
//! ([`MemoryRegion::enable`], required by `FI_MR_ENDPOINT` and, for
//! `FI_RMA_EVENT` regions, `FI_MR_RMA_EVENT`), and take a single remote
//! access (`FI_MR_SINGLE_USE`). See `docs/design.md`, "RMA events,
//! endpoint-bound regions and single-use keys".

use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use weft_core::flags::{BindFlags, Caps, MrAccess, MrRegFlags};
use weft_core::provider::{MrMemory, MrRequest, ProviderMr};
use weft_core::sync::lock;
use weft_core::{Error, Result};

use crate::counter::Counter;
use crate::endpoint::Endpoint;
use crate::fabric::{next_fid, Domain};

/// What to register and how (`struct fi_mr_attr`), for
/// [`Domain::mr_regattr`].
#[derive(Debug)]
pub struct MrAttr<'a> {
    memory: Source<'a>,
    access: MrAccess,
    requested_key: u64,
    offset: u64,
    flags: MrRegFlags,
    auth_key: Option<KeyBytes<'a>>,
}

/// A region's authorization key as given: its bytes, or a key handle of
/// an AV (`FI_AUTH_KEY` on `fi_mr_regattr`). `Debug` never shows bytes.
enum KeyBytes<'a> {
    Bytes(Vec<u8>),
    Handle(&'a crate::av::AddressVector, weft_core::addr::FiAddr),
}

impl std::fmt::Debug for KeyBytes<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyBytes::Bytes(b) => write!(f, "<{} key bytes>", b.len()),
            KeyBytes::Handle(_, h) => write!(f, "AV key handle {h}"),
        }
    }
}

impl KeyBytes<'_> {
    /// The key's bytes: a handle's are looked up now (`Inval` for a
    /// handle that is not a live key of that AV).
    fn resolve(&self) -> Result<Vec<u8>> {
        match self {
            KeyBytes::Bytes(b) => Ok(b.clone()),
            KeyBytes::Handle(av, h) => av.lookup_auth_key(*h, weft_core::flags::AvFlags::AUTH_KEY),
        }
    }
}

#[derive(Debug)]
enum Source<'a> {
    Alloc(usize),
    Buffers(Vec<BytesMut>),
    Sub {
        base: &'a MemoryRegion,
        offset: usize,
        len: usize,
    },
}

impl<'a> MrAttr<'a> {
    /// `len` zeroed bytes the provider allocates.
    pub fn alloc(len: usize, access: MrAccess) -> MrAttr<'a> {
        MrAttr::new(Source::Alloc(len), access)
    }

    /// The application's buffer, registered where it is: its `len()`
    /// bytes, not its spare capacity.
    pub fn buffer(buf: BytesMut, access: MrAccess) -> MrAttr<'a> {
        MrAttr::new(Source::Buffers(vec![buf]), access)
    }

    /// Several buffers as one region (`mr_iov`), at most the domain's
    /// `mr_iov_limit`.
    pub fn iov(bufs: Vec<BytesMut>, access: MrAccess) -> MrAttr<'a> {
        MrAttr::new(Source::Buffers(bufs), access)
    }

    /// `offset..offset + len` of `base` as a region of its own
    /// (`base_mr`): its own key and `access`, the same memory. `base`
    /// cannot be closed while the sub-region lives.
    pub fn sub(base: &'a MemoryRegion, offset: usize, len: usize, access: MrAccess) -> MrAttr<'a> {
        MrAttr::new(Source::Sub { base, offset, len }, access)
    }

    fn new(memory: Source<'a>, access: MrAccess) -> MrAttr<'a> {
        MrAttr {
            memory,
            access,
            requested_key: 0,
            offset: 0,
            flags: MrRegFlags::empty(),
            auth_key: None,
        }
    }

    /// `fi_mr_attr::auth_key`: only peers whose connection proved this
    /// key (1 ..= 64 bytes, else `Inval`) may read, write or atomically
    /// update the region; others get `FI_EACCES`, as for a key that does
    /// not exist. Without it the region takes the domain's
    /// `domain_attr.auth_key`, and without that any peer the endpoint
    /// accepted. On an `FI_AV_AUTH_KEY` domain, pass the bytes of an AV
    /// key ([`AddressVector::lookup_auth_key`](crate::AddressVector::lookup_auth_key)).
    /// Providers that do not enforce region keys refuse it
    /// (`OpNotSupp`); verbs registers the region in a protection domain
    /// of the key's, where only connections that proved it have queue
    /// pairs, so the device itself refuses everyone else. Sub-regions keep
    /// their base's key (`BadFlags` if one is given).
    pub fn auth_key(mut self, key: &[u8]) -> MrAttr<'a> {
        self.auth_key = Some(KeyBytes::Bytes(key.to_vec()));
        self
    }

    /// [`auth_key`](Self::auth_key) by the handle of a key in `av`
    /// (`fi_mr_regattr` with `FI_AUTH_KEY` on an `FI_AV_AUTH_KEY`
    /// domain): the region takes only connections that proved that key.
    /// A handle that is not a live key of `av` is `Inval` at
    /// registration; `av` must belong to the registering domain
    /// (`Domain` otherwise).
    pub fn av_auth_key(
        mut self,
        av: &'a crate::av::AddressVector,
        key: weft_core::addr::FiAddr,
    ) -> MrAttr<'a> {
        self.auth_key = Some(KeyBytes::Handle(av, key));
        self
    }

    /// The key to use, for domains without `FI_MR_PROV_KEY` (others
    /// choose their own keys and ignore it). Such a domain refuses a key
    /// that one of its regions (sub-regions included) already has with
    /// `NoKey` (`FI_ENOKEY`); the default is 0.
    pub fn requested_key(mut self, key: u64) -> MrAttr<'a> {
        self.requested_key = key;
        self
    }

    /// `fi_mr_attr::offset`, reserved by fi_mr(3): anything but 0 is
    /// `Inval`.
    pub fn offset(mut self, offset: u64) -> MrAttr<'a> {
        self.offset = offset;
        self
    }

    /// Registration flags. `FI_RMA_EVENT` (needs the domain's
    /// `FI_RMA_EVENT` capability): the region will count remote accesses
    /// on counters bound to it ([`MemoryRegion::bind_counter`]) and, on a
    /// domain whose `mr_mode` has `FI_MR_RMA_EVENT`, is unreachable until
    /// [`MemoryRegion::enable`]. `FI_MR_SINGLE_USE`: the key admits one
    /// remote access and dies when it completes (tcp; verbs cannot see
    /// remote accesses and refuses it, `BadFlags`).
    pub fn flags(mut self, flags: MrRegFlags) -> MrAttr<'a> {
        self.flags = flags;
        self
    }

    /// The application buffers, if any: what a failed registration
    /// hands back.
    fn into_buffers(self) -> Vec<BytesMut> {
        match self.memory {
            Source::Buffers(b) => b,
            Source::Alloc(_) | Source::Sub { .. } => Vec::new(),
        }
    }
}

/// A registration that failed, with the application's buffers (if it
/// passed any) handed back untouched.
#[derive(Debug)]
pub struct RegError {
    /// Why it failed.
    pub error: Error,
    /// The buffers of the request.
    pub buffers: Vec<BytesMut>,
}

impl From<RegError> for Error {
    fn from(e: RegError) -> Error {
        e.error
    }
}

impl std::fmt::Display for RegError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.error, f)
    }
}

impl std::error::Error for RegError {}

impl Domain {
    /// `fi_mr_reg` on memory the provider allocates: `len` zeroed bytes
    /// registered with `access`, reached through the region's copy
    /// methods (the device may write it at any time). `NoSys` when the
    /// provider has no memory registration (no `FI_RMA` in its caps);
    /// `Inval` for an empty region or no access rights.
    pub fn mr_alloc(&self, len: usize, access: MrAccess) -> Result<MemoryRegion> {
        Ok(self.mr_regattr(MrAttr::alloc(len, access))?)
    }

    /// `fi_mr_reg` on the application's buffer, registered in place:
    /// peers read and write `buf` itself, and [`MemoryRegion::take_buffers`]
    /// gives it back. On failure the buffer comes back in the error.
    pub fn mr_reg(
        &self,
        buf: BytesMut,
        access: MrAccess,
    ) -> std::result::Result<MemoryRegion, RegError> {
        self.mr_regattr(MrAttr::buffer(buf, access))
    }

    /// `fi_mr_regv`: several buffers as one region, addressed as their
    /// concatenation. `Inval` beyond the domain's `mr_iov_limit`.
    pub fn mr_regv(
        &self,
        bufs: Vec<BytesMut>,
        access: MrAccess,
    ) -> std::result::Result<MemoryRegion, RegError> {
        self.mr_regattr(MrAttr::iov(bufs, access))
    }

    /// `fi_mr_regattr`. Errors: `Inval` for no access rights, an empty
    /// region or buffer, more buffers than `mr_iov_limit`, a nonzero
    /// `offset` or a sub-region outside its base; `BadFlags` for flags
    /// the domain does not support (`FI_RMA_EVENT` without the
    /// `FI_RMA_EVENT` cap, HMEM flags without `FI_HMEM`, `FI_RMA_PMEM`
    /// without `FI_RMA_PMEM`, or what the provider refuses, such as
    /// `FI_MR_SINGLE_USE` on verbs); `Canceled`
    /// for a closed base; `NoKey` for a requested key already in use (in
    /// domains without `FI_MR_PROV_KEY`); `NoSys` without memory
    /// registration. Buffers come back in the error.
    pub fn mr_regattr(&self, attr: MrAttr<'_>) -> std::result::Result<MemoryRegion, RegError> {
        let _span = tracing::debug_span!("mr_reg", domain = self.fid()).entered();
        match self.check(&attr) {
            Ok(()) => {}
            Err(error) => {
                return Err(RegError {
                    error,
                    buffers: attr.into_buffers(),
                })
            }
        }
        let key_size = self.info().domain_attr.mr_key_size;
        let rma_events = self.info().caps.contains(Caps::RMA_EVENT);
        let access = attr.access;
        let memory = match attr.memory {
            Source::Sub { base, offset, len } => {
                return base
                    .register_sub(offset, len, access, attr.requested_key)
                    .map_err(|error| RegError {
                        error,
                        buffers: Vec::new(),
                    });
            }
            Source::Alloc(len) => MrMemory::Alloc(len),
            Source::Buffers(b) => MrMemory::Buffers(b),
        };
        let owns_buffers = matches!(memory, MrMemory::Buffers(_));
        let given = match attr.auth_key.as_ref().map(KeyBytes::resolve).transpose() {
            Ok(k) => k,
            Err(error) => {
                return Err(RegError {
                    error,
                    buffers: memory.into_buffers(),
                })
            }
        };
        let auth_key = given
            .as_deref()
            .or(self.info().domain_attr.auth_key.as_deref())
            .map(weft_core::auth::AuthKey::new)
            .transpose();
        let auth_key = match auth_key {
            Ok(k) => k,
            Err(error) => {
                return Err(RegError {
                    error,
                    buffers: memory.into_buffers(),
                })
            }
        };
        let req = MrRequest {
            memory,
            access,
            requested_key: attr.requested_key,
            flags: attr.flags,
            auth_key,
        };
        let Some(prov) = self.inner.prov.as_ref() else {
            return Err(RegError {
                error: Error::NoSys,
                buffers: req.memory.into_buffers(),
            });
        };
        match prov.mr_reg(req) {
            Ok(mr) => Ok(MemoryRegion::new(
                mr,
                Origin {
                    access,
                    domain: self.fid(),
                    key_size,
                    rma_events,
                },
                owns_buffers,
                None,
            )),
            Err(rej) => Err(RegError {
                error: rej.err,
                buffers: rej.req.memory.into_buffers(),
            }),
        }
    }

    /// The checks every provider shares.
    fn check(&self, attr: &MrAttr<'_>) -> Result<()> {
        if attr.access.is_empty() || attr.offset != 0 {
            return Err(Error::Inval);
        }
        let info = self.info();
        if let Some(k) = &attr.auth_key {
            match k {
                KeyBytes::Bytes(b) => weft_core::auth::check_key(b)?,
                KeyBytes::Handle(av, _) if av.inner.domain.fid() != self.fid() => {
                    return Err(Error::Domain)
                }
                KeyBytes::Handle(..) => {}
            }
            if matches!(attr.memory, Source::Sub { .. }) {
                return Err(Error::BadFlags);
            }
            if !self.fabric().prov().auth_keys() {
                return Err(Error::OpNotSupp);
            }
        }
        let caps = info.caps;
        let needs = [
            (MrRegFlags::RMA_EVENT, Caps::RMA_EVENT),
            (MrRegFlags::RMA_PMEM, Caps::RMA_PMEM),
            (MrRegFlags::HMEM_DEVICE_ONLY, Caps::HMEM),
            (MrRegFlags::HMEM_HOST_ALLOC, Caps::HMEM),
            (MrRegFlags::DMABUF, Caps::HMEM),
        ];
        if needs
            .iter()
            .any(|(flag, cap)| attr.flags.contains(*flag) && !caps.contains(*cap))
        {
            return Err(Error::BadFlags);
        }
        match &attr.memory {
            Source::Alloc(len) if *len == 0 => Err(Error::Inval),
            Source::Alloc(_) => Ok(()),
            Source::Buffers(b) => {
                let limit = info.domain_attr.mr_iov_limit.max(1);
                if b.is_empty() || b.len() > limit || b.iter().any(|x| x.is_empty()) {
                    Err(Error::Inval)
                } else {
                    Ok(())
                }
            }
            Source::Sub { base, offset, len } => {
                if base.domain != self.fid() {
                    return Err(Error::Domain);
                }
                let end = offset.checked_add(*len).ok_or(Error::Inval)?;
                if *len == 0 || end > base.len() {
                    return Err(Error::Inval);
                }
                // A sub-region inherits how its memory is used; its own
                // flags have nothing to say.
                if !attr.flags.is_empty() {
                    return Err(Error::BadFlags);
                }
                Ok(())
            }
        }
    }

    /// `fi_mr_map_raw`: the key a raw key from a peer's
    /// [`MemoryRegion::raw_attr`] stands for. Keys of this domain's
    /// providers fit in 64 bits, so the mapping is a decoding (little
    /// endian, `mr_key_size` bytes) and holds nothing to release. `Inval`
    /// for a raw key of another length.
    pub fn map_raw(&self, base_addr: u64, raw_key: &[u8]) -> Result<u64> {
        let _ = base_addr;
        let size = self.info().domain_attr.mr_key_size;
        if raw_key.len() != size || size > 8 {
            return Err(Error::Inval);
        }
        let mut b = [0u8; 8];
        b[..size].copy_from_slice(raw_key);
        Ok(u64::from_le_bytes(b))
    }

    /// `fi_mr_unmap_key`: releases a key from [`map_raw`](Self::map_raw).
    /// Mapping allocates nothing here; a key wider than the domain's
    /// `mr_key_size` cannot have come from it and is `Inval`.
    pub fn unmap_key(&self, key: u64) -> Result<()> {
        let size = self.info().domain_attr.mr_key_size;
        if size < 8 && key >> (size * 8) != 0 {
            return Err(Error::Inval);
        }
        Ok(())
    }

    /// What the domain's registration cache did (hits, misses,
    /// evictions, occupancy): `None` for providers without one. The verbs
    /// domain caches the registrations of the `Bytes` its endpoints send
    /// from (limits from `FI_MR_CACHE_MAX_COUNT`, `FI_MR_CACHE_MAX_SIZE`;
    /// `FI_MR_CACHE_MONITOR=disabled` turns it off).
    pub fn mr_cache_stats(&self) -> Option<weft_core::provider::MrCacheStats> {
        self.inner.prov.as_ref().and_then(|p| p.mr_cache_stats())
    }
}

/// What closing needs to know, shared with sub-regions.
#[derive(Debug, Default)]
struct State {
    closed: bool,
    /// Live sub-regions of this region.
    subs: usize,
}

/// What a region keeps of its registration, shared with its sub-regions
/// (but `access`, which each has of its own).
#[derive(Debug, Clone, Copy)]
struct Origin {
    access: MrAccess,
    domain: u64,
    key_size: usize,
    /// The domain has `FI_RMA_EVENT`: counters may be bound.
    rma_events: bool,
}

/// A registered memory region (`fid_mr`).
#[derive(Debug)]
pub struct MemoryRegion {
    prov: Arc<dyn ProviderMr>,
    access: MrAccess,
    fid: u64,
    domain: u64,
    key_size: usize,
    rma_events: bool,
    /// Registered on application buffers ([`take_buffers`](Self::take_buffers)).
    owns_buffers: bool,
    state: Arc<Mutex<State>>,
    /// The base's state, for a sub-region.
    parent: Option<Arc<Mutex<State>>>,
}

impl MemoryRegion {
    fn new(
        prov: Arc<dyn ProviderMr>,
        origin: Origin,
        owns_buffers: bool,
        parent: Option<Arc<Mutex<State>>>,
    ) -> MemoryRegion {
        let fid = next_fid();
        tracing::debug!(fid, len = prov.len(), key = prov.key(), "mr registered");
        MemoryRegion {
            prov,
            access: origin.access,
            fid,
            domain: origin.domain,
            key_size: origin.key_size,
            rma_events: origin.rma_events,
            owns_buffers,
            state: Arc::default(),
            parent,
        }
    }

    /// Registers part of this region for a sub-region, counting it so
    /// that this region cannot close before it.
    fn register_sub(
        &self,
        offset: usize,
        len: usize,
        access: MrAccess,
        requested_key: u64,
    ) -> Result<MemoryRegion> {
        let mut st = lock(&self.state);
        if st.closed {
            return Err(Error::Canceled);
        }
        let prov = self.prov.sub_region(offset, len, access, requested_key)?;
        st.subs += 1;
        Ok(MemoryRegion::new(
            prov,
            Origin {
                access,
                domain: self.domain,
                key_size: self.key_size,
                rma_events: self.rma_events,
            },
            false,
            Some(self.state.clone()),
        ))
    }

    /// The object id.
    pub fn fid(&self) -> u64 {
        self.fid
    }

    /// The object id of the domain it belongs to.
    pub fn domain_fid(&self) -> u64 {
        self.domain
    }

    /// `fi_mr_key`: what a peer passes as the key of RMA operations on
    /// this region: chosen by the provider with `FI_MR_PROV_KEY` in the
    /// domain's `mr_mode`, the requested key
    /// ([`MrAttr::requested_key`]) without.
    pub fn key(&self) -> u64 {
        self.prov.key()
    }

    /// The region's first byte as an RMA target address: a peer
    /// addresses byte `i` as `addr() + i`. With `FI_MR_VIRT_ADDR` in the
    /// domain's `mr_mode` this is the memory's virtual address; without,
    /// 0 (targets are offsets into the region, sub-regions included).
    pub fn addr(&self) -> u64 {
        self.prov.addr()
    }

    /// `fi_mr_desc`: the local descriptor.
    pub fn desc(&self) -> u64 {
        self.prov.desc()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.prov.len()
    }

    /// True for an empty region (never: regions have at least one byte).
    pub fn is_empty(&self) -> bool {
        self.prov.is_empty()
    }

    /// The access rights it was registered with.
    pub fn access(&self) -> MrAccess {
        self.access
    }

    /// True for a sub-region (made with [`MrAttr::sub`]).
    pub fn is_sub_region(&self) -> bool {
        self.parent.is_some()
    }

    /// The size of a raw key ([`raw_attr`](Self::raw_attr)): the
    /// domain's `mr_key_size`.
    pub fn raw_key_size(&self) -> usize {
        self.key_size
    }

    /// `fi_mr_raw_attr`: writes the key in its raw form (little endian,
    /// [`raw_key_size`](Self::raw_key_size) bytes) to the front of `out`
    /// and returns the base address and the key's size. `TooSmall` when
    /// `out` is shorter than the key; `Canceled` once closed. A peer
    /// turns it back into a key with [`Domain::map_raw`].
    pub fn raw_attr(&self, out: &mut [u8]) -> Result<(u64, usize)> {
        if lock(&self.state).closed {
            return Err(Error::Canceled);
        }
        let size = self.key_size;
        if out.len() < size {
            return Err(Error::TooSmall);
        }
        let key = self.key().to_le_bytes();
        let n = size.min(key.len());
        out[..n].copy_from_slice(&key[..n]);
        out[n..size].fill(0);
        Ok((self.addr(), size))
    }

    /// `fi_mr_bind` with an endpoint: from now on the region is reached
    /// only by accesses that arrive through `ep` (enabled or not yet);
    /// through any other endpoint they get `FI_EACCES`, as for a key that
    /// does not exist. A domain whose `mr_mode` has `FI_MR_ENDPOINT`
    /// requires it before [`enable`](Self::enable); elsewhere it is
    /// allowed on providers that see remote accesses (tcp) and confines
    /// the region from the bind on. Errors: `Domain` for another
    /// domain's endpoint, `Inval` for a second endpoint, `OpBadState`
    /// once enabled, `Canceled` once closed, `NoSys` where regions cannot
    /// be confined (verbs).
    pub fn bind_endpoint(&self, ep: &Endpoint) -> Result<()> {
        if ep.domain_fid() != self.domain {
            return Err(Error::Domain);
        }
        let st = lock(&self.state);
        if st.closed {
            return Err(Error::Canceled);
        }
        self.prov.bind_ep(ep.fid())
    }

    /// `fi_mr_bind` with a counter: `c` counts the remote accesses of
    /// this region (through its own key; a sub-region's are its own) that
    /// `flags` names, each once complete at the target, after its bytes
    /// are in place or copied out: `REMOTE_WRITE` every RMA write and
    /// every atomic that may modify the region (fi_mr(3)), `REMOTE_READ`
    /// every RMA read and every fetching or compare atomic. One access
    /// adds at most 1 to a counter, even one bound for both. Refused
    /// accesses count nothing (their initiator gets the error). The region
    /// must be registered with `FI_RMA_EVENT`. Errors: `BadFlags` for
    /// flags other than those two (or none), `Domain` for another domain's
    /// counter, `NoSys` without the domain's `FI_RMA_EVENT` capability
    /// (fi_mr(3): verbs never has it), `Inval` for a region registered
    /// without `FI_RMA_EVENT` or a direction bound already, `OpBadState`
    /// once enabled, `Canceled` once closed.
    pub fn bind_counter(&self, c: &Counter, flags: BindFlags) -> Result<()> {
        let remote = BindFlags::REMOTE_READ | BindFlags::REMOTE_WRITE;
        if flags.is_empty() || !remote.contains(flags) {
            return Err(Error::BadFlags);
        }
        if c.domain != self.domain {
            return Err(Error::Domain);
        }
        if !self.rma_events {
            return Err(Error::NoSys);
        }
        let st = lock(&self.state);
        if st.closed {
            return Err(Error::Canceled);
        }
        self.prov.bind_cntr(c.shared.clone(), flags)
    }

    /// `fi_mr_enable`: a region waiting for its bindings becomes
    /// reachable, and takes no more ([`bind_endpoint`](Self::bind_endpoint)
    /// and [`bind_counter`](Self::bind_counter) are `OpBadState` after
    /// it). Regions wait when the domain's `mr_mode` has `FI_MR_ENDPOINT`
    /// (all of them) or `FI_MR_RMA_EVENT` (those registered with
    /// `FI_RMA_EVENT`); until then every peer's access is `FI_EACCES`.
    /// Other regions are reachable from registration, and enabling them
    /// only closes their bindings. Enabling twice is fine. Errors: `Inval`
    /// on an `FI_MR_ENDPOINT` domain before an endpoint is bound
    /// (fi_mr(3) names no code for it; `FI_ENOKEY` there means a key in
    /// use), `Canceled` once closed, `NoSys` where regions take no
    /// bindings and are reachable from registration (verbs).
    pub fn enable(&self) -> Result<()> {
        let st = lock(&self.state);
        if st.closed {
            return Err(Error::Canceled);
        }
        self.prov.enable()
    }

    /// Copies `out.len()` bytes starting at `offset` out of the region.
    /// `Inval` if the range does not fit; `Canceled` once closed. Bytes
    /// a peer is writing at the same moment may be seen half-written:
    /// synchronise through a message or remote CQ data, as with any RMA.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.prov.read_at(offset, out)
    }

    /// Copies `data` into the region at `offset`. `Inval` if it does not
    /// fit; `Canceled` once closed.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.prov.write_at(offset, data)
    }

    /// The whole region, copied.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.len()];
        self.read_at(0, &mut v)?;
        Ok(v)
    }

    /// `fi_close`: deregisters now. Peers' operations with the key fail
    /// with `Access` from here on; local copies fail with `Canceled`.
    /// `Busy` while sub-regions of it are open (nothing changes then);
    /// closing twice is fine.
    pub fn close(&self) -> Result<()> {
        let mut st = lock(&self.state);
        if st.subs > 0 {
            return Err(Error::Busy);
        }
        self.close_locked(&mut st);
        Ok(())
    }

    /// Deregisters, as [`close`](Self::close), and hands back the buffers
    /// the region was registered on ([`Domain::mr_reg`],
    /// [`Domain::mr_regv`]), with whatever peers wrote into them. `Inval`
    /// for regions on provider memory or sub-regions; `Busy` while
    /// sub-regions are open; `Canceled` once closed. Nothing changes
    /// when it fails.
    pub fn take_buffers(&self) -> Result<Vec<BytesMut>> {
        if !self.owns_buffers {
            return Err(Error::Inval);
        }
        let mut st = lock(&self.state);
        if st.closed {
            return Err(Error::Canceled);
        }
        if st.subs > 0 {
            return Err(Error::Busy);
        }
        let bufs = self.prov.take_buffers()?;
        self.close_locked(&mut st);
        Ok(bufs)
    }

    fn close_locked(&self, st: &mut State) {
        if st.closed {
            return;
        }
        st.closed = true;
        self.prov.close();
        if let Some(parent) = &self.parent {
            let mut p = lock(parent);
            p.subs = p.subs.saturating_sub(1);
        }
        tracing::debug!(fid = self.fid, "mr closed");
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // A base dropped before its sub-regions is deregistered all the
        // same: the provider keeps the memory for the sub-regions.
        let mut st = lock(&self.state);
        self.close_locked(&mut st);
    }
}
