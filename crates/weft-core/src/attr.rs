//! Attribute structures: what a provider offers and what an application asks
//! for (`fi_info` and its `fi_*_attr` members).

use crate::flags::{Caps, CompOrder, Mode, MrMode, MsgOrder, OpFlags};
use std::fmt;

/// Endpoint type (`enum fi_ep_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum EpType {
    /// Not specified: any type matches.
    #[default]
    Unspec,
    /// Reliable, connection-oriented.
    Msg,
    /// Unreliable datagram.
    Dgram,
    /// Reliable datagram (connectionless, reliable).
    Rdm,
    /// Socket-like byte stream.
    SockStream,
    /// Socket-like datagram.
    SockDgram,
}

impl EpType {
    /// The libfabric spelling (`FI_EP_RDM`).
    pub const fn fi_name(self) -> &'static str {
        match self {
            EpType::Unspec => "FI_EP_UNSPEC",
            EpType::Msg => "FI_EP_MSG",
            EpType::Dgram => "FI_EP_DGRAM",
            EpType::Rdm => "FI_EP_RDM",
            EpType::SockStream => "FI_EP_SOCK_STREAM",
            EpType::SockDgram => "FI_EP_SOCK_DGRAM",
        }
    }

    /// Parses the short names used by `fi_pingpong -e` (`msg`, `rdm`, `dgram`)
    /// and the `FI_EP_*` names.
    pub fn parse(s: &str) -> Option<EpType> {
        let l = s.trim().to_ascii_lowercase();
        let l = l.strip_prefix("fi_ep_").unwrap_or(&l);
        Some(match l {
            "unspec" => EpType::Unspec,
            "msg" => EpType::Msg,
            "dgram" => EpType::Dgram,
            "rdm" => EpType::Rdm,
            "sock_stream" => EpType::SockStream,
            "sock_dgram" => EpType::SockDgram,
            _ => return None,
        })
    }

    /// Connection-oriented endpoints need connect/accept; the others an AV.
    pub const fn is_connected(self) -> bool {
        matches!(self, EpType::Msg | EpType::SockStream)
    }

    /// On an `FI_AV_AUTH_KEY` domain, endpoints of this type take their
    /// keys from their AV when enabled (tcp RDM, udp DGRAM), have none of
    /// their own, and take receives directed by key.
    pub const fn takes_av_keys(self) -> bool {
        matches!(self, EpType::Rdm | EpType::Dgram)
    }
}

/// AV type (`enum fi_av_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AvType {
    /// Provider chooses; open reports the choice.
    #[default]
    Unspec,
    /// fi_addr is an opaque value that may encode the address.
    Map,
    /// fi_addr is an index into a table.
    Table,
}

/// Address format (`enum fi_addr_format` subset Weft implements).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum AddrFormat {
    /// Not specified.
    #[default]
    Unspec,
    /// `struct sockaddr_in` (16 bytes).
    SockaddrIn,
    /// `struct sockaddr_in6` (28 bytes).
    SockaddrIn6,
    /// Either of the two, distinguished by length and family.
    Sockaddr,
    /// Formatted string (`fi_sockaddr_in://1.2.3.4:5`).
    Str,
}

/// Wire protocol (`enum fi_protocol` subset).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Protocol {
    /// Any.
    #[default]
    Unspec,
    /// Plain UDP payloads.
    Udp,
    /// Weft's own framing over TCP (see `docs/wire.md`).
    SockTcp,
    /// Shared memory.
    Shm,
    /// RC over rdma_cm.
    RdmaCmIbRc,
    /// UD.
    IbUd,
    /// Weft's reliable-datagram protocol over RC queue pairs (a header per
    /// message, eager or read rendezvous; see the verbs provider).
    WeftRdmRc,
    /// Weft's datagram header over UDP (the udp provider; `docs/wire.md`).
    WeftUdp,
}

/// Progress model (`enum fi_progress`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Progress {
    /// Any.
    #[default]
    Unspec,
    /// The provider makes progress on its own (Weft: reactor or busy-poll thread).
    Auto,
    /// The application must call into the provider.
    Manual,
}

/// Threading model (`enum fi_threading`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Threading {
    /// Any.
    #[default]
    Unspec,
    /// Every object may be used from any thread at once.
    Safe,
    /// Per-fid serialisation required.
    Fid,
    /// Per-domain serialisation required.
    Domain,
    /// Per-completion-object serialisation required.
    Completion,
    /// Per-endpoint serialisation required.
    Endpoint,
}

/// Fabric attributes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FabricAttr {
    /// Fabric name (e.g. `"127.0.0.0/8"` or `"tcp"`).
    pub name: Option<String>,
    /// Provider name (`"tcp"`, `"udp"`, `"shm"`, `"verbs"`).
    pub prov_name: Option<String>,
    /// Provider version (major << 16 | minor).
    pub prov_version: u32,
    /// Implemented API version (major << 16 | minor).
    pub api_version: u32,
}

/// An authorization key in a `Debug` rendering: its size, never its bytes.
struct RedactedKey<'a>(Option<&'a [u8]>);

impl fmt::Debug for RedactedKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(k) => write!(f, "Some(<{} key bytes>)", k.len()),
            None => f.write_str("None"),
        }
    }
}

/// Domain attributes.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct DomainAttr {
    /// Domain name (interface or device).
    pub name: Option<String>,
    /// Threading model.
    pub threading: Threading,
    /// Control-path progress.
    pub control_progress: Progress,
    /// Data-path progress.
    pub data_progress: Progress,
    /// AV type the domain prefers.
    pub av_type: AvType,
    /// Memory registration mode.
    pub mr_mode: MrMode,
    /// Size of an MR key in bytes.
    pub mr_key_size: usize,
    /// Remote CQ data size in bytes.
    pub cq_data_size: usize,
    /// Maximum CQ entries.
    pub cq_cnt: usize,
    /// Maximum endpoints.
    pub ep_cnt: usize,
    /// Maximum transmit contexts per endpoint.
    pub tx_ctx_cnt: usize,
    /// Maximum receive contexts per endpoint.
    pub rx_ctx_cnt: usize,
    /// Maximum scalable transmit contexts.
    pub max_ep_tx_ctx: usize,
    /// Maximum scalable receive contexts.
    pub max_ep_rx_ctx: usize,
    /// Shared transmit contexts an endpoint may use (0: none; then
    /// `fi_stx_context` is `NoSys`).
    pub max_ep_stx_ctx: usize,
    /// Shared receive contexts an endpoint may use (0: none; then
    /// `fi_srx_context` is `NoSys`).
    pub max_ep_srx_ctx: usize,
    /// Maximum iov entries in one MR registration.
    pub mr_iov_limit: usize,
    /// Maximum MRs.
    pub mr_cnt: usize,
    /// Domain capabilities.
    pub caps: Caps,
    /// Domain mode bits.
    pub mode: Mode,
    /// The default authorization key of the domain's endpoints
    /// (`auth_key` and `auth_key_size`; an endpoint's own
    /// [`EpAttr::auth_key`] takes precedence). `None`: no key. Offers
    /// carry none; a hint's key is copied into the result.
    pub auth_key: Option<Vec<u8>>,
    /// Authorization keys an endpoint can hold (`max_ep_auth_key`): at
    /// least 1 where the provider enforces keys (tcp: an AV's worth;
    /// verbs MSG and RDM: 1), 0 where it takes none (verbs DGRAM). Hints
    /// with a key match only offers that take one.
    pub max_ep_auth_key: usize,
    /// `FI_AV_AUTH_KEY` (libfabric's `auth_key_size` sentinel): the
    /// domain's RDM endpoints take their keys from their AV
    /// (`fi_av_insert_auth_key`) when they are enabled, and address
    /// entries are inserted under a key. `auth_key` must then be `None`.
    /// Hints with it match only offers that have it.
    pub av_auth_key: bool,
    /// TLS for every connection of the domain's endpoints and of passive
    /// endpoints opened with these attributes (`docs/design.md`, "TLS on
    /// tcp"): TLS 1.3, both sides presenting a certificate signed by the
    /// CA. `None`: the `FI_TCP_TLS_*` environment variables decide when
    /// the object is created ([`crate::tls::TlsFiles::from_env`]); none
    /// set is plain TCP. A Weft extension; offers carry none, and a hint's
    /// files are copied into the result.
    pub tls: Option<crate::tls::TlsFiles>,
    /// Whether the provider runs TLS (tcp) or refuses it (verbs,
    /// `OpNotSupp`). A Weft extension: hints asking for it, or carrying
    /// `tls`, match only offers that have it.
    pub tls_capable: bool,
}

impl fmt::Debug for DomainAttr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DomainAttr")
            .field("name", &self.name)
            .field("threading", &self.threading)
            .field("control_progress", &self.control_progress)
            .field("data_progress", &self.data_progress)
            .field("av_type", &self.av_type)
            .field("mr_mode", &self.mr_mode)
            .field("mr_key_size", &self.mr_key_size)
            .field("cq_data_size", &self.cq_data_size)
            .field("cq_cnt", &self.cq_cnt)
            .field("ep_cnt", &self.ep_cnt)
            .field("tx_ctx_cnt", &self.tx_ctx_cnt)
            .field("rx_ctx_cnt", &self.rx_ctx_cnt)
            .field("max_ep_tx_ctx", &self.max_ep_tx_ctx)
            .field("max_ep_rx_ctx", &self.max_ep_rx_ctx)
            .field("max_ep_stx_ctx", &self.max_ep_stx_ctx)
            .field("max_ep_srx_ctx", &self.max_ep_srx_ctx)
            .field("mr_iov_limit", &self.mr_iov_limit)
            .field("mr_cnt", &self.mr_cnt)
            .field("caps", &self.caps)
            .field("mode", &self.mode)
            .field("auth_key", &RedactedKey(self.auth_key.as_deref()))
            .field("max_ep_auth_key", &self.max_ep_auth_key)
            .field("av_auth_key", &self.av_auth_key)
            .field("tls", &self.tls)
            .field("tls_capable", &self.tls_capable)
            .finish()
    }
}

/// Endpoint attributes.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct EpAttr {
    /// Endpoint type.
    pub ep_type: EpType,
    /// Wire protocol.
    pub protocol: Protocol,
    /// Protocol version.
    pub protocol_version: u32,
    /// Largest message, in bytes.
    pub max_msg_size: usize,
    /// Bytes reserved in front of buffers with `FI_MSG_PREFIX`.
    pub msg_prefix_size: usize,
    /// Ordered read-after-write bytes.
    pub max_order_raw_size: usize,
    /// Ordered write-after-read bytes.
    pub max_order_war_size: usize,
    /// Ordered write-after-write bytes.
    pub max_order_waw_size: usize,
    /// Tag bits layout (`mem_tag_format`).
    pub mem_tag_format: u64,
    /// Transmit contexts (0 = shared, 1 = normal, >1 = scalable).
    pub tx_ctx_cnt: usize,
    /// Receive contexts.
    pub rx_ctx_cnt: usize,
    /// Connection-manager data size (MSG endpoints).
    pub cm_data_size: usize,
    /// The endpoint's authorization key (`auth_key` and `auth_key_size`):
    /// it completes connections only with peers that prove they hold the
    /// same key (`docs/design.md`, "Authorization keys"). `None`: the
    /// domain's key, if any. 1 ..= 64 bytes
    /// ([`crate::auth::MAX_KEY_LEN`]); an empty or longer key is refused
    /// with `Inval` when the endpoint is created. Offers carry none; a
    /// hint's key is copied into the result.
    pub auth_key: Option<Vec<u8>>,
}

impl fmt::Debug for EpAttr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EpAttr")
            .field("ep_type", &self.ep_type)
            .field("protocol", &self.protocol)
            .field("protocol_version", &self.protocol_version)
            .field("max_msg_size", &self.max_msg_size)
            .field("msg_prefix_size", &self.msg_prefix_size)
            .field("max_order_raw_size", &self.max_order_raw_size)
            .field("max_order_war_size", &self.max_order_war_size)
            .field("max_order_waw_size", &self.max_order_waw_size)
            .field("mem_tag_format", &self.mem_tag_format)
            .field("tx_ctx_cnt", &self.tx_ctx_cnt)
            .field("rx_ctx_cnt", &self.rx_ctx_cnt)
            .field("cm_data_size", &self.cm_data_size)
            .field("auth_key", &RedactedKey(self.auth_key.as_deref()))
            .finish()
    }
}

/// Transmit attributes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TxAttr {
    /// Transmit capabilities.
    pub caps: Caps,
    /// Transmit mode bits.
    pub mode: Mode,
    /// Default operation flags.
    pub op_flags: OpFlags,
    /// Message ordering.
    pub msg_order: MsgOrder,
    /// Completion ordering.
    pub comp_order: CompOrder,
    /// Largest inject (`FI_INJECT`) size.
    pub inject_size: usize,
    /// Transmit queue depth.
    pub size: usize,
    /// Maximum iov entries per send.
    pub iov_limit: usize,
    /// Maximum RMA iov entries.
    pub rma_iov_limit: usize,
    /// Traffic class.
    pub tclass: u32,
    /// The transmit flags this offer honours, as operation flags and as
    /// default `op_flags` (a Weft extension of `fi_tx_attr`). A hint whose
    /// `op_flags` ask for more matches nothing, an endpoint whose
    /// `op_flags` hold more is `BadFlags`, and so is an operation that
    /// carries one: a flag is honoured or refused, never ignored.
    pub op_flags_supported: OpFlags,
}

/// Receive attributes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RxAttr {
    /// Receive capabilities.
    pub caps: Caps,
    /// Receive mode bits.
    pub mode: Mode,
    /// Default operation flags.
    pub op_flags: OpFlags,
    /// Message ordering.
    pub msg_order: MsgOrder,
    /// Completion ordering.
    pub comp_order: CompOrder,
    /// Bytes the provider buffers for unexpected messages.
    pub total_buffered_recv: usize,
    /// Receive queue depth.
    pub size: usize,
    /// Maximum iov entries per receive.
    pub iov_limit: usize,
    /// The receive flags this offer honours (see
    /// [`TxAttr::op_flags_supported`]).
    pub op_flags_supported: OpFlags,
}

/// One `fi_info` entry: a provider's offer, or an application's hints.
///
/// In hints, zero / `Unspec` / `None` / empty mean "don't care".
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Info {
    /// Capabilities.
    pub caps: Caps,
    /// Mode bits the application supports (hints) / the provider needs (offer).
    pub mode: Mode,
    /// Address format.
    pub addr_format: AddrFormat,
    /// Source address (raw bytes in `addr_format`).
    pub src_addr: Option<Vec<u8>>,
    /// Destination address.
    pub dest_addr: Option<Vec<u8>>,
    /// Transmit attributes.
    pub tx_attr: TxAttr,
    /// Receive attributes.
    pub rx_attr: RxAttr,
    /// Endpoint attributes.
    pub ep_attr: EpAttr,
    /// Domain attributes.
    pub domain_attr: DomainAttr,
    /// Fabric attributes.
    pub fabric_attr: FabricAttr,
}

/// `rx_ctx_cnt` / `tx_ctx_cnt` value asking for a shared context
/// (`FI_SHARED_CONTEXT`).
pub const SHARED_CONTEXT: usize = usize::MAX;

/// API version Weft implements: libfabric 1.17's object model.
pub const API_VERSION: u32 = (1 << 16) | 17;

/// Packs a `(major, minor)` version as libfabric's `FI_VERSION` does.
pub const fn version(major: u16, minor: u16) -> u32 {
    ((major as u32) << 16) | minor as u32
}

#[cfg(test)]
mod debug_tests {
    use super::*;

    #[test]
    fn debug_shows_key_sizes_not_keys() {
        let mut i = Info::default();
        i.ep_attr.auth_key = Some(b"secret-ep-key".to_vec());
        i.domain_attr.auth_key = Some(b"secret-dom".to_vec());
        let s = format!("{i:?}");
        assert!(!s.contains("115, 101, 99"), "key bytes in {s}");
        assert!(s.contains("<13 key bytes>") && s.contains("<10 key bytes>"));
        assert!(s.contains("max_ep_auth_key"), "other fields still shown");
    }
}
