//! Doorbells: a FIFO per endpoint in `/dev/shm`, read by its owner (in the
//! Tokio reactor, interrupt mode) and written by peers only when the owner
//! said it sleeps, or when a sender waits for room. A FIFO rather than an
//! eventfd because a peer must open it by name: another process's eventfd
//! can only be had through `pidfd_getfd` (ptrace rights, which Yama
//! commonly denies) or a socket passing it, a second transport to set up
//! and to guard. One byte is a wake-up; a full FIFO is one already rung.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

use rustix::fs::{FileType, Mode, OFlags, CWD};
use weft_core::{Error, Result};

use crate::name::bell_path;

fn nonblock() -> i32 {
    OFlags::NONBLOCK.bits() as i32
}

/// Creates `name`'s doorbell (replacing a stale one: the caller owns the
/// name, its segment was created exclusively) and opens it for reading.
/// Opened read-write, so it never reports end-of-file when no writer has
/// it open.
pub fn create(name: &str) -> Result<File> {
    let path = bell_path(name);
    let _ = std::fs::remove_file(&path);
    rustix::fs::mknodat(
        CWD,
        path.as_str(),
        FileType::Fifo,
        Mode::RUSR | Mode::WUSR,
        0,
    )
    .map_err(|e| Error::from(std::io::Error::from(e)))?;
    Ok(OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(nonblock())
        .open(&path)?)
}

/// Opens peer `name`'s doorbell for ringing; `None` if it cannot be (the
/// peer is gone: its liveness check says so in time), or if what is
/// under the name is not a FIFO: a link is not followed, and a regular
/// file is nobody's doorbell (ringing would write into it).
pub fn open_remote(name: &str) -> Option<File> {
    use std::os::unix::fs::FileTypeExt;
    let f = OpenOptions::new()
        .write(true)
        .custom_flags(nonblock() | OFlags::NOFOLLOW.bits() as i32)
        .open(bell_path(name))
        .ok()?;
    f.metadata().ok()?.file_type().is_fifo().then_some(f)
}

/// Rings: one byte. A full FIFO (`EAGAIN`) has a wake-up pending already.
pub fn ring(mut f: &File) {
    let _ = f.write(&[1]);
}

/// The owner's doorbell `bell` ([`create`]'s) for its reactor
/// (interrupt and inline modes): another descriptor of the same open
/// FIFO, registered for readability. Not a Tokio pipe: the driver
/// clears its readiness itself after a short read (`driver::drain`),
/// which saves the failing `read` a wake-up would otherwise end with.
pub fn register(bell: &File) -> Result<tokio::io::unix::AsyncFd<File>> {
    let f = bell.try_clone()?;
    // SAFETY: `File` owns its descriptor: it stays open and the same
    // file description, and `as_raw_fd` returns it, until the `AsyncFd`
    // holding the `File` drops it.
    #[allow(unsafe_code)]
    let fd = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(f, tokio::io::Interest::READABLE)
    };
    fd.map_err(|e| Error::from(std::io::Error::from(e)))
}
