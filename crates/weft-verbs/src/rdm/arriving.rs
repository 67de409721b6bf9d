//! The places of messages still arriving into a dropped multi-receive
//! stream, so that they come back in their sender's order.
//!
//! A dropped stream gives back, in buffer order, the messages it holds
//! and has not yielded (`give_back_after`), then withdraws its buffer
//! (`cancel`). On tcp a sender has at most one message arriving at a
//! time, its last, so one still arriving can simply follow the others
//! when it is whole. Here a large message is read by RDMA while the
//! sender's later, small ones land whole before it: given back as they
//! come, a small one would pass the large one ahead of it, and the
//! sender's next messages could too.
//!
//! So every part of an awaited buffer whose message is being read is
//! registered ([`Guard`], held by its read job). Once its stream is gone,
//! its place is taken when the messages after it in the buffer are given
//! back (or at the withdrawal, for those after every given-back one): a
//! placeholder (an [`rx::Pull`], as for a message being pulled) goes to
//! the oldest posted receive that accepts it or ahead of every buffered
//! message, behind those given back before it. The receive that takes it
//! waits for its bytes; the read's completion, given back in turn, fills
//! it. A read that ends without a message (its connection died, the
//! message was truncated) fails the placeholder, which withdraws it (its
//! receive goes on to the next message).
//!
//! Only the drop of a stream takes the places of its parts until it has
//! given back what its slots held (a give-back of its own takes those
//! before the message given back; the sink says when it is done,
//! `MultiSink::given_back`, and its withdrawal takes the rest). Taken
//! by anyone else meanwhile — a cancel, a give-back of another buffer on
//! another thread — a later part's placeholder would pass an earlier
//! message of the same sender that the drop had still to give back.
//!
//! Every part of an awaited buffer cut off the CQ path (for a
//! placeholder, or a given-back message, delivered once the lock is let
//! go while the CQ goes on dispatching its sender's later messages) is
//! registered in the hold of the registry's lock that cut it; a part cut
//! on the CQ path (a read started) is registered just after, before the
//! next completion is dispatched, and gets its place then if its
//! stream's drop ran in between. Parts cut when a buffer is posted
//! either take a whole message, delivered before the stream exists
//! (nothing can drop it meanwhile), or wait for a read or a pull, and
//! register when that starts (`start_read`, `Pull::matched`).
//! Zero-length parts are not registered (they share the address of the
//! next part cut).
//!
//! A part's message that reaches its stream's reader is no longer
//! arriving: the part leaves the registry in the same hold of the
//! registry's lock as its completion goes into the stream
//! ([`deliver_registered`]). Unregistered only when its read job ended,
//! a part whose message the reader had already taken could be given a
//! placeholder by a drop of the stream meanwhile: a phantom message at
//! the head of the unexpected queue (charged, seen by the matcher)
//! until the job's end withdrew it.
//!
//! On a scalable endpoint all of this is the receive context's: its
//! parts register with it (the read job and the pull run on the context),
//! its dropped streams give back to it, and a placeholder is owned by it
//! ([`rx::Pull::held_on`]), so the read's end, polled by the endpoint's
//! CQ driver, fills it on the context it was cut on.

use std::cell::Cell;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};

use weft_core::addr::FiAddr;
use weft_core::completion::Returned;
use weft_core::credits::Credits;
use weft_core::multi_recv::MultiShared;
use weft_core::provider::RecvReq;
use weft_core::recv_completion::RecvCtx;
use weft_core::sync::lock;
use weft_core::tagmatch::MsgInfo;
use weft_core::Error;

use super::{multi, rx, RdmShared, Unexp};

/// A part of an awaited buffer whose message is being read.
#[derive(Debug)]
pub(crate) struct Arriving {
    /// Where the part starts: parts are cut in buffer order.
    addr: usize,
    buffer: Arc<MultiShared>,
    info: MsgInfo,
    from: SocketAddr,
    /// Its placeholder, once its stream is gone and its place taken.
    held: Mutex<Option<Arc<rx::Pull>>>,
}

/// Keeps a part registered while its read job lives; dropping it (the
/// job ended, whichever way) unregisters the part, failing a placeholder
/// that nothing filled.
pub(crate) struct Guard {
    ep: Weak<RdmShared>,
    part: Arc<Arriving>,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("addr", &self.part.addr)
            .finish()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let Some(ep) = self.ep.upgrade() else {
            return;
        };
        lock(&ep.arriving).retain(|p| !Arc::ptr_eq(p, &self.part));
        let Some(pull) = lock(&self.part.held).take() else {
            return;
        };
        if ep.is_closed() {
            return;
        }
        // A job may end under the peers' lock, which the placeholder's
        // end may need (its receive going back to the matcher).
        let rt = ep.rt.clone();
        rt.spawn(async move { pull.finish(&ep, Err(Error::ConnReset)) });
    }
}

impl RdmShared {
    /// Registers `req`, a part about to be read into, if it is a part of
    /// an awaited buffer (`None` otherwise). A part is cut before it is
    /// registered, with no lock held in between: if its stream's drop ran
    /// meanwhile (to its end: nobody took this part's place), its place
    /// is taken now, ahead of its sender's messages still to come.
    pub(crate) fn register_arriving(
        &self,
        req: &RecvReq,
        info: MsgInfo,
        from: SocketAddr,
    ) -> Option<Guard> {
        let mut placed = Placed::default();
        let guard = {
            let mut g = lock(&self.arriving);
            let guard = self.register_cut(&mut g, req, info, from)?;
            if guard.part.buffer.is_drained() {
                self.hold_places(&mut g, None, &mut placed);
            }
            guard
        };
        placed.finish(self);
        Some(guard)
    }

    /// The guard of a registry entry for `req` (its `part`), if `req` is
    /// a part of an awaited buffer; not yet registered.
    fn new_part(&self, req: &RecvReq, info: MsgInfo, from: SocketAddr) -> Option<Guard> {
        let buffer = weft_core::multi_recv::buffer_of(req).filter(|b| b.is_awaited())?;
        // A zero-length part is not registered: it lies at the address
        // of the next part cut (parts are found by address). Only a
        // zero-byte buffer's part waits for bytes (a pulled message
        // truncated into it), and that one then holds no place.
        let addr = req.bufs.first().filter(|b| !b.is_empty())?.as_ptr() as usize;
        let part = Arc::new(Arriving {
            addr,
            buffer,
            info,
            from,
            held: Mutex::new(None),
        });
        Some(Guard {
            ep: self.me.clone(),
            part,
        })
    }

    /// Takes the places of the parts of dropped streams still arriving
    /// that lie before `before` in its buffer, and of every part of the
    /// other dropped streams whose drop has given back what their slots
    /// held (with `None`, only the latter), in buffer order. Called with the
    /// registry's lock held, which orders this with the messages given
    /// back around it; what the placeholders are matched to is done by
    /// [`Placed::finish`] once that lock is let go.
    ///
    /// A message given back from a buffer comes after every earlier slot
    /// of it was settled (the drop closes the slots in order, giving
    /// back what each holds), so an earlier part still registered will
    /// not reach its slot. A stream still being drained is left alone by
    /// everyone else (a cancel, another buffer's give-back on another
    /// thread): a later part of it placed then would pass the earlier
    /// messages its drop has still to give back.
    ///
    /// A placeholder a receive takes is a part of that receive's buffer
    /// too when it is awaited: registered here, in the same hold, so that
    /// a drop of that stream never finds it cut and unregistered.
    fn hold_places(&self, reg: &mut Vec<Arc<Arriving>>, before: Option<usize>, out: &mut Placed) {
        let settled = |p: &Arriving| match before {
            Some(b) if p.buffer.holds(b) => p.addr < b,
            _ => p.buffer.is_drained(),
        };
        let mut due: Vec<Arc<Arriving>> = reg
            .iter()
            .filter(|p| p.buffer.is_abandoned() && settled(p))
            .filter(|p| lock(&p.held).is_none())
            .cloned()
            .collect();
        due.sort_by_key(|p| p.addr);
        if due.is_empty() {
            return;
        }
        // One hold of the matcher for them all: an arrival matched
        // between two placeholders of its sender would pass the second.
        let mut m = lock(&self.side.matcher);
        for p in due {
            // Owned by this endpoint (a receive context: the one the
            // part was cut on), where its read's end fills it.
            let pull = rx::Pull::held_on(
                self,
                super::Sender {
                    addr: p.from,
                    key: p.info.key,
                },
            );
            *lock(&p.held) = Some(pull.clone());
            match multi::match_arrival(&mut m, &p.info, &mut out.ended) {
                // No bytes yet: the receive will wait for them.
                Some(req) => {
                    let part = self.register_cut(reg, &req, p.info, p.from);
                    out.matched.push((pull, req, p.info, part));
                }
                None => m.push_unexpected_front_after(
                    self.src(p.from, p.info.key),
                    p.info,
                    self.held_forced(Unexp::Pull(pull), p.info.len),
                ),
            }
        }
    }

    /// `give_back_after`: a message of a dropped stream. The places of
    /// the parts before it still arriving are taken first; if it is one
    /// of those, it fills its placeholder. Its own place is decided under
    /// the registry's lock too, so that a message given back at the same
    /// time from another thread (one still arriving when its slot was
    /// closed) cannot pass it.
    pub(crate) fn give_back_in_order(&self, r: Returned) {
        self.give_back_of(r, None);
    }

    /// [`give_back_in_order`](Self::give_back_in_order) of the message of
    /// `part` when the caller knows it; else the part is the registered
    /// one at the message's address. Only parts with room register
    /// (`new_part`), and those never share an address; a zero-length
    /// part shares its address with the next part cut, so a zero-length
    /// message is never taken for a registered part's.
    fn give_back_of(&self, r: Returned, part: Option<&Arc<Arriving>>) {
        if self.is_closed() {
            return;
        }
        let first = r.entry.bufs.first();
        let addr = first.map(|b| b.as_ptr() as usize);
        let whole = first.is_some_and(|b| !b.is_empty());
        let mut placed = Placed::default();
        let (fill, deliver) = {
            let mut g = lock(&self.arriving);
            self.hold_places(&mut g, addr, &mut placed);
            let own = g
                .iter()
                .position(|p| match part {
                    Some(q) => Arc::ptr_eq(p, q),
                    None => whole && Some(p.addr) == addr,
                })
                .map(|i| g.swap_remove(i));
            match own.and_then(|p| lock(&p.held).take()) {
                Some(pull) => (Some((pull, r)), None),
                None => (None, self.put_back_registered(&mut g, r, true)),
            }
        };
        placed.finish(self);
        if let Some((pull, mut r)) = fill {
            pull.finish(self, Ok(r.take_bytes()));
        }
        if let Some(d) = deliver {
            d.deliver(self);
        }
    }

    /// [`put_back`](Self::put_back) under the registry's lock (`reg`): a
    /// receive that takes the message and is a part of an awaited buffer
    /// is registered in the same hold, so that a drop of its stream
    /// before the delivery holds its place (its message, on its way,
    /// would otherwise come back behind its sender's later ones).
    pub(crate) fn put_back_registered(
        &self,
        reg: &mut Vec<Arc<Arriving>>,
        r: Returned,
        after: bool,
    ) -> Option<GivenTo> {
        let (req, info, data, from) = self.put_back(r, after)?;
        let part = self.register_cut(reg, &req, info, from.addr);
        Some(GivenTo {
            req,
            info,
            data,
            from,
            part,
        })
    }

    /// Registers in `reg` (the registry, its lock held) `req`, a part just
    /// cut for a message whose bytes are to come, if it is a part of an
    /// awaited buffer.
    fn register_cut(
        &self,
        reg: &mut Vec<Arc<Arriving>>,
        req: &RecvReq,
        info: MsgInfo,
        from: SocketAddr,
    ) -> Option<Guard> {
        let guard = self.new_part(req, info, from)?;
        reg.push(guard.part.clone());
        Some(guard)
    }

    /// The places of the dropped streams' parts still arriving here that
    /// lie before `before` in their buffer: a message of such a stream
    /// given back at another endpoint bound to the same shared context
    /// must not pass them.
    pub(crate) fn hold_places_before(&self, before: Option<usize>) {
        let mut placed = Placed::default();
        {
            let mut g = lock(&self.arriving);
            if g.is_empty() {
                return;
            }
            self.hold_places(&mut g, before, &mut placed);
        }
        placed.finish(self);
    }

    /// A stream's buffer withdrawn (or any cancel): the places of the
    /// dropped streams' parts still arriving are taken, behind every
    /// message given back before.
    pub(crate) fn hold_all_places(&self) {
        self.hold_places_before(None);
    }
}

/// Completes a receive through `deliver`: when `guard` registers it (a
/// part of an awaited buffer), under the registry's lock, the part
/// leaving the registry in that same hold unless the delivery gave its
/// message back. Whether it did is decided by the stream's slot, which a
/// drop closes after giving back what the slots before it held and
/// before anyone may take the part's place (`hold_places`): so a part
/// whose message its reader has is never given a placeholder, and a
/// part with a placeholder finds its slot closed. A message given back
/// comes out of the delivery and goes back once the lock is let go
/// (giving back takes it), the part still registered, so that it fills
/// its placeholder if one holds its place.
pub(crate) fn deliver_registered(
    ep: &RdmShared,
    guard: Option<Guard>,
    deliver: impl FnOnce(&dyn RecvCtx),
) {
    let Some((guard, reg)) = guard.and_then(|g| g.ep.upgrade().map(|r| (g, r))) else {
        deliver(ep);
        return;
    };
    let ctx = Deferring {
        ep,
        back: Cell::new(Vec::new()),
    };
    let back = {
        let mut g = lock(&reg.arriving);
        deliver(&ctx);
        let back = ctx.back.into_inner();
        if back.is_empty() {
            g.retain(|p| !Arc::ptr_eq(p, &guard.part));
        }
        back
    };
    // Given back where the part was registered: its place is kept there.
    for (r, after) in back {
        if after {
            reg.give_back_of(r, Some(&guard.part));
        } else {
            reg.take_back(r, false);
        }
    }
    drop(guard);
}

/// The endpoint as a delivery under the registry's lock sees it: what it
/// would give back is kept, for [`deliver_registered`] to give back once
/// that lock is let go (giving back takes it).
struct Deferring<'a> {
    ep: &'a RdmShared,
    /// Messages to give back, and whether each goes behind those given
    /// back before it.
    back: Cell<Vec<(Returned, bool)>>,
}

impl Deferring<'_> {
    fn keep(&self, r: Returned, after: bool) {
        let mut v = self.back.take();
        v.push((r, after));
        self.back.set(v);
    }
}

impl RecvCtx for Deferring<'_> {
    fn rx_credits(&self) -> &Credits {
        RecvCtx::rx_credits(self.ep)
    }

    fn reported_addr(&self, a: FiAddr) -> FiAddr {
        RecvCtx::reported_addr(self.ep, a)
    }

    fn give_back(&self, r: Returned) {
        self.keep(r, false);
    }

    fn give_back_after(&self, r: Returned) {
        self.keep(r, true);
    }
}

/// A given-back message and the receive that took it, registered if a
/// part of an awaited buffer: delivered with no lock held.
pub(crate) struct GivenTo {
    req: RecvReq,
    info: MsgInfo,
    data: bytes::Bytes,
    from: super::Sender,
    part: Option<Guard>,
}

impl GivenTo {
    pub(crate) fn deliver(self, ep: &RdmShared) {
        rx::copy_and_deliver_registered(ep, self.req, self.info, &self.data, self.from, self.part);
    }
}

/// What taking places left to do with no lock held.
#[derive(Default)]
struct Placed {
    /// Placeholders and the receives that took them (registered, if
    /// parts of awaited buffers).
    matched: Vec<(Arc<rx::Pull>, RecvReq, MsgInfo, Option<Guard>)>,
    /// Buffers that ended without the message they were offered.
    ended: Vec<RecvReq>,
}

impl Placed {
    fn finish(self, ep: &RdmShared) {
        ep.end_buffers(self.ended);
        for (pull, req, info, part) in self.matched {
            pull.matched_as(ep, req, info, false, part);
        }
    }
}
