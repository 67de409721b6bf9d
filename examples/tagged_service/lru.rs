//! The server's bounded table of clients, least recently heard from first out.

use super::*;

/// A map of at most `cap` entries that, when full, makes room by
/// dropping the entry used least recently.
#[derive(Debug)]
pub(crate) struct Lru<V> {
    pub(crate) cap: usize,
    /// Increases with every use: an entry's last one orders it.
    pub(crate) clock: u64,
    pub(crate) entries: HashMap<u64, (V, u64)>,
    pub(crate) by_use: BTreeMap<u64, u64>,
}

impl<V: Copy> Lru<V> {
    pub(crate) fn new(cap: usize) -> Lru<V> {
        Lru {
            cap: cap.max(1),
            clock: 0,
            entries: HashMap::new(),
            by_use: BTreeMap::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The value of `key`, which is now the most recently used.
    pub(crate) fn get(&mut self, key: u64) -> Option<V> {
        let now = self.tick();
        let (v, used) = self.entries.get_mut(&key)?;
        self.by_use.remove(used);
        *used = now;
        self.by_use.insert(now, key);
        Some(*v)
    }

    /// Inserts `key`, most recently used. Returns what it displaced: the
    /// old value of `key`, or the least recent entry if the map was full.
    pub(crate) fn insert(&mut self, key: u64, v: V) -> Option<(u64, V)> {
        let now = self.tick();
        let out = match self.entries.remove(&key) {
            Some((old, used)) => {
                self.by_use.remove(&used);
                Some((key, old))
            }
            None if self.entries.len() >= self.cap => self.pop_oldest(),
            None => None,
        };
        self.entries.insert(key, (v, now));
        self.by_use.insert(now, key);
        out
    }

    pub(crate) fn pop_oldest(&mut self) -> Option<(u64, V)> {
        let (_, key) = self.by_use.pop_first()?;
        self.entries.remove(&key).map(|(v, _)| (key, v))
    }
}
