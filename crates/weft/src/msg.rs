//! The argument structs of `fi_sendmsg` / `fi_recvmsg`.

use bytes::{Bytes, BytesMut};
use weft_core::addr::FiAddr;

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
}
