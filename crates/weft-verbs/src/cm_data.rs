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

/// The RDM hello: where the sender listens (an encoded sockaddr) and
/// which incarnation of the endpoint this is, as plain private data.
pub fn hello(listen: &std::net::SocketAddr, incarnation: u64) -> Result<Vec<u8>> {
    let mut v = weft_core::addr::encode_sockaddr(listen);
    v.extend_from_slice(&incarnation.to_le_bytes());
    cm_encode(&v)
}

/// The peer's listening address and incarnation from its plain hello.
pub fn parse_hello(private: &[u8]) -> Result<(std::net::SocketAddr, u64)> {
    let d = cm_decode(private);
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
pub const KEYED_HELLO_LEN: usize = 10;

/// The RDM hello inside a key proof (`crate::keyproof`), where a whole
/// sockaddr does not fit beside the MAC: the listening port and the
/// incarnation, both little-endian. The listening address is the port at
/// the IP address the request came from (an RDM endpoint connects from
/// the address it listens on).
pub fn keyed_hello(listen_port: u16, incarnation: u64) -> [u8; KEYED_HELLO_LEN] {
    let mut b = [0u8; KEYED_HELLO_LEN];
    b[..2].copy_from_slice(&listen_port.to_le_bytes());
    b[2..].copy_from_slice(&incarnation.to_le_bytes());
    b
}

/// The listening address (port `data` names at `from`) and incarnation of
/// a keyed hello; any other length is `Inval`.
pub fn parse_keyed_hello(
    data: &[u8],
    from: std::net::IpAddr,
) -> Result<(std::net::SocketAddr, u64)> {
    let b: [u8; KEYED_HELLO_LEN] = data.try_into().map_err(|_| Error::Inval)?;
    let port = u16::from_le_bytes([b[0], b[1]]);
    let mut n = [0u8; 8];
    n.copy_from_slice(&b[2..]);
    Ok((std::net::SocketAddr::new(from, port), u64::from_le_bytes(n)))
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
        let mut h = hello(&a, 0x0102_0304_0506_0708).unwrap();
        h.resize(56, 0);
        assert_eq!(parse_hello(&h), Ok((a, 0x0102_0304_0506_0708)));
        assert!(parse_hello(&cm_encode(b"garbage").unwrap()).is_err());
        assert!(parse_hello(&[]).is_err());
        // A keyed hello fits a proof, and names the port at the sender.
        let k = keyed_hello(7000, 42);
        assert!(k.len() <= crate::keyproof::payload::PROOF_DATA_MAX);
        assert_eq!(parse_keyed_hello(&k, a.ip()), Ok((a, 42)));
        assert_eq!(parse_keyed_hello(&k[..9], a.ip()), Err(Error::Inval));
        let v6: SocketAddr = "[fd00::2]:7000".parse().unwrap();
        assert_eq!(parse_keyed_hello(&k, v6.ip()), Ok((v6, 42)));
    }
}
