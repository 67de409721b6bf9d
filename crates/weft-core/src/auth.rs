//! Authorization keys (`ep_attr.auth_key`, `domain_attr.auth_key`): the
//! rules a key must meet, and the proof two endpoints give each other
//! that they hold the same key without sending it (`docs/wire.md` §8.6
//! and §10.1, `docs/design.md` "Authorization keys").
//!
//! Each side of a connection chooses a fresh nonce and proves the key with
//! HMAC-SHA256 over a [`Transcript`]: both nonces, both endpoints'
//! addresses, the kind of connection and which side speaks. The peer
//! recomputes the MAC and compares in constant time. A MAC is good for
//! exactly one connection attempt in one direction: the nonce the verifier
//! chose itself makes an old MAC (a replay) useless, and the role byte
//! keeps an acceptor's MAC from passing as a connector's.

use std::fmt;
use std::net::SocketAddr;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::addr::encode_sockaddr;
use crate::wire::claim::{canonical, Nonce, NONCE_LEN};
use crate::{Error, Result};

/// Bytes of a MAC (HMAC-SHA256).
pub const MAC_LEN: usize = 32;

/// A MAC over a [`Transcript`].
pub type Tag = [u8; MAC_LEN];

/// Bytes of a short MAC: the first 128 bits of a whole one (RFC 2104
/// section 5 truncation, as RFC 4868's HMAC-SHA-256-128), for channels
/// too small for 32 bytes (rdma_cm connect private data: 56).
pub const SHORT_MAC_LEN: usize = 16;

/// Shortest key the tcp provider takes.
pub const MIN_KEY_LEN: usize = 1;

/// Longest key the tcp provider takes. HMAC-SHA256 hashes longer keys
/// down to 32 bytes anyway; 64 is the hash's block size, the longest key
/// HMAC uses as given.
pub const MAX_KEY_LEN: usize = 64;

/// Bytes of a key selector ([`AuthKey::selector`]).
pub const SELECTOR_LEN: usize = 16;

/// A key selector.
pub type Selector = [u8; SELECTOR_LEN];

/// Label of key selectors, distinct from the transcript's.
const SELECTOR_LABEL: &[u8] = b"weft-auth-1 key selector";

/// Label that starts every transcript, so these MACs cannot be confused
/// with any other use of the same key.
const LABEL: &[u8] = b"weft-auth-1";

/// Checks a key's size: [`MIN_KEY_LEN`]`..=`[`MAX_KEY_LEN`] bytes, else
/// `Inval` (an empty key is a mistake, not "no key": no key is `None`).
pub fn check_key(key: &[u8]) -> Result<()> {
    if (MIN_KEY_LEN..=MAX_KEY_LEN).contains(&key.len()) {
        Ok(())
    } else {
        Err(Error::Inval)
    }
}

/// The key an endpoint uses: its own `ep_attr.auth_key`, else its domain's
/// `domain_attr.auth_key` (fi_endpoint(3): the domain key is the default).
/// A key of the wrong size is `Inval`.
pub fn effective_key(ep: Option<&[u8]>, domain: Option<&[u8]>) -> Result<Option<AuthKey>> {
    if let Some(d) = domain {
        check_key(d)?;
    }
    ep.or(domain).map(AuthKey::new).transpose()
}

/// A checked authorization key. Its `Debug` form does not show the key.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthKey(Vec<u8>);

impl AuthKey {
    /// A key of [`MIN_KEY_LEN`]`..=`[`MAX_KEY_LEN`] bytes, else `Inval`.
    pub fn new(key: &[u8]) -> Result<AuthKey> {
        check_key(key)?;
        Ok(AuthKey(key.to_vec()))
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The selector a connector sends with its nonce so that an acceptor
    /// holding several keys (`FI_AV_AUTH_KEY`) knows which one to prove:
    /// the first [`SELECTOR_LEN`] bytes of HMAC-SHA256 over a label of its
    /// own and the connector's nonce. Fresh with every nonce, so it tells
    /// a listener without the key nothing it can reuse or link.
    pub fn selector(&self, connector_nonce: &Nonce) -> Result<Selector> {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.0).map_err(|_| Error::Inval)?;
        m.update(SELECTOR_LABEL);
        m.update(connector_nonce);
        let full = m.finalize().into_bytes();
        let mut sel = [0u8; SELECTOR_LEN];
        sel.copy_from_slice(full.get(..SELECTOR_LEN).ok_or(Error::Inval)?);
        Ok(sel)
    }

    /// Whether `sel` is this key's selector for `connector_nonce`
    /// (compared in constant time).
    pub fn selects(&self, connector_nonce: &Nonce, sel: &[u8]) -> bool {
        let Ok(mut m) = Hmac::<Sha256>::new_from_slice(&self.0) else {
            return false;
        };
        m.update(SELECTOR_LABEL);
        m.update(connector_nonce);
        m.verify_truncated_left(sel).is_ok() && sel.len() == SELECTOR_LEN
    }

    /// This key's MAC of a transcript built by the caller, for channels
    /// whose peers are not socket addresses (shm). The transcript must
    /// begin with a label of the caller's own that no other transcript
    /// begins with (not `weft-auth-1`), and bind both nonces and the role.
    pub fn prove_bytes(&self, transcript: &[u8]) -> Result<Tag> {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.0).map_err(|_| Error::Inval)?;
        m.update(transcript);
        let mut tag = [0u8; MAC_LEN];
        tag.copy_from_slice(&m.finalize().into_bytes());
        Ok(tag)
    }

    /// Checks a whole MAC made by [`prove_bytes`](Self::prove_bytes), in
    /// constant time; `KeyRejected` otherwise.
    pub fn verify_bytes(&self, transcript: &[u8], tag: &[u8]) -> Result<()> {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.0).map_err(|_| Error::KeyRejected)?;
        m.update(transcript);
        m.verify_slice(tag).map_err(|_| Error::KeyRejected)
    }

    fn mac(&self, t: &Transcript, role: Role, extra: &[u8]) -> Result<Hmac<Sha256>> {
        // Any key length is accepted by HMAC; the error cannot occur for
        // the sizes `new` lets through, but is not worth a panic.
        let mut m = Hmac::<Sha256>::new_from_slice(&self.0).map_err(|_| Error::Inval)?;
        m.update(&t.bytes(role));
        m.update(extra);
        Ok(m)
    }

    /// This side's MAC of `t` as `role`.
    pub fn prove(&self, t: &Transcript, role: Role) -> Result<Tag> {
        self.prove_with(t, role, &[])
    }

    /// Checks the peer's MAC of `t` as `role`, in constant time.
    /// `KeyRejected` if it is not the MAC this key gives: the peer holds
    /// another key, or none, or the MAC was not made for this transcript.
    pub fn verify(&self, t: &Transcript, role: Role, tag: &[u8]) -> Result<()> {
        self.verify_with(t, role, &[], tag)
    }

    /// This side's MAC of `t` as `role` followed by `extra`: what a
    /// channel binds beyond the transcript (a label of its own, so its
    /// MACs are never valid on another channel, and data the peer must
    /// not be able to change). With `extra` empty this is [`prove`](Self::prove).
    pub fn prove_with(&self, t: &Transcript, role: Role, extra: &[u8]) -> Result<Tag> {
        let mut tag = [0u8; MAC_LEN];
        tag.copy_from_slice(&self.mac(t, role, extra)?.finalize().into_bytes());
        Ok(tag)
    }

    /// Checks a whole ([`MAC_LEN`]-byte) MAC made by
    /// [`prove_with`](Self::prove_with), in constant time; `KeyRejected`
    /// otherwise.
    pub fn verify_with(&self, t: &Transcript, role: Role, extra: &[u8], tag: &[u8]) -> Result<()> {
        self.mac(t, role, extra)?
            .verify_slice(tag)
            .map_err(|_| Error::KeyRejected)
    }

    /// Checks a short MAC: exactly the first [`SHORT_MAC_LEN`] bytes of
    /// [`prove_with`](Self::prove_with)'s, compared in constant time. Any
    /// other length is `KeyRejected`, so a peer cannot shorten the MAC it
    /// has to guess.
    pub fn verify_short_with(
        &self,
        t: &Transcript,
        role: Role,
        extra: &[u8],
        tag: &[u8],
    ) -> Result<()> {
        if tag.len() != SHORT_MAC_LEN {
            return Err(Error::KeyRejected);
        }
        self.mac(t, role, extra)?
            .verify_truncated_left(tag)
            .map_err(|_| Error::KeyRejected)
    }
}

impl fmt::Debug for AuthKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AuthKey({} bytes)", self.0.len())
    }
}

/// What kind of connection a transcript is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ConnKind {
    /// An RDM connection (`KeyedHello`).
    Rdm = 1,
    /// An MSG connection (`KeyedConnReq`).
    Msg = 2,
}

/// Which side of the connection makes a MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Role {
    /// The side that accepted the connection (its MAC is in
    /// `KeyChallenge`).
    Acceptor = 1,
    /// The side that opened the connection (its MAC is in `KeyProof`).
    Connector = 2,
}

/// What both sides' MACs cover: everything that makes one connection
/// attempt unlike any other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transcript {
    /// RDM or MSG.
    pub kind: ConnKind,
    /// The connector's nonce (in `KeyedHello` / `KeyedConnReq`).
    pub connector_nonce: Nonce,
    /// The acceptor's nonce (in `KeyChallenge`).
    pub acceptor_nonce: Nonce,
    /// RDM: the connector's listening address as its `KeyedHello`
    /// claims it; MSG: the connector's end of the stream.
    pub connector: SocketAddr,
    /// The address the connector dialled (the acceptor's end of the
    /// stream).
    pub acceptor: SocketAddr,
}

impl Transcript {
    /// The bytes a MAC covers (`docs/wire.md` §8.6): the label, the kind,
    /// the role, both nonces, then both addresses as encoded sockaddrs,
    /// each after its length. An IPv4-mapped IPv6 address is written as
    /// IPv4, so that a dual-stack socket's view and an IPv4 peer's agree.
    pub fn bytes(&self, role: Role) -> Vec<u8> {
        let c = encode_sockaddr(&canonical(self.connector));
        let a = encode_sockaddr(&canonical(self.acceptor));
        let mut b = Vec::with_capacity(LABEL.len() + 2 + 2 * NONCE_LEN + 2 + c.len() + a.len());
        b.extend_from_slice(LABEL);
        b.push(self.kind as u8);
        b.push(role as u8);
        b.extend_from_slice(&self.connector_nonce);
        b.extend_from_slice(&self.acceptor_nonce);
        for addr in [c, a] {
            // Sockaddrs are 16 or 28 bytes: the length fits a byte.
            b.push(addr.len() as u8);
            b.extend_from_slice(&addr);
        }
        b
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn transcript() -> Transcript {
        Transcript {
            kind: ConnKind::Rdm,
            connector_nonce: [1; NONCE_LEN],
            acceptor_nonce: [2; NONCE_LEN],
            connector: "192.0.2.1:4000".parse().unwrap(),
            acceptor: "192.0.2.2:5000".parse().unwrap(),
        }
    }

    #[test]
    fn key_sizes() {
        assert_eq!(check_key(&[]), Err(Error::Inval));
        assert_eq!(check_key(&[0; MAX_KEY_LEN + 1]), Err(Error::Inval));
        assert_eq!(check_key(&[0; MIN_KEY_LEN]), Ok(()));
        assert_eq!(check_key(&[0; MAX_KEY_LEN]), Ok(()));
        assert_eq!(effective_key(None, None), Ok(None));
        let k = effective_key(None, Some(b"dom")).unwrap().unwrap();
        assert_eq!(k, AuthKey::new(b"dom").unwrap());
        let k = effective_key(Some(b"ep"), Some(b"dom")).unwrap().unwrap();
        assert_eq!(k, AuthKey::new(b"ep").unwrap());
        assert_eq!(effective_key(Some(b""), Some(b"dom")), Err(Error::Inval));
        assert_eq!(effective_key(Some(b"ep"), Some(b"")), Err(Error::Inval));
        assert_eq!(format!("{k:?}"), "AuthKey(2 bytes)");
    }

    #[test]
    fn transcript_layout() {
        let b = transcript().bytes(Role::Connector);
        let mut want = b"weft-auth-1".to_vec();
        want.extend_from_slice(&[1, 2]);
        want.extend_from_slice(&[1; 16]);
        want.extend_from_slice(&[2; 16]);
        want.push(16);
        want.extend_from_slice(&[2, 0, 0x0f, 0xa0, 192, 0, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
        want.push(16);
        want.extend_from_slice(&[2, 0, 0x13, 0x88, 192, 0, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(b, want);
        // A mapped acceptor address is the same transcript as its IPv4 form.
        let mut mapped = transcript();
        mapped.acceptor = "[::ffff:192.0.2.2]:5000".parse().unwrap();
        assert_eq!(mapped.bytes(Role::Connector), want);
    }

    /// RFC 4231 test case 2, so the MAC is HMAC-SHA256 and nothing else.
    #[test]
    fn selectors_pick_the_key_and_change_with_the_nonce() {
        let (a, b) = (AuthKey::new(b"a").unwrap(), AuthKey::new(b"b").unwrap());
        let sa = a.selector(&[1; NONCE_LEN]).unwrap();
        assert!(a.selects(&[1; NONCE_LEN], &sa));
        assert!(!b.selects(&[1; NONCE_LEN], &sa));
        assert!(!a.selects(&[2; NONCE_LEN], &sa));
        assert_ne!(sa, a.selector(&[2; NONCE_LEN]).unwrap());
        assert!(!a.selects(&[1; NONCE_LEN], &sa[..8]));
        assert!(!a.selects(&[1; NONCE_LEN], &[]));
    }

    #[test]
    fn hmac_is_the_standard_one() {
        let mut m = Hmac::<Sha256>::new_from_slice(b"Jefe").unwrap();
        m.update(b"what do ya want for nothing?");
        let out = m.finalize().into_bytes();
        let want = [
            0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e, 0x6a, 0x04, 0x24, 0x26, 0x08, 0x95,
            0x75, 0xc7, 0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27, 0x39, 0x83, 0x9d, 0xec, 0x58, 0xb9,
            0x64, 0xec, 0x38, 0x43,
        ];
        assert_eq!(out[..], want);
    }

    #[test]
    fn extra_bytes_and_short_macs() {
        let k = AuthKey::new(b"job-1").unwrap();
        let t = transcript();
        // No extra bytes: the same MAC as `prove`.
        assert_eq!(
            k.prove_with(&t, Role::Acceptor, &[]).unwrap(),
            k.prove(&t, Role::Acceptor).unwrap()
        );
        let tag = k.prove_with(&t, Role::Connector, b"label data").unwrap();
        assert_ne!(tag, k.prove(&t, Role::Connector).unwrap());
        assert_eq!(
            k.verify_with(&t, Role::Connector, b"label data", &tag),
            Ok(())
        );
        assert_eq!(
            k.verify_with(&t, Role::Connector, b"label datA", &tag),
            Err(Error::KeyRejected)
        );
        // The short MAC is the whole one's first 16 bytes, exactly.
        let short = &tag[..SHORT_MAC_LEN];
        assert_eq!(
            k.verify_short_with(&t, Role::Connector, b"label data", short),
            Ok(())
        );
        for bad in [
            &tag[..SHORT_MAC_LEN - 1],
            &tag[..SHORT_MAC_LEN + 1],
            &tag[..],
            &[],
        ] {
            assert_eq!(
                k.verify_short_with(&t, Role::Connector, b"label data", bad),
                Err(Error::KeyRejected)
            );
        }
        let mut flipped = [0u8; SHORT_MAC_LEN];
        flipped.copy_from_slice(short);
        flipped[15] ^= 0x80;
        assert_eq!(
            k.verify_short_with(&t, Role::Connector, b"label data", &flipped),
            Err(Error::KeyRejected)
        );
        // Another role, other extra bytes or another key: refused.
        assert_eq!(
            k.verify_short_with(&t, Role::Acceptor, b"label data", short),
            Err(Error::KeyRejected)
        );
        assert_eq!(
            k.verify_short_with(&t, Role::Connector, b"label", short),
            Err(Error::KeyRejected)
        );
        let other = AuthKey::new(b"job-2").unwrap();
        assert_eq!(
            other.verify_short_with(&t, Role::Connector, b"label data", short),
            Err(Error::KeyRejected)
        );
    }

    #[test]
    fn byte_transcripts() {
        let k = AuthKey::new(b"job-1").unwrap();
        let tag = k.prove_bytes(b"weft-x transcript").unwrap();
        assert_eq!(k.verify_bytes(b"weft-x transcript", &tag), Ok(()));
        assert_eq!(
            k.verify_bytes(b"weft-x transcripT", &tag),
            Err(Error::KeyRejected)
        );
        assert_eq!(
            k.verify_bytes(b"weft-x transcript", &tag[..MAC_LEN - 1]),
            Err(Error::KeyRejected)
        );
        let other = AuthKey::new(b"job-2").unwrap();
        assert_eq!(
            other.verify_bytes(b"weft-x transcript", &tag),
            Err(Error::KeyRejected)
        );
        // The same bytes as a socket transcript's MAC would hash.
        let t = transcript();
        assert_eq!(
            k.prove_bytes(&t.bytes(Role::Acceptor)).unwrap(),
            k.prove(&t, Role::Acceptor).unwrap()
        );
    }

    #[test]
    fn a_mac_proves_one_key_for_one_transcript_in_one_role() {
        let k = AuthKey::new(b"job-1").unwrap();
        let t = transcript();
        let tag = k.prove(&t, Role::Acceptor).unwrap();
        assert_eq!(k.verify(&t, Role::Acceptor, &tag), Ok(()));
        // Another key, another role (a reflected MAC), either nonce, either
        // address or the kind changed: refused.
        let other = AuthKey::new(b"job-2").unwrap();
        assert_eq!(
            other.verify(&t, Role::Acceptor, &tag),
            Err(Error::KeyRejected)
        );
        assert_eq!(k.verify(&t, Role::Connector, &tag), Err(Error::KeyRejected));
        let changed = [
            Transcript {
                connector_nonce: [9; NONCE_LEN],
                ..t
            },
            Transcript {
                acceptor_nonce: [9; NONCE_LEN],
                ..t
            },
            Transcript {
                connector: "192.0.2.1:4001".parse().unwrap(),
                ..t
            },
            Transcript {
                acceptor: "192.0.2.3:5000".parse().unwrap(),
                ..t
            },
            Transcript {
                kind: ConnKind::Msg,
                ..t
            },
        ];
        for c in changed {
            assert_eq!(k.verify(&c, Role::Acceptor, &tag), Err(Error::KeyRejected));
        }
        // Truncated or extended tags, and a flipped bit.
        assert_eq!(
            k.verify(&t, Role::Acceptor, &tag[..MAC_LEN - 1]),
            Err(Error::KeyRejected)
        );
        let mut long = tag.to_vec();
        long.push(0);
        assert_eq!(k.verify(&t, Role::Acceptor, &long), Err(Error::KeyRejected));
        let mut flipped = tag;
        flipped[7] ^= 1;
        assert_eq!(
            k.verify(&t, Role::Acceptor, &flipped),
            Err(Error::KeyRejected)
        );
        assert_eq!(k.verify(&t, Role::Acceptor, &[]), Err(Error::KeyRejected));
    }
}
