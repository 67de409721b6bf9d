//! Named AVs (`fi_av_attr::name`): one address vector shared by every
//! process of the node that opens the same name.
//!
//! The shared state is an append-only log of AV operations in a
//! [`Segment`] (a file, for Weft's API layer). Each process keeps an
//! ordinary [`AvTable`] and replays the log into it in order, so every
//! process computes the same handles for the same addresses: for a TABLE
//! the index, for a MAP the same opaque value. Providers keep reading the
//! local table; [`lock_synced`] catches it up with the log first.
//!
//! Writers append under the segment's lock and publish with a checksummed
//! commit written last; readers take no lock (`docs/design.md`, "Named
//! shared AVs", has the layout and the commit protocol). Every value read from the segment is checked, so a
//! damaged or hostile segment gives errors, never a panic.

mod layout;
mod mirror;
mod name;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

pub use layout::{SharedHeader, MAX_RECORDS};
pub use name::{validate_name, MAX_NAME_LEN};

pub(crate) use mirror::Mirror;

use super::{AvAttr, AvTable};
use crate::addr::{FiAddr, FI_ADDR_NOTAVAIL};
use crate::attr::{AddrFormat, AvType};
use crate::flags::AvFlags;
use crate::sync::lock;
use crate::{Error, Result};
use layout::{Record, HEADER_LEN};

/// How a shared AV checks an address before any process stores it.
pub type Validate = fn(&[u8]) -> Result<()>;

/// Where a named AV lives: positional reads and writes on bytes every
/// process of the node sees, and a lock between processes that the
/// operating system releases when its holder dies.
pub trait Segment: Send + Sync + fmt::Debug {
    /// Reads exactly `buf.len()` bytes at `off`; `Io` past the end.
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()>;
    /// Writes all of `buf` at `off`.
    fn write_at(&self, buf: &[u8], off: u64) -> Result<()>;
    /// Current length in bytes.
    fn size(&self) -> Result<u64>;
    /// Sets the length; new bytes read as zero.
    fn set_len(&self, len: u64) -> Result<()>;
    /// Waits for the lock: exclusive for writers, shared for a reader that
    /// must not see a half-created segment.
    fn lock(&self, exclusive: bool) -> Result<()>;
    /// Releases the lock.
    fn unlock(&self) -> Result<()>;
}

/// The segment's lock for the life of a scope.
pub(super) struct SegmentLock<'a>(&'a dyn Segment);

impl<'a> SegmentLock<'a> {
    pub(super) fn take(seg: &'a dyn Segment, exclusive: bool) -> Result<SegmentLock<'a>> {
        seg.lock(exclusive)?;
        Ok(SegmentLock(seg))
    }
}

impl Drop for SegmentLock<'_> {
    fn drop(&mut self) {
        // An unlock that fails leaves the lock to the kernel, which drops
        // it with the descriptor.
        let _ = self.0.unlock();
    }
}

/// What a process brings to a named AV besides its [`AvAttr`]: it must
/// match what the segment was created with.
#[derive(Debug, Clone)]
pub struct SharedParams {
    /// The domain's address format.
    pub addr_format: AddrFormat,
    /// The longest address the domain's provider uses.
    pub max_addr_len: u32,
    /// The domain's identity (provider and domain name): processes share
    /// a named AV only within the same domain.
    pub domain: String,
    /// The address check every process applies when it replays an insert.
    pub validate: Validate,
}

impl SharedParams {
    /// The header a segment created by `attr` under this domain gets.
    fn header_for(&self, name: &str, attr: &AvAttr) -> SharedHeader {
        let av_type = match attr.av_type {
            AvType::Map => AvType::Map,
            AvType::Table | AvType::Unspec => AvType::Table,
        };
        let map_addr = match (av_type, attr.map_addr) {
            (AvType::Map, 0) => default_map_addr(name),
            (AvType::Map, m) => m,
            _ => 0,
        };
        SharedHeader {
            av_type,
            rx_ctx_bits: attr.rx_ctx_bits,
            addr_format: self.addr_format,
            max_addr_len: self.max_addr_len,
            map_addr,
            domain_label: SharedHeader::label_of(&self.domain),
            domain_hash: SharedHeader::hash_domain(&self.domain),
        }
    }

    /// Why `found` cannot be opened with `attr` under this domain, if it
    /// cannot.
    pub fn mismatch(&self, found: &SharedHeader, attr: &AvAttr) -> Option<&'static str> {
        if attr.av_type != AvType::Unspec && attr.av_type != found.av_type {
            return Some("AV type");
        }
        if attr.rx_ctx_bits != found.rx_ctx_bits {
            return Some("rx_ctx_bits");
        }
        if self.addr_format != found.addr_format || self.max_addr_len != found.max_addr_len {
            return Some("address format");
        }
        if SharedHeader::hash_domain(&self.domain) != found.domain_hash {
            return Some("domain");
        }
        if found.av_type == AvType::Map && attr.map_addr != 0 && attr.map_addr != found.map_addr {
            return Some("map_addr");
        }
        None
    }
}

/// The `map_addr` of a MAP AV whose creator gave none: any fixed nonzero
/// value serves, since Weft's handles do not depend on it.
fn default_map_addr(name: &str) -> u64 {
    layout::fnv(layout::CHAIN_START, name.as_bytes()) | 1
}

/// The header of an existing segment (`Ok(None)` if nobody finished
/// creating it), for diagnostics and tools. Takes the shared lock.
pub fn read_header(seg: &dyn Segment) -> Result<Option<SharedHeader>> {
    let _lock = SegmentLock::take(seg, false)?;
    read_header_locked(seg)
}

fn read_header_locked(seg: &dyn Segment) -> Result<Option<SharedHeader>> {
    let size = seg.size()?;
    if size < HEADER_LEN {
        // Creation writes the magic last, into a segment already this
        // long: a shorter one with a magic was cut short behind our back.
        let mut magic = [0u8; 8];
        if size >= 8 {
            seg.read_at(&mut magic, 0)?;
        }
        return if magic == [0; 8] {
            Ok(None)
        } else {
            Err(Error::Io)
        };
    }
    let mut b = vec![0u8; HEADER_LEN as usize];
    seg.read_at(&mut b, 0)?;
    SharedHeader::decode(&b)
}

/// Writes a fresh segment: everything but the magic, then the magic, so
/// that a creator dying half-way leaves a segment the next opener treats
/// as never created.
fn create(seg: &dyn Segment, header: &SharedHeader) -> Result<()> {
    seg.set_len(0)?;
    seg.set_len(HEADER_LEN)?;
    let bytes = header.encode_without_magic();
    seg.write_at(bytes.get(8..).unwrap_or_default(), 8)?;
    seg.write_at(&layout::magic(), 0)
}

impl AvTable {
    /// Opens the named AV `attr.name` in `seg` (`fi_av_open` with a name).
    ///
    /// Without `FI_READ` the segment is created if it holds no AV yet;
    /// with `FI_READ` a segment holding none is `NoEnt`, and every change
    /// through this table is `Perm`. `Inval` for a bad name (see
    /// [`validate_name`]), for a segment created with another type,
    /// `rx_ctx_bits`, address format or domain, or (MAP) another nonzero
    /// `map_addr`, and for a segment that is not a Weft AV of this layout
    /// version; `Io` for a damaged one. Open flags and `rx_ctx_bits` are
    /// checked as [`AvTable::open`] checks them. `Unspec` takes the type
    /// the segment has.
    pub fn open_shared(
        attr: &AvAttr,
        seg: Arc<dyn Segment>,
        params: &SharedParams,
    ) -> Result<AvTable> {
        let name = attr.name.as_deref().ok_or(Error::Inval)?;
        validate_name(name)?;
        let read_only = attr.flags.contains(AvFlags::READ);
        let local = AvAttr {
            name: None,
            flags: attr.flags - AvFlags::READ,
            map_addr: 0,
            ..attr.clone()
        };
        // Refuse bad flags and bits before the segment is touched.
        AvTable::open(&local)?;
        if params.max_addr_len == 0 || params.max_addr_len > layout::MAX_ADDR_LEN {
            return Err(Error::Inval);
        }
        let header = {
            let _lock = SegmentLock::take(&*seg, !read_only)?;
            match read_header_locked(&*seg)? {
                Some(h) => h,
                None if read_only => return Err(Error::NoEnt),
                None => {
                    let h = params.header_for(name, attr);
                    create(&*seg, &h)?;
                    h
                }
            }
        };
        if params.mismatch(&header, attr).is_some() {
            return Err(Error::Inval);
        }
        let mut table = AvTable::open(&AvAttr {
            av_type: header.av_type,
            ..local
        })?;
        let mut mirror = Mirror::new(seg, read_only, &header, params.validate);
        mirror.sync(&mut table)?;
        table.shared = Some(Box::new(mirror));
        Ok(table)
    }

    /// True for a named AV's table.
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// The `map_addr` in use: that of the segment for a named MAP AV (the
    /// value a creator passed, or the one Weft chose when it passed 0);
    /// 0 otherwise.
    pub fn map_addr(&self) -> u64 {
        self.shared.as_ref().map_or(0, |m| m.map_addr())
    }

    /// `Perm` for a named AV opened with `FI_READ`: it takes no inserts or
    /// removes.
    pub fn check_writable(&self) -> Result<()> {
        match &self.shared {
            Some(m) if m.read_only() => Err(Error::Perm),
            _ => Ok(()),
        }
    }

    /// Catches a named AV's table up with what other processes committed
    /// (nothing to do for a private one). `Io` for a damaged segment; the
    /// table then keeps the last state it verified.
    pub fn sync_shared(&mut self) -> Result<()> {
        with_mirror(self, |m, t| m.sync(t)).unwrap_or(Ok(()))
    }
}

/// Locks `av`, first catching a named AV up with the segment: what
/// providers use before they read handles, so that an address another
/// process inserted is visible at once. A damaged segment leaves the last
/// verified state (the AV's own calls report the error).
#[inline]
pub fn lock_synced(av: &Mutex<AvTable>) -> MutexGuard<'_, AvTable> {
    let mut t = lock(av);
    // Every arrival resolves its source through here: a private AV
    // pays one test.
    if t.is_shared() {
        let _ = t.sync_shared();
    }
    t
}

/// Runs `f` with the table's mirror taken out of it, so that the table
/// operations it replays act on the local table alone.
fn with_mirror<R>(t: &mut AvTable, f: impl FnOnce(&mut Mirror, &mut AvTable) -> R) -> Option<R> {
    let mut m = t.shared.take()?;
    let r = f(&mut m, t);
    t.shared = Some(m);
    Some(r)
}

/// `AvTable::insert*` on a named AV: the checks the local table would make
/// first (so a refused address costs no record), then one record per
/// accepted address, appended at once.
pub(super) fn insert(
    t: &mut AvTable,
    addrs: &[Vec<u8>],
    user_ids: Option<&[u64]>,
    validate: &dyn Fn(&[u8]) -> Result<()>,
) -> Vec<Result<FiAddr>> {
    let Some(max) = t.shared.as_ref().map(|m| m.max_addr_len()) else {
        return Vec::new();
    };
    if t.check_writable().is_err() {
        return vec![Err(Error::Perm); addrs.len()];
    }
    let opened_with_ids = t.flags().contains(AvFlags::AV_USER_ID);
    let mut out: Vec<Result<FiAddr>> = Vec::with_capacity(addrs.len());
    let mut records = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let uid = match user_ids {
            None => Ok(None),
            Some(_) if opened_with_ids => Err(Error::Inval),
            Some(ids) => ids.get(i).copied().map(Some).ok_or(Error::Inval),
        };
        let checked = uid.and_then(|uid| {
            validate(addr)?;
            if addr.len() > max {
                return Err(Error::Inval);
            }
            Ok(uid)
        });
        match checked {
            Ok(uid) => {
                records.push((Record::Insert(addr.as_slice()), uid));
                out.push(Ok(FI_ADDR_NOTAVAIL));
            }
            Err(e) => out.push(Err(e)),
        }
    }
    let done = with_mirror(t, |m, t| m.append(t, &records)).unwrap_or(Err(Error::Io));
    let mut done = match done {
        Ok(v) => v.into_iter(),
        Err(e) => vec![Err(e); records.len()].into_iter(),
    };
    for slot in out.iter_mut().filter(|r| r.is_ok()) {
        *slot = done.next().unwrap_or(Err(Error::Io));
    }
    out
}

/// `AvTable::reserve` on a named AV: one record per handle.
pub(super) fn reserve(t: &mut AvTable, n: usize) -> Vec<FiAddr> {
    if t.check_writable().is_err() {
        return vec![FI_ADDR_NOTAVAIL; n];
    }
    let records = vec![(Record::Reserve, None); n];
    match with_mirror(t, |m, t| m.append(t, &records)) {
        Some(Ok(v)) => v
            .into_iter()
            .map(|r| r.unwrap_or(FI_ADDR_NOTAVAIL))
            .collect(),
        _ => vec![FI_ADDR_NOTAVAIL; n],
    }
}

/// `AvTable::fill` on a named AV.
pub(super) fn fill(
    t: &mut AvTable,
    fi_addr: FiAddr,
    addr: &[u8],
    user_id: Option<u64>,
) -> Result<()> {
    t.check_writable()?;
    let max = t.shared.as_ref().map_or(0, |m| m.max_addr_len());
    if addr.len() > max || (user_id.is_some() && t.flags().contains(AvFlags::AV_USER_ID)) {
        return Err(Error::Inval);
    }
    one(t, Record::Fill(fi_addr, addr), user_id)
}

/// `AvTable::release` on a named AV.
pub(super) fn release(t: &mut AvTable, fi_addr: FiAddr) {
    if t.check_writable().is_ok() {
        // A release that cannot be logged leaves the handle reserved,
        // which costs one slot and nothing else.
        let _ = one(t, Record::Release(fi_addr), None);
    }
}

/// `AvTable::remove` on a named AV: removes the address for every
/// process.
pub(super) fn remove(t: &mut AvTable, fi_addr: FiAddr) -> Result<()> {
    t.check_writable()?;
    t.sync_shared()?;
    // A handle that is not live here is not live in the log either (as of
    // the last commit): refuse it without spending a record.
    t.lookup(fi_addr)?;
    one(t, Record::Remove(fi_addr), None)
}

fn one(t: &mut AvTable, r: Record<'_>, uid: Option<u64>) -> Result<()> {
    with_mirror(t, |m, t| m.append(t, &[(r, uid)]))
        .unwrap_or(Err(Error::Io))?
        .pop()
        .unwrap_or(Err(Error::Io))
        .map(|_| ())
}
