//! The address vector table itself.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;

use super::auth_keys::AuthKeyTable;
use super::index::{AddrIndex, MAX_SLOT};
use super::{low_mask, split_rx_addr, AvAttr, MAX_RX_CTX_BITS};
use crate::{addr::FiAddr, addr::FI_ADDR_NOTAVAIL, attr::AvType, flags::AvFlags, Error, Result};

/// Flags `fi_av_open` may carry.
const OPEN_FLAGS: AvFlags = AvFlags::READ
    .union(AvFlags::SYMMETRIC)
    .union(AvFlags::EVENT)
    .union(AvFlags::AV_USER_ID);

/// Upper bound on what the `count` hint pre-allocates, so that an absurd
/// hint costs nothing until addresses really arrive.
const MAX_PREALLOC: usize = 1 << 20;

/// Bits a MAP handle always spends on its generation, so that stale handles
/// stay detectable even when 32 bits go to receive contexts.
const MIN_GEN_BITS: u32 = 8;

/// The first generation of a MAP slot. Not 0: a zeroed `fi_addr_t` or a table
/// index used by mistake is then never a valid MAP handle.
const FIRST_GEN: u32 = 1;

/// What a slot currently holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// In the free pool.
    Free,
    /// Handed out by `reserve`, waiting for `fill` or `release`.
    Reserved,
    /// An inserted address.
    Live,
    /// A MAP slot whose generations are used up: reusing it could make an
    /// old handle valid again, so it stays out of the free pool for good.
    Retired,
}

/// One entry. Its bytes live in the table's arena at `off..off + len`; the
/// region (`cap` bytes) stays with the slot across remove and reuse, so
/// churn with same-sized addresses never moves or allocates.
#[derive(Clone)]
struct Slot {
    gen: u32,
    state: State,
    /// Reverse-index hash of the bytes (valid while `Live`).
    hash: u32,
    off: usize,
    len: u32,
    cap: u32,
    user_id: Option<u64>,
    /// The authorization key handle the address was inserted under
    /// (`FI_AUTH_KEY`).
    auth: Option<u32>,
}

/// How handles are built from slot indices.
///
/// TABLE: the handle is the index. MAP: `gen << index_bits | index`, where
/// `index_bits + gen_bits` fill exactly the bits below the receive-context
/// bits. In both, the index never reaches all ones, so a handle is never
/// `FI_ADDR_NOTAVAIL` nor the all-ones value [`split_rx_addr`] reads as it.
#[derive(Clone, Copy)]
struct Layout {
    map: bool,
    index_bits: u32,
    max_gen: u32,
    /// Number of slots that may exist (exclusive bound on indices).
    max_slots: u32,
}

impl Layout {
    fn new(av_type: AvType, rx_ctx_bits: u32) -> Layout {
        let avail = 64 - rx_ctx_bits;
        if av_type == AvType::Map {
            let index_bits = (avail - MIN_GEN_BITS).min(32);
            let gen_bits = (avail - index_bits).min(32);
            Layout {
                map: true,
                index_bits,
                max_gen: u32::try_from(low_mask(gen_bits)).unwrap_or(u32::MAX),
                max_slots: u32::try_from(low_mask(index_bits))
                    .map_or(MAX_SLOT, |m| m.min(MAX_SLOT)),
            }
        } else {
            Layout {
                map: false,
                index_bits: 32,
                max_gen: 0,
                max_slots: MAX_SLOT,
            }
        }
    }

    fn first_gen(self) -> u32 {
        if self.map {
            FIRST_GEN
        } else {
            0
        }
    }

    fn encode(self, index: u32, gen: u32) -> FiAddr {
        if self.map {
            (u64::from(gen) << self.index_bits) | u64::from(index)
        } else {
            u64::from(index)
        }
    }

    /// Splits a handle (receive-context bits already stripped) into index
    /// and generation; `None` when it cannot be one of ours.
    fn decode(self, base: FiAddr) -> Option<(u32, u32)> {
        if self.map {
            let index = u32::try_from(base & low_mask(self.index_bits)).ok()?;
            let gen = u32::try_from(base >> self.index_bits).ok()?;
            Some((index, gen))
        } else {
            Some((u32::try_from(base).ok()?, 0))
        }
    }
}

/// An address vector of type TABLE or MAP.
///
/// Handles of a TABLE are indices; the lowest unused index is always handed
/// out first. Handles of a MAP are opaque and carry a generation, so a handle
/// that was removed (or released) stays invalid even after its slot is
/// reused. Every handle leaves the top `rx_ctx_bits` bits zero for
/// [`rx_addr`](super::rx_addr), and every method taking a handle ignores
/// those bits.
#[derive(Clone)]
pub struct AvTable {
    av_type: AvType,
    rx_ctx_bits: u32,
    flags: AvFlags,
    layout: Layout,
    slots: Vec<Slot>,
    /// Free slot indices; a min-heap because TABLE must reuse the lowest.
    free: BinaryHeap<Reverse<u32>>,
    /// The address bytes of every slot, back to back: one allocation
    /// instead of one per peer.
    arena: Vec<u8>,
    /// Arena bytes no slot owns any more (left behind by relocations).
    garbage: usize,
    index: AddrIndex,
    live: usize,
    /// Authorization keys (`FI_AV_AUTH_KEY` domains).
    keys: AuthKeyTable,
    /// Bumped by every change, so a reader may cache a lookup
    /// ([`version`](Self::version)).
    version: super::version::Counter,
    /// Named AVs: the segment this table replays (`av::shared`). Changes
    /// go through it; reads stay local.
    pub(super) shared: Option<Box<super::shared::Mirror>>,
}

impl fmt::Debug for AvTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Entries are omitted: a table may hold millions of them.
        f.debug_struct("AvTable")
            .field("av_type", &self.av_type)
            .field("rx_ctx_bits", &self.rx_ctx_bits)
            .field("flags", &self.flags)
            .field("len", &self.live)
            .field("slots", &self.slots.len())
            .finish()
    }
}

impl AvTable {
    /// Opens a table (`fi_av_open`).
    ///
    /// Open flags other than `READ | SYMMETRIC | EVENT | AV_USER_ID` are
    /// `BadFlags`; `rx_ctx_bits` above 32 is `Inval`; `READ` without a name is
    /// `Inval`; a name is `NoSys` here (named AVs open with
    /// [`open_shared`](Self::open_shared)). `count` only sizes the
    /// initial allocation. `Unspec` resolves to `Table`.
    pub fn open(attr: &AvAttr) -> Result<AvTable> {
        if attr.flags.bits() & !OPEN_FLAGS.bits() != 0 {
            return Err(Error::BadFlags);
        }
        if attr.rx_ctx_bits > MAX_RX_CTX_BITS {
            return Err(Error::Inval);
        }
        if attr.name.is_some() {
            return Err(Error::NoSys);
        }
        if attr.flags.contains(AvFlags::READ) {
            return Err(Error::Inval);
        }
        let av_type = match attr.av_type {
            AvType::Map => AvType::Map,
            AvType::Table | AvType::Unspec => AvType::Table,
        };
        let hint = attr.count.min(MAX_PREALLOC);
        Ok(AvTable {
            av_type,
            rx_ctx_bits: attr.rx_ctx_bits,
            flags: attr.flags,
            layout: Layout::new(av_type, attr.rx_ctx_bits),
            slots: Vec::with_capacity(hint),
            free: BinaryHeap::new(),
            arena: Vec::new(),
            garbage: 0,
            index: AddrIndex::with_capacity(hint),
            live: 0,
            keys: AuthKeyTable::default(),
            version: Default::default(),
            shared: None,
        })
    }

    /// The type in use (never `Unspec`).
    pub fn av_type(&self) -> AvType {
        self.av_type
    }

    /// Receive-context bits reserved at the top of every handle.
    pub fn rx_ctx_bits(&self) -> u32 {
        self.rx_ctx_bits
    }

    /// The open flags.
    pub fn flags(&self) -> AvFlags {
        self.flags
    }

    /// Number of live (filled) entries.
    pub fn len(&self) -> usize {
        self.live
    }

    /// True when no address is live.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Reserves one handle per address, in call order. A TABLE hands out the
    /// lowest unused indices, ascending. Reserved handles cannot be looked up
    /// until [`fill`](Self::fill)ed.
    ///
    /// Should the handle space run out (about `2^32` slots, or `2^24` for a
    /// MAP with 32 receive-context bits), the remaining handles are
    /// `FI_ADDR_NOTAVAIL`, which `fill` rejects with `Inval`.
    pub fn reserve(&mut self, n: usize) -> Vec<FiAddr> {
        if self.shared.is_some() {
            return super::shared::reserve(self, n);
        }
        self.version.bump();
        let mut out = Vec::with_capacity(n.min(MAX_PREALLOC));
        for _ in 0..n {
            out.push(self.reserve_one().unwrap_or(FI_ADDR_NOTAVAIL));
        }
        out
    }

    fn reserve_one(&mut self) -> Option<FiAddr> {
        let index = self.reserve_index()?;
        let gen = self.slots.get(index as usize)?.gen;
        Some(self.layout.encode(index, gen))
    }

    fn reserve_index(&mut self) -> Option<u32> {
        if let Some(Reverse(index)) = self.free.pop() {
            self.slots.get_mut(index as usize)?.state = State::Reserved;
            return Some(index);
        }
        let index = u32::try_from(self.slots.len())
            .ok()
            .filter(|&i| i < self.layout.max_slots)?;
        self.slots.push(Slot {
            gen: self.layout.first_gen(),
            state: State::Reserved,
            hash: 0,
            off: self.arena.len(),
            len: 0,
            cap: 0,
            user_id: None,
            auth: None,
        });
        Some(index)
    }

    /// Stores the address of a reserved handle, with its per-insert
    /// `FI_AV_USER_ID` value if the insert carried one.
    ///
    /// `Inval` if the handle is not reserved, if a user id is given to an AV
    /// opened with `AV_USER_ID` (those take ids through
    /// [`set_user_id`](Self::set_user_id)), or for an address of 4 GiB or
    /// more; the handle then stays reserved.
    pub fn fill(&mut self, fi_addr: FiAddr, addr: Vec<u8>, user_id: Option<u64>) -> Result<()> {
        if self.shared.is_some() {
            return super::shared::fill(self, fi_addr, &addr, user_id);
        }
        self.version.bump();
        self.fill_bytes(fi_addr, &addr, user_id)
    }

    fn fill_bytes(&mut self, fi_addr: FiAddr, addr: &[u8], user_id: Option<u64>) -> Result<()> {
        let index = self.resolve(fi_addr).ok_or(Error::Inval)?;
        self.fill_index(index, addr, user_id)
    }

    fn fill_index(&mut self, index: u32, addr: &[u8], user_id: Option<u64>) -> Result<()> {
        if user_id.is_some() && self.flags.contains(AvFlags::AV_USER_ID) {
            return Err(Error::Inval);
        }
        let Ok(len) = u32::try_from(addr.len()) else {
            return Err(Error::Inval);
        };
        let hash = self.index.hash(addr);
        let Some(slot) = self.slots.get_mut(index as usize) else {
            return Err(Error::Inval);
        };
        if slot.state != State::Reserved {
            return Err(Error::Inval);
        }
        if len <= slot.cap {
            let Some(region) = self.arena.get_mut(slot.off..slot.off + addr.len()) else {
                return Err(Error::Inval);
            };
            region.copy_from_slice(addr);
        } else {
            self.garbage += slot.cap as usize;
            slot.off = self.arena.len();
            slot.cap = len;
            self.arena.extend_from_slice(addr);
        }
        slot.len = len;
        slot.hash = hash;
        slot.user_id = user_id;
        slot.state = State::Live;
        self.index.insert(hash, index);
        self.live += 1;
        if self.garbage != 0 {
            self.maybe_compact();
        }
        Ok(())
    }

    /// Returns a reserved handle whose address failed back to the free pool.
    /// Anything but a reserved handle is ignored.
    pub fn release(&mut self, fi_addr: FiAddr) {
        if self.shared.is_some() {
            return super::shared::release(self, fi_addr);
        }
        self.version.bump();
        if let Some(index) = self.resolve(fi_addr) {
            if self
                .slots
                .get(index as usize)
                .is_some_and(|s| s.state == State::Reserved)
            {
                self.free_slot(index);
            }
        }
    }

    /// Synchronous insert: validates each address, then reserves and fills a
    /// handle for it. Results are per address, in order; a failed address
    /// takes no slot. Running out of handle space fails with `NoSpc`.
    pub fn insert(
        &mut self,
        addrs: &[Vec<u8>],
        validate: &dyn Fn(&[u8]) -> Result<()>,
    ) -> Vec<Result<FiAddr>> {
        self.insert_inner(addrs, None, validate)
    }

    /// [`insert`](Self::insert) with a per-insert `FI_AV_USER_ID` value for
    /// each address (`user_ids[i]` goes with `addrs[i]`). Addresses without a
    /// matching id, or every address if the AV was opened with
    /// `AV_USER_ID`, fail with `Inval`.
    pub fn insert_with_user_ids(
        &mut self,
        addrs: &[Vec<u8>],
        user_ids: &[u64],
        validate: &dyn Fn(&[u8]) -> Result<()>,
    ) -> Vec<Result<FiAddr>> {
        self.insert_inner(addrs, Some(user_ids), validate)
    }

    fn insert_inner(
        &mut self,
        addrs: &[Vec<u8>],
        user_ids: Option<&[u64]>,
        validate: &dyn Fn(&[u8]) -> Result<()>,
    ) -> Vec<Result<FiAddr>> {
        // A connection's cached source lookup must see the new entries.
        self.version.bump();
        if self.shared.is_some() {
            return super::shared::insert(self, addrs, user_ids, validate);
        }
        let mut out = Vec::with_capacity(addrs.len());
        for (i, addr) in addrs.iter().enumerate() {
            out.push(self.insert_one(addr, i, user_ids, validate));
        }
        out
    }

    fn insert_one(
        &mut self,
        addr: &[u8],
        i: usize,
        user_ids: Option<&[u64]>,
        validate: &dyn Fn(&[u8]) -> Result<()>,
    ) -> Result<FiAddr> {
        let user_id = match user_ids {
            None => None,
            Some(_) if self.flags.contains(AvFlags::AV_USER_ID) => return Err(Error::Inval),
            Some(ids) => Some(*ids.get(i).ok_or(Error::Inval)?),
        };
        validate(addr)?;
        let index = self.reserve_index().ok_or(Error::NoSpc)?;
        if let Err(e) = self.fill_index(index, addr, user_id) {
            self.free_slot(index);
            return Err(e);
        }
        let gen = self.slots.get(index as usize).map_or(0, |s| s.gen);
        Ok(self.layout.encode(index, gen))
    }

    /// Removes a live entry (`fi_av_remove`). `Inval` for handles never
    /// handed out, out of range, reserved but unfilled, or already removed.
    pub fn remove(&mut self, fi_addr: FiAddr) -> Result<()> {
        if self.shared.is_some() {
            return super::shared::remove(self, fi_addr);
        }
        self.version.bump();
        let index = self.live_index(fi_addr).ok_or(Error::Inval)?;
        if let Some(slot) = self.slots.get(index as usize) {
            self.index.remove(slot.hash, index);
            self.live -= 1;
        }
        self.free_slot(index);
        Ok(())
    }

    /// The address bytes of a live entry (`fi_av_lookup`); same `Inval`
    /// rules as [`remove`](Self::remove).
    pub fn lookup(&self, fi_addr: FiAddr) -> Result<&[u8]> {
        self.lookup_keyed(fi_addr).map(|(b, _)| b)
    }

    /// [`lookup`](Self::lookup) and [`entry_key`](Self::entry_key) in one
    /// resolve of the handle: what a send needs.
    pub fn lookup_keyed(&self, fi_addr: FiAddr) -> Result<(&[u8], Option<FiAddr>)> {
        let index = self.live_index(fi_addr).ok_or(Error::Inval)?;
        let slot = self.slots.get(index as usize).ok_or(Error::Inval)?;
        let bytes = self.bytes(index).ok_or(Error::Inval)?;
        Ok((bytes, slot.auth.map(FiAddr::from)))
    }

    /// Reverse lookup: the handle of a live entry with exactly these bytes,
    /// e.g. for the source of an incoming message. If the bytes were
    /// inserted more than once, the numerically lowest live handle.
    pub fn find(&self, addr: &[u8]) -> Option<FiAddr> {
        let mut best: Option<FiAddr> = None;
        for index in self.index.candidates(self.index.hash(addr)) {
            if self.bytes(index) == Some(addr) {
                let gen = self.slots.get(index as usize).map_or(0, |s| s.gen);
                let handle = self.layout.encode(index, gen);
                best = Some(best.map_or(handle, |b| b.min(handle)));
            }
        }
        best
    }

    /// [`find`](Self::find) among the entries inserted under the key
    /// handle `key` (`None`: under no key): the source of a message that
    /// arrived over a connection that proved that key.
    pub fn find_keyed(&self, addr: &[u8], key: Option<FiAddr>) -> Option<FiAddr> {
        let key = key.map(|k| u32::try_from(k).unwrap_or(u32::MAX));
        let mut best: Option<FiAddr> = None;
        for index in self.index.candidates(self.index.hash(addr)) {
            let Some(slot) = self.slots.get(index as usize) else {
                continue;
            };
            if slot.auth == key && self.bytes(index) == Some(addr) {
                let handle = self.layout.encode(index, slot.gen);
                best = Some(best.map_or(handle, |b| b.min(handle)));
            }
        }
        best
    }

    /// The authorization keys of the AV.
    pub fn keys(&self) -> &AuthKeyTable {
        &self.keys
    }

    /// The authorization keys of the AV, to change.
    pub fn keys_mut(&mut self) -> &mut AuthKeyTable {
        self.version.bump();
        &mut self.keys
    }

    /// Puts a live entry under the key handle `key` (an insert with
    /// `FI_AUTH_KEY`). `Inval` if either is not live.
    pub fn associate(&mut self, fi_addr: FiAddr, key: FiAddr) -> Result<()> {
        self.version.bump();
        self.keys.get(key)?;
        let k = u32::try_from(key).map_err(|_| Error::Inval)?;
        let index = self.live_index(fi_addr).ok_or(Error::Inval)?;
        let slot = self.slots.get_mut(index as usize).ok_or(Error::Inval)?;
        slot.auth = Some(k);
        Ok(())
    }

    /// The key handle a live entry was inserted under, if any; `Inval`
    /// for a handle that is not live.
    pub fn entry_key(&self, fi_addr: FiAddr) -> Result<Option<FiAddr>> {
        self.lookup_keyed(fi_addr).map(|(_, k)| k)
    }

    /// Changes whenever the table does: a [`find`](Self::find) result
    /// stays valid for as long as the version is the same.
    pub fn version(&self) -> u64 {
        self.version.get()
    }

    /// A handle reading [`version`](Self::version) without the table's
    /// lock, for a private table. `None` for a named AV's: other
    /// processes change it, and only [`sync_shared`](Self::sync_shared)
    /// under the lock brings their changes in
    /// ([`shared::lock_synced`](super::shared::lock_synced)).
    pub fn version_watch(&self) -> Option<super::AvVersion> {
        (!self.is_shared()).then(|| self.version.watch())
    }

    /// What a completion reports as the source of a message from `addr`:
    /// [`reported_addr`](Self::reported_addr) of [`find`](Self::find), or
    /// `FI_ADDR_NOTAVAIL` for an unknown peer.
    pub fn source_addr(&self, addr: &[u8]) -> FiAddr {
        self.find(addr)
            .map_or(FI_ADDR_NOTAVAIL, |h| self.reported_addr(h))
    }

    /// Sets the user id of a live entry (`fi_av_set_user_id`). `Inval` unless
    /// the AV was opened with `AV_USER_ID`, or for an invalid handle.
    pub fn set_user_id(&mut self, fi_addr: FiAddr, user_id: u64) -> Result<()> {
        self.version.bump();
        if !self.flags.contains(AvFlags::AV_USER_ID) {
            return Err(Error::Inval);
        }
        let index = self.live_index(fi_addr).ok_or(Error::Inval)?;
        let slot = self.slots.get_mut(index as usize).ok_or(Error::Inval)?;
        slot.user_id = Some(user_id);
        Ok(())
    }

    /// The value completions report as the source for `fi_addr`: with an AV
    /// opened with `AV_USER_ID`, the id set by `set_user_id`
    /// (`FI_ADDR_NOTAVAIL` until then); else the per-insert user id if one
    /// was given; else `fi_addr` itself. `FI_ADDR_NOTAVAIL` for a handle that
    /// is not live.
    pub fn reported_addr(&self, fi_addr: FiAddr) -> FiAddr {
        let Some(slot) = self
            .live_index(fi_addr)
            .and_then(|i| self.slots.get(i as usize))
        else {
            return FI_ADDR_NOTAVAIL;
        };
        if self.flags.contains(AvFlags::AV_USER_ID) {
            slot.user_id.unwrap_or(FI_ADDR_NOTAVAIL)
        } else {
            slot.user_id.unwrap_or(fi_addr)
        }
    }

    /// The live entries, by ascending slot (for a TABLE: by index).
    pub fn iter(&self) -> impl Iterator<Item = (FiAddr, &[u8])> + '_ {
        self.slots
            .iter()
            .zip(0u32..)
            .filter_map(move |(slot, index)| {
                if slot.state != State::Live {
                    return None;
                }
                let bytes = self.bytes(index)?;
                Some((self.layout.encode(index, slot.gen), bytes))
            })
    }

    fn bytes(&self, index: u32) -> Option<&[u8]> {
        let slot = self.slots.get(index as usize)?;
        self.arena.get(slot.off..slot.off + slot.len as usize)
    }

    /// The slot a handle names in its current generation, whatever its state.
    fn resolve(&self, fi_addr: FiAddr) -> Option<u32> {
        let (base, _) = split_rx_addr(fi_addr, self.rx_ctx_bits);
        let (index, gen) = self.layout.decode(base)?;
        let slot = self.slots.get(index as usize)?;
        (!self.layout.map || slot.gen == gen).then_some(index)
    }

    fn live_index(&self, fi_addr: FiAddr) -> Option<u32> {
        let index = self.resolve(fi_addr)?;
        (self.slots.get(index as usize)?.state == State::Live).then_some(index)
    }

    /// Puts a slot back in the pool under a new generation, or retires it
    /// when the generations are used up.
    fn free_slot(&mut self, index: u32) {
        let Some(slot) = self.slots.get_mut(index as usize) else {
            return;
        };
        slot.user_id = None;
        slot.auth = None;
        if self.layout.map {
            if slot.gen >= self.layout.max_gen {
                slot.state = State::Retired;
                self.garbage += slot.cap as usize;
                slot.cap = 0;
                slot.len = 0;
                return;
            }
            slot.gen += 1;
        }
        slot.state = State::Free;
        self.free.push(Reverse(index));
    }

    /// Rewrites the arena without garbage once garbage is the larger part,
    /// which keeps the cost amortised O(1) per relocated byte.
    fn maybe_compact(&mut self) {
        if self.garbage < 4096 || self.garbage * 2 < self.arena.len() {
            return;
        }
        let mut arena = Vec::with_capacity(self.arena.len() - self.garbage);
        for slot in &mut self.slots {
            let region = slot.off..slot.off + slot.cap as usize;
            slot.off = arena.len();
            arena.extend_from_slice(self.arena.get(region).unwrap_or_default());
        }
        self.arena = arena;
        self.garbage = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_bounds() {
        let t = Layout::new(AvType::Table, 32);
        assert_eq!((t.encode(7, 0), t.decode(7)), (7, Some((7, 0))));
        assert_eq!(t.decode(1 << 32), None);
        let m = Layout::new(AvType::Map, 0);
        assert_eq!(
            (m.index_bits, m.max_gen, m.max_slots),
            (32, u32::MAX, u32::MAX - 2)
        );
        assert_ne!(m.encode(m.max_slots - 1, m.max_gen), FI_ADDR_NOTAVAIL);
        let m = Layout::new(AvType::Map, 8);
        assert_eq!((m.index_bits, m.max_gen), (32, (1 << 24) - 1));
        let m = Layout::new(AvType::Map, 32);
        assert_eq!(
            (m.index_bits, m.max_gen, m.max_slots),
            (24, 255, (1 << 24) - 1)
        );
        let top = m.encode(m.max_slots - 1, m.max_gen);
        assert_eq!(top >> 32, 0);
        assert_ne!(
            top,
            u64::from(u32::MAX),
            "never the all-ones NOTAVAIL pattern"
        );
        assert_eq!(m.decode(top), Some((m.max_slots - 1, m.max_gen)));
    }

    #[test]
    fn every_change_moves_the_version() {
        let mut t = AvTable::open(&AvAttr::default()).unwrap();
        let ok = |_: &[u8]| Ok(());
        let v0 = t.version();
        let h = t.insert(&[vec![1, 2, 3]], &ok)[0].unwrap();
        let v1 = t.version();
        assert_ne!(v0, v1, "a cached source lookup must see inserts");
        let k = t.keys_mut().insert(b"k").unwrap();
        t.associate(h, k).unwrap();
        assert_ne!(t.version(), v1);
        assert_eq!(t.find_keyed(&[1, 2, 3], Some(k)), Some(h));
        assert_eq!(t.find_keyed(&[1, 2, 3], None), None);
        assert_eq!(t.entry_key(h), Ok(Some(k)));
    }

    #[test]
    fn arena_garbage_stays_bounded() {
        let mut t = AvTable::open(&AvAttr::default()).unwrap();
        let ok = |_: &[u8]| Ok(());
        for size in 1..200usize {
            let addrs: Vec<Vec<u8>> = (0..64u8).map(|n| vec![n; size]).collect();
            let hs = t.insert(&addrs, &ok);
            assert!(t.garbage == 0 || t.garbage * 2 < t.arena.len() || t.garbage < 4096);
            for h in hs.into_iter().flatten() {
                t.remove(h).unwrap();
            }
        }
        let owned: usize = t.slots.iter().map(|s| s.cap as usize).sum();
        assert_eq!(owned + t.garbage, t.arena.len());
        assert!(
            t.arena.len() <= 2 * owned.max(4096),
            "{} vs {owned}",
            t.arena.len()
        );
    }
}
