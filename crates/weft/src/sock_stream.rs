//! `FI_EP_SOCK_STREAM` endpoints as Tokio I/O: once connected (`connect`
//! or `accept`, with CM data and keys as on MSG endpoints), the endpoint
//! hands out its connection as a [`SockStream`], which is `AsyncRead` +
//! `AsyncWrite` and so carries anything that speaks them (HTTP/2, gRPC,
//! codecs from `tokio-util`).

use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use weft_core::provider::ByteStream;
use weft_core::Result;

use crate::Endpoint;

/// The connection of an `FI_EP_SOCK_STREAM` endpoint: a reliable,
/// ordered byte stream without message boundaries. Reading 0 bytes is
/// the peer's end of writing; writing after [`shutdown`] is an error.
/// Dropping it closes the connection.
///
/// [`shutdown`]: tokio::io::AsyncWriteExt::shutdown
#[derive(Debug)]
pub struct SockStream {
    inner: Box<dyn ByteStream>,
}

impl Endpoint {
    /// `FI_EP_SOCK_STREAM`: takes the connected stream (once: `OpBadState`
    /// after). `NotConn` before `connect`/`accept` has finished, `NoSys`
    /// on other endpoint types.
    pub fn stream(&self) -> Result<SockStream> {
        let inner = self.live()?.prov.take_byte_stream()?;
        Ok(SockStream { inner })
    }
}

impl AsyncRead for SockStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        match this.inner.poll_read(cx, buf.initialize_unfilled()) {
            Poll::Ready(Ok(n)) => {
                buf.advance(n);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncWrite for SockStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.get_mut().inner.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.get_mut().inner.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.get_mut().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.get_mut().inner.poll_shutdown(cx)
    }
}
