//! Posting a send: the checks every send passes, the direct write into
//! the ring when nothing is queued ahead, and the peer's queue otherwise.
//! A child of `tx` so that it reaches the peer's ring helpers without
//! widening their visibility.

use weft_core::av::shared::lock_synced;
use weft_core::flags::OpFlags;
use weft_core::provider::{Iov, SendReq};
use weft_core::sync::lock;

use super::*;

/// The last destination a send resolved, under the peers' lock: its AV
/// handle and the AV version of the lookup, the address and the key
/// handle to prove there. A run of sends to one peer (every ping-pong)
/// only reads the AV's version (`EpShared::av_version`): the lookup and
/// the copy of the address were about 140 instructions of a 64 B send.
#[derive(Debug)]
pub struct LastDest {
    handle: FiAddr,
    version: u64,
    addr: Addr,
    proves: Option<FiAddr>,
    /// Where its peer is in the peers' map, once found there.
    place: Option<crate::by_addr::Place>,
}

/// What [`EpShared::offer`] made of a send.
pub enum Offered {
    /// Written into the peer's ring: the send of this many bytes ends
    /// (it took no slot of the transmit queue).
    Sent(usize),
    /// For the queue's path ([`EpShared::send_queued`]).
    Queue(Queue),
}

/// A send for the queue's path: its destination, the key handle to prove
/// there, its record flags and length.
pub struct Queue {
    addr: Addr,
    proves: Option<FiAddr>,
    flags: u32,
    len: usize,
}

impl EpShared {
    /// The checks of a send, then the send itself when it is plain and
    /// nothing waits ahead of it. Checks happen first: a message over
    /// `max_msg_size` or `inject_size` (with `FI_INJECT`) is `MsgSize`,
    /// too many buffers `Inval`, no AV `NoAv`, an address not in the AV
    /// `AddrNotAvail`, a key not held `NoKey`, a full queue `Again` (the
    /// order of [`admit`](Self::admit)). The request is looked at by
    /// reference: the endpoint's `post_send` keeps it until its end, as
    /// moving it into a call copies all of it.
    #[inline(always)]
    pub fn offer(&self, req: &SendReq) -> Result<Offered> {
        let len = req.len();
        let inject = req.flags.contains(OpFlags::INJECT);
        if len > self.max_msg || (inject && len > self.inject) {
            return Err(Error::MsgSize);
        }
        if req.iov.len() > self.iov_limit {
            return Err(Error::Inval);
        }
        // Lock order: the peers, then the AV (in `dest_cached`). Nothing
        // takes them the other way round: the AV calls no provider code
        // while it holds its lock.
        let mut peers = lock(&self.peers);
        let Peers { map, last, .. } = &mut *peers;
        let d = self.dest_cached(last, req.dest)?;
        // A send written into the ring below ends at once: it needs a free
        // slot of the transmit queue but never holds one, so it takes
        // none (taking and giving back were two atomic read-modify-writes
        // a send). The queue's path takes its slot below.
        if self.tx.left() == 0 {
            return Err(Error::Again);
        }
        let flags = if req.tag.is_some() { F_TAGGED } else { 0 }
            | if req.data.is_some() { F_DATA } else { 0 };
        let plain = !req
            .flags
            .intersects(OpFlags::DELIVERY_COMPLETE | OpFlags::FENCE);
        // Straight into the ring of a peer already sent to, when nothing
        // waits ahead of it and one record below CMA's window takes it:
        // no `Out` built and moved through the queue's path, no list of
        // what ended (about 400 of a 64 B send's instructions,
        // `docs/benchmarks.md`). Every other case (a first send, a claim,
        // a key, a full ring, a freed channel) takes the queue's path.
        if plain && len < crate::cma::CMA_MIN {
            if !d.place.is_some_and(|p| map.holds(p)) {
                d.place = map.place_of(&d.addr);
            }
            if let Some(peer) = d.place.and_then(|p| map.get_at(p)) {
                let ok = peer.queue.is_empty() && peer.proves == d.proves && peer.alive_now();
                if ok
                    && peer.write_whole(
                        flags,
                        req.tag.unwrap_or(0),
                        req.data.unwrap_or(0),
                        &req.iov,
                        len,
                    )
                {
                    return Ok(Offered::Sent(len));
                }
            }
        }
        if !self.tx.try_take() {
            return Err(Error::Again);
        }
        Ok(Offered::Queue(Queue {
            addr: d.addr.clone(),
            proves: d.proves,
            flags,
            len,
        }))
    }

    /// The destination of AV handle `dest`, from `last` when it is the
    /// handle resolved last and the AV has not changed since
    /// ([`av_version`](Self::av_version)), else looked
    /// up into `last`: [`dest`](Self::dest)'s answers.
    #[inline(always)]
    fn dest_cached<'a>(
        &self,
        last: &'a mut Option<LastDest>,
        dest: FiAddr,
    ) -> Result<&'a mut LastDest> {
        let av = self.cfg.av.as_ref().ok_or(Error::NoAv)?;
        let now = self.av_version(av);
        if !matches!(last, Some(l) if l.handle == dest && l.version == now) {
            // The version read again under the lock: the lookup is
            // valid for that one (the AV may have changed since `now`).
            let t = lock_synced(av);
            let version = t.version();
            let (b, key) = t.lookup_keyed(dest).map_err(|_| Error::AddrNotAvail)?;
            let addr = Addr::from_slice(crate::name::canonical(b));
            drop(t);
            let proves = self.keys.for_dest(key)?;
            *last = Some(LastDest {
                handle: dest,
                version,
                addr,
                proves,
                place: None,
            });
        }
        last.as_mut().ok_or(Error::AddrNotAvail)
    }

    /// A send [`offer`](Self::offer) did not write: into the peer's
    /// queue (or written by it at once, when the ring takes it).
    pub fn send_queued(&self, req: SendReq, q: Queue) {
        let o = Out {
            flags: q.flags,
            tag: req.tag.unwrap_or(0),
            data: req.data.unwrap_or(0),
            iov: req.iov,
            len: q.len,
            off: 0,
            started: false,
            dc: req.flags.contains(OpFlags::DELIVERY_COMPLETE),
            cma: false,
            lead: None,
            done: Some(req.done),
            fence: req.flags.contains(OpFlags::FENCE),
            answer: None,
            proves: q.proves,
            direct: None,
        };
        self.enqueue(&q.addr, o, None);
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
        self.enqueue_if(addr, o, pending, None, |_| true);
    }

    /// Sends the answer `o` to the endpoint at `addr` if that is the
    /// instance `by` (whose request it answers); else drops it: no
    /// operation of the endpoint now holding the name waits for it
    /// (`EpShared::answer`) — unless our record maps a gone instance
    /// ([`enqueue_renewed`](Self::enqueue_renewed)).
    pub fn enqueue_answer(&self, addr: &[u8], o: Out, by: Option<crate::live::Instance>) {
        self.enqueue_if(addr, o, None, by, |p| by == Some(p.instance()));
    }

    /// [`enqueue`](Self::enqueue) if the peer at `addr` passes `ok`;
    /// else `o` is dropped (an answer: nothing waits for it here). `by`:
    /// the instance an answer is for.
    #[inline]
    fn enqueue_if(
        &self,
        addr: &[u8],
        o: Out,
        pending: Option<crate::rma::Pending>,
        by: Option<crate::live::Instance>,
        ok: impl Fn(&Peer) -> bool,
    ) {
        let mut guard = lock(&self.peers);
        let peers = &mut *guard;
        // Filled in place: returned, it was copied out on every send.
        let mut after = AfterEnqueue::default();
        // One lookup of a known peer: hashing the address twice (whether
        // it is there, then to take it) was a tenth of a send.
        match peers.map.get_mut(addr) {
            Some(peer) if !ok(peer) => {
                // The instance answered holds the name: the record's has
                // certainly left it, whatever `alive` could not tell
                // (a lock test that failed for want of resources).
                if peer.alive()
                    && by.is_none_or(|b| crate::live::instance_of_name(&peer.name) != Some(b))
                {
                    tracing::debug!("shm: an answer for an instance gone from its name; dropped");
                    return;
                }
                self.enqueue_renewed(peers, addr, o, ok, &mut after);
            }
            Some(peer) => self.enqueue_to(peer, o, pending, &mut peers.next_seq, &mut after),
            None => match crate::name::parse(addr).and_then(|n| self.open_peer(n)) {
                Ok(p) if !ok(&p) => {
                    tracing::debug!("shm: an answer for an instance gone from its name; dropped");
                    return;
                }
                Ok(mut p) => {
                    self.enqueue_to(&mut p, o, pending, &mut peers.next_seq, &mut after);
                    peers.map.insert(addr, p);
                }
                Err(e) => {
                    drop(guard);
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
        drop(guard);
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

    /// The answer `o` for the instance now under the name of `addr`,
    /// whose record still maps another, gone one: the claim's look
    /// (`rx::lifecycle::forget_if_gone`) saw that one still alive (it
    /// died or closed just after). Its record goes here as at the sweep
    /// (what waited there fails, `FI_ECONNRESET`), and one is made anew
    /// for the name — else every answer to the new instance would be
    /// dropped for as long as our record stayed. Rare: off the hot path.
    #[cold]
    #[inline(never)]
    fn enqueue_renewed(
        &self,
        peers: &mut Peers,
        addr: &[u8],
        o: Out,
        ok: impl Fn(&Peer) -> bool,
        after: &mut AfterEnqueue,
    ) {
        if let Some(mut old) = peers.map.remove(addr) {
            old.fail_all(Error::ConnReset, &mut after.ended);
            // As at the sweep: its segment goes if still its own (a
            // crash left it). Under the peers' lock, but this path is
            // rare and a few syscalls long.
            crate::live::remove_if_owned(&old.name, old.instance());
        }
        match crate::name::parse(addr).and_then(|n| self.open_peer(n)) {
            Ok(mut p) if ok(&p) => {
                self.enqueue_to(&mut p, o, None, &mut peers.next_seq, after);
                peers.map.insert(addr, p);
            }
            _ => tracing::debug!("shm: an answer for an instance gone from its name; dropped"),
        }
    }

    /// [`enqueue`](Self::enqueue) to `peer`, under the peers' lock,
    /// noting in `after` what is left to do once it is released.
    fn enqueue_to(
        &self,
        peer: &mut Peer,
        mut o: Out,
        pending: Option<crate::rma::Pending>,
        seq: &mut u64,
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
        let claimed = if !gated && peer.queue.is_empty() {
            peer.claim(self.instance(), &self.name, &self.keys)
        } else {
            Ok(false)
        };
        let claimed = match claimed {
            Ok(c) => c,
            // No claim can be made (the peer's segment gone from its
            // name, claim locks refused): this send fails, and so does
            // what waits; the record goes, and the next send opens the
            // peer anew (refused if it is gone).
            Err(e) => {
                peer.fail_all(e, &mut after.ended);
                after.ended.push((o.done, len, Err(e)));
                if let Some(p) = o.answer.take() {
                    let p = *p;
                    after.ended.push((Some(p.done), p.len, Err(e)));
                }
                after.forget = true;
                return;
            }
        };
        if claimed {
            peer.begin(&mut o, seq);
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
