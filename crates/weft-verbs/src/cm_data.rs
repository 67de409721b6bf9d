//! Plain Weft private data: one length byte, then the user's CM data
//! (MSG) or the RDM hello. rdma_cm pads private data to a fixed size, so
//! its length must travel with it. The keyed forms of
//! [`crate::keyproof`] start with a tag above this length's range.

use weft_core::{Error, Result};

/// rdma_cm's private-data limit on an RC connect, less our length byte.
pub const CM_DATA_SIZE: usize = 55;

/// Encodes CM data with its length byte.
pub fn cm_encode(data: &[u8]) -> Result<Vec<u8>> {
    if data.len() > CM_DATA_SIZE {
        return Err(Error::Inval);
    }
    let mut v = Vec::with_capacity(data.len() + 1);
    v.push(data.len() as u8);
    v.extend_from_slice(data);
    Ok(v)
}

/// The user's CM data out of (padded) private data. Data whose first
/// byte is not a length that fits (a peer that does not use the length
/// byte, or a keyed form) gives none.
pub fn cm_decode(pd: &[u8]) -> Vec<u8> {
    match pd.split_first() {
        Some((&n, rest)) if usize::from(n) <= rest.len() && usize::from(n) <= CM_DATA_SIZE => {
            rest[..usize::from(n)].to_vec()
        }
        _ => Vec::new(),
    }
}

/// Feature bit of an RDM hello: the sender takes bare eager sends
/// (`weft_core::wire::rdm`, sends without the header, with immediate
/// data). Other bits are ignored on receipt: a later peer may set them.
pub const FEAT_BARE: u8 = 1;

/// Feature bit of an RDM hello: the sender answers a request-to-send
/// that announces a memory window with a "finished" that revokes it
/// (a send with invalidate, on the connection it came on). Announced
/// only where the device takes such sends.
pub const FEAT_WINDOWS: u8 = 2;

/// The features every RDM endpoint of this build announces; windows
/// depend on the device (`rdm::lanes`).
pub const FEATURES: u8 = FEAT_BARE;

/// The RDM hello: where the sender listens (an encoded sockaddr), which
/// incarnation of the endpoint this is, and its feature byte, as plain
/// private data.
pub fn hello(listen: &std::net::SocketAddr, incarnation: u64, features: u8) -> Result<Vec<u8>> {
    let mut v = weft_core::addr::encode_sockaddr(listen);
    v.extend_from_slice(&incarnation.to_le_bytes());
    v.push(features);
    cm_encode(&v)
}

/// The peer's listening address, incarnation and features from its
/// plain hello. A hello without the feature byte (an earlier peer's)
/// has features 0.
pub fn parse_hello(private: &[u8]) -> Result<(std::net::SocketAddr, u64, u8)> {
    let d = cm_decode(private);
    // The sockaddr's own length tells the forms apart: a sockaddr is
    // decoded only at its family's exact length.
    let with = d
        .split_last()
        .and_then(|(f, rest)| split_hello(rest).ok().map(|(a, n)| (a, n, *f)));
    match with {
        Some(h) => Ok(h),
        None => split_hello(&d).map(|(a, n)| (a, n, 0)),
    }
}

fn split_hello(d: &[u8]) -> Result<(std::net::SocketAddr, u64)> {
    let (addr, nonce) = d
        .split_at_checked(d.len().saturating_sub(8))
        .ok_or(Error::Inval)?;
    let n: [u8; 8] = nonce.try_into().map_err(|_| Error::Inval)?;
    Ok((
        weft_core::addr::decode_sockaddr(addr)?,
        u64::from_le_bytes(n),
    ))
}

/// Bytes of a keyed hello.
pub const KEYED_HELLO_LEN: usize = 11;

/// Bytes of a keyed hello without the feature byte (an earlier peer's).
pub const KEYED_HELLO_V1_LEN: usize = 10;

/// The RDM hello inside a key proof (`crate::keyproof`), where a whole
/// sockaddr does not fit beside the MAC: the listening port and the
/// incarnation, both little-endian, then the feature byte. The listening
/// address is the port at the IP address the request came from (an RDM
/// endpoint connects from the address it listens on).
pub fn keyed_hello(listen_port: u16, incarnation: u64, features: u8) -> [u8; KEYED_HELLO_LEN] {
    let mut b = [0u8; KEYED_HELLO_LEN];
    b[..2].copy_from_slice(&listen_port.to_le_bytes());
    b[2..10].copy_from_slice(&incarnation.to_le_bytes());
    b[10] = features;
    b
}

/// The listening address (port `data` names at `from`), incarnation and
/// features of a keyed hello (features 0 without the feature byte); any
/// other length is `Inval`.
pub fn parse_keyed_hello(
    data: &[u8],
    from: std::net::IpAddr,
) -> Result<(std::net::SocketAddr, u64, u8)> {
    let features = match data.len() {
        KEYED_HELLO_LEN => data[10],
        KEYED_HELLO_V1_LEN => 0,
        _ => return Err(Error::Inval),
    };
    let port = u16::from_le_bytes([data[0], data[1]]);
    let mut n = [0u8; 8];
    n.copy_from_slice(&data[2..10]);
    Ok((
        std::net::SocketAddr::new(from, port),
        u64::from_le_bytes(n),
        features,
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::net::SocketAddr;

    #[test]
    fn cm_data_round_trip_and_padding() {
        let e = cm_encode(b"hello").unwrap();
        assert_eq!(e, b"\x05hello");
        let mut padded = e.clone();
        padded.resize(56, 0);
        assert_eq!(cm_decode(&padded), b"hello");
        assert_eq!(cm_encode(&[0; CM_DATA_SIZE + 1]), Err(Error::Inval));
        assert!(cm_decode(&[]).is_empty());
        assert!(cm_decode(&[9, 1, 2]).is_empty(), "a length beyond the data");
        assert!(cm_decode(&[0xA1; 56]).is_empty(), "a keyed form");
    }

    #[test]
    fn hellos() {
        let a: SocketAddr = "10.66.0.2:7000".parse().unwrap();
        let mut h = hello(&a, 0x0102_0304_0506_0708, FEATURES).unwrap();
        h.resize(56, 0);
        assert_eq!(parse_hello(&h), Ok((a, 0x0102_0304_0506_0708, FEATURES)));
        assert!(parse_hello(&cm_encode(b"garbage").unwrap()).is_err());
        assert!(parse_hello(&[]).is_err());
        // An earlier peer's hello, without the feature byte, for both
        // address families.
        let v6: SocketAddr = "[fd00::2]:7000".parse().unwrap();
        for peer in [a, v6] {
            let mut old = weft_core::addr::encode_sockaddr(&peer);
            old.extend_from_slice(&9u64.to_le_bytes());
            assert_eq!(parse_hello(&cm_encode(&old).unwrap()), Ok((peer, 9, 0)));
            let new = hello(&peer, 9, 0x81).unwrap();
            assert_eq!(parse_hello(&new), Ok((peer, 9, 0x81)));
        }
        // A keyed hello fits a proof, and names the port at the sender.
        let k = keyed_hello(7000, 42, FEATURES);
        assert!(k.len() <= crate::keyproof::payload::PROOF_DATA_MAX);
        assert_eq!(parse_keyed_hello(&k, a.ip()), Ok((a, 42, FEATURES)));
        assert_eq!(parse_keyed_hello(&k[..10], a.ip()), Ok((a, 42, 0)));
        assert_eq!(parse_keyed_hello(&k[..9], a.ip()), Err(Error::Inval));
        assert_eq!(parse_keyed_hello(&[0; 12], a.ip()), Err(Error::Inval));
        assert_eq!(parse_keyed_hello(&k, v6.ip()), Ok((v6, 42, FEATURES)));
    }
}
