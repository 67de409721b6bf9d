//! Device discovery: every device's ports probed for state, link layer, RoCE
//! GID addresses, limits and the largest inline send ([`discover`]).

use std::collections::HashSet;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::sync::OnceLock;

use weft_core::Error;

use crate::sys::{list_devices, Context, DeviceAttr, GidEntry, LinkLayer, PortAttr, PortState};

use super::attrs::FABRIC_PREFIX;

/// One port of one device, as found by [`discover`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceReport {
    /// Device name, e.g. `rxe1`, `mlx5_0`.
    pub name: String,
    /// Port number (from 1).
    pub port: u8,
    /// Logical port state; only `Active` ports are offered.
    pub state: PortState,
    /// InfiniBand, or Ethernet for RoCE (and iWARP).
    pub link_layer: LinkLayer,
    /// The IP addresses of the port's RoCE GIDs, IPv4 first, without
    /// duplicates; IPv6 link-local ones only if there is nothing else.
    /// Empty on InfiniBand ports (their GIDs are not IP addresses).
    pub ips: Vec<IpAddr>,
    /// Device attributes.
    pub attr: DeviceAttr,
    /// Port attributes.
    pub port_attr: PortAttr,
    /// Largest `max_inline_data` of an RC QP (0 if probing failed).
    pub max_inline: u32,
    /// The port's valid GID table entries.
    pub gids: Vec<GidEntry>,
    /// Subnet prefix of GID index 0 (host order), which names the fabric.
    pub subnet_prefix: u64,
}

impl DeviceReport {
    /// The libfabric verbs fabric name, `IB-0x<subnet prefix in hex>` (RoCE
    /// ports included, as libfabric names them).
    pub fn fabric_name(&self) -> String {
        format!("{FABRIC_PREFIX}{:x}", self.subnet_prefix)
    }

    /// Whether the port is offered.
    pub fn is_active(&self) -> bool {
        self.state == PortState::Active
    }

    /// The source address offers use: the first IP with port 0; IPv6
    /// link-local addresses get the scope of their netdev.
    pub fn src_addr(&self) -> Option<SocketAddr> {
        let ip = *self.ips.first()?;
        Some(match ip {
            IpAddr::V6(v6) if is_link_local(&v6) => {
                let scope = self
                    .gids
                    .iter()
                    .find(|e| e.gid.to_ip() == Some(ip))
                    .map_or(0, |e| e.ndev_ifindex);
                SocketAddr::V6(SocketAddrV6::new(v6, 0, 0, scope))
            }
            ip => SocketAddr::new(ip, 0),
        })
    }
}

fn is_link_local(v6: &Ipv6Addr) -> bool {
    v6.segments()[0] & 0xffc0 == 0xfe80
}

/// The IPs of a port's RoCE GIDs (see [`DeviceReport::ips`]).
pub(super) fn port_ips(link_layer: LinkLayer, gids: &[GidEntry]) -> Vec<IpAddr> {
    if link_layer != LinkLayer::Ethernet {
        return Vec::new();
    }
    let mut seen = HashSet::new();
    let all: Vec<IpAddr> = gids
        .iter()
        .filter_map(|e| e.gid.to_ip())
        .filter(|ip| seen.insert(*ip))
        .collect();
    let link_local = |ip: &IpAddr| matches!(ip, IpAddr::V6(v6) if is_link_local(v6));
    let mut ips: Vec<IpAddr> = all.iter().copied().filter(|ip| !link_local(ip)).collect();
    if ips.is_empty() {
        ips = all;
    }
    // Stable: keeps the table order within each family.
    ips.sort_by_key(|ip| ip.is_ipv6());
    ips
}

/// Probes every port of every device. Devices that cannot be opened or
/// queried are skipped (with a `tracing` warning;
/// [`no_device_reason`](super::no_device_reason) explains them). An
/// error means libibverbs could not list devices at all (usually: no
/// RDMA support in the kernel).
pub fn discover() -> Result<Vec<DeviceReport>, Error> {
    let mut out = Vec::new();
    for dev in list_devices()? {
        match probe_device(&dev.name) {
            Ok(ports) => out.extend(ports),
            Err(e) => tracing::warn!(device = %dev.name, error = %e, "skipping RDMA device"),
        }
    }
    Ok(out)
}

fn probe_device(name: &str) -> Result<Vec<DeviceReport>, Error> {
    let ctx = Context::open(name)?;
    let attr = ctx.query_device()?;
    let table = ctx.gid_table().unwrap_or_else(|e| {
        tracing::warn!(device = %name, error = %e, "cannot read the GID table");
        Vec::new()
    });
    let max_inline = ctx.probe_max_inline_data().unwrap_or_else(|e| {
        tracing::warn!(device = %name, error = %e, "cannot probe max_inline_data; using 0");
        0
    });
    let mut out = Vec::new();
    for port in 1..=attr.phys_port_cnt {
        let port_attr = ctx.query_port(port)?;
        let gids: Vec<GidEntry> = table.iter().filter(|e| e.port == port).copied().collect();
        let gid0 = gids
            .iter()
            .find(|e| e.index == 0)
            .map(|e| e.gid)
            .or_else(|| ctx.query_gid(port, 0).ok())
            .unwrap_or_default();
        let mut prefix = [0u8; 8];
        prefix.copy_from_slice(&gid0.0[..8]);
        out.push(DeviceReport {
            name: name.to_owned(),
            port,
            state: port_attr.state,
            link_layer: port_attr.link_layer,
            ips: port_ips(port_attr.link_layer, &gids),
            attr: attr.clone(),
            port_attr,
            max_inline,
            gids,
            subnet_prefix: u64::from_be_bytes(prefix),
        });
    }
    Ok(out)
}

/// [`discover`], probed once per process and cached (devices that appear
/// later are not seen until restart).
pub fn discover_cached() -> Result<&'static [DeviceReport], Error> {
    static CACHE: OnceLock<Result<Vec<DeviceReport>, Error>> = OnceLock::new();
    match CACHE.get_or_init(discover) {
        Ok(v) => Ok(v.as_slice()),
        Err(e) => Err(*e),
    }
}
