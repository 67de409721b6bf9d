//! Which authorization keys an shm endpoint proves and accepts
//! (`docs/design.md`, "Authorization keys", shm).
//!
//! An endpoint holds its own key (`ep_attr.auth_key`, else the domain's)
//! or, on an `FI_AV_AUTH_KEY` domain, the keys its AV held when it was
//! enabled, until it closes (removing them is `Busy` meanwhile). A
//! sender names the key it proves in its claim by a **key id**, the first
//! 16 bytes of HMAC-SHA256 under the key over a label of its own: a
//! one-way function of the key, fixed per key, so the owner finds the
//! one key to verify with in a table instead of trying each.
//!
//! A message's sender as the matcher keeps it is its address and, on an
//! `FI_AV_AUTH_KEY` endpoint, the handle of the key its channel proved
//! ([`ident`]): the same address under another key is another peer.

use std::sync::{Arc, Mutex};

use weft_core::addr::FiAddr;
use weft_core::auth::{effective_key, AuthKey};
use weft_core::av::{AvTable, KeyLease};
use weft_core::{Error, Result};

/// Bytes of a key id.
pub const KEY_ID_LEN: usize = 16;
/// A key's id in claims.
pub type KeyId = [u8; KEY_ID_LEN];

/// Label of key ids (no transcript starts so).
const KEY_ID_LABEL: &[u8] = b"weft-shm-key-id-1";

/// The id of `key`: the first [`KEY_ID_LEN`] bytes of HMAC-SHA256 under
/// it over [`KEY_ID_LABEL`].
pub fn key_id(key: &AuthKey) -> Result<KeyId> {
    let t = key.prove_bytes(KEY_ID_LABEL)?;
    let mut id = [0u8; KEY_ID_LEN];
    id.copy_from_slice(&t[..KEY_ID_LEN]);
    Ok(id)
}

/// One key an endpoint holds: its AV handle (`None`: the endpoint's own
/// key), the key, and its id.
#[derive(Debug, Clone)]
pub struct HeldKey {
    pub handle: Option<FiAddr>,
    pub key: AuthKey,
    pub id: KeyId,
}

/// The keys of one endpoint.
#[derive(Debug)]
pub struct EpKeys {
    /// `FI_AV_AUTH_KEY`: the keys come from the AV, by handle.
    av_mode: bool,
    /// The own key (one, handle `None`) or the AV's keys.
    held: Vec<HeldKey>,
    /// The AV keys' hold, given back when the endpoint closes.
    lease: KeyLease,
}

impl EpKeys {
    /// The keys of an endpoint with `info`, bound to `av`: its own key, or
    /// on an `FI_AV_AUTH_KEY` domain every key of its AV, held (an own key
    /// there is `Inval`).
    pub fn for_endpoint(
        info: &weft_core::attr::Info,
        av: Option<&Arc<Mutex<AvTable>>>,
    ) -> Result<EpKeys> {
        let own = effective_key(
            info.ep_attr.auth_key.as_deref(),
            info.domain_attr.auth_key.as_deref(),
        )?;
        if !info.domain_attr.av_auth_key {
            return EpKeys::single(own);
        }
        if own.is_some() {
            return Err(Error::Inval);
        }
        let Some(av) = av else {
            return EpKeys::detached(Vec::new());
        };
        let (lease, keys) = KeyLease::take(av)?;
        let mut ep = EpKeys::detached(keys)?;
        ep.lease = lease;
        Ok(ep)
    }

    /// An endpoint's own key, or none.
    pub fn single(own: Option<AuthKey>) -> Result<EpKeys> {
        let held = match own {
            Some(key) => vec![HeldKey {
                handle: None,
                id: key_id(&key)?,
                key,
            }],
            None => Vec::new(),
        };
        Ok(EpKeys {
            av_mode: false,
            held,
            lease: KeyLease::default(),
        })
    }

    /// AV keys by handle, held by no AV (a judge without an endpoint: the
    /// fuzzing scan, tests).
    pub fn detached(keys: Vec<(FiAddr, AuthKey)>) -> Result<EpKeys> {
        let held = keys
            .into_iter()
            .map(|(h, key)| {
                Ok(HeldKey {
                    handle: Some(h),
                    id: key_id(&key)?,
                    key,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(EpKeys {
            av_mode: true,
            held,
            lease: KeyLease::default(),
        })
    }

    /// Whether every claim must prove a key.
    pub fn keyed(&self) -> bool {
        !self.held.is_empty()
    }

    /// Whether the endpoint takes its keys from its AV.
    pub fn av_mode(&self) -> bool {
        self.av_mode
    }

    /// Whether it holds the AV key of handle `h`.
    pub fn holds(&self, h: FiAddr) -> bool {
        self.held.iter().any(|k| k.handle == Some(h))
    }

    /// The key with id `id`, if held. Ids are public; what proves the key
    /// is the MAC checked after.
    pub fn by_id(&self, id: &KeyId) -> Option<&HeldKey> {
        self.held.iter().find(|k| &k.id == id)
    }

    /// Sender: the key handle to prove to an AV entry inserted under
    /// `entry_key` (`None`: the own key, or none). On an `FI_AV_AUTH_KEY`
    /// endpoint that holds keys, an entry under no key, or under a key
    /// the endpoint was not enabled with, is `NoKey`.
    pub fn for_dest(&self, entry_key: Option<FiAddr>) -> Result<Option<FiAddr>> {
        match entry_key {
            _ if !self.av_mode => Ok(None),
            None if self.held.is_empty() => Ok(None),
            Some(h) if self.holds(h) => Ok(Some(h)),
            _ => Err(Error::NoKey),
        }
    }

    /// The key a claim made for `proves` (from [`for_dest`](Self::for_dest),
    /// or the handle a peer's channel proved) shows.
    pub fn key_for(&self, proves: Option<FiAddr>) -> Option<&HeldKey> {
        if self.av_mode {
            let h = proves?;
            self.held.iter().find(|k| k.handle == Some(h))
        } else {
            self.held.first()
        }
    }

    /// Gives the AV's keys back (the endpoint closed).
    pub fn release(&self) {
        self.lease.release();
    }
}

/// Marks an address as a sender under a key handle: names never hold a
/// NUL byte, so the handle rides after one.
const KEY_MARK: u8 = 0;

/// A sender as the matcher keeps it: `addr`, and the AV key handle its
/// channel proved, if any.
pub fn ident(addr: &[u8], key: Option<u16>) -> Arc<[u8]> {
    match key {
        None => addr.into(),
        Some(k) => {
            let mut v = Vec::with_capacity(addr.len() + 3);
            v.extend_from_slice(addr);
            v.push(KEY_MARK);
            v.extend_from_slice(&k.to_le_bytes());
            v.into()
        }
    }
}

/// The address and key handle of an [`ident`].
pub fn split(id: &[u8]) -> (&[u8], Option<FiAddr>) {
    match id.len().checked_sub(3) {
        Some(at) if id[at] == KEY_MARK => {
            let k = u16::from_le_bytes([id[at + 1], id[at + 2]]);
            (&id[..at], Some(FiAddr::from(k)))
        }
        _ => (id, None),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn idents_round_trip() {
        let a = b"fi_shm://x-1";
        assert_eq!(split(&ident(a, None)), (&a[..], None));
        assert_eq!(split(&ident(a, Some(0))), (&a[..], Some(0)));
        assert_eq!(split(&ident(a, Some(513))), (&a[..], Some(513)));
        assert_eq!(split(b"ab"), (&b"ab"[..], None));
    }

    #[test]
    fn key_ids_are_per_key() {
        let a = AuthKey::new(b"job-a").unwrap();
        let b = AuthKey::new(b"job-b").unwrap();
        assert_eq!(key_id(&a).unwrap(), key_id(&a).unwrap());
        assert_ne!(key_id(&a).unwrap(), key_id(&b).unwrap());
        assert_ne!(&key_id(&a).unwrap()[..], &a.as_bytes()[..5]);
    }
}
