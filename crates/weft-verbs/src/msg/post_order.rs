//! Work requests by id, in the order they were posted: an RC queue
//! pair completes a queue's work requests in that order, so the one a
//! completion names is the oldest (a shared receive queue's completions,
//! handled through several CQs, may come a little out of order: those
//! are found by a search). No hashing per message.

use std::collections::VecDeque;

pub(super) struct PostOrder<T>(VecDeque<(u64, T)>);

impl<T> Default for PostOrder<T> {
    fn default() -> Self {
        PostOrder(VecDeque::new())
    }
}

impl<T> PostOrder<T> {
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Work request `id`, just posted (the caller holds the lock it
    /// posted under, so the order is the device's).
    pub(super) fn insert(&mut self, id: u64, v: T) {
        self.0.push_back((id, v));
    }

    /// Work request `id` completed: what it held, if it is here.
    // Always inlined: out of line its answer was copied once more per
    // completion. `pop_front` for the front: `remove(0)` takes the
    // general path (a `wrap_copy`).
    #[inline(always)]
    pub(super) fn remove(&mut self, id: u64) -> Option<T> {
        let at = match self.0.front() {
            Some((front, _)) if *front == id => return self.0.pop_front().map(|(_, v)| v),
            _ => self.0.iter().position(|(w, _)| *w == id)?,
        };
        self.0.remove(at).map(|(_, v)| v)
    }

    /// The oldest work request, with its id.
    #[inline(always)]
    pub(super) fn front(&self) -> Option<(u64, &T)> {
        self.0.front().map(|(id, v)| (*id, v))
    }

    /// Drops the oldest work request.
    #[inline(always)]
    pub(super) fn pop_front(&mut self) -> Option<T> {
        self.0.pop_front().map(|(_, v)| v)
    }

    pub(super) fn get_mut(&mut self, id: u64) -> Option<&mut T> {
        self.0.iter_mut().find(|(w, _)| *w == id).map(|(_, v)| v)
    }

    pub(super) fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.0.iter_mut().map(|(_, v)| v)
    }
}
