//! Posted operations on pool buffers (`fi_send`/`fi_recv` with the
//! pool's descriptor): non-blocking, reporting to the bound CQ with the
//! caller's context, as [`Endpoint::post_send`] and
//! [`Endpoint::post_recv`]. A send's buffer goes back to its pool when
//! the send ends; a receive's comes back to the caller in its
//! completion's `bufs`, for [`BufferPool::reclaim`](crate::BufferPool::reclaim).
//! The buffers go to the device as they are: registered memory on verbs
//! (no bounce copy), plain memory elsewhere.

use bytes::{Bytes, BytesMut};
use weft_core::addr::{FiAddr, FI_ADDR_UNSPEC};
use weft_core::flags::OpFlags;
use weft_core::Error;

use crate::endpoint::Endpoint;
use crate::msg::RecvMsg;
use crate::pool::PoolBuf;

/// A send that was not posted: why, and the buffer, frozen (post it
/// again with [`Endpoint::post_send`]; dropped, it goes back to its
/// pool).
pub type SendRefused = (Error, Bytes);

/// A receive that was not posted: why, and the buffer back (`None` only
/// if the provider failed to hand it back; the pool then counts it as
/// lost).
pub type RecvRefused = (Error, Option<PoolBuf>);

impl Endpoint {
    /// Whether `buf` belongs to a pool of this endpoint's domain: its
    /// descriptor means nothing elsewhere (fi_mr(3)).
    pub(crate) fn owns_pool_buf(&self, buf: &PoolBuf) -> bool {
        buf.domain_fid() == self.domain_fid()
    }

    /// `fi_send` of a pool buffer (its whole length); the completion goes
    /// to the transmit CQ with `context`, and the buffer back to its
    /// pool when the send ends. `Inval` for a buffer of another domain's
    /// pool, `Again` when the queue is full; then the buffer comes back
    /// frozen, to post again.
    pub fn post_send_pooled(
        &self,
        dest: FiAddr,
        buf: PoolBuf,
        context: u64,
    ) -> std::result::Result<(), SendRefused> {
        self.post_pooled_send(dest, buf, None, context)
    }

    /// Tagged [`post_send_pooled`](Self::post_send_pooled) (`fi_tsend`).
    pub fn post_tsend_pooled(
        &self,
        dest: FiAddr,
        buf: PoolBuf,
        tag: u64,
        context: u64,
    ) -> std::result::Result<(), SendRefused> {
        self.post_pooled_send(dest, buf, Some(tag), context)
    }

    fn post_pooled_send(
        &self,
        dest: FiAddr,
        buf: PoolBuf,
        tag: Option<u64>,
        context: u64,
    ) -> std::result::Result<(), SendRefused> {
        if !self.owns_pool_buf(&buf) {
            return Err((Error::Inval, buf.freeze()));
        }
        match buf.into_send() {
            Some(send) => self.post_pool_send(dest, send, tag, context),
            // Only a buffer already lent has no pool: never one of the
            // caller's.
            None => Err((Error::Inval, Bytes::new())),
        }
    }

    /// `fi_recv` into a pool buffer (up to its length); the completion
    /// goes to the receive CQ with `context` and carries the buffer, cut
    /// to the message, in its `bufs` — a `Canceled` error entry too
    /// ([`cancel`](Self::cancel)), except on verbs MSG, where the device
    /// may keep a posted receive's buffer (the next message to land in it
    /// may bring it back inside another receive's completion, or it stays
    /// lent). Take it back
    /// with [`BufferPool::reclaim`](crate::BufferPool::reclaim); until
    /// then the pool counts it as lent ([`BufferPool`](crate::BufferPool)
    /// says when a buffer stays lent for good: a completion dropped
    /// unreclaimed, `fi_close`). Always reported, selective completion or
    /// not. Refused, the buffer coming back: `Inval` for a buffer of
    /// another domain's pool, `Again` when the queue is full, `NoCq`
    /// without a receive CQ, `BadFlags` when the endpoint's default
    /// receive flags hold `FI_MULTI_RECV`, `FI_PEEK`, `FI_CLAIM` or
    /// `FI_DISCARD`, `OpNotSupp` on an endpoint
    /// bound to a shared receive context.
    pub fn post_recv_pooled(
        &self,
        buf: PoolBuf,
        context: u64,
    ) -> std::result::Result<(), RecvRefused> {
        self.post_pooled_recv(buf, |bufs| RecvMsg {
            src: FI_ADDR_UNSPEC,
            bufs,
            tagged: false,
            tag: 0,
            ignore: 0,
            context,
        })
    }

    /// Tagged [`post_recv_pooled`](Self::post_recv_pooled) (`fi_trecv`):
    /// a message from `src` (`FI_ADDR_UNSPEC`: any) matching `tag`
    /// outside `ignore`.
    pub fn post_trecv_pooled(
        &self,
        buf: PoolBuf,
        src: FiAddr,
        tag: u64,
        ignore: u64,
        context: u64,
    ) -> std::result::Result<(), RecvRefused> {
        self.post_pooled_recv(buf, |bufs| RecvMsg {
            src,
            bufs,
            tagged: true,
            tag,
            ignore,
            context,
        })
    }

    /// A posted pool receive needs a completion to carry its buffer
    /// back, as one message: `NoCq` without a receive CQ (a counter alone
    /// would count the message and keep the buffer lent), `BadFlags`
    /// when the endpoint's default receive flags make it a multi-receive
    /// (its messages would be parts of the buffer, none reclaimable) or a
    /// peek, claim or discard (whose error entries carry no buffer), and
    /// `OpNotSupp` on an endpoint bound to a shared receive context, as
    /// for the awaited [`recv_pooled`](Self::recv_pooled).
    fn pool_recv_allowed(&self) -> weft_core::Result<()> {
        let live = self.live()?;
        if live.srx.is_some() {
            return Err(Error::OpNotSupp);
        }
        if live.rx_cq.is_none() {
            return Err(Error::NoCq);
        }
        let refused = OpFlags::MULTI_RECV | OpFlags::PEEK_FAMILY;
        if live.rx_flags(OpFlags::empty()).intersects(refused) {
            return Err(Error::BadFlags);
        }
        Ok(())
    }

    fn post_pooled_recv(
        &self,
        buf: PoolBuf,
        msg: impl FnOnce(Vec<BytesMut>) -> RecvMsg,
    ) -> std::result::Result<(), RecvRefused> {
        if !self.owns_pool_buf(&buf) {
            return Err((Error::Inval, Some(buf)));
        }
        if let Err(e) = self.pool_recv_allowed() {
            return Err((e, Some(buf)));
        }
        let Some((view, pool)) = buf.lend_posted() else {
            // Only a buffer already lent has no pool: never one of the
            // caller's.
            return Err((Error::Inval, None));
        };
        // Reported whatever the queue's selectivity: the completion is
        // the only way the buffer comes back.
        match self.post_recvmsg(msg(view), OpFlags::COMPLETION) {
            Ok(()) => Ok(()),
            Err((e, mut bufs)) => {
                let back = pool.reclaim(&mut bufs);
                if back.is_none() {
                    pool.lose_lent();
                }
                Err((e, back))
            }
        }
    }
}
