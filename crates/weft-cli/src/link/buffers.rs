//! Receive buffers out of completions and back into receives, so that
//! the latency path allocates nothing.

use bytes::{Bytes, BytesMut};
use weft::CqEntry;

/// The received bytes of a completion, as one buffer.
pub fn payload(e: CqEntry) -> Bytes {
    payload_keep(e).0
}

/// [`payload`], also handing back the completion's emptied `Vec` for the
/// next receive.
pub fn payload_keep(e: CqEntry) -> (Bytes, Vec<BytesMut>) {
    let mut bufs = e.bufs;
    if bufs.len() == 1 {
        let mut b = bufs.swap_remove(0);
        b.truncate(e.len);
        return (b.freeze(), bufs);
    }
    let mut out = BytesMut::with_capacity(e.len);
    for b in bufs.drain(..) {
        out.extend_from_slice(&b);
    }
    out.truncate(e.len);
    (out.freeze(), bufs)
}

/// The receive buffers of a completion, ready to post again: the first
/// buffer back at `size` bytes, in the same `Vec`.
// Always: left to itself the compiler kept it out of line, with the
// `Vec` moved in and out (about 20 instructions a message).
#[inline(always)]
pub fn reclaim(bufs: Vec<BytesMut>, size: usize) -> Vec<BytesMut> {
    // The usual case, a whole message in the one buffer it was posted
    // with: nothing to do (the general path cost about 30 instructions a
    // message).
    if let [b] = bufs.as_slice() {
        if b.len() == size {
            return bufs;
        }
    }
    reclaim_resize(bufs, size)
}

/// [`reclaim`] of buffers that need cutting or resizing.
fn reclaim_resize(mut bufs: Vec<BytesMut>, size: usize) -> Vec<BytesMut> {
    bufs.truncate(1);
    if bufs.is_empty() {
        bufs.push(BytesMut::new());
    }
    // A receive leaves the buffer's length alone: resizing it to what it
    // is cost a third of this a message.
    if bufs[0].len() != size {
        bufs[0].resize(size, 0);
    }
    bufs
}

/// A sent buffer becomes a receive buffer again once the provider has
/// let go of it; if it has not, a fresh one is cheaper than waiting.
pub fn recycle(data: Bytes, size: usize) -> BytesMut {
    match data.try_into_mut() {
        Ok(mut b) => {
            b.resize(size, 0);
            b
        }
        Err(_) => BytesMut::zeroed(size),
    }
}
