//! Device discovery and the provider's `fi_getinfo` offers.
//!
//! [`discover`] walks every RDMA device and port and records what the
//! offers are built from: port state, link layer, the IP addresses of the
//! port's RoCE GIDs, the device limits and the largest inline send the
//! device accepts. Probing costs a few milliseconds (it creates throw-away
//! QPs), so [`offers`] works from [`discover_cached`], probed once per
//! process.
//!
//! The offers are an `FI_EP_MSG` and an `FI_EP_RDM` info per active port:
//! RC queue pairs connected through rdma_cm, send/receive with immediate
//! data, RMA write and read of regions with provider keys.
//! Their attributes follow libfabric's verbs provider where Weft implements
//! the same thing (fabric name `IB-0x<subnet prefix>`, message ordering,
//! 4-byte keys and CQ data, device limits in the domain attributes) and the
//! tcp provider's conventions elsewhere (queue sizes are the default depth
//! an endpoint gets, capped by the device).
//!
//! When there is nothing to offer, [`no_device_reason`] says why in terms a
//! user can act on, and [`describe`] prints what was found.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::path::Path;
use std::sync::OnceLock;

use weft_core::addr::encode_sockaddr;
use weft_core::attr::{
    version, AddrFormat, AvType, DomainAttr, EpAttr, EpType, FabricAttr, Info, Progress, Protocol,
    RxAttr, Threading, TxAttr, API_VERSION,
};
use weft_core::flags::{Caps, CompOrder, Mode, MrMode, MsgOrder, OpFlags};
use weft_core::Error;

use crate::sys::{
    list_devices, AtomicCap, Context, DeviceAttr, GidEntry, LinkLayer, PortAttr, PortState,
};
use crate::{dev_nodes, NAME};

/// Default transmit/receive queue depth of an endpoint (capped by the
/// device's `max_qp_wr`). Hints may ask for less, not more.
pub const QUEUE_SIZE: usize = 1024;
/// Cap on the scatter/gather entries of a send (a QP's send WQEs grow with
/// `max_send_sge`).
pub const TX_IOV_LIMIT: usize = 8;
/// CM data per connect: rdma_cm's 56-byte private-data limit for RC
/// requests, less the length byte Weft puts in front (rdma_cm pads private
/// data, so its length must travel with it).
pub const CM_DATA_SIZE: usize = crate::msg::CM_DATA_SIZE;
/// Bytes of remote CQ data on MSG and DGRAM: the 32-bit immediate of
/// `IBV_WR_SEND_WITH_IMM` (and, on MSG, of `IBV_WR_RDMA_WRITE_WITH_IMM`).
pub const CQ_DATA_SIZE: usize = 4;
/// MR key size: `lkey`/`rkey` are 32 bits.
pub const MR_KEY_SIZE: usize = 4;
/// Below this locked-memory limit, registering ordinary buffers fails.
pub const MIN_MEMLOCK: u64 = 64 << 20;
/// The `IB-0x` prefix of libfabric verbs fabric names.
pub const FABRIC_PREFIX: &str = "IB-0x";

/// What an RC QP keeps in order, as libfabric's verbs provider reports it
/// (`VERBS_MSG_ORDER`): everything but write-after-read and
/// send-after-read, which a responder may overtake. Each of read-after-
/// read, read-after-write and write-after-write holds for RMA and for
/// atomics alike (one QP carries both, in posting order), so their
/// `RMA_*` and `ATOMIC_*` forms are set with them.
pub const MSG_ORDER: MsgOrder = MsgOrder::RAR
    .union(MsgOrder::RMA_RAR)
    .union(MsgOrder::ATOMIC_RAR)
    .union(MsgOrder::RAW)
    .union(MsgOrder::RMA_RAW)
    .union(MsgOrder::ATOMIC_RAW)
    .union(MsgOrder::RAS)
    .union(MsgOrder::WAW)
    .union(MsgOrder::RMA_WAW)
    .union(MsgOrder::ATOMIC_WAW)
    .union(MsgOrder::WAS)
    .union(MsgOrder::SAW)
    .union(MsgOrder::SAS);

/// RMA as both endpoint types implement it: RDMA write and read of a
/// peer's registered region (one remote segment per operation). Atomics
/// (`FI_ATOMIC`: fetch-add and compare-swap of one `u64`) are added per
/// device, when it has them ([`with_atomics`]).
pub const RMA_CAPS: Caps = Caps::RMA
    .union(Caps::READ)
    .union(Caps::WRITE)
    .union(Caps::REMOTE_READ)
    .union(Caps::REMOTE_WRITE);

/// What the MSG endpoint implements: two-sided messages with immediate
/// data, and RMA, writes with immediate data included. Remote CQ data
/// completes a posted receive at the target, writes' as well as sends'
/// (the offer's optional `FI_RX_CQ_DATA` mode; see the `msg` module).
pub const MSG_CAPS: Caps = Caps::MSG
    .union(Caps::SEND)
    .union(Caps::RECV)
    .union(Caps::REMOTE_CQ_DATA)
    .union(Caps::LOCAL_COMM)
    .union(Caps::REMOTE_COMM)
    .union(RMA_CAPS);

/// What the application must do about registration: the keys of its
/// regions are the device's (`PROV_KEY`) and RMA addresses are virtual
/// addresses (`VIRT_ADDR`). Regions come from the domain's `mr_alloc`, so
/// `ALLOCATED` holds by construction and is not asked. The device needs
/// local buffers registered too, but the provider does that itself for
/// each operation, so `FI_MR_LOCAL` is not asked either. Both bits concern
/// RMA targets only: getinfo asks them only of hints that want RMA.
pub const MR_MODE: MrMode = MrMode::PROV_KEY.union(MrMode::VIRT_ADDR);

const SYS_INFINIBAND: &str = "/sys/class/infiniband";
const SYS_UVERBS: &str = "/sys/class/infiniband_verbs";
const DEV_INFINIBAND: &str = "/dev/infiniband";
const RXE_HINT: &str = "modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <if>";
/// `CAP_IPC_LOCK`: pinning beyond `RLIMIT_MEMLOCK` is allowed.
const CAP_IPC_LOCK: u32 = 14;

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
fn port_ips(link_layer: LinkLayer, gids: &[GidEntry]) -> Vec<IpAddr> {
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
/// queried are skipped (with a `tracing` warning; [`no_device_reason`]
/// explains them). An error means libibverbs could not list devices at all
/// (usually: no RDMA support in the kernel).
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

/// The provider's offers: one `FI_EP_MSG` info per active port of every
/// device, in device and port order. Empty when there is no active port
/// (see [`no_device_reason`]).
pub fn offers() -> Vec<Info> {
    match discover_cached() {
        Ok(reports) => offers_for(reports),
        Err(_) => Vec::new(),
    }
}

/// The offers for the given ports (inactive ones are skipped).
pub fn offers_for(reports: &[DeviceReport]) -> Vec<Info> {
    reports
        .iter()
        .filter(|r| r.is_active())
        .flat_map(|r| {
            [
                rdm_offer(r),
                msg_offer(r),
                dgram_offer(r),
                crate::msg::stream::offer(r),
            ]
        })
        .collect()
}

/// What the RDM endpoint implements: tagged and untagged messages with
/// 64-bit CQ data (carried in Weft's header), source addresses (with
/// `FI_SOURCE_ERR` on request: getinfo leaves it out of results that did
/// not name it), directed receives, and multi-receive buffers (matched in
/// software, see the `rdm` module).
pub const RDM_CAPS: Caps = Caps::MSG
    .union(Caps::TAGGED)
    .union(Caps::SEND)
    .union(Caps::RECV)
    .union(Caps::REMOTE_CQ_DATA)
    .union(Caps::SOURCE)
    .union(Caps::SOURCE_ERR)
    .union(Caps::DIRECTED_RECV)
    .union(Caps::AV_USER_ID)
    .union(Caps::LOCAL_COMM)
    .union(Caps::REMOTE_COMM)
    .union(Caps::MULTI_RECV)
    .union(RMA_CAPS);

/// `caps` with `FI_ATOMIC` if the device does 64-bit atomics.
pub fn with_atomics(caps: Caps, a: AtomicCap) -> Caps {
    if a == AtomicCap::None {
        caps
    } else {
        caps | Caps::ATOMIC
    }
}

/// Tag bits: all 64 are matched.
pub const MEM_TAG_FORMAT: u64 = 0xAAAA_AAAA_AAAA_AAAA;

/// The MSG offer of a port without what only MSG has, for the RDM and
/// DGRAM offers to build on: no CM data, no RMA ordering sizes, no
/// `FI_RX_CQ_DATA` (RDM's remote CQ data travels in a note of its own,
/// DGRAM has no RMA), and no shared receive contexts (`rdm_offer` adds
/// its own: RDM shares its software matcher, not an SRQ).
fn connectionless_base(r: &DeviceReport) -> Info {
    let mut i = msg_offer(r);
    i.mode = Mode::empty();
    i.rx_attr.mode = Mode::empty();
    i.domain_attr.max_ep_srx_ctx = 0;
    i.ep_attr.cm_data_size = 0;
    i.ep_attr.max_order_raw_size = 0;
    i.ep_attr.max_order_waw_size = 0;
    i
}

/// The `FI_EP_RDM` offer of one port: Weft's protocol over RC queue pairs
/// (see the `rdm` module). Inject size is what fits inline beside the
/// header; operations keep an RC queue pair's order (one RC connection
/// per peer, one backlog).
pub fn rdm_offer(r: &DeviceReport) -> Info {
    let mut i = connectionless_base(r);
    let caps = with_atomics(RDM_CAPS, r.attr.atomic_cap) | Caps::FENCE;
    i.caps = caps;
    i.tx_attr.caps = caps
        & !(Caps::RECV | Caps::DIRECTED_RECV | Caps::SOURCE | Caps::SOURCE_ERR | Caps::MULTI_RECV);
    i.rx_attr.caps = caps & !(Caps::SEND | Caps::FENCE);
    // One RC queue pair per peer, and sends and RMA to a peer leave
    // through one backlog in posting order: what RC keeps on MSG holds
    // here too (a rendezvous send's header is what is ordered; the
    // receiver pulls its data when it matches).
    i.tx_attr.msg_order = MSG_ORDER;
    i.rx_attr.msg_order = MSG_ORDER;
    i.tx_attr.inject_size = crate::rdm::inject_size(to_usize(r.max_inline));
    i.rx_attr.iov_limit = i.tx_attr.iov_limit;
    i.ep_attr.ep_type = EpType::Rdm;
    i.ep_attr.protocol = Protocol::WeftRdmRc;
    i.ep_attr.mem_tag_format = MEM_TAG_FORMAT;
    // The 64-bit data rides in Weft's header.
    i.domain_attr.cq_data_size = 8;
    // The receiver acknowledges a delivery-complete message once it is
    // placed or buffered. Match-complete would need the acknowledgement
    // held until a receive takes it: not offered.
    // FI_FENCE is IBV_SEND_FENCE on the work request that carries the
    // fenced operation (its header, for a send).
    i.tx_attr.op_flags_supported = OpFlags::TX_BASE | OpFlags::DELIVERY_COMPLETE | OpFlags::FENCE;
    i.rx_attr.op_flags_supported = OpFlags::RX_BASE | OpFlags::PEEK_FAMILY | OpFlags::MULTI_RECV;
    // A shared receive context shares the software matcher
    // (`crate::rdm::srx`); it needs no SRQ beyond each endpoint's own.
    i.domain_attr.max_ep_srx_ctx = 1;
    // Scalable endpoints (`crate::rdm::scalable`): receive contexts are
    // named by `fi_rx_addr`, up to one header byte's worth each way.
    i.caps |= Caps::NAMED_RX_CTX;
    i.rx_attr.caps |= Caps::NAMED_RX_CTX;
    i.domain_attr.max_ep_tx_ctx = RDM_MAX_CTX;
    i.domain_attr.max_ep_rx_ctx = RDM_MAX_CTX;
    i
}

/// Contexts of a scalable RDM endpoint, each way (`rdm::scalable::MAX_CTX`).
pub const RDM_MAX_CTX: usize = 256;

/// What the DGRAM endpoint implements: datagrams of up to one path MTU
/// on a UD queue pair, with 32-bit remote CQ data (immediate data),
/// source addresses, directed receives and multicast groups
/// (`rdma_join_multicast`).
pub const DGRAM_CAPS: Caps = Caps::MSG
    .union(Caps::SEND)
    .union(Caps::RECV)
    .union(Caps::REMOTE_CQ_DATA)
    .union(Caps::SOURCE)
    .union(Caps::DIRECTED_RECV)
    .union(Caps::MULTICAST)
    .union(Caps::LOCAL_COMM)
    .union(Caps::REMOTE_COMM);

/// The `FI_EP_DGRAM` offer of one port (see the `dgram` module): a
/// message is one UD packet, so the largest is the port's active MTU.
/// Addresses are the IP and port of the endpoint's rdma_cm id, which
/// inserts resolve to an address handle and queue pair.
pub fn dgram_offer(r: &DeviceReport) -> Info {
    let mut i = connectionless_base(r);
    let mtu = to_usize(r.port_attr.active_mtu.bytes());
    i.caps = DGRAM_CAPS;
    i.tx_attr.caps = DGRAM_CAPS & !(Caps::RECV | Caps::DIRECTED_RECV | Caps::SOURCE);
    i.rx_attr.caps = DGRAM_CAPS & !Caps::SEND;
    // UD promises neither delivery nor order.
    i.tx_attr.msg_order = MsgOrder::empty();
    i.rx_attr.msg_order = MsgOrder::empty();
    i.tx_attr.inject_size = to_usize(r.max_inline).min(mtu);
    i.tx_attr.rma_iov_limit = 0;
    i.rx_attr.iov_limit = i.tx_attr.iov_limit;
    i.ep_attr.ep_type = EpType::Dgram;
    i.ep_attr.protocol = Protocol::IbUd;
    i.ep_attr.max_msg_size = mtu;
    i.domain_attr.cq_data_size = 4;
    i.domain_attr.mr_mode = MrMode::empty();
    // The destination, a group's address or a peer's, decides where a
    // datagram goes: the flag changes nothing.
    i.tx_attr.op_flags_supported |= OpFlags::MULTICAST;
    // No connection, so nothing to prove a key on: keyed hints do not
    // match, and a keyed DGRAM endpoint is `OpNotSupp`.
    i.domain_attr.max_ep_auth_key = 0;
    i
}

fn to_usize(v: u32) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

/// The `FI_EP_MSG` offer of one port.
pub fn msg_offer(r: &DeviceReport) -> Info {
    let a = &r.attr;
    let caps = with_atomics(MSG_CAPS, a.atomic_cap) | Caps::FENCE;
    let src = r.src_addr();
    let addr_format = match src {
        Some(SocketAddr::V6(_)) => AddrFormat::SockaddrIn6,
        _ => AddrFormat::SockaddrIn,
    };
    let max_msg_size = to_usize(r.port_attr.max_msg_sz);
    let queue = QUEUE_SIZE.min(to_usize(a.max_qp_wr));
    Info {
        caps,
        // Optional (getinfo drops it for hints that do not accept it):
        // a write's remote CQ data takes a posted receive.
        mode: Mode::RX_CQ_DATA,
        addr_format,
        src_addr: src.map(|s| encode_sockaddr(&s)),
        dest_addr: None,
        tx_attr: TxAttr {
            caps: caps & !Caps::RECV,
            mode: Mode::empty(),
            msg_order: MSG_ORDER,
            comp_order: CompOrder::empty(),
            inject_size: to_usize(r.max_inline),
            // One send queue entry of the device's is the liveness probe's.
            size: queue.min(to_usize(a.max_qp_wr).saturating_sub(1)),
            iov_limit: TX_IOV_LIMIT.min(to_usize(a.max_sge)),
            rma_iov_limit: 1,
            // A send's completion on RC means the peer's NIC has it, not
            // that a receive took it: no delivery- or match-complete.
            // FI_FENCE is IBV_SEND_FENCE (`msg::post`).
            op_flags_supported: OpFlags::TX_BASE | OpFlags::FENCE,
            ..TxAttr::default()
        },
        rx_attr: RxAttr {
            caps: caps & !(Caps::SEND | Caps::FENCE),
            mode: Mode::RX_CQ_DATA,
            msg_order: MSG_ORDER,
            comp_order: CompOrder::empty(),
            total_buffered_recv: 0,
            size: queue,
            iov_limit: to_usize(a.max_sge),
            op_flags_supported: OpFlags::RX_BASE,
            ..RxAttr::default()
        },
        ep_attr: EpAttr {
            ep_type: EpType::Msg,
            protocol: Protocol::RdmaCmIbRc,
            protocol_version: 1,
            max_msg_size,
            msg_prefix_size: 0,
            max_order_raw_size: max_msg_size,
            max_order_war_size: 0,
            max_order_waw_size: max_msg_size,
            mem_tag_format: 0,
            tx_ctx_cnt: 1,
            rx_ctx_cnt: 1,
            cm_data_size: CM_DATA_SIZE,
            auth_key: None,
        },
        domain_attr: DomainAttr {
            name: Some(r.name.clone()),
            threading: Threading::Safe,
            control_progress: Progress::Auto,
            data_progress: Progress::Auto,
            av_type: AvType::Unspec,
            mr_mode: MR_MODE,
            mr_key_size: MR_KEY_SIZE,
            cq_data_size: CQ_DATA_SIZE,
            cq_cnt: to_usize(a.max_cq),
            ep_cnt: to_usize(a.max_qp),
            tx_ctx_cnt: to_usize(a.max_qp),
            rx_ctx_cnt: to_usize(a.max_qp),
            max_ep_tx_ctx: 1,
            max_ep_rx_ctx: 1,
            // An endpoint takes receives from at most one shared context.
            max_ep_srx_ctx: usize::from(a.max_srq > 0),
            // No shared transmit contexts (fi_stx_context is NoSys).
            max_ep_stx_ctx: 0,
            mr_iov_limit: 1,
            mr_cnt: to_usize(a.max_mr),
            caps: Caps::LOCAL_COMM | Caps::REMOTE_COMM,
            mode: Mode::empty(),
            auth_key: None,
            // One key per endpoint, proven over rdma_cm private data
            // (`crate::keyproof`); DGRAM has no connection to prove it
            // on and takes none (`dgram_offer`).
            max_ep_auth_key: 1,
            // Offers carry no `FI_AV_AUTH_KEY`; hints with it match RDM
            // offers only (`VerbsProvider::offer_for`).
            av_auth_key: false,
            tls: None,
            // No TLS over RDMA: asking a verbs domain for it is
            // `OpNotSupp`, and hints asking for it match no verbs offer.
            tls_capable: false,
        },
        fabric_attr: FabricAttr {
            name: Some(r.fabric_name()),
            prov_name: Some(NAME.into()),
            prov_version: version(0, 1),
            api_version: API_VERSION,
        },
    }
}

/// Why there is nothing to offer: `None` when at least one active port
/// exists, otherwise a message naming the cause and the fix (no RDMA in the
/// kernel, no device, missing user-space driver, a device node missing or
/// not accessible, ports not active), followed by a warning if the
/// locked-memory limit is too low for memory registration.
pub fn no_device_reason() -> Option<String> {
    let cached = discover_cached();
    if matches!(cached, Ok(r) if r.iter().any(DeviceReport::is_active)) {
        return None;
    }
    // `None` from a fresh diagnosis: usable now, but not when this process
    // probed (and cached) the devices.
    let mut msg = diagnose().unwrap_or_else(|| {
        "RDMA ports became active after this process probed the devices; \
         restart it to use them"
            .to_owned()
    });
    if let Some(w) = memlock_warning() {
        msg.push_str("\nalso: ");
        msg.push_str(&w);
    }
    Some(msg)
}

/// A fresh diagnosis (not cached): `None` if an active port exists.
fn diagnose() -> Option<String> {
    let sys = Path::new(SYS_INFINIBAND);
    if !sys.is_dir() {
        return Some(format!(
            "no RDMA device: {SYS_INFINIBAND} is missing (kernel without RDMA support, \
             or rdma_rxe not loaded: {RXE_HINT})"
        ));
    }
    let kernel_devs = dir_names(sys);
    if kernel_devs.is_empty() {
        return Some(format!(
            "no RDMA device: {SYS_INFINIBAND} is empty (no RDMA NIC, or no soft-RoCE \
             device yet: {RXE_HINT})"
        ));
    }
    let listed = match list_devices() {
        Ok(l) => l,
        Err(e) => {
            return Some(format!(
                "the kernel has RDMA devices ({}) but libibverbs cannot list them: {e}",
                kernel_devs.join(", ")
            ))
        }
    };
    if listed.is_empty() {
        let nodes = dev_nodes::scan(Path::new(SYS_UVERBS), Path::new(DEV_INFINIBAND));
        let node_problems: Vec<String> =
            nodes.iter().filter_map(dev_nodes::Node::problem).collect();
        if !nodes.is_empty() && node_problems.len() == nodes.len() {
            // Typical of a container given no device: sysfs shows the
            // host's devices, /dev does not have their nodes.
            let mut msg = format!(
                "no RDMA device node: the kernel has RDMA devices ({}) but none of their \
                 nodes in {DEV_INFINIBAND} is usable:",
                kernel_devs.join(", ")
            );
            for p in node_problems {
                msg.push_str("\n  - ");
                msg.push_str(&p);
            }
            return Some(msg);
        }
        let why = if Path::new(SYS_UVERBS).is_dir() {
            "their user-space drivers are missing (install rdma-core's \
             ibverbs-providers, e.g. librxe for rxe, mlx5 for ConnectX)"
                .to_owned()
        } else {
            format!("{SYS_UVERBS} is missing (ib_uverbs not loaded: modprobe ib_uverbs)")
        };
        return Some(format!(
            "the kernel has RDMA devices ({}) but libibverbs lists none: {why}",
            kernel_devs.join(", ")
        ));
    }

    let mut problems = Vec::new();
    for dev in &listed {
        let ctx = match Context::open(&dev.name) {
            Ok(c) => c,
            Err(e) => {
                problems.push(open_failure(&dev.name, e));
                continue;
            }
        };
        let attr = match ctx.query_device() {
            Ok(a) => a,
            Err(e) => {
                problems.push(format!("{}: ibv_query_device failed: {e}", dev.name));
                continue;
            }
        };
        if attr.phys_port_cnt == 0 {
            problems.push(format!("{}: the device has no ports", dev.name));
        }
        for port in 1..=attr.phys_port_cnt {
            match ctx.query_port(port) {
                Ok(p) if p.state == PortState::Active => return None,
                Ok(p) => problems.push(format!(
                    "{} port {port}: {} ({} link layer): not active ({})",
                    dev.name,
                    state_str(p.state),
                    link_layer_str(p.link_layer),
                    inactive_hint(p.link_layer)
                )),
                Err(e) => problems.push(format!(
                    "{} port {port}: ibv_query_port failed: {e}",
                    dev.name
                )),
            }
        }
    }
    let mut msg = format!("no active RDMA port ({} device(s) found):", listed.len());
    for p in problems {
        msg.push_str("\n  - ");
        msg.push_str(&p);
    }
    Some(msg)
}

fn inactive_hint(ll: LinkLayer) -> &'static str {
    match ll {
        LinkLayer::Ethernet => {
            "RoCE: bring the netdev up (ip link set <if> up) and check its carrier; \
             `rdma link` shows which netdev it is"
        }
        _ => "InfiniBand: check the cable and that a subnet manager (opensm) runs on the fabric",
    }
}

/// Explains why `ibv_open_device` failed, naming the device node.
fn open_failure(dev: &str, e: Error) -> String {
    let node = dev_nodes::node_of(Path::new(SYS_UVERBS), Path::new(DEV_INFINIBAND), dev);
    if let Some(p) = node.as_ref().and_then(dev_nodes::Node::problem) {
        return format!("{dev}: cannot be opened ({e}): {p}");
    }
    let Some(node) = node.map(|n| n.name) else {
        return format!(
            "{dev}: cannot be opened ({e}), and no {SYS_UVERBS}/uverbs* entry belongs to it \
             (ib_uverbs not loaded? modprobe ib_uverbs)"
        );
    };
    // The node is there and is the right device (checked above).
    let path = Path::new(DEV_INFINIBAND).join(&node);
    let shown = path.display();
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
    {
        Err(io) if io.kind() == std::io::ErrorKind::PermissionDenied => format!(
            "{dev}: cannot be opened ({e}): no permission to open {shown} read-write \
             (check its owner/mode, e.g. the rdma group or udev rules)"
        ),
        Err(io) => format!("{dev}: cannot be opened ({e}): opening {shown} fails: {io}"),
        Ok(_) => format!(
            "{dev}: cannot be opened ({e}) although {shown} can be (driver or firmware \
             problem? see dmesg)"
        ),
    }
}

fn dir_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// The soft `RLIMIT_MEMLOCK` from `/proc/self/limits`: `Some(None)` for
/// unlimited, `None` if it cannot be read.
pub fn memlock_limit() -> Option<Option<u64>> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_memlock(&text)
}

fn parse_memlock(limits: &str) -> Option<Option<u64>> {
    let line = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max locked memory"))?;
    let soft = line.split_whitespace().next()?;
    if soft == "unlimited" {
        return Some(None);
    }
    soft.parse().ok().map(Some)
}

/// Whether `CapEff` in `/proc/self/status` has `CAP_IPC_LOCK`.
fn has_cap_ipc_lock() -> bool {
    // Bytes, not a string: the `Name:` line holds the command name,
    // which may be any bytes, and a name that is not UTF-8 would make
    // the whole file unreadable as a string (the capability then
    // reported absent).
    std::fs::read("/proc/self/status").is_ok_and(|s| parse_cap_ipc_lock(&s))
}

fn parse_cap_ipc_lock(status: &[u8]) -> bool {
    status
        .split(|&b| b == b'\n')
        .find_map(|l| l.strip_prefix(b"CapEff:"))
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// A warning when the locked-memory limit (`ulimit -l`) is below
/// [`MIN_MEMLOCK`]: memory registration pins pages and fails beyond it.
pub fn memlock_warning() -> Option<String> {
    memlock_message(memlock_limit()?, has_cap_ipc_lock())
}

fn memlock_message(limit: Option<u64>, cap_ipc_lock: bool) -> Option<String> {
    let limit = limit?;
    if limit >= MIN_MEMLOCK {
        return None;
    }
    let mut msg = format!(
        "the locked-memory limit (RLIMIT_MEMLOCK, 'Max locked memory' in /proc/self/limits) \
         is {}, below {}: registering larger buffers will fail with ENOMEM; raise it with \
         `ulimit -l unlimited` (or memlock in /etc/security/limits.conf, LimitMEMLOCK= for \
         systemd units; containers: `docker run --ulimit memlock=-1`)",
        bytes_str(limit),
        bytes_str(MIN_MEMLOCK)
    );
    if cap_ipc_lock {
        msg.push_str(
            "; this process has CAP_IPC_LOCK, which lifts the limit unless it runs in a \
             user namespace (rootless container)",
        );
    }
    Some(msg)
}

fn bytes_str(b: u64) -> String {
    if b >= 1 << 20 && b % (1 << 20) == 0 {
        format!("{} MiB", b >> 20)
    } else if b >= 1 << 10 && b % (1 << 10) == 0 {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} bytes")
    }
}

fn state_str(s: PortState) -> String {
    match s {
        PortState::Nop => "NOP".into(),
        PortState::Down => "DOWN".into(),
        PortState::Init => "INIT".into(),
        PortState::Armed => "ARMED".into(),
        PortState::Active => "ACTIVE".into(),
        PortState::ActiveDefer => "ACTIVE_DEFER".into(),
        PortState::Unknown(v) => format!("unknown state {v}"),
    }
}

fn link_layer_str(l: LinkLayer) -> &'static str {
    match l {
        LinkLayer::InfiniBand => "InfiniBand",
        LinkLayer::Ethernet => "Ethernet",
        LinkLayer::Unspecified => "unspecified",
    }
}

fn atomic_str(a: AtomicCap) -> &'static str {
    match a {
        AtomicCap::None => "none",
        AtomicCap::Hca => "HCA (between QPs of this device)",
        AtomicCap::Glob => "global",
    }
}

/// A human summary of every device and port, for `weft info -p verbs -v`:
/// state, link layer, MTU, addresses, the limits offers are built from,
/// and the reason there is nothing to offer (if so) and a memlock warning.
pub fn describe() -> String {
    let mut out = String::new();
    match discover_cached() {
        Err(e) => {
            let _ = writeln!(out, "verbs: cannot list RDMA devices: {e}");
        }
        Ok(reports) => {
            let _ = writeln!(out, "verbs: {} RDMA port(s)", reports.len());
            for r in reports {
                describe_port(&mut out, r);
            }
        }
    }
    if let Some(reason) = no_device_reason() {
        let _ = writeln!(out, "verbs: nothing offered: {reason}");
    } else if let Some(w) = memlock_warning() {
        let _ = writeln!(out, "verbs: warning: {w}");
    }
    out
}

fn describe_port(out: &mut String, r: &DeviceReport) {
    let (a, p) = (&r.attr, &r.port_attr);
    let ips = if r.ips.is_empty() {
        "(none)".to_owned()
    } else {
        r.ips
            .iter()
            .map(IpAddr::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        out,
        "{} port {}: {}, link layer {}, MTU {} (max {}), fabric {}{}",
        r.name,
        r.port,
        state_str(r.state),
        link_layer_str(r.link_layer),
        p.active_mtu.bytes(),
        p.max_mtu.bytes(),
        r.fabric_name(),
        if r.is_active() { "" } else { " (not offered)" }
    );
    let _ = writeln!(out, "    addresses: {ips}");
    let _ = writeln!(
        out,
        "    fw {}, node guid {:016x}, vendor {:#x}/{:#x}",
        a.fw_ver, a.node_guid, a.vendor_id, a.vendor_part_id
    );
    let _ = writeln!(
        out,
        "    max_qp {}, max_qp_wr {}, max_sge {}, max_cq {}, max_cqe {}, max_srq {}",
        a.max_qp, a.max_qp_wr, a.max_sge, a.max_cq, a.max_cqe, a.max_srq
    );
    let _ = writeln!(
        out,
        "    max_mr {}, max_mr_size {:#x}, max_msg_sz {}, max inline {}, atomics {}",
        a.max_mr,
        a.max_mr_size,
        p.max_msg_sz,
        r.max_inline,
        atomic_str(a.atomic_cap)
    );
}

#[cfg(test)]
#[path = "info_tests.rs"]
mod tests;
