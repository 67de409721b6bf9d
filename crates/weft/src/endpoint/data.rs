//! The data path of an endpoint: the non-blocking `post_*` operations
//! that report to the bound CQ, and the `async` forms that resolve with
//! their own completion (both checked against the endpoint's attributes
//! first).

use std::future::Future;

use bytes::{Bytes, BytesMut};
use weft_core::addr::{FiAddr, FI_ADDR_UNSPEC};
use weft_core::completion::{CqEntry, CqErrEntry, Waiter};
use weft_core::flags::{Caps, OpFlags};
use weft_core::provider::{Iov, PoolSend, RecvReq, Rejected, SendReq};
use weft_core::{Error, Result};

use super::{async_op, op_done, Endpoint, Live};
use crate::msg::{RecvMsg, SendMsg, SendParts};
use crate::opfuture::{wait_then_post, Lazy, OnDrop, OpFuture, Started};

/// What the `async` sends and receives resolve with.
pub(crate) type OpResult = std::result::Result<CqEntry, CqErrEntry>;

impl Endpoint {
    fn check_send(&self, msg: &SendParts, flags: OpFlags) -> Result<()> {
        self.check_send_of(msg, msg.iov.iter().map(|b| b.len()).sum(), flags)
    }

    /// [`check_send`](Self::check_send) of a message of `len` bytes
    /// that `msg.iov` does not carry (a pool buffer).
    #[inline]
    fn check_send_of(&self, msg: &SendParts, len: usize, flags: OpFlags) -> Result<()> {
        let info = &self.inner.info;
        // A flag the provider would not honour is refused, never ignored.
        if !info.tx_attr.op_flags_supported.contains(flags)
            || (flags & OpFlags::COMPLETION_LEVELS).bits().count_ones() > 1
        {
            return Err(Error::BadFlags);
        }
        let need = if msg.tag.is_some() {
            Caps::TAGGED
        } else {
            Caps::MSG
        };
        if !info.caps.contains(need) {
            return Err(Error::NoSys);
        }
        if msg.iov.len() > info.tx_attr.iov_limit.max(1) {
            return Err(Error::Inval);
        }
        if len > info.ep_attr.max_msg_size {
            return Err(Error::MsgSize);
        }
        if flags.contains(OpFlags::INJECT) && len > info.tx_attr.inject_size {
            return Err(Error::MsgSize);
        }
        Ok(())
    }

    /// Checks a receive; `flags` has the endpoint's defaults merged.
    pub(super) fn check_recv(&self, msg: &RecvMsg, flags: OpFlags) -> Result<()> {
        let info = &self.inner.info;
        if !info
            .rx_attr
            .op_flags_supported
            .contains(flags - OpFlags::AUTH_KEY)
        {
            return Err(Error::BadFlags);
        }
        // A receive directed by key: only where keys live in the AV, with
        // directed receives, and naming a key.
        if flags.contains(OpFlags::AUTH_KEY) {
            if !info.domain_attr.av_auth_key
                || !info.ep_attr.ep_type.takes_av_keys()
                || !info.caps.contains(Caps::DIRECTED_RECV)
            {
                return Err(Error::BadFlags);
            }
            if msg.src == FI_ADDR_UNSPEC {
                return Err(Error::Inval);
            }
        }
        if !peek_flags_ok(msg, flags) {
            return Err(Error::BadFlags);
        }
        if flags.contains(OpFlags::MULTI_RECV) {
            self.check_multi(msg)?;
        }
        let need = if msg.tagged { Caps::TAGGED } else { Caps::MSG };
        if !info.caps.contains(need) {
            return Err(Error::NoSys);
        }
        if msg.bufs.len() > info.rx_attr.iov_limit.max(1) {
            return Err(Error::Inval);
        }
        Ok(())
    }

    // Inlined, the parts moved from the caller's `msg` straight into the
    // request: through a helper's by-value parameter the 72-byte buffer
    // list was copied twice on its way (about 18 instructions a send).
    #[inline(always)]
    fn send_req(
        &self,
        live: &Live,
        msg: SendParts,
        pool: Option<PoolSend>,
        flags: OpFlags,
        waiter: Option<Waiter>,
    ) -> SendReq {
        let flags = live.tx_flags(flags);
        let kind = OpFlags::SEND | OpFlags::msg_or_tagged(msg.tag.is_some());
        let mut done = op_done(
            &live.tx_cq,
            msg.context,
            kind,
            flags,
            live.send_cntr.clone(),
            waiter,
        );
        // fi_inject: no completion on success.
        done.report &= !flags.contains(OpFlags::INJECT);
        SendReq {
            dest: msg.dest,
            iov: msg.iov,
            pool,
            tag: msg.tag,
            data: msg.data,
            flags,
            done,
        }
    }

    // Inlined, and the request built in the place it is returned
    // (nothing changed in it afterwards): out of line, or fixed up after
    // it was built, it was copied again on its way to the provider
    // (about 40 instructions a receive each). Always: left to itself the
    // compiler kept this one out of line.
    #[inline(always)]
    pub(super) fn recv_req(
        &self,
        live: &Live,
        msg: RecvMsg,
        flags: OpFlags,
        waiter: Option<Waiter>,
    ) -> RecvReq {
        let flags = live.rx_flags(flags);
        let kind = OpFlags::RECV | OpFlags::msg_or_tagged(msg.tagged);
        let directed = self.inner.info.caps.contains(Caps::DIRECTED_RECV);
        let done = op_done(
            &live.rx_cq,
            msg.context,
            kind,
            flags,
            live.recv_cntr.clone(),
            waiter,
        );
        let multi = if flags.contains(OpFlags::MULTI_RECV) {
            Some(weft_core::multi_recv::buffer(
                &done,
                self.min_multi_recv(),
                None,
            ))
        } else {
            None
        };
        RecvReq {
            src: if directed { msg.src } else { FI_ADDR_UNSPEC },
            bufs: msg.bufs,
            tagged: msg.tagged,
            tag: msg.tag,
            ignore: msg.ignore,
            flags,
            done,
            multi,
        }
    }

    /// `fi_sendmsg` / `fi_tsendmsg`: posts a send; its completion goes to
    /// the transmit CQ with `msg.context`. `Again` when the queue is full.
    pub fn post_sendmsg(&self, msg: SendMsg, flags: OpFlags) -> Result<()> {
        self.post_parts(msg.into(), flags)
    }

    fn post_parts(&self, msg: SendParts, flags: OpFlags) -> Result<()> {
        self.post_parts_on(self.live()?, msg, flags)
    }

    // Always: left to the compiler it stayed out of line under
    // `post_parts`, one more call (its register saves and the message's
    // hand-over) on every send.
    #[inline(always)]
    fn post_parts_on(&self, live: &Live, msg: SendParts, flags: OpFlags) -> Result<()> {
        self.check_send(&msg, flags)?;
        let req = self.send_req(live, msg, None, flags, None);
        live.prov.post_send(req).map_err(|r| r.err)
    }

    /// A send whose message is one pool buffer: handed to the provider
    /// as the buffer itself where it takes one
    /// ([`takes_pool_sends`](weft_core::provider::ProviderEndpoint::takes_pool_sends):
    /// no allocation, the pool's key read from the buffer), as `Bytes`
    /// (a boxed owner, back in the pool when dropped) elsewhere. Refused,
    /// the message comes back as such `Bytes`.
    pub(crate) fn post_pool_send(
        &self,
        dest: FiAddr,
        buf: PoolSend,
        tag: Option<u64>,
        context: u64,
    ) -> std::result::Result<(), (Error, Bytes)> {
        let live = match self.live() {
            Ok(l) => l,
            Err(e) => return Err((e, buf.into_bytes())),
        };
        if !live.prov.takes_pool_sends() {
            let bytes = buf.into_bytes();
            // A clone (a count) to hand back if the post is refused: the
            // refused request is dropped inside the post.
            let parts = SendParts::one(dest, bytes.clone(), tag, None, context);
            return self
                .post_parts_on(live, parts, OpFlags::empty())
                .map_err(|e| (e, bytes));
        }
        let parts = SendParts {
            dest,
            iov: Iov::new(),
            tag,
            data: None,
            context,
        };
        if let Err(e) = self.check_send_of(&parts, buf.len(), OpFlags::empty()) {
            return Err((e, buf.into_bytes()));
        }
        // Into the request as it is built: set afterwards, the request
        // was copied once more on its way to the provider.
        let req = self.send_req(live, parts, Some(buf), OpFlags::empty(), None);
        live.prov.post_send(req).map_err(|Rejected { err, req }| {
            // The provider may have turned it into `Bytes` already.
            let back = match req.pool {
                Some(p) => p.into_bytes(),
                None => req.iov.into_iter().next().unwrap_or_default(),
            };
            (err, back)
        })
    }

    /// `fi_send`.
    pub fn post_send(&self, dest: FiAddr, buf: Bytes, context: u64) -> Result<()> {
        self.post_parts(
            SendParts::one(dest, buf, None, None, context),
            OpFlags::empty(),
        )
    }

    /// `fi_senddata`: a send carrying remote CQ data.
    pub fn post_senddata(&self, dest: FiAddr, buf: Bytes, data: u64, context: u64) -> Result<()> {
        self.post_parts(
            SendParts::one(dest, buf, None, Some(data), context),
            OpFlags::REMOTE_CQ_DATA,
        )
    }

    /// `fi_inject`: the buffer is the caller's again on return and no
    /// completion is generated (up to `inject_size` bytes).
    pub fn inject(&self, dest: FiAddr, buf: Bytes) -> Result<()> {
        self.post_parts(SendParts::one(dest, buf, None, None, 0), OpFlags::INJECT)
    }

    /// `fi_tsend`.
    pub fn post_tsend(&self, dest: FiAddr, buf: Bytes, tag: u64, context: u64) -> Result<()> {
        self.post_parts(
            SendParts::one(dest, buf, Some(tag), None, context),
            OpFlags::empty(),
        )
    }

    /// `fi_tinject`.
    pub fn tinject(&self, dest: FiAddr, buf: Bytes, tag: u64) -> Result<()> {
        self.post_parts(
            SendParts::one(dest, buf, Some(tag), None, 0),
            OpFlags::INJECT,
        )
    }

    /// `fi_recvmsg` / `fi_trecvmsg`, including `PEEK`, `PEEK|CLAIM`,
    /// `PEEK|DISCARD`, `CLAIM` and `CLAIM|DISCARD` for tagged receives,
    /// and `MULTI_RECV` for untagged ones (see
    /// [`post_recv_multi`](Self::post_recv_multi)).
    /// On failure to post, the buffers come back in the error.
    pub fn post_recvmsg(
        &self,
        msg: RecvMsg,
        flags: OpFlags,
    ) -> std::result::Result<(), (Error, Vec<BytesMut>)> {
        let live = match self.live() {
            Ok(l) => l,
            Err(e) => return Err((e, msg.bufs)),
        };
        if let Some(srx) = &live.srx {
            return srx.post_recvmsg(msg, flags);
        }
        if let Err(e) = self.check_recv(&msg, live.rx_flags(flags)) {
            return Err((e, msg.bufs));
        }
        live.prov
            .post_recv(self.recv_req(live, msg, flags, None))
            .map_err(|Rejected { err, req }| (err, req.bufs))
    }

    /// `fi_recv`: receive into `buf` (its `len()` is the capacity).
    pub fn post_recv(&self, buf: BytesMut, context: u64) -> Result<()> {
        self.post_recvmsg(RecvMsg::untagged(buf, context), OpFlags::empty())
            .map_err(|(e, _)| e)
    }

    /// `fi_trecv`.
    pub fn post_trecv(
        &self,
        buf: BytesMut,
        src: FiAddr,
        tag: u64,
        ignore: u64,
        context: u64,
    ) -> Result<()> {
        let msg = RecvMsg::tagged(buf, src, tag, ignore, context);
        self.post_recvmsg(msg, OpFlags::empty()).map_err(|(e, _)| e)
    }

    /// `fi_cancel`: a pending receive with `context` completes with a
    /// `Canceled` error entry. `NoEnt` if none is pending (already
    /// completed, or never posted).
    pub fn cancel(&self, context: u64) -> Result<()> {
        if self.live()?.prov.cancel(context) {
            Ok(())
        } else {
            Err(Error::NoEnt)
        }
    }

    /// Sends `msg` and resolves with its completion. A full transmit queue
    /// is waited out, not reported.
    pub fn sendmsg(
        &self,
        msg: SendMsg,
        flags: OpFlags,
    ) -> impl Future<Output = OpResult> + Send + '_ {
        self.send_parts(msg.into(), flags)
    }

    fn send_parts(
        &self,
        msg: SendParts,
        flags: OpFlags,
    ) -> impl Future<Output = OpResult> + Send + '_ {
        Lazy::new(move || self.start_send(msg, flags))
    }

    /// Checks and posts a send for its future.
    fn start_send(&self, msg: SendParts, flags: OpFlags) -> Started<'_> {
        let fail = |e: Error| Started::Failed(CqErrEntry::new(0, OpFlags::SEND, e));
        let live = match self.live() {
            Ok(l) => l,
            Err(e) => return fail(e),
        };
        if let Err(e) = self.check_send(&msg, flags) {
            return fail(e);
        }
        let (ctx, tx, rx) = async_op();
        let mut msg = msg;
        msg.context = ctx;
        // The waiter takes the completion; the CQ never sees it.
        let req = self.send_req(live, msg, None, flags & !OpFlags::INJECT, Some(tx));
        match live.prov.post_send(req) {
            Ok(()) => Started::Posted(live.op_future(ctx, rx, OnDrop::Nothing)),
            Err(Rejected {
                err: Error::Again,
                req,
            }) => Started::Boxed(Box::pin(async move {
                let fail = |e: Error| CqErrEntry::new(0, OpFlags::SEND, e);
                if let Err(r) = wait_then_post(req, |r| live.prov.post_send(r)).await {
                    return Err(fail(r.err));
                }
                live.op_future(ctx, rx, OnDrop::Nothing).await
            })),
            Err(r) => fail(r.err),
        }
    }

    /// `send` resolving with the completion.
    pub fn send(&self, dest: FiAddr, buf: Bytes) -> impl Future<Output = OpResult> + Send + '_ {
        self.send_parts(SendParts::one(dest, buf, None, None, 0), OpFlags::empty())
    }

    /// Tagged `send` resolving with the completion.
    pub fn tsend(
        &self,
        dest: FiAddr,
        buf: Bytes,
        tag: u64,
    ) -> impl Future<Output = OpResult> + Send + '_ {
        self.send_parts(
            SendParts::one(dest, buf, Some(tag), None, 0),
            OpFlags::empty(),
        )
    }

    /// Receives and resolves with the completion, whose `bufs` hold the
    /// data. Dropping the future withdraws the receive, or, when a message
    /// already reached it, hands that message to the next receive ahead of
    /// later ones: a receive nobody awaits consumes no message.
    /// `MULTI_RECV` (given or a default) is `BadFlags` here: a
    /// multi-receive has many completions, so it is a stream
    /// ([`recv_multi`](Self::recv_multi)).
    pub fn recvmsg(
        &self,
        msg: RecvMsg,
        flags: OpFlags,
    ) -> impl Future<Output = OpResult> + Send + '_ {
        Lazy::new(move || self.start_recv(msg, flags))
    }

    /// Checks and posts a receive for its future.
    fn start_recv(&self, msg: RecvMsg, flags: OpFlags) -> Started<'_> {
        let fail =
            |e: Error, bufs| Started::Failed(CqErrEntry::new(0, OpFlags::RECV, e).with_bufs(bufs));
        let live = match self.live() {
            Ok(l) => l,
            Err(e) => return fail(e, msg.bufs),
        };
        if let Some(srx) = &live.srx {
            return srx.start_recv(msg, flags);
        }
        // One future, one completion: a multi-receive is `recv_multi`.
        let merged = live.rx_flags(flags);
        if merged.contains(OpFlags::MULTI_RECV) {
            return fail(Error::BadFlags, msg.bufs);
        }
        if let Err(e) = self.check_recv(&msg, merged) {
            return fail(e, msg.bufs);
        }
        let (ctx, tx, rx) = async_op();
        let mut msg = msg;
        msg.context = ctx;
        let on_drop = OnDrop::for_recv(merged);
        let req = self.recv_req(live, msg, flags, Some(tx));
        // A receive that has not matched is withdrawn if the future goes;
        // one that has gives its message back.
        match live.prov.post_recv(req) {
            Ok(()) => Started::Posted(live.op_future(ctx, rx, on_drop)),
            Err(Rejected {
                err: Error::Again,
                req,
            }) => Started::Boxed(Box::pin(async move {
                if let Err(r) = wait_then_post(req, |r| live.prov.post_recv(r)).await {
                    return Err(CqErrEntry::new(0, OpFlags::RECV, r.err).with_bufs(r.req.bufs));
                }
                live.op_future(ctx, rx, on_drop).await
            })),
            Err(r) => fail(r.err, r.req.bufs),
        }
    }

    /// Posts a receive once, for the future of its completion (pool
    /// receives, which hold their buffer themselves while they wait out a
    /// full queue). Not on endpoints bound to a shared receive context
    /// (`OpNotSupp`). On failure the buffers come back.
    pub(crate) fn recv_once(
        &self,
        msg: RecvMsg,
        flags: OpFlags,
    ) -> std::result::Result<OpFuture, (Error, Vec<BytesMut>)> {
        let live = match self.live() {
            Ok(l) => l,
            Err(e) => return Err((e, msg.bufs)),
        };
        if live.srx.is_some() {
            return Err((Error::OpNotSupp, msg.bufs));
        }
        if let Err(e) = self.check_recv(&msg, flags) {
            return Err((e, msg.bufs));
        }
        let (ctx, tx, rx) = async_op();
        let mut msg = msg;
        msg.context = ctx;
        let on_drop = OnDrop::for_recv(live.rx_flags(flags));
        let req = self.recv_req(live, msg, flags, Some(tx));
        match live.prov.post_recv(req) {
            Ok(()) => Ok(live.op_future(ctx, rx, on_drop)),
            Err(r) => Err((r.err, r.req.bufs)),
        }
    }

    /// Receives one message into `buf`.
    pub fn recv(&self, buf: BytesMut) -> impl Future<Output = OpResult> + Send + '_ {
        self.recvmsg(RecvMsg::untagged(buf, 0), OpFlags::empty())
    }

    /// Receives one tagged message matching `tag`/`ignore` from `src`.
    pub fn trecv(
        &self,
        buf: BytesMut,
        src: FiAddr,
        tag: u64,
        ignore: u64,
    ) -> impl Future<Output = OpResult> + Send + '_ {
        let msg = RecvMsg {
            src,
            bufs: vec![buf],
            tagged: true,
            tag,
            ignore,
            context: 0,
        };
        self.recvmsg(msg, OpFlags::empty())
    }
}

/// fi_tagged(3)'s rules for the peek family: `PEEK`, `CLAIM` and
/// `DISCARD` on tagged receives only, `DISCARD` with `PEEK` or `CLAIM`.
pub(crate) fn peek_flags_ok(msg: &RecvMsg, flags: OpFlags) -> bool {
    let peeks = OpFlags::PEEK | OpFlags::CLAIM | OpFlags::DISCARD;
    (msg.tagged || !flags.intersects(peeks))
        && (!flags.contains(OpFlags::DISCARD) || flags.intersects(OpFlags::PEEK | OpFlags::CLAIM))
}
