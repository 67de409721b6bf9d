//! Multi-receive buffers (`FI_MULTI_RECV`): one buffer receives many
//! untagged messages, packed one after another. Posted with
//! [`Endpoint::post_recv_multi`], each message is a CQ completion whose
//! buffer is its range of the posted one ([`MultiRecvBuf::offset_of`]
//! says where); awaited with [`Endpoint::recv_multi`], the receive is a
//! [`Stream`] of [`MultiMsg`]s that hands the whole buffer back at its
//! end ([`MultiRecv::into_buffer`]).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::BytesMut;
use futures::Stream;
use weft_core::addr::FiAddr;
use weft_core::completion::{CqEntry, CqErrEntry, Finished, Returned};
use weft_core::flags::{Caps, OpFlags};
use weft_core::multi_recv::{self, MultiSink};
use weft_core::progress::{InlineWait, Progress};
use weft_core::provider::Rejected;
use weft_core::{Error, Result};

use super::{async_op, Endpoint};
use crate::msg::RecvMsg;
use crate::opfuture::{post_when_room, Owner};

/// The checks of a multi-receive on an endpoint or shared receive
/// context with `FI_MULTI_RECV` (`capable`) whose `FI_OPT_MIN_MULTI_RECV`
/// is `min` (see [`Endpoint::check_multi`]).
pub(crate) fn check_multi(capable: bool, msg: &RecvMsg, min: usize) -> Result<()> {
    if !capable || msg.tagged {
        return Err(Error::BadFlags);
    }
    let [buf] = msg.bufs.as_slice() else {
        return Err(Error::Inval);
    };
    if buf.is_empty() || buf.len() < min {
        return Err(Error::MsgSize);
    }
    Ok(())
}

impl Endpoint {
    /// The checks of a multi-receive: an endpoint with `FI_MULTI_RECV`
    /// and an untagged receive (libfabric defines none for tagged ones),
    /// else `BadFlags`; one buffer (`Inval`) of at least
    /// `FI_OPT_MIN_MULTI_RECV` bytes and not empty (`MsgSize`).
    pub(super) fn check_multi(&self, msg: &RecvMsg) -> Result<()> {
        check_multi(
            self.inner.info.caps.contains(Caps::MULTI_RECV),
            msg,
            self.min_multi_recv(),
        )
    }

    /// `fi_recv` with `FI_MULTI_RECV`: `buf` (its `len()` is the capacity,
    /// at least `FI_OPT_MIN_MULTI_RECV`) takes untagged messages packed
    /// from its start, each reported on the receive CQ with `context`;
    /// an entry's `bufs[0]` is the message's range of `buf` (sharing its
    /// memory, as libfabric's `buf` points into it). Once less than
    /// `FI_OPT_MIN_MULTI_RECV` is free the buffer is released: the last
    /// completion of it carries `FI_MULTI_RECV` (and the unused space as
    /// an empty last buffer). A message that does not fit the space left
    /// releases the buffer by a completion without a message (flags
    /// `FI_RECV | FI_MULTI_RECV`, no `FI_MSG`, length 0) and goes to the
    /// next receive; one larger than the whole unused buffer is truncated
    /// into it (`Trunc`). `fi_cancel` with `context` releases it with
    /// what it holds (a `Canceled` error carrying `FI_MULTI_RECV`).
    ///
    /// Errors: `BadFlags` without `FI_MULTI_RECV` in the endpoint's caps,
    /// `MsgSize` for a buffer smaller than `FI_OPT_MIN_MULTI_RECV` (or
    /// empty), `Again` when the receive queue is full; the buffer comes
    /// back with the error.
    pub fn post_recv_multi(
        &self,
        buf: BytesMut,
        context: u64,
    ) -> std::result::Result<MultiRecvBuf, (Error, BytesMut)> {
        post_multi(buf, context, |m, f| self.post_recvmsg(m, f))
    }

    /// A multi-receive as a stream: `buf` takes untagged messages packed
    /// from its start, as [`post_recv_multi`](Self::post_recv_multi)
    /// describes, and the stream yields one [`MultiMsg`] per message, in
    /// their order in the buffer (bytes through [`MultiRecv::bytes`]). It
    /// ends when the buffer is released (less than
    /// `FI_OPT_MIN_MULTI_RECV` free, a message that does not fit, or
    /// [`MultiRecv::cancel`]) and every message in it was yielded; then
    /// [`MultiRecv::into_buffer`] hands the buffer back. A message
    /// larger than the whole unused buffer is yielded as a `Trunc` error
    /// (its bytes in the error's `bufs`), as is, with `FI_SOURCE_ERR`, one
    /// from a sender not in the AV (`AddrNotAvail`).
    ///
    /// Dropping the stream loses nothing: the buffer is withdrawn, and
    /// messages it took that were not yet yielded go back to the
    /// endpoint, in order and ahead of later ones, for the next receive.
    /// A full receive queue is waited out. Errors as for
    /// `post_recv_multi`, with the buffer back.
    ///
    /// ```no_run
    /// # async fn serve(ep: weft::Endpoint) -> Result<(), Box<dyn std::error::Error>> {
    /// use futures::StreamExt;
    ///
    /// // Messages up to 4 KiB: release a buffer once less than that is free.
    /// ep.setopt(weft::EpOpt::MinMultiRecv, 4096)?;
    /// let mut buf = bytes::BytesMut::zeroed(256 * 1024);
    /// loop {
    ///     let mut msgs = ep.recv_multi(buf).await.map_err(|(e, _)| e)?;
    ///     while let Some(m) = msgs.next().await {
    ///         let m = m?;
    ///         println!("{} bytes at {}: {:?}", m.len, m.offset, msgs.bytes(&m));
    ///     }
    ///     // Released and read to its end: the same buffer again.
    ///     buf = msgs.into_buffer().map_err(|_| "not ended")?;
    /// }
    /// # }
    /// ```
    pub async fn recv_multi(
        &self,
        buf: BytesMut,
    ) -> std::result::Result<MultiRecv, (Error, BytesMut)> {
        let live = match self.live() {
            Ok(l) => l,
            Err(e) => return Err((e, buf)),
        };
        if let Some(srx) = &live.srx {
            return srx.recv_multi(buf).await;
        }
        let msg = RecvMsg::untagged(buf, 0);
        if let Err(e) = self.check_recv(&msg, live.rx_flags(OpFlags::MULTI_RECV)) {
            return Err((e, msg.bufs.into_iter().next().unwrap_or_default()));
        }
        post_stream(
            msg,
            self.min_multi_recv(),
            |m| self.recv_req(live, m, OpFlags::MULTI_RECV, None),
            |r| live.prov.post_recv(r),
            Owner::Ep(live.prov.clone()),
            live.inline.clone(),
        )
        .await
    }
}

/// `post_recv_multi` through `post` (an endpoint's or a context's
/// `post_recvmsg`): the buffer's place, or the error with the buffer.
pub(crate) fn post_multi(
    buf: BytesMut,
    context: u64,
    post: impl FnOnce(RecvMsg, OpFlags) -> std::result::Result<(), (Error, Vec<BytesMut>)>,
) -> std::result::Result<MultiRecvBuf, (Error, BytesMut)> {
    let at = MultiRecvBuf::of(&buf);
    post(RecvMsg::untagged(buf, context), OpFlags::MULTI_RECV)
        .map(|()| at)
        .map_err(|(e, mut bufs)| (e, bufs.pop().unwrap_or_default()))
}

/// Posts the awaited multi-receive of `msg` (checked: one buffer): the
/// request `make` builds is given a new stream released below `min`
/// free bytes and posted through `post`, a full queue waited out; the
/// stream withdraws it through `owner`, driving `progress` while it
/// waits (inline modes).
pub(crate) async fn post_stream(
    mut msg: RecvMsg,
    min: usize,
    make: impl FnOnce(RecvMsg) -> weft_core::provider::RecvReq,
    post: impl Fn(
        weft_core::provider::RecvReq,
    ) -> std::result::Result<(), Rejected<weft_core::provider::RecvReq>>,
    owner: Owner,
    progress: Option<Arc<dyn Progress>>,
) -> std::result::Result<MultiRecv, (Error, BytesMut)> {
    let Some(at) = msg.bufs.first().map(MultiRecvBuf::of) else {
        return Err((Error::Inval, BytesMut::new()));
    };
    let (ctx, _, _) = async_op();
    msg.context = ctx;
    let sink = MultiSink::new();
    let mut req = make(msg);
    multi_recv::attach(&mut req, min, Some(sink.clone()));
    if let Err(Rejected { err, mut req }) = post_when_room(req, post).await {
        return Err((err, req.bufs.pop().unwrap_or_default()));
    }
    Ok(MultiRecv::new(sink, owner, ctx, at, progress))
}

/// Where a posted multi-receive buffer lies, to find each completion's
/// place in it (libfabric's `buf - base`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MultiRecvBuf {
    base: usize,
    len: usize,
}

impl MultiRecvBuf {
    pub(crate) fn of(buf: &BytesMut) -> MultiRecvBuf {
        MultiRecvBuf {
            base: buf.as_ptr() as usize,
            len: buf.len(),
        }
    }

    /// The buffer's capacity as posted.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a buffer of no bytes (never posted: refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where in the buffer a completion of it starts (its first buffer);
    /// `None` for an entry that is not of this buffer.
    pub fn offset_of(&self, entry: &CqEntry) -> Option<usize> {
        entry.bufs.first().and_then(|b| self.offset(b))
    }

    /// Where `b`, a range of the buffer handed back in an entry (an
    /// error's `bufs`, the unused space), starts in it.
    pub fn offset(&self, b: &[u8]) -> Option<usize> {
        let off = (b.as_ptr() as usize).checked_sub(self.base)?;
        (off <= self.len).then_some(off)
    }
}

/// One message of a multi-receive stream: where it lies in the buffer
/// and what its completion reported. Its bytes: [`MultiRecv::bytes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiMsg {
    /// Where the message starts in the buffer.
    pub offset: usize,
    /// Its length.
    pub len: usize,
    /// The completion's flags (`FI_RECV | FI_MSG`, `FI_REMOTE_CQ_DATA`,
    /// and `FI_MULTI_RECV` on the completion that released the buffer).
    pub flags: OpFlags,
    /// Remote CQ data (with `FI_REMOTE_CQ_DATA`).
    pub data: u64,
    /// The sender (`FI_SOURCE`), `FI_ADDR_NOTAVAIL` if unknown.
    pub src: FiAddr,
}

/// An awaited multi-receive ([`Endpoint::recv_multi`]): a stream of the
/// messages placed in one buffer, which [`into_buffer`](Self::into_buffer)
/// hands back once the stream has ended.
pub struct MultiRecv {
    sink: Arc<MultiSink>,
    /// The endpoint, or the shared receive context, it was posted to.
    owner: Owner,
    context: u64,
    at: MultiRecvBuf,
    /// The parts of the buffer read so far, with their offsets, in
    /// buffer order (the unused space last).
    parts: Vec<(usize, BytesMut)>,
    ended: bool,
    canceled: bool,
    progress: Option<Arc<dyn Progress>>,
    wait: InlineWait,
}

impl std::fmt::Debug for MultiRecv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiRecv")
            .field("context", &self.context)
            .field("len", &self.at.len)
            .field(
                "parts",
                &self
                    .parts
                    .iter()
                    .map(|(o, b)| (*o, b.len()))
                    .collect::<Vec<_>>(),
            )
            .field("ended", &self.ended)
            .finish()
    }
}

impl MultiRecv {
    /// The stream of the buffer at `at`, posted to `owner` with
    /// `context`, whose completions come through `sink`.
    pub(crate) fn new(
        sink: Arc<MultiSink>,
        owner: Owner,
        context: u64,
        at: MultiRecvBuf,
        progress: Option<Arc<dyn Progress>>,
    ) -> MultiRecv {
        MultiRecv {
            sink,
            owner,
            context,
            at,
            parts: Vec::new(),
            ended: false,
            canceled: false,
            progress,
            wait: InlineWait::new(),
        }
    }

    /// The bytes of a message this stream yielded (empty for one it did
    /// not).
    pub fn bytes(&self, msg: &MultiMsg) -> &[u8] {
        match self.parts.binary_search_by_key(&msg.offset, |(o, _)| *o) {
            Ok(i) => {
                // A zero-length message may share its offset with the
                // next part: take the first part of that offset.
                let i = self.parts[..i]
                    .iter()
                    .rposition(|(o, _)| *o != msg.offset)
                    .map_or(0, |j| j + 1);
                self.parts[i..]
                    .iter()
                    .take_while(|(o, _)| *o == msg.offset)
                    .find(|(_, b)| b.len() == msg.len)
                    .map_or(&[][..], |(_, b)| &b[..])
            }
            Err(_) => &[],
        }
    }

    /// `fi_cancel` of the buffer: it takes no more messages and is
    /// released with what it holds; the stream yields those and ends.
    /// `NoEnt` once the buffer was released already.
    pub fn cancel(&self) -> Result<()> {
        if self.owner.cancel(self.context) {
            Ok(())
        } else {
            Err(Error::NoEnt)
        }
    }

    /// Whether the buffer was released by a cancel (or its MSG
    /// connection's end) rather than by filling up.
    pub fn is_canceled(&self) -> bool {
        self.canceled
    }

    /// The buffer, whole (`len()` as posted; the messages at their
    /// offsets, the unused space zeroed), once the stream has ended; the
    /// stream itself before. Without copying when every message was
    /// yielded as a message (an error that carried its bytes, or a
    /// message that died part-way, makes it a copy).
    pub fn into_buffer(mut self) -> std::result::Result<BytesMut, MultiRecv> {
        if !self.ended {
            return Err(self);
        }
        Ok(rebuild(std::mem::take(&mut self.parts), self.at.len))
    }

    /// Keeps a part of the buffer, in buffer order. Parts come in the
    /// order of their messages, except the unused space: it comes with
    /// the last completion, which may be that of an earlier message still
    /// arriving from another sender when the buffer was released.
    fn keep(&mut self, b: BytesMut) {
        if let Some(o) = self.at.offset(&b) {
            let at = self.parts.partition_point(|(p, _)| *p <= o);
            self.parts.insert(at, (o, b));
        }
    }

    /// Takes one completion in: a message to yield, or the release.
    fn on_finished(&mut self, f: Finished) -> Option<std::result::Result<MultiMsg, CqErrEntry>> {
        // A multi-receive's parts report no context of their own.
        match f.into_result(0) {
            Ok(mut e) => {
                let offset = e.bufs.first().and_then(|b| self.at.offset(b));
                for b in e.bufs.drain(..) {
                    self.keep(b);
                }
                // A release without a message carries no FI_MSG.
                if !e.flags.contains(OpFlags::MSG) {
                    return None;
                }
                Some(Ok(MultiMsg {
                    offset: offset.unwrap_or(0),
                    len: e.len,
                    flags: e.flags,
                    data: e.data,
                    src: e.src,
                }))
            }
            Err(e) if e.err == Error::Canceled => {
                self.canceled = true;
                for b in e.bufs {
                    self.keep(b);
                }
                None
            }
            Err(e) => Some(Err(e)),
        }
    }
}

/// The buffer from its parts: joined in place when they are its
/// contiguous ranges in order (`BytesMut::unsplit` on shared memory is
/// O(1)), else copied at their offsets into a fresh one.
fn rebuild(mut parts: Vec<(usize, BytesMut)>, len: usize) -> BytesMut {
    parts.sort_by_key(|(o, _)| *o);
    let mut next = 0;
    let mut contiguous = true;
    for (i, (o, b)) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        if *o != next || (!last && b.len() != b.capacity()) {
            contiguous = false;
            break;
        }
        next = o + b.capacity();
    }
    if contiguous && next == len && !parts.is_empty() {
        let mut it = parts.into_iter().map(|(_, b)| b);
        let mut whole = it.next().unwrap_or_default();
        for b in it {
            whole.unsplit(b);
        }
        whole.resize(len, 0);
        return whole;
    }
    let mut whole = BytesMut::zeroed(len);
    for (o, b) in parts {
        if let Some(dst) = whole.get_mut(o..o + b.len()) {
            dst.copy_from_slice(&b);
        }
    }
    whole
}

impl Stream for MultiRecv {
    type Item = std::result::Result<MultiMsg, CqErrEntry>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if this.ended {
                return Poll::Ready(None);
            }
            let mut polled = this.sink.poll_next(cx);
            if polled.is_pending() {
                if let Some(p) = &this.progress {
                    let sink = &this.sink;
                    if let Some(r) = this.wait.poll(
                        cx,
                        p.spin_hint(),
                        || p.progress(),
                        |cx| match sink.poll_next(cx) {
                            Poll::Ready(r) => Some(r),
                            Poll::Pending => None,
                        },
                        || p.idle(),
                    ) {
                        polled = Poll::Ready(r);
                    }
                }
            }
            match polled {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => this.ended = true,
                Poll::Ready(Some(f)) => {
                    this.wait
                        .finish(this.progress.as_ref().and_then(|p| p.spin_hint()));
                    if let Some(item) = this.on_finished(f) {
                        return Poll::Ready(Some(item));
                    }
                }
            }
        }
    }
}

impl Drop for MultiRecv {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        // Closed first: a completion racing this drop is either in its
        // slot already (taken below) or finds the slot closed and goes
        // back to the endpoint through its provider, after these. The
        // buffer takes no message from now on (a closed stream's buffer
        // ends when offered one).
        let slots = self.sink.close();
        for mut rx in slots {
            rx.close();
            let Some(f) = rx.try_recv().ok().flatten() else {
                continue;
            };
            let is_msg = f.entry().is_none_or(|e| e.flags.contains(OpFlags::MSG));
            if let Some(back) = Returned::from_finished(f).filter(|_| is_msg) {
                self.owner.give_back_after(back);
            }
        }
        // Withdrawn last: a provider whose parts may still be arriving
        // then knows every message already in has been given back, and
        // keeps the places of the ones still arriving behind them. Said
        // first to the sink, for a provider taking places on another
        // thread meanwhile (a cancel, another stream's give-back).
        self.sink.given_back();
        self.owner.cancel(self.context);
    }
}
