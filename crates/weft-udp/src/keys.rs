//! Which authorization keys a DGRAM endpoint proves and accepts
//! (`docs/design.md`, "Authorization keys", udp DGRAM).
//!
//! An endpoint holds its own key (`ep_attr.auth_key`, else the domain's)
//! and proves it in every datagram, or, on an `FI_AV_AUTH_KEY` domain,
//! the keys its AV held when it was enabled: a datagram to an AV entry is
//! sealed with that entry's key and names it by its identifier
//! (`weft_core::dgram_auth::NamedKeys`), and an arriving one is checked
//! against the held key it names, which then decides who it is from (the
//! AV entry of its address under that key).

use std::sync::{Arc, Mutex};

use weft_core::addr::FiAddr;
use weft_core::auth::effective_key;
use weft_core::av::AvTable;
use weft_core::dgram_auth::{AddrBytes, DgramKey, NamedKeys, ID_TRAILER_LEN, TRAILER_LEN};
use weft_core::provider::EpConfig;
use weft_core::sync::lock;
use weft_core::{Error, Result};

use crate::wire::Header;

/// How an endpoint's datagrams prove keys.
#[derive(Debug)]
enum Mode {
    /// No key: datagrams prove nothing, and keyed ones are refused.
    None,
    /// One key, proven by every datagram without naming it.
    Own(DgramKey),
    /// An AV's keys (at least one): each datagram names the key it proves.
    Av(NamedKeys),
}

/// The keys of one endpoint.
#[derive(Debug)]
pub struct EpKeys {
    mode: Mode,
    /// `FI_AV_AUTH_KEY`: entries name their keys, and the endpoint sends
    /// only through entries under a key it holds (when it holds any).
    av_mode: bool,
    /// The AV whose keys are held (`Busy` to remove) until
    /// [`release`](Self::release).
    lease: Mutex<Option<Arc<Mutex<AvTable>>>>,
}

/// The key a datagram to one AV entry is sealed with.
#[derive(Debug, Clone, Copy)]
pub enum Seal<'a> {
    /// Unkeyed.
    None,
    /// The endpoint's own key.
    Own(&'a DgramKey),
    /// An AV key, named in the trailer.
    Named(&'a DgramKey),
}

/// What a keyed datagram proved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proof {
    /// Its sequence number, for the replay window.
    pub seq: u64,
    /// The AV key handle it proved (`FI_AV_AUTH_KEY` endpoints).
    pub key: Option<FiAddr>,
}

impl EpKeys {
    /// The keys of an endpoint of `cfg`. `raw` (`FI_EP_SOCK_DGRAM`) has
    /// no room for a proof: a key, or an `FI_AV_AUTH_KEY` domain, is
    /// `OpNotSupp`.
    /// On an `FI_AV_AUTH_KEY` domain a DGRAM endpoint takes (and holds)
    /// every key its AV has now and may not carry a key of its own
    /// (`Inval`).
    pub fn for_endpoint(cfg: &EpConfig, raw: bool) -> Result<EpKeys> {
        let info = &cfg.info;
        let own = effective_key(
            info.ep_attr.auth_key.as_deref(),
            info.domain_attr.auth_key.as_deref(),
        )?;
        let unleased = |mode, av_mode| EpKeys {
            mode,
            av_mode,
            lease: Mutex::new(None),
        };
        if raw && info.domain_attr.av_auth_key {
            // The domain's endpoints prove keys; this one could not.
            return Err(Error::OpNotSupp);
        }
        if raw || !info.domain_attr.av_auth_key {
            return match own {
                Some(_) if raw => Err(Error::OpNotSupp),
                Some(k) => Ok(unleased(Mode::Own(DgramKey::new(&k)?), false)),
                None => Ok(unleased(Mode::None, false)),
            };
        }
        if own.is_some() {
            return Err(Error::Inval);
        }
        let Some(av) = &cfg.av else {
            return Ok(unleased(Mode::None, true));
        };
        let mut t = lock(av);
        let keys = t.keys().snapshot();
        if keys.is_empty() {
            return Ok(unleased(Mode::None, true));
        }
        let named = NamedKeys::new(&keys)?;
        let handles: Vec<FiAddr> = named.handles().collect();
        t.keys_mut().acquire(&handles)?;
        Ok(EpKeys {
            mode: Mode::Av(named),
            av_mode: true,
            lease: Mutex::new(Some(av.clone())),
        })
    }

    /// Whether datagrams carry a trailer.
    pub fn keyed(&self) -> bool {
        !matches!(self.mode, Mode::None)
    }

    /// Bytes of the trailer every datagram sent carries.
    pub fn trailer_len(&self) -> usize {
        match self.mode {
            Mode::None => 0,
            Mode::Own(_) => TRAILER_LEN,
            Mode::Av(_) => ID_TRAILER_LEN,
        }
    }

    /// The key a datagram to an AV entry under `entry_key` is sealed
    /// with. On an `FI_AV_AUTH_KEY` endpoint that holds keys, an entry
    /// under no key, or under a key inserted after the endpoint was
    /// enabled, is `NoKey`: such an endpoint never sends unkeyed.
    pub fn for_dest(&self, entry_key: Option<FiAddr>) -> Result<Seal<'_>> {
        match (&self.mode, entry_key) {
            (Mode::None, None) => Ok(Seal::None),
            (Mode::Own(k), _) => Ok(Seal::Own(k)),
            (Mode::Av(keys), Some(h)) => keys.get(h).map(Seal::Named).ok_or(Error::NoKey),
            // An entry under a key the endpoint does not hold (it held
            // none when it was enabled), or under none where keys are held.
            (Mode::None, Some(_)) | (Mode::Av(_), None) => Err(Error::NoKey),
        }
    }

    /// Whether the endpoint takes the `FI_AUTH_KEY` flag on receives
    /// (its domain keeps keys in the AV).
    pub fn av_mode(&self) -> bool {
        self.av_mode
    }

    /// Whether the endpoint holds the AV key of handle `h`.
    pub fn holds(&self, h: FiAddr) -> bool {
        matches!(&self.mode, Mode::Av(k) if k.get(h).is_some())
    }

    /// Checks a well-formed datagram with header `h` (its bytes
    /// `header`) from `ends.0` to `ends.1`: `Ok(None)` for an unkeyed one
    /// at an unkeyed endpoint, the proof of a keyed one whose trailer
    /// proves a key held here in the form this endpoint speaks, else
    /// `KeyRejected`.
    pub fn check(
        &self,
        h: &Header,
        ends: (&AddrBytes, &AddrBytes),
        header: &[u8],
        payload: &[u8],
        trailer: &[u8],
    ) -> Result<Option<Proof>> {
        let rejected = Err(Error::KeyRejected);
        match (&self.mode, h.keyed, h.named) {
            (Mode::None, false, _) => Ok(None),
            (Mode::Own(k), true, false) => k
                .open(ends.0, ends.1, header, payload, trailer)
                .map(|seq| Some(Proof { seq, key: None })),
            (Mode::Av(keys), true, true) => {
                keys.open(ends, header, payload, trailer).map(|(key, seq)| {
                    Some(Proof {
                        seq,
                        key: Some(key),
                    })
                })
            }
            _ => rejected,
        }
    }

    /// Gives the AV's keys back (the endpoint closed): removing them is
    /// no longer `Busy` on its account.
    pub fn release(&self) {
        if let (Some(av), Mode::Av(keys)) = (lock(&self.lease).take(), &self.mode) {
            let handles: Vec<FiAddr> = keys.handles().collect();
            lock(&av).keys_mut().release(&handles);
        }
    }
}

impl Drop for EpKeys {
    fn drop(&mut self) {
        self.release();
    }
}
