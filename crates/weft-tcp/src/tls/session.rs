//! An established connection's TLS session: what `Conn` reads and writes
//! through instead of the socket when the endpoint runs TLS.
//!
//! One session holds both directions (rustls has no split halves), so a
//! mutex guards it: the receive side (the reactor's reader, the
//! busy-poll thread or an inline waiter) and the transmit side (the
//! posting thread or the writer task) each take it for one read or one
//! frame. Records leave in the order they were sealed whoever writes
//! them, so records the receive side produces (the answer to a peer's key
//! update, an alert) may be written by either side.

use std::io::{self, IoSlice, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use weft_core::sync::lock;
use weft_core::{Error, Result};

use super::tls_error;
use crate::frame::TxFrame;

/// Reads the socket through the reactor's handle: `WouldBlock` clears
/// its readiness, as `try_read` does.
pub struct ReactorRead<'a>(pub &'a tokio::net::TcpStream);

impl Read for ReactorRead<'_> {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(b)
    }
}

/// Ciphertext read from the socket at once: rustls takes records at most
/// 4 KiB per `read_tls`, and reading the socket that finely costs a
/// system call per 4 KiB of a large message.
const CIPHER_BUF: usize = 64 * 1024;

/// The TLS state of one established connection.
pub struct Session {
    inner: Mutex<Inner>,
    /// The receive side sealed records the socket did not take: the
    /// connection's writer must send them.
    out_pending: AtomicBool,
}

struct Inner {
    conn: rustls::Connection,
    /// Ciphertext read but not yet given to rustls (`start..end`);
    /// allocated by the first read, given back when the connection is
    /// quiet (`shrink`).
    cipher: Vec<u8>,
    start: usize,
    end: usize,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").finish_non_exhaustive()
    }
}

impl Session {
    pub fn new(conn: rustls::Connection) -> Session {
        Session {
            inner: Mutex::new(Inner {
                conn,
                cipher: Vec::new(),
                start: 0,
                end: 0,
            }),
            out_pending: AtomicBool::new(false),
        }
    }

    /// Plaintext into `buf`, reading records from `sock` as needed: as
    /// much as is there, so a short read means the socket was empty (what
    /// the receive state machine relies on). `Ok(0)` at the stream's end;
    /// whether that end was clean is for the frame layer to say (a frame
    /// cut short is `ConnReset` there), as on plain TCP. Records the
    /// session produces meanwhile go out on `out` when it takes them.
    pub fn read(
        &self,
        buf: &mut [u8],
        sock: &mut dyn Read,
        out: &std::net::TcpStream,
    ) -> io::Result<usize> {
        let mut g = lock(&self.inner);
        let Inner {
            conn: c,
            cipher,
            start,
            end,
        } = &mut *g;
        let mut n = 0;
        loop {
            match c.reader().read(&mut buf[n..]) {
                // `close_notify`: nothing more will come.
                Ok(0) => return Ok(n),
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(n),
                Err(e) => return Err(e),
            }
            if n == buf.len() {
                return Ok(n);
            }
            if *start == *end {
                if cipher.is_empty() {
                    cipher.resize(CIPHER_BUF, 0);
                }
                match sock.read(cipher) {
                    Ok(0) => {
                        // The end: rustls is told, and says whether it
                        // came cleanly on the next turn.
                        c.read_tls(&mut io::empty())?;
                        continue;
                    }
                    Ok(k) => (*start, *end) = (0, k),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock && n > 0 => return Ok(n),
                    Err(e) => return Err(e),
                }
            }
            let mut rd = &cipher[*start..*end];
            *start += c.read_tls(&mut rd)?;
            let r = c.process_new_packets();
            if c.wants_write() {
                self.send_pending(c, out);
            }
            if let Err(e) = r {
                tracing::debug!(error = %e, "TLS record refused; closing");
                return Err(io::Error::from_raw_os_error(tls_error(&e).code()));
            }
        }
    }

    /// Gives the ciphertext buffer back if it holds nothing (a quiet
    /// connection); the next read allocates it again.
    pub fn shrink(&self) {
        let mut g = lock(&self.inner);
        if g.start == g.end {
            g.cipher = Vec::new();
            (g.start, g.end) = (0, 0);
        }
    }

    /// Whether the receive side left records for the writer (and clears
    /// the word).
    pub fn take_out_pending(&self) -> bool {
        self.out_pending.load(Ordering::Relaxed) && self.out_pending.swap(false, Ordering::AcqRel)
    }

    fn send_pending(&self, c: &mut rustls::Connection, out: &std::net::TcpStream) {
        let mut w = out;
        while c.wants_write() {
            if c.write_tls(&mut w).is_err() {
                self.out_pending.store(true, Ordering::Release);
                return;
            }
        }
    }

    /// Seals and writes as much of `f` as the socket takes. `Ok(true)`
    /// once the whole frame is sealed and every sealed record is out (so
    /// a completion never waits on bytes still in the session),
    /// `Ok(false)` when the socket is full. `f.written` counts plaintext.
    pub fn write_frame(&self, sock: &std::net::TcpStream, f: &mut TxFrame) -> Result<bool> {
        let total = f.total_len();
        let mut g = lock(&self.inner);
        let c = &mut g.conn;
        loop {
            if !drain_into(c, sock)? {
                return Ok(false);
            }
            if f.written == total {
                return Ok(true);
            }
            let mut iov = [IoSlice::new(&[]); crate::conn::MAX_IOV];
            let k = f.slices(&mut iov);
            let n = io::Write::write_vectored(&mut c.writer(), &iov[..k])?;
            if n == 0 {
                // The session took nothing with its buffer just emptied:
                // it is closed for writing.
                return Err(Error::ConnReset);
            }
            f.written += n;
        }
    }

    /// Writes records already sealed. `Ok(true)` when none are left.
    pub fn drain(&self, sock: &std::net::TcpStream) -> Result<bool> {
        drain_into(&mut lock(&self.inner).conn, sock)
    }
}

fn drain_into(c: &mut rustls::Connection, sock: &std::net::TcpStream) -> Result<bool> {
    let mut w = sock;
    while c.wants_write() {
        match c.write_tls(&mut w) {
            Ok(0) => return Err(Error::ConnReset),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::from(e)),
        }
    }
    Ok(true)
}
