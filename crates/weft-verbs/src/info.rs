//! Device discovery and the provider's `fi_getinfo` offers.
//!
//! [`discover`] walks every RDMA device and port and records what the
//! offers are built from: port state, link layer, the IP addresses of the
//! port's RoCE GIDs, the device limits and the largest inline send the
//! device accepts. Probing costs a few milliseconds (it creates throw-away
//! QPs), so [`offers()`] works from [`discover_cached`], probed once per
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
//! user can act on, and [`describe()`] prints what was found.

mod attrs;
mod describe;
mod diagnose;
mod offers;
mod probe;

pub use attrs::{
    with_atomics, CM_DATA_SIZE, CQ_DATA_SIZE, DGRAM_CAPS, FABRIC_PREFIX, MEM_TAG_FORMAT,
    MIN_MEMLOCK, MR_KEY_SIZE, MR_MODE, MSG_CAPS, MSG_ORDER, QUEUE_SIZE, RDM_CAPS, RDM_MAX_CTX,
    RMA_CAPS, TX_IOV_LIMIT,
};
pub use describe::describe;
pub use diagnose::{memlock_limit, memlock_warning, no_device_reason};
pub use offers::{dgram_offer, msg_offer, offers, offers_for, rdm_offer};
pub use probe::{discover, discover_cached, DeviceReport};

#[cfg(test)]
#[path = "info_tests.rs"]
mod tests;
