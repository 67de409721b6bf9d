//! The `fi_getinfo` offers built from the probed ports: `FI_EP_MSG`,
//! `FI_EP_RDM` and `FI_EP_DGRAM` infos per active port.

use std::net::SocketAddr;

use weft_core::addr::encode_sockaddr;
use weft_core::attr::{
    version, AddrFormat, AvType, DomainAttr, EpAttr, EpType, FabricAttr, Info, Progress, Protocol,
    RxAttr, Threading, TxAttr, API_VERSION,
};
use weft_core::flags::{Caps, CompOrder, Mode, MrMode, MsgOrder, OpFlags};

use crate::NAME;

use super::attrs::{
    with_atomics, CM_DATA_SIZE, CQ_DATA_SIZE, DGRAM_CAPS, MEM_TAG_FORMAT, MR_KEY_SIZE, MR_MODE,
    MSG_CAPS, MSG_ORDER, QUEUE_SIZE, RDM_CAPS, RDM_MAX_CTX, TX_IOV_LIMIT,
};
use super::probe::{discover_cached, DeviceReport};

/// The provider's offers: one `FI_EP_MSG` info per active port of every
/// device, in device and port order. Empty when there is no active port
/// (see [`no_device_reason`](super::no_device_reason)).
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
