//! Frames in flight: outgoing frames with their completion, and the async
//! helpers for the handshake frames exchanged before a connection carries
//! data.

use std::io::IoSlice;
use std::sync::Arc;
use std::time::Duration;

use weft_core::completion::OpDone;
use weft_core::credits::Credits;
use weft_core::provider::Iov;
use weft_core::wire::{self, FrameKind, Header, HEADER_LEN};
use weft_core::{Error, Result};

use crate::tls::HsStream;

/// An outgoing frame: header, payload buffers, how much is written, and
/// what to do once it is.
#[derive(Debug)]
pub struct TxFrame {
    pub hdr: Header,
    pub enc: [u8; HEADER_LEN],
    pub payload: Iov,
    /// Encoded `Ack` frames that were waiting for the next write to the
    /// peer (see `Conn::answer`): they go out first, in the same `writev`.
    /// Boxed: most frames carry none, and a frame is moved several times
    /// on its way out.
    pub pre: Option<Box<[u8]>>,
    /// Only `pre`: the frame's own header is not written (a flush of
    /// waiting acks that found no frame to ride with).
    pub bare: bool,
    /// Bytes of `pre` + header + payload already written.
    pub written: usize,
    pub done: Option<OpDone>,
    /// Delivery-complete: the completion waits for the peer's Ack.
    pub wait_ack: bool,
    /// Holds one transmit credit, given back exactly once when the frame is
    /// written or fails. Only data frames take credits: control frames
    /// (Ack, Shutdown) are not the application's and must not consume its
    /// queue depth.
    pub credit: Credit,
    /// An RMA read request's read (or an atomic's pending answer),
    /// registered with the connection (by sequence number) when the
    /// frame is queued on it.
    pub read: Option<Box<crate::rma::PendingRead>>,
    /// A read answer's charge against the receive budget, given back
    /// when the frame is written or dropped.
    pub charge: Option<crate::admission::Charge>,
}

/// Whose transmit credit a frame holds.
#[derive(Debug)]
pub enum Credit {
    /// None: a control frame.
    None,
    /// One of its endpoint's (`EpShared::tx`).
    Ep,
    /// One of a scalable endpoint's transmit context, whose queue is its
    /// own (`scalable.rs`).
    Ctx(Arc<Credits>),
}

impl Credit {
    /// Whether the frame holds one.
    pub fn held(&self) -> bool {
        !matches!(self, Credit::None)
    }

    /// Gives it back to `ep`'s queue, or to the context's.
    pub fn give_back(&self, ep: &crate::endpoint::EpShared) {
        match self {
            Credit::None => {}
            Credit::Ep => ep.tx.release(1),
            Credit::Ctx(c) => c.release(1),
        }
    }
}

impl TxFrame {
    /// A data frame posted through a transmit context holds a credit of
    /// that context's `queue`, not of its endpoint's.
    pub fn charge_to(&mut self, queue: Option<&Arc<Credits>>) {
        if let Some(q) = queue {
            self.credit = Credit::Ctx(q.clone());
        }
    }

    pub fn new(hdr: Header, payload: Iov, done: Option<OpDone>) -> TxFrame {
        let wait_ack = hdr.flags & wire::FLAG_ACK_REQ != 0;
        let credit = if hdr.kind.is_some_and(FrameKind::is_data) {
            Credit::Ep
        } else {
            Credit::None
        };
        TxFrame {
            hdr,
            enc: [0; HEADER_LEN],
            payload,
            pre: None,
            bare: false,
            written: 0,
            done,
            wait_ack,
            credit,
            read: None,
            charge: None,
        }
    }

    /// The length a completion reports: the payload, less an RMA
    /// write's target prefix.
    pub fn op_len(&self) -> usize {
        let len = self.hdr.len as usize;
        if self.hdr.kind == Some(FrameKind::RmaWrite) {
            len.saturating_sub(wire::rma::TARGET_LEN)
        } else {
            len
        }
    }

    /// Waiting acks alone, written as they are.
    pub fn acks_only(pre: Vec<u8>) -> TxFrame {
        let mut f = TxFrame::new(Header::new(FrameKind::Ack), Iov::new(), None);
        f.pre = Some(pre.into_boxed_slice());
        f.bare = true;
        f
    }

    fn head(&self) -> &[u8] {
        if self.bare {
            &[]
        } else {
            &self.enc
        }
    }

    pub fn total_len(&self) -> usize {
        self.pre.as_ref().map_or(0, |p| p.len())
            + self.head().len()
            + self.payload.iter().map(|b| b.len()).sum::<usize>()
    }

    /// The unwritten remainder as I/O slices (at most `max` of them).
    #[inline]
    pub fn slices<'a>(&'a self, out: &mut [IoSlice<'a>]) -> usize {
        match &self.pre {
            None => fill(
                out,
                self.written,
                std::iter::once(&self.enc[..]).chain(self.payload.iter().map(|b| &b[..])),
            ),
            Some(pre) => fill(
                out,
                self.written,
                [&pre[..], self.head()]
                    .into_iter()
                    .chain(self.payload.iter().map(|b| &b[..])),
            ),
        }
    }
}

/// Fills `out` with `parts` less their first `skip` bytes; returns how
/// many slices it filled.
fn fill<'a>(
    out: &mut [IoSlice<'a>],
    mut skip: usize,
    parts: impl Iterator<Item = &'a [u8]>,
) -> usize {
    let mut n = 0;
    for p in parts {
        if n >= out.len() {
            break;
        }
        if skip >= p.len() {
            skip -= p.len();
            continue;
        }
        out[n] = IoSlice::new(&p[skip..]);
        n += 1;
        skip = 0;
    }
    n
}

/// Writes one control frame (handshake; not on the hot path) within
/// `deadline`: a peer that never reads must not hold the task.
pub async fn write_frame(
    s: &mut HsStream,
    hdr: Header,
    payload: &[u8],
    deadline: Duration,
) -> Result<()> {
    let mut h = hdr;
    h.len = payload.len() as u64;
    // One write: a header and its payload written apart are two small
    // segments, and Nagle holds the second until the peer's delayed ACK
    // (40 ms) whenever the peer waits for the whole frame before it
    // answers, as every handshake step does.
    let mut b = Vec::with_capacity(HEADER_LEN + payload.len());
    b.extend_from_slice(&h.encode());
    b.extend_from_slice(payload);
    let fut = async {
        s.write_all(&b).await?;
        Ok::<(), Error>(())
    };
    tokio::time::timeout(deadline, fut)
        .await
        .map_err(|_| Error::TimedOut)?
}

/// Reads one control frame of the expected kind within `deadline`.
pub async fn read_frame(
    s: &mut HsStream,
    expect: FrameKind,
    deadline: Duration,
) -> Result<(Header, Vec<u8>)> {
    read_frame_of(s, &[expect], deadline).await
}

/// [`read_frame`] of any kind in `expect`. On a plain stream, a TLS
/// ClientHello where a frame should be is answered with a TLS alert and
/// is `NoProtoOpt`.
pub async fn read_frame_of(
    s: &mut HsStream,
    expect: &[FrameKind],
    deadline: Duration,
) -> Result<(Header, Vec<u8>)> {
    let fut = async {
        let mut b = [0u8; HEADER_LEN];
        s.read_exact(&mut b).await?;
        let h = match wire::decode(&b, 0) {
            Ok(h) => h,
            Err(e) => {
                // A TLS peer of a plain endpoint is told so, in TLS.
                if let Some(e) = s.refuse_if_tls(&b, deadline).await {
                    return Err(e);
                }
                return Err(e.into());
            }
        };
        if !h.kind.is_some_and(|k| expect.contains(&k)) {
            return Err(Error::Io);
        }
        let mut p = vec![0u8; h.len as usize];
        s.read_exact(&mut p).await?;
        Ok((h, p))
    };
    tokio::time::timeout(deadline, fut)
        .await
        .map_err(|_| Error::TimedOut)?
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use bytes::Bytes;

    #[test]
    fn only_data_frames_hold_a_credit() {
        for k in [
            FrameKind::Msg,
            FrameKind::Tagged,
            FrameKind::RmaWrite,
            FrameKind::RmaReadReq,
        ] {
            assert!(TxFrame::new(Header::new(k), Iov::new(), None).credit.held());
        }
        for k in [
            FrameKind::Ack,
            FrameKind::Shutdown,
            FrameKind::Hello,
            FrameKind::RmaReadResp,
        ] {
            assert!(!TxFrame::new(Header::new(k), Iov::new(), None).credit.held());
        }
    }

    #[test]
    fn slices_resume_where_writing_stopped() {
        let mut f = TxFrame::new(
            Header::new(FrameKind::Msg),
            Iov::from_vec(vec![
                Bytes::from_static(b"abc"),
                Bytes::from_static(b"defg"),
            ]),
            None,
        );
        f.enc = f.hdr.encode();
        assert_eq!(f.total_len(), HEADER_LEN + 7);
        f.written = HEADER_LEN + 4;
        let mut out = [IoSlice::new(&[]); 8];
        let n = f.slices(&mut out);
        let rest: Vec<u8> = out[..n].iter().flat_map(|s| s.iter().copied()).collect();
        assert_eq!(rest, b"efg");
        f.written = 10;
        let mut one = [IoSlice::new(&[])];
        assert_eq!(f.slices(&mut one), 1);
        assert_eq!(one[0].len(), HEADER_LEN - 10);
    }
}
