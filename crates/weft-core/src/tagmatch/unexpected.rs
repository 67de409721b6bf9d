//! Buffered unexpected messages.
//!
//! Messages are kept in arrival order under a sequence number. Unclaimed
//! tagged messages are indexed by tag (for exact-tag receives) and in one
//! ordered set (for wildcard receives); unclaimed untagged messages in
//! another. Claimed messages leave those indexes, so no receive or peek can
//! reach them, and are found only through their claiming context.
//!
//! Sources are not indexed: a message from a sender unknown at arrival is
//! matched by resolving its raw identity at post time, so its source can
//! change under us when the AV gains the sender.

use std::collections::{BTreeMap, BTreeSet};

use super::{effective_src, index_first, index_insert, index_remove, kind_and_tag_ok};
use super::{tag_matches, MsgInfo, RecvSpec, Seqs};
use crate::addr::FiAddr;
use crate::hash::{fast_map, FastMap};

struct Entry<U, S> {
    src_raw: S,
    info: MsgInfo,
    payload: U,
    claimed_by: Option<u64>,
}

/// Room below the first tail sequence number for messages put back at
/// the head (one per receive whose future was dropped unread).
const FIRST_SEQ: u64 = 1 << 62;
/// The sequence number of a message put back while no other put-back
/// message is buffered: in the middle of the room below [`FIRST_SEQ`],
/// so messages put back ahead of the others count down from it and
/// those put back behind them count up.
const FRONT_BASE: u64 = 1 << 61;

pub(super) struct UnexpectedQueue<U, S> {
    next_seq: u64,
    entries: BTreeMap<u64, Entry<U, S>>,
    bytes: usize,
    by_tag: FastMap<u64, Seqs>,
    // Tag kept beside the sequence number so a wildcard scan never
    // touches the entries it rejects.
    tagged: BTreeMap<u64, u64>,
    untagged: BTreeSet<u64>,
    claimed: FastMap<u64, Seqs>,
    claimed_count: usize,
}

impl<U, S> UnexpectedQueue<U, S> {
    pub(super) fn new() -> Self {
        UnexpectedQueue {
            next_seq: FIRST_SEQ,
            entries: BTreeMap::new(),
            bytes: 0,
            by_tag: fast_map(),
            tagged: BTreeMap::new(),
            untagged: BTreeSet::new(),
            claimed: fast_map(),
            claimed_count: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    pub(super) fn claimed_len(&self) -> usize {
        self.claimed_count
    }

    pub(super) fn push(&mut self, src_raw: S, info: MsgInfo, payload: U) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.insert(seq, src_raw, info, payload);
    }

    /// Puts a message back ahead of every other one.
    pub(super) fn push_front(&mut self, src_raw: S, info: MsgInfo, payload: U) {
        let seq = match self.entries.range(..FIRST_SEQ).next() {
            Some((&first, _)) => first.saturating_sub(1),
            None => FRONT_BASE,
        };
        self.insert(seq, src_raw, info, payload);
    }

    /// Puts a message back ahead of every message that arrived, but
    /// behind those put back before it that are still here: messages
    /// handed back one after another in their order (the unread messages
    /// of a dropped multi-receive stream) keep it.
    pub(super) fn push_front_after(&mut self, src_raw: S, info: MsgInfo, payload: U) {
        let seq = match self.entries.range(..FIRST_SEQ).next_back() {
            Some((&last, _)) => (last + 1).min(FIRST_SEQ - 1),
            None => FRONT_BASE,
        };
        self.insert(seq, src_raw, info, payload);
    }

    fn insert(&mut self, seq: u64, src_raw: S, info: MsgInfo, payload: U) {
        self.bytes += info.len;
        self.index(seq, &info);
        self.entries.insert(
            seq,
            Entry {
                src_raw,
                info,
                payload,
                claimed_by: None,
            },
        );
    }

    /// The oldest unclaimed message `spec` accepts, with its info carrying
    /// the source it matched with.
    #[inline]
    pub(super) fn find(
        &self,
        spec: &RecvSpec,
        resolve: &dyn Fn(&S) -> FiAddr,
    ) -> Option<(u64, MsgInfo)> {
        // Every post looks here first; mostly nothing is held, and that
        // look is inlined.
        if self.len() == 0 {
            return None;
        }
        self.find_held(spec, resolve)
    }

    /// [`find`](Self::find) among held messages.
    fn find_held(&self, spec: &RecvSpec, resolve: &dyn Fn(&S) -> FiAddr) -> Option<(u64, MsgInfo)> {
        if !spec.tagged {
            self.first_accepted(self.untagged.iter(), spec, resolve)
        } else if spec.ignore == 0 {
            let set = self.by_tag.get(&spec.tag)?;
            self.first_accepted(set.iter(), spec, resolve)
        } else {
            let seqs = self
                .tagged
                .iter()
                .filter(|(_, &tag)| tag_matches(spec.tag, spec.ignore, tag))
                .map(|(seq, _)| seq);
            self.first_accepted(seqs, spec, resolve)
        }
    }

    fn first_accepted<'a>(
        &self,
        seqs: impl Iterator<Item = &'a u64>,
        spec: &RecvSpec,
        resolve: &dyn Fn(&S) -> FiAddr,
    ) -> Option<(u64, MsgInfo)> {
        seqs.filter_map(|&seq| self.entries.get(&seq).map(|e| (seq, e)))
            .filter(|(_, e)| kind_and_tag_ok(spec, &e.info))
            .find_map(|(seq, e)| {
                let src = effective_src(&e.info, &e.src_raw, resolve);
                spec.takes_from(&e.info, src)
                    .then_some((seq, MsgInfo { src, ..e.info }))
            })
    }

    /// Reserves a message for `context`. The info the peek reported (with
    /// its resolved source) is stored, since the later claim has no AV to
    /// resolve with and must report what the peek saw.
    pub(super) fn claim(&mut self, seq: u64, context: u64, info: MsgInfo) {
        let Some(entry) = self.entries.get_mut(&seq) else {
            return;
        };
        if entry.claimed_by.is_some() {
            return;
        }
        let old = entry.info;
        entry.info = info;
        entry.claimed_by = Some(context);
        self.unindex(seq, &old);
        index_insert(&mut self.claimed, context, seq);
        self.claimed_count += 1;
    }

    /// What `look` makes of buffered message `seq`.
    pub(super) fn look<T>(&self, seq: u64, look: &dyn Fn(&S, &U) -> T) -> Option<T> {
        self.entries.get(&seq).map(|e| look(&e.src_raw, &e.payload))
    }

    pub(super) fn take_claimed(&mut self, context: u64) -> Option<(MsgInfo, U)> {
        let seq = index_first(&self.claimed, &context)?;
        self.take(seq).map(|(_, info, payload)| (info, payload))
    }

    pub(super) fn take(&mut self, seq: u64) -> Option<(S, MsgInfo, U)> {
        let entry = self.entries.remove(&seq)?;
        self.bytes -= entry.info.len;
        match entry.claimed_by {
            Some(context) => {
                index_remove(&mut self.claimed, &context, seq);
                self.claimed_count -= 1;
            }
            None => self.unindex(seq, &entry.info),
        }
        Some((entry.src_raw, entry.info, entry.payload))
    }

    /// Removes the newest unclaimed message whose payload `pred` picks.
    /// Searched from the newest: the message a dying connection was still
    /// receiving is almost always the last one that arrived.
    pub(super) fn remove_newest_where(&mut self, pred: impl Fn(&U) -> bool) -> Option<U> {
        let seq = self
            .entries
            .iter()
            .rev()
            .find(|(_, e)| e.claimed_by.is_none() && pred(&e.payload))
            .map(|(&seq, _)| seq)?;
        self.take(seq).map(|(_, _, payload)| payload)
    }

    pub(super) fn drain(&mut self) -> Vec<(S, MsgInfo, U)> {
        self.bytes = 0;
        self.by_tag.clear();
        self.tagged.clear();
        self.untagged.clear();
        self.claimed.clear();
        self.claimed_count = 0;
        std::mem::take(&mut self.entries)
            .into_values()
            .map(|e| (e.src_raw, e.info, e.payload))
            .collect()
    }

    fn index(&mut self, seq: u64, info: &MsgInfo) {
        if info.tagged {
            index_insert(&mut self.by_tag, info.tag, seq);
            self.tagged.insert(seq, info.tag);
        } else {
            self.untagged.insert(seq);
        }
    }

    fn unindex(&mut self, seq: u64, info: &MsgInfo) {
        if info.tagged {
            index_remove(&mut self.by_tag, &info.tag, seq);
            self.tagged.remove(&seq);
        } else {
            self.untagged.remove(&seq);
        }
    }
}
