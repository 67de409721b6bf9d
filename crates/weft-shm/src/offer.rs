//! The provider's one offer: `FI_EP_RDM` between the processes of this
//! host, addresses as `FI_ADDR_STR` names (`fi_shm://<name>`).

use weft_core::attr::{
    version, AddrFormat, AvType, DomainAttr, EpAttr, EpType, FabricAttr, Info, Progress, Protocol,
    RxAttr, Threading, TxAttr, API_VERSION,
};
use weft_core::flags::{Caps, CompOrder, MrMode, MsgOrder, OpFlags};

use crate::{
    BUFFERED_RECV, INJECT_SIZE, IOV_LIMIT, MAX_MSG_SIZE, MEM_TAG_FORMAT, NAME, QUEUE_SIZE,
};

/// What an shm endpoint does: untagged and tagged messages with 64-bit
/// remote CQ data, source addresses (with `FI_SOURCE_ERR` on request) and
/// directed receives, RMA reads and writes and atomics (the target does
/// every access to its regions), multi-receive buffers and fences,
/// between processes of one host. No RMA events yet.
pub const CAPS: Caps = Caps::MSG
    .union(Caps::TAGGED)
    .union(Caps::SEND)
    .union(Caps::RECV)
    .union(Caps::REMOTE_CQ_DATA)
    .union(Caps::SOURCE)
    .union(Caps::SOURCE_ERR)
    .union(Caps::DIRECTED_RECV)
    .union(Caps::LOCAL_COMM)
    .union(Caps::RMA)
    .union(Caps::ATOMIC)
    .union(Caps::READ)
    .union(Caps::WRITE)
    .union(Caps::REMOTE_READ)
    .union(Caps::REMOTE_WRITE)
    // Multi-receive buffers: docs/design.md, "Multi-receive buffers".
    .union(Caps::MULTI_RECV)
    // A fenced operation waits for the earlier ones: `tx.rs`.
    .union(Caps::FENCE);

/// The fabric name: the provider's, and how large messages and RMA
/// transfers move ([`crate::cma::mode`]).
pub fn fabric_name() -> String {
    format!("{NAME}-{}", crate::cma::mode().label())
}

/// Every offer: none where claim locks do not work
/// (`claim_lock::usable`), as an endpoint could not be made.
pub fn offers() -> Vec<Info> {
    if !crate::claim_lock::usable() {
        return Vec::new();
    }
    vec![offer()]
}

/// The RDM offer.
pub fn offer() -> Info {
    // Everything one endpoint sends to another travels one ring, in
    // posting order, and the target handles each record to its end (a
    // message matched or held, a write placed, a read's bytes copied
    // out, an atomic applied) before the next: every ordering bit holds
    // (docs/design.md, "Ordering and fences on shm").
    let order = MsgOrder::all();
    Info {
        caps: CAPS,
        addr_format: AddrFormat::Str,
        tx_attr: TxAttr {
            caps: CAPS
                & !(Caps::RECV
                    | Caps::DIRECTED_RECV
                    | Caps::SOURCE
                    | Caps::SOURCE_ERR
                    | Caps::REMOTE_READ
                    | Caps::REMOTE_WRITE
                    | Caps::MULTI_RECV),
            msg_order: order,
            comp_order: CompOrder::empty(),
            inject_size: INJECT_SIZE,
            size: QUEUE_SIZE,
            iov_limit: IOV_LIMIT,
            // One remote segment per operation (fi_msg_rma's rma_iov).
            rma_iov_limit: 1,
            // A send completes once it is in the receiver's ring; with
            // delivery-complete, once the receiver consumed it (placed or
            // buffered). Match- and commit-complete are not offered.
            op_flags_supported: OpFlags::TX_BASE | OpFlags::DELIVERY_COMPLETE | OpFlags::FENCE,
            ..TxAttr::default()
        },
        rx_attr: RxAttr {
            caps: CAPS & !(Caps::SEND | Caps::READ | Caps::WRITE | Caps::FENCE),
            msg_order: order,
            comp_order: CompOrder::empty(),
            total_buffered_recv: BUFFERED_RECV,
            size: QUEUE_SIZE,
            iov_limit: IOV_LIMIT,
            op_flags_supported: OpFlags::RX_BASE | OpFlags::PEEK_FAMILY | OpFlags::MULTI_RECV,
            ..RxAttr::default()
        },
        ep_attr: EpAttr {
            ep_type: EpType::Rdm,
            protocol: Protocol::Shm,
            protocol_version: crate::layout::VERSION,
            max_msg_size: MAX_MSG_SIZE,
            mem_tag_format: MEM_TAG_FORMAT,
            tx_ctx_cnt: 1,
            rx_ctx_cnt: 1,
            ..EpAttr::default()
        },
        domain_attr: DomainAttr {
            name: Some(NAME.into()),
            threading: Threading::Safe,
            control_progress: Progress::Auto,
            data_progress: Progress::Auto,
            av_type: AvType::Unspec,
            // Requested keys, offset addressing, as tcp.
            mr_mode: MrMode::empty(),
            mr_key_size: 8,
            mr_cnt: crate::mr::MR_CNT,
            mr_iov_limit: crate::IOV_LIMIT,
            cq_data_size: 8,
            cq_cnt: 1 << 16,
            ep_cnt: 1 << 16,
            tx_ctx_cnt: 1,
            rx_ctx_cnt: 1,
            max_ep_tx_ctx: 1,
            max_ep_rx_ctx: 1,
            // One shared receive context per endpoint (`srx.rs`).
            max_ep_srx_ctx: 1,
            // Proven when a channel is claimed (`keyproof`): one key, or
            // on an `FI_AV_AUTH_KEY` domain every key of the AV when the
            // endpoint is enabled (`keys`).
            max_ep_auth_key: weft_core::av::MAX_AV_AUTH_KEYS,
            ..DomainAttr::default()
        },
        fabric_attr: FabricAttr {
            // How large messages and large RMA transfers move here:
            // `shm-cma` (in one copy between the processes' memory:
            // messages read from the sender's, RMA moved by the target
            // to or from the initiator's), `shm-cma-restricted` (Yama
            // allows it only towards descendants: probed per sender),
            // `shm-copy` (through the ring, two copies).
            name: Some(fabric_name()),
            prov_name: Some(NAME.into()),
            prov_version: version(0, 1),
            api_version: API_VERSION,
        },
        ..Info::default()
    }
}
