//! The argument structs of `fi_sendmsg` / `fi_recvmsg`.

use bytes::{Bytes, BytesMut};
use weft_core::addr::FiAddr;
use weft_core::provider::{iov1, Iov};

/// A message to send with every option (`fi_sendmsg` / `fi_tsendmsg`).
#[derive(Debug, Clone, Default)]
pub struct SendMsg {
    /// Destination (ignored on connected endpoints).
    pub dest: FiAddr,
    /// Gathered in order (at most `iov_limit` buffers).
    pub iov: Vec<Bytes>,
    /// `Some(tag)` for a tagged send.
    pub tag: Option<u64>,
    /// Remote CQ data.
    pub data: Option<u64>,
    /// Context reported in the completion.
    pub context: u64,
}

/// A send as the endpoint checks and posts it: [`SendMsg`] with its
/// buffer list inline, so the one-buffer calls (`post_send`, `send`, ...)
/// allocate nothing for it.
#[derive(Debug)]
pub(crate) struct SendParts {
    pub dest: FiAddr,
    pub iov: Iov,
    pub tag: Option<u64>,
    pub data: Option<u64>,
    pub context: u64,
}

impl SendParts {
    /// One buffer.
    pub fn one(
        dest: FiAddr,
        buf: Bytes,
        tag: Option<u64>,
        data: Option<u64>,
        context: u64,
    ) -> Self {
        SendParts {
            dest,
            iov: iov1(buf),
            tag,
            data,
            context,
        }
    }
}

impl From<SendMsg> for SendParts {
    fn from(m: SendMsg) -> Self {
        SendParts {
            dest: m.dest,
            iov: m.iov.into(),
            tag: m.tag,
            data: m.data,
            context: m.context,
        }
    }
}

/// A receive with every option (`fi_recvmsg` / `fi_trecvmsg`).
#[derive(Debug, Default)]
pub struct RecvMsg {
    /// Source filter (`FI_ADDR_UNSPEC`: any).
    pub src: FiAddr,
    /// Buffers filled in order; each one's `len()` is its capacity.
    pub bufs: Vec<BytesMut>,
    /// Tagged receive with `tag`/`ignore`.
    pub tagged: bool,
    /// Tag to match.
    pub tag: u64,
    /// Tag bits to ignore.
    pub ignore: u64,
    /// Context reported in the completion.
    pub context: u64,
}

impl RecvMsg {
    /// An untagged receive from anyone into `buf` (its `len()` is the
    /// capacity), completing with `context`.
    pub fn untagged(buf: BytesMut, context: u64) -> RecvMsg {
        RecvMsg {
            src: weft_core::addr::FI_ADDR_UNSPEC,
            bufs: vec![buf],
            context,
            ..RecvMsg::default()
        }
    }

    /// A tagged receive into `buf` of a message whose tag matches `tag`
    /// outside the bits of `ignore`, from `src` (`FI_ADDR_UNSPEC`:
    /// anyone), completing with `context`.
    pub fn tagged(buf: BytesMut, src: FiAddr, tag: u64, ignore: u64, context: u64) -> RecvMsg {
        RecvMsg {
            src,
            bufs: vec![buf],
            tagged: true,
            tag,
            ignore,
            context,
        }
    }
}
