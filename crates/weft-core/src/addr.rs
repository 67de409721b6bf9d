//! Fabric addresses: `fi_addr_t` handles and the raw address formats of the
//! software providers (`sockaddr_in` / `sockaddr_in6` bytes, `FI_ADDR_STR`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use crate::error::{Error, Result};

/// An AV handle (`fi_addr_t`).
pub type FiAddr = u64;

/// `FI_ADDR_UNSPEC`: no address (receive from any source).
pub const FI_ADDR_UNSPEC: FiAddr = u64::MAX;
/// `FI_ADDR_NOTAVAIL`: address not available (failed insert, unknown source).
pub const FI_ADDR_NOTAVAIL: FiAddr = u64::MAX;

const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

/// The bit that marks a joined multicast group's address (`fi_mc_addr`)
/// among an endpoint's destinations: AV handles of endpoints with one
/// receive context never set it.
pub const MC_ADDR_BIT: u64 = 1 << 62;

/// The index of the group whose address is `a`; `None` for anything
/// else (AV handles, `FI_ADDR_UNSPEC`).
pub fn mc_index(a: FiAddr) -> Option<usize> {
    if a & MC_ADDR_BIT == 0 || a == FI_ADDR_NOTAVAIL {
        return None;
    }
    usize::try_from(a & !MC_ADDR_BIT).ok()
}

/// Keeps group `g` in the first free slot of `list` (slots of groups
/// left are reused) and returns the group's address.
pub fn mc_insert<G>(list: &mut Vec<Option<G>>, g: G) -> FiAddr {
    let i = match list.iter().position(Option::is_none) {
        Some(i) => {
            list[i] = Some(g);
            i
        }
        None => {
            list.push(Some(g));
            list.len() - 1
        }
    };
    MC_ADDR_BIT | i as u64
}

/// Length of an encoded `struct sockaddr_in`.
pub const SOCKADDR_IN_LEN: usize = 16;
/// Length of an encoded `struct sockaddr_in6`.
pub const SOCKADDR_IN6_LEN: usize = 28;

/// Encodes a socket address in the layout of a Linux `struct sockaddr_in` or
/// `struct sockaddr_in6`, which is what libfabric's socket providers put in
/// an AV. Port and address are in network order; the family and scope id
/// are little-endian (what x86/ARM Linux stores), fixed so that the bytes —
/// compared on the wire to resolve simultaneous connects — are the same on
/// every host.
pub fn encode_sockaddr(addr: &SocketAddr) -> Vec<u8> {
    sockaddr_bytes(addr).to_vec()
}

/// [`encode_sockaddr`] into a value on the stack: for lookups on the data
/// path (the source of every arriving message), which must not allocate.
#[derive(Debug, Clone, Copy)]
pub struct SockaddrBytes {
    buf: [u8; SOCKADDR_IN6_LEN],
    len: usize,
}

impl std::ops::Deref for SockaddrBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// The bytes of [`encode_sockaddr`], without allocating.
pub fn sockaddr_bytes(addr: &SocketAddr) -> SockaddrBytes {
    let mut buf = [0u8; SOCKADDR_IN6_LEN];
    let len = match addr {
        SocketAddr::V4(a) => {
            buf[0..2].copy_from_slice(&AF_INET.to_le_bytes());
            buf[2..4].copy_from_slice(&a.port().to_be_bytes());
            buf[4..8].copy_from_slice(&a.ip().octets());
            SOCKADDR_IN_LEN
        }
        SocketAddr::V6(a) => {
            buf[0..2].copy_from_slice(&AF_INET6.to_le_bytes());
            buf[2..4].copy_from_slice(&a.port().to_be_bytes());
            buf[4..8].copy_from_slice(&a.flowinfo().to_be_bytes());
            buf[8..24].copy_from_slice(&a.ip().octets());
            buf[24..28].copy_from_slice(&a.scope_id().to_le_bytes());
            SOCKADDR_IN6_LEN
        }
    };
    SockaddrBytes { buf, len }
}

/// Decodes `sockaddr_in` / `sockaddr_in6` bytes. Anything else is `Inval`.
pub fn decode_sockaddr(b: &[u8]) -> Result<SocketAddr> {
    let fam = b.get(0..2).ok_or(Error::Inval)?;
    let fam = u16::from_le_bytes([fam[0], fam[1]]);
    match (fam, b.len()) {
        (AF_INET, SOCKADDR_IN_LEN) => {
            let port = u16::from_be_bytes([b[2], b[3]]);
            let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
            Ok(SocketAddr::V4(SocketAddrV4::new(ip, port)))
        }
        (AF_INET6, SOCKADDR_IN6_LEN) => {
            let port = u16::from_be_bytes([b[2], b[3]]);
            let flow = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
            let mut o = [0u8; 16];
            o.copy_from_slice(&b[8..24]);
            let scope = u32::from_le_bytes([b[24], b[25], b[26], b[27]]);
            Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(o),
                port,
                flow,
                scope,
            )))
        }
        _ => Err(Error::Inval),
    }
}

/// Formats a socket address the way libfabric's `fi_av_straddr` does for
/// socket providers: `fi_sockaddr_in://127.0.0.1:4000` or
/// `fi_sockaddr_in6://[::1]:4000`.
pub fn sockaddr_to_str(addr: &SocketAddr) -> String {
    match addr {
        SocketAddr::V4(a) => format!("fi_sockaddr_in://{}:{}", a.ip(), a.port()),
        SocketAddr::V6(a) => format!("fi_sockaddr_in6://[{}]:{}", a.ip(), a.port()),
    }
}

/// Parses an `FI_ADDR_STR` socket address (`fi_sockaddr_in://ip:port`,
/// `fi_sockaddr_in6://[ip]:port`, `fi_sockaddr://...`) or a bare `ip:port`.
pub fn parse_sockaddr_str(s: &str) -> Result<SocketAddr> {
    let s = s.trim();
    let rest = ["fi_sockaddr_in6://", "fi_sockaddr_in://", "fi_sockaddr://"]
        .iter()
        .find_map(|p| s.strip_prefix(p))
        .unwrap_or(s);
    rest.parse::<SocketAddr>().map_err(|_| Error::Inval)
}

/// Parses a numeric host (no name resolution) and a numeric service.
pub fn parse_numeric(node: &str, service: &str) -> Result<SocketAddr> {
    let ip: IpAddr = node
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map_err(|_| Error::Inval)?;
    let port: u16 = service.parse().map_err(|_| Error::Inval)?;
    Ok(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_addresses_reuse_free_slots_and_stand_apart() {
        let mut list = Vec::new();
        let a = mc_insert(&mut list, 'a');
        let b = mc_insert(&mut list, 'b');
        assert_eq!((mc_index(a), mc_index(b)), (Some(0), Some(1)));
        list[0] = None;
        assert_eq!(mc_insert(&mut list, 'c'), a, "a left group's slot");
        for not_a_group in [0, 5, FI_ADDR_UNSPEC] {
            assert_eq!(mc_index(not_a_group), None);
        }
    }

    #[test]
    fn sockaddr_round_trip() {
        for s in ["127.0.0.1:4000", "[::1]:9", "10.1.2.3:65535"] {
            let a: SocketAddr = s.parse().unwrap();
            let b = encode_sockaddr(&a);
            assert_eq!(decode_sockaddr(&b).unwrap(), a);
            assert_eq!(parse_sockaddr_str(&sockaddr_to_str(&a)).unwrap(), a);
        }
    }

    #[test]
    fn bad_bytes_are_inval() {
        assert_eq!(decode_sockaddr(&[]), Err(Error::Inval));
        assert_eq!(decode_sockaddr(&[2, 0, 1]), Err(Error::Inval));
        assert_eq!(decode_sockaddr(&[99u8; 16]), Err(Error::Inval));
        assert_eq!(
            parse_sockaddr_str("fi_sockaddr_in://nope"),
            Err(Error::Inval)
        );
        assert_eq!(parse_numeric("1.2.3.4", "x"), Err(Error::Inval));
    }
}
