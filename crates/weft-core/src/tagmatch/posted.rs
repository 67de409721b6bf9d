//! Posted receives.
//!
//! Every receive gets a post sequence number. Exact-tag and untagged
//! receives are bucketed by (tag, source) and source, so an arrival only
//! looks at the head of the buckets it could match: its own source and
//! "any source". Wildcard receives (non-zero ignore mask) cannot be bucketed
//! by tag and sit in one ordered set; an arrival scans only those posted
//! before the best bucket candidate, which keeps "first posted wins" exact.
//!
//! Few receives posted at once (a ping-pong has one) skip the indexes:
//! up to [`LIST_MAX`] sit in one list in post order, and an arrival takes
//! the first that accepts it. Hashing into the indexes on every post and
//! every match cost more than scanning so short a list; the queue moves
//! to the indexes when the list would outgrow that, and back once it is
//! empty again.

use std::collections::BTreeMap;
use std::ops::Bound;

use super::{index_first, index_insert, index_remove, kind_and_tag_ok, src_ok, tag_matches};
use super::{MsgInfo, RecvSpec, Seqs, Take};
use crate::addr::{FiAddr, FI_ADDR_UNSPEC};
use crate::hash::{fast_map, FastMap};

/// Which index a receive lives in, derived from its spec alone so removal
/// never has to search.
enum Slot {
    Exact(u64, FiAddr),
    Wild,
    Untagged(FiAddr),
    /// Directed by key: bucketed apart, since key handles and address
    /// handles are different numbers spaces.
    ExactKey(u64, FiAddr),
    UntaggedKey(FiAddr),
}

fn slot_of(spec: &RecvSpec) -> Slot {
    if !spec.tagged {
        if spec.by_key {
            Slot::UntaggedKey(spec.src)
        } else {
            Slot::Untagged(spec.src)
        }
    } else if spec.ignore == 0 {
        if spec.by_key {
            Slot::ExactKey(spec.tag, spec.src)
        } else {
            Slot::Exact(spec.tag, spec.src)
        }
    } else {
        Slot::Wild
    }
}

/// Whether a receive in the list takes `info`: in post order, the first
/// that does is the one to take, by the rules the indexes implement.
fn accepts(spec: &RecvSpec, info: &MsgInfo) -> bool {
    kind_and_tag_ok(spec, info) && spec.takes_from(info, info.src)
}

fn earlier(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// Where sequence numbers start: receives put back at the front count
/// down from here, new ones count up, so both keep post order.
const FIRST_SEQ: u64 = 1 << 63;

/// The most receives kept in the scanned list before the indexes take
/// over.
pub(crate) const LIST_MAX: usize = 8;

pub(super) struct PostedQueue<R> {
    next_seq: u64,
    front_seq: u64,
    /// Every posted receive's sequence number and spec, in post order,
    /// while `indexed` is false; empty while it is true.
    list: Vec<(u64, RecvSpec)>,
    /// The receives of `list`, at the same places. Kept apart from their
    /// specs: a receive is moved into and out of its own vector, where
    /// as a part of one 180-byte entry it was built into the entry,
    /// copied into the list and out of it whole, and out of the entry
    /// again (about 30 instructions a ping-pong round trip).
    reqs: Vec<R>,
    /// The receives are in `entries` and the indexes.
    indexed: bool,
    // By sequence number. A hash map, not an ordered one: matching finds
    // the sequence through the indexes, and only the rare `cancel` and
    // `drain` need post order (they sort or scan). A B-tree moved the large
    // receive records within its nodes on every insert and remove.
    entries: FastMap<u64, (RecvSpec, R)>,
    exact: FastMap<(u64, FiAddr), Seqs>,
    // (tag, ignore, source) kept beside the sequence number: the scan of
    // wildcard receives never touches the entries it rejects.
    wild: BTreeMap<u64, (u64, u64, FiAddr, bool)>,
    untagged: FastMap<FiAddr, Seqs>,
    /// Receives directed by key, by (tag, key) and by key; empty unless
    /// the endpoint takes keys from its AV.
    exact_key: FastMap<(u64, FiAddr), Seqs>,
    untagged_key: FastMap<FiAddr, Seqs>,
    // No index by context: `cancel` is rare and scans, while an index
    // would cost every posted receive a map insert and remove.
}

impl<R> PostedQueue<R> {
    pub(super) fn new() -> Self {
        PostedQueue {
            next_seq: FIRST_SEQ,
            front_seq: FIRST_SEQ,
            list: Vec::new(),
            reqs: Vec::new(),
            indexed: false,
            entries: fast_map(),
            exact: fast_map(),
            wild: BTreeMap::new(),
            untagged: fast_map(),
            exact_key: fast_map(),
            untagged_key: fast_map(),
        }
    }

    pub(super) fn len(&self) -> usize {
        if self.indexed {
            self.entries.len()
        } else {
            self.list.len()
        }
    }

    #[inline(always)]
    pub(super) fn push(&mut self, spec: RecvSpec, r: R) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.insert(seq, spec, r);
    }

    /// Queues a receive ahead of every posted one: a receive handed back
    /// after the message it had matched died keeps its place at the head.
    pub(super) fn push_front(&mut self, spec: RecvSpec, r: R) {
        self.front_seq -= 1;
        let seq = self.front_seq;
        self.insert(seq, spec, r);
    }

    #[inline(always)]
    fn insert(&mut self, seq: u64, spec: RecvSpec, r: R) {
        // New receives go last and put-back ones first, so this is
        // rarely more than a look at the last entry.
        if !self.indexed && self.list.len() < LIST_MAX && self.list.last().is_none_or(|e| e.0 < seq)
        {
            // The receive first: pushed after the spec (whose push may
            // grow its vector, a call), it was copied once more to be
            // kept across that call (about 15 instructions a receive).
            self.reqs.push(r);
            self.list.push((seq, spec));
            debug_assert_eq!(self.list.len(), self.reqs.len());
            return;
        }
        self.insert_slow(seq, spec, r);
    }

    /// [`insert`](Self::insert) ahead of a listed receive, or into the
    /// indexes.
    fn insert_slow(&mut self, seq: u64, spec: RecvSpec, r: R) {
        if !self.indexed {
            if self.list.len() < LIST_MAX {
                let at = self.list.partition_point(|e| e.0 < seq);
                self.list.insert(at, (seq, spec));
                self.reqs.insert(at, r);
                return;
            }
            self.indexed = true;
            let listed = std::mem::take(&mut self.list);
            for ((seq, spec), r) in listed.into_iter().zip(std::mem::take(&mut self.reqs)) {
                self.index(seq, spec, r);
            }
        }
        self.index(seq, spec, r);
    }

    fn index(&mut self, seq: u64, spec: RecvSpec, r: R) {
        match slot_of(&spec) {
            Slot::Exact(tag, src) => index_insert(&mut self.exact, (tag, src), seq),
            Slot::Wild => {
                self.wild
                    .insert(seq, (spec.tag, spec.ignore, spec.src, spec.by_key));
            }
            Slot::Untagged(src) => index_insert(&mut self.untagged, src, seq),
            Slot::ExactKey(tag, k) => index_insert(&mut self.exact_key, (tag, k), seq),
            Slot::UntaggedKey(k) => index_insert(&mut self.untagged_key, k, seq),
        }
        self.entries.insert(seq, (spec, r));
    }

    pub(super) fn take_match(&mut self, info: &MsgInfo) -> Option<(RecvSpec, R)> {
        self.take_first(info).map(|(_, spec, r)| (spec, r))
    }

    /// The first-posted receive that accepts `info`, out of the queue,
    /// with its sequence number.
    #[inline]
    fn take_first(&mut self, info: &MsgInfo) -> Option<(u64, RecvSpec, R)> {
        if !self.indexed {
            let i = self.list.iter().position(|(_, spec)| accepts(spec, info))?;
            let (seq, spec) = self.list[i];
            return self.list_remove(i).map(|r| (seq, spec, r));
        }
        let seq = self.find(info)?;
        let (spec, r) = self.remove(seq)?;
        Some((seq, spec, r))
    }

    /// [`take_match`](Self::take_match), asking `take` what the receive
    /// gives: a receive that keeps room stays in its place; one that ends
    /// leaves the queue into `ended` and the next receive that accepts the
    /// message is asked. Returns the receive (or part) that takes the
    /// message and writes its spec into `spec` (meaningful only when a
    /// receive is returned): a listed receive is asked
    /// in place and moved out once, straight into the result (a
    /// receive is 128 bytes, and every move of it cost about 16
    /// instructions an arrival).
    #[inline(always)]
    pub(super) fn take_match_by<F>(
        &mut self,
        info: &MsgInfo,
        take: &mut F,
        ended: &mut Vec<R>,
        spec: &mut RecvSpec,
    ) -> Option<R>
    where
        F: FnMut(&mut R, &MsgInfo) -> Take<R> + ?Sized,
    {
        if self.indexed {
            let (s, r) = self.take_indexed_by(info, take, ended)?;
            *spec = s;
            return Some(r);
        }
        loop {
            let i = self.list.iter().position(|(_, spec)| accepts(spec, info))?;
            *spec = self.list[i].1;
            let r = self.reqs.get_mut(i)?;
            match take(r, info) {
                Take::Whole => return self.list_remove(i),
                Take::Part(p) => return Some(p),
                Take::Last(p) => {
                    drop(self.list_remove(i));
                    return Some(p);
                }
                Take::End => ended.extend(self.list_remove(i)),
            }
        }
    }

    /// Takes the listed receive at `i` (and its spec) out of the list:
    /// mostly the last (a ping-pong lists one), which needs no shift of
    /// the ones after it.
    #[inline(always)]
    fn list_remove(&mut self, i: usize) -> Option<R> {
        // The two vectors are one list: every push and removal takes both.
        debug_assert_eq!(self.list.len(), self.reqs.len());
        if i + 1 == self.list.len() {
            self.list.pop();
            return self.reqs.pop();
        }
        if i >= self.list.len() {
            return None;
        }
        self.list.remove(i);
        Some(self.reqs.remove(i))
    }

    /// [`take_match_by`](Self::take_match_by) of an indexed queue: a
    /// receive that keeps room goes back under its own sequence number.
    fn take_indexed_by<F>(
        &mut self,
        info: &MsgInfo,
        take: &mut F,
        ended: &mut Vec<R>,
    ) -> Option<(RecvSpec, R)>
    where
        F: FnMut(&mut R, &MsgInfo) -> Take<R> + ?Sized,
    {
        loop {
            let (seq, spec, mut r) = self.take_first(info)?;
            match take(&mut r, info) {
                Take::Whole => return Some((spec, r)),
                Take::Part(p) => {
                    self.insert(seq, spec, r);
                    return Some((spec, p));
                }
                Take::Last(p) => return Some((spec, p)),
                Take::End => ended.push(r),
            }
        }
    }

    fn find(&self, info: &MsgInfo) -> Option<u64> {
        if !self.indexed {
            return self
                .list
                .iter()
                .find(|(_, spec)| accepts(spec, info))
                .map(|e| e.0);
        }
        // A message from an unknown sender carries FI_ADDR_NOTAVAIL, which
        // is the same value as FI_ADDR_UNSPEC: only the "any source" bucket
        // may take it, and that bucket is consulted anyway.
        let own_src = info.src != FI_ADDR_UNSPEC;
        if !info.tagged {
            let any = index_first(&self.untagged, &FI_ADDR_UNSPEC);
            let own = own_src
                .then(|| index_first(&self.untagged, &info.src))
                .flatten();
            let by_key = info
                .key
                .and_then(|k| index_first(&self.untagged_key, &FiAddr::from(k)));
            return earlier(earlier(any, own), by_key);
        }
        let any = index_first(&self.exact, &(info.tag, FI_ADDR_UNSPEC));
        let own = own_src
            .then(|| index_first(&self.exact, &(info.tag, info.src)))
            .flatten();
        let by_key = info
            .key
            .and_then(|k| index_first(&self.exact_key, &(info.tag, FiAddr::from(k))));
        let best = earlier(earlier(any, own), by_key);
        let upper = best.map_or(Bound::Unbounded, Bound::Excluded);
        let wild = self
            .wild
            .range((Bound::Unbounded, upper))
            .find(|(_, &(tag, ignore, src, by_key))| {
                tag_matches(tag, ignore, info.tag)
                    && if by_key {
                        info.key.map(FiAddr::from) == Some(src)
                    } else {
                        src_ok(src, info.src)
                    }
            })
            .map(|(&seq, _)| seq);
        wild.or(best)
    }

    pub(super) fn cancel(&mut self, context: u64) -> Option<(RecvSpec, R)> {
        if !self.indexed {
            let i = self.list.iter().position(|e| e.1.context == context)?;
            let spec = self.list[i].1;
            return self.list_remove(i).map(|r| (spec, r));
        }
        let seq = self
            .entries
            .iter()
            .filter(|(_, (spec, _))| spec.context == context)
            .map(|(&seq, _)| seq)
            .min()?;
        self.remove(seq)
    }

    pub(super) fn drain(&mut self) -> Vec<(RecvSpec, R)> {
        if !self.indexed {
            return std::mem::take(&mut self.list)
                .into_iter()
                .zip(std::mem::take(&mut self.reqs))
                .map(|((_, spec), r)| (spec, r))
                .collect();
        }
        self.indexed = false;
        self.exact.clear();
        self.wild.clear();
        self.untagged.clear();
        self.exact_key.clear();
        self.untagged_key.clear();
        let mut all: Vec<(u64, (RecvSpec, R))> =
            std::mem::take(&mut self.entries).into_iter().collect();
        all.sort_unstable_by_key(|(seq, _)| *seq);
        all.into_iter().map(|(_, e)| e).collect()
    }

    fn remove(&mut self, seq: u64) -> Option<(RecvSpec, R)> {
        if !self.indexed {
            let i = self.list.iter().position(|e| e.0 == seq)?;
            let spec = self.list[i].1;
            return self.list_remove(i).map(|r| (spec, r));
        }
        let (spec, r) = self.entries.remove(&seq)?;
        // Emptied: the next receives go to the list again.
        self.indexed = !self.entries.is_empty();
        match slot_of(&spec) {
            Slot::Exact(tag, src) => index_remove(&mut self.exact, &(tag, src), seq),
            Slot::Wild => {
                self.wild.remove(&seq);
            }
            Slot::Untagged(src) => index_remove(&mut self.untagged, &src, seq),
            Slot::ExactKey(tag, k) => index_remove(&mut self.exact_key, &(tag, k), seq),
            Slot::UntaggedKey(k) => index_remove(&mut self.untagged_key, &k, seq),
        }
        Some((spec, r))
    }
}
