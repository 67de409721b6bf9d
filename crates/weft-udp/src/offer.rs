//! The provider's `fi_getinfo` offers: one `FI_EP_DGRAM` info per address
//! of every interface that is up (loopback first), as libfabric's udp
//! provider lists them: the fabric is the address's network, the domain
//! the interface, the source address the interface's address (port 0),
//! and `max_msg_size` what one datagram carries over that interface.

use std::net::{IpAddr, SocketAddr};

use weft_core::addr::encode_sockaddr;
use weft_core::attr::{
    version, AddrFormat, AvType, DomainAttr, EpAttr, EpType, FabricAttr, Info, Progress, Protocol,
    RxAttr, Threading, TxAttr, API_VERSION,
};
use weft_core::flags::{Caps, CompOrder, MrMode, MsgOrder, OpFlags};

use crate::ifaces::{self, Iface};
use crate::{BUFFERED_RECV, INJECT_SIZE, IOV_LIMIT, MEM_TAG_FORMAT, NAME, QUEUE_SIZE};

/// What a udp endpoint does: untagged and tagged datagrams with 64-bit
/// remote CQ data, source addresses (with `FI_SOURCE_ERR` on request) and
/// directed receives, and multi-receive buffers. Nothing is
/// retransmitted: see `docs/design.md`, "The udp provider".
pub const CAPS: Caps = Caps::MSG
    .union(Caps::TAGGED)
    .union(Caps::SEND)
    .union(Caps::RECV)
    .union(Caps::REMOTE_CQ_DATA)
    .union(Caps::SOURCE)
    .union(Caps::SOURCE_ERR)
    .union(Caps::DIRECTED_RECV)
    .union(Caps::MULTICAST)
    .union(Caps::LOCAL_COMM)
    .union(Caps::REMOTE_COMM)
    // Multi-receive buffers: docs/design.md, "Multi-receive buffers".
    .union(Caps::MULTI_RECV)
    // Sends leave in posting order and complete as they leave, so a
    // fenced one begins after the earlier ones completed: docs/design.md,
    // "Fences on udp".
    .union(Caps::FENCE);

/// What a `FI_EP_SOCK_DGRAM` endpoint does: plain UDP payloads, so no
/// tags and no remote CQ data (nothing but the payload is sent), and no
/// multi-receive (its datagrams are read as a stream of their own).
pub const SOCK_DGRAM_CAPS: Caps = CAPS
    .difference(Caps::TAGGED)
    .difference(Caps::REMOTE_CQ_DATA)
    .difference(Caps::MULTI_RECV);

/// Every offer, from the interfaces there are now: `FI_EP_DGRAM`, then
/// `FI_EP_SOCK_DGRAM`, per address.
pub fn offers() -> Vec<Info> {
    let list = ifaces::list();
    let mut v: Vec<Info> = list.iter().map(offer).collect();
    v.extend(list.iter().map(sock_dgram_offer));
    v
}

/// `FI_EP_SOCK_DGRAM` on one interface address: datagrams as a UDP
/// socket sends them — the payload and nothing else — so a plain UDP
/// socket is a peer (`docs/design.md`, "Socket-style datagrams").
pub fn sock_dgram_offer(i: &Iface) -> Info {
    let mut o = offer(i);
    o.caps = SOCK_DGRAM_CAPS;
    o.tx_attr.caps &= SOCK_DGRAM_CAPS;
    o.rx_attr.caps &= SOCK_DGRAM_CAPS;
    o.rx_attr.op_flags_supported -= OpFlags::MULTI_RECV;
    // A socket's receives are its own, as tcp's stream sockets' are.
    o.domain_attr.max_ep_srx_ctx = 0;
    o.ep_attr.ep_type = EpType::SockDgram;
    o.ep_attr.protocol = Protocol::Udp;
    o.ep_attr.protocol_version = 0;
    o.ep_attr.mem_tag_format = 0;
    o.ep_attr.max_msg_size += crate::wire::HEADER_LEN;
    // No room for a key's proof in a bare payload.
    o.domain_attr.max_ep_auth_key = 0;
    o.tx_attr.inject_size = INJECT_SIZE.min(o.ep_attr.max_msg_size);
    o.domain_attr.cq_data_size = 0;
    o
}

/// A DGRAM offer for hints that carry a key: a keyed datagram's trailer
/// (`wire::TRAILER_LEN`, or `wire::NAMED_TRAILER_LEN` where the keys
/// live in the AV) comes off what a message may carry, so `max_msg_size`
/// (and `inject_size`, at most that) say what a keyed endpoint sends.
pub fn keyed(hints: &Info, o: &mut Info) {
    let given = hints.ep_attr.auth_key.is_some() || hints.domain_attr.auth_key.is_some();
    let trailer = if hints.domain_attr.av_auth_key {
        crate::wire::NAMED_TRAILER_LEN
    } else if given {
        crate::wire::TRAILER_LEN
    } else {
        return;
    };
    if o.ep_attr.ep_type != EpType::Dgram {
        return;
    }
    o.ep_attr.max_msg_size = o.ep_attr.max_msg_size.saturating_sub(trailer);
    o.tx_attr.inject_size = o.tx_attr.inject_size.min(o.ep_attr.max_msg_size);
}

/// The offer of one interface address.
pub fn offer(i: &Iface) -> Info {
    let max_msg = i.max_msg();
    let addr_format = match i.addr {
        IpAddr::V4(_) => AddrFormat::SockaddrIn,
        IpAddr::V6(_) => AddrFormat::SockaddrIn6,
    };
    Info {
        caps: CAPS,
        addr_format,
        src_addr: Some(encode_sockaddr(&SocketAddr::new(i.addr, 0))),
        tx_attr: TxAttr {
            caps: CAPS
                & !(Caps::RECV
                    | Caps::DIRECTED_RECV
                    | Caps::SOURCE
                    | Caps::SOURCE_ERR
                    | Caps::MULTI_RECV),
            // UDP promises no order, and a lost datagram leaves a gap.
            msg_order: MsgOrder::empty(),
            comp_order: CompOrder::empty(),
            inject_size: INJECT_SIZE.min(max_msg),
            size: QUEUE_SIZE,
            iov_limit: IOV_LIMIT,
            rma_iov_limit: 0,
            // A send completes once the kernel has the datagram: nothing
            // comes back from the receiver, so delivery- and
            // match-complete cannot be honoured. FI_MULTICAST is taken
            // as given: the destination address, a group's or a peer's,
            // decides where the datagram goes.
            op_flags_supported: OpFlags::TX_BASE | OpFlags::MULTICAST | OpFlags::FENCE,
            ..TxAttr::default()
        },
        rx_attr: RxAttr {
            caps: CAPS & !(Caps::SEND | Caps::FENCE),
            msg_order: MsgOrder::empty(),
            comp_order: CompOrder::empty(),
            total_buffered_recv: BUFFERED_RECV,
            size: QUEUE_SIZE,
            iov_limit: IOV_LIMIT,
            op_flags_supported: OpFlags::RX_BASE | OpFlags::PEEK_FAMILY | OpFlags::MULTI_RECV,
            ..RxAttr::default()
        },
        ep_attr: EpAttr {
            ep_type: EpType::Dgram,
            protocol: Protocol::WeftUdp,
            protocol_version: u32::from(crate::wire::VERSION),
            max_msg_size: max_msg,
            mem_tag_format: MEM_TAG_FORMAT,
            tx_ctx_cnt: 1,
            rx_ctx_cnt: 1,
            ..EpAttr::default()
        },
        domain_attr: DomainAttr {
            name: Some(i.name.clone()),
            threading: Threading::Safe,
            control_progress: Progress::Auto,
            data_progress: Progress::Auto,
            av_type: AvType::Unspec,
            mr_mode: MrMode::empty(),
            cq_data_size: 8,
            cq_cnt: 1 << 16,
            ep_cnt: 1 << 16,
            tx_ctx_cnt: 1,
            rx_ctx_cnt: 1,
            max_ep_tx_ctx: 1,
            max_ep_rx_ctx: 1,
            // One shared receive context per endpoint (`soft_srx`).
            max_ep_srx_ctx: 1,
            // One key proven in every datagram (`weft_core::dgram_auth`),
            // or on an `FI_AV_AUTH_KEY` domain the AV's keys (`keys.rs`).
            max_ep_auth_key: weft_core::av::MAX_AV_AUTH_KEYS,
            ..DomainAttr::default()
        },
        fabric_attr: FabricAttr {
            name: Some(i.network()),
            prov_name: Some(NAME.into()),
            prov_version: version(0, 1),
            api_version: API_VERSION,
        },
        ..Info::default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn loopback_offer() {
        let i = Iface {
            name: "lo".into(),
            addr: "127.0.0.1".parse().unwrap(),
            prefix: 8,
            mtu: 65_536,
            loopback: true,
        };
        let o = offer(&i);
        assert_eq!(o.ep_attr.ep_type, EpType::Dgram);
        assert_eq!(o.ep_attr.max_msg_size, 65_507 - crate::wire::HEADER_LEN);
        assert_eq!(o.tx_attr.inject_size, INJECT_SIZE);
        assert_eq!(o.domain_attr.name.as_deref(), Some("lo"));
        assert_eq!(o.fabric_attr.name.as_deref(), Some("127.0.0.0/8"));
        assert_eq!(
            weft_core::addr::decode_sockaddr(o.src_addr.as_deref().unwrap()).unwrap(),
            "127.0.0.1:0".parse().unwrap()
        );
        // Nothing that needs an answer from the receiver, no RMA; IP
        // multicast; multi-receive on DGRAM, not on SOCK_DGRAM.
        assert!(!o
            .tx_attr
            .op_flags_supported
            .contains(OpFlags::DELIVERY_COMPLETE));
        assert!(!o.caps.intersects(Caps::RMA));
        assert!(o.caps.contains(Caps::MULTICAST | Caps::MULTI_RECV));
        let s = sock_dgram_offer(&i);
        assert!(!s.caps.intersects(Caps::MULTI_RECV));
        assert!(!s.rx_attr.caps.intersects(Caps::MULTI_RECV));
        assert!(!s.rx_attr.op_flags_supported.contains(OpFlags::MULTI_RECV));
    }

    /// An interface with a small MTU.
    fn tun0() -> Iface {
        Iface {
            name: "tun0".into(),
            addr: "10.9.0.1".parse().unwrap(),
            prefix: 24,
            mtu: 576,
            loopback: false,
        }
    }

    #[test]
    fn a_small_mtu_bounds_messages_and_inject() {
        let i = tun0();
        let o = offer(&i);
        assert_eq!(o.ep_attr.max_msg_size, 576 - 28 - crate::wire::HEADER_LEN);
        assert_eq!(o.tx_attr.inject_size, o.ep_attr.max_msg_size);
        assert_eq!(o.addr_format, AddrFormat::SockaddrIn);
    }

    #[test]
    fn keyed_hints_take_the_trailer_off() {
        let i = tun0();
        let unkeyed = offer(&i).ep_attr.max_msg_size;
        let sized = |h: &Info, o: Info| {
            let mut o = o;
            keyed(h, &mut o);
            (o.ep_attr.max_msg_size, o.tx_attr.inject_size)
        };
        let mut h = Info::default();
        assert_eq!(sized(&h, offer(&i)), (unkeyed, unkeyed));
        h.domain_attr.auth_key = Some(b"k".to_vec());
        assert_eq!(sized(&h, offer(&i)), (unkeyed - 24, unkeyed - 24));
        let mut h = Info::default();
        h.ep_attr.auth_key = Some(b"k".to_vec());
        assert_eq!(sized(&h, offer(&i)).0, unkeyed - 24);
        let mut h = Info::default();
        h.domain_attr.av_auth_key = true;
        assert_eq!(sized(&h, offer(&i)).0, unkeyed - 32);
        // SOCK_DGRAM takes no key: its offer is left as it is.
        let s = sock_dgram_offer(&i);
        assert_eq!(sized(&h, s.clone()).0, s.ep_attr.max_msg_size);
    }
}
