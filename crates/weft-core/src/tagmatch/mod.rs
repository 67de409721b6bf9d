//! Message matching for one receive context: posted receives against
//! arriving messages, and buffered unexpected messages against later
//! receives, with the rules of fi_tagged(3) and fi_msg(3).
//!
//! Tagged and untagged traffic never cross-match. A receive whose `src` is
//! [`FI_ADDR_UNSPEC`] accepts any sender; any other `src` is a directed
//! receive (`FI_DIRECTED_RECV`). Callers without that capability pass
//! `FI_ADDR_UNSPEC`, since directedness is the caller's policy, not the
//! matcher's.
//!
//! Ordering is exact: an arrival takes the first-posted receive that accepts
//! it, and a receive takes the oldest unexpected message it accepts. Both
//! sides are indexed so that exact-tag traffic never walks unrelated entries.

mod posted;
mod unexpected;

#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::fmt;
use std::hash::Hash;

use crate::addr::{FiAddr, FI_ADDR_NOTAVAIL, FI_ADDR_UNSPEC};
use crate::flags::OpFlags;
use crate::hash::FastMap;
use crate::{Error, Result};

use posted::PostedQueue;
use unexpected::UnexpectedQueue;

/// A spec for the posted queue to overwrite with the one of the receive
/// it takes.
const UNSET: RecvSpec = RecvSpec {
    src: FI_ADDR_UNSPEC,
    tagged: false,
    tag: 0,
    ignore: 0,
    context: 0,
    by_key: false,
};

/// A posted receive's matching criteria. `src == FI_ADDR_UNSPEC` matches any
/// source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvSpec {
    /// Directed source, or [`FI_ADDR_UNSPEC`] for any source.
    pub src: FiAddr,
    /// Tagged receive (`fi_trecv`) rather than untagged (`fi_recv`).
    pub tagged: bool,
    /// Tag to match (tagged receives only).
    pub tag: u64,
    /// Tag bits to ignore when matching (tagged receives only).
    pub ignore: u64,
    /// The operation context; cancel and claim refer to receives by it.
    pub context: u64,
    /// `src` is an authorization key handle (`FI_AUTH_KEY` on a directed
    /// receive): any sender whose connection proved that key matches.
    pub by_key: bool,
}

/// What is known about an arrived message. `src` is the handle the
/// receiver's AV gave the sender at arrival time ([`FI_ADDR_NOTAVAIL`] if
/// unknown then).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsgInfo {
    /// Sender's AV handle, or [`FI_ADDR_NOTAVAIL`].
    pub src: FiAddr,
    /// Sent as a tagged message.
    pub tagged: bool,
    /// The message tag (tagged messages only).
    pub tag: u64,
    /// Payload length in bytes.
    pub len: usize,
    /// Remote CQ data, if the sender attached any.
    pub data: Option<u64>,
    /// The AV key handle the sender's connection proved
    /// (`FI_AV_AUTH_KEY` endpoints), for receives directed by key. Key
    /// handles are below `MAX_AV_AUTH_KEYS`; 16 bits keep this struct,
    /// which every arrival moves, at its size without them.
    pub key: Option<u16>,
}

impl RecvSpec {
    /// Whether this receive would take a message like `info` (kind, tag
    /// and directed source). A message whose source was unknown when it
    /// arrived is taken to be acceptable: its source may be resolved by
    /// the time it is matched.
    pub fn accepts(&self, info: &MsgInfo) -> bool {
        if self.by_key {
            return kind_and_tag_ok(self, info) && info.key.map(FiAddr::from) == Some(self.src);
        }
        kind_and_tag_ok(self, info) && (src_ok(self.src, info.src) || info.src == FI_ADDR_NOTAVAIL)
    }

    /// Whether the receive takes a message of `info` from the sender
    /// with handle `src` (resolved now), by address or by key.
    fn takes_from(&self, info: &MsgInfo, src: FiAddr) -> bool {
        if self.by_key {
            info.key.map(FiAddr::from) == Some(self.src)
        } else {
            src_ok(self.src, src)
        }
    }
}

/// The tag rule of fi_tagged(3): bits set in `ignore` do not take part.
pub fn tag_matches(recv_tag: u64, ignore: u64, msg_tag: u64) -> bool {
    (recv_tag | ignore) == (msg_tag | ignore)
}

/// Whether `spec` accepts a message of this kind and tag, leaving the source
/// aside so that callers can resolve it only when it matters.
fn kind_and_tag_ok(spec: &RecvSpec, info: &MsgInfo) -> bool {
    spec.tagged == info.tagged && (!spec.tagged || tag_matches(spec.tag, spec.ignore, info.tag))
}

/// Whether a receive directed at `want` accepts a message from `src`.
fn src_ok(want: FiAddr, src: FiAddr) -> bool {
    want == FI_ADDR_UNSPEC || want == src
}

/// The sequence numbers under one index key. Almost always one (a tag, a
/// context in use once), so that case needs no allocation of its own; a
/// key shared by several entries falls back to an ordered set.
#[derive(Debug)]
pub(crate) enum Seqs {
    One(u64),
    Many(BTreeSet<u64>),
}

impl Seqs {
    fn first(&self) -> Option<u64> {
        match self {
            Seqs::One(s) => Some(*s),
            Seqs::Many(set) => set.first().copied(),
        }
    }

    /// In ascending order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &u64> + '_ {
        let (one, many) = match self {
            Seqs::One(s) => (Some(s), None),
            Seqs::Many(set) => (None, Some(set.iter())),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }

    fn insert(&mut self, seq: u64) {
        match self {
            Seqs::One(s) => {
                *self = Seqs::Many(BTreeSet::from([*s, seq]));
            }
            Seqs::Many(set) => {
                set.insert(seq);
            }
        }
    }

    /// Removes `seq`; true when nothing is left.
    fn remove(&mut self, seq: u64) -> bool {
        match self {
            Seqs::One(s) => *s == seq,
            Seqs::Many(set) => {
                set.remove(&seq);
                set.is_empty()
            }
        }
    }
}

/// Adds `seq` to the ordered set stored under `key`.
fn index_insert<K: Hash + Eq>(map: &mut FastMap<K, Seqs>, key: K, seq: u64) {
    match map.entry(key) {
        std::collections::hash_map::Entry::Occupied(mut e) => e.get_mut().insert(seq),
        std::collections::hash_map::Entry::Vacant(e) => {
            e.insert(Seqs::One(seq));
        }
    }
}

/// Removes `seq` from the set under `key`, dropping emptied sets so that
/// short-lived tags and contexts do not grow the map forever.
fn index_remove<K: Hash + Eq + Copy>(map: &mut FastMap<K, Seqs>, key: &K, seq: u64) {
    // One lookup for both the set and its removal.
    if let std::collections::hash_map::Entry::Occupied(mut e) = map.entry(*key) {
        if e.get_mut().remove(seq) {
            e.remove();
        }
    }
}

/// The oldest sequence number stored under `key`.
fn index_first<K: Hash + Eq>(map: &FastMap<K, Seqs>, key: &K) -> Option<u64> {
    map.get(key).and_then(Seqs::first)
}

/// The result of [`Matcher::post`].
#[derive(Debug)]
pub enum PostOutcome<R, U> {
    /// Nothing buffered matched; the receive is now posted.
    Queued,
    /// A buffered unexpected message matched and was removed.
    Matched {
        /// The receive's payload, handed back to complete it.
        recv: R,
        /// The receive's criteria.
        spec: RecvSpec,
        /// The message, with its source re-resolved if it was unknown.
        info: MsgInfo,
        /// The buffered message.
        payload: U,
    },
}

/// What a posted receive gives a message it accepts. A plain receive is
/// taken whole; a multi-receive buffer (`FI_MULTI_RECV`) gives a part of
/// itself and may stay posted in its place.
#[derive(Debug)]
pub enum Take<R> {
    /// The receive leaves the queue and takes the message.
    Whole,
    /// This part takes the message; the receive stays posted where it is.
    Part(R),
    /// This part takes the message, and the receive leaves the queue.
    Last(R),
    /// The receive takes no more (the message does not fit what is left
    /// of it): it leaves the queue without the message, which goes on to
    /// the next receive that accepts it.
    End,
}

/// The result of [`Matcher::post_by`].
#[derive(Debug)]
pub struct PostedBy<R, U> {
    /// Buffered messages taken, oldest first, each with the receive (or
    /// part of one) that takes it and its info (source re-resolved).
    pub matched: Vec<(R, MsgInfo, U)>,
    /// The receive ended without being queued (see [`Take::End`]).
    pub ended: Option<R>,
    /// The receive was queued (it has room for more).
    pub queued: bool,
}

/// Posted receives and unexpected messages of one receive context.
///
/// `R` is a posted receive's payload (buffer, completion sink), `U` a
/// buffered unexpected message, and `S` the sender's raw identity (e.g. a
/// `SocketAddr`), kept to re-resolve the source of messages whose sender
/// was inserted into the AV only after they arrived.
pub struct Matcher<R, U, S> {
    posted: PostedQueue<R>,
    unexpected: UnexpectedQueue<U, S>,
}

impl<R, U, S> fmt::Debug for Matcher<R, U, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Matcher")
            .field("posted", &self.posted.len())
            .field("unexpected", &self.unexpected.len())
            .field("unexpected_bytes", &self.unexpected.bytes())
            .field("claimed", &self.unexpected.claimed_len())
            .finish()
    }
}

impl<R, U, S> Default for Matcher<R, U, S> {
    fn default() -> Self {
        Self::new()
    }
}

impl<R, U, S> Matcher<R, U, S> {
    /// An empty matcher.
    pub fn new() -> Self {
        Matcher {
            posted: PostedQueue::new(),
            unexpected: UnexpectedQueue::new(),
        }
    }

    /// An incoming message header: removes and returns the first-posted
    /// receive that accepts it (same kind, tag rule, directed source).
    /// `None` means the caller should buffer it with
    /// [`push_unexpected`](Self::push_unexpected).
    pub fn match_arrival(&mut self, info: &MsgInfo) -> Option<(RecvSpec, R)> {
        self.posted.take_match(info)
    }

    /// [`match_arrival`](Self::match_arrival) where receives may take part
    /// of themselves (multi-receive buffers): `take` says what the
    /// first-posted receive that accepts the message gives it (see
    /// [`Take`]). Receives that end without the message are moved into
    /// `ended`, in post order, for the caller to complete.
    ///
    /// Generic over `take` (a `&mut dyn FnMut` still fits): every arrival
    /// asks it, and a plain receive's answer, inlined, is one comparison.
    #[inline]
    pub fn match_arrival_by<F>(
        &mut self,
        info: &MsgInfo,
        take: &mut F,
        ended: &mut Vec<R>,
    ) -> Option<(RecvSpec, R)>
    where
        F: FnMut(&mut R, &MsgInfo) -> Take<R> + ?Sized,
    {
        let mut spec = UNSET;
        let r = self.posted.take_match_by(info, take, ended, &mut spec)?;
        Some((spec, r))
    }

    /// [`match_arrival_by`](Self::match_arrival_by) for a caller that
    /// needs the receive alone: one move of it fewer.
    #[inline(always)]
    pub fn arrival_by<F>(&mut self, info: &MsgInfo, take: &mut F, ended: &mut Vec<R>) -> Option<R>
    where
        F: FnMut(&mut R, &MsgInfo) -> Take<R> + ?Sized,
    {
        let mut spec = UNSET;
        self.posted.take_match_by(info, take, ended, &mut spec)
    }

    /// Buffers an unmatched message; arrival order is preserved.
    pub fn push_unexpected(&mut self, src_raw: S, info: MsgInfo, payload: U) {
        self.unexpected.push(src_raw, info, payload);
    }

    /// Puts back, ahead of every buffered message, one that a receive had
    /// taken but nobody read (its future was dropped after the message
    /// reached it), so the next receive that accepts it takes it first.
    pub fn push_unexpected_front(&mut self, src_raw: S, info: MsgInfo, payload: U) {
        self.unexpected.push_front(src_raw, info, payload);
    }

    /// [`push_unexpected_front`](Self::push_unexpected_front) for
    /// messages handed back in their order (a dropped multi-receive
    /// stream's): ahead of every message that arrived, behind those put
    /// back before it.
    pub fn push_unexpected_front_after(&mut self, src_raw: S, info: MsgInfo, payload: U) {
        self.unexpected.push_front_after(src_raw, info, payload);
    }

    /// Posts a receive. If a buffered message matches (oldest first, claimed
    /// ones skipped) it is removed and returned; otherwise the receive is
    /// queued. Messages that arrived from an unknown source are matched with
    /// the source `resolve` gives their raw identity now, and that resolved
    /// source is what the returned [`MsgInfo`] carries.
    #[inline(always)]
    pub fn post(
        &mut self,
        spec: RecvSpec,
        r: R,
        resolve: &dyn Fn(&S) -> FiAddr,
    ) -> PostOutcome<R, U> {
        // Nothing held (the usual case): the receive goes straight into
        // the queue, in the caller.
        if self.unexpected.len() == 0 {
            self.posted.push(spec, r);
            return PostOutcome::Queued;
        }
        self.post_at(spec, r, resolve, false)
    }

    /// Queues a receive without looking for a buffered message: for a
    /// caller that saw [`unexpected_len`](Self::unexpected_len) is 0
    /// (under the same lock). Nothing comes back, so the receive is moved
    /// once, from the caller's place into the queue; through
    /// [`post`](Self::post), whose outcome may carry it, it was copied
    /// twice more on the way (128 bytes, about 30 instructions).
    #[inline(always)]
    pub fn queue(&mut self, spec: RecvSpec, r: R) {
        self.posted.push(spec, r);
    }

    /// [`post`](Self::post), queueing at the head (`front`: a receive
    /// whose message died goes back where it was) or the tail.
    #[inline]
    pub fn post_at(
        &mut self,
        spec: RecvSpec,
        r: R,
        resolve: &dyn Fn(&S) -> FiAddr,
        front: bool,
    ) -> PostOutcome<R, U> {
        if let Some((seq, info)) = self.unexpected.find(&spec, resolve) {
            if let Some((_, _, payload)) = self.unexpected.take(seq) {
                return PostOutcome::Matched {
                    recv: r,
                    spec,
                    info,
                    payload,
                };
            }
        }
        if front {
            self.posted.push_front(spec, r);
        } else {
            self.posted.push(spec, r);
        }
        PostOutcome::Queued
    }

    /// [`post`](Self::post) for a receive that may take several buffered
    /// messages (a multi-receive buffer): `take` is asked, oldest first,
    /// what the receive gives each buffered message it accepts, until it
    /// is taken whole, ends, or no buffered message is left for it (then
    /// it is queued, at the head with `front`).
    pub fn post_by(
        &mut self,
        spec: RecvSpec,
        r: R,
        resolve: &dyn Fn(&S) -> FiAddr,
        take: &mut dyn FnMut(&mut R, &MsgInfo) -> Take<R>,
        front: bool,
    ) -> PostedBy<R, U> {
        let mut r = r;
        let mut matched = Vec::new();
        loop {
            let Some((seq, info)) = self.unexpected.find(&spec, resolve) else {
                if front {
                    self.posted.push_front(spec, r);
                } else {
                    self.posted.push(spec, r);
                }
                return PostedBy {
                    matched,
                    ended: None,
                    queued: true,
                };
            };
            let (whole, last) = match take(&mut r, &info) {
                Take::End => {
                    return PostedBy {
                        matched,
                        ended: Some(r),
                        queued: false,
                    }
                }
                Take::Whole => (None, true),
                Take::Part(p) => (Some(p), false),
                Take::Last(p) => (Some(p), true),
            };
            let Some((_, _, payload)) = self.unexpected.take(seq) else {
                continue;
            };
            match whole {
                Some(p) => matched.push((p, info, payload)),
                None => {
                    matched.push((r, info, payload));
                    return PostedBy {
                        matched,
                        ended: None,
                        queued: false,
                    };
                }
            }
            if last {
                return PostedBy {
                    matched,
                    ended: None,
                    queued: false,
                };
            }
        }
    }

    /// [`post`](Self::post) for a receive that had already matched a
    /// message which then died (its sender's connection ended mid-way):
    /// it takes a buffered message if one matches, else it goes back to
    /// the head of the posted receives, ahead of those posted after it.
    pub fn repost_front(
        &mut self,
        spec: RecvSpec,
        r: R,
        resolve: &dyn Fn(&S) -> FiAddr,
    ) -> PostOutcome<R, U> {
        self.post_at(spec, r, resolve, true)
    }

    /// Removes the newest unclaimed buffered message that `pred` picks
    /// (one whose sender died before it was complete), so it neither holds
    /// buffer space nor is matched. Claimed messages stay: their claim
    /// must still find them and report the failure.
    pub fn remove_unexpected(&mut self, pred: impl Fn(&U) -> bool) -> Option<U> {
        self.unexpected.remove_newest_where(pred)
    }

    /// `fi_trecvmsg` with `FI_PEEK`: `flags` must contain `PEEK`, optionally
    /// with `CLAIM` or `DISCARD` (both is `Inval`).
    ///
    /// `PEEK` reports the first match and leaves it buffered; `PEEK|CLAIM`
    /// also reserves it for `spec.context` so no other receive or peek sees
    /// it; `PEEK|DISCARD` drops it. No match is `NoMsg`.
    pub fn peek(
        &mut self,
        spec: &RecvSpec,
        flags: OpFlags,
        resolve: &dyn Fn(&S) -> FiAddr,
    ) -> Result<MsgInfo> {
        self.peek_with(spec, flags, resolve, &|_, _| ())
            .map(|(info, ())| info)
    }

    /// [`peek`](Self::peek) that also returns what `look` makes of the
    /// message found (its raw source and payload), before a discard drops
    /// it: a shared receive context reports a peek on the queues of the
    /// endpoint the message arrived at.
    pub fn peek_with<T>(
        &mut self,
        spec: &RecvSpec,
        flags: OpFlags,
        resolve: &dyn Fn(&S) -> FiAddr,
        look: &dyn Fn(&S, &U) -> T,
    ) -> Result<(MsgInfo, T)> {
        if !flags.contains(OpFlags::PEEK) || flags.contains(OpFlags::CLAIM | OpFlags::DISCARD) {
            return Err(Error::Inval);
        }
        let (seq, info) = self.unexpected.find(spec, resolve).ok_or(Error::NoMsg)?;
        let seen = self.unexpected.look(seq, look).ok_or(Error::NoMsg)?;
        if flags.contains(OpFlags::DISCARD) {
            self.unexpected.take(seq);
        } else if flags.contains(OpFlags::CLAIM) {
            self.unexpected.claim(seq, spec.context, info);
        }
        Ok((info, seen))
    }

    /// `fi_trecvmsg` with `FI_CLAIM` (no `PEEK`): takes the message claimed
    /// by `context`. With `discard` (`CLAIM|DISCARD`) the payload is dropped
    /// and `None` returned in its place. Nothing claimed by that context is
    /// `NoMsg`.
    pub fn claim(&mut self, context: u64, discard: bool) -> Result<(MsgInfo, Option<U>)> {
        let (info, payload) = self.unexpected.take_claimed(context).ok_or(Error::NoMsg)?;
        Ok((info, if discard { None } else { Some(payload) }))
    }

    /// Withdraws the first posted receive with this context. `None` if there
    /// is none (never posted, or already matched).
    pub fn cancel(&mut self, context: u64) -> Option<(RecvSpec, R)> {
        self.posted.cancel(context)
    }

    /// Removes every posted receive (endpoint close), in post order.
    pub fn drain_posted(&mut self) -> Vec<(RecvSpec, R)> {
        self.posted.drain()
    }

    /// Removes every buffered message, claimed ones included, in arrival
    /// order, returning each with its raw source.
    pub fn drain_unexpected(&mut self) -> Vec<(S, MsgInfo, U)> {
        self.unexpected.drain()
    }

    /// Number of posted receives.
    pub fn posted_len(&self) -> usize {
        self.posted.len()
    }

    /// Number of buffered unexpected messages, claimed ones included.
    pub fn unexpected_len(&self) -> usize {
        self.unexpected.len()
    }

    /// Sum of `info.len` over buffered unexpected messages, claimed ones
    /// included (they still hold memory): the flow-control budget.
    pub fn unexpected_bytes(&self) -> usize {
        self.unexpected.bytes()
    }
}

/// The source a buffered message is matched with: its arrival-time handle,
/// or, if that was unknown, whatever the AV says about its raw identity now.
fn effective_src<S>(info: &MsgInfo, src_raw: &S, resolve: &dyn Fn(&S) -> FiAddr) -> FiAddr {
    if info.src == FI_ADDR_NOTAVAIL {
        resolve(src_raw)
    } else {
        info.src
    }
}
