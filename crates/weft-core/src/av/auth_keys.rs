//! The authorization keys of an AV opened on an `FI_AV_AUTH_KEY` domain
//! (`fi_av_insert_auth_key`, `fi_av_lookup_auth_key`, removal with
//! `FI_AUTH_KEY`).
//!
//! A key handle names one key; addresses inserted with `FI_AUTH_KEY`
//! under it are reachable only through connections that proved that key.
//! Handles are slot indices and are never reused: a removed key's handle
//! stays dead, so a stale handle can never come to name another job's
//! key. Endpoints take the keys present when they are enabled and hold
//! them ([`acquire`](AuthKeyTable::acquire)) until they close; removing a
//! held key is `Busy` (fi_av(3)).

use crate::addr::{FiAddr, FI_ADDR_NOTAVAIL};
use crate::auth::AuthKey;
use crate::{Error, Result};

/// Most keys one AV holds over its life (handles are not reused). Also
/// the most an endpoint can be enabled with (`max_ep_auth_key`).
pub const MAX_AV_AUTH_KEYS: usize = 256;

#[derive(Debug, Clone)]
struct KeySlot {
    /// `None` once removed.
    key: Option<AuthKey>,
    user_id: Option<u64>,
    /// Enabled endpoints (and regions) holding the key.
    holders: usize,
}

/// The key table of one AV.
#[derive(Debug, Clone, Default)]
pub struct AuthKeyTable {
    slots: Vec<KeySlot>,
}

impl AuthKeyTable {
    /// `fi_av_insert_auth_key`: a handle for `key` (1..=64 bytes, else
    /// `Inval`); `NoSpc` once [`MAX_AV_AUTH_KEYS`] handles were handed out.
    pub fn insert(&mut self, key: &[u8]) -> Result<FiAddr> {
        let key = AuthKey::new(key)?;
        if self.slots.len() >= MAX_AV_AUTH_KEYS {
            return Err(Error::NoSpc);
        }
        self.slots.push(KeySlot {
            key: Some(key),
            user_id: None,
            holders: 0,
        });
        Ok((self.slots.len() - 1) as FiAddr)
    }

    /// The key of a live handle; `Inval` for any other handle.
    pub fn get(&self, handle: FiAddr) -> Result<&AuthKey> {
        self.slot(handle)?.key.as_ref().ok_or(Error::Inval)
    }

    fn slot(&self, handle: FiAddr) -> Result<&KeySlot> {
        usize::try_from(handle)
            .ok()
            .and_then(|i| self.slots.get(i))
            .ok_or(Error::Inval)
    }

    fn live_mut(&mut self, handle: FiAddr) -> Result<&mut KeySlot> {
        usize::try_from(handle)
            .ok()
            .and_then(|i| self.slots.get_mut(i))
            .filter(|s| s.key.is_some())
            .ok_or(Error::Inval)
    }

    /// Removes a key (`fi_av_remove` with `FI_AUTH_KEY`): `Busy` while an
    /// enabled endpoint or a region holds it, `Inval` for a handle that is
    /// not live.
    pub fn remove(&mut self, handle: FiAddr) -> Result<()> {
        let s = self.live_mut(handle)?;
        if s.holders > 0 {
            return Err(Error::Busy);
        }
        s.key = None;
        s.user_id = None;
        Ok(())
    }

    /// `fi_av_set_user_id` with `FI_AUTH_KEY`.
    pub fn set_user_id(&mut self, handle: FiAddr, id: u64) -> Result<()> {
        self.live_mut(handle)?.user_id = Some(id);
        Ok(())
    }

    /// What an `FI_EADDRNOTAVAIL` error reports for a source that proved
    /// this key but is not in the AV: the key's user id on an AV opened
    /// with `FI_AV_USER_ID` (`FI_ADDR_NOTAVAIL` until one is set), else
    /// the key handle.
    pub fn reported(&self, handle: FiAddr, user_ids: bool) -> FiAddr {
        match self.slot(handle) {
            Ok(s) if s.key.is_some() => match (user_ids, s.user_id) {
                (true, id) => id.unwrap_or(FI_ADDR_NOTAVAIL),
                (false, _) => handle,
            },
            _ => FI_ADDR_NOTAVAIL,
        }
    }

    /// The live keys with their handles, for an endpoint being enabled.
    pub fn snapshot(&self) -> Vec<(FiAddr, AuthKey)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.key.clone().map(|k| (i as FiAddr, k)))
            .collect()
    }

    /// Marks `handles` as held (by an endpoint being enabled, or a region).
    /// `Inval`, holding nothing, if one of them is not live.
    pub fn acquire(&mut self, handles: &[FiAddr]) -> Result<()> {
        for &h in handles {
            self.get(h)?;
        }
        for &h in handles {
            if let Ok(s) = self.live_mut(h) {
                s.holders += 1;
            }
        }
        Ok(())
    }

    /// Gives back what [`acquire`](Self::acquire) took.
    pub fn release(&mut self, handles: &[FiAddr]) {
        for &h in handles {
            if let Ok(s) = self.live_mut(h) {
                s.holders = s.holders.saturating_sub(1);
            }
        }
    }

    /// Number of live keys.
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.key.is_some()).count()
    }

    /// True when no key is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn insert_lookup_remove() {
        let mut t = AuthKeyTable::default();
        assert_eq!(t.insert(b""), Err(Error::Inval));
        assert_eq!(t.insert(&[1; 65]), Err(Error::Inval));
        let a = t.insert(b"job-a").unwrap();
        let b = t.insert(b"job-b").unwrap();
        assert_ne!(a, b);
        assert_eq!(t.get(a).unwrap(), &AuthKey::new(b"job-a").unwrap());
        assert_eq!(t.get(99).err(), Some(Error::Inval));
        assert_eq!(t.len(), 2);
        t.acquire(&[a]).unwrap();
        assert_eq!(t.remove(a), Err(Error::Busy));
        t.release(&[a]);
        assert_eq!(t.remove(a), Ok(()));
        assert_eq!(t.remove(a), Err(Error::Inval), "removed twice");
        assert_eq!(t.get(a).err(), Some(Error::Inval));
        // A stale handle never names a later key.
        let c = t.insert(b"job-c").unwrap();
        assert_ne!(c, a);
        assert_eq!(t.snapshot().len(), 2);
        assert_eq!(t.acquire(&[b, a]), Err(Error::Inval));
        assert_eq!(t.remove(b), Ok(()), "a failed acquire holds nothing");
    }

    #[test]
    fn reported_handles_and_user_ids() {
        let mut t = AuthKeyTable::default();
        let a = t.insert(b"k").unwrap();
        assert_eq!(t.reported(a, false), a);
        assert_eq!(t.reported(a, true), FI_ADDR_NOTAVAIL);
        t.set_user_id(a, 77).unwrap();
        assert_eq!(t.reported(a, true), 77);
        assert_eq!(t.reported(5, false), FI_ADDR_NOTAVAIL);
        assert_eq!(t.set_user_id(5, 1), Err(Error::Inval));
    }

    #[test]
    fn bounded() {
        let mut t = AuthKeyTable::default();
        for _ in 0..MAX_AV_AUTH_KEYS {
            t.insert(b"k").unwrap();
        }
        assert_eq!(t.insert(b"k"), Err(Error::NoSpc));
    }
}
