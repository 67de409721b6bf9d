//! Posting a send: the checks every send passes, the direct write into
//! the ring when nothing is queued ahead, and the peer's queue otherwise.
//! A child of `tx` so that it reaches the peer's ring helpers without
//! widening their visibility.

use weft_core::flags::OpFlags;
use weft_core::provider::{Iov, Rejected, SendReq};
use weft_core::sync::lock;

use super::*;

impl EpShared {
    /// Posts a send. Checks happen first: a message over `max_msg_size`
    /// or `inject_size` (with `FI_INJECT`) is `MsgSize`, too many
    /// buffers `Inval`, an address not in the AV `AddrNotAvail`, a full
    /// queue `Again`. A peer that cannot be reached fails the send's
    /// completion (`ConnRefused`).
    // Inlined into the endpoint's `post_send`: called, the request (a
    // few hundred bytes) was copied once more on every send.
    #[inline]
    pub fn send(&self, req: SendReq) -> std::result::Result<(), Rejected<SendReq>> {
        let len = req.len();
        let reject = |err, req| Err(Rejected { err, req });
        let inject = req.flags.contains(OpFlags::INJECT);
        let (addr, proves) = match self.admit(len, inject, req.iov.len(), req.dest) {
            Ok(d) => d,
            Err(e) => return reject(e, req),
        };
        let flags = if req.tag.is_some() { F_TAGGED } else { 0 }
            | if req.data.is_some() { F_DATA } else { 0 };
        let plain = !req
            .flags
            .intersects(OpFlags::DELIVERY_COMPLETE | OpFlags::FENCE);
        if plain && self.send_direct(&addr, proves, flags, &req, len) {
            finish(self, (Some(req.done), len, Ok(())));
            return Ok(());
        }
        let o = Out {
            flags,
            tag: req.tag.unwrap_or(0),
            data: req.data.unwrap_or(0),
            iov: req.iov,
            len,
            off: 0,
            started: false,
            dc: req.flags.contains(OpFlags::DELIVERY_COMPLETE),
            cma: false,
            lead: None,
            done: Some(req.done),
            fence: req.flags.contains(OpFlags::FENCE),
            answer: None,
            proves,
            direct: None,
        };
        self.enqueue(&addr, o, None);
        Ok(())
    }

    /// A send written straight into the ring of a peer already sent to,
    /// when nothing waits ahead of it and one record takes it: no `Out`
    /// built and moved through the queue's path, no list of what ended
    /// (about 400 of a 64 B send's instructions, `docs/benchmarks.md`).
    /// False: the send takes the queue's path, which handles every other
    /// case (a first send, a claim, a key, a full ring, a freed channel).
    fn send_direct(
        &self,
        addr: &[u8],
        proves: Option<FiAddr>,
        flags: u32,
        req: &SendReq,
        len: usize,
    ) -> bool {
        // Below CMA's window: always copied through the ring.
        if len >= crate::cma::CMA_MIN {
            return false;
        }
        let mut peers = lock(&self.peers);
        let Some(peer) = peers.map.get_mut(addr) else {
            return false;
        };
        let ok = peer.queue.is_empty() && peer.proves == proves && peer.alive_now();
        ok && peer.write_whole(
            flags,
            req.tag.unwrap_or(0),
            req.data.unwrap_or(0),
            &req.iov,
            len,
        )
    }

    /// An RMA request or response of `len` bytes from `iov`, led by
    /// `lead`.
    pub fn rma_out(lead: Lead, iov: Iov, len: usize) -> Out {
        Out {
            flags: 0,
            tag: 0,
            data: 0,
            iov,
            len,
            off: 0,
            started: false,
            dc: false,
            cma: false,
            lead: Some(Box::new(lead)),
            done: None,
            fence: false,
            answer: None,
            proves: None,
            direct: None,
        }
    }

    /// Sends `o` to the endpoint at `addr` (mapping its segment the
    /// first time), with `pending` waiting for its response when it is
    /// an RMA request: written now if the ring takes it, else queued in
    /// order. A peer that cannot be reached fails it (`ConnRefused`).
    pub fn enqueue(&self, addr: &[u8], o: Out, pending: Option<crate::rma::Pending>) {
        let mut peers = lock(&self.peers);
        // Filled in place: returned, it was copied out on every send.
        let mut after = AfterEnqueue::default();
        // One lookup of a known peer: hashing the address twice (whether
        // it is there, then to take it) was a tenth of a send.
        match peers.map.get_mut(addr) {
            Some(peer) => self.enqueue_to(peer, o, pending, &mut after),
            None => match crate::name::parse(addr).and_then(Peer::open) {
                Ok(mut p) => {
                    self.enqueue_to(&mut p, o, pending, &mut after);
                    peers.map.insert(addr, p);
                }
                Err(e) => {
                    drop(peers);
                    finish(self, (o.done, o.len, Err(e)));
                    if let Some(p) = pending {
                        finish(self, (Some(p.done), p.len, Err(e)));
                    }
                    return;
                }
            },
        }
        if after.forget {
            peers.map.remove(addr);
        }
        drop(peers);
        if after.refused {
            self.key_refused(addr);
        }
        for e in after.ended {
            finish(self, e);
        }
        if after.kick {
            self.tx_pending.store(true, Ordering::Release);
            self.kick.notify_one();
        }
    }

    /// [`enqueue`](Self::enqueue) to `peer`, under the peers' lock,
    /// noting in `after` what is left to do once it is released.
    fn enqueue_to(
        &self,
        peer: &mut Peer,
        mut o: Out,
        pending: Option<crate::rma::Pending>,
        after: &mut AfterEnqueue,
    ) {
        let len = o.len;
        if peer.chan.is_none() && peer.queue.is_empty() {
            peer.proves = o.proves;
        } else if peer.proves != o.proves {
            // The channel proves another key: this operation would cross
            // jobs (tcp's one connection per peer, likewise).
            after.ended.push((o.done, len, Err(Error::KeyRejected)));
            if let Some(p) = pending {
                after
                    .ended
                    .push((Some(p.done), p.len, Err(Error::KeyRejected)));
            }
            return;
        }
        let gated = o.fence && (peer.outstanding() || !peer.queue.is_empty());
        if !gated {
            o.fence = false;
        }
        if let Some(p) = pending {
            o.answer = Some(Box::new(p));
            // Flushing watches what waits for answers (a channel the
            // owner freed fails it).
            self.tx_pending.store(true, Ordering::Release);
        }
        if !peer.alive_now() {
            // The owner closed its endpoint: what waits fails, and so
            // does this send.
            peer.fail_all(Error::ConnReset, &mut after.ended);
            after.ended.push((o.done, len, Err(Error::ConnReset)));
            if let Some(p) = o.answer.take() {
                let p = *p;
                after
                    .ended
                    .push((Some(p.done), p.len, Err(Error::ConnReset)));
            }
            after.forget = true;
            return;
        }
        if !gated && peer.queue.is_empty() && peer.claim(self.me, &self.name, &self.keys) {
            peer.begin(&mut o);
            match peer.advance(&mut o) {
                Ok(true) => {
                    peer.written(o, &mut after.ended);
                    after.kick = after.ended.is_empty();
                    return;
                }
                Ok(false) => {}
                Err(e) => {
                    after.ended.push((o.done, len, Err(e)));
                    peer.fail_all(e, &mut after.ended);
                    after.refused = std::mem::take(&mut peer.refused);
                    return;
                }
            }
        }
        peer.queue.push_back(o);
        after.kick = true;
    }
}
