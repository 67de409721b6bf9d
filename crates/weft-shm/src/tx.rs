//! The send side. Sending to a peer maps its segment (once) and claims
//! one of its channels, a single-producer ring this endpoint alone writes.
//! A message is copied from the caller's buffers into the ring by the
//! posting thread — records of at most a quarter ring, so a long message
//! streams while the receiver drains — and completes once its last byte
//! is in the ring. What does not fit waits in the peer's queue, in order,
//! until the receiver makes room (it rings our doorbell when we ask).
//! Only the owner of a ring's head can free room; a head that lies (more
//! than a ring behind or ahead) fails the peer's sends.
//!
//! A fenced operation (`FI_FENCE`) to a peer waits in its queue, with
//! everything posted after it, until every earlier operation to that
//! peer has completed: sends waiting for delivery, RMA and atomics
//! waiting for their answers (`docs/design.md`, "Ordering and fences on
//! shm").

use std::collections::VecDeque;
use std::fs::File;
use std::sync::atomic::Ordering;

use weft_core::addr::FiAddr;
use weft_core::completion::OpDone;
use weft_core::provider::Iov;
use weft_core::{Error, Result};

use crate::endpoint::EpShared;
use crate::layout::*;
pub use crate::out::{Addr, AfterEnqueue, Ended, EndedList, Out};
use crate::ring::Chan;
use crate::rma::Lead;
use crate::segment::Segment;
pub use crate::tx_drive::finish;

mod answers;
mod claim;
mod delivery;
mod flush;
mod post;
mod write;
pub use answers::Answered;
pub use post::Offered;

/// A delivery-complete send wholly in the ring, waiting for the
/// receiver's head to pass `end`.
#[derive(Debug)]
struct Delivering {
    end: u64,
    len: usize,
    done: Option<OpDone>,
    /// A CMA send's buffers, which the receiver reads until it consumes
    /// the record, and the send's place in the order of this process's
    /// CMA sends ([`delivery::CMA_STAMP`]: what the driver stays awake
    /// for).
    keep: Option<(Iov, u64)>,
    /// A CMA send whose record offers to write a part (`F_SPLIT`): we
    /// look for the owner's offer while it waits.
    split: bool,
}

/// A peer this endpoint sends to.
#[derive(Debug)]
pub struct Peer {
    pub(crate) name: String,
    seg: Segment,
    /// Which file `seg` maps: a claim takes its channel's claim lock
    /// (`claim_lock`) through a description of its own, opened by name
    /// for that claim, and goes on only if the name still holds this
    /// file. No descriptor is kept besides the doorbell's.
    file: crate::segment::FileId,
    g: Geometry,
    /// The claimed channel and its claim count; `None` while all are
    /// taken.
    chan: Option<(Chan, u32)>,
    /// Our produced position.
    tail: u64,
    /// The consumer's head as we last read it. Reading the head word
    /// each send cost a cache miss (the receiver writes it at every
    /// record it consumes); it is read again only when the room this
    /// one leaves is too little.
    head_seen: u64,
    /// The segment's owner when mapped.
    pub(crate) owner: (u32, u64),
    /// Its endpoint serial (`H_SERIAL`): with `owner`, the target
    /// instance our requests go to, which an answer channel must name
    /// (`Peers::answered`).
    serial: u64,
    bell: Option<File>,
    queue: VecDeque<Out>,
    delivering: VecDeque<Delivering>,
    /// RMA operations sent to this peer, waiting for its responses, in
    /// the order their requests began (it answers in that order; each
    /// answer names its request by id).
    pub pending: VecDeque<crate::rma::Pending>,
    /// An answer's bytes are arriving (its operation left `pending`
    /// when they began).
    answering: bool,
    /// That operation's request id and sequence number, not to be given
    /// again meanwhile.
    answering_id: u32,
    answering_seq: u64,
    /// Stranded operations' sequence numbers and ids, oldest first,
    /// whose requests the target may still answer (`Peers::strand`):
    /// their ids are not given again until that answer, or one to a
    /// later request, arrives (`answers.rs`).
    ghosts: answers::Ghosts,
    /// The claimed channel waits for the owner's verdict on the key
    /// (`keyproof`): nothing is written before it.
    awaiting: Option<crate::keyproof::Awaiting>,
    /// The owner refused the key (or its proof was not good) since the
    /// endpoint last looked: to be counted and reported once.
    pub(crate) refused: bool,
    /// `FI_AV_AUTH_KEY`: the AV key handle its channel proves (or will,
    /// once claimed). One key per peer at a time: an operation under
    /// another key fails (`KeyRejected`) while the channel lives.
    proves: Option<FiAddr>,
    /// We can write the owner's memory (we read its probe word at
    /// `H_CMA_PROBE`): our CMA records offer to write a part of their
    /// message (`split`).
    split_ok: bool,
    /// The owner shares our memory (`split::shares_memory`: it is this
    /// process, by whatever id): its offers are written only if it
    /// vouched for them.
    mine: bool,
    /// Sends in `delivering` that offer a split: while any does, each
    /// pass looks at the channel's offer block.
    splits: usize,
    /// Our endpoint spins (inline or busy-poll progress): large
    /// transfers go through the ring unless the receiver sleeps
    /// (`cma::pays`).
    spins: bool,
}

/// The peers sent to, by address.
#[derive(Debug, Default)]
pub struct Peers {
    pub(crate) map: crate::by_addr::ByAddr<Peer>,
    /// The destination resolved last (`post.rs`).
    last: Option<post::LastDest>,
    /// The sequence number the next RMA request takes, whatever its
    /// peer: endpoint-wide, so a peer record made again for a target
    /// does not give its first ids again (`answers::fresh_id`).
    pub(crate) next_seq: u64,
}

impl EpShared {
    /// Whether this endpoint spins (inline or busy-poll progress), which
    /// decides how its large transfers go (`cma::pays`).
    fn spinning_wait(&self) -> bool {
        self.cfg.wait != weft_core::completion::WaitMode::Interrupt
    }

    /// Maps the segment of the endpoint named `name`, to send to it.
    pub(crate) fn open_peer(&self, name: &str) -> Result<Peer> {
        Peer::open(name, self.spinning_wait())
    }
}

impl Peers {
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Bytes waiting in the queue to the endpoint at `addr` (not yet in
    /// its ring).
    pub fn backlog(&mut self, addr: &[u8]) -> usize {
        self.map
            .get_mut(addr)
            .map_or(0, |p| p.queue.iter().map(|o| o.len - o.off).sum())
    }

    /// Whether the answer to an operation sent to the peer at `addr` is
    /// arriving: its operation has not completed, and a fence waits.
    pub fn set_answering(&mut self, addr: &[u8], on: bool) {
        if let Some(p) = self.map.get_mut(addr) {
            p.answering = on;
        }
    }

    /// The endpoint closes: every claimed channel is handed back
    /// (`CLOSED`: the receiver frees it once drained).
    pub fn release(self) {
        for p in self.map.into_values() {
            p.settle_cma();
            if let Some((c, gen)) = p.chan {
                c.give_back(&p.seg, gen);
            }
        }
    }
}
