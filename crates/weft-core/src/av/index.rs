//! Reverse index of an AV: address bytes → slots, for `AvTable::find`.
//!
//! A purpose-built open-addressing table rather than `HashMap`: the index
//! only stores `(hash, slot)` pairs (the bytes live once, in the table's
//! arena), it never re-reads the bytes to grow, and it stays fast in debug
//! builds, where a generic map's inlined hashing and probing are not
//! optimised and a million-peer AV becomes seconds slower.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

/// Bucket marker: never used.
const EMPTY: u32 = u32::MAX;
/// Bucket marker: used, then removed (keeps probe chains intact).
const TOMB: u32 = u32::MAX - 1;
/// Slot numbers the index can hold (the sentinels are above).
pub(super) const MAX_SLOT: u32 = TOMB - 1;

const MIN_BUCKETS: usize = 16;
const MUL: u64 = 0x9E37_79B9_7F4A_7C15;

#[derive(Clone, Copy)]
struct Bucket {
    hash: u32,
    slot: u32,
}

const VACANT: Bucket = Bucket {
    hash: 0,
    slot: EMPTY,
};

/// Multiset of `(hash, slot)`; the caller resolves hash collisions by
/// comparing bytes.
#[derive(Clone)]
pub(super) struct AddrIndex {
    buckets: Vec<Bucket>,
    /// Live entries.
    live: usize,
    /// Live entries plus tombstones: what lengthens probe chains.
    used: usize,
    /// Per-table key: peers choose their own addresses, and the addresses a
    /// server inserts may be its peers' choice, so bucket placement must not
    /// be predictable from outside.
    seed: u64,
}

impl AddrIndex {
    pub(super) fn with_capacity(n: usize) -> AddrIndex {
        let seed = RandomState::new().hash_one(0x5745_4654_u64) | 1;
        let mut index = AddrIndex {
            buckets: Vec::new(),
            live: 0,
            used: 0,
            seed,
        };
        index.rebuild(n);
        index
    }

    /// Keyed hash of address bytes, word at a time. Written with plain
    /// indexing and `as` casts: this runs once per insert and per incoming
    /// message, and must not be slow in debug builds either.
    pub(super) fn hash(&self, bytes: &[u8]) -> u32 {
        let n = bytes.len();
        let mut h = self.seed ^ (n as u64).wrapping_mul(MUL);
        let mut i = 0;
        while i + 8 <= n {
            let mut w = 0u64;
            let mut k = 0;
            while k < 8 {
                w |= (bytes[i + k] as u64) << (8 * k);
                k += 1;
            }
            h = (h ^ w).wrapping_mul(MUL).rotate_left(29);
            i += 8;
        }
        let mut w = 0u64;
        let mut shift = 0;
        while i < n {
            w |= (bytes[i] as u64) << shift;
            shift += 8;
            i += 1;
        }
        h = (h ^ w).wrapping_mul(MUL);
        // Fold so that the low bits, which pick the bucket, see every input bit.
        h ^= h >> 32;
        h = h.wrapping_mul(MUL);
        (h >> 32) as u32
    }

    fn mask(&self) -> usize {
        self.buckets.len() - 1
    }

    pub(super) fn insert(&mut self, hash: u32, slot: u32) {
        // Keep at most half the buckets used so probe chains stay short.
        if (self.used + 1) * 2 > self.buckets.len() {
            self.rebuild(self.live + 1);
        }
        let mask = self.mask();
        let mut pos = hash as usize & mask;
        loop {
            let b = &mut self.buckets[pos];
            if b.slot == EMPTY || b.slot == TOMB {
                if b.slot == EMPTY {
                    self.used += 1;
                }
                *b = Bucket { hash, slot };
                self.live += 1;
                return;
            }
            pos = (pos + 1) & mask;
        }
    }

    pub(super) fn remove(&mut self, hash: u32, slot: u32) {
        let mask = self.mask();
        let mut pos = hash as usize & mask;
        loop {
            let b = &mut self.buckets[pos];
            if b.slot == EMPTY {
                return;
            }
            if b.slot == slot {
                b.slot = TOMB;
                self.live -= 1;
                return;
            }
            pos = (pos + 1) & mask;
        }
    }

    /// The slots whose entry has this hash, in probe order.
    pub(super) fn candidates(&self, hash: u32) -> Candidates<'_> {
        Candidates {
            index: self,
            pos: hash as usize & self.mask(),
            hash,
        }
    }

    /// Re-lays the live entries into a power-of-two table with room for
    /// `min_live` entries at half load; tombstones disappear.
    fn rebuild(&mut self, min_live: usize) {
        let want = min_live.max(self.live).saturating_mul(2).max(MIN_BUCKETS);
        let len = want.checked_next_power_of_two().unwrap_or(want);
        let old = std::mem::replace(&mut self.buckets, vec![VACANT; len]);
        self.used = 0;
        self.live = 0;
        for b in old {
            if b.slot != EMPTY && b.slot != TOMB {
                self.insert(b.hash, b.slot);
            }
        }
    }
}

/// Iterator over [`AddrIndex::candidates`].
pub(super) struct Candidates<'a> {
    index: &'a AddrIndex,
    pos: usize,
    hash: u32,
}

impl Iterator for Candidates<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        let mask = self.index.mask();
        loop {
            let b = self.index.buckets[self.pos];
            if b.slot == EMPTY {
                return None;
            }
            self.pos = (self.pos + 1) & mask;
            if b.slot != TOMB && b.hash == self.hash {
                return Some(b.slot);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multiset_with_collisions_and_tombstones() {
        let mut ix = AddrIndex::with_capacity(0);
        // Same hash for everything: the worst case still works.
        for slot in 0..100 {
            ix.insert(7, slot);
        }
        let mut got: Vec<_> = ix.candidates(7).collect();
        got.sort_unstable();
        assert_eq!(got, (0..100).collect::<Vec<_>>());
        for slot in (0..100).step_by(2) {
            ix.remove(7, slot);
        }
        ix.remove(7, 1000); // absent: ignored
        assert_eq!(ix.candidates(7).count(), 50);
        assert_eq!(ix.candidates(8).count(), 0);
        // Churn must not fill the table with tombstones.
        for round in 0..10_000 {
            ix.insert(round, 500);
            ix.remove(round, 500);
        }
        assert!(ix.buckets.len() <= 256, "{}", ix.buckets.len());
        assert_eq!(ix.live, 50);
    }

    #[test]
    fn hash_depends_on_every_byte_and_length() {
        let ix = AddrIndex::with_capacity(0);
        let base = [0u8; 17];
        let h0 = ix.hash(&base);
        for i in 0..base.len() {
            let mut b = base;
            b[i] = 1;
            assert_ne!(ix.hash(&b), h0, "byte {i}");
        }
        assert_ne!(ix.hash(&base[..16]), h0);
        assert_ne!(ix.hash(&[]), ix.hash(&[0]));
    }
}
