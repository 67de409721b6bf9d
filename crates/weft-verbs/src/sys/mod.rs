//! Safe wrappers over libibverbs and librdmacm.
//!
//! This is the only place in the crate that calls C. Everything exported
//! from here is safe to use; the invariants that make it so are:
//!
//! * **Parents outlive children by construction.** Every object holds an
//!   `Arc` of the objects it was created from (MR/QP/CQ/SRQ/AH → PD →
//!   [`Context`]; QP → its CQs and SRQ; CQ → its [`CompChannel`]; a
//!   [`CmId`] → its [`EventChannel`]; a QP created on a `CmId` → that id),
//!   so C objects are always destroyed children first.
//! * **The device never touches memory safe code can free or mutate.** Work
//!   requests can only name memory through an [`Sge`], which only the
//!   registration types ([`OwnedMr`], [`BytesMr`], [`BytesMutMr`]) hand
//!   out (and [`PoolMr`], over a buffer the caller holds), and a
//!   registration owns its memory until `ibv_dereg_mr` has
//!   returned (after which the device can no longer access it; an operation
//!   still in flight then fails with a protection error completion instead
//!   of touching freed memory). Inline sends copy their data at post time.
//! * **A window exposes only memory a region owns, and only until it is
//!   revoked.** A [`MemoryWindow`] is bound over part of an [`OwnedMr`]
//!   (borrowed for the post) by
//!   [`QueuePair::post_bind_then_send`]; a region with windows bound
//!   cannot be deregistered, so its memory is leaked rather than freed
//!   if it is dropped first, and dropping the window revokes it.
//! * **librdmacm calls are serialised per event channel** (see [`cm`]),
//!   because librdmacm mutates ids while it processes events.
//!
//! Errors are [`weft_core::Error`]s; errno values keep their meaning
//! (`ENOMEM` → `NoMem`, `EINVAL` → `Inval`, `ENODEV` → `NoDev`, ...), except
//! that a full send/receive queue (`ENOMEM` from a post) is `Again`.

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;

use weft_core::Error;

pub mod ah;
pub mod async_event;
pub mod cm;
pub mod cm_event;
pub mod cq;
pub mod device;
pub mod mr;
pub mod mw;
pub mod pd;
pub mod pool_mr;
pub mod qp;
pub mod wr;

pub use ah::{AddressHandle, AhAttr};
pub use async_event::AsyncEvents;
pub use cm::{CmId, ConnParam, EventChannel, PortSpace};
pub use cm_event::{CmEvent, CmEventKind, ConnInfo, UdParam};
pub use cq::{CompChannel, Cq, CqEvents, WcFlags, WcOpcode, WcStatus, WorkCompletion};
pub use device::{
    find_gid_for_ip, list_devices, AtomicCap, Context, DeviceAttr, DeviceInfo, Gid, GidEntry,
    GidLocation, LinkLayer, Mtu, PortAttr, PortState,
};
pub use mr::{AccessFlags, BytesMr, BytesMutMr, OwnedMr, Sge};
pub use mw::MemoryWindow;
pub use pd::ProtectionDomain;
pub use pool_mr::{in_any_pool, PoolMr};
pub use qp::{
    probe_max_inline_data, QpCaps, QpInitAttr, QpState, QpType, QueuePair, RcConnectParams, Srq,
    RC_RETRIES, RNR_TIMER,
};
pub use wr::{Payload, PostError, RecvRequest, SendFlags, SendOp, SendRequest, UdDest};

/// The Q_Key rdma_cm gives UD ids of the UDP port space (`RDMA_UDP_QKEY`):
/// a UD queue pair that answers address resolution must use it, because
/// the kernel announces it to resolvers.
pub const UDP_QKEY: u32 = rdma_sys::RDMA_UDP_QKEY;

/// Bytes before a UD receive's payload: the packet's GRH (or, for RoCE v2
/// over IPv4, 20 unused bytes and the IPv4 header).
pub const GRH_LEN: usize = 40;

/// The error for an errno value, keeping its meaning.
pub(crate) fn errno_error(errno: i32) -> Error {
    Error::from_io(&io::Error::from_raw_os_error(errno))
}

/// The error in `errno`, or `fallback` when a C call failed without
/// setting it.
pub(crate) fn last_error_or(fallback: Error) -> Error {
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(0) | None => fallback,
        Some(_) => Error::from_io(&e),
    }
}

/// Maps the return value of a verbs call that returns 0 on success and an
/// errno on failure. Providers disagree on the sign convention (the man
/// pages say "the value of errno", rxe returns `-errno`, some return -1 and
/// set `errno`), so all three are accepted.
pub(crate) fn check_ret(ret: i32) -> Result<(), Error> {
    match ret {
        0 => Ok(()),
        -1 => Err(last_error_or(Error::Perm)),
        r if r < 0 => Err(errno_error(r.saturating_neg())),
        r => Err(errno_error(r)),
    }
}

/// The errno of a verbs-style return value (see [`check_ret`]), for the
/// callers that remap some codes.
pub(crate) fn ret_errno(ret: i32) -> i32 {
    match ret {
        -1 => io::Error::last_os_error()
            .raw_os_error()
            .filter(|&e| e != 0)
            .unwrap_or(libc::EPERM),
        r if r < 0 => r.saturating_neg(),
        r => r,
    }
}

/// Sets `O_NONBLOCK` on a file descriptor this module owns.
pub(crate) fn set_nonblocking(fd: i32) -> Result<(), Error> {
    // SAFETY: fcntl(F_GETFL) on any integer is memory-safe; an invalid fd
    // just fails with EBADF.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(last_error_or(Error::BadF));
    }
    // SAFETY: as above; F_SETFL only changes the file status flags.
    let ret = unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) };
    if ret < 0 {
        return Err(last_error_or(Error::BadF));
    }
    Ok(())
}

/// Waits until `fd` is readable or `timeout` passes (`poll(2)`); returns
/// whether it is readable. A blocking helper for tools and tests: the
/// provider registers [`CompChannel`] and [`EventChannel`] fds with
/// `tokio::io::unix::AsyncFd` instead.
pub fn poll_readable(fd: impl AsFd, timeout: Duration) -> Result<bool, Error> {
    let mut pfd = libc::pollfd {
        fd: fd.as_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    loop {
        // SAFETY: `pfd` is one valid pollfd; the borrowed fd stays open for
        // the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n >= 0 {
            return Ok(n > 0 && pfd.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(Error::from_io(&err));
        }
    }
}
