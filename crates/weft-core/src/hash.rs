//! The hash maps of the hot paths (tag matching, peer and ack tables).
//!
//! SipHash, std's default, cost 13% of all instructions of a 64 B
//! ping-pong (callgrind). foldhash is several times cheaper per key and
//! still seeded per process, so a peer choosing tags or addresses cannot
//! precompute collisions.

/// A `HashMap` with the fast, randomly seeded hasher.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// An empty [`FastMap`].
pub fn fast_map<K, V>() -> FastMap<K, V> {
    FastMap::with_hasher(foldhash::fast::RandomState::default())
}
