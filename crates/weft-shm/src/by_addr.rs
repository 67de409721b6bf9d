//! Values kept by address bytes, with the one found last remembered: a
//! run of sends to one peer compares its address instead of hashing it
//! (the hashing and the probe were about 140 instructions of a 64 B
//! send, `docs/benchmarks.md`).

use weft_core::hash::FastMap;

#[derive(Debug)]
pub struct ByAddr<T> {
    list: Vec<(Vec<u8>, T)>,
    /// Where each address's value is in `list`.
    at: FastMap<Vec<u8>, usize>,
    /// The place in `list` of the value found last; only a hint (it is
    /// checked against the address every time).
    last: usize,
    /// Moves on whenever a value may have changed places in `list` (one
    /// added or removed): a place taken with [`place_of`](Self::place_of)
    /// holds while this is the same.
    gen: u64,
}

/// Where an address's value was, as of a generation of the map.
pub type Place = (usize, u64);

impl<T> Default for ByAddr<T> {
    fn default() -> Self {
        ByAddr {
            list: Vec::new(),
            at: FastMap::default(),
            last: 0,
            gen: 0,
        }
    }
}

impl<T> ByAddr<T> {
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// The value kept for `addr`.
    pub fn get_mut(&mut self, addr: &[u8]) -> Option<&mut T> {
        let i = match self.list.get(self.last) {
            Some((a, _)) if a[..] == *addr => self.last,
            _ => {
                let i = *self.at.get(addr)?;
                self.last = i;
                i
            }
        };
        self.list.get_mut(i).map(|(_, v)| v)
    }

    /// Where `addr`'s value is now (for [`get_at`](Self::get_at)).
    pub fn place_of(&mut self, addr: &[u8]) -> Option<Place> {
        self.get_mut(addr)?;
        Some((self.last, self.gen))
    }

    /// Whether `p` still says where its value is.
    pub fn holds(&self, p: Place) -> bool {
        p.1 == self.gen && p.0 < self.list.len()
    }

    /// The value at place `p`, if `p` still holds: a run of sends to one
    /// peer finds it without comparing its address each time.
    pub fn get_at(&mut self, p: Place) -> Option<&mut T> {
        if p.1 != self.gen {
            return None;
        }
        self.list.get_mut(p.0).map(|(_, v)| v)
    }

    /// Keeps `v` for `addr`, replacing what was kept for it.
    pub fn insert(&mut self, addr: &[u8], v: T) {
        if let Some(old) = self.get_mut(addr) {
            *old = v;
            return;
        }
        self.last = self.list.len();
        self.gen = self.gen.wrapping_add(1);
        self.at.insert(addr.to_vec(), self.list.len());
        self.list.push((addr.to_vec(), v));
    }

    /// Forgets what is kept for `addr`.
    pub fn remove(&mut self, addr: &[u8]) -> Option<T> {
        let i = self.at.remove(addr)?;
        self.gen = self.gen.wrapping_add(1);
        let (_, v) = self.list.swap_remove(i);
        if let Some((moved, _)) = self.list.get(i) {
            if let Some(j) = self.at.get_mut(&moved[..]) {
                *j = i;
            }
        }
        Some(v)
    }

    /// Every value, with its address.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&Vec<u8>, &mut T)> {
        self.list.iter_mut().map(|(a, v)| (&*a, v))
    }

    /// Keeps the values `keep` says to keep.
    pub fn retain(&mut self, mut keep: impl FnMut(&mut T) -> bool) {
        let before = self.list.len();
        self.list.retain_mut(|(_, v)| keep(v));
        if self.list.len() != before {
            self.gen = self.gen.wrapping_add(1);
            self.at = self
                .list
                .iter()
                .enumerate()
                .map(|(i, (a, _))| (a.clone(), i))
                .collect();
        }
    }

    /// The values, the addresses dropped.
    pub fn into_values(self) -> impl Iterator<Item = T> {
        self.list.into_iter().map(|(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(i: u32) -> Vec<u8> {
        format!("fi_shm://peer-{i}").into_bytes()
    }

    /// Every address finds its own value, whatever the hint says.
    fn check(m: &mut ByAddr<u32>, live: &[u32]) {
        assert_eq!(m.len(), live.len());
        for &i in live {
            assert_eq!(m.get_mut(&addr(i)).copied(), Some(i));
        }
        for &i in live.iter().rev() {
            assert_eq!(m.get_mut(&addr(i)).copied(), Some(i));
        }
    }

    #[test]
    fn removals_and_retains_keep_every_address_found() {
        let mut m = ByAddr::default();
        let mut live: Vec<u32> = (0..20).collect();
        for &i in &live {
            m.insert(&addr(i), i);
        }
        check(&mut m, &live);
        // Removing the first moves the last into its place.
        assert_eq!(m.remove(&addr(0)), Some(0));
        assert_eq!(m.remove(&addr(0)), None);
        live.retain(|&i| i != 0);
        check(&mut m, &live);
        // The hint on the last one, then that one removed.
        assert_eq!(m.get_mut(&addr(19)).copied(), Some(19));
        assert_eq!(m.remove(&addr(19)), Some(19));
        live.retain(|&i| i != 19);
        assert_eq!(m.get_mut(&addr(19)), None);
        check(&mut m, &live);
        m.retain(|v| *v % 3 != 0);
        live.retain(|&i| i % 3 != 0);
        check(&mut m, &live);
        assert_eq!(m.get_mut(&addr(3)), None);
        m.insert(&addr(3), 3);
        m.insert(&addr(4), 4);
        live.push(3);
        check(&mut m, &live);
        // A place holds until a value is added or removed.
        let p = m.place_of(&addr(4)).unwrap();
        assert!(m.holds(p));
        assert_eq!(m.get_at(p).copied(), Some(4));
        assert_eq!(m.remove(&addr(3)), Some(3));
        live.retain(|&i| i != 3);
        assert!(!m.holds(p));
        assert_eq!(m.get_at(p), None);
        let p = m.place_of(&addr(4)).unwrap();
        assert_eq!(m.get_at(p).copied(), Some(4));
        m.insert(&addr(4), 44);
        assert_eq!(m.get_at(p).copied(), Some(44));
        m.insert(&addr(4), 4);
        m.insert(&addr(3), 3);
        live.push(3);
        assert_eq!(m.get_at(p), None);
        let mut all: Vec<u32> = m.into_values().collect();
        all.sort_unstable();
        live.sort_unstable();
        assert_eq!(all, live);
    }
}
