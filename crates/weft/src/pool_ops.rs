//! Endpoint operations on pool buffers: sends and RMA writes from them
//! (frozen: back in the pool when the operation ends), receives and RMA
//! reads into them (lent: back in the caller's hands with what arrived,
//! or in the pool if the future is dropped).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BytesMut;
use weft_core::addr::{FiAddr, FI_ADDR_UNSPEC};
use weft_core::completion::{CqEntry, CqErrEntry};
use weft_core::flags::OpFlags;
use weft_core::provider::RmaOp;
use weft_core::Error;

use crate::endpoint::Endpoint;
use crate::msg::RecvMsg;
use crate::opfuture::{wait_for_room, OpFuture};
use crate::pool::{Lent, PoolBuf};
use crate::rma::rma;

/// A receive or RMA read into a pool buffer that completed: the buffer,
/// cut to the bytes that arrived, and the completion (whose `bufs` are
/// empty: the bytes are in `buf`).
#[derive(Debug)]
pub struct Received {
    /// The filled buffer.
    pub buf: PoolBuf,
    /// The completion entry.
    pub entry: CqEntry,
}

type OpResult<T> = std::result::Result<T, CqErrEntry>;

impl Endpoint {
    /// `Inval` for a buffer of another domain's pool: its descriptor means
    /// nothing here (fi_mr(3)).
    fn own_pool(&self, buf: &PoolBuf, kind: OpFlags) -> OpResult<()> {
        if self.owns_pool_buf(buf) {
            Ok(())
        } else {
            Err(CqErrEntry::new(0, kind, Error::Inval))
        }
    }

    /// Sends a pool buffer (its whole length); it goes back to its pool
    /// when the send ends. `Inval` for a buffer of another domain's pool.
    pub async fn send_pooled(&self, dest: FiAddr, buf: PoolBuf) -> OpResult<CqEntry> {
        self.own_pool(&buf, OpFlags::SEND)?;
        self.send(dest, buf.freeze()).await
    }

    /// Tagged [`send_pooled`](Self::send_pooled).
    pub async fn tsend_pooled(&self, dest: FiAddr, buf: PoolBuf, tag: u64) -> OpResult<CqEntry> {
        self.own_pool(&buf, OpFlags::SEND)?;
        self.tsend(dest, buf.freeze(), tag).await
    }

    /// RMA-writes a pool buffer to `addr` of the peer's region `key`; the
    /// buffer goes back to its pool when the write ends. `Inval` for a
    /// buffer of another domain's pool.
    pub async fn write_pooled(
        &self,
        dest: FiAddr,
        buf: PoolBuf,
        addr: u64,
        key: u64,
    ) -> OpResult<CqEntry> {
        self.own_pool(&buf, OpFlags::RMA | OpFlags::WRITE)?;
        self.write(dest, buf.freeze(), addr, key).await
    }

    /// Receives one message into a pool buffer (up to its length). On
    /// success the buffer comes back with the message; on failure it
    /// goes back to its pool. Dropping the future withdraws the receive
    /// (a message that already reached it goes to the next receive, as
    /// a copy) and returns the buffer to its pool once the device is
    /// done with it. `Inval` for a buffer of another domain's pool;
    /// `OpNotSupp` on an endpoint bound to a shared receive context.
    pub async fn recv_pooled(&self, buf: PoolBuf) -> OpResult<Received> {
        self.recv_lent(buf, FI_ADDR_UNSPEC, None).await
    }

    /// Tagged [`recv_pooled`](Self::recv_pooled): a message from `src`
    /// (`FI_ADDR_UNSPEC`: any) matching `tag` outside `ignore`.
    pub async fn trecv_pooled(
        &self,
        buf: PoolBuf,
        src: FiAddr,
        tag: u64,
        ignore: u64,
    ) -> OpResult<Received> {
        self.recv_lent(buf, src, Some((tag, ignore))).await
    }

    async fn recv_lent(
        &self,
        buf: PoolBuf,
        src: FiAddr,
        tag: Option<(u64, u64)>,
    ) -> OpResult<Received> {
        self.own_pool(&buf, OpFlags::RECV)?;
        let post = |view: BytesMut| {
            let msg = RecvMsg {
                src,
                bufs: vec![view],
                tagged: tag.is_some(),
                tag: tag.map_or(0, |t| t.0),
                ignore: tag.map_or(0, |t| t.1),
                context: 0,
            };
            self.recv_once(msg, OpFlags::empty())
        };
        self.lent_op(buf, OpFlags::RECV, post).await
    }

    /// RMA-reads `buf.len()` bytes from `addr` of the peer's region `key`
    /// into a pool buffer; as [`recv_pooled`](Self::recv_pooled) for what
    /// comes back and what dropping the future does (an RMA read cannot
    /// be withdrawn: the buffer returns when it ends).
    pub async fn read_pooled(
        &self,
        dest: FiAddr,
        buf: PoolBuf,
        addr: u64,
        key: u64,
    ) -> OpResult<Received> {
        let kind = OpFlags::RMA | OpFlags::READ;
        self.own_pool(&buf, kind)?;
        let post = |view: BytesMut| {
            let op = RmaOp::Read { bufs: vec![view] };
            self.rma_once(rma(dest, op, addr, key, 0), OpFlags::empty())
                .map_err(|(e, op)| match op {
                    RmaOp::Read { bufs } => (e, bufs),
                    _ => (e, Vec::new()),
                })
        };
        self.lent_op(buf, kind, post).await
    }

    /// Lends `buf` to the operation `post` makes of it, waiting out a full
    /// queue with the buffer back in hand, and awaits the operation.
    async fn lent_op(
        &self,
        buf: PoolBuf,
        kind: OpFlags,
        post: impl Fn(BytesMut) -> std::result::Result<OpFuture, (Error, Vec<BytesMut>)>,
    ) -> OpResult<Received> {
        let mut buf = buf;
        let mut spins = 0;
        let (fut, lent) = loop {
            let (view, lent) = buf.lend();
            match post(view) {
                Ok(fut) => break (fut, lent),
                Err((err, bufs)) => {
                    let back = lent.restore(bufs);
                    match back {
                        Some(b) if err == Error::Again => buf = b,
                        _ => return Err(CqErrEntry::new(0, kind, err)),
                    }
                    wait_for_room(&mut spins).await;
                }
            }
        };
        let rt = self.domain_rt();
        LentOp {
            fut: Some(fut),
            lent: Some(lent),
            rt,
        }
        .await
    }
}

/// The future of an operation on a lent pool buffer: resolves with the
/// buffer; dropped early, it leaves a task that waits for the operation
/// to end and returns the buffer to its pool.
struct LentOp {
    fut: Option<OpFuture>,
    lent: Option<Lent>,
    rt: tokio::runtime::Handle,
}

impl Future for LentOp {
    type Output = OpResult<Received>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(fut) = self.fut.as_mut() else {
            return Poll::Ready(Err(CqErrEntry::new(0, OpFlags::empty(), Error::Canceled)));
        };
        let done = match Pin::new(fut).poll(cx) {
            Poll::Ready(d) => d,
            Poll::Pending => return Poll::Pending,
        };
        self.fut = None;
        let lent = self.lent.take();
        Poll::Ready(match done {
            Ok(mut entry) => {
                let bufs = std::mem::take(&mut entry.bufs);
                match lent.and_then(|l| l.restore(bufs)) {
                    Some(buf) => Ok(Received { buf, entry }),
                    None => Err(CqErrEntry::new(entry.context, entry.flags, Error::Io)),
                }
            }
            Err(mut e) => {
                // The buffer goes back to its pool.
                drop(lent.map(|l| l.restore(std::mem::take(&mut e.bufs))));
                Err(e)
            }
        })
    }
}

impl Drop for LentOp {
    fn drop(&mut self) {
        let (Some(fut), Some(lent)) = (self.fut.take(), self.lent.take()) else {
            return;
        };
        // The device may still write the buffer: it comes back only when
        // the operation has ended.
        self.rt.spawn(async move {
            let bufs = fut.reclaim().await;
            drop(lent.restore(bufs));
        });
    }
}
