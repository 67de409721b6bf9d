//! Who sent a message, as completions report it: the AV entry of the
//! sender's address (on an `FI_AV_AUTH_KEY` endpoint, under the key its
//! connection proved), or for `FI_SOURCE_ERR` the sender itself.

use std::net::SocketAddr;

use weft_core::addr::{sockaddr_bytes, FiAddr, FI_ADDR_NOTAVAIL};
use weft_core::flags::AvFlags;
use weft_core::sync::lock;

use super::RdmShared;

/// Who sent a message: its endpoint address and the AV key handle its
/// connection proved (`FI_SOURCE_ERR` reports both for a sender not in
/// the AV).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sender {
    pub addr: SocketAddr,
    pub key: Option<u16>,
}

impl RdmShared {
    /// The AV handle of the peer at `peer` whose connection proved the
    /// AV key `key`, if the AV knows it: on an `FI_AV_AUTH_KEY` endpoint
    /// the entry of that address under that key, another key's being
    /// another peer.
    pub(crate) fn resolve_src(&self, peer: &SocketAddr, key: Option<u16>) -> FiAddr {
        let Some(av) = &self.cfg.av else {
            return FI_ADDR_NOTAVAIL;
        };
        let t = lock(av);
        let raw = sockaddr_bytes(peer);
        match self.keys.av_mode() {
            true => t.find_keyed(&raw, key.map(FiAddr::from)),
            false => t.find(&raw),
        }
        .unwrap_or(FI_ADDR_NOTAVAIL)
    }

    /// What an `FI_SOURCE_ERR` error entry reports as the source of a
    /// sender not in the AV whose connection proved the AV key `key`: its
    /// handle, or its user id on an AV opened with `FI_AV_USER_ID`;
    /// `FI_ADDR_NOTAVAIL` without a key.
    pub(crate) fn key_reported(&self, key: Option<u16>) -> FiAddr {
        match (&self.cfg.av, key) {
            (Some(av), Some(k)) => {
                let t = lock(av);
                let ids = t.flags().contains(AvFlags::AV_USER_ID);
                t.keys().reported(FiAddr::from(k), ids)
            }
            _ => FI_ADDR_NOTAVAIL,
        }
    }
}
