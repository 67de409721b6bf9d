//! `FI_EP_SOCK_DGRAM` endpoints as a `Stream` and a `Sink` of datagrams:
//! UDP payloads exactly as a socket sends them (no Weft header), so plain
//! UDP sockets are peers. Addresses go through the endpoint's AV as on
//! any connectionless endpoint; a sender outside the AV arrives with
//! `FI_ADDR_NOTAVAIL` as its source.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use futures::{FutureExt, Sink, Stream};
use weft_core::addr::FiAddr;
use weft_core::attr::EpType;
use weft_core::completion::{CqEntry, CqErrEntry};
use weft_core::{Error, Result};

use crate::Endpoint;

/// One datagram received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    /// Its payload.
    pub data: BytesMut,
    /// Its sender's AV handle (`FI_ADDR_NOTAVAIL` for a sender not in the
    /// AV).
    pub src: FiAddr,
}

type Op = BoxFuture<'static, std::result::Result<CqEntry, CqErrEntry>>;

/// The datagrams of an `FI_EP_SOCK_DGRAM` endpoint: a `Stream` of the
/// ones that arrive (each read into a buffer of the largest size the
/// endpoint carries; a longer one is `Trunc`) and a `Sink` of
/// `(destination, payload)` pairs. Dropping it withdraws a pending
/// receive without losing the datagram it may have taken (the next read
/// gets it).
pub struct SockDgram {
    ep: Endpoint,
    max: usize,
    recv: Option<Op>,
    send: Option<Op>,
}

impl std::fmt::Debug for SockDgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SockDgram")
            .field("max", &self.max)
            .field("receiving", &self.recv.is_some())
            .field("sending", &self.send.is_some())
            .finish()
    }
}

impl Endpoint {
    /// `FI_EP_SOCK_DGRAM`: the endpoint's datagrams as a `Stream` and a
    /// `Sink` (see [`SockDgram`]). `NoSys` on other endpoint types.
    pub fn datagrams(&self) -> Result<SockDgram> {
        let info = self.info();
        if info.ep_attr.ep_type != EpType::SockDgram {
            return Err(Error::NoSys);
        }
        self.live()?;
        Ok(SockDgram {
            ep: self.clone(),
            max: info.ep_attr.max_msg_size.max(1),
            recv: None,
            send: None,
        })
    }
}

impl Stream for SockDgram {
    type Item = Result<Datagram>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let (ep, max) = (this.ep.clone(), this.max);
        let op = this
            .recv
            .get_or_insert_with(|| async move { ep.recv(BytesMut::zeroed(max)).await }.boxed());
        let done = match op.as_mut().poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(r) => r,
        };
        this.recv = None;
        Poll::Ready(Some(match done {
            Ok(e) => {
                let src = e.src;
                Ok(Datagram {
                    data: e.into_bytes(),
                    src,
                })
            }
            Err(e) => Err(e.err),
        }))
    }
}

impl SockDgram {
    fn poll_sent(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let Some(op) = self.send.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let done = match op.as_mut().poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(r) => r,
        };
        self.send = None;
        Poll::Ready(done.map(|_| ()).map_err(|e| e.err))
    }
}

impl Sink<(FiAddr, Bytes)> for SockDgram {
    type Error = Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.get_mut().poll_sent(cx)
    }

    fn start_send(self: Pin<&mut Self>, (dest, data): (FiAddr, Bytes)) -> Result<()> {
        let this = self.get_mut();
        if this.send.is_some() {
            // `poll_ready` was not awaited first.
            return Err(Error::Again);
        }
        let ep = this.ep.clone();
        this.send = Some(async move { ep.send(dest, data).await }.boxed());
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.get_mut().poll_sent(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.get_mut().poll_sent(cx)
    }
}
