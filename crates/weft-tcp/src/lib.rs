//! Weft's TCP provider: `FI_EP_MSG` (connect/accept with CM data) and
//! `FI_EP_RDM` (connectionless and reliable: one TCP connection per peer,
//! made on first use, simultaneous connects resolved) over Weft's own
//! framing (`docs/wire.md`), with memory regions, RMA reads and writes,
//! and atomics (the fi_atomic(3) set on integers, `FLOAT` and `DOUBLE`)
//! carried as frames of their own and served by the target's reader.
//!
//! Sends are written from the posting thread when the socket has room
//! (no task hop on the latency path), large messages go out with vectored
//! writes straight from the caller's `Bytes`, and large receives are read
//! straight into the posted buffer. Receiving is driven by the Tokio
//! reactor (`WaitMode::Interrupt`) or a spinning thread per endpoint
//! (`WaitMode::BusyPoll`).

// Rejected posts hand the request back by value; see weft_core::provider.
#![allow(clippy::result_large_err)]

mod admission;
mod atomic;
mod boundary;
mod conn;
mod connect;
mod driver;
mod endpoint;
mod frame;
mod keyproof;
mod keys;
mod mr;
mod parked;
mod place;
#[cfg(test)]
mod retire_tests;
mod returned;
mod rma;
mod rma_events;
mod rx;
mod scalable;
mod sock_stream;
mod srx;
mod stx;
mod sweep;
mod tls;
mod unexpected;
mod verify;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use tokio::runtime::Handle;
use weft_core::addr::decode_sockaddr;
use weft_core::attr::{
    version, AddrFormat, AvType, DomainAttr, EpAttr, EpType, FabricAttr, Info, Progress, Protocol,
    RxAttr, Threading, TxAttr, API_VERSION,
};
use weft_core::flags::{Caps, CompOrder, MrMode, MsgOrder, OpFlags};
use weft_core::provider::{
    EpConfig, PassiveConfig, Provider, ProviderDomain, ProviderEndpoint, ProviderPassive,
};
use weft_core::{Error, Result};

pub use connect::TcpPassive;
pub use scalable::MAX_CTX;

/// Provider name.
pub const NAME: &str = "tcp";
/// Largest message: bounded so one hostile header cannot make a receiver
/// allocate without limit.
pub const MAX_MSG_SIZE: usize = 1 << 30;
/// Bytes `FI_INJECT` accepts.
pub const INJECT_SIZE: usize = 4096;
/// Default queue depth.
pub const QUEUE_SIZE: usize = 1024;
/// Buffers per operation.
pub const IOV_LIMIT: usize = 8;
/// Connection-manager data limit.
pub const CM_DATA_SIZE: usize = 256;
/// Unexpected-message buffering before the reader applies back-pressure.
pub const BUFFERED_RECV: usize = 64 << 20;
/// `FI_TAG_GENERIC`: 64 tag bits, no reserved fields.
pub const MEM_TAG_FORMAT: u64 = 0xAAAA_AAAA_AAAA_AAAA;

/// The offers of this provider, one per endpoint type.
pub fn offers() -> Vec<Info> {
    let mut v: Vec<Info> = [EpType::Rdm, EpType::Msg].into_iter().map(offer).collect();
    v.push(sock_stream_offer());
    v
}

/// `FI_EP_SOCK_STREAM`: MSG's connection management, then the socket's
/// bytes as they are (`sock_stream.rs`). Data moves through the stream
/// (`weft::SockStream`), not through sends and receives: no data
/// capabilities, no queues to size.
fn sock_stream_offer() -> Info {
    weft_core::getinfo::sock_stream_offer(offer(EpType::Msg))
}

fn offer(ep_type: EpType) -> Info {
    let caps = Caps::MSG
        | Caps::TAGGED
        | Caps::SEND
        | Caps::RECV
        | Caps::REMOTE_CQ_DATA
        | Caps::SOURCE
        | Caps::LOCAL_COMM
        | Caps::REMOTE_COMM
        | Caps::RMA
        | Caps::ATOMIC
        | Caps::READ
        | Caps::WRITE
        | Caps::REMOTE_READ
        | Caps::REMOTE_WRITE
        // On request only (it brings the optional mr_mode bits
        // FI_MR_RMA_EVENT and FI_MR_ENDPOINT): docs/design.md, "RMA
        // events, endpoint-bound regions and single-use keys".
        | Caps::RMA_EVENT
        | Caps::FENCE
        // Multi-receive buffers: docs/design.md, "Multi-receive buffers".
        | Caps::MULTI_RECV
        | if ep_type == EpType::Rdm {
            // Named AVs: see docs/design.md, "Named shared AVs".
            // Receive contexts of scalable endpoints are named by
            // `fi_rx_addr`: docs/design.md, "Scalable endpoints on tcp".
            Caps::DIRECTED_RECV
                | Caps::AV_USER_ID
                | Caps::SOURCE_ERR
                | Caps::SHARED_AV
                | Caps::NAMED_RX_CTX
        } else {
            Caps::empty()
        };
    // One TCP stream per peer, written in posting order, and a target
    // that handles each frame to the end (a write placed, a read's
    // answer copied out, an atomic applied, a message matched or
    // buffered) before it reads the next: every ordering bit holds, and
    // so does FI_FENCE without waiting (docs/design.md, "Ordering and
    // fences on tcp").
    let order = MsgOrder::all();
    Info {
        caps,
        addr_format: AddrFormat::SockaddrIn,
        tx_attr: TxAttr {
            caps: caps
                & !(Caps::RECV
                    | Caps::DIRECTED_RECV
                    | Caps::SOURCE
                    | Caps::SOURCE_ERR
                    | Caps::REMOTE_READ
                    | Caps::REMOTE_WRITE
                    | Caps::RMA_EVENT
                    | Caps::MULTI_RECV),
            msg_order: order,
            comp_order: CompOrder::empty(),
            inject_size: INJECT_SIZE,
            size: QUEUE_SIZE,
            iov_limit: IOV_LIMIT,
            // One remote segment per operation (fi_msg_rma's rma_iov).
            rma_iov_limit: 1,
            // Delivery-complete waits for the receiver's Ack, sent once
            // the message is placed or buffered. Match-complete would
            // need the Ack held until a receive takes it, and nothing
            // here is persistent (commit-complete): neither is offered.
            op_flags_supported: OpFlags::TX_BASE | OpFlags::DELIVERY_COMPLETE | OpFlags::FENCE,
            ..TxAttr::default()
        },
        rx_attr: RxAttr {
            caps: caps & !(Caps::SEND | Caps::READ | Caps::WRITE | Caps::FENCE),
            msg_order: order,
            // Each message's and each write's bytes are placed in stream
            // order.
            comp_order: CompOrder::DATA,
            total_buffered_recv: BUFFERED_RECV,
            size: QUEUE_SIZE,
            iov_limit: IOV_LIMIT,
            op_flags_supported: OpFlags::RX_BASE | OpFlags::PEEK_FAMILY | OpFlags::MULTI_RECV,
            ..RxAttr::default()
        },
        ep_attr: EpAttr {
            ep_type,
            protocol: Protocol::SockTcp,
            protocol_version: weft_core::wire::VERSION as u32,
            max_msg_size: MAX_MSG_SIZE,
            mem_tag_format: MEM_TAG_FORMAT,
            tx_ctx_cnt: 1,
            rx_ctx_cnt: 1,
            cm_data_size: if ep_type == EpType::Msg {
                CM_DATA_SIZE
            } else {
                0
            },
            ..EpAttr::default()
        },
        domain_attr: DomainAttr {
            name: Some("lo".into()),
            threading: Threading::Safe,
            control_progress: Progress::Auto,
            data_progress: Progress::Auto,
            av_type: AvType::Unspec,
            // Requested keys, offset addressing: see docs/design.md,
            // "tcp memory regions". FI_MR_RMA_EVENT and FI_MR_ENDPOINT
            // are granted to hints that accept them (getinfo's
            // ON_REQUEST_MR_MODES), never required.
            mr_mode: MrMode::empty(),
            mr_key_size: 8,
            cq_data_size: 8,
            cq_cnt: 1 << 16,
            ep_cnt: 1 << 16,
            // RDM endpoints may be scalable (`scalable.rs`): up to
            // MAX_CTX contexts each way, as many in the domain as it has
            // endpoints.
            tx_ctx_cnt: if ep_type == EpType::Rdm { 1 << 16 } else { 1 },
            rx_ctx_cnt: if ep_type == EpType::Rdm { 1 << 16 } else { 1 },
            max_ep_tx_ctx: if ep_type == EpType::Rdm {
                scalable::MAX_CTX
            } else {
                1
            },
            max_ep_rx_ctx: if ep_type == EpType::Rdm {
                scalable::MAX_CTX
            } else {
                1
            },
            // RDM and MSG endpoints may take their receives from one
            // shared receive context (`srx.rs`); stream sockets have no
            // receives.
            max_ep_srx_ctx: usize::from(ep_type != EpType::SockStream),
            // Likewise a shared transmit context: room in one queue.
            max_ep_stx_ctx: usize::from(ep_type != EpType::SockStream),
            mr_iov_limit: IOV_LIMIT,
            mr_cnt: mr::MR_CNT,
            // Proven at connection set-up (docs/design.md,
            // "Authorization keys"): one key, or on an `FI_AV_AUTH_KEY`
            // domain every key of the AV when the endpoint is enabled.
            max_ep_auth_key: weft_core::av::MAX_AV_AUTH_KEYS,
            // TLS 1.3 with mutual authentication, off unless configured:
            // see docs/design.md, "TLS on tcp".
            tls_capable: true,
            ..DomainAttr::default()
        },
        fabric_attr: FabricAttr {
            name: Some("127.0.0.0/8".into()),
            prov_name: Some(NAME.into()),
            prov_version: version(0, 1),
            api_version: API_VERSION,
        },
        ..Info::default()
    }
}

fn bind_addr(cfg: &EpConfig) -> Result<SocketAddr> {
    match &cfg.src_addr {
        Some(b) => decode_sockaddr(b),
        None => Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))),
    }
}

/// Opens (enables) an RDM endpoint, with a scalable endpoint's
/// contexts: it starts listening at once so its address can be handed to
/// peers.
fn open_rdm(
    cfg: EpConfig,
    rt: &Handle,
    ctxs: scalable::Contexts,
) -> Result<Arc<endpoint::EpShared>> {
    let l = connect::listen(bind_addr(&cfg)?, 1024)?;
    let local = l.local_addr()?;
    let ep = endpoint::EpShared::with_contexts(cfg, local, rt.clone(), ctxs)?;
    connect::start_rdm_listener(&ep, l);
    sweep::start(&ep);
    Ok(ep)
}

/// Opens (enables) a scalable RDM endpoint (`scalable.rs`): `Inval` for
/// more contexts than [`MAX_CTX`] or none, or with a shared context
/// bound, `NoSys` for other endpoint types. Each transmit context has a queue of its own.
pub fn open_scalable(cfg: EpConfig, rt: Handle) -> Result<Arc<dyn ProviderEndpoint>> {
    let _g = rt.enter();
    if cfg.info.ep_attr.ep_type != EpType::Rdm {
        return Err(Error::NoSys);
    }
    // Its contexts are its queues; shared ones have no place there.
    if cfg.srx.is_some() || cfg.stx.is_some() {
        return Err(Error::Inval);
    }
    let (tx, rx) = (cfg.info.ep_attr.tx_ctx_cnt, cfg.info.ep_attr.rx_ctx_cnt);
    if [tx, rx].iter().any(|&n| n == 0 || n > scalable::MAX_CTX) {
        return Err(Error::Inval);
    }
    let ctxs = scalable::Contexts::for_scalable(&cfg);
    let ep = open_rdm(cfg, &rt, ctxs)?;
    Ok(Arc::new(endpoint::TcpEndpoint::new(ep)))
}

/// Opens (enables) an endpoint. RDM endpoints start listening at once so
/// their address can be handed to peers.
pub fn open_endpoint(cfg: EpConfig, rt: Handle) -> Result<Arc<dyn ProviderEndpoint>> {
    let _g = rt.enter();
    let ep_type = cfg.info.ep_attr.ep_type;
    let shared = match ep_type {
        EpType::Rdm => open_rdm(cfg, &rt, scalable::Contexts::default())?,
        EpType::Msg | EpType::SockStream => {
            let local = match &cfg.conn {
                Some(h) => connect::pending_of(h)?.local,
                None => bind_addr(&cfg)?,
            };
            let ep = endpoint::EpShared::new(cfg, local, rt.clone())?;
            if ep_type == EpType::SockStream && (ep.srx.is_some() || ep.cfg.stx.is_some()) {
                return Err(Error::Inval);
            }
            if ep_type == EpType::SockStream && ep.tls.is_some() {
                // The stream is the socket itself; over TLS it would be
                // the session, which is not handed out yet.
                return Err(Error::NoSys);
            }
            sweep::start(&ep);
            ep
        }
        _ => return Err(Error::NoSys),
    };
    Ok(Arc::new(endpoint::TcpEndpoint::new(shared)))
}

/// The tcp provider, as the `weft` registry holds it.
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpProvider;

impl Provider for TcpProvider {
    fn name(&self) -> &'static str {
        NAME
    }

    fn auth_keys(&self) -> bool {
        true
    }

    fn check_tls(&self, files: Option<&weft_core::tls::TlsFiles>) -> Result<()> {
        tls::TlsContext::resolve(files).map(|_| ())
    }

    fn offers(&self) -> Vec<Info> {
        offers()
    }

    fn open_domain(&self, info: &Info) -> Result<Option<Arc<dyn ProviderDomain>>> {
        let tls = tls::TlsContext::resolve(info.domain_attr.tls.as_ref())?;
        Ok(Some(Arc::new(mr::TcpDomain::new(
            info.domain_attr.mr_mode,
            tls,
        ))))
    }

    fn open_endpoint(&self, cfg: EpConfig) -> Result<Arc<dyn ProviderEndpoint>> {
        open_endpoint(cfg, Handle::current())
    }

    fn open_scalable(&self, cfg: EpConfig) -> Result<Arc<dyn ProviderEndpoint>> {
        open_scalable(cfg, Handle::current())
    }

    fn open_passive(&self, cfg: PassiveConfig) -> Result<Arc<dyn ProviderPassive>> {
        let a = match cfg.addr {
            Some(b) => decode_sockaddr(&b)?,
            None => SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        };
        Ok(Arc::new(TcpPassive::open(
            a,
            cfg.backlog,
            cfg.eq,
            cfg.fid,
            cfg.context,
            CM_DATA_SIZE,
            cfg.limits,
            weft_core::auth::effective_key(
                cfg.info.ep_attr.auth_key.as_deref(),
                cfg.info.domain_attr.auth_key.as_deref(),
            )?,
            // A passive endpoint has no domain: its attributes, else the
            // environment as it is now.
            tls::TlsContext::resolve(cfg.info.domain_attr.tls.as_ref())?,
            Handle::current(),
        )?))
    }
}
