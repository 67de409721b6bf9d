//! rdma_cm: event channels, communication ids, connection set-up.
//!
//! librdmacm mutates ids (and their QPs) while it processes events in
//! `rdma_get_cm_event` (address/route queries, connect-response handling,
//! new ids for connection requests) and does not lock against calls on the
//! same ids from other threads. So every librdmacm call on an id, and
//! `rdma_get_cm_event` itself, runs under the mutex of the id's
//! [`EventChannel`]. Events are acknowledged immediately after being copied
//! out, so `rdma_destroy_id` (which waits for acknowledgements) never
//! blocks on the application.

use std::collections::HashSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rdma_sys::{
    ibv_qp, ibv_qp_init_attr, ibv_qp_type, ibv_transport_type, rdma_accept, rdma_ack_cm_event,
    rdma_bind_addr, rdma_cm_event, rdma_cm_id, rdma_conn_param, rdma_connect,
    rdma_create_event_channel, rdma_create_id, rdma_create_qp, rdma_destroy_event_channel,
    rdma_destroy_id, rdma_destroy_qp, rdma_disconnect, rdma_establish, rdma_event_channel,
    rdma_get_cm_event, rdma_join_multicast, rdma_leave_multicast, rdma_listen, rdma_port_space,
    rdma_reject, rdma_resolve_addr, rdma_resolve_route, rdma_set_option,
};
use weft_core::Error;

use super::cm_event::{copy_event, CmEvent, CmEventKind};
use super::device::{device_name, Context};
use super::pd::ProtectionDomain;
use super::qp::{set_min_rnr_timer, QpInitAttr, QpType, QueuePair, RNR_TIMER};
use super::{check_ret, last_error_or, set_nonblocking};

/// `RDMA_OPTION_ID` of rdma_cma.h (an anonymous enum, which the
/// bindings leave out).
const RDMA_OPTION_ID: libc::c_int = 0;
/// `RDMA_OPTION_ID_TOS` of rdma_cma.h: a `uint8_t` IP TOS byte.
const RDMA_OPTION_ID_TOS: libc::c_int = 0;

static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

/// A fresh process-unique id token.
pub(super) fn next_token() -> u64 {
    NEXT_TOKEN.fetch_add(1, Ordering::Relaxed)
}

/// rdma_cm port space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortSpace {
    /// `RDMA_PS_TCP`: reliable connected (RC QPs), MSG endpoints.
    Tcp,
    /// `RDMA_PS_UDP`: unreliable datagram (UD QPs).
    Udp,
}

impl PortSpace {
    fn to_raw(self) -> rdma_port_space::Type {
        match self {
            PortSpace::Tcp => rdma_port_space::RDMA_PS_TCP,
            PortSpace::Udp => rdma_port_space::RDMA_PS_UDP,
        }
    }

    /// Longest private data for `rdma_connect` (IB CM REQ minus the rdma_cm
    /// header; SIDR REQ for UDP). iWARP allows more; these are the limits
    /// that hold on every transport.
    pub const fn max_connect_private_data(self) -> usize {
        match self {
            PortSpace::Tcp => 56,
            PortSpace::Udp => 180,
        }
    }

    /// Longest private data for `rdma_accept` (IB CM REP / SIDR REP).
    pub const fn max_accept_private_data(self) -> usize {
        match self {
            PortSpace::Tcp => 196,
            PortSpace::Udp => 136,
        }
    }

    /// Longest private data for `rdma_reject` (IB CM REJ / SIDR REP).
    pub const fn max_reject_private_data(self) -> usize {
        match self {
            PortSpace::Tcp => 148,
            PortSpace::Udp => 136,
        }
    }
}

/// An rdma_cm event channel: a non-blocking fd that becomes readable when
/// events are pending. Register [`AsRawFd::as_raw_fd`] with
/// `tokio::io::unix::AsyncFd`, then drain [`get_event`](Self::get_event).
pub struct EventChannel {
    ch: NonNull<rdma_event_channel>,
    fd: RawFd,
    lock: Mutex<Locked>,
}

/// What the channel lock guards besides librdmacm's own state.
#[derive(Default)]
struct Locked {
    /// Tokens of the ids whose QP already has [`RNR_TIMER`], so the
    /// accepting side, set in [`CmId::accept`], is not modified again
    /// when its `Established` arrives. Removed when the id is destroyed.
    rnr_timer_set: HashSet<u64>,
}

// SAFETY: every librdmacm call on the channel and its ids is serialised by
// `lock`; the fd itself may be polled from any thread.
unsafe impl Send for EventChannel {}
// SAFETY: see `Send`.
unsafe impl Sync for EventChannel {}

impl fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.fd)
            .finish()
    }
}

impl EventChannel {
    /// `rdma_create_event_channel`, with the fd set to `O_NONBLOCK`.
    pub fn new() -> Result<Arc<EventChannel>, Error> {
        // SAFETY: no preconditions; the result is owned by us.
        let ch = unsafe { rdma_create_event_channel() };
        let ch = NonNull::new(ch).ok_or_else(|| last_error_or(Error::NoDev))?;
        // SAFETY: a valid channel; `fd` is immutable.
        let fd = unsafe { (*ch.as_ptr()).fd };
        let chan = EventChannel {
            ch,
            fd,
            lock: Mutex::new(Locked::default()),
        };
        set_nonblocking(fd)?;
        Ok(Arc::new(chan))
    }

    fn lock(&self) -> MutexGuard<'_, Locked> {
        self.lock.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next event (`rdma_get_cm_event`), copied out and acknowledged;
    /// `None` when nothing is pending.
    pub fn get_event(self: &Arc<Self>) -> Result<Option<CmEvent>, Error> {
        let mut guard = self.lock();
        let mut ev: *mut rdma_cm_event = ptr::null_mut();
        // SAFETY: the channel is alive; `ev` is a valid out-pointer.
        let ret = unsafe { rdma_get_cm_event(self.ch.as_ptr(), &mut ev) };
        if ret != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EAGAIN) {
                return Ok(None);
            }
            return Err(last_error_or(Error::Io));
        }
        let Some(ev) = NonNull::new(ev) else {
            return Err(Error::Io);
        };
        // SAFETY: a successfully returned event is valid until acked, and
        // its ids are live ids of this channel (owned by CmIds, or, for a
        // connect request, a new id that `copy_event` takes ownership of).
        let event = unsafe { copy_event(self, ev.as_ptr()) };
        if event.kind == CmEventKind::Established
            && !guard.rnr_timer_set.contains(&event.id_token)
            // SAFETY: the event's id is live until the event is acked, and
            // its QP cannot be destroyed while we hold the channel lock.
            && unsafe { shorten_rnr_wait((*ev.as_ptr()).id) }
        {
            guard.rnr_timer_set.insert(event.id_token);
        }
        // SAFETY: acked exactly once, after copying everything out.
        unsafe { rdma_ack_cm_event(ev.as_ptr()) };
        Ok(Some(event))
    }
}

impl EventChannel {
    /// Registers the fd with the current Tokio reactor for readability.
    /// Wait with `readable().await`, then drain with `get_inner()` and clear
    /// the readiness when it returns nothing.
    ///
    /// # Panics
    /// Outside a Tokio runtime (Tokio's own check).
    pub fn register_async(
        self: &Arc<Self>,
    ) -> Result<tokio::io::unix::AsyncFd<Arc<EventChannel>>, Error> {
        // SAFETY: the AsyncFd owns an Arc of the event channel, whose fd stays
        // open and unchanged until the last Arc is dropped (Drop closes it),
        // so it outlives the registration, and `as_raw_fd` always returns
        // the same fd.
        unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(
                Arc::clone(self),
                tokio::io::Interest::READABLE,
            )
        }
        .map_err(|e| Error::from_io(&e.into_parts().1))
    }
}

impl AsRawFd for EventChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

impl AsFd for EventChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the fd stays open until the channel is destroyed in Drop,
        // which cannot happen while `&self` is borrowed.
        unsafe { BorrowedFd::borrow_raw(self.fd) }
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: created by rdma_create_event_channel, destroyed once;
        // every id holds an Arc of the channel, so none is left, and all
        // events were acked.
        unsafe { rdma_destroy_event_channel(self.ch.as_ptr()) }
    }
}

/// Gives the RC QP of `id`, if it has one, the RNR timer of
/// [`RNR_TIMER`] instead of the 655 ms that the kernel CM set at RTR
/// (an RTS to RTS modify). Both callers run right after librdmacm has
/// moved the QP to RTS: [`CmId::accept`] on the accepting side, once
/// `rdma_accept` has returned, which is after the reply has been sent;
/// and, on the connecting side, the `rdma_get_cm_event` that reports
/// `Established`, which has already sent the handshake's last message.
/// A message the peer sends before the modify lands can still find the
/// long timer if no receive is posted; on the accepting side that window
/// is the reply's flight, the peer's last handshake message and its
/// first send. Only QPs whose attributes the application sets before
/// accepting (`ConnParam::with_qp_num`, then `establish`) would close it.
///
/// RC QPs on InfiniBand-transport devices (IB, RoCE) only: iWARP has no
/// RNR NAK. The type and device never change, so unlike the QP's state
/// they can be read while another thread moves the QP to the error state
/// (which librdmacm's lock does not cover). A QP that has already left
/// RTS fails with `EINVAL`, which is expected and logged at debug level;
/// any other failure only keeps the long wait, so it is logged, not
/// returned. Returns whether the timer was set.
///
/// # Safety
/// `id` must be a live id whose channel lock the caller holds.
unsafe fn shorten_rnr_wait(id: *mut rdma_cm_id) -> bool {
    // SAFETY: the caller guarantees a live, locked id; its QP (if any)
    // is only destroyed under the same lock.
    let qp = unsafe { (*id).qp };
    if qp.is_null() {
        return false;
    }
    // SAFETY: a live QP; its type, number and context are written once
    // by ibv_create_qp and only read afterwards, and the context (with
    // its device) outlives its QPs.
    let (qp_type, qp_num, dev) = unsafe { ((*qp).qp_type, (*qp).qp_num, (*(*qp).context).device) };
    if qp_type != ibv_qp_type::IBV_QPT_RC {
        return false;
    }
    // SAFETY: the device of a live context; `transport_type` is fixed
    // when the device list is built.
    if unsafe { (*dev).transport_type } != ibv_transport_type::IBV_TRANSPORT_IB {
        return false;
    }
    // SAFETY: as above; the QP outlives the call.
    match unsafe { set_min_rnr_timer(qp, RNR_TIMER) } {
        Ok(()) => true,
        Err(error) => {
            // SAFETY: as above.
            let device = unsafe { device_name(dev) };
            if error == Error::Inval {
                tracing::debug!(
                    qp_num,
                    %device,
                    %error,
                    "rdma_cm QP left RTS before its RNR timer could be shortened"
                );
            } else {
                tracing::warn!(
                    qp_num,
                    %device,
                    %error,
                    "cannot shorten the RNR timer of an rdma_cm QP; it keeps 655 ms"
                );
            }
            false
        }
    }
}

/// Connection parameters for [`CmId::connect`] / [`CmId::accept`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnParam<'a> {
    /// Private data for the peer (see [`PortSpace`] for the limits).
    pub private_data: &'a [u8],
    /// Reads/atomics the peer may have outstanding at us (0xFF: device max).
    pub responder_resources: u8,
    /// Reads/atomics we may have outstanding at the peer (0xFF: device max).
    pub initiator_depth: u8,
    /// Hardware flow control.
    pub flow_control: u8,
    /// Transport retries (0-7; ignored by accept).
    pub retry_count: u8,
    /// RNR retries (0-7, 7 = infinite).
    pub rnr_retry_count: u8,
    /// The queue pair to announce when the id has none of its own (a UD
    /// endpoint answering address resolution for its one QP); ignored
    /// when the id has a QP.
    pub qp_num: u32,
}

impl<'a> ConnParam<'a> {
    /// Device-maximum read/atomic depths, [`RC_RETRIES`] retries,
    /// infinite RNR retries.
    ///
    /// [`RC_RETRIES`]: super::RC_RETRIES
    pub fn new(private_data: &'a [u8]) -> ConnParam<'a> {
        ConnParam {
            private_data,
            responder_resources: 0xFF,
            initiator_depth: 0xFF,
            flow_control: 0,
            retry_count: super::qp::RC_RETRIES,
            rnr_retry_count: 7,
            qp_num: 0,
        }
    }

    /// Announcing queue pair `qp_num` (for an id without a QP).
    pub fn with_qp_num(mut self, qp_num: u32) -> Self {
        self.qp_num = qp_num & 0x00ff_ffff;
        self
    }

    fn to_raw(self, limit: usize) -> Result<rdma_conn_param, Error> {
        if self.private_data.len() > limit {
            return Err(Error::Inval);
        }
        Ok(rdma_conn_param {
            private_data: if self.private_data.is_empty() {
                ptr::null()
            } else {
                self.private_data.as_ptr().cast()
            },
            private_data_len: self.private_data.len() as u8,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: self.flow_control,
            retry_count: self.retry_count.min(7),
            rnr_retry_count: self.rnr_retry_count.min(7),
            srq: 0,
            qp_num: self.qp_num,
        })
    }
}

/// The shared state of a [`CmId`] (QPs created on it keep it alive).
pub(crate) struct CmIdInner {
    id: NonNull<rdma_cm_id>,
    token: u64,
    channel: Arc<EventChannel>,
}

// SAFETY: every access to the id goes through the channel's lock.
unsafe impl Send for CmIdInner {}
// SAFETY: see `Send`.
unsafe impl Sync for CmIdInner {}

impl CmIdInner {
    /// Runs `f` on the id with the channel lock held.
    fn with<R>(&self, f: impl FnOnce(*mut rdma_cm_id) -> R) -> R {
        let _guard = self.channel.lock();
        f(self.id.as_ptr())
    }

    /// [`with`](Self::with), also handing `f` what the lock guards.
    fn with_locked<R>(&self, f: impl FnOnce(*mut rdma_cm_id, &mut Locked) -> R) -> R {
        let mut guard = self.channel.lock();
        f(self.id.as_ptr(), &mut guard)
    }

    /// `rdma_create_qp` with `pd` (which must be on the id's device).
    pub(crate) fn create_qp(
        &self,
        pd: &ProtectionDomain,
        attr: &mut ibv_qp_init_attr,
    ) -> Result<NonNull<ibv_qp>, Error> {
        self.with(|id| {
            // SAFETY: the id is alive and we hold the lock.
            if unsafe { (*id).verbs } != pd.context().as_ptr() {
                return Err(Error::Inval);
            }
            // SAFETY: id and PD are alive; `attr` is fully initialised and
            // its CQs/SRQ are kept alive by the QueuePair being built.
            check_ret(unsafe { rdma_create_qp(id, pd.as_ptr(), attr) })?;
            // SAFETY: set by the successful rdma_create_qp.
            NonNull::new(unsafe { (*id).qp }).ok_or(Error::Io)
        })
    }

    /// `rdma_destroy_qp` (from the QueuePair's Drop).
    pub(crate) fn destroy_qp(&self) {
        self.with(|id| {
            // SAFETY: the id is alive, we hold the lock, and the QP was
            // created by rdma_create_qp on it.
            unsafe {
                if !(*id).qp.is_null() {
                    rdma_destroy_qp(id);
                }
            }
        })
    }
}

impl Drop for CmIdInner {
    fn drop(&mut self) {
        let token = self.token;
        let ret = self.with_locked(|id, locked| {
            locked.rnr_timer_set.remove(&token);
            // SAFETY: created by rdma_create_id (or handed over with a
            // connect request), destroyed once; its QP (if any) holds an Arc
            // of this inner, so it is gone; all its events were acked.
            unsafe { rdma_destroy_id(id) }
        });
        if ret != 0 {
            tracing::warn!(ret, "rdma_destroy_id failed");
        }
    }
}

/// An rdma_cm communication id. Holds its [`EventChannel`] alive. A QP
/// created on it keeps the id alive until the QP is dropped.
pub struct CmId {
    inner: Arc<CmIdInner>,
}

impl fmt::Debug for CmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmId")
            .field("token", &self.inner.token)
            .field("local", &self.local_addr())
            .field("peer", &self.peer_addr())
            .finish()
    }
}

/// A socket address in C form.
enum RawSockAddr {
    V4(libc::sockaddr_in),
    V6(libc::sockaddr_in6),
}

impl RawSockAddr {
    fn new(addr: &SocketAddr) -> RawSockAddr {
        match addr {
            SocketAddr::V4(a) => RawSockAddr::V4(libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            }),
            SocketAddr::V6(a) => RawSockAddr::V6(libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            }),
        }
    }

    fn as_mut_ptr(&mut self) -> *mut libc::sockaddr {
        match self {
            RawSockAddr::V4(a) => (a as *mut libc::sockaddr_in).cast(),
            RawSockAddr::V6(a) => (a as *mut libc::sockaddr_in6).cast(),
        }
    }
}

/// Reads a socket address out of a `sockaddr_storage`.
fn from_storage(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    let base: *const libc::sockaddr_storage = ss;
    match i32::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says it holds a sockaddr_in, which fits in
            // (and is less aligned than) sockaddr_storage.
            let a = unsafe { &*base.cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(a.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let a = unsafe { &*base.cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

impl CmId {
    /// Takes ownership of the new id of a connection request.
    ///
    /// # Safety
    /// `id` must be a live id of `channel` that nothing else owns.
    pub(super) unsafe fn adopt(
        id: NonNull<rdma_cm_id>,
        token: u64,
        channel: &Arc<EventChannel>,
    ) -> CmId {
        CmId {
            inner: Arc::new(CmIdInner {
                id,
                token,
                channel: Arc::clone(channel),
            }),
        }
    }

    /// `rdma_create_id` on `channel`.
    pub fn new(channel: &Arc<EventChannel>, ps: PortSpace) -> Result<CmId, Error> {
        let token = next_token();
        let guard = channel.lock();
        let mut id: *mut rdma_cm_id = ptr::null_mut();
        // SAFETY: the channel is alive and locked; `id` is a valid
        // out-pointer; the context is an opaque integer we only read back.
        check_ret(unsafe {
            rdma_create_id(
                channel.ch.as_ptr(),
                &mut id,
                token as usize as *mut libc::c_void,
                ps.to_raw(),
            )
        })?;
        let id = NonNull::new(id).ok_or(Error::Io)?;
        drop(guard);
        Ok(CmId {
            inner: Arc::new(CmIdInner {
                id,
                token,
                channel: Arc::clone(channel),
            }),
        })
    }

    /// A process-unique token identifying this id in [`CmEvent::id_token`].
    pub fn token(&self) -> u64 {
        self.inner.token
    }

    /// The event channel.
    pub fn channel(&self) -> &Arc<EventChannel> {
        &self.inner.channel
    }

    /// The port space.
    pub fn port_space(&self) -> PortSpace {
        // SAFETY: `ps` is immutable after creation.
        let ps = self.inner.with(|id| unsafe { (*id).ps });
        if ps == rdma_port_space::RDMA_PS_UDP {
            PortSpace::Udp
        } else {
            PortSpace::Tcp
        }
    }

    /// `rdma_bind_addr`.
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<(), Error> {
        let mut sa = RawSockAddr::new(&addr);
        // SAFETY: the id is alive and locked; `sa` is a valid sockaddr of
        // the family's size.
        self.inner
            .with(|id| check_ret(unsafe { rdma_bind_addr(id, sa.as_mut_ptr()) }))
    }

    /// `rdma_listen` (after `bind_addr`).
    pub fn listen(&self, backlog: i32) -> Result<(), Error> {
        // SAFETY: the id is alive and locked.
        self.inner
            .with(|id| check_ret(unsafe { rdma_listen(id, backlog) }))
    }

    /// `rdma_set_option(RDMA_OPTION_ID, RDMA_OPTION_ID_TOS)`: the IP TOS
    /// byte (DSCP << 2) of the id's connection. On RoCE it becomes the
    /// traffic class of the route that `resolve_route` builds, so it must
    /// be set before that. The passive side's QP takes its traffic class
    /// from the connect request instead: set on a connect request's id
    /// before `accept`, it does not change the QP (rxe, Linux 6.1).
    pub fn set_tos(&self, tos: u8) -> Result<(), Error> {
        let mut v = tos;
        self.inner.with(|id| {
            // SAFETY: the id is alive and locked; the option is one byte,
            // read during the call.
            check_ret(unsafe {
                rdma_set_option(
                    id,
                    RDMA_OPTION_ID,
                    RDMA_OPTION_ID_TOS,
                    (&mut v as *mut u8).cast(),
                    std::mem::size_of::<u8>(),
                )
            })
        })
    }

    /// `rdma_resolve_addr`: completes with `AddrResolved`/`AddrError`.
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout_ms: u32,
    ) -> Result<(), Error> {
        let mut src = src.map(|a| RawSockAddr::new(&a));
        let mut dst = RawSockAddr::new(&dst);
        let timeout = i32::try_from(timeout_ms).map_err(|_| Error::Inval)?;
        let src_ptr = src.as_mut().map_or(ptr::null_mut(), |s| s.as_mut_ptr());
        let dst_ptr = dst.as_mut_ptr();
        self.inner.with(|id| {
            // SAFETY: the id is alive and locked; the addresses are valid
            // sockaddrs (or NULL for the source) that outlive the call.
            check_ret(unsafe { rdma_resolve_addr(id, src_ptr, dst_ptr, timeout) })
        })
    }

    /// `rdma_resolve_route`: completes with `RouteResolved`/`RouteError`.
    pub fn resolve_route(&self, timeout_ms: u32) -> Result<(), Error> {
        let timeout = i32::try_from(timeout_ms).map_err(|_| Error::Inval)?;
        // SAFETY: the id is alive and locked.
        self.inner
            .with(|id| check_ret(unsafe { rdma_resolve_route(id, timeout) }))
    }

    /// `rdma_connect`. `Inval` if the private data exceeds
    /// [`PortSpace::max_connect_private_data`].
    pub fn connect(&self, param: &ConnParam<'_>) -> Result<(), Error> {
        let mut raw = param.to_raw(self.port_space().max_connect_private_data())?;
        // SAFETY: the id is alive and locked; `raw` (and the private data
        // it points to) is valid for the call, which copies it.
        self.inner
            .with(|id| check_ret(unsafe { rdma_connect(id, &mut raw) }))
    }

    /// `rdma_accept` (on the id of a `ConnectRequest`). `Inval` if the
    /// private data exceeds [`PortSpace::max_accept_private_data`].
    /// An RC QP created on the id then gets [`RNR_TIMER`]; `rdma_accept`
    /// has already sent the reply by then, so post receives before
    /// accepting.
    pub fn accept(&self, param: &ConnParam<'_>) -> Result<(), Error> {
        let mut raw = param.to_raw(self.port_space().max_accept_private_data())?;
        let token = self.inner.token;
        self.inner.with_locked(|id, locked| {
            // SAFETY: as for `connect`.
            check_ret(unsafe { rdma_accept(id, &mut raw) })?;
            // SAFETY: the id is alive and locked.
            if unsafe { shorten_rnr_wait(id) } {
                locked.rnr_timer_set.insert(token);
            }
            Ok(())
        })
    }

    /// `rdma_reject`. `Inval` if the private data exceeds
    /// [`PortSpace::max_reject_private_data`].
    pub fn reject(&self, private_data: &[u8]) -> Result<(), Error> {
        if private_data.len() > self.port_space().max_reject_private_data() {
            return Err(Error::Inval);
        }
        let ptr = if private_data.is_empty() {
            ptr::null()
        } else {
            private_data.as_ptr().cast()
        };
        let len = private_data.len() as u8;
        // SAFETY: the id is alive and locked; the call copies the data.
        self.inner
            .with(|id| check_ret(unsafe { rdma_reject(id, ptr, len) }))
    }

    /// `rdma_establish`: completes a connection whose `ConnectResponse` was
    /// reported (only when the id has no QP).
    pub fn establish(&self) -> Result<(), Error> {
        // SAFETY: the id is alive and locked.
        self.inner
            .with(|id| check_ret(unsafe { rdma_establish(id) }))
    }

    /// `rdma_disconnect`: both sides get `Disconnected`; the QP moves to
    /// the error state (flushing its work requests).
    pub fn disconnect(&self) -> Result<(), Error> {
        // SAFETY: the id is alive and locked.
        self.inner
            .with(|id| check_ret(unsafe { rdma_disconnect(id) }))
    }

    /// `rdma_join_multicast` of group `addr` (the id bound to a local
    /// address first): completes with `MulticastJoin`, whose UD
    /// parameters are the group's address vector, QPN and Q_Key, or
    /// `MulticastError`. Destroying the id leaves its groups.
    pub fn join_multicast(&self, addr: SocketAddr) -> Result<(), Error> {
        let mut sa = RawSockAddr::new(&addr);
        self.inner.with(|id| {
            // SAFETY: the id is alive and locked; `sa` is a valid sockaddr
            // (librdmacm copies it); the context is left NULL.
            check_ret(unsafe { rdma_join_multicast(id, sa.as_mut_ptr(), ptr::null_mut()) })
        })
    }

    /// `rdma_leave_multicast` of a group joined with
    /// [`join_multicast`](Self::join_multicast). librdmacm waits there
    /// until the group's reported events are acknowledged, which
    /// [`EventChannel::get_event`] does under the same lock, so it never
    /// waits on the application.
    pub fn leave_multicast(&self, addr: SocketAddr) -> Result<(), Error> {
        let mut sa = RawSockAddr::new(&addr);
        self.inner.with(|id| {
            // SAFETY: the id is alive and locked; `sa` is a valid sockaddr.
            check_ret(unsafe { rdma_leave_multicast(id, sa.as_mut_ptr()) })
        })
    }

    /// The bound/resolved local address, if any.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: the id is alive and locked; the union is plain data and
        // sockaddr_storage covers all of it.
        let ss = self
            .inner
            .with(|id| unsafe { (*id).route.addr.src_addr_union.src_storage });
        from_storage(&ss)
    }

    /// The peer address, once resolved / connected.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as for `local_addr`.
        let ss = self
            .inner
            .with(|id| unsafe { (*id).route.addr.dst_addr_union.dst_storage });
        from_storage(&ss)
    }

    /// The local IP, if bound.
    pub fn local_ip(&self) -> Option<IpAddr> {
        self.local_addr()
            .map(|a| a.ip())
            .filter(|ip| !ip.is_unspecified())
    }

    /// The device the id is bound to (after `bind_addr` on a specific
    /// address, `resolve_addr`, or for a `ConnectRequest` id), so PDs, CQs
    /// and QPs can be created on it. `NoDev` if not bound to a device yet.
    pub fn context(&self) -> Result<Arc<Context>, Error> {
        // SAFETY: the id is alive and locked.
        let verbs = self.inner.with(|id| unsafe { (*id).verbs });
        Context::from_rdma_cm(verbs)
    }

    /// The port of the device the id is bound to (0 if none).
    pub fn port_num(&self) -> u8 {
        // SAFETY: the id is alive and locked.
        self.inner.with(|id| unsafe { (*id).port_num })
    }

    /// `rdma_create_qp`: a QP on this id, moved to INIT by librdmacm and to
    /// RTR/RTS during connect/accept. `pd` must be on [`CmId::context`]'s
    /// device and the type must match the port space (`Inval`). An id has
    /// at most one QP.
    pub fn create_qp(
        &self,
        pd: &Arc<ProtectionDomain>,
        init: &QpInitAttr,
    ) -> Result<Arc<QueuePair>, Error> {
        let want = match self.port_space() {
            PortSpace::Tcp => QpType::Rc,
            PortSpace::Udp => QpType::Ud,
        };
        if init.qp_type != want {
            return Err(Error::Inval);
        }
        QueuePair::new_cm(&self.inner, pd, init)
    }
}
