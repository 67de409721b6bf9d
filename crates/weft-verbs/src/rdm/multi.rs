//! Placing receives in the software matcher, multi-receive buffers
//! (`FI_MULTI_RECV`, `weft_core::multi_recv`) included, and taking back
//! messages whose receivers went away.
//!
//! Every message lands in a receive slot of the shared receive queue (or
//! is announced there and read later), and is matched in software, so a
//! multi-receive buffer is a posted receive that gives each message it
//! accepts a part of itself, cut off the front of its free space: an
//! eager message is copied out of its slot into its part, a rendezvous
//! one is read by RDMA straight into it (the part is registered on its
//! own; parts never overlap, so reads from several peers can run at
//! once). The buffer stays posted while it has room. Messages never
//! straddle: one that does not fit what is left releases the buffer and
//! goes on to the next receive.
//!
//! A buffer may take several buffered messages when it is posted; that
//! happens under one hold of the matcher's lock, so no message that
//! arrives meanwhile passes the ones it takes. Buffers released without
//! a message (full, or their stream dropped) are reported once that lock
//! is let go.
//!
//! A part whose message died with its sender's connection is a fixed
//! range of the buffer: it cannot take another message, so the range
//! stays unused (`multi_recv::drop_piece`). The unread messages of a
//! dropped stream come back in their order, ahead of later arrivals
//! (`give_back_after`).

use std::net::SocketAddr;

use weft_core::addr::{decode_sockaddr, FI_ADDR_NOTAVAIL};
use weft_core::completion::Returned;
use weft_core::multi_recv;
use weft_core::provider::RecvReq;
use weft_core::sync::lock;
use weft_core::tagmatch::MsgInfo;

use super::srx::Src;
use super::{spec_of, RdmMatcher, RdmShared, Sender, Unexp};

/// The receive (or part of a multi-receive buffer) that takes an
/// arriving message, if one does. Buffers that end without it (it does
/// not fit what they have left) go to `ended`, for
/// [`RdmShared::end_buffers`] once the matcher's lock is let go.
pub(crate) fn match_arrival(
    m: &mut RdmMatcher,
    info: &MsgInfo,
    ended: &mut Vec<RecvReq>,
) -> Option<RecvReq> {
    m.match_arrival_by(info, &mut multi_recv::take, ended)
        .map(|(_, req)| req)
}

impl RdmShared {
    /// Posts a receive to the matcher, or hands it the buffered messages
    /// it matches.
    pub(crate) fn repost(&self, req: RecvReq) {
        self.place(req, false);
    }

    /// A receive that had matched a message which then died with its
    /// sender's connection: it takes a buffered message if one matches,
    /// else it goes back to the head of the posted receives. (The part of
    /// a multi-receive buffer leaves its range unused instead.)
    pub(crate) fn repost_front(&self, req: RecvReq) {
        self.place(req, true);
    }

    fn place(&self, req: RecvReq, front: bool) {
        let Some(req) = multi_recv::unless_piece(self, req, self.is_closed()) else {
            return;
        };
        let spec = spec_of(&req);
        let resolve = Src::resolve;
        let out =
            lock(&self.side.matcher).post_by(spec, req, &resolve, &mut multi_recv::take, front);
        for (recv, info, held) in out.matched {
            if let Some(req) =
                super::srx::take_held(self, self.srx.as_deref(), recv, info, held, false)
            {
                self.repost(req);
            }
        }
        self.end_buffers(out.ended);
    }

    /// Reports the release of multi-receive buffers that ended without
    /// the message they were offered. Call with no lock of the endpoint
    /// held.
    pub(crate) fn end_buffers(&self, ended: impl IntoIterator<Item = RecvReq>) {
        for r in ended {
            multi_recv::end(self, r, false);
        }
    }

    /// Takes back a message a dropped receive future did not read: the
    /// oldest posted receive that accepts it gets it, else it goes ahead
    /// of every buffered message; with `after` (a dropped multi-receive
    /// stream's messages, handed back in their order) behind those given
    /// back before it.
    pub(crate) fn take_back(&self, r: Returned, after: bool) {
        if self.is_closed() {
            return;
        }
        // Under the registry's lock: the receive that takes it is
        // registered if a part of an awaited buffer (`arriving`).
        let given = self.put_back_registered(&mut lock(&self.arriving), r, after);
        if let Some(d) = given {
            d.deliver(self);
        }
    }

    /// Where a given-back message goes: the receive that takes it, for
    /// the caller to deliver it to with no lock of the endpoint held, or
    /// buffered (`None`). Takes the matcher's lock only.
    pub(crate) fn put_back(
        &self,
        mut r: Returned,
        after: bool,
    ) -> Option<(RecvReq, MsgInfo, bytes::Bytes, Sender)> {
        let info = r.info();
        let data = r.take_bytes().freeze();
        // A sender not in the AV (`FI_SOURCE_ERR`) came back with its
        // address.
        let addr = decode_sockaddr(&r.raw).unwrap_or_else(|_| self.key_of(info.src));
        let from = Sender {
            addr,
            key: info.key,
        };
        let key = self.src(addr, info.key);
        let mut ended = Vec::new();
        let mut m = lock(&self.side.matcher);
        let out = match match_arrival(&mut m, &info, &mut ended) {
            Some(mut req) => {
                self.report_here(&mut req);
                Some((req, info, data, from))
            }
            None => {
                let len = data.len();
                let held = self.held_forced(Unexp::Eager(data, from), len);
                if after {
                    m.push_unexpected_front_after(key, info, held);
                } else {
                    m.push_unexpected_front(key, info, held);
                }
                None
            }
        };
        drop(m);
        self.end_buffers(ended);
        out
    }

    /// The matcher's raw identity of the sender with AV handle `src`: its
    /// address when known; an unknown one stays unknown (the unspecified
    /// address resolves to none).
    pub(crate) fn key_of(&self, src: weft_core::addr::FiAddr) -> SocketAddr {
        match &self.cfg.av {
            Some(av) if src != FI_ADDR_NOTAVAIL => lock(av)
                .lookup(src)
                .ok()
                .and_then(|b| decode_sockaddr(b).ok()),
            _ => None,
        }
        .unwrap_or_else(|| SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, 0)))
    }
}
