//! Multi-receive buffers (`FI_MULTI_RECV`) on a shared receive context:
//! one buffer takes the untagged messages of every bound endpoint, packed
//! one after another from its start, as on an endpoint
//! ([`Endpoint::post_recv_multi`](crate::Endpoint::post_recv_multi)).
//! Each message's completion goes to the queues of the endpoint it
//! arrived at (a context has none), with its sender (`FI_SOURCE`) in
//! that endpoint's AV; a completion without a message (a release by a
//! message that did not fit, a cancel) goes to the queues of the first
//! endpoint bound when the buffer was posted. The release threshold is
//! the context's own `FI_OPT_MIN_MULTI_RECV`
//! ([`SharedRxContext::setopt`]), not the endpoints'.

use std::sync::atomic::Ordering;

use bytes::BytesMut;
use weft_core::flags::{Caps, OpFlags};
use weft_core::{Error, Result};

use crate::endpoint::{post_multi, post_stream, EpOpt, MultiRecv, MultiRecvBuf};
use crate::msg::RecvMsg;
use crate::opfuture::Owner;
use crate::srx::SharedRxContext;

impl SharedRxContext {
    /// Whether the context takes multi-receive buffers: it matches in
    /// software and has `FI_MULTI_RECV` among its caps.
    fn multi_capable(&self) -> bool {
        self.inner.prov.matches() && self.attr().caps.contains(Caps::MULTI_RECV)
    }

    /// `fi_getopt` on the context: `MinMultiRecv` (16 KiB unless set)
    /// where it takes multi-receive buffers; any other option, or a
    /// context that takes none, is `NoProtoOpt`.
    pub fn getopt(&self, opt: EpOpt) -> Result<usize> {
        match opt {
            EpOpt::MinMultiRecv if self.multi_capable() => Ok(self.min_multi_recv()),
            _ => Err(Error::NoProtoOpt),
        }
    }

    /// `fi_setopt` on the context: `MinMultiRecv`, the free space below
    /// which its multi-receive buffers are released, for buffers posted
    /// after it (through the context or a bound endpoint: a bound
    /// endpoint's own option does not apply to them). 0 up to the
    /// largest message (`MsgSize` above); `NoProtoOpt` as for `getopt`.
    pub fn setopt(&self, opt: EpOpt, value: usize) -> Result<()> {
        match opt {
            EpOpt::MinMultiRecv if self.multi_capable() => {
                if value > self.inner.max_msg_size {
                    return Err(Error::MsgSize);
                }
                self.inner.min_multi_recv.store(value, Ordering::Release);
                Ok(())
            }
            _ => Err(Error::NoProtoOpt),
        }
    }

    /// The `FI_OPT_MIN_MULTI_RECV` in force now.
    pub(crate) fn min_multi_recv(&self) -> usize {
        self.inner.min_multi_recv.load(Ordering::Acquire)
    }

    /// `fi_recv` with `FI_MULTI_RECV` on the context: `buf` (its `len()`
    /// is the capacity, at least the context's `FI_OPT_MIN_MULTI_RECV`)
    /// takes the untagged messages of every bound endpoint, as
    /// [`Endpoint::post_recv_multi`](crate::Endpoint::post_recv_multi)
    /// describes; each completion, with `context`, goes to the receive
    /// CQ of the endpoint its message arrived at (see the module notes).
    /// A bound endpoint's `post_recv_multi` posts here.
    ///
    /// Errors: `BadFlags` where the context takes no multi-receive
    /// (without `FI_MULTI_RECV` in its caps, or verbs MSG's), `MsgSize`
    /// for a buffer smaller than the minimum (or empty), `Again` when the
    /// context is full, `OpBadState` once closed; the buffer comes back.
    pub fn post_recv_multi(
        &self,
        buf: BytesMut,
        context: u64,
    ) -> std::result::Result<MultiRecvBuf, (Error, BytesMut)> {
        post_multi(buf, context, |m, f| self.post_recvmsg(m, f))
    }

    /// A multi-receive on the context as a stream, as
    /// [`Endpoint::recv_multi`](crate::Endpoint::recv_multi) describes:
    /// it yields the messages of every bound endpoint in their order in
    /// the buffer, each with its sender in the AV of the endpoint it
    /// arrived at, and hands the buffer back once it has ended. Dropping
    /// the stream loses nothing: messages it took and did not yield go
    /// back to the context, in order and ahead of later ones. A bound
    /// endpoint's `recv_multi` posts here. Errors as for
    /// [`post_recv_multi`](Self::post_recv_multi) (a full context is
    /// waited out).
    pub async fn recv_multi(
        &self,
        buf: BytesMut,
    ) -> std::result::Result<MultiRecv, (Error, BytesMut)> {
        let msg = RecvMsg::untagged(buf, 0);
        if let Err(e) = self
            .inner
            .state
            .live()
            .and_then(|()| self.check(&msg, OpFlags::MULTI_RECV))
        {
            return Err((e, msg.bufs.into_iter().next().unwrap_or_default()));
        }
        let prov = &self.inner.prov;
        post_stream(
            msg,
            self.min_multi_recv(),
            |m| self.req(m, OpFlags::MULTI_RECV, None),
            |r| prov.post_recv(r),
            Owner::Srx(prov.clone()),
            None,
        )
        .await
    }
}
