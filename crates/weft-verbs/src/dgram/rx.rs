//! The receive side of a DGRAM endpoint and its work completions: each
//! datagram is matched to the oldest posted receive that takes its
//! source, copied out of its slot, and the slot goes back to the queue
//! pair.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::Ordering;

use weft_core::addr::{FiAddr, FI_ADDR_NOTAVAIL, FI_ADDR_UNSPEC};
use weft_core::completion::{CqEntry, CqErrEntry, Returned};
use weft_core::credits::Credits;
use weft_core::flags::{Caps, OpFlags};
use weft_core::provider::{RecvReq, Rejected};
use weft_core::recv_completion::{self, RecvCtx};
use weft_core::sync::lock;
use weft_core::tagmatch::MsgInfo;
use weft_core::{Error, Result};

use super::{Arrival, DgramShared, Held, RECV_BIT};
use crate::cq_poller::CqSink;
use crate::sys::{RecvRequest, WcOpcode, WcStatus, WorkCompletion, GRH_LEN};

impl RecvCtx for DgramShared {
    fn rx_credits(&self) -> &Credits {
        &self.rx
    }

    fn reported_addr(&self, a: FiAddr) -> FiAddr {
        match &self.cfg.av {
            Some(av) => lock(av).reported_addr(a),
            None => a,
        }
    }

    fn give_back(&self, mut r: Returned) {
        if self.is_closed() {
            return;
        }
        let info = r.info();
        self.requeue(Arrival {
            held: Held::Copied(r.take_bytes()),
            len: info.len,
            src: info.src,
            data: info.data,
        });
    }
}

/// The sender's IP from the 40 bytes before a UD payload: a GRH (IB,
/// RoCE v1, RoCE v2 over IPv6: source GID at bytes 8..24), or for RoCE v2
/// over IPv4 20 unused bytes and then the IPv4 header (source at 12..16
/// of it).
pub(super) fn grh_source(grh: &[u8; GRH_LEN]) -> Option<IpAddr> {
    // A GRH starts with IP version 6; the IPv4 form leaves its first 20
    // bytes unused (zeroed by rxe), so that test comes first.
    if grh[0] >> 4 == 6 {
        let mut g = [0u8; 16];
        g.copy_from_slice(&grh[8..24]);
        let v6 = Ipv6Addr::from(g);
        return Some(match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        });
    }
    if grh[20] >> 4 == 4 {
        let s = &grh[32..36];
        return Some(IpAddr::V4(Ipv4Addr::new(s[0], s[1], s[2], s[3])));
    }
    None
}

/// The traffic class of a datagram from the header before it: the
/// GRH's (bits 4..12), or the TOS byte of RoCE v2's IPv4 header.
pub(super) fn grh_tclass(grh: &[u8; GRH_LEN]) -> Option<u8> {
    if grh[0] >> 4 == 6 {
        return Some((grh[0] << 4) | (grh[1] >> 4));
    }
    (grh[20] >> 4 == 4).then_some(grh[21])
}

impl DgramShared {
    /// Hands receive slot `slot` to the queue pair.
    pub(super) fn post_slot(&self, slot: u32) -> Result<()> {
        let pool = &self.res.recv_pool;
        pool.with(|mr| {
            let sge = mr.sge(pool.offset(slot), GRH_LEN + self.mtu)?;
            self.res.qp.post_recv(&RecvRequest {
                wr_id: RECV_BIT | u64::from(slot),
                sges: &[sge],
            })
        })
    }

    /// A slot is free again: back to the queue pair, unless the endpoint
    /// is closing (its queue pair flushes).
    fn recycle(&self, slot: u32) {
        if self.is_closed() {
            return;
        }
        if let Err(e) = self.post_slot(slot) {
            tracing::warn!(error = %e, slot, "verbs dgram: reposting a receive slot failed");
        }
    }

    /// Whether a receive from `src_filter` takes a datagram from `src`.
    fn takes(&self, src_filter: FiAddr, src: FiAddr) -> bool {
        src_filter == FI_ADDR_UNSPEC
            || !self.cfg.info.caps.contains(Caps::DIRECTED_RECV)
            || src_filter == src
    }

    pub(super) fn post_recv(&self, req: RecvReq) -> std::result::Result<(), Rejected<RecvReq>> {
        let reject = |err, req| Err(Rejected { err, req });
        if self.is_closed() {
            return reject(Error::OpBadState, req);
        }
        if req.tagged
            || req
                .flags
                .intersects(OpFlags::PEEK | OpFlags::CLAIM | OpFlags::DISCARD)
        {
            return reject(Error::NoSys, req);
        }
        if req.bufs.len() > self.cfg.info.rx_attr.iov_limit.max(1) {
            return reject(Error::Inval, req);
        }
        if !self.rx.try_take() {
            return reject(Error::Again, req);
        }
        let waiting = {
            let mut q = lock(&self.rxq);
            match q.arrived.iter().position(|a| self.takes(req.src, a.src)) {
                Some(i) => q.arrived.remove(i),
                None => {
                    q.posted.push_back(req);
                    return Ok(());
                }
            }
        };
        if let Some(a) = waiting {
            self.deliver(req, a);
        }
        Ok(())
    }

    /// Cancels the posted receive with `context`.
    pub(super) fn cancel(&self, context: u64) -> bool {
        let req = {
            let mut q = lock(&self.rxq);
            q.posted
                .iter()
                .position(|r| r.done.context == context)
                .and_then(|i| q.posted.remove(i))
        };
        match req {
            Some(r) => {
                recv_completion::cancel_recv(self, r);
                true
            }
            None => false,
        }
    }

    /// Copies a datagram into a receive, recycles its slot, and completes
    /// the receive. Should the receive's future be gone by the hand-over
    /// (it was dropped while the datagram was being copied in), the
    /// datagram comes back through `give_back` to the next receive.
    fn deliver(&self, mut req: RecvReq, a: Arrival) {
        let info = MsgInfo {
            key: None,
            src: a.src,
            tagged: false,
            tag: 0,
            len: a.len,
            data: a.data,
        };
        let slot = match a.held {
            Held::Slot(slot) => slot,
            Held::Copied(data) => return recv_completion::copy_and_deliver(self, req, info, &data),
        };
        let pool = &self.res.recv_pool;
        let copied = pool.scatter(pool.offset(slot) + GRH_LEN, a.len, &mut req.bufs);
        self.recycle(slot);
        match copied {
            Ok(placed) => recv_completion::deliver(self, req, info, placed),
            Err((e, placed)) => recv_completion::fail_recv(self, req, info, placed, e),
        }
    }

    /// A datagram whose receive went away: to the next receive that
    /// takes it, or first in line for one.
    fn requeue(&self, a: Arrival) {
        let req = {
            let mut q = lock(&self.rxq);
            match q.posted.iter().position(|r| self.takes(r.src, a.src)) {
                Some(i) => q.posted.remove(i),
                None => {
                    q.arrived.push_front(a);
                    return;
                }
            }
        };
        if let Some(r) = req {
            self.deliver(r, a);
        }
    }

    /// A datagram arrived in `slot`.
    fn arrived(&self, wc: &WorkCompletion, slot: u32) {
        let pool = &self.res.recv_pool;
        let mut grh = [0u8; GRH_LEN];
        let src = match pool.with(|mr| mr.read_at(pool.offset(slot), &mut grh)) {
            Ok(()) => {
                if let Some(tc) = grh_tclass(&grh) {
                    self.rx_tclass.store(u16::from(tc), Ordering::Relaxed);
                }
                self.source_of(&grh, wc.src_qp)
            }
            Err(_) => FI_ADDR_NOTAVAIL,
        };
        let a = Arrival {
            held: Held::Slot(slot),
            len: (wc.byte_len as usize).saturating_sub(GRH_LEN),
            src,
            data: wc.imm_data.map(u64::from),
        };
        let req = {
            let mut q = lock(&self.rxq);
            match q.posted.iter().position(|r| self.takes(r.src, src)) {
                Some(i) => q.posted.remove(i),
                None => {
                    q.arrived.push_back(a);
                    return;
                }
            }
        };
        if let Some(r) = req {
            self.deliver(r, a);
        }
    }

    /// The AV handle of a datagram's sender, if its address was inserted
    /// (and so resolved) here.
    fn source_of(&self, grh: &[u8; GRH_LEN], src_qp: u32) -> FiAddr {
        let (Some(ip), Some(av)) = (grh_source(grh), &self.cfg.av) else {
            return FI_ADDR_NOTAVAIL;
        };
        match self.resolver.source(ip, src_qp) {
            Some(raw) => lock(av).find(&raw).unwrap_or(FI_ADDR_NOTAVAIL),
            None => FI_ADDR_NOTAVAIL,
        }
    }
}

impl CqSink for DgramShared {
    fn on_completion(&self, wc: &WorkCompletion) {
        if wc.wr_id & RECV_BIT != 0 {
            let slot = (wc.wr_id & !RECV_BIT) as u32;
            match wc.status {
                WcStatus::Success if wc.opcode == WcOpcode::Recv => self.arrived(wc, slot),
                // Flushed at close: nothing to give back.
                WcStatus::WrFlushErr => {}
                _ => {
                    tracing::debug!(status = ?wc.status, "verbs dgram: receive failed");
                    self.recycle(slot);
                }
            }
            return;
        }
        let Some(op) = lock(&self.inflight).remove(&wc.wr_id) else {
            return;
        };
        if let Some(slot) = op.slot {
            self.res.send_pool.put(slot);
        }
        self.tx.release(1);
        match wc.to_error() {
            None => op.done.complete(CqEntry {
                len: op.len,
                flags: OpFlags::SEND | OpFlags::MSG,
                ..CqEntry::default()
            }),
            Some(e) => op
                .done
                .fail(CqErrEntry::new(0, OpFlags::SEND | OpFlags::MSG, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_of_roce_v2_ipv4() {
        let mut g = [0u8; GRH_LEN];
        g[20] = 0x45;
        g[32..36].copy_from_slice(&[10, 66, 0, 2]);
        assert_eq!(
            grh_source(&g),
            Some(IpAddr::V4(Ipv4Addr::new(10, 66, 0, 2)))
        );
    }

    #[test]
    fn source_of_grh_with_mapped_and_plain_ipv6() {
        let mut g = [0u8; GRH_LEN];
        g[0] = 0x60;
        let mapped = Ipv4Addr::new(127, 0, 0, 1).to_ipv6_mapped();
        g[8..24].copy_from_slice(&mapped.octets());
        assert_eq!(grh_source(&g), Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        let v6: Ipv6Addr = "fe80::1".parse().unwrap();
        g[8..24].copy_from_slice(&v6.octets());
        assert_eq!(grh_source(&g), Some(IpAddr::V6(v6)));
    }

    #[test]
    fn unknown_header_has_no_source() {
        assert_eq!(grh_source(&[0u8; GRH_LEN]), None);
        assert_eq!(grh_tclass(&[0u8; GRH_LEN]), None);
    }

    #[test]
    fn tclass_of_ipv4_tos_and_of_grh() {
        let mut g = [0u8; GRH_LEN];
        g[20] = 0x45;
        g[21] = 46 << 2;
        assert_eq!(grh_tclass(&g), Some(184));
        let mut g = [0u8; GRH_LEN];
        // Version 6, traffic class 0xB8, flow label 0x12345.
        g[0..4].copy_from_slice(&[0x6B, 0x81, 0x23, 0x45]);
        assert_eq!(grh_tclass(&g), Some(0xB8));
    }
}
