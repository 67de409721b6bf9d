//! A device context's asynchronous events (`ibv_get_async_event`).
//!
//! Every event read is acknowledged (`ibv_ack_async_event`) before the
//! read returns: `ibv_destroy_qp` (and the destroys of CQs and SRQs)
//! waits until each event read for the object is acknowledged, so an
//! event left unacknowledged would hang the close of whatever it names.
//! The caller's `route` runs between the two, while the object the event
//! names cannot be destroyed yet (see `crate::device_events`).

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;

use rdma_sys::{ibv_context, ibv_qp};
use weft_core::Error;

use super::device::Context;
use super::{last_error_or, set_nonblocking};
use crate::device_events::{AsyncEvent, AsyncEventKind, ElementKind};

/// `struct ibv_async_event`, with the event type read as the plain
/// integer it is in C: a value this build's bindings do not list must
/// not become an invalid Rust enum.
#[repr(C)]
struct RawAsyncEvent {
    element: RawElement,
    event_type: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
union RawElement {
    ptr: *mut libc::c_void,
    port_num: libc::c_int,
}

extern "C" {
    // Declared here with the event type as an integer (see
    // `RawAsyncEvent`); the layout is libibverbs' struct.
    #[link_name = "ibv_get_async_event"]
    fn get_async_event(context: *mut ibv_context, event: *mut RawAsyncEvent) -> libc::c_int;
    #[link_name = "ibv_ack_async_event"]
    fn ack_async_event(event: *mut RawAsyncEvent);
}

/// The async event fd of a device context, set non-blocking. Register it
/// with `tokio::io::unix::AsyncFd` ([`register_async`](Self::register_async))
/// and call [`read`](Self::read) when it is readable.
///
/// A context has one such fd and each event is read once: the caller
/// makes sure one reader per `ibv_context` exists in the process
/// ([`key`](Self::key)).
pub struct AsyncEvents {
    ctx: Arc<Context>,
    fd: RawFd,
}

impl fmt::Debug for AsyncEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncEvents")
            .field("device", &self.ctx.name())
            .field("fd", &self.fd)
            .finish()
    }
}

/// Acknowledges the event on every way out of [`AsyncEvents::read`].
struct Ack(RawAsyncEvent);

impl Drop for Ack {
    fn drop(&mut self) {
        // SAFETY: filled by a successful ibv_get_async_event and
        // acknowledged once, here.
        unsafe { ack_async_event(&mut self.0) }
    }
}

impl AsyncEvents {
    /// The async events of `ctx`; its fd becomes non-blocking.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<AsyncEvents>, Error> {
        // SAFETY: the context is open (we hold an Arc of it); `async_fd`
        // is set when it is opened and never changes.
        let fd = unsafe { (*ctx.as_ptr()).async_fd };
        set_nonblocking(fd)?;
        Ok(Arc::new(AsyncEvents {
            ctx: ctx.clone(),
            fd,
        }))
    }

    /// Identifies the `ibv_context` (two [`Context`]s may wrap one).
    pub fn key(&self) -> usize {
        self.ctx.as_ptr() as usize
    }

    /// The device name.
    pub fn device(&self) -> &str {
        self.ctx.name()
    }

    /// Reads one event, hands it to `route` and acknowledges it. False
    /// when none was pending.
    pub fn read(&self, route: impl FnOnce(&AsyncEvent)) -> Result<bool, Error> {
        let mut raw = RawAsyncEvent {
            element: RawElement {
                ptr: std::ptr::null_mut(),
            },
            event_type: 0,
        };
        // SAFETY: the context is open; `raw` is a valid, writable
        // ibv_async_event.
        let ret = unsafe { get_async_event(self.ctx.as_ptr(), &mut raw) };
        if ret != 0 {
            let err = std::io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(libc::EAGAIN) => Ok(false),
                Some(libc::EINTR) => Ok(true),
                _ => Err(last_error_or(Error::Io)),
            };
        }
        let ack = Ack(raw);
        let kind = AsyncEventKind::from_raw(ack.0.event_type);
        let mut ev = AsyncEvent {
            kind,
            qp_num: None,
            port: None,
        };
        match kind.element() {
            ElementKind::Qp => {
                // SAFETY: a queue pair's event fills `element.qp`.
                let qp = unsafe { ack.0.element.ptr } as *mut ibv_qp;
                if !qp.is_null() {
                    // SAFETY: the queue pair cannot be destroyed before
                    // this event is acknowledged (ibv_destroy_qp waits for
                    // it), so it is alive; `qp_num` never changes.
                    ev.qp_num = Some(unsafe { (*qp).qp_num });
                }
            }
            ElementKind::Port => {
                // SAFETY: a port's event fills `element.port_num`.
                let port = unsafe { ack.0.element.port_num };
                ev.port = u32::try_from(port).ok();
            }
            _ => {}
        }
        route(&ev);
        drop(ack);
        Ok(true)
    }

    /// Registers the fd with the current Tokio reactor for readability.
    ///
    /// # Panics
    /// Outside a Tokio runtime (Tokio's own check).
    pub fn register_async(
        self: &Arc<Self>,
    ) -> Result<tokio::io::unix::AsyncFd<Arc<AsyncEvents>>, Error> {
        // SAFETY: the AsyncFd owns an Arc of this value, which holds the
        // context open, so the fd stays open and unchanged until the
        // registration is gone, and `as_raw_fd` always returns it.
        unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(
                Arc::clone(self),
                tokio::io::Interest::READABLE,
            )
        }
        .map_err(|e| Error::from_io(&e.into_parts().1))
    }
}

impl AsRawFd for AsyncEvents {
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

impl AsFd for AsyncEvents {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the fd is the context's, open until the context is
        // closed, which the Arc held here prevents while `&self` lives.
        unsafe { BorrowedFd::borrow_raw(self.fd) }
    }
}
