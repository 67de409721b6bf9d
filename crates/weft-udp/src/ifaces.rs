//! The host's interfaces as the udp provider sees them: each address of an
//! interface that is up, with the interface's MTU, which bounds what one
//! datagram may carry there.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use nix::ifaddrs::getifaddrs;
use nix::net::if_::InterfaceFlags;
use nix::sys::socket::SockaddrStorage;

use crate::wire::{HEADER_LEN, UDP_MAX_V4, UDP_MAX_V6};

/// IPv4 header without options.
const IPV4_HEADER: usize = 20;
/// IPv6 header without extension headers.
const IPV6_HEADER: usize = 40;
/// UDP header.
const UDP_HEADER: usize = 8;
/// The MTU assumed when the interface's cannot be read: Ethernet's.
pub const FALLBACK_MTU: usize = 1500;
/// Loopback's MTU on Linux, assumed for the loopback offers when the
/// interfaces cannot be listed.
const LOOPBACK_MTU: usize = 65_536;

/// One address of an interface that is up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Iface {
    /// The interface (`lo`, `eth0`): the offer's domain name.
    pub name: String,
    /// The address.
    pub addr: IpAddr,
    /// Prefix length of its network.
    pub prefix: u8,
    /// The interface's MTU.
    pub mtu: usize,
    /// A loopback interface.
    pub loopback: bool,
}

impl Iface {
    /// The network, `127.0.0.0/8` style: the offer's fabric name.
    pub fn network(&self) -> String {
        let net = match self.addr {
            IpAddr::V4(a) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
            }
        };
        format!("{net}/{}", self.prefix)
    }

    /// The largest message one datagram carries on this interface.
    pub fn max_msg(&self) -> usize {
        max_payload(self.mtu, self.addr.is_ipv6())
    }
}

/// The largest message one datagram carries over a link of `mtu` bytes:
/// the MTU less the IP, UDP and Weft headers, and never more than UDP's
/// own limit less the Weft header.
pub fn max_payload(mtu: usize, v6: bool) -> usize {
    let (ip, udp_max) = if v6 {
        (IPV6_HEADER, UDP_MAX_V6)
    } else {
        (IPV4_HEADER, UDP_MAX_V4)
    };
    mtu.saturating_sub(ip + UDP_HEADER)
        .min(udp_max)
        .saturating_sub(HEADER_LEN)
}

/// Every address of every interface that is up, loopback interfaces
/// first. IPv6 link-local addresses are left out (they need a scope to
/// bind to, which an offer's address would have to carry). When the
/// interfaces cannot be listed, the loopback addresses alone.
pub fn list() -> Vec<Iface> {
    let mut v: Vec<Iface> = match getifaddrs() {
        Ok(it) => it
            .filter(|i| i.flags.contains(InterfaceFlags::IFF_UP))
            .filter_map(|i| {
                let addr = ip_of(i.address.as_ref()?)?;
                if is_link_local(&addr) {
                    return None;
                }
                let prefix = i.netmask.as_ref().and_then(ip_of).map_or(
                    if addr.is_ipv4() { 32 } else { 128 },
                    |m| match m {
                        IpAddr::V4(m) => u32::from(m).count_ones() as u8,
                        IpAddr::V6(m) => u128::from(m).count_ones() as u8,
                    },
                );
                Some(Iface {
                    mtu: mtu_of(&i.interface_name).unwrap_or(FALLBACK_MTU),
                    loopback: i.flags.contains(InterfaceFlags::IFF_LOOPBACK),
                    name: i.interface_name,
                    addr,
                    prefix,
                })
            })
            .collect(),
        Err(e) => {
            tracing::debug!(error = %e, "udp: getifaddrs failed; offering loopback only");
            Vec::new()
        }
    };
    if v.is_empty() {
        v = [
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
        ]
        .into_iter()
        .map(|addr| Iface {
            name: "lo".into(),
            prefix: if addr.is_ipv4() { 8 } else { 128 },
            addr,
            mtu: LOOPBACK_MTU,
            loopback: true,
        })
        .collect();
    }
    // Stable: within each group the system's order, IPv4 before IPv6.
    v.sort_by_key(|i| (!i.loopback, i.addr.is_ipv6()));
    v
}

/// The interface holding `ip`, if it is one of this host's (and up).
pub fn holding(ip: IpAddr) -> Option<Iface> {
    list().into_iter().find(|i| i.addr == ip)
}

/// The largest message an endpoint bound to `ip` can send in one
/// datagram: its interface's, or for a wildcard address (any interface)
/// the smallest among the interfaces of its family.
pub fn max_msg_at(ip: IpAddr) -> usize {
    if ip.is_unspecified() {
        return list()
            .iter()
            .filter(|i| i.addr.is_ipv6() == ip.is_ipv6())
            .map(Iface::max_msg)
            .min()
            .unwrap_or_else(|| max_payload(FALLBACK_MTU, ip.is_ipv6()));
    }
    match holding(ip) {
        Some(i) => i.max_msg(),
        // Loopback addresses beyond 127.0.0.1 are loopback's too.
        None if ip.is_loopback() => list()
            .iter()
            .find(|i| i.loopback && i.addr.is_ipv6() == ip.is_ipv6())
            .map_or_else(|| max_payload(LOOPBACK_MTU, ip.is_ipv6()), Iface::max_msg),
        None => max_payload(FALLBACK_MTU, ip.is_ipv6()),
    }
}

fn ip_of(s: &SockaddrStorage) -> Option<IpAddr> {
    if let Some(a) = s.as_sockaddr_in() {
        return Some(IpAddr::V4(a.ip()));
    }
    s.as_sockaddr_in6().map(|a| IpAddr::V6(a.ip()))
}

fn is_link_local(a: &IpAddr) -> bool {
    match a {
        IpAddr::V6(a) => a.segments()[0] & 0xffc0 == 0xfe80,
        IpAddr::V4(_) => false,
    }
}

/// `/sys/class/net/<name>/mtu`.
fn mtu_of(name: &str) -> Option<usize> {
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return None;
    }
    let s = std::fs::read_to_string(format!("/sys/class/net/{name}/mtu")).ok()?;
    parse_mtu(&s)
}

fn parse_mtu(s: &str) -> Option<usize> {
    s.trim().parse::<usize>().ok().filter(|&m| m >= 68)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn payload_limits() {
        // Loopback's 64 KiB MTU hits UDP's own limit first.
        assert_eq!(max_payload(65_536, false), 65_507 - HEADER_LEN);
        assert_eq!(max_payload(65_536, true), 65_536 - 48 - HEADER_LEN);
        assert_eq!(max_payload(1500, false), 1500 - 28 - HEADER_LEN);
        assert_eq!(max_payload(1500, true), 1500 - 48 - HEADER_LEN);
        assert_eq!(max_payload(0, false), 0);
    }

    #[test]
    fn networks_are_masked() {
        let i = Iface {
            name: "lo".into(),
            addr: "127.0.0.1".parse().unwrap(),
            prefix: 8,
            mtu: 65_536,
            loopback: true,
        };
        assert_eq!(i.network(), "127.0.0.0/8");
        let i = Iface {
            addr: "fd00::2".parse().unwrap(),
            prefix: 64,
            ..i
        };
        assert_eq!(i.network(), "fd00::/64");
        let i = Iface { prefix: 0, ..i };
        assert_eq!(i.network(), "::/0");
    }

    #[test]
    fn mtu_files_are_parsed_defensively() {
        assert_eq!(parse_mtu("1500\n"), Some(1500));
        assert_eq!(parse_mtu("garbage"), None);
        assert_eq!(parse_mtu("10"), None);
        assert_eq!(mtu_of("../etc"), None);
    }

    #[test]
    fn loopback_comes_first_and_is_always_there() {
        let l = list();
        assert!(l[0].loopback, "{l:?}");
        assert!(l.iter().any(|i| i.addr == IpAddr::V4(Ipv4Addr::LOCALHOST)));
        assert!(max_msg_at(IpAddr::V4(Ipv4Addr::LOCALHOST)) > 1000);
        assert!(max_msg_at(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 9))) > 1000);
    }
}
