//! The registration cache: registrations of the application's send
//! buffers, kept for reuse so that sending the same bytes again costs no
//! `ibv_reg_mr` (a system call that pins pages: tens of microseconds per
//! megabyte).
//!
//! Caches in C runtimes must learn when cached memory is unmapped and the
//! address reused (libfabric's userfaultfd or memhooks monitors), or they
//! would hand the device pages that no longer back the address. Here an
//! entry owns a clone of the `Bytes` it registered, so the memory cannot
//! be freed, unmapped or changed while the entry exists, and a key (address,
//! length, rights) always names the same bytes: no monitor is needed and
//! there is no window in which a stale registration could be used.
//!
//! The price is that cached buffers stay allocated (and pinned) until
//! evicted (or, once the application holds them no more, until the next
//! miss: [`Owns`]) — at most `FI_MR_CACHE_MAX_SIZE` bytes per domain, 32 MiB by
//! default — and that `Bytes::try_into_mut` cannot reclaim a cached
//! buffer meanwhile. Limits follow libfabric's variables: `FI_MR_CACHE_MAX_COUNT`
//! entries (0 disables the cache), `FI_MR_CACHE_MAX_SIZE` bytes, and
//! `FI_MR_CACHE_MONITOR=disabled` turns it off; the other monitor names are
//! accepted and mean the ownership rule above. The least recently used
//! entries go first; an operation still using an evicted registration
//! keeps it alive until it completes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use weft_core::hash::{fast_map, FastMap};
use weft_core::provider::MrCacheStats as CacheStats;
use weft_core::sync::lock;
use weft_core::{Error, Result};

/// Default entry limit (libfabric's default).
pub const DEFAULT_MAX_COUNT: usize = 1024;
/// Default byte limit: pinned memory counts against `RLIMIT_MEMLOCK`, so
/// at most half of a finite limit, and never more than this.
pub const DEFAULT_MAX_SIZE: usize = 32 << 20;

/// Limits of a cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheLimits {
    /// Most entries (0: no caching).
    pub max_count: usize,
    /// Most bytes registered through entries.
    pub max_size: usize,
}

impl CacheLimits {
    /// From `FI_MR_CACHE_*` (`get` reads one variable) and the locked
    /// memory limit (`None`: unlimited). A value that is not a number, or
    /// a monitor fi_mr(3) does not name, is `Inval` (the domain does not
    /// open): a typo must not quietly leave the cache on or off.
    pub fn from_env(
        get: impl Fn(&str) -> Option<String>,
        memlock: Option<u64>,
    ) -> Result<CacheLimits> {
        let num = |name: &str| -> Result<Option<usize>> {
            match get(name) {
                None => Ok(None),
                Some(v) => v.trim().parse::<usize>().map(Some).map_err(|_| {
                    tracing::error!(variable = name, value = %v, "not a number");
                    Error::Inval
                }),
            }
        };
        let disabled = match get("FI_MR_CACHE_MONITOR") {
            None => false,
            Some(m) => match m.trim().to_ascii_lowercase().as_str() {
                "disabled" => true,
                "userfaultfd" | "uffd" | "memhooks" | "kdreg2" => false,
                _ => {
                    tracing::error!(variable = "FI_MR_CACHE_MONITOR", value = %m, "unknown monitor");
                    return Err(Error::Inval);
                }
            },
        };
        let cap = memlock.map_or(DEFAULT_MAX_SIZE, |m| {
            usize::try_from(m / 2)
                .unwrap_or(usize::MAX)
                .min(DEFAULT_MAX_SIZE)
        });
        let count = num("FI_MR_CACHE_MAX_COUNT")?;
        let size = num("FI_MR_CACHE_MAX_SIZE")?;
        Ok(CacheLimits {
            max_count: if disabled {
                0
            } else {
                count.unwrap_or(DEFAULT_MAX_COUNT)
            },
            max_size: size.unwrap_or(cap),
        })
    }
}

/// A cached registration that can tell when the buffer it owns is held
/// by nobody else: the application dropped every handle to it, so no
/// send can name it again, and the entry only keeps dead memory pinned.
pub trait Owns {
    /// Whether the entry's own handle is the buffer's last one.
    fn only_owner(&self) -> bool;
}

/// How many of the most recently used entries a miss looks at for dead
/// ones. An application that sends a buffer once and drops it (an echo
/// of what it received, a message built per send) leaves one dead entry
/// per send, the most recent ones: dropped at the next miss, its memory
/// goes back to the allocator (to be handed out again, warm) and its
/// pages are unpinned, instead of both waiting for the least recently
/// used end of a 32 MiB cache.
const RECENT: usize = 4;

/// The cache key: start address, length and access rights of a buffer.
pub type Key = (usize, usize, u32);

struct Entry<T> {
    reg: Arc<T>,
    stamp: u64,
}

struct Inner<T> {
    map: FastMap<Key, Entry<T>>,
    /// Use stamp → key, oldest first.
    lru: BTreeMap<u64, Key>,
    next: u64,
    stats: CacheStats,
}

impl<T> Inner<T> {
    /// Takes the entry of `key` out of the map (its use stamp is the
    /// caller's to take out of `lru`), counted as an eviction.
    fn remove(&mut self, key: &Key) -> Option<Entry<T>> {
        let e = self.map.remove(key)?;
        self.stats.entries -= 1;
        self.stats.bytes -= key.1;
        self.stats.evictions += 1;
        Some(e)
    }
}

/// A bounded LRU map from buffers to registrations `T`.
pub struct RegCache<T> {
    limits: CacheLimits,
    inner: Mutex<Inner<T>>,
}

impl<T> std::fmt::Debug for RegCache<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegCache")
            .field("limits", &self.limits)
            .field("stats", &self.stats())
            .finish()
    }
}

impl<T> RegCache<T> {
    /// An empty cache.
    pub fn new(limits: CacheLimits) -> RegCache<T> {
        RegCache {
            limits,
            inner: Mutex::new(Inner {
                map: fast_map(),
                lru: BTreeMap::new(),
                next: 0,
                stats: CacheStats::default(),
            }),
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> CacheLimits {
        self.limits
    }

    /// Counters and occupancy.
    pub fn stats(&self) -> CacheStats {
        lock(&self.inner).stats
    }

    /// The registration for `key` (`len` bytes), made by `register` on a
    /// miss. Buffers too large for the cache, or all buffers when it is
    /// disabled, are registered for this one use. A registration that
    /// fails for lack of memory is retried once after emptying the cache,
    /// whose entries hold pinned pages. A miss also drops the most recent
    /// entries whose buffers nobody else holds any more ([`Owns`]).
    pub fn get(&self, key: Key, register: impl Fn() -> Result<T>) -> Result<Arc<T>>
    where
        T: Owns,
    {
        let len = key.1;
        if self.limits.max_count == 0 || len > self.limits.max_size {
            return register().map(Arc::new);
        }
        if let Some(reg) = self.peek(key) {
            return Ok(reg);
        }
        // Registration is a system call: not under the lock.
        let reg = match register() {
            Err(Error::NoMem) => {
                self.clear();
                register()?
            }
            r => r?,
        };
        let reg = Arc::new(reg);
        let mut g = lock(&self.inner);
        g.stats.misses += 1;
        if g.map.contains_key(&key) {
            // Another thread registered the same buffer meanwhile.
            return Ok(reg);
        }
        let stamp = g.next;
        g.next += 1;
        g.map.insert(
            key,
            Entry {
                reg: reg.clone(),
                stamp,
            },
        );
        g.lru.insert(stamp, key);
        g.stats.bytes += len;
        g.stats.entries += 1;
        // Dropped after the lock: a deregistration is a system call.
        let mut gone: Vec<Entry<T>> = Vec::new();
        let dead: Vec<(u64, Key)> = g
            .lru
            .iter()
            .rev()
            .skip(1)
            .take(RECENT)
            .filter(|(_, k)| {
                g.map
                    .get(*k)
                    .is_some_and(|e| Arc::strong_count(&e.reg) == 1 && e.reg.only_owner())
            })
            .map(|(st, k)| (*st, *k))
            .collect();
        for (st, k) in dead {
            g.lru.remove(&st);
            gone.extend(g.remove(&k));
        }
        while g.stats.entries > self.limits.max_count || g.stats.bytes > self.limits.max_size {
            let Some((_, oldest)) = g.lru.pop_first() else {
                break;
            };
            gone.extend(g.remove(&oldest));
        }
        drop(g);
        drop(gone);
        Ok(reg)
    }

    /// The registration for `key` if the cache holds one (a hit, counted
    /// and made the most recent); nothing is registered on a miss, which
    /// is not counted.
    pub fn peek(&self, key: Key) -> Option<Arc<T>> {
        let mut g = lock(&self.inner);
        let g = &mut *g;
        let stamp = g.next;
        let e = g.map.get_mut(&key)?;
        g.lru.remove(&e.stamp);
        e.stamp = stamp;
        g.lru.insert(stamp, key);
        g.next += 1;
        g.stats.hits += 1;
        Some(e.reg.clone())
    }

    /// Drops every entry (registrations in use live on until their
    /// operations end).
    pub fn clear(&self) {
        let mut g = lock(&self.inner);
        g.map.clear();
        g.lru.clear();
        g.stats.entries = 0;
        g.stats.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    // The plain values these tests cache are always held elsewhere too.
    impl Owns for usize {
        fn only_owner(&self) -> bool {
            false
        }
    }
    impl Owns for u8 {
        fn only_owner(&self) -> bool {
            false
        }
    }
    impl Owns for String {
        fn only_owner(&self) -> bool {
            false
        }
    }

    /// A buffer as the cache holds it: an `Arc` whose other handles are
    /// the application's.
    struct Buf(Arc<()>);
    impl Owns for Buf {
        fn only_owner(&self) -> bool {
            Arc::strong_count(&self.0) == 1
        }
    }

    #[test]
    fn a_miss_drops_recent_entries_nobody_else_holds() {
        let c: RegCache<Buf> = RegCache::new(limits(100, 1 << 20));
        let held = Arc::new(());
        let dropped = Arc::new(());
        let watch = Arc::downgrade(&dropped);
        c.get((1, 10, 0), || Ok(Buf(held.clone()))).unwrap();
        c.get((2, 10, 0), || Ok(Buf(dropped.clone()))).unwrap();
        // In use by an operation: kept whoever else holds the buffer.
        let used = Arc::new(());
        let op = c.get((3, 10, 0), || Ok(Buf(used.clone()))).unwrap();
        drop((dropped, used));
        c.get((4, 10, 0), || Ok(Buf(Arc::new(())))).unwrap();
        let s = c.stats();
        assert_eq!((s.entries, s.evictions), (3, 1), "only the dead entry went");
        assert!(watch.upgrade().is_none(), "its buffer is freed");
        // The entry just made is never the one dropped, and a hit finds
        // what is left.
        c.get((1, 10, 0), || unreachable!()).unwrap();
        c.get((3, 10, 0), || unreachable!()).unwrap();
        c.get((4, 10, 0), || unreachable!()).unwrap();
        drop(op);
        // Dead now: entry 3 (its operation ended, nobody holds its
        // buffer) and entry 4 (nobody did but the cache, which a miss
        // never drops in the same breath as it makes it). The next miss
        // drops both; the live one stays.
        c.get((5, 10, 0), || Ok(Buf(held.clone()))).unwrap();
        let s = c.stats();
        assert_eq!((s.entries, s.evictions), (2, 3), "entries 3 and 4 went");
        assert_eq!(s.bytes, 20);
        c.get((1, 10, 0), || unreachable!()).unwrap();
        c.get((5, 10, 0), || unreachable!()).unwrap();
    }

    #[test]
    fn peek_finds_only_what_is_cached_and_registers_nothing() {
        let c: RegCache<usize> = RegCache::new(limits(2, 1 << 20));
        assert!(c.peek((1, 10, 0)).is_none());
        assert_eq!(
            (c.stats().hits, c.stats().misses, c.stats().entries),
            (0, 0, 0)
        );
        c.get((1, 10, 0), || Ok(7)).unwrap();
        c.get((2, 10, 0), || Ok(8)).unwrap();
        assert_eq!(c.peek((1, 10, 0)).as_deref(), Some(&7));
        assert!(
            c.peek((1, 11, 0)).is_none(),
            "another length is another buffer"
        );
        // The peek made entry 1 the most recent: the next miss evicts 2.
        c.get((3, 10, 0), || Ok(9)).unwrap();
        assert!(c.peek((2, 10, 0)).is_none());
        assert_eq!(c.peek((1, 10, 0)).as_deref(), Some(&7));
        assert_eq!(c.stats().hits, 2);
    }

    fn limits(max_count: usize, max_size: usize) -> CacheLimits {
        CacheLimits {
            max_count,
            max_size,
        }
    }

    #[test]
    fn hit_after_miss_and_lru_eviction_by_count() {
        let c: RegCache<usize> = RegCache::new(limits(2, 1 << 20));
        let made = Cell::new(0);
        let reg = |v: usize| {
            let made = &made;
            move || {
                made.set(made.get() + 1);
                Ok(v)
            }
        };
        assert_eq!(*c.get((0x1000, 10, 0), reg(1)).unwrap(), 1);
        assert_eq!(*c.get((0x1000, 10, 0), reg(9)).unwrap(), 1);
        // Same address, other length or rights: other entries.
        assert_eq!(*c.get((0x1000, 11, 0), reg(2)).unwrap(), 2);
        // Touch the first so the second is the oldest.
        c.get((0x1000, 10, 0), reg(9)).unwrap();
        assert_eq!(*c.get((0x1000, 10, 1), reg(3)).unwrap(), 3);
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.evictions, s.entries), (2, 3, 1, 2));
        assert_eq!(*c.get((0x1000, 10, 0), reg(9)).unwrap(), 1);
        assert_eq!(*c.get((0x1000, 11, 0), reg(4)).unwrap(), 4, "evicted");
        assert_eq!(made.get(), 4);
    }

    #[test]
    fn byte_limit_and_oversized_buffers() {
        let c: RegCache<u8> = RegCache::new(limits(100, 100));
        c.get((1, 60, 0), || Ok(1)).unwrap();
        c.get((2, 60, 0), || Ok(2)).unwrap();
        let s = c.stats();
        assert_eq!((s.entries, s.bytes, s.evictions), (1, 60, 1));
        // Larger than the cache: registered, never kept.
        c.get((3, 101, 0), || Ok(3)).unwrap();
        c.get((3, 101, 0), || Ok(4)).unwrap();
        let s = c.stats();
        assert_eq!((s.entries, s.hits), (1, 0));
    }

    #[test]
    fn evicted_registration_lives_while_used() {
        let c: RegCache<String> = RegCache::new(limits(1, 1000));
        let a = c.get((1, 1, 0), || Ok("a".to_owned())).unwrap();
        c.get((2, 1, 0), || Ok("b".to_owned())).unwrap();
        assert_eq!(c.stats().evictions, 1);
        assert_eq!(*a, "a");
        assert_eq!(Arc::strong_count(&a), 1);
    }

    #[test]
    fn no_memory_empties_the_cache_and_retries_once() {
        let c: RegCache<u8> = RegCache::new(limits(10, 1000));
        c.get((1, 1, 0), || Ok(1)).unwrap();
        let tries = Cell::new(0);
        let r = c.get((2, 1, 0), || {
            tries.set(tries.get() + 1);
            if tries.get() == 1 {
                Err(Error::NoMem)
            } else {
                Ok(2)
            }
        });
        assert_eq!(*r.unwrap(), 2);
        assert_eq!(c.stats().entries, 1);
        let r = c.get((3, 1, 0), || Err(Error::NoMem));
        assert_eq!(r.unwrap_err(), Error::NoMem);
    }

    #[test]
    fn limits_from_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let d = CacheLimits::from_env(env(&[]), None).unwrap();
        assert_eq!(d, limits(DEFAULT_MAX_COUNT, DEFAULT_MAX_SIZE));
        let small = CacheLimits::from_env(env(&[]), Some(8 << 20)).unwrap();
        assert_eq!(small.max_size, 4 << 20);
        let set = CacheLimits::from_env(
            env(&[
                ("FI_MR_CACHE_MAX_COUNT", "7"),
                ("FI_MR_CACHE_MAX_SIZE", "4096"),
            ]),
            None,
        )
        .unwrap();
        assert_eq!(set, limits(7, 4096));
        // A size set explicitly is honoured even above the default cap.
        let big = CacheLimits::from_env(env(&[("FI_MR_CACHE_MAX_SIZE", "1073741824")]), None);
        assert_eq!(big.unwrap().max_size, 1 << 30);
        let off = CacheLimits::from_env(env(&[("FI_MR_CACHE_MONITOR", "disabled")]), None).unwrap();
        assert_eq!(off.max_count, 0);
        let zero = CacheLimits::from_env(env(&[("FI_MR_CACHE_MAX_COUNT", "0")]), None).unwrap();
        assert_eq!(zero.max_count, 0);
        for m in ["userfaultfd", "memhooks", "kdreg2", "Memhooks"] {
            let pairs: &'static [(&'static str, &'static str)] =
                Box::leak(Box::new([("FI_MR_CACHE_MONITOR", m)]));
            let on = CacheLimits::from_env(env(pairs), None).unwrap();
            assert_eq!(on.max_count, DEFAULT_MAX_COUNT, "{m}");
        }
        for bad in [
            ("FI_MR_CACHE_MONITOR", "userfault"),
            ("FI_MR_CACHE_MAX_COUNT", "many"),
            ("FI_MR_CACHE_MAX_SIZE", "-1"),
            ("FI_MR_CACHE_MAX_SIZE", "32M"),
        ] {
            let pairs: &'static [(&'static str, &'static str)] = Box::leak(Box::new([bad]));
            assert_eq!(
                CacheLimits::from_env(env(pairs), None),
                Err(Error::Inval),
                "{bad:?}"
            );
        }
    }
}
