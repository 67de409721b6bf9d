//! Weft: an async, Tokio-based fabric runtime implementing the libfabric
//! object model — fabric, domain, address vectors, endpoints, event and
//! completion queues, counters — over its own providers.
//!
//! Every data operation comes in two forms: `post_*` is non-blocking and
//! reports to the bound [`CompletionQueue`] (a [`futures::Stream`]) with the
//! caller's context — for pipelines; the `async fn` form resolves with that
//! operation's own completion — for services. Both coexist on one endpoint.
//!
//! ```
//! use bytes::{Bytes, BytesMut};
//! use weft::{AvAttr, BindFlags, CqAttr, EpType, Info};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), weft::Error> {
//! let mut hints = Info::default();
//! hints.ep_attr.ep_type = EpType::Rdm;
//! hints.caps = weft::Caps::TAGGED;
//! let info = weft::getinfo(Some(&hints))?.remove(0);
//! let fabric = weft::Fabric::open(&info)?;
//! let domain = fabric.domain(&info)?;
//!
//! // Two endpoints in one process, each with its own AV and CQ.
//! let open = || -> Result<_, weft::Error> {
//!     let av = domain.av(AvAttr::default())?;
//!     let cq = domain.cq(CqAttr::default())?;
//!     let ep = domain.endpoint(&info)?;
//!     ep.bind_av(&av)?;
//!     ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)?;
//!     ep.enable()?;
//!     Ok((ep, av))
//! };
//! let (a, a_av) = open()?;
//! let (b, _b_av) = open()?;
//! let b_addr = a_av.insert_sync(&[b.local_addr()?], Default::default())?.fi_addrs[0];
//!
//! let recv = b.trecv(BytesMut::zeroed(64), weft::FI_ADDR_UNSPEC, 7, 0);
//! let send = a.tsend(b_addr, Bytes::from_static(b"hello"), 7);
//! let (got, sent) = tokio::join!(recv, send);
//! sent?;
//! assert_eq!(&got?.into_bytes()[..], b"hello");
//! # Ok(())
//! # }
//! ```
//!
//! To spread one endpoint's traffic over threads, a [`ScalableEndpoint`]
//! (tcp RDM) has one address and a transmit and receive context per Tokio
//! worker, each an [`Endpoint`] with its own CQ, addressed with
//! [`rx_addr`]; its documentation shows the pattern.
//!
//! Contexts with bit 63 set are reserved for the `async` forms.

// Rejected posts hand the request back by value; see weft_core::provider.
#![allow(clippy::result_large_err)]

mod addrfmt;
mod atomic;
mod av;
mod counter;
mod cq;
mod endpoint;
mod eq;
mod fabric;
mod helpers;
mod mr;
mod msg;
mod multicast;
mod opfuture;
mod passive;
mod pool;
mod pool_ops;
mod pool_post;
mod registry;
mod rma;
mod scalable;
mod shared_av;
mod sock_dgram;
mod sock_stream;
mod srx;
mod srx_multi;
mod stx;

pub use av::{AddressVector, AvAttr, Insert, InsertReport};
pub use counter::{Counter, CounterChanges};
pub use cq::CompletionQueue;
pub use endpoint::{Endpoint, EpOpt, MultiMsg, MultiRecv, MultiRecvBuf};
pub use eq::{ConnRequest, EventQueue};
pub use fabric::{all_offers, error_hint, getinfo, provider_unavailable, CqAttr, Domain, Fabric};
pub use helpers::{
    ep_types_offered, explain_no_match, fi_log_directives, post_when_room, post_when_room_with,
    read_batch_spinning, NoMatch, SpinPolicy, LOG_TARGETS,
};
pub use mr::{MemoryRegion, MrAttr, RegError};
pub use msg::{RecvMsg, SendMsg};
pub use multicast::Multicast;
pub use passive::PassiveEndpoint;
pub use pool::{BufferPool, PoolBuf, PoolStats, MAX_POOL_BUFS};
pub use pool_ops::Received;
pub use pool_post::{RecvRefused, SendRefused};
pub use registry::providers;
pub use rma::RmaMsg;
pub use scalable::ScalableEndpoint;
pub use shared_av::{shared_av_path, unlink_shared_av};
pub use sock_dgram::{Datagram, SockDgram};
pub use sock_stream::SockStream;
pub use srx::SharedRxContext;
pub use stx::SharedTxContext;
pub use weft_core::atomic::{AtomicKind, AtomicOp, Datatype};
pub use weft_core::provider::{Atomic, EpStats, MrCacheStats, RmaOp};

pub use weft_core::addr::{
    decode_sockaddr, encode_sockaddr, parse_sockaddr_str, sockaddr_to_str, FiAddr,
    FI_ADDR_NOTAVAIL, FI_ADDR_UNSPEC,
};
pub use weft_core::attr::{
    AddrFormat, AvType, DomainAttr, EpAttr, EpType, FabricAttr, Info, Progress, Protocol, RxAttr,
    Threading, TxAttr, SHARED_CONTEXT,
};
/// What `AddressVector::insert_sym` expands a range into, in slot order:
/// lets a caller tell which handle stands for which name.
pub use weft_core::av::expand_insertsym;
/// `fi_rx_addr`: the handle that targets receive context `rx_index` of the
/// scalable endpoint `fi_addr` names, in an AV opened with `rx_ctx_bits`
/// (see [`ScalableEndpoint`]).
pub use weft_core::av::rx_addr;
pub use weft_core::completion::{CqEntry, CqErrEntry, CqFormat, CqItem, WaitMode};
pub use weft_core::eventq::{EqErrEntry, EqEvent, EqEventKind, EqItem};
pub use weft_core::flags::{
    AvFlags, BindFlags, Caps, CompOrder, Mode, MrAccess, MrMode, MrRegFlags, MsgOrder, OpFlags,
};
pub use weft_core::getinfo::format_info;
pub use weft_core::limits::{ConnLimits, UNEXPECTED_OVERHEAD};
pub use weft_core::tclass;
pub use weft_core::tls::TlsFiles;
pub use weft_core::{Error, Result};
