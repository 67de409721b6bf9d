//! Which authorization keys an endpoint proves and accepts, and what a
//! connection proved (`docs/design.md`, "Authorization keys").
//!
//! An endpoint holds its own key (`ep_attr.auth_key`, else the domain's),
//! or, on an `FI_AV_AUTH_KEY` domain, the keys its AV held when it was
//! enabled. A connector names the key it will prove with a selector
//! (`AuthKey::selector`), so an acceptor holding several knows which one
//! to prove back; a connection then carries the key it proved, which
//! decides who its messages are from (the AV entry of that address under
//! that key) and which memory regions it may touch.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use weft_core::addr::FiAddr;
use weft_core::attr::EpType;
use weft_core::attr::Info;
use weft_core::auth::{effective_key, AuthKey, Selector};
use weft_core::av::{AvTable, KeyLease};
use weft_core::wire::claim::Nonce;
use weft_core::{Error, Result};

/// A peer as matching and AV lookups know it: its address and, on an
/// `FI_AV_AUTH_KEY` endpoint, the handle of the key its connection proved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Source {
    /// The peer's listening address (RDM) or socket address (MSG).
    pub addr: SocketAddr,
    /// The AV key handle the connection proved.
    pub key: Option<FiAddr>,
}

impl Source {
    /// A peer known by its address alone.
    pub fn plain(addr: SocketAddr) -> Source {
        Source { addr, key: None }
    }
}

/// What a connection proved at set-up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnAuth {
    /// The key both sides proved (`None`: an unkeyed connection).
    pub key: Option<AuthKey>,
    /// Its AV key handle, on an `FI_AV_AUTH_KEY` endpoint.
    pub av_key: Option<FiAddr>,
}

/// The keys of one endpoint (or passive endpoint).
#[derive(Debug)]
pub struct EpKeys {
    own: Option<AuthKey>,
    /// `FI_AV_AUTH_KEY`: the AV's keys when the endpoint was enabled.
    av_mode: bool,
    av: Vec<(FiAddr, AuthKey)>,
    /// The AV keys' hold, given back when the endpoint closes.
    lease: KeyLease,
}

impl EpKeys {
    /// One key or none (passive endpoints, MSG endpoints).
    pub fn single(own: Option<AuthKey>) -> EpKeys {
        EpKeys::with(own, false, Vec::new(), KeyLease::default())
    }

    /// An endpoint's own key, or (`av_mode`) the AV keys `av` held on
    /// `lease` until [`release`](Self::release).
    fn with(
        own: Option<AuthKey>,
        av_mode: bool,
        av: Vec<(FiAddr, AuthKey)>,
        lease: KeyLease,
    ) -> EpKeys {
        EpKeys {
            own,
            av_mode,
            av,
            lease,
        }
    }

    /// The keys of an endpoint with `info`, bound to `av`. On an
    /// `FI_AV_AUTH_KEY` domain an RDM endpoint takes (and holds) every
    /// key of its AV and may not carry a key of its own (`Inval`).
    pub fn for_endpoint(info: &Info, av: Option<&Arc<Mutex<AvTable>>>) -> Result<EpKeys> {
        let own = effective_key(
            info.ep_attr.auth_key.as_deref(),
            info.domain_attr.auth_key.as_deref(),
        )?;
        if !(info.domain_attr.av_auth_key && info.ep_attr.ep_type == EpType::Rdm) {
            return Ok(EpKeys::single(own));
        }
        if own.is_some() {
            return Err(Error::Inval);
        }
        let Some(av) = av else {
            return Ok(EpKeys::with(None, true, Vec::new(), KeyLease::default()));
        };
        let (lease, keys) = KeyLease::take(av)?;
        Ok(EpKeys::with(None, true, keys, lease))
    }

    /// Whether every connection must prove a key.
    pub fn keyed(&self) -> bool {
        self.own.is_some() || !self.av.is_empty()
    }

    /// Connector: the key to prove to an AV entry inserted under
    /// `entry_key`. On an `FI_AV_AUTH_KEY` endpoint that holds keys, an
    /// entry under no key, or under a key inserted after the endpoint was
    /// enabled, is `NoKey`.
    pub fn for_dest(&self, entry_key: Option<FiAddr>) -> Result<ConnAuth> {
        if !self.av_mode {
            return Ok(ConnAuth {
                key: self.own.clone(),
                av_key: None,
            });
        }
        match entry_key {
            None if self.av.is_empty() => Ok(ConnAuth::default()),
            None => Err(Error::NoKey),
            Some(h) => self
                .av
                .iter()
                .find(|(k, _)| *k == h)
                .map(|(_, key)| ConnAuth {
                    key: Some(key.clone()),
                    av_key: Some(h),
                })
                .ok_or(Error::NoKey),
        }
    }

    /// Whether the endpoint holds the AV key of handle `h`.
    pub fn holds(&self, h: FiAddr) -> bool {
        self.av.iter().any(|(k, _)| *k == h)
    }

    /// Whether [`for_dest`](Self::for_dest) would find a key for an entry
    /// under `entry_key` (`NoKey` if not), without building one: the send
    /// path checks this on every message.
    pub fn check_dest(&self, entry_key: Option<FiAddr>) -> Result<()> {
        match entry_key {
            _ if !self.av_mode => Ok(()),
            None if self.av.is_empty() => Ok(()),
            Some(h) if self.holds(h) => Ok(()),
            _ => Err(Error::NoKey),
        }
    }

    /// Acceptor: the key a keyed connector's selector names, if this
    /// endpoint holds it.
    pub fn for_selector(&self, nonce: &Nonce, sel: &Selector) -> Option<ConnAuth> {
        if let Some(k) = &self.own {
            return k.selects(nonce, sel).then(|| ConnAuth {
                key: Some(k.clone()),
                av_key: None,
            });
        }
        self.av
            .iter()
            .find(|(_, k)| k.selects(nonce, sel))
            .map(|(h, k)| ConnAuth {
                key: Some(k.clone()),
                av_key: Some(*h),
            })
    }

    /// Gives the AV's keys back (the endpoint closed): removing them is
    /// no longer `Busy` on its account.
    pub fn release(&self) {
        self.lease.release();
    }
}
