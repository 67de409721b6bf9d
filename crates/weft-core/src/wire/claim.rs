//! The payload of `Hello` and `Verify` (`docs/wire.md` §8.1–8.2): an
//! endpoint address and a nonce.
//!
//! A connecting RDM endpoint claims to be the endpoint listening at some
//! address. Taking that on trust let any local process receive another
//! endpoint's messages, or lock it out, by claiming its address first. So
//! the claim carries a fresh random nonce, and the acceptor asks the
//! claimed address, over a connection of its own, whether it made this
//! claim to this acceptor: only the endpoint really listening there can
//! say yes, and it says yes only for a nonce it sent to the address the
//! acceptor was reached at (a peer that learnt a nonce by being dialled
//! cannot reuse it elsewhere).

use std::io::Read;
use std::net::{IpAddr, SocketAddr};

use crate::addr::{decode_sockaddr, encode_sockaddr};
use crate::{Error, Result};

/// Bytes of a claim's nonce.
pub const NONCE_LEN: usize = 16;

/// A claim's nonce: random, used for one connection attempt.
pub type Nonce = [u8; NONCE_LEN];

/// An address and a nonce: in `Hello`, the claimant's listening address;
/// in `Verify`, the address the claimant dialled to reach the asker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// The address.
    pub addr: SocketAddr,
    /// The nonce.
    pub nonce: Nonce,
}

impl Claim {
    /// The payload: the address's sockaddr bytes, then the nonce.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = encode_sockaddr(&self.addr);
        v.extend_from_slice(&self.nonce);
        v
    }

    /// Parses a payload; anything but a sockaddr followed by exactly
    /// [`NONCE_LEN`] bytes is `Inval`.
    pub fn decode(b: &[u8]) -> Result<Claim> {
        let split = b.len().checked_sub(NONCE_LEN).ok_or(Error::Inval)?;
        let addr = decode_sockaddr(&b[..split])?;
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&b[split..]);
        Ok(Claim { addr, nonce })
    }
}

/// A fresh nonce from the kernel's random source.
pub fn fresh_nonce() -> Result<Nonce> {
    let mut n = [0u8; NONCE_LEN];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut n)?;
    Ok(n)
}

/// `a` with an IPv4-mapped IPv6 address written as IPv4, so that a
/// dual-stack socket's view and an IPv4 peer's view compare equal.
pub fn canonical(a: SocketAddr) -> SocketAddr {
    match a.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), a.port()),
            None => a,
        },
        IpAddr::V4(_) => a,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let c = Claim {
            addr: "192.0.2.10:4000".parse().unwrap_or_else(|_| unreachable!()),
            nonce: [7; NONCE_LEN],
        };
        let b = c.encode();
        assert_eq!(b.len(), 16 + NONCE_LEN);
        assert_eq!(Claim::decode(&b), Ok(c));
        assert_eq!(Claim::decode(&b[..b.len() - 1]), Err(Error::Inval));
        assert_eq!(Claim::decode(&b[..NONCE_LEN - 1]), Err(Error::Inval));
        let mut long = b.clone();
        long.push(0);
        assert!(Claim::decode(&long).is_err());
    }

    #[test]
    fn nonces_differ_and_mapped_addresses_compare_as_v4() {
        let (a, b) = (fresh_nonce(), fresh_nonce());
        assert!(a.is_ok() && b.is_ok());
        assert_ne!(a, b);
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:9"
            .parse()
            .unwrap_or_else(|_| unreachable!());
        let v4: SocketAddr = "127.0.0.1:9".parse().unwrap_or_else(|_| unreachable!());
        assert_eq!(canonical(mapped), v4);
        assert_eq!(canonical(v4), v4);
    }
}
