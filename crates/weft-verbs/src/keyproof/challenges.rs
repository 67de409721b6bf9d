//! An acceptor's open challenges: what it must remember between a keyed
//! connector's two requests, bounded in number and in time.
//!
//! Each entry is one challenge sent in a rejection: both nonces and the
//! address the request came from. A proof takes its entry out whether or
//! not it checks (each challenge is good for one attempt, so a replayed
//! or second guess finds nothing). Entries older than the time-to-live
//! are dropped; at the capacity the oldest goes to make room, so a flood
//! of openings costs at most `cap` entries (and the flood's own oldest
//! challenges, not the memory of the process).

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use weft_core::hash::{fast_map, FastMap};
use weft_core::wire::claim::Nonce;

use super::payload::Handle;

/// One open challenge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pending {
    /// The connector's nonce (from its opening request).
    pub connector_nonce: Nonce,
    /// The acceptor's nonce (in the challenge).
    pub acceptor_nonce: Nonce,
    /// Where the opening request came from.
    pub from: IpAddr,
    /// Which of the acceptor's keys the challenge was made with.
    pub key: usize,
}

/// When a challenge was issued, and its serial number, which tells it
/// from an earlier challenge under the same handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Issued {
    at: Instant,
    serial: u64,
}

/// The table.
#[derive(Debug)]
pub(crate) struct Challenges {
    open: FastMap<Handle, (Pending, Issued)>,
    /// Handles in the order they were issued, for expiry and eviction.
    /// Entries taken out early stay here until they reach the front or a
    /// compaction drops them, which keeps this within `2 * cap + 1`.
    order: VecDeque<(Handle, Issued)>,
    next_serial: u64,
    cap: usize,
    ttl: Duration,
}

impl Challenges {
    /// At most `cap` (at least one) open challenges, each for `ttl`.
    pub(crate) fn new(cap: usize, ttl: Duration) -> Challenges {
        Challenges {
            open: fast_map(),
            order: VecDeque::new(),
            next_serial: 0,
            cap: cap.max(1),
            ttl,
        }
    }

    /// Open challenges (expired ones not yet dropped included).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.open.len()
    }

    /// Remembers `p` under `h`, issued at `now`. `false` if `h` already
    /// names an open challenge (the caller draws another nonce).
    pub(crate) fn insert(&mut self, h: Handle, p: Pending, now: Instant) -> bool {
        self.expire(now);
        if self.open.contains_key(&h) {
            return false;
        }
        while self.open.len() >= self.cap {
            if !self.evict_oldest() {
                break;
            }
        }
        let issued = Issued {
            at: now,
            serial: self.next_serial,
        };
        self.next_serial += 1;
        self.open.insert(h, (p, issued));
        self.order.push_back((h, issued));
        if self.order.len() > 2 * self.cap {
            let open = &self.open;
            self.order.retain(|(h, i)| is_open(open, h, i));
        }
        true
    }

    /// Takes the challenge `h` out (it is good for one attempt): `None`
    /// if none is open under `h` or it is older than the time-to-live.
    pub(crate) fn take(&mut self, h: &Handle, now: Instant) -> Option<Pending> {
        self.expire(now);
        self.open.remove(h).map(|(p, _)| p)
    }

    /// Drops the oldest open challenge; `false` if there is none.
    fn evict_oldest(&mut self) -> bool {
        while let Some((h, i)) = self.order.pop_front() {
            if is_open(&self.open, &h, &i) {
                self.open.remove(&h);
                return true;
            }
        }
        false
    }

    /// Drops challenges issued more than the time-to-live before `now`.
    fn expire(&mut self, now: Instant) {
        while let Some(&(h, i)) = self.order.front() {
            if now.saturating_duration_since(i.at) <= self.ttl {
                break;
            }
            self.order.pop_front();
            if is_open(&self.open, &h, &i) {
                self.open.remove(&h);
            }
        }
        // The room a burst needed goes back once it is over.
        if self.open.capacity() > 64 && self.open.len() * 4 < self.open.capacity() {
            self.open.shrink_to(self.open.len() * 2);
        }
    }
}

/// Whether the record `(h, i)` of the issue order is the challenge open
/// under `h` (not an earlier one taken out since).
fn is_open(open: &FastMap<Handle, (Pending, Issued)>, h: &Handle, i: &Issued) -> bool {
    open.get(h).is_some_and(|(_, o)| o == i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn p(i: u8) -> Pending {
        Pending {
            connector_nonce: [i; 16],
            acceptor_nonce: [i.wrapping_add(100); 16],
            from: IpAddr::V4(Ipv4Addr::new(10, 66, 0, 2)),
            key: usize::from(i),
        }
    }

    fn h(i: u8) -> Handle {
        [i; 8]
    }

    const TTL: Duration = Duration::from_secs(10);

    #[test]
    fn a_challenge_is_taken_once() {
        let now = Instant::now();
        let mut c = Challenges::new(8, TTL);
        assert!(c.insert(h(1), p(1), now));
        // A handle already open is not reused.
        assert!(!c.insert(h(1), p(2), now));
        assert_eq!(c.take(&h(1), now), Some(p(1)));
        // A replay (the same handle again) finds nothing.
        assert_eq!(c.take(&h(1), now), None);
        // Nor does a handle never issued.
        assert_eq!(c.take(&h(9), now), None);
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn challenges_expire() {
        let t0 = Instant::now();
        let mut c = Challenges::new(8, TTL);
        assert!(c.insert(h(1), p(1), t0));
        assert!(c.insert(h(2), p(2), t0 + Duration::from_secs(5)));
        // Within the time-to-live: still open.
        assert_eq!(c.take(&h(1), t0 + TTL), Some(p(1)));
        assert!(c.insert(h(1), p(1), t0 + TTL));
        // Past it: gone, taken or not, and dropped from memory.
        let late = t0 + TTL + Duration::from_secs(6);
        assert_eq!(c.take(&h(2), late), None);
        assert_eq!(c.len(), 1, "the newer one is still open");
        assert_eq!(c.take(&h(1), t0 + 2 * TTL + Duration::from_millis(1)), None);
        assert_eq!(c.len(), 0);
        assert!(c.order.is_empty());
    }

    #[test]
    fn a_flood_is_bounded_and_evicts_the_oldest() {
        let now = Instant::now();
        let mut c = Challenges::new(4, TTL);
        for i in 0..200u8 {
            assert!(c.insert(h(i), p(i), now));
            assert!(c.len() <= 4);
            assert!(c.order.len() <= 2 * 4 + 1);
        }
        // The four newest are open, the rest were evicted.
        for i in 0..196u8 {
            assert_eq!(c.take(&h(i), now), None, "{i}");
        }
        for i in 196..200u8 {
            assert_eq!(c.take(&h(i), now), Some(p(i)));
        }
    }

    #[test]
    fn taking_early_keeps_the_order_bounded() {
        let now = Instant::now();
        let mut c = Challenges::new(4, TTL);
        // Issued and answered at once, many times within the time-to-live:
        // the issue order must not keep a record of each.
        for round in 0..1000u32 {
            let i = (round % 251) as u8;
            assert!(c.insert(h(i), p(i), now));
            assert_eq!(c.take(&h(i), now), Some(p(i)));
            assert!(c.order.len() <= 2 * 4 + 1, "{}", c.order.len());
        }
        // A handle reissued after being taken is the new challenge, and an
        // old record of it in the order does not evict it.
        assert!(c.insert(h(7), p(7), now));
        for i in 20..23u8 {
            assert!(c.insert(h(i), p(i), now));
        }
        assert_eq!(c.len(), 4);
        assert_eq!(c.take(&h(7), now), Some(p(7)));
    }

    #[test]
    fn capacity_is_at_least_one() {
        let now = Instant::now();
        let mut c = Challenges::new(0, TTL);
        assert!(c.insert(h(1), p(1), now));
        assert!(c.insert(h(2), p(2), now));
        assert_eq!(c.len(), 1);
        assert_eq!(c.take(&h(2), now), Some(p(2)));
    }
}
