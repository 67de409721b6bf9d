//! A connection before it carries data: the TLS handshake right after the
//! TCP connect, then the Weft handshake frames, over plain TCP or inside
//! the session ([`HsStream`]).
//!
//! Each side answers a peer of the other kind in that peer's own
//! language, so both report why (`NoProtoOpt`) instead of a bare reset: a
//! TLS acceptor answers a plain Weft opening frame with its plain refusal
//! (`HelloAck`, `ConnResp` or `VerifyAck` with status `FI_ENOPROTOOPT`),
//! and a plain endpoint answers a TLS ClientHello with a TLS
//! `protocol_version` alert.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weft_core::wire::{self, FrameKind, Header, HEADER_LEN, MAX_CONTROL_LEN};
use weft_core::{Error, Result};

use super::session::ReactorRead;
use super::{tls_error, TlsContext};

/// A TLS record header: content type, legacy version, length.
const RECORD_HEADER: usize = 5;
/// The record type of a handshake message (a ClientHello opens with it).
const HANDSHAKE_RECORD: u8 = 0x16;
/// A fatal `protocol_version` alert, as a plain endpoint sends it: alert
/// record, TLS 1.2 record version, 2 bytes, fatal, protocol_version (70).
const PROTOCOL_VERSION_ALERT: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 70];
/// How long a refusing side waits for its peer to read the answer and
/// close, and how much it reads meanwhile: closing on unread bytes resets
/// the connection, and a reset can discard the answer at the peer.
const LINGER_TIME: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 64 * 1024;

/// A connection in its handshake phase.
pub enum HsStream {
    Plain(TcpStream),
    Tls(Box<TlsHs>),
}

/// A TCP stream and the TLS session over it.
pub struct TlsHs {
    tcp: TcpStream,
    conn: rustls::Connection,
}

impl std::fmt::Debug for HsStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (kind, tcp) = match self {
            HsStream::Plain(s) => ("plain", s),
            HsStream::Tls(t) => ("tls", &t.tcp),
        };
        f.debug_struct("HsStream")
            .field("kind", &kind)
            .field("peer", &tcp.peer_addr().ok())
            .finish()
    }
}

async fn within<T>(t: Duration, f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(t, f)
        .await
        .map_err(|_| Error::TimedOut)?
}

impl HsStream {
    /// The TCP stream under it.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            HsStream::Plain(s) => s,
            HsStream::Tls(t) => &t.tcp,
        }
    }

    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.tcp().local_addr()?)
    }

    /// Writes all of `b` (no deadline: callers bound it).
    pub async fn write_all(&mut self, b: &[u8]) -> Result<()> {
        match self {
            HsStream::Plain(s) => Ok(s.write_all(b).await?),
            HsStream::Tls(t) => t.write_all(b).await,
        }
    }

    /// Reads exactly `b.len()` bytes (no deadline: callers bound it).
    pub async fn read_exact(&mut self, b: &mut [u8]) -> Result<()> {
        match self {
            HsStream::Plain(s) => {
                s.read_exact(b).await?;
                Ok(())
            }
            HsStream::Tls(t) => t.read_exact(b).await,
        }
    }

    /// A plain stream that read `head` where a Weft frame was expected:
    /// if it is a TLS ClientHello, tells that peer in TLS that this end
    /// does not speak it, and says `NoProtoOpt`.
    pub async fn refuse_if_tls(&mut self, head: &[u8], t: Duration) -> Option<Error> {
        match self {
            HsStream::Plain(s) if looks_like_tls(head) => {
                refuse_tls_peer(s, t).await;
                Some(Error::NoProtoOpt)
            }
            _ => None,
        }
    }

    /// The stream and, for TLS, the session with whatever it already
    /// read past the handshake frames (a data frame that followed them).
    pub fn into_parts(self) -> (TcpStream, Option<rustls::Connection>) {
        match self {
            HsStream::Plain(s) => (s, None),
            HsStream::Tls(t) => {
                let TlsHs { tcp, conn } = *t;
                (tcp, Some(conn))
            }
        }
    }
}

/// Whether `head`, the first bytes of a stream, open a TLS handshake
/// record.
fn looks_like_tls(head: &[u8]) -> bool {
    head.len() >= 2 && head[0] == HANDSHAKE_RECORD && head[1] == 0x03
}

/// Sends a plain endpoint's answer to a TLS ClientHello (a fatal
/// `protocol_version` alert) and closes its side.
async fn refuse_tls_peer(s: &mut TcpStream, t: Duration) {
    let _ = within(t, async { Ok(s.write_all(&PROTOCOL_VERSION_ALERT).await?) }).await;
    linger(s, t).await;
}

/// Shuts our side and reads what the peer still sends until it closes
/// (bounded in time and bytes), so the answer just written is not lost
/// to a reset.
async fn linger(s: &mut TcpStream, t: Duration) {
    let _ = s.shutdown().await;
    let drain = async {
        let mut b = [0u8; 4096];
        let mut left = LINGER_BYTES;
        while left > 0 {
            match s.read(&mut b).await {
                Ok(0) | Err(_) => return,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(t.min(LINGER_TIME), drain).await;
}

/// Each side of a TLS handshake writes a flight as several records and
/// waits for the other's: with Nagle on, a flight's last small segment
/// waits for the delayed ACK of its first (about 40 ms on Linux), twice
/// per set-up (measured on loopback: 88 ms per connection set-up, 0.9 ms
/// with Nagle off; `docs/benchmarks.md`).
fn no_delay(tcp: &TcpStream) -> Result<()> {
    tcp.set_nodelay(true)?;
    Ok(())
}

/// Connector: the TLS handshake with the endpoint at `dest`, within `t`.
pub async fn connect(
    tcp: TcpStream,
    ctx: &TlsContext,
    dest: SocketAddr,
    t: Duration,
) -> Result<HsStream> {
    no_delay(&tcp)?;
    let name = rustls::pki_types::ServerName::IpAddress(dest.ip().into());
    let conn =
        rustls::ClientConnection::new(ctx.client.clone(), name).map_err(|e| tls_error(&e))?;
    let mut hs = TlsHs {
        tcp,
        conn: conn.into(),
    };
    within(t, hs.handshake()).await?;
    Ok(HsStream::Tls(Box::new(hs)))
}

/// Acceptor: the TLS handshake with whoever connected, within `t`. A
/// plain Weft peer is told so in its own frames, and anything that does
/// not open with a TLS handshake record is closed; both are `NoProtoOpt`.
pub async fn accept(mut tcp: TcpStream, ctx: &TlsContext, t: Duration) -> Result<HsStream> {
    no_delay(&tcp)?;
    let mut head = [0u8; RECORD_HEADER];
    within(t, async {
        tcp.read_exact(&mut head).await?;
        Ok(())
    })
    .await?;
    if head[..2] == wire::MAGIC.to_le_bytes() {
        refuse_plain_peer(&mut tcp, &head, t).await;
        return Err(Error::NoProtoOpt);
    }
    if !looks_like_tls(&head) {
        linger(&mut tcp, t).await;
        return Err(Error::NoProtoOpt);
    }
    let mut conn = rustls::ServerConnection::new(ctx.server.clone()).map_err(|e| tls_error(&e))?;
    // The record header already read goes in first; the handshake reads
    // the rest from the socket.
    conn.read_tls(&mut &head[..])?;
    let mut hs = TlsHs {
        tcp,
        conn: conn.into(),
    };
    within(t, hs.handshake()).await?;
    Ok(HsStream::Tls(Box::new(hs)))
}

/// Answers a plain Weft opening frame whose first bytes are `head` with
/// the refusal its kind expects, status `FI_ENOPROTOOPT`.
async fn refuse_plain_peer(tcp: &mut TcpStream, head: &[u8; RECORD_HEADER], t: Duration) {
    let mut b = [0u8; HEADER_LEN];
    b[..RECORD_HEADER].copy_from_slice(head);
    let answer = within(t, async {
        tcp.read_exact(&mut b[RECORD_HEADER..]).await?;
        let h = wire::decode(&b, MAX_CONTROL_LEN)?;
        let kind = match h.kind {
            Some(FrameKind::Hello | FrameKind::KeyedHello) => FrameKind::HelloAck,
            Some(FrameKind::ConnReq | FrameKind::KeyedConnReq) => FrameKind::ConnResp,
            Some(FrameKind::Verify) => FrameKind::VerifyAck,
            _ => return Ok(()),
        };
        let mut no = Header::new(kind);
        no.data = Error::NoProtoOpt.code() as u64;
        tcp.write_all(&no.encode()).await?;
        Ok(())
    })
    .await;
    if let Err(e) = answer {
        tracing::debug!(error = %e, "plain peer's opening frame unreadable");
    }
    linger(tcp, t).await;
}

/// Writes to the socket without blocking (`WouldBlock` when full).
struct ReactorWrite<'a>(&'a TcpStream);

impl io::Write for ReactorWrite<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.try_write(b)
    }

    fn write_vectored(&mut self, b: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.0.try_write_vectored(b)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl TlsHs {
    async fn handshake(&mut self) -> Result<()> {
        loop {
            self.flush().await?;
            if !self.conn.is_handshaking() {
                return Ok(());
            }
            self.fill().await?;
        }
    }

    /// Reads what the socket has into the session and processes it.
    async fn fill(&mut self) -> Result<()> {
        loop {
            match self.conn.read_tls(&mut ReactorRead(&self.tcp)) {
                // The peer closed in the middle of the handshake or a frame.
                Ok(0) => return Err(Error::ConnReset),
                Ok(_) => break,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.tcp.readable().await?,
                Err(e) => return Err(Error::from(e)),
            }
        }
        if let Err(e) = self.conn.process_new_packets() {
            tracing::debug!(error = %e, "TLS session failed");
            // The alert rustls queued tells the peer why.
            let _ = self.flush().await;
            return Err(tls_error(&e));
        }
        Ok(())
    }

    /// Sends every record the session has sealed.
    async fn flush(&mut self) -> Result<()> {
        while self.conn.wants_write() {
            match self.conn.write_tls(&mut ReactorWrite(&self.tcp)) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.tcp.writable().await?,
                Err(e) => return Err(Error::from(e)),
            }
        }
        Ok(())
    }

    async fn write_all(&mut self, mut b: &[u8]) -> Result<()> {
        use std::io::Write;
        while !b.is_empty() {
            let n = self.conn.writer().write(b)?;
            b = &b[n..];
            self.flush().await?;
        }
        Ok(())
    }

    async fn read_exact(&mut self, b: &mut [u8]) -> Result<()> {
        use std::io::Read;
        let mut n = 0;
        while n < b.len() {
            match self.conn.reader().read(&mut b[n..]) {
                // Closed (cleanly or not) before the frame was whole.
                Ok(0) => return Err(Error::ConnReset),
                Ok(k) => {
                    n += k;
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return Err(Error::ConnReset),
            }
            self.fill().await?;
            // A key update's answer, if the peer asked for one.
            self.flush().await?;
        }
        Ok(())
    }
}
