//! The control connection's addresses: the peer's name resolved, and
//! ours as the provider takes it.

use std::net::{IpAddr, SocketAddr};

use crate::fail::{Context, Failure, Res};

/// An IPv4 address that arrived IPv4-mapped (a dual-stack socket) as the
/// plain IPv4 one the provider's `FI_SOCKADDR_IN` endpoints bind to.
pub(crate) fn unmap(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The provider speaks `FI_SOCKADDR_IN`, so IPv4 answers come first.
pub(crate) async fn resolve(host: &str, port: u16) -> Res<SocketAddr> {
    let what = || format!("resolve {host}:{port}");
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .with_ctx(what)?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| Failure::new(what(), "no address found"))
}
