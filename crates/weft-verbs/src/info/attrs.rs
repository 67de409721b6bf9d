//! The attribute tables of the offers: capabilities, ordering, registration
//! mode and the fixed sizes every offer shares.

use weft_core::flags::{Caps, MrMode, MsgOrder};

use crate::sys::AtomicCap;

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
