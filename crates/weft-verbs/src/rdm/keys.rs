//! Which keys an RDM endpoint proves and takes: its own (`ep_attr`, else
//! the domain's), or on an `FI_AV_AUTH_KEY` domain every key its AV held
//! when it was enabled, held until it closes (removing one is `Busy`
//! meanwhile; `docs/design.md`, "Authorization keys", verbs).
//!
//! Each key is a *lane* ([`super::lanes`]): lane 0 serves the endpoint's
//! own key (or none), lane `1 + i` the `i`-th held AV key, and the gate
//! holds the AV keys in that order, so the index a proof's verdict names
//! is the lane's.

use std::sync::{Arc, Mutex};

use weft_core::addr::FiAddr;
use weft_core::attr::Info;
use weft_core::auth::{effective_key, AuthKey};
use weft_core::av::{AvTable, KeyLease};
use weft_core::{Error, Result};

/// The keys of one RDM endpoint.
#[derive(Debug)]
pub(crate) struct RdmKeys {
    own: Option<AuthKey>,
    /// `FI_AV_AUTH_KEY`: keys come from the AV, by handle.
    av_mode: bool,
    /// The AV keys held, in lane order (lane `1 + i`).
    held: Vec<(FiAddr, AuthKey)>,
    /// The AV keys' hold, given back when the endpoint closes.
    lease: KeyLease,
}

impl RdmKeys {
    /// The keys of an RDM endpoint with `info`, bound to `av`. On an
    /// `FI_AV_AUTH_KEY` domain it takes and holds every key of its AV and
    /// may carry none of its own (`Inval`).
    pub(crate) fn for_endpoint(info: &Info, av: Option<&Arc<Mutex<AvTable>>>) -> Result<RdmKeys> {
        let own = effective_key(
            info.ep_attr.auth_key.as_deref(),
            info.domain_attr.auth_key.as_deref(),
        )?;
        let mut k = RdmKeys {
            own,
            av_mode: info.domain_attr.av_auth_key,
            held: Vec::new(),
            lease: KeyLease::default(),
        };
        if !k.av_mode {
            return Ok(k);
        }
        if k.own.is_some() {
            return Err(Error::Inval);
        }
        if let Some(av) = av {
            (k.lease, k.held) = KeyLease::take(av)?;
        }
        Ok(k)
    }

    /// Whether the endpoint takes its keys from its AV.
    pub(crate) fn av_mode(&self) -> bool {
        self.av_mode
    }

    /// Lanes the endpoint may use: its own key's, then one per held key.
    pub(crate) fn lanes(&self) -> usize {
        1 + self.held.len()
    }

    /// What its gate takes, in lane order from lane 0 (own key) or lane 1
    /// (AV keys).
    pub(crate) fn gate_keys(&self) -> Vec<AuthKey> {
        if self.av_mode {
            self.held.iter().map(|(_, k)| k.clone()).collect()
        } else {
            self.own.iter().cloned().collect()
        }
    }

    /// The lane of the gate's key `i` (as a proof's verdict names it).
    pub(crate) fn lane_of_proven(&self, i: usize) -> usize {
        if self.av_mode {
            1 + i
        } else {
            0
        }
    }

    /// The key lane `lane` proves, if any.
    pub(crate) fn key_of(&self, lane: usize) -> Option<&AuthKey> {
        match lane {
            0 => self.own.as_ref(),
            n => self.held.get(n - 1).map(|(_, k)| k),
        }
    }

    /// The AV key handle of lane `lane` (`None`: lane 0).
    pub(crate) fn handle_of(&self, lane: usize) -> Option<FiAddr> {
        lane.checked_sub(1)
            .and_then(|i| self.held.get(i))
            .map(|(h, _)| *h)
    }

    /// The lane that reaches an AV entry inserted under `entry_key`. On
    /// an `FI_AV_AUTH_KEY` endpoint that holds keys, an entry under no
    /// key, or under one it was not enabled with, is `NoKey`: an endpoint
    /// holding keys never talks unkeyed.
    pub(crate) fn lane_for_dest(&self, entry_key: Option<FiAddr>) -> Result<usize> {
        if !self.av_mode {
            return Ok(0);
        }
        match entry_key {
            None if self.held.is_empty() => Ok(0),
            None => Err(Error::NoKey),
            Some(h) => self
                .held
                .iter()
                .position(|(k, _)| *k == h)
                .map(|i| 1 + i)
                .ok_or(Error::NoKey),
        }
    }

    /// Whether it holds the AV key of handle `h`.
    pub(crate) fn holds(&self, h: FiAddr) -> bool {
        self.held.iter().any(|(k, _)| *k == h)
    }

    /// Gives the AV's keys back (the endpoint closed).
    pub(crate) fn release(&self) {
        self.lease.release();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use weft_core::av::AvAttr;
    use weft_core::sync::lock;

    fn av_with(keys: &[&[u8]]) -> (Arc<Mutex<AvTable>>, Vec<FiAddr>) {
        let mut t = AvTable::open(&AvAttr::default()).unwrap();
        let hs = keys
            .iter()
            .map(|k| t.keys_mut().insert(k).unwrap())
            .collect();
        (Arc::new(Mutex::new(t)), hs)
    }

    #[test]
    fn av_keys_are_lanes_held_until_release() {
        let (av, hs) = av_with(&[b"job-a", b"job-b"]);
        let mut info = Info::default();
        info.domain_attr.av_auth_key = true;
        let k = RdmKeys::for_endpoint(&info, Some(&av)).unwrap();
        assert!(k.av_mode());
        assert_eq!(k.lanes(), 3);
        assert_eq!(k.gate_keys().len(), 2);
        assert_eq!(k.lane_of_proven(1), 2);
        assert_eq!(k.handle_of(2), Some(hs[1]));
        assert_eq!(k.handle_of(0), None);
        assert_eq!(k.key_of(1).unwrap().as_bytes(), b"job-a");
        assert_eq!(k.lane_for_dest(Some(hs[0])), Ok(1));
        assert_eq!(k.lane_for_dest(None), Err(Error::NoKey));
        assert_eq!(k.lane_for_dest(Some(77)), Err(Error::NoKey));
        assert!(k.holds(hs[1]) && !k.holds(77));
        // A later key is not held.
        let later = lock(&av).keys_mut().insert(b"job-c").unwrap();
        assert_eq!(k.lane_for_dest(Some(later)), Err(Error::NoKey));
        assert_eq!(lock(&av).keys_mut().remove(hs[0]), Err(Error::Busy));
        assert_eq!(lock(&av).keys_mut().remove(later), Ok(()));
        drop(k);
        assert_eq!(lock(&av).keys_mut().remove(hs[0]), Ok(()));
    }

    #[test]
    fn own_keys_and_keyless_av_endpoints_use_lane_zero() {
        let mut info = Info::default();
        info.ep_attr.auth_key = Some(b"mine".to_vec());
        let k = RdmKeys::for_endpoint(&info, None).unwrap();
        assert_eq!((k.lanes(), k.lane_of_proven(0)), (1, 0));
        assert_eq!(k.lane_for_dest(Some(3)), Ok(0));
        assert_eq!(k.key_of(0).unwrap().as_bytes(), b"mine");
        info.domain_attr.av_auth_key = true;
        assert_eq!(RdmKeys::for_endpoint(&info, None).err(), Some(Error::Inval));
        info.ep_attr.auth_key = None;
        let (av, _) = av_with(&[]);
        let k = RdmKeys::for_endpoint(&info, Some(&av)).unwrap();
        assert_eq!(k.lane_for_dest(None), Ok(0));
        assert!(k.gate_keys().is_empty() && k.key_of(0).is_none());
    }
}
