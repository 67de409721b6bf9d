//! Messages given back by receives whose futures were dropped just as
//! the message reached them (the completion was sent, nobody read it).
//!
//! Such a message is not lost: it goes to the oldest posted receive that
//! accepts it, or to the head of the unexpected queue, ahead of every
//! message that arrived after it, where the next receive finds it. It is
//! charged against the unexpected budget like any buffered message, even
//! past the budget: it was admitted once already, and refusing it now
//! could only drop it.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use weft_core::addr::{decode_sockaddr, FiAddr, FI_ADDR_NOTAVAIL};
use weft_core::av::shared::lock_synced;
use weft_core::completion::Returned;
use weft_core::limits::UNEXPECTED_OVERHEAD;
use weft_core::multi_recv;
use weft_core::sync::lock;

use crate::admission::Charge;
use crate::endpoint::EpShared;
use crate::keys::Source;
use crate::rx::{copy_and_deliver, Unexpected};

impl EpShared {
    /// Takes back a message a dropped receive future did not read: ahead
    /// of every buffered message, or with `after` (a dropped
    /// multi-receive stream's messages, handed back in their order)
    /// behind those given back before it.
    pub fn take_back(&self, mut r: Returned, after: bool) {
        if let Some(l) = &self.srx {
            l.core.take_back(r, after);
            return;
        }
        if self.is_closed() {
            return;
        }
        let Some(me) = self.me.upgrade() else {
            return;
        };
        let mut info = r.info();
        let data = r.take_bytes();
        let key = self.source_key(info.src, &r.raw);
        info.key = key.key.and_then(|k| u16::try_from(k).ok());
        let mut m = lock(&self.matcher);
        let mut ended = Vec::new();
        if let Some((_, req)) = m.match_arrival_by(&info, &mut multi_recv::take, &mut ended) {
            drop(m);
            self.end_buffers(ended);
            copy_and_deliver(self, req, info, &data, &key);
            return;
        }
        let charge = UNEXPECTED_OVERHEAD.saturating_add(info.len);
        // Not a connection's share: the connection it came on may be gone.
        let share = Arc::new(AtomicUsize::new(0));
        let u = Unexpected::whole(data, info.len, key, None, Charge::new(&me, &share, charge));
        if after {
            m.push_unexpected_front_after(key, info, u);
        } else {
            m.push_unexpected_front(key, info, u);
        }
        drop(m);
        self.end_buffers(ended);
    }

    /// The matcher's raw identity of the sender with AV handle `src`: its
    /// address; for a sender unknown at arrival, the address it came from
    /// (`raw`, kept for `FI_SOURCE_ERR`) or an unspecified one that
    /// resolves to no handle.
    pub(crate) fn source_key(&self, src: FiAddr, raw: &[u8]) -> Source {
        let unknown = Source::plain(
            decode_sockaddr(raw).unwrap_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))),
        );
        if src == FI_ADDR_NOTAVAIL {
            return unknown;
        }
        let Some(av) = &self.cfg.av else {
            return unknown;
        };
        let t = lock_synced(av);
        let Some(addr) = t.lookup(src).ok().and_then(|b| decode_sockaddr(b).ok()) else {
            return unknown;
        };
        Source {
            addr,
            key: t.entry_key(src).ok().flatten(),
        }
    }
}
