//! `FI_EP_SOCK_STREAM`: a connection set up exactly as an MSG endpoint's
//! (passive endpoint, `ConnReq`/`ConnResp` with CM data, keys), after
//! which the socket carries the application's bytes as they are — no
//! frames, no message boundaries. The endpoint hands the socket out once
//! as a [`ByteStream`]; `weft` makes it Tokio's `AsyncRead`/`AsyncWrite`.

use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use weft_core::provider::ByteStream;
use weft_core::sync::lock;
use weft_core::{Error, Result};

use crate::tls::HsStream;

/// Where a socket-style endpoint's connection is.
#[derive(Debug, Default)]
enum State {
    #[default]
    Unconnected,
    Connected(TcpStream),
    /// Handed to the application.
    Taken,
}

/// The connection of one `FI_EP_SOCK_STREAM` endpoint.
#[derive(Debug, Default)]
pub struct SockSlot(Mutex<State>);

impl SockSlot {
    /// Whether a connection was made (taken or not).
    pub fn is_connected(&self) -> bool {
        !matches!(*lock(&self.0), State::Unconnected)
    }

    /// The handshake is done: from here on the socket is the stream.
    /// TLS never gets here (socket-style endpoints refuse it when they
    /// open).
    pub fn connected(&self, s: HsStream) -> Result<()> {
        let HsStream::Plain(s) = s else {
            return Err(Error::NoSys);
        };
        s.set_nodelay(true)?;
        crate::conn::congestion::choose(&s, s.peer_addr()?);
        let mut g = lock(&self.0);
        if !matches!(*g, State::Unconnected) {
            return Err(Error::IsConn);
        }
        *g = State::Connected(s);
        Ok(())
    }

    /// The stream, once.
    pub fn take(&self) -> Result<Box<dyn ByteStream>> {
        let mut g = lock(&self.0);
        match std::mem::take(&mut *g) {
            State::Connected(s) => {
                *g = State::Taken;
                Ok(Box::new(TcpByteStream(s)))
            }
            State::Unconnected => Err(Error::NotConn),
            State::Taken => {
                *g = State::Taken;
                Err(Error::OpBadState)
            }
        }
    }
}

/// A connected socket as a [`ByteStream`].
#[derive(Debug)]
struct TcpByteStream(TcpStream);

impl ByteStream for TcpByteStream {
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<std::io::Result<usize>> {
        let mut rb = ReadBuf::new(buf);
        match Pin::new(&mut self.0).poll_read(cx, &mut rb) {
            Poll::Ready(Ok(())) => Poll::Ready(Ok(rb.filled().len())),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
