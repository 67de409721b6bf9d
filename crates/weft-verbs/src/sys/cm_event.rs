//! rdma_cm events, copied out of librdmacm into owned Rust values.

use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::{ibv_qp_type, rdma_cm_event, rdma_cm_event_type};
use weft_core::Error;

use super::ah::AhAttr;
use super::cm::{next_token, CmId, EventChannel};
use super::errno_error;

/// Most private data an event can carry (`RDMA_MAX_PRIVATE_DATA`).
const MAX_PRIVATE_DATA: usize = 256;

/// Event type (`rdma_cm_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum CmEventKind {
    AddrResolved,
    AddrError,
    RouteResolved,
    RouteError,
    ConnectRequest,
    ConnectResponse,
    ConnectError,
    Unreachable,
    Rejected,
    Established,
    Disconnected,
    DeviceRemoval,
    MulticastJoin,
    MulticastError,
    AddrChange,
    TimewaitExit,
    Other(u32),
}

impl CmEventKind {
    fn from_raw(v: rdma_cm_event_type::Type) -> CmEventKind {
        use rdma_cm_event_type::*;
        match v {
            RDMA_CM_EVENT_ADDR_RESOLVED => CmEventKind::AddrResolved,
            RDMA_CM_EVENT_ADDR_ERROR => CmEventKind::AddrError,
            RDMA_CM_EVENT_ROUTE_RESOLVED => CmEventKind::RouteResolved,
            RDMA_CM_EVENT_ROUTE_ERROR => CmEventKind::RouteError,
            RDMA_CM_EVENT_CONNECT_REQUEST => CmEventKind::ConnectRequest,
            RDMA_CM_EVENT_CONNECT_RESPONSE => CmEventKind::ConnectResponse,
            RDMA_CM_EVENT_CONNECT_ERROR => CmEventKind::ConnectError,
            RDMA_CM_EVENT_UNREACHABLE => CmEventKind::Unreachable,
            RDMA_CM_EVENT_REJECTED => CmEventKind::Rejected,
            RDMA_CM_EVENT_ESTABLISHED => CmEventKind::Established,
            RDMA_CM_EVENT_DISCONNECTED => CmEventKind::Disconnected,
            RDMA_CM_EVENT_DEVICE_REMOVAL => CmEventKind::DeviceRemoval,
            RDMA_CM_EVENT_MULTICAST_JOIN => CmEventKind::MulticastJoin,
            RDMA_CM_EVENT_MULTICAST_ERROR => CmEventKind::MulticastError,
            RDMA_CM_EVENT_ADDR_CHANGE => CmEventKind::AddrChange,
            RDMA_CM_EVENT_TIMEWAIT_EXIT => CmEventKind::TimewaitExit,
            other => CmEventKind::Other(other),
        }
    }
}

/// Connection parameters carried by an RC event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct ConnInfo {
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: bool,
    /// The peer's QP number.
    pub qp_num: u32,
}

/// UD parameters carried by a UDP-port-space event: how to reach the peer.
///
/// Only `Established` (on the active side, from the peer's accept) carries a
/// real address; on a `ConnectRequest` the kernel reports zeros (no QP
/// number or address vector of the requester), so the passive side learns
/// the peer from private data or the first datagram's `src_qp` and GRH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdParam {
    /// Peer QP number.
    pub qp_num: u32,
    /// Peer Q_Key.
    pub qkey: u32,
    /// Address vector for an [`super::AddressHandle`].
    pub ah_attr: AhAttr,
}

/// An rdma_cm event, copied out of librdmacm (and already acknowledged).
#[derive(Debug)]
pub struct CmEvent {
    /// What happened.
    pub kind: CmEventKind,
    /// Status: 0, a negative errno, or for `Rejected` the (positive) IB CM
    /// reject reason (28 = consumer reject). See [`CmEvent::error`].
    pub status: i32,
    /// [`CmId::token`] of the id the event concerns; for `ConnectRequest`
    /// the listener's.
    pub id_token: u64,
    /// For `ConnectRequest`: the listener's token.
    pub listen_token: Option<u64>,
    /// For `ConnectRequest`: the new id of the incoming connection; accept
    /// or reject it (dropping it destroys it, which rejects).
    pub new_id: Option<CmId>,
    /// Private data from the peer. The transport may pad it (IB/RoCE CM
    /// delivers the full field: 56 bytes for a request, 196 for an accept,
    /// 148 for a reject), so protocols must carry their own length.
    pub private_data: Vec<u8>,
    /// Connection parameters (RC ids).
    pub conn: Option<ConnInfo>,
    /// Peer address (UD ids: `ConnectRequest`, `Established`), or the
    /// group's (`MulticastJoin`: QPN 0xFFFFFF).
    pub ud: Option<UdParam>,
}

impl CmEvent {
    /// The error this event reports, if any: `ConnRefused` for `Rejected`,
    /// the errno in `status` otherwise, or a kind-specific error for
    /// failure events without a status.
    pub fn error(&self) -> Option<Error> {
        if self.kind == CmEventKind::Rejected {
            return Some(Error::ConnRefused);
        }
        if self.status != 0 {
            return Some(errno_error(self.status.saturating_abs()));
        }
        match self.kind {
            CmEventKind::AddrError => Some(Error::AddrNotAvail),
            CmEventKind::RouteError | CmEventKind::Unreachable => Some(Error::HostUnreach),
            CmEventKind::ConnectError => Some(Error::ConnAborted),
            CmEventKind::DeviceRemoval => Some(Error::NoDev),
            CmEventKind::MulticastError => Some(Error::Io),
            _ => None,
        }
    }
}

/// Copies an event out.
///
/// # Safety
/// `ev` must be a valid, unacknowledged event of this channel, and the
/// channel's lock must be held.
pub(super) unsafe fn copy_event(channel: &Arc<EventChannel>, ev: *mut rdma_cm_event) -> CmEvent {
    // SAFETY: guaranteed by the caller.
    let e = unsafe { &*ev };
    let kind = CmEventKind::from_raw(e.event);
    // SAFETY: `e.id` is a live id of this channel (see get_event).
    let (id_token, is_ud) = unsafe {
        (
            (*e.id).context as usize as u64,
            (*e.id).qp_type == ibv_qp_type::IBV_QPT_UD,
        )
    };
    let mut new_id = None;
    let mut listen_token = None;
    if kind == CmEventKind::ConnectRequest {
        if let Some(id) = NonNull::new(e.id) {
            let token = next_token();
            // SAFETY: the new id is ours alone; nobody else knows it yet.
            unsafe { (*id.as_ptr()).context = token as usize as *mut libc::c_void };
            if !e.listen_id.is_null() {
                // SAFETY: the listener is a live id of this channel.
                listen_token = Some(unsafe { (*e.listen_id).context } as usize as u64);
            }
            // SAFETY: librdmacm created this id for the request and hands
            // it to us; nothing else owns it.
            new_id = Some(unsafe { CmId::adopt(id, token, channel) });
        }
    }
    let multicast = matches!(
        kind,
        CmEventKind::MulticastJoin | CmEventKind::MulticastError
    );
    // SAFETY: the event was zeroed and then filled by librdmacm; both
    // union members start with the same (pointer, length) pair, which
    // points into the event's own buffer when the length is non-zero
    // (multicast events reuse the pointer for a user context instead).
    let (pd_ptr, pd_len) = unsafe {
        if is_ud {
            (e.param.ud.private_data, e.param.ud.private_data_len)
        } else {
            (e.param.conn.private_data, e.param.conn.private_data_len)
        }
    };
    let private_data = if multicast || pd_ptr.is_null() || pd_len == 0 {
        Vec::new()
    } else {
        let len = usize::from(pd_len).min(MAX_PRIVATE_DATA);
        // SAFETY: `pd_len` bytes at `pd_ptr` are the event's private
        // data buffer (RDMA_MAX_PRIVATE_DATA bytes), valid until acked.
        unsafe { std::slice::from_raw_parts(pd_ptr.cast::<u8>(), len) }.to_vec()
    };
    let conn = if is_ud || multicast {
        None
    } else {
        // SAFETY: conn is the active member for non-UD ids.
        let c = unsafe { &e.param.conn };
        Some(ConnInfo {
            responder_resources: c.responder_resources,
            initiator_depth: c.initiator_depth,
            flow_control: c.flow_control,
            retry_count: c.retry_count,
            rnr_retry_count: c.rnr_retry_count,
            srq: c.srq != 0,
            qp_num: c.qp_num,
        })
    };
    // A join's event carries the group's address vector, QPN (0xFFFFFF)
    // and Q_Key, as a UD id's events do the peer's.
    let ud = if (is_ud && !multicast) || kind == CmEventKind::MulticastJoin {
        // SAFETY: ud is the active member for UD ids and multicast joins.
        let u = unsafe { &e.param.ud };
        Some(UdParam {
            qp_num: u.qp_num,
            qkey: u.qkey,
            ah_attr: AhAttr::from_raw(&u.ah_attr),
        })
    } else {
        None
    };
    CmEvent {
        kind,
        status: e.status,
        id_token,
        listen_token,
        new_id,
        private_data,
        conn,
        ud,
    }
}
