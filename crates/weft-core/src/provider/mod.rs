//! The boundary between the public API and a provider: requests the API
//! posts, and the object-safe traits a provider's endpoints implement.
//!
//! Posting never blocks and never awaits: an operation ends later through
//! its [`OpDone`](crate::completion::OpDone). Connection set-up is the only asynchronous part and is
//! expressed as boxed futures so that no runtime type crosses this boundary.
// A rejected post hands the whole request back (buffers, completion sink)
// so the caller loses nothing; boxing it would cost an allocation per post.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use futures::future::BoxFuture;

use crate::addr::FiAddr;
use crate::attr::Info;
use crate::av::AvTable;
use crate::completion::{CqShared, Returned, WaitMode};
use crate::error::{Error, Result};
use crate::eventq::{ConnHandle, EqErrEntry, EqEvent, EqEventKind, EqShared};
use crate::progress::Progress;

mod pool_send;
mod requests;
pub use pool_send::{PoolHome, PoolSend};
pub use requests::*;

/// The memory a registration covers.
#[derive(Debug)]
pub enum MrMemory {
    /// `len` zeroed bytes the provider allocates (and frees).
    Alloc(usize),
    /// The application's buffers, registered where they are. The region
    /// owns them while registered (so nothing else can free or touch
    /// them while the device may) and hands them back through
    /// [`ProviderMr::take_buffers`]. Several buffers make one region,
    /// addressed as their concatenation.
    Buffers(Vec<BytesMut>),
}

impl MrMemory {
    /// The application's buffers, if any (what a refused request gives
    /// back).
    pub fn into_buffers(self) -> Vec<BytesMut> {
        match self {
            MrMemory::Buffers(b) => b,
            MrMemory::Alloc(_) => Vec::new(),
        }
    }
}

/// A registration request, checked by the API layer (lengths, access,
/// iov count, flags against the domain's caps) before a provider sees it.
#[derive(Debug)]
pub struct MrRequest {
    /// What to register.
    pub memory: MrMemory,
    /// Access rights (never empty).
    pub access: crate::flags::MrAccess,
    /// The key the application asks for; providers whose `mr_mode` has
    /// `FI_MR_PROV_KEY` choose their own and ignore it, the others use it
    /// and refuse one already in use in the domain with `NoKey`.
    pub requested_key: u64,
    /// Registration flags.
    pub flags: crate::flags::MrRegFlags,
    /// The authorization key a peer's connection must have proven to
    /// reach the region (`fi_mr_attr::auth_key`, else the domain's);
    /// `None`: any connection the endpoint accepted.
    pub auth_key: Option<crate::auth::AuthKey>,
}

/// A registered memory region: the device may read or write it at any
/// time while it is registered, so the application reaches its bytes
/// only by copying in and out (or by taking its buffers back).
pub trait ProviderMr: Send + Sync + Debug {
    /// The key a peer passes to RMA operations (`fi_mr_key`).
    fn key(&self) -> u64;
    /// The region's address, the base of RMA target addresses: its
    /// virtual address with `FI_MR_VIRT_ADDR`, 0 without (targets are
    /// offsets into the region).
    fn addr(&self) -> u64;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// True for an empty region.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The local descriptor (`fi_mr_desc`): the local key.
    fn desc(&self) -> u64;
    /// Copies `out.len()` bytes from `offset`. `Inval` when out of range;
    /// `Canceled` after close.
    fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()>;
    /// Copies `data` in at `offset`. `Inval` when out of range;
    /// `Canceled` after close.
    fn write_at(&self, offset: usize, data: &[u8]) -> Result<()>;
    /// Deregisters: the key stops working at once (peers' operations
    /// with it fail with `Access`). Later calls are no-ops. Memory that
    /// sub-regions still cover stays allocated until they are gone.
    fn close(&self);
    /// Registers `offset..offset + len` of this region again, with its own
    /// key and `access` (a sub-MR, `fi_mr_attr::base_mr`). The sub-region
    /// keeps the memory alive. The API layer has checked the range.
    /// `requested_key` is the key asked for, as in [`MrRequest`].
    /// `NoSys` for providers without sub-regions.
    fn sub_region(
        &self,
        offset: usize,
        len: usize,
        access: crate::flags::MrAccess,
        requested_key: u64,
    ) -> Result<Arc<dyn ProviderMr>> {
        let _ = (offset, len, access, requested_key);
        Err(Error::NoSys)
    }
    /// Deregisters, as [`close`](Self::close), and hands back the
    /// application buffers the region was registered on. `Inval` for a
    /// region whose memory the provider allocated; `Canceled` once
    /// closed.
    fn take_buffers(&self) -> Result<Vec<BytesMut>> {
        Err(Error::Inval)
    }
    /// `fi_mr_bind` with an endpoint (object id `ep`, of the region's
    /// domain: the API layer checked): from now on only accesses that
    /// arrive through that endpoint reach the region. `Inval` when bound
    /// already, `OpBadState` once enabled. Providers whose regions
    /// cannot be confined keep the default, `NoSys`.
    fn bind_ep(&self, ep: u64) -> Result<()> {
        let _ = ep;
        Err(Error::NoSys)
    }
    /// `fi_mr_bind` with a counter: `cntr` counts the remote accesses of
    /// this region that `flags` (`REMOTE_WRITE` and/or `REMOTE_READ`,
    /// checked by the API layer) name. `Inval` for a region registered
    /// without `FI_RMA_EVENT` or a direction already bound,
    /// `OpBadState` once enabled. Providers that cannot see remote
    /// accesses keep the default, `NoSys` (fi_mr(3)).
    fn bind_cntr(
        &self,
        cntr: Arc<crate::counter::CounterShared>,
        flags: crate::flags::BindFlags,
    ) -> Result<()> {
        let _ = (cntr, flags);
        Err(Error::NoSys)
    }
    /// `fi_mr_enable`: a region that waited for its bindings becomes
    /// reachable, and takes no more bindings. `Inval` when the domain
    /// confines regions to endpoints (`FI_MR_ENDPOINT`) and none is
    /// bound. Providers whose regions are reachable from registration
    /// and take no bindings keep the default, `NoSys`.
    fn enable(&self) -> Result<()> {
        Err(Error::NoSys)
    }
}

/// A provider's domain: what endpoints and memory regions of one domain
/// share (for verbs, the device context and protection domain).
pub trait ProviderDomain: Send + Sync + Debug {
    /// Registers memory (`fi_mr_regattr`). `NoSys` when the provider
    /// has no memory registration; `BadFlags` for flags it does not
    /// support.
    /// A refused request comes back whole, with its buffers.
    fn mr_reg(
        &self,
        req: MrRequest,
    ) -> std::result::Result<Arc<dyn ProviderMr>, Rejected<MrRequest>>;
    /// The concrete domain, for the provider's own endpoints.
    fn as_any(&self) -> &dyn std::any::Any;
    /// What must happen to an address before endpoints of this domain can
    /// send to it, if anything: `None` (the default) when the bytes an AV
    /// holds are enough.
    fn addr_resolver(&self) -> Option<Arc<dyn AddrResolver>> {
        None
    }
    /// Opens a shared receive context (`fi_srx_context`). `NoSys` (the
    /// default) for providers without them.
    fn srx_open(&self, size: usize) -> Result<Arc<dyn ProviderSrx>> {
        let _ = size;
        Err(Error::NoSys)
    }
    /// Opens a shared receive context with the receive attributes it
    /// was asked for (`fi_srx_context`'s `fi_rx_attr`: `size`,
    /// `total_buffered_recv`, `caps`, already filled from the domain's
    /// where 0). By default, [`srx_open`](Self::srx_open) with the size.
    fn srx_open_attr(&self, attr: &crate::attr::RxAttr) -> Result<Arc<dyn ProviderSrx>> {
        self.srx_open(attr.size)
    }
    /// Opens a shared transmit context (`fi_stx_context`) with the
    /// transmit attributes it was asked for (zeros already filled from
    /// the domain's). `NoSys` (the default) for providers without them.
    fn stx_open(&self, attr: &crate::attr::TxAttr) -> Result<Arc<dyn ProviderStx>> {
        let _ = attr;
        Err(Error::NoSys)
    }
    /// What the domain's registration cache did, if it has one.
    fn mr_cache_stats(&self) -> Option<MrCacheStats> {
        None
    }
    /// The memory of a buffer pool: `count` buffers of `size` bytes,
    /// registered once for the device to read and write where the
    /// provider registers memory (verbs: one region; operations on its
    /// buffers use its local key and register nothing). The default,
    /// for providers that register nothing, is plain memory.
    fn pool_alloc(&self, count: usize, size: usize) -> Result<crate::pool::PoolMemory> {
        crate::pool::PoolMemory::plain(count, size)
    }
}

/// A shared receive context: receives posted here are taken by whichever
/// bound endpoint a message arrives at, and complete on that endpoint's
/// receive CQ (the request's `done.cq` is `None` until then).
pub trait ProviderSrx: Send + Sync + Debug {
    /// Posts a receive. `Again` when full; the request comes back on
    /// failure.
    fn post_recv(&self, req: RecvReq) -> std::result::Result<(), Rejected<RecvReq>>;
    /// Cancels the pending receive with `context`; false if none can be.
    fn cancel(&self, context: u64) -> bool;
    /// Takes back a message whose receive's future was dropped after the
    /// message reached it (see [`ProviderEndpoint::give_back`]); it is
    /// reported where `r.origin` says when the receive that takes it has
    /// no queue of its own.
    fn give_back(&self, r: Returned);
    /// [`give_back`](Self::give_back) for a message of a multi-receive
    /// buffer whose stream was dropped: behind the ones given back before
    /// it (see [`RecvCtx::give_back_after`](crate::recv_completion::RecvCtx::give_back_after)).
    /// By default, `give_back`.
    fn give_back_after(&self, r: Returned) {
        self.give_back(r)
    }
    /// Receives that can still be posted.
    fn rx_size_left(&self) -> usize;
    /// Stops taking receives; pending ones complete with `Canceled`.
    fn close(&self);
    /// The concrete context, for the provider's endpoints.
    fn as_any(&self) -> &dyn std::any::Any;
    /// Whether the context matches in software: tagged receives,
    /// receives directed by source, `FI_PEEK`/`FI_CLAIM`/`FI_DISCARD`.
    /// `false` (the default): untagged receives without flags only.
    fn matches(&self) -> bool {
        false
    }
    /// What the context holds (`unexpected_bytes`, `parked`); by default
    /// nothing is tracked.
    fn stats(&self) -> EpStats {
        EpStats::default()
    }
}

/// A shared transmit context: the endpoints bound to it post their
/// transmit operations into its one queue (its `size` is shared); each
/// operation still completes on its endpoint's CQ.
pub trait ProviderStx: Send + Sync + Debug {
    /// Transmit operations that can still be posted, by any bound
    /// endpoint.
    fn tx_size_left(&self) -> usize;
    /// The concrete context, for the provider's endpoints.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// Counters and occupancy of a registration cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MrCacheStats {
    /// Lookups that found a registration.
    pub hits: u64,
    /// Lookups that registered.
    pub misses: u64,
    /// Entries dropped to stay within the limits.
    pub evictions: u64,
    /// Entries now.
    pub entries: usize,
    /// Bytes registered through entries now.
    pub bytes: usize,
}

/// Resolution of AV addresses for providers that cannot send to raw
/// address bytes (verbs `FI_EP_DGRAM`: each address needs an address
/// handle, a queue pair number and a Q_Key, found through rdma_cm).
///
/// An AV of such a domain reserves the handles of an insert at once and
/// fills them as their resolutions end; an address that fails to
/// resolve fails its insert with the resolution's error.
pub trait AddrResolver: Send + Sync + Debug {
    /// Resolves `addr` (raw bytes in the domain's address format) and
    /// keeps what sends to it need. Run on the domain's runtime.
    fn resolve(&self, addr: Vec<u8>) -> BoxFuture<'static, Result<()>>;
    /// No AV entry holds `addr` any more: what was kept for it may go.
    fn forget(&self, addr: &[u8]);
    /// Checks that `addr` is an address of the domain's format (`Inval`
    /// if not) before it is resolved or inserted. By default, a socket
    /// address.
    fn validate(&self, addr: &[u8]) -> Result<()> {
        crate::addr::decode_sockaddr(addr).map(|_| ())
    }
    /// Whether `addr` needs no waiting now: an insert whose addresses all
    /// are ready completes at once (and `insert_sync` takes it). By
    /// default none is.
    fn resolved(&self, addr: &[u8]) -> bool {
        let _ = addr;
        false
    }
}

/// A post that could not be accepted, with the request handed back so the
/// caller loses nothing (e.g. `Again` when the queue is full).
#[derive(Debug)]
pub struct Rejected<T> {
    /// Why.
    pub err: Error,
    /// The request, untouched.
    pub req: T,
}

/// What the API layer gives a provider when an endpoint is enabled.
#[derive(Debug, Clone)]
pub struct EpConfig {
    /// The endpoint's object id (for EQ events).
    pub fid: u64,
    /// The endpoint's context (for EQ events).
    pub context: u64,
    /// Negotiated attributes (ep type, sizes, caps).
    pub info: Info,
    /// The bound AV (connectionless endpoints).
    pub av: Option<Arc<Mutex<AvTable>>>,
    /// The bound EQ.
    pub eq: Option<Arc<EqShared>>,
    /// How the endpoint makes progress.
    pub wait: WaitMode,
    /// Local address to bind, raw bytes (`None`: any port on the domain's
    /// interface).
    pub src_addr: Option<Vec<u8>>,
    /// Accepting side of a MSG connection: the request from `ConnReq`.
    pub conn: Option<ConnHandle>,
    /// The provider's domain object, if it has one.
    pub domain: Option<Arc<dyn ProviderDomain>>,
    /// The CQ bound for receive completions: where completions the peer
    /// causes without a posted operation go (remote CQ data of writes).
    pub rx_cq: Option<Arc<CqShared>>,
    /// The counter bound to receive completions (receives taken from a
    /// shared context count here).
    pub rx_cntr: Option<Arc<crate::counter::CounterShared>>,
    /// Counters of the remote accesses completed at this endpoint
    /// (`FI_REMOTE_READ`, `FI_REMOTE_WRITE` binds; the endpoint has
    /// `FI_RMA_EVENT`).
    pub remote_cntrs: RemoteCntrs,
    /// The bound shared receive context: the endpoint takes its receives
    /// from there.
    pub srx: Option<Arc<dyn ProviderSrx>>,
    /// The bound shared transmit context: the endpoint's transmit
    /// operations take their room in its queue.
    pub stx: Option<Arc<dyn ProviderStx>>,
    /// What peers may make the endpoint hold (connections, buffered
    /// bytes, time).
    pub limits: crate::limits::ConnLimits,
    /// Raised by the provider on a critical error (a MSG connection's
    /// fatal fault): the endpoint is disabled until re-enabled.
    pub fault: Arc<Fault>,
}

/// The counters of remote accesses bound to an endpoint (fi_endpoint(3)):
/// `read` counts RMA reads and the fetching and compare atomics that
/// peers complete at the endpoint, `write` RMA writes and plain atomics.
#[derive(Debug, Clone, Default)]
pub struct RemoteCntrs {
    /// `FI_REMOTE_READ`.
    pub read: Option<Arc<crate::counter::CounterShared>>,
    /// `FI_REMOTE_WRITE`.
    pub write: Option<Arc<crate::counter::CounterShared>>,
}

/// An endpoint's critical-error state (fi_endpoint(3): a critical error
/// moves the endpoint to the disabled state).
#[derive(Debug, Default)]
pub struct Fault(std::sync::atomic::AtomicBool);

impl Fault {
    /// The endpoint hit a critical error.
    pub fn raise(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Re-enabled.
    pub fn clear(&self) {
        self.0.store(false, std::sync::atomic::Ordering::Release);
    }

    /// Whether the endpoint is disabled by a critical error.
    pub fn is_raised(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl EpConfig {
    /// Queues an error event naming the peer whose connection the
    /// endpoint refused or closed (a limit, a timeout, a broken frame), so
    /// the application sees each refusal and whom it concerned (bounded:
    /// see [`EqShared::report_peer`]).
    pub fn eq_peer_error(&self, err: Error, peer: Vec<u8>) {
        if let Some(eq) = &self.eq {
            eq.report_peer(self.fid, self.context, err, peer);
        }
    }

    /// Queues `FI_CONNECTED` (with the peer's CM data) on the bound EQ.
    pub fn eq_connected(&self, cm_data: Vec<u8>) {
        if let Some(eq) = &self.eq {
            let mut ev = EqEvent::new(EqEventKind::Connected, self.fid, self.context, 0);
            ev.cm_data = cm_data;
            eq.push(Ok(ev));
        }
    }

    /// Queues `FI_SHUTDOWN` on the bound EQ.
    pub fn eq_shutdown(&self) {
        if let Some(eq) = &self.eq {
            eq.push(Ok(EqEvent::new(
                EqEventKind::Shutdown,
                self.fid,
                self.context,
                0,
            )));
        }
    }

    /// Queues a connection error (with data from the peer, e.g. a
    /// rejection's) on the bound EQ.
    pub fn eq_error(&self, err: Error, data: Vec<u8>) {
        if let Some(eq) = &self.eq {
            eq.push(Err(EqErrEntry {
                fid: self.fid,
                context: self.context,
                data: 0,
                err,
                prov_errno: err.code(),
                err_data: data,
                peer_addr: None,
            }));
        }
    }
}

/// What an endpoint holds on its peers' behalf now: for monitoring, and
/// for tests that bound it. Fields a provider does not track stay 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EpStats {
    /// Connections open or being set up.
    pub conns: usize,
    /// Connections whose reader waits for a receive or for budget.
    pub parked: usize,
    /// Unexpected-message bytes buffered, with the fixed per-message cost
    /// (`weft_core::limits::UNEXPECTED_OVERHEAD`).
    pub unexpected_bytes: usize,
    /// Peers the endpoint keeps state for.
    pub peers: usize,
    /// The traffic class (IP TOS byte: DSCP << 2) the transport holds for
    /// the endpoint's connections, read back where it can be: verbs
    /// reports the address vector of a MSG endpoint's queue pair, of an
    /// RDM endpoint's connected queue pairs (when they agree), and of the
    /// address handles a DGRAM endpoint has sent with. `None`: nothing to
    /// read yet, or not tracked.
    pub tclass: Option<u8>,
    /// The traffic class of the last datagram received, from its IP header
    /// (verbs DGRAM on RoCE v2); `None` where not tracked.
    pub rx_tclass: Option<u8>,
    /// Datagrams dropped on arrival because the unexpected budget
    /// (`rx_attr.total_buffered_recv`) was full (udp DGRAM).
    pub rx_dropped: u64,
    /// Datagrams dropped on arrival because they were not well-formed
    /// Weft datagrams: bad magic, version, flags or length (udp DGRAM).
    pub rx_malformed: u64,
    /// Messages received by reading the sender's memory directly, in one
    /// copy (shm cross-memory attach).
    pub rx_direct: u64,
    /// Of those, messages whose sender wrote part of them into the
    /// receive itself while the receiver read the rest (shm split
    /// copies).
    pub rx_split: u64,
    /// Messages dropped on arrival because they named a receive context
    /// the endpoint does not have, or one not enabled (tcp; scalable
    /// endpoints, `fi_rx_addr`).
    pub rx_bad_ctx: u64,
    /// Refusals for the authorization key. udp DGRAM: datagrams dropped
    /// on arrival (no trailer on a keyed endpoint, a trailer on an
    /// unkeyed one, or a MAC this key did not make). shm: channel claims
    /// refused either way (as the owner, a sender that did not prove the
    /// key; as a sender, an owner that refused it or did not prove it).
    /// verbs MSG and RDM: connections refused for their key, either way.
    pub rx_key_rejected: u64,
    /// Datagrams dropped on arrival because their key proof was one
    /// already seen, or older than the sender's replay window (udp DGRAM).
    pub rx_replayed: u64,
    /// Rendezvous sends whose payload the peer read through a memory
    /// window over a pre-registered slot of the sender's, rather than
    /// from the caller's buffer registered for it (verbs RDM).
    pub tx_windowed: u64,
    /// Sends posted without a completion of their own, ended by a later
    /// one of the same queue (verbs MSG: injects and sends whose success
    /// nothing takes).
    pub tx_unsignaled: u64,
}

/// A connected byte stream (`FI_EP_SOCK_STREAM`), in the poll form of an
/// asynchronous socket; `weft` presents it as Tokio's `AsyncRead` and
/// `AsyncWrite`. The methods follow those traits: `Pending` registers
/// `cx`'s waker, a read of 0 bytes is the end of the stream.
pub trait ByteStream: Send + Sync + Debug {
    /// Reads into `buf`.
    fn poll_read(
        &mut self,
        cx: &mut std::task::Context<'_>,
        buf: &mut [u8],
    ) -> std::task::Poll<std::io::Result<usize>>;
    /// Writes from `buf`; how much was taken.
    fn poll_write(
        &mut self,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>>;
    /// Writes from several buffers at once.
    fn poll_write_vectored(
        &mut self,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>>;
    /// Everything written has left this end.
    fn poll_flush(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>>;
    /// Ends this end's writing (the peer reads the end of the stream).
    fn poll_shutdown(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>>;
}

/// An enabled provider endpoint.
pub trait ProviderEndpoint: Send + Sync + Debug {
    /// What the endpoint holds for its peers now.
    fn stats(&self) -> EpStats {
        EpStats::default()
    }
    /// `FI_EP_SOCK_STREAM`: the connected byte stream, taken once (the
    /// caller owns it from then on). `NotConn` before the connection is
    /// made, `OpBadState` once taken; providers without socket-style
    /// endpoints keep this default (`NoSys`).
    fn take_byte_stream(&self) -> Result<Box<dyn ByteStream>> {
        Err(Error::NoSys)
    }
    /// Makes an endpoint that a critical error disabled usable again
    /// (`fi_enable` after the error). Providers that cannot keep this
    /// default (`NoSys`).
    fn reenable(&self) -> Result<()> {
        Err(Error::NoSys)
    }
    /// Posts a send; gives it back on failure to post.
    fn post_send(&self, req: SendReq) -> std::result::Result<(), Rejected<SendReq>>;
    /// Whether [`post_send`](Self::post_send) takes a message held in
    /// [`SendReq::pool`] (reading the pool buffer where it is). Providers
    /// that keep this default (`false`) never see one: the API hands
    /// them the buffer as `Bytes`.
    fn takes_pool_sends(&self) -> bool {
        false
    }
    /// Posts a receive (or a peek/claim when the flags say so).
    fn post_recv(&self, req: RecvReq) -> std::result::Result<(), Rejected<RecvReq>>;
    /// Posts an RMA read, write or atomic. Providers without them
    /// (nothing in getinfo's caps) keep this default.
    fn post_rma(&self, req: RmaReq) -> std::result::Result<(), Rejected<RmaReq>> {
        Err(Rejected {
            err: Error::NoSys,
            req,
        })
    }
    /// `fi_atomicvalid` and friends: how many elements one atomic of
    /// `op` on `datatype` in form `kind` may carry, or `OpNotSupp` for a
    /// combination this provider does not execute. Providers without
    /// atomics keep the default, `NoSys`.
    fn atomic_valid(
        &self,
        kind: crate::atomic::AtomicKind,
        op: crate::atomic::AtomicOp,
        datatype: crate::atomic::Datatype,
    ) -> Result<usize> {
        let _ = (kind, op, datatype);
        Err(Error::NoSys)
    }
    /// Cancels a posted receive with `context`; it completes with
    /// `Canceled`. Returns whether one was found.
    fn cancel(&self, context: u64) -> bool;
    /// Takes back a message that completed a receive whose future was
    /// then dropped without reading it: the next receive that accepts it
    /// gets it, ahead of later messages, so a dropped future never
    /// consumes a message. (A receive found still posted is withdrawn by
    /// [`cancel`](Self::cancel) instead.)
    fn give_back(&self, r: Returned);
    /// [`give_back`](Self::give_back) for the unread messages of a
    /// dropped multi-receive stream, handed back in their order: each
    /// goes behind those given back before it (still ahead of later
    /// arrivals). The stream withdraws its buffer
    /// ([`cancel`](Self::cancel)) after these, so a provider whose parts
    /// may still be arriving knows then that every message already in
    /// was given back. Providers without multi-receive keep the default,
    /// `give_back`.
    fn give_back_after(&self, r: Returned) {
        self.give_back(r)
    }
    /// The bound local address, raw bytes.
    fn local_addr(&self) -> Vec<u8>;
    /// The connected peer's address (connected endpoints; connectionless
    /// ones keep the default `None`).
    fn peer_addr(&self) -> Option<Vec<u8>> {
        None
    }
    /// The endpoint's inline-progress hook: one non-blocking pass over
    /// its I/O. `None` when the provider is always driven by its own
    /// threads.
    fn progress_hook(&self) -> Option<Arc<dyn Progress>> {
        None
    }
    /// Room left in the transmit queue.
    fn tx_size_left(&self) -> usize;
    /// Room left in the receive queue.
    fn rx_size_left(&self) -> usize;
    /// `fi_join`: joins the multicast group at raw address `group`;
    /// resolves with the address that sends to the group (`fi_mc_addr`).
    /// `Inval` for an address that is not a multicast group of this
    /// endpoint's address family; providers without `FI_MULTICAST` keep
    /// the default (`NoSys`).
    fn join(&self, group: Vec<u8>) -> BoxFuture<'static, Result<FiAddr>> {
        let _ = group;
        Box::pin(async { Err(Error::NoSys) })
    }
    /// Leaves the group joined as `mc` (`fi_close` of the multicast
    /// handle). `Inval` for an address that is not a joined group.
    fn leave(&self, mc: FiAddr) -> Result<()> {
        let _ = mc;
        Err(Error::NoSys)
    }
    /// MSG: connects to `dest` with CM data; resolves with the peer's CM
    /// data once connected (a `Connected` event is also queued on the EQ).
    /// Connectionless endpoints keep the default, `OpNotSupp`.
    fn connect(&self, dest: Vec<u8>, cm_data: Vec<u8>) -> BoxFuture<'static, Result<Vec<u8>>> {
        let _ = (dest, cm_data);
        Box::pin(async { Err(Error::OpNotSupp) })
    }
    /// MSG: accepts the request this endpoint was opened with
    /// (`OpNotSupp` by default).
    fn accept(&self, cm_data: Vec<u8>) -> BoxFuture<'static, Result<()>> {
        let _ = cm_data;
        Box::pin(async { Err(Error::OpNotSupp) })
    }
    /// Shuts down the connection (MSG) without closing the endpoint
    /// (`OpNotSupp` by default).
    fn shutdown(&self) -> Result<()> {
        Err(Error::OpNotSupp)
    }
    /// Opens transmit context `index` of this scalable endpoint
    /// (`fi_tx_context`, enabled): an endpoint for sends whose completions
    /// go where each request's `done` says (the context's own CQ and
    /// counter). `cfg` is the context's: its sizes and bindings. `Inval`
    /// for an index beyond `ep_attr.tx_ctx_cnt`, `Busy` for one already
    /// opened. Endpoints that are not scalable keep the default, `NoSys`.
    fn tx_context(&self, index: usize, cfg: EpConfig) -> Result<Arc<dyn ProviderEndpoint>> {
        let _ = (index, cfg);
        Err(Error::NoSys)
    }
    /// Opens receive context `index` of this scalable endpoint
    /// (`fi_rx_context`, enabled): an endpoint for receives, with queues
    /// of its own, that completes on `cfg.rx_cq`/`cfg.rx_cntr`. Errors as
    /// [`tx_context`](Self::tx_context) (bound: `ep_attr.rx_ctx_cnt`).
    fn rx_context(&self, index: usize, cfg: EpConfig) -> Result<Arc<dyn ProviderEndpoint>> {
        let _ = (index, cfg);
        Err(Error::NoSys)
    }
    /// Closes: outstanding operations are discarded without completions.
    fn close(&self);
}

/// A listening (passive) endpoint.
pub trait ProviderPassive: Send + Sync + Debug {
    /// The bound address, raw bytes.
    fn local_addr(&self) -> Vec<u8>;
    /// Rejects a connection request with data for the peer.
    fn reject(&self, conn: &ConnHandle, data: Vec<u8>) -> Result<()>;
    /// Sets the listen backlog.
    fn set_backlog(&self, backlog: usize) -> Result<()>;
    /// Stops listening.
    fn close(&self);
}

/// What a passive endpoint (a listener for MSG connections) is opened
/// with.
#[derive(Debug, Clone)]
pub struct PassiveConfig {
    /// The attributes it was created with (raw addresses).
    pub info: Info,
    /// The address to listen on, raw; `None`: the provider's default.
    pub addr: Option<Vec<u8>>,
    /// Pending-connection limit.
    pub backlog: u32,
    /// Where connection requests go.
    pub eq: Arc<EqShared>,
    /// The passive endpoint's object id (for EQ events).
    pub fid: u64,
    /// Its context (for EQ events).
    pub context: u64,
    /// Requests pending at once (`max_conns`) and the time each may take
    /// to arrive (`handshake_timeout`).
    pub limits: crate::limits::ConnLimits,
}

/// A provider: its offers and the objects it opens. Each provider crate
/// implements this once; the `weft` crate keeps the one list of them
/// (its registry), so nothing else compares provider names.
///
/// The open calls run inside the domain's Tokio runtime (the runtime's
/// handle is the current one), so a provider spawns and registers I/O
/// where its domain lives.
pub trait Provider: Send + Sync + Debug {
    /// The name (`fabric_attr.prov_name`, `FI_PROVIDER`).
    fn name(&self) -> &'static str;
    /// Whether this build can open the provider's objects (a provider
    /// behind a cargo feature that is off still says why it cannot).
    fn built(&self) -> bool {
        true
    }
    /// Its offers, one per endpoint type and device it can serve.
    fn offers(&self) -> Vec<Info>;
    /// Why it offers nothing here (no device, not compiled in), if so.
    fn unavailable_reason(&self) -> Option<String> {
        None
    }
    /// The cause behind `err` that the code alone cannot carry, when this
    /// process can see it (e.g. a locked-memory limit behind `NoMem`).
    fn error_hint(&self, _err: Error) -> Option<String> {
        None
    }
    /// Whether its endpoints take an authorization key and enforce it
    /// (`ep_attr.auth_key`, `domain_attr.auth_key`). A provider that
    /// keeps this default refuses keys: a key it would carry but not
    /// check is worse than none.
    fn auth_keys(&self) -> bool {
        false
    }
    /// Checks the TLS configuration an object would run: `files` (its
    /// `domain_attr.tls`), else whatever the provider reads from its
    /// environment. Called when a domain, endpoint or passive endpoint is
    /// created, so a bad configuration fails that call. A provider that
    /// keeps this default runs no TLS and refuses files with `OpNotSupp`:
    /// plain text where encryption was asked for is worse than no object.
    fn check_tls(&self, files: Option<&crate::tls::TlsFiles>) -> Result<()> {
        match files {
            Some(_) => Err(Error::OpNotSupp),
            None => Ok(()),
        }
    }
    /// Whether its domains keep their RDM (tcp) and DGRAM (udp)
    /// endpoints' keys in their AVs (`FI_AV_AUTH_KEY`,
    /// `domain_attr.av_auth_key`). By default, what
    /// [`auth_keys`](Self::auth_keys) says; a provider that enforces an
    /// endpoint's own key but not AV keys says `false`, and such domains
    /// and hints are refused rather than served without the keys.
    fn av_auth_keys(&self) -> bool {
        self.auth_keys()
    }
    /// An offer as it stands for `hints`, before they are matched against
    /// it: what the hints' keys cost (udp: a keyed datagram's trailer
    /// comes off `max_msg_size`). By default the offer stands as it is.
    fn offer_for(&self, _hints: &Info, _offer: &mut Info) {}
    /// Per-domain state (device context, protection domain), if the
    /// provider keeps any.
    fn open_domain(&self, _info: &Info) -> Result<Option<Arc<dyn ProviderDomain>>> {
        Ok(None)
    }
    /// Opens (enables) an endpoint.
    fn open_endpoint(&self, cfg: EpConfig) -> Result<Arc<dyn ProviderEndpoint>>;
    /// Opens (enables) a scalable endpoint (`fi_scalable_ep`): one
    /// address, `cfg.info.ep_attr.tx_ctx_cnt` transmit and `rx_ctx_cnt`
    /// receive contexts opened later through
    /// [`ProviderEndpoint::tx_context`] and
    /// [`ProviderEndpoint::rx_context`]; the endpoint itself carries no
    /// data operations. Providers whose offers have `max_ep_tx_ctx` and
    /// `max_ep_rx_ctx` of 1 keep the default, `NoSys`.
    fn open_scalable(&self, cfg: EpConfig) -> Result<Arc<dyn ProviderEndpoint>> {
        let _ = cfg;
        Err(Error::NoSys)
    }
    /// Opens a listening passive endpoint. Providers without MSG
    /// endpoints keep this default.
    fn open_passive(&self, _cfg: PassiveConfig) -> Result<Arc<dyn ProviderPassive>> {
        Err(Error::NoSys)
    }
}
