//! The rdma_cm private data of a keyed connection set-up
//! (`docs/wire.md` §13.2): what each request and rejection carries, as
//! bytes.
//!
//! Plain Weft private data starts with a length byte of at most
//! [`CM_DATA_SIZE`](crate::cm_data::CM_DATA_SIZE) (55); every keyed form
//! starts with a tag byte above that range instead, so one look at the
//! first byte tells them apart. The transport pads private data (IB/RoCE
//! CM delivers the whole field: 56 bytes for a request, 148 for a
//! rejection), so decoders take trailing bytes as padding and every form
//! has a fixed size or its own length byte.

use weft_core::auth::{Selector, Tag, MAC_LEN, SELECTOR_LEN, SHORT_MAC_LEN};
use weft_core::wire::claim::{Nonce, NONCE_LEN};
use weft_core::{Error, Result};

/// Request, round 1: the connector's nonce, key selector and key
/// identifier.
pub(crate) const OPEN: u8 = 0xA1;
/// Rejection of round 1: the acceptor's nonce and its MAC (the challenge).
pub(crate) const CHALLENGE: u8 = 0xA2;
/// Request, round 2: the challenge's handle, the connector's short MAC
/// and the data it covers.
pub(crate) const PROOF: u8 = 0xA3;
/// Rejection: the key was not proven (`FI_EKEYREJECTED`).
pub(crate) const REFUSED: u8 = 0xA4;
/// Request, round 2 instead of a proof: the connector refuses a challenge
/// that proved nothing, so the acceptor hears of the failure too.
pub(crate) const NOTICE: u8 = 0xA5;

/// Bytes of a challenge handle: the first bytes of the acceptor's nonce,
/// which the acceptor chose and keeps unique among its open challenges.
pub(crate) const HANDLE_LEN: usize = 8;

/// Names one open challenge of an acceptor.
pub(crate) type Handle = [u8; HANDLE_LEN];

/// Bytes of a key identifier (`super::key_id`).
pub(crate) const KEY_ID_LEN: usize = 8;

/// Names one key, the same in every opening that key makes.
pub(crate) type KeyId = [u8; KEY_ID_LEN];

/// Most private data an RC connect request carries (IB CM REQ less the
/// rdma_cm header; `PortSpace::Tcp.max_connect_private_data()`).
pub(crate) const MAX_REQUEST: usize = 56;

/// Bytes of an [`OPEN`] request.
pub(crate) const OPEN_LEN: usize = 1 + NONCE_LEN + SELECTOR_LEN + KEY_ID_LEN;
/// Bytes of a [`CHALLENGE`] rejection.
pub(crate) const CHALLENGE_LEN: usize = 1 + NONCE_LEN + MAC_LEN;
/// Bytes of a [`PROOF`] request in front of its data: tag, handle, short
/// MAC, data length.
pub(crate) const PROOF_PREFIX: usize = 1 + HANDLE_LEN + SHORT_MAC_LEN + 1;
/// Most data a proof carries (MSG CM data, RDM keyed hello).
pub(crate) const PROOF_DATA_MAX: usize = MAX_REQUEST - PROOF_PREFIX;
/// Bytes of a [`NOTICE`] request.
pub(crate) const NOTICE_LEN: usize = 1 + HANDLE_LEN;

/// The handle of the challenge that carries acceptor nonce `na`.
pub(crate) fn handle_of(na: &Nonce) -> Handle {
    let mut h = [0u8; HANDLE_LEN];
    h.copy_from_slice(&na[..HANDLE_LEN]);
    h
}

/// Private data as the key proof reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CmAuth<'a> {
    /// Not a keyed form: plain Weft private data (or none, or a foreign
    /// program's).
    Plain,
    /// [`OPEN`].
    Open {
        nonce: Nonce,
        selector: Selector,
        key_id: KeyId,
    },
    /// [`CHALLENGE`].
    Challenge { nonce: Nonce, mac: Tag },
    /// [`PROOF`]: `data` is what the MAC covers after the transcript.
    Proof {
        handle: Handle,
        mac: [u8; SHORT_MAC_LEN],
        data: &'a [u8],
    },
    /// [`NOTICE`].
    Notice { handle: Handle },
    /// [`REFUSED`].
    Refused,
}

/// Reads private data. A keyed tag whose form is cut short (or whose
/// data length overruns it) is `KeyRejected`: it proves nothing.
pub(crate) fn decode(pd: &[u8]) -> Result<CmAuth<'_>> {
    let Some((&tag, rest)) = pd.split_first() else {
        return Ok(CmAuth::Plain);
    };
    let short = || Error::KeyRejected;
    match tag {
        OPEN => {
            let (nonce, rest) = take::<NONCE_LEN>(rest).ok_or_else(short)?;
            let (selector, rest) = take::<SELECTOR_LEN>(rest).ok_or_else(short)?;
            let (key_id, _) = take::<KEY_ID_LEN>(rest).ok_or_else(short)?;
            Ok(CmAuth::Open {
                nonce,
                selector,
                key_id,
            })
        }
        CHALLENGE => {
            let (nonce, rest) = take::<NONCE_LEN>(rest).ok_or_else(short)?;
            let (mac, _) = take::<MAC_LEN>(rest).ok_or_else(short)?;
            Ok(CmAuth::Challenge { nonce, mac })
        }
        PROOF => {
            let (handle, rest) = take::<HANDLE_LEN>(rest).ok_or_else(short)?;
            let (mac, rest) = take::<SHORT_MAC_LEN>(rest).ok_or_else(short)?;
            let (&n, rest) = rest.split_first().ok_or_else(short)?;
            let n = usize::from(n);
            if n > PROOF_DATA_MAX {
                return Err(Error::KeyRejected);
            }
            let data = rest.get(..n).ok_or_else(short)?;
            Ok(CmAuth::Proof { handle, mac, data })
        }
        NOTICE => {
            let (handle, _) = take::<HANDLE_LEN>(rest).ok_or_else(short)?;
            Ok(CmAuth::Notice { handle })
        }
        REFUSED => Ok(CmAuth::Refused),
        _ => Ok(CmAuth::Plain),
    }
}

/// The first `N` bytes of `b` as an array, and the rest.
fn take<const N: usize>(b: &[u8]) -> Option<([u8; N], &[u8])> {
    let (head, rest) = b.split_at_checked(N)?;
    Some((head.try_into().ok()?, rest))
}

/// An [`OPEN`] request.
pub(crate) fn open(nonce: &Nonce, selector: &Selector, key_id: &KeyId) -> Vec<u8> {
    let mut v = Vec::with_capacity(OPEN_LEN);
    v.push(OPEN);
    v.extend_from_slice(nonce);
    v.extend_from_slice(selector);
    v.extend_from_slice(key_id);
    v
}

/// A [`CHALLENGE`] rejection.
pub(crate) fn challenge(nonce: &Nonce, mac: &Tag) -> Vec<u8> {
    let mut v = Vec::with_capacity(CHALLENGE_LEN);
    v.push(CHALLENGE);
    v.extend_from_slice(nonce);
    v.extend_from_slice(mac);
    v
}

/// The bytes a connector's MAC covers after the transcript and the
/// channel's label: the data's length, then the data.
pub(crate) fn covered(data: &[u8]) -> Result<Vec<u8>> {
    if data.len() > PROOF_DATA_MAX {
        return Err(Error::Inval);
    }
    let mut v = Vec::with_capacity(1 + data.len());
    v.push(data.len() as u8);
    v.extend_from_slice(data);
    Ok(v)
}

/// A [`PROOF`] request; data longer than [`PROOF_DATA_MAX`] is `Inval`.
pub(crate) fn proof(handle: &Handle, mac: &[u8; SHORT_MAC_LEN], data: &[u8]) -> Result<Vec<u8>> {
    let mut v = Vec::with_capacity(PROOF_PREFIX + data.len());
    v.push(PROOF);
    v.extend_from_slice(handle);
    v.extend_from_slice(mac);
    v.extend_from_slice(&covered(data)?);
    Ok(v)
}

/// A [`NOTICE`] request.
pub(crate) fn notice(handle: &Handle) -> Vec<u8> {
    let mut v = Vec::with_capacity(NOTICE_LEN);
    v.push(NOTICE);
    v.extend_from_slice(handle);
    v
}

/// A [`REFUSED`] rejection.
pub(crate) fn refused() -> Vec<u8> {
    vec![REFUSED]
}

/// The error a rejection stands for: a [`REFUSED`] one is
/// `KeyRejected` whatever rdma_cm called it; any other keeps `err`.
pub(crate) fn rejection(err: Error, pd: &[u8]) -> Error {
    match decode(pd) {
        Ok(CmAuth::Refused) => Error::KeyRejected,
        _ => err,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// `b` padded with zeros to `n` bytes, as IB/RoCE CM delivers it.
    fn padded(b: &[u8], n: usize) -> Vec<u8> {
        let mut v = b.to_vec();
        v.resize(n, 0);
        v
    }

    #[test]
    fn sizes_fit_rdma_cm() {
        assert_eq!(OPEN_LEN, 41);
        assert_eq!(CHALLENGE_LEN, 49);
        assert_eq!(PROOF_PREFIX, 26);
        assert_eq!(PROOF_DATA_MAX, 30);
        assert_eq!(NOTICE_LEN, 9);
        // Requests within a connect's 56 bytes, rejections within a
        // reject's 148.
        const {
            assert!(OPEN_LEN <= MAX_REQUEST && PROOF_PREFIX + PROOF_DATA_MAX == MAX_REQUEST);
            assert!(CHALLENGE_LEN <= 148);
        }
        // Every tag is above the plain length byte's range.
        for t in [OPEN, CHALLENGE, PROOF, REFUSED, NOTICE] {
            assert!(usize::from(t) > crate::cm_data::CM_DATA_SIZE);
        }
    }

    #[test]
    fn round_trips_with_and_without_padding() {
        let (n, s, k) = ([1u8; NONCE_LEN], [2u8; SELECTOR_LEN], [9u8; KEY_ID_LEN]);
        let o = open(&n, &s, &k);
        assert_eq!(o.len(), OPEN_LEN);
        let want = CmAuth::Open {
            nonce: n,
            selector: s,
            key_id: k,
        };
        assert_eq!(decode(&o), Ok(want));
        assert_eq!(decode(&padded(&o, MAX_REQUEST)), Ok(want));

        let c = challenge(&[3; NONCE_LEN], &[4; MAC_LEN]);
        assert_eq!(c.len(), CHALLENGE_LEN);
        let want = CmAuth::Challenge {
            nonce: [3; NONCE_LEN],
            mac: [4; MAC_LEN],
        };
        assert_eq!(decode(&c), Ok(want));
        assert_eq!(decode(&padded(&c, 148)), Ok(want));

        let p = proof(&[5; HANDLE_LEN], &[6; SHORT_MAC_LEN], b"cm data").unwrap();
        assert_eq!(p.len(), PROOF_PREFIX + 7);
        let want = CmAuth::Proof {
            handle: [5; HANDLE_LEN],
            mac: [6; SHORT_MAC_LEN],
            data: b"cm data",
        };
        assert_eq!(decode(&p), Ok(want));
        assert_eq!(decode(&padded(&p, MAX_REQUEST)), Ok(want));
        let full = proof(&[5; HANDLE_LEN], &[6; SHORT_MAC_LEN], &[7; PROOF_DATA_MAX]).unwrap();
        assert_eq!(full.len(), MAX_REQUEST);
        assert!(
            matches!(decode(&full), Ok(CmAuth::Proof { data, .. }) if data == [7; PROOF_DATA_MAX])
        );

        let x = notice(&[8; HANDLE_LEN]);
        assert_eq!(
            decode(&padded(&x, MAX_REQUEST)),
            Ok(CmAuth::Notice {
                handle: [8; HANDLE_LEN]
            })
        );
        assert_eq!(decode(&padded(&refused(), 148)), Ok(CmAuth::Refused));
    }

    #[test]
    fn plain_data_and_short_forms() {
        // Plain Weft private data (a length byte), none, or a foreign
        // program's bytes: not keyed.
        assert_eq!(decode(&[]), Ok(CmAuth::Plain));
        assert_eq!(
            decode(&crate::cm_data::cm_encode(b"hi").unwrap()),
            Ok(CmAuth::Plain)
        );
        assert_eq!(decode(&[0; 56]), Ok(CmAuth::Plain));
        assert_eq!(decode(&[0xFF, 1, 2]), Ok(CmAuth::Plain));
        // A keyed tag cut short proves nothing.
        let o = open(&[1; NONCE_LEN], &[2; SELECTOR_LEN], &[9; KEY_ID_LEN]);
        assert_eq!(decode(&o[..OPEN_LEN - 1]), Err(Error::KeyRejected));
        let c = challenge(&[3; NONCE_LEN], &[4; MAC_LEN]);
        assert_eq!(decode(&c[..CHALLENGE_LEN - 1]), Err(Error::KeyRejected));
        let p = proof(&[5; HANDLE_LEN], &[6; SHORT_MAC_LEN], b"abc").unwrap();
        assert_eq!(decode(&p[..p.len() - 1]), Err(Error::KeyRejected));
        assert_eq!(decode(&p[..PROOF_PREFIX - 1]), Err(Error::KeyRejected));
        assert_eq!(
            decode(&notice(&[8; HANDLE_LEN])[..NOTICE_LEN - 1]),
            Err(Error::KeyRejected)
        );
        // A data length beyond what a request can hold.
        let mut long = p.clone();
        long[PROOF_PREFIX - 1] = (PROOF_DATA_MAX + 1) as u8;
        long.resize(200, 0);
        assert_eq!(decode(&long), Err(Error::KeyRejected));
        // Data too long to send.
        assert_eq!(
            proof(
                &[0; HANDLE_LEN],
                &[0; SHORT_MAC_LEN],
                &[0; PROOF_DATA_MAX + 1]
            ),
            Err(Error::Inval)
        );
    }

    #[test]
    fn rejections_name_their_error() {
        assert_eq!(
            rejection(Error::ConnRefused, &padded(&refused(), 148)),
            Error::KeyRejected
        );
        let user = crate::cm_data::cm_encode(b"no").unwrap();
        assert_eq!(rejection(Error::ConnRefused, &user), Error::ConnRefused);
        assert_eq!(rejection(Error::ConnRefused, &[]), Error::ConnRefused);
        assert_eq!(rejection(Error::TimedOut, &[]), Error::TimedOut);
    }

    #[test]
    fn handles_are_the_nonce_prefix() {
        let mut na = [0u8; NONCE_LEN];
        for (i, b) in na.iter_mut().enumerate() {
            *b = i as u8;
        }
        assert_eq!(handle_of(&na), [0, 1, 2, 3, 4, 5, 6, 7]);
    }
}
