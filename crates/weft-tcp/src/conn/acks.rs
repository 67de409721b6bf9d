//! Acknowledgements: acks owed to the peer (riding with the next frame),
//! completions waiting for the peer's, and RMA reads waiting for their answer.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use weft_core::completion::CqEntry;
use weft_core::sync::lock;
use weft_core::wire::{FrameKind, Header, FLAG_ACK_REQ};
use weft_core::Error;

use super::Conn;
use crate::frame::TxFrame;
use crate::rma::PendingRead;

impl Conn {
    /// The peer acknowledged delivery of `seq` (`status` 0 or an error code).
    pub fn on_ack(&self, seq: u64, status: u64) {
        let done = lock(&self.acks).remove(&seq);
        if let Some((d, len)) = done {
            match Error::from_code(status as i32) {
                None if status == 0 => d.complete(CqEntry {
                    len,
                    ..CqEntry::default()
                }),
                Some(e) => d.fail_with(e),
                None => d.fail_with(Error::RemoteIo),
            }
        }
    }

    /// Sends an acknowledgement for a delivered frame.
    pub fn send_ack(self: &Arc<Self>, hdr: &Header, status: u64) {
        if hdr.flags & FLAG_ACK_REQ == 0 {
            return;
        }
        self.answer(hdr.seq, status);
    }

    /// Answers `seq` with an `Ack` carrying `status` (an RMA write's
    /// answer, which every write gets, or a delivery-complete send's).
    ///
    /// The ack is not written at once: it waits for the next frame to the
    /// peer and goes out in the same `writev`. In a request/response
    /// exchange (a write answered by a write) that halves the system calls
    /// on both sides. Only receive progress calls this, and every driver
    /// of it sends what waits soon after (see [`Conn::flush_acks`]): the
    /// reader task at the end of its pass, a spinning or inline pass at
    /// the start of the next one, and the endpoint's ack timer once an
    /// inline waiter has let go.
    pub fn answer(&self, seq: u64, status: u64) {
        let mut h = Header::new(FrameKind::Ack);
        h.seq = seq;
        h.data = status;
        let mut g = lock(&self.tx);
        if g.closed.is_none() {
            g.acks_out.extend_from_slice(&h.encode());
            self.acks_pending.store(true, Ordering::Release);
        }
    }

    /// Whether acks wait for a frame to ride with (a hint: the transmit
    /// state is what counts).
    #[inline]
    pub fn acks_waiting(&self) -> bool {
        self.acks_pending.load(Ordering::Acquire)
    }

    /// Sends the acks that wait, on their own. Returns whether there were
    /// any. Inlined: every pass of every driver asks, and mostly there
    /// are none.
    #[inline]
    pub fn flush_acks(self: &Arc<Self>) -> bool {
        self.acks_waiting() && self.send_waiting_acks()
    }

    #[inline(never)]
    fn send_waiting_acks(self: &Arc<Self>) -> bool {
        let pre = {
            let mut g = lock(&self.tx);
            self.acks_pending.store(false, Ordering::Release);
            if g.acks_out.is_empty() {
                return false;
            }
            std::mem::take(&mut g.acks_out)
        };
        self.send(TxFrame::acks_only(pre));
        true
    }

    /// Takes the read that request `seq` made, while its answer arrives.
    pub fn take_read(&self, seq: u64) -> Option<Box<PendingRead>> {
        lock(&self.reads).remove(&seq)
    }

    /// Puts back a read whose answer has more to come. On a connection
    /// that died meanwhile it fails instead, as the others did.
    pub fn put_read(&self, seq: u64, r: Box<PendingRead>) {
        if self.is_dead() {
            (*r).fail(Error::ConnReset);
            return;
        }
        lock(&self.reads).insert(seq, r);
    }
}
