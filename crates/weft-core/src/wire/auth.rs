//! The payloads of the key-proof frames (`docs/wire.md` §8.6, §10.1):
//! `KeyChallenge` (the acceptor's nonce and MAC), `KeyProof` (the
//! connector's MAC), `KeyedHello` (a [`Claim`], as `Hello`, then the key
//! selector) and `KeyedConnReq` (the connector's nonce, the key selector,
//! then CM data). The MACs and selectors themselves are [`crate::auth`].

use crate::auth::{Selector, Tag, MAC_LEN, SELECTOR_LEN};
use crate::wire::claim::{Claim, Nonce, NONCE_LEN};
use crate::{Error, Result};

/// Bytes of a `KeyChallenge` payload: the acceptor's nonce, then its MAC.
pub const CHALLENGE_LEN: usize = NONCE_LEN + MAC_LEN;

/// Bytes of an accepting `KeyProof` payload (a refusal has none).
pub const PROOF_LEN: usize = MAC_LEN;

/// The acceptor's half: its nonce and its MAC over the transcript.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Challenge {
    /// The acceptor's nonce.
    pub nonce: Nonce,
    /// The acceptor's MAC (role: acceptor).
    pub mac: Tag,
}

impl Challenge {
    /// The payload: nonce, then MAC.
    pub fn encode(&self) -> [u8; CHALLENGE_LEN] {
        let mut b = [0u8; CHALLENGE_LEN];
        b[..NONCE_LEN].copy_from_slice(&self.nonce);
        b[NONCE_LEN..].copy_from_slice(&self.mac);
        b
    }

    /// Parses a payload of exactly [`CHALLENGE_LEN`] bytes; anything else
    /// is `KeyRejected` (no proof was given).
    pub fn decode(b: &[u8]) -> Result<Challenge> {
        if b.len() != CHALLENGE_LEN {
            return Err(Error::KeyRejected);
        }
        let mut c = Challenge {
            nonce: [0; NONCE_LEN],
            mac: [0; MAC_LEN],
        };
        c.nonce.copy_from_slice(&b[..NONCE_LEN]);
        c.mac.copy_from_slice(&b[NONCE_LEN..]);
        Ok(c)
    }
}

/// The connector's MAC from a `KeyProof` frame with status `status`
/// (its header's `data`): `KeyRejected` if the connector refused (status
/// not 0) or the payload is not exactly [`PROOF_LEN`] bytes.
pub fn decode_proof(status: u64, b: &[u8]) -> Result<Tag> {
    if status != 0 || b.len() != PROOF_LEN {
        return Err(Error::KeyRejected);
    }
    let mut t = [0u8; MAC_LEN];
    t.copy_from_slice(b);
    Ok(t)
}

/// A `KeyedHello` payload: the claim, then the key selector.
pub fn encode_keyed_hello(claim: &Claim, sel: &Selector) -> Vec<u8> {
    let mut v = claim.encode();
    v.extend_from_slice(sel);
    v
}

/// Splits a `KeyedHello` payload into the claim and the selector; a
/// payload too short for a selector is `KeyRejected`, a bad claim `Inval`.
pub fn decode_keyed_hello(b: &[u8]) -> Result<(Claim, Selector)> {
    let split = b
        .len()
        .checked_sub(SELECTOR_LEN)
        .ok_or(Error::KeyRejected)?;
    let claim = Claim::decode(&b[..split])?;
    let mut sel = [0u8; SELECTOR_LEN];
    sel.copy_from_slice(&b[split..]);
    Ok((claim, sel))
}

/// Bytes in front of the CM data of a `KeyedConnReq`.
pub const CONN_REQ_PREFIX: usize = NONCE_LEN + SELECTOR_LEN;

/// A `KeyedConnReq` payload: the connector's nonce, the key selector,
/// then the CM data.
pub fn encode_conn_req(nonce: &Nonce, sel: &Selector, cm: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(CONN_REQ_PREFIX + cm.len());
    v.extend_from_slice(nonce);
    v.extend_from_slice(sel);
    v.extend_from_slice(cm);
    v
}

/// Splits a `KeyedConnReq` payload into the nonce, the selector and the
/// CM data; shorter than nonce and selector is `KeyRejected`.
pub fn decode_conn_req(b: &[u8]) -> Result<(Nonce, Selector, &[u8])> {
    if b.len() < CONN_REQ_PREFIX {
        return Err(Error::KeyRejected);
    }
    let mut n = [0u8; NONCE_LEN];
    n.copy_from_slice(&b[..NONCE_LEN]);
    let mut sel = [0u8; SELECTOR_LEN];
    sel.copy_from_slice(&b[NONCE_LEN..CONN_REQ_PREFIX]);
    Ok((n, sel, &b[CONN_REQ_PREFIX..]))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn challenge_round_trip_and_exact_size() {
        let c = Challenge {
            nonce: [3; NONCE_LEN],
            mac: [4; MAC_LEN],
        };
        let b = c.encode();
        assert_eq!(&b[..NONCE_LEN], &[3; NONCE_LEN]);
        assert_eq!(Challenge::decode(&b), Ok(c));
        assert_eq!(
            Challenge::decode(&b[..CHALLENGE_LEN - 1]),
            Err(Error::KeyRejected)
        );
        let mut long = b.to_vec();
        long.push(0);
        assert_eq!(Challenge::decode(&long), Err(Error::KeyRejected));
    }

    #[test]
    fn proofs_and_requests() {
        assert_eq!(decode_proof(0, &[5; PROOF_LEN]), Ok([5; MAC_LEN]));
        assert_eq!(decode_proof(129, &[]), Err(Error::KeyRejected));
        assert_eq!(decode_proof(129, &[5; PROOF_LEN]), Err(Error::KeyRejected));
        assert_eq!(
            decode_proof(0, &[5; PROOF_LEN - 1]),
            Err(Error::KeyRejected)
        );
        assert_eq!(decode_proof(0, &[]), Err(Error::KeyRejected));
        let b = encode_conn_req(&[6; NONCE_LEN], &[7; SELECTOR_LEN], b"cm");
        assert_eq!(
            decode_conn_req(&b),
            Ok(([6; NONCE_LEN], [7; SELECTOR_LEN], &b"cm"[..]))
        );
        assert_eq!(
            decode_conn_req(&b[..CONN_REQ_PREFIX]),
            Ok(([6; NONCE_LEN], [7; SELECTOR_LEN], &[][..]))
        );
        assert_eq!(
            decode_conn_req(&b[..CONN_REQ_PREFIX - 1]),
            Err(Error::KeyRejected)
        );
    }

    #[test]
    fn keyed_hellos() {
        let claim = Claim {
            addr: "127.0.0.1:7000".parse().unwrap(),
            nonce: [1; NONCE_LEN],
        };
        let b = encode_keyed_hello(&claim, &[9; SELECTOR_LEN]);
        assert_eq!(decode_keyed_hello(&b), Ok((claim, [9; SELECTOR_LEN])));
        assert_eq!(
            decode_keyed_hello(&b[..SELECTOR_LEN - 1]),
            Err(Error::KeyRejected)
        );
        assert_eq!(decode_keyed_hello(&b[..b.len() - 1]), Err(Error::Inval));
    }
}
