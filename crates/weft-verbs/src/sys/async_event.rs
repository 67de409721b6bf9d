//! A device context's asynchronous events (`ibv_get_async_event`).
//!
//! Every event read is acknowledged (`ibv_ack_async_event`) before the
//! read returns: `ibv_destroy_qp` (and the destroys of CQs and SRQs)
//! waits until each event read for the object is acknowledged, so an
//! event left unacknowledged would hang the close of whatever it names.
//! The caller's `route` runs between the two, while the object the event
//! names cannot be destroyed yet (see `crate::device_events`).
//!
//! The reader is a thread of its own (`crate::async_reader`) blocked in
//! `poll(2)` on the context's async fd and a stop eventfd of ours. The
//! async fd is made non-blocking: it is the context's, and other code in
//! the process may read it too, taking between our `poll` and our read
//! the event `poll` saw; a blocking read would then wait where the stop
//! fd cannot reach it. Non-blocking, that read answers "none" and the
//! thread polls again. (Another reader of the same context then sees a
//! non-blocking fd too: its `ibv_get_async_event` fails with `EAGAIN`
//! when nothing is pending, instead of waiting.)

use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use rdma_sys::{ibv_context, ibv_qp};
use weft_core::Error;

use super::device::Context;
use super::{last_error_or, set_nonblocking};
use crate::device_events::{AsyncEvent, AsyncEventKind, ElementKind, FdFault};

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

/// The async event fd of a device context, and a stop fd to wake a
/// reader blocked on it (`wait`, [`stop`](Self::stop)).
///
/// A context has one such fd and each event is read once: the caller
/// makes sure one reader per `ibv_context` reads at a time.
pub struct AsyncEvents {
    ctx: Arc<Context>,
    fd: RawFd,
    /// An eventfd: written by [`stop`](Self::stop), and readable until
    /// [`clear_stop`](Self::clear_stop) reads it.
    stop: OwnedFd,
}

/// What `AsyncEvents::wait` saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woken {
    /// An event may be read.
    Event,
    /// [`AsyncEvents::stop`] was called.
    Stop,
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
struct Ack {
    raw: RawAsyncEvent,
    /// Which member of `raw.element` the event fills.
    element: ElementKind,
}

impl Drop for Ack {
    fn drop(&mut self) {
        // libibverbs' ack locks the queue pair, CQ, SRQ or WQ an event
        // names: one that names a null one is not handed to it (nothing
        // could be waiting for its acknowledgement). Other kinds name
        // no object, and their ack touches none.
        let names_object = matches!(
            self.element,
            ElementKind::Qp | ElementKind::Cq | ElementKind::Srq | ElementKind::Wq
        );
        // SAFETY: the element was initialised as a null pointer and
        // libibverbs writes a pointer or an int into it; it is only
        // compared with null.
        if names_object && unsafe { self.raw.element.ptr }.is_null() {
            return;
        }
        // SAFETY: filled by a successful ibv_get_async_event and
        // acknowledged once, here.
        unsafe { ack_async_event(&mut self.raw) }
    }
}

impl AsyncEvents {
    /// The async events of `ctx`, with a stop fd of their own.
    pub fn new(ctx: &Arc<Context>) -> Result<AsyncEvents, Error> {
        // SAFETY: the context is open (we hold an Arc of it); `async_fd`
        // is set when it is opened and never changes.
        let fd = unsafe { (*ctx.as_ptr()).async_fd };
        set_nonblocking(fd)?;
        // SAFETY: eventfd takes no pointers.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return Err(last_error_or(Error::Io));
        }
        // SAFETY: a new fd, owned by nothing else.
        let stop = unsafe { OwnedFd::from_raw_fd(efd) };
        Ok(AsyncEvents {
            ctx: ctx.clone(),
            fd,
            stop,
        })
    }

    /// The context whose events these are.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Wakes `wait`, now and every time after until
    /// [`clear_stop`](Self::clear_stop).
    pub fn stop(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd. It
        // cannot fail but for a counter at its maximum, which one write
        // of 1 per stop never reaches; the fd is readable either way.
        let _ = unsafe {
            libc::write(
                self.stop.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }

    /// Takes back every [`stop`](Self::stop) so far: `wait` blocks again.
    pub fn clear_stop(&self) {
        let mut n: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our own eventfd,
        // which is non-blocking: a counter of zero fails with EAGAIN,
        // which leaves it as wanted.
        let _ = unsafe {
            libc::read(
                self.stop.as_raw_fd(),
                (&mut n as *mut u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }

    /// Blocks until the async fd is readable or [`stop`](Self::stop) is
    /// called (stop first when both). An error or hang-up on the async
    /// fd (the device gone) is `FdFault::Hangup`; a failed `poll` is
    /// its error, which the caller may retry (`FdFault::is_transient`).
    /// Crate-only, as [`read`](Self::read) and [`pause`](Self::pause):
    /// their fault type is the crate's own.
    pub(crate) fn wait(&self) -> Result<Woken, FdFault> {
        let mut fds = [
            libc::pollfd {
                fd: self.stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.fd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        loop {
            // SAFETY: two valid pollfds; both fds stay open during the
            // call (ours by `self.stop`, the context's by `self.ctx`).
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if n < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(FdFault::Os(err));
            }
            if fds[0].revents != 0 {
                return Ok(Woken::Stop);
            }
            let ev = fds[1].revents;
            if ev & libc::POLLIN != 0 {
                return Ok(Woken::Event);
            }
            if ev & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
                return Err(FdFault::Hangup(ev));
            }
        }
    }

    /// Pauses the caller up to `d` (a retry's backoff), ending early if
    /// [`stop`](Self::stop) is called: the stop fd stays readable, so the
    /// next [`wait`](Self::wait) sees it. Where even that `poll` fails
    /// (the shortage the caller backs off from), it sleeps instead.
    pub(crate) fn pause(&self, d: Duration) {
        let mut fd = libc::pollfd {
            fd: self.stop.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = libc::c_int::try_from(d.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one valid pollfd; the stop fd stays open during the
        // call (owned by `self.stop`).
        let n = unsafe { libc::poll(&mut fd, 1, ms) };
        if n < 0 {
            std::thread::sleep(d);
        }
    }

    /// Reads one event if one is pending, hands it to `route` while it is
    /// unacknowledged, then acknowledges it: `Ok(true)`. `Ok(false)` when
    /// none was pending (another reader of the context may have taken the
    /// one [`wait`](Self::wait) saw; `route` not called) or the read was
    /// interrupted: the caller reads again after the next `wait` either
    /// way, and has learnt nothing about whether the fd works. An error:
    /// the read failed (`EIO`: the device gone; the caller retries what
    /// `FdFault::is_transient` says may pass).
    pub(crate) fn read(&self, route: impl FnOnce(&AsyncEvent)) -> Result<bool, FdFault> {
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
            let err = io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(libc::EAGAIN | libc::EINTR) => Ok(false),
                // libibverbs failed without an errno (a short read):
                // nothing says it may pass.
                Some(0) | None => Err(FdFault::Os(io::Error::from_raw_os_error(libc::EIO))),
                Some(_) => Err(FdFault::Os(err)),
            };
        }
        let kind = AsyncEventKind::from_raw(raw.event_type);
        let ack = Ack {
            raw,
            element: kind.element(),
        };
        let mut ev = AsyncEvent {
            kind,
            qp_num: None,
            port: None,
        };
        match ack.element {
            ElementKind::Qp => {
                // SAFETY: a queue pair's event fills `element.qp`.
                let qp = unsafe { ack.raw.element.ptr } as *mut ibv_qp;
                if !qp.is_null() {
                    // SAFETY: the queue pair cannot be destroyed before
                    // this event is acknowledged (ibv_destroy_qp waits for
                    // it), so it is alive; `qp_num` never changes.
                    ev.qp_num = Some(unsafe { (*qp).qp_num });
                }
            }
            ElementKind::Port => {
                // SAFETY: a port's event fills `element.port_num`.
                let port = unsafe { ack.raw.element.port_num };
                ev.port = u32::try_from(port).ok();
            }
            _ => {}
        }
        route(&ev);
        drop(ack);
        Ok(true)
    }
}
