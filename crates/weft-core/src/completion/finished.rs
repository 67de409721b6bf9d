//! What the awaiting future of an operation is sent ([`Finished`]), where
//! a receive reported ([`Origin`]), and a message nobody read ([`Returned`]).

use std::sync::Arc;

use bytes::BytesMut;
use futures::channel::oneshot;

use crate::addr::FiAddr;
use crate::counter::CounterShared;
use crate::error::Error;
use crate::flags::OpFlags;
use crate::tagmatch::MsgInfo;

use super::{CqEntry, CqErrEntry, CqShared};

/// Where a received message's completion was reported: kept beside the
/// completion an awaiting future is sent, so a message whose future is
/// dropped before it reads it can go back to its endpoint (see
/// [`Returned`]).
#[derive(Debug, Clone, Default)]
pub struct Origin {
    /// The CQ the operation reported to (for a shared receive context:
    /// the one of the endpoint the message arrived at).
    pub cq: Option<Arc<CqShared>>,
    /// Its counter, likewise.
    pub cntr: Option<Arc<CounterShared>>,
}

impl Origin {
    /// No queues.
    pub fn unknown() -> Origin {
        Origin::default()
    }
}

/// What the awaiting future of an operation is sent.
///
/// Its size decides the size of every operation's channel allocation, so
/// it is kept at 88 bytes: at 96 the channel became a 176-byte block,
/// which in most heap layouts took glibc's slow path on every other
/// message (`docs/benchmarks.md`). To get there, the entry's `context`
/// slot carries the sender's raw AV handle while in the channel: the
/// future knows its own context and puts it back ([`into_result`]).
///
/// [`into_result`]: Finished::into_result
#[derive(Debug)]
pub struct Finished {
    /// The completion; an error entry boxed, since errors are rare and
    /// every completion moves this through a channel. Its `context` is
    /// the raw source (see above).
    item: std::result::Result<CqEntry, Box<CqErrEntry>>,
    /// For a receive: where it was reported.
    origin: Origin,
}

impl Finished {
    /// A completion for a future; `src` is the sender's AV handle as the
    /// endpoint knew it at arrival (before any user id replaced it in the
    /// entry), or `FI_ADDR_NOTAVAIL`.
    pub(super) fn new(
        item: std::result::Result<CqEntry, Box<CqErrEntry>>,
        src: FiAddr,
        origin: Origin,
    ) -> Finished {
        let mut item = item;
        match &mut item {
            Ok(e) => e.context = src,
            Err(e) => e.context = src,
        }
        Finished { item, origin }
    }

    /// The successful completion, to look at (its `context` is the raw
    /// source until [`into_result`](Self::into_result)); `None` for an
    /// error.
    pub fn entry(&self) -> Option<&CqEntry> {
        self.item.as_ref().ok()
    }

    /// The completion as the future of the operation posted with
    /// `context` reports it, with the sender's raw AV handle and where it
    /// was reported (what a give-back needs).
    pub fn into_parts(
        self,
        context: u64,
    ) -> (std::result::Result<CqEntry, CqErrEntry>, FiAddr, Origin) {
        let Finished { item, origin } = self;
        let (item, src) = match item {
            Ok(mut e) => {
                let src = std::mem::replace(&mut e.context, context);
                (Ok(e), src)
            }
            Err(mut e) => {
                let src = std::mem::replace(&mut e.context, context);
                (Err(*e), src)
            }
        };
        (item, src, origin)
    }

    /// The completion as the future of the operation posted with
    /// `context` reports it.
    #[inline]
    pub fn into_result(self, context: u64) -> std::result::Result<CqEntry, CqErrEntry> {
        self.into_parts(context).0
    }
}

/// A received message nobody read: the future awaiting its receive was
/// dropped after the message reached it. Its endpoint hands it to the next
/// receive that takes it, ahead of later messages.
#[derive(Debug)]
pub struct Returned {
    /// The completion the receive would have reported (buffers included).
    pub entry: CqEntry,
    /// The sender's AV handle as the endpoint knew it at arrival (before
    /// any user id replaced it in the entry), or `FI_ADDR_NOTAVAIL`.
    pub src: FiAddr,
    /// Where it was reported.
    pub origin: Origin,
    /// The sender's raw address when its AV handle was unknown
    /// (`FI_SOURCE_ERR`), so that the message keeps it; else empty.
    pub raw: Vec<u8>,
}

impl Returned {
    /// The message a finished receive carries, if it carries a whole one:
    /// a completion, or an `FI_SOURCE_ERR` error entry (`AddrNotAvail`,
    /// the message placed, the sender's address in `err_data`). Other
    /// errors carry nothing to hand on.
    pub fn from_finished(f: Finished) -> Option<Returned> {
        let (item, src, origin) = f.into_parts(0);
        Returned::from_parts(item, src, origin)
    }

    /// [`from_finished`](Self::from_finished) of a completion already
    /// taken apart ([`Finished::into_parts`]).
    pub fn from_parts(
        item: std::result::Result<CqEntry, CqErrEntry>,
        src: FiAddr,
        origin: Origin,
    ) -> Option<Returned> {
        match item {
            Ok(entry) => Some(Returned {
                src,
                entry,
                origin,
                raw: Vec::new(),
            }),
            Err(e) if e.err == Error::AddrNotAvail => Some(Returned {
                src,
                entry: CqEntry {
                    context: 0,
                    flags: e.flags,
                    len: e.len,
                    bufs: e.bufs,
                    data: e.data,
                    tag: e.tag,
                    src: e.src,
                },
                origin,
                raw: e.err_data,
            }),
            Err(_) => None,
        }
    }

    /// The message as a matcher knows one: raw source, kind, tag, length,
    /// remote data.
    pub fn info(&self) -> MsgInfo {
        let e = &self.entry;
        MsgInfo {
            key: None,
            src: self.src,
            tagged: e.flags.contains(OpFlags::TAGGED),
            tag: e.tag,
            len: e.len,
            data: e.flags.contains(OpFlags::REMOTE_CQ_DATA).then_some(e.data),
        }
    }

    /// Its bytes in one buffer: the receive's own when it had only one
    /// (no copy), else joined.
    pub fn take_bytes(&mut self) -> BytesMut {
        let mut bufs = std::mem::take(&mut self.entry.bufs);
        if bufs.len() == 1 {
            return bufs.pop().unwrap_or_default();
        }
        let mut out = BytesMut::with_capacity(self.entry.len);
        for b in &bufs {
            out.extend_from_slice(b);
        }
        out
    }
}

/// The channel an awaiting future's completion comes through.
pub type Waiter = oneshot::Sender<Finished>;
