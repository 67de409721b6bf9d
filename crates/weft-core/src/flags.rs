//! Typed flag sets with libfabric's bit values.
//!
//! libfabric reuses bits between contexts (`FI_CLAIM` is `FI_DIRECTED_RECV`,
//! `FI_SYNC_ERR` is `FI_DISCARD`), so each context gets its own type: a flag
//! that makes no sense somewhere cannot be passed there by accident.

use bitflags::bitflags;

bitflags! {
    /// Capabilities (`fi_info::caps`, `fi_tx_attr::caps`, `fi_rx_attr::caps`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct Caps: u64 {
        /// Send/receive messages.
        const MSG = 1 << 1;
        /// Remote memory access.
        const RMA = 1 << 2;
        /// Tagged messages.
        const TAGGED = 1 << 3;
        /// Atomic operations.
        const ATOMIC = 1 << 4;
        /// Multicast.
        const MULTICAST = 1 << 5;
        /// Collectives.
        const COLLECTIVE = 1 << 6;
        /// Initiate reads.
        const READ = 1 << 8;
        /// Initiate writes.
        const WRITE = 1 << 9;
        /// Receive.
        const RECV = 1 << 10;
        /// Send.
        const SEND = 1 << 11;
        /// Target of remote reads.
        const REMOTE_READ = 1 << 12;
        /// Target of remote writes.
        const REMOTE_WRITE = 1 << 13;
        /// Multi-receive buffers.
        const MULTI_RECV = 1 << 16;
        /// Remote CQ data.
        const REMOTE_CQ_DATA = 1 << 17;
        /// Triggered operations.
        const TRIGGER = 1 << 20;
        /// Fenced operations.
        const FENCE = 1 << 21;
        /// Per-insert user ids in the AV.
        const AV_USER_ID = 1 << 41;
        /// Heterogeneous memory.
        const HMEM = 1 << 47;
        /// Variable-length messages.
        const VARIABLE_MSG = 1 << 48;
        /// Persistent memory RMA.
        const RMA_PMEM = 1 << 49;
        /// Source address on error when unknown.
        const SOURCE_ERR = 1 << 50;
        /// Communication within the node.
        const LOCAL_COMM = 1 << 51;
        /// Communication across nodes.
        const REMOTE_COMM = 1 << 52;
        /// Shared AV across processes.
        const SHARED_AV = 1 << 53;
        /// Remote RMA events (counters/CQ at the target).
        const RMA_EVENT = 1 << 56;
        /// Source address reported in completions.
        const SOURCE = 1 << 57;
        /// Named receive contexts.
        const NAMED_RX_CTX = 1 << 58;
        /// Directed receive (match on source address).
        const DIRECTED_RECV = 1 << 59;
    }
}

impl Caps {
    /// The primary capabilities (what operations exist at all).
    pub const PRIMARY: Caps = Caps::MSG
        .union(Caps::RMA)
        .union(Caps::TAGGED)
        .union(Caps::ATOMIC)
        .union(Caps::MULTICAST)
        .union(Caps::COLLECTIVE)
        .union(Caps::READ)
        .union(Caps::WRITE)
        .union(Caps::RECV)
        .union(Caps::SEND)
        .union(Caps::REMOTE_READ)
        .union(Caps::REMOTE_WRITE)
        .union(Caps::MULTI_RECV)
        .union(Caps::TRIGGER)
        .union(Caps::FENCE)
        .union(Caps::HMEM)
        .union(Caps::RMA_EVENT)
        .union(Caps::SOURCE)
        .union(Caps::NAMED_RX_CTX)
        .union(Caps::DIRECTED_RECV)
        .union(Caps::VARIABLE_MSG)
        .union(Caps::SHARED_AV)
        .union(Caps::AV_USER_ID)
        .union(Caps::REMOTE_CQ_DATA);

    /// Capabilities a result carries only when the hints ask for them:
    /// they change what existing operations report (`FI_SOURCE_ERR` turns
    /// messages from senders outside the AV into error entries;
    /// `FI_RMA_EVENT` lets an endpoint count remote accesses and brings
    /// the region bindings of `FI_MR_RMA_EVENT`), so an application that
    /// did not ask must not get them by default.
    pub const ON_REQUEST: Caps = Caps::SOURCE_ERR.union(Caps::RMA_EVENT);
}

bitflags! {
    /// Operation flags (`fi_*msg` flags, `FI_SETOPSFLAG`) and the flags of
    /// completion entries.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct OpFlags: u64 {
        /// Message operation (completion flag).
        const MSG = 1 << 1;
        /// RMA operation (completion flag).
        const RMA = 1 << 2;
        /// Tagged operation (completion flag).
        const TAGGED = 1 << 3;
        /// Atomic operation (completion flag).
        const ATOMIC = 1 << 4;
        /// Multicast send.
        const MULTICAST = 1 << 5;
        /// RMA/atomic read (completion flag).
        const READ = 1 << 8;
        /// RMA/atomic write (completion flag).
        const WRITE = 1 << 9;
        /// Receive (completion flag; also selects the rx side in `SETOPSFLAG`).
        const RECV = 1 << 10;
        /// Send (completion flag; `FI_TRANSMIT` in `SETOPSFLAG`).
        const SEND = 1 << 11;
        /// Remote read happened at this target.
        const REMOTE_READ = 1 << 12;
        /// Remote write happened at this target.
        const REMOTE_WRITE = 1 << 13;
        /// Multi-receive buffer (and: the buffer was released).
        const MULTI_RECV = 1 << 16;
        /// The entry carries remote CQ data / send remote CQ data.
        const REMOTE_CQ_DATA = 1 << 17;
        /// More operations follow: the provider may batch.
        const MORE = 1 << 18;
        /// Peek for a matching unexpected message.
        const PEEK = 1 << 19;
        /// Triggered operation.
        const TRIGGER = 1 << 20;
        /// Fence.
        const FENCE = 1 << 21;
        /// Generate a completion (with selective completion).
        const COMPLETION = 1 << 24;
        /// Buffer reusable on return.
        const INJECT = 1 << 25;
        /// Complete once the buffer is reusable.
        const INJECT_COMPLETE = 1 << 26;
        /// Complete once the data left the initiator.
        const TRANSMIT_COMPLETE = 1 << 27;
        /// Complete once the target processed the data.
        const DELIVERY_COMPLETE = 1 << 28;
        /// Complete once the data is persistent at the target.
        const COMMIT_COMPLETE = 1 << 30;
        /// Complete once the target matched the message.
        const MATCH_COMPLETE = 1 << 31;
        /// Directed receive: the source is an authorization key handle
        /// (`FI_AUTH_KEY`), any sender that proved that key matches.
        const AUTH_KEY = 1 << 57;
        /// With `PEEK`: discard the message; with a claimed receive: drop it.
        const DISCARD = 1 << 58;
        /// Claim a message found by `PEEK`, or receive a claimed message.
        const CLAIM = 1 << 59;
    }
}

impl OpFlags {
    /// `TAGGED` for a tagged operation, else `MSG`: the class bit of a
    /// message completion.
    pub fn msg_or_tagged(tagged: bool) -> OpFlags {
        if tagged {
            OpFlags::TAGGED
        } else {
            OpFlags::MSG
        }
    }

    /// `FI_TRANSMIT`, an alias of `SEND` used with `SETOPSFLAG`/binds.
    pub const TRANSMIT: OpFlags = OpFlags::SEND;
    /// The completion-semantics flags; at most one may be given.
    pub const COMPLETION_LEVELS: OpFlags = OpFlags::INJECT_COMPLETE
        .union(OpFlags::TRANSMIT_COMPLETE)
        .union(OpFlags::DELIVERY_COMPLETE)
        .union(OpFlags::COMMIT_COMPLETE)
        .union(OpFlags::MATCH_COMPLETE);
    /// Transmit flags every provider honours: `FI_COMPLETION` (selective
    /// completion), `FI_INJECT`, remote CQ data, `FI_MORE` and the two
    /// local completion levels.
    pub const TX_BASE: OpFlags = OpFlags::COMPLETION
        .union(OpFlags::INJECT)
        .union(OpFlags::REMOTE_CQ_DATA)
        .union(OpFlags::MORE)
        .union(OpFlags::INJECT_COMPLETE)
        .union(OpFlags::TRANSMIT_COMPLETE);
    /// Receive flags every provider honours.
    pub const RX_BASE: OpFlags = OpFlags::COMPLETION.union(OpFlags::MORE);
    /// The `FI_PEEK` family of tagged receives.
    pub const PEEK_FAMILY: OpFlags = OpFlags::PEEK.union(OpFlags::CLAIM).union(OpFlags::DISCARD);
}

bitflags! {
    /// Flags of `fi_ep_bind` (CQs and counters).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct BindFlags: u64 {
        /// Counter: initiated reads.
        const READ = 1 << 8;
        /// Counter: initiated writes.
        const WRITE = 1 << 9;
        /// CQ/counter: receive completions.
        const RECV = 1 << 10;
        /// CQ: transmit completions; counter: sends.
        const TRANSMIT = 1 << 11;
        /// Counter: remote reads at this target.
        const REMOTE_READ = 1 << 12;
        /// Counter: remote writes at this target.
        const REMOTE_WRITE = 1 << 13;
        /// CQ: only operations with `FI_COMPLETION` report success.
        const SELECTIVE_COMPLETION = 1 << 59;
    }
}

impl BindFlags {
    /// `FI_SEND`, the same bit as `FI_TRANSMIT`.
    pub const SEND: BindFlags = BindFlags::TRANSMIT;
}

bitflags! {
    /// Flags of AV open and insert/remove calls.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AvFlags: u64 {
        /// Open: open an existing named AV read-only.
        const READ = 1 << 8;
        /// Insert: more inserts follow.
        const MORE = 1 << 18;
        /// Open/insert: asynchronous completion reported on the bound EQ.
        const EVENT = 1 << 24;
        /// Open / insert: user ids replace fi_addr in completions.
        const AV_USER_ID = 1 << 41;
        /// Insert, remove, set user id: the handle given is an
        /// authorization key's (`FI_AUTH_KEY`).
        const AUTH_KEY = 1 << 57;
        /// Insert: per-address status array.
        const SYNC_ERR = 1 << 58;
        /// Open: all peers insert addresses in the same order.
        const SYMMETRIC = 1 << 59;
    }
}

bitflags! {
    /// Mode bits: requirements the application accepts.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct Mode: u64 {
        /// Buffered receive.
        const BUFFERED_RECV = 1 << 51;
        /// Context2 space.
        const CONTEXT2 = 1 << 52;
        /// Restricted completions.
        const RESTRICTED_COMP = 1 << 53;
        /// Flags-only notification.
        const NOTIFY_FLAGS_ONLY = 1 << 54;
        /// Local MR (legacy).
        const LOCAL_MR = 1 << 55;
        /// Receive CQ data needs a receive buffer.
        const RX_CQ_DATA = 1 << 56;
        /// Async iov.
        const ASYNC_IOV = 1 << 57;
        /// Message prefix space.
        const MSG_PREFIX = 1 << 58;
        /// fi_context space.
        const CONTEXT = 1 << 59;
    }
}

bitflags! {
    /// Access rights of a memory region (`fi_mr_reg`'s `access`): the
    /// operations that may use it, locally as a source or target, or
    /// remotely through its key.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct MrAccess: u64 {
        /// Local: read from by RMA writes and atomics this side initiates.
        const READ = 1 << 8;
        /// Local: written by RMA reads this side initiates.
        const WRITE = 1 << 9;
        /// Local: received into.
        const RECV = 1 << 10;
        /// Local: sent from.
        const SEND = 1 << 11;
        /// Remote peers may read it.
        const REMOTE_READ = 1 << 12;
        /// Remote peers may write it.
        const REMOTE_WRITE = 1 << 13;
    }
}

bitflags! {
    /// Flags of a memory registration (`fi_mr_reg`'s `flags`,
    /// `fi_mr_regattr`'s): what the region is for, beyond its access.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct MrRegFlags: u64 {
        /// Device memory (`FI_HMEM_DEVICE_ONLY`).
        const HMEM_DEVICE_ONLY = 1 << 46;
        /// Host memory from a device API (`FI_HMEM_HOST_ALLOC`).
        const HMEM_HOST_ALLOC = 1 << 45;
        /// A DMA-buf region (`FI_MR_DMABUF`).
        const DMABUF = 1 << 40;
        /// The key dies after one operation (`FI_MR_SINGLE_USE`).
        const SINGLE_USE = 1 << 41;
        /// Persistent memory (`FI_RMA_PMEM`).
        const RMA_PMEM = 1 << 49;
        /// The region will be bound to a counter of remote accesses
        /// (`FI_RMA_EVENT`).
        const RMA_EVENT = 1 << 56;
    }
}

bitflags! {
    /// Memory registration mode bits (`fi_domain_attr::mr_mode`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct MrMode: u32 {
        /// Local buffers must be registered.
        const LOCAL = 1 << 2;
        /// Raw keys larger than 64 bits.
        const RAW = 1 << 3;
        /// RMA addresses are virtual addresses (else offsets).
        const VIRT_ADDR = 1 << 4;
        /// Only allocated memory can be registered.
        const ALLOCATED = 1 << 5;
        /// Keys are chosen by the provider.
        const PROV_KEY = 1 << 6;
        /// MMU notifications needed.
        const MMU_NOTIFY = 1 << 7;
        /// MR-level RMA events (bind counters to MRs).
        const RMA_EVENT = 1 << 8;
        /// MRs bound to endpoints.
        const ENDPOINT = 1 << 9;
        /// Device memory registration.
        const HMEM = 1 << 10;
        /// Collective MRs.
        const COLLECTIVE = 1 << 11;
    }
}

bitflags! {
    /// Message ordering bits (`msg_order`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct MsgOrder: u64 {
        /// Read after read.
        const RAR = 1 << 0;
        /// Read after write.
        const RAW = 1 << 1;
        /// Read after send.
        const RAS = 1 << 2;
        /// Write after read.
        const WAR = 1 << 3;
        /// Write after write.
        const WAW = 1 << 4;
        /// Write after send.
        const WAS = 1 << 5;
        /// Send after read.
        const SAR = 1 << 6;
        /// Send after write.
        const SAW = 1 << 7;
        /// Send after send.
        const SAS = 1 << 8;
        /// RMA read after read.
        const RMA_RAR = 1 << 32;
        /// RMA read after write.
        const RMA_RAW = 1 << 33;
        /// RMA write after read.
        const RMA_WAR = 1 << 34;
        /// RMA write after write.
        const RMA_WAW = 1 << 35;
        /// Atomic read after read.
        const ATOMIC_RAR = 1 << 36;
        /// Atomic read after write.
        const ATOMIC_RAW = 1 << 37;
        /// Atomic write after read.
        const ATOMIC_WAR = 1 << 38;
        /// Atomic write after write.
        const ATOMIC_WAW = 1 << 39;
    }
}

impl MsgOrder {
    /// `FI_ORDER_STRICT`: every one of the nine basic orderings.
    pub const STRICT: MsgOrder = MsgOrder::from_bits_truncate(0x1FF);
}

bitflags! {
    /// Completion ordering bits (`comp_order`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct CompOrder: u64 {
        /// Completions in the order operations were submitted/processed.
        const STRICT = 0x1FF;
        /// Data is placed in order with completions.
        const DATA = 1 << 16;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_match_libfabric() {
        assert_eq!(Caps::MSG.bits(), 2);
        assert_eq!(Caps::TAGGED.bits(), 8);
        assert_eq!(Caps::DIRECTED_RECV.bits(), 1 << 59);
        assert_eq!(OpFlags::CLAIM.bits(), Caps::DIRECTED_RECV.bits());
        assert_eq!(OpFlags::COMPLETION.bits(), 1 << 24);
        assert_eq!(AvFlags::EVENT.bits(), OpFlags::COMPLETION.bits());
        assert_eq!(AvFlags::SYNC_ERR.bits(), OpFlags::DISCARD.bits());
        assert_eq!(BindFlags::SELECTIVE_COMPLETION.bits(), 1 << 59);
        assert_eq!(MrMode::PROV_KEY.bits(), 64);
        assert_eq!(MsgOrder::STRICT.bits(), 0x1FF);
        assert_eq!(OpFlags::TRANSMIT, OpFlags::SEND);
    }
}
