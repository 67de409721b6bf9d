//! The memory a receive work request fills, and a message taken out of
//! it to wait for a receive that is not that work request's.

use std::sync::Arc;

use bytes::BytesMut;
use weft_core::completion::{trim_bufs, CqEntry, CqShared, OpDone};
use weft_core::counter::CounterShared;
use weft_core::flags::OpFlags;
use weft_core::Error;

use super::recv_finish::{is_remote_write, recv_error};
use crate::local_mem::RecvTargets;
use crate::slot_pool::SlotPool;
use crate::sys::WorkCompletion;
use crate::user_bufs::unregister_before;

/// The memory a receive work request fills.
pub(in crate::msg) enum RecvMem {
    /// A bounce slot; the receive keeps its own buffers.
    Slot(u32),
    /// The receive's own buffers, registered (zero-length ones are not
    /// registered and are given back as they were).
    Registered {
        mrs: RecvTargets,
        empty: Vec<BytesMut>,
    },
}

/// The buffer lengths of a receive whose buffers are a work request's
/// memory, for buffers like them.
pub(in crate::msg) trait Shape {
    fn shape(&self) -> Vec<usize>;
}

impl Shape for RecvMem {
    fn shape(&self) -> Vec<usize> {
        match self {
            RecvMem::Slot(_) => Vec::new(),
            RecvMem::Registered { mrs, empty } => mrs
                .iter()
                .map(|m| m.len())
                .chain(empty.iter().map(|b| b.len()))
                .collect(),
        }
    }
}

impl RecvMem {
    /// Its bounce slot, if it is one.
    #[inline(always)]
    pub(super) fn slot(&self) -> Option<u32> {
        match self {
            RecvMem::Slot(s) => Some(*s),
            RecvMem::Registered { .. } => None,
        }
    }

    /// The caller's buffers back (a slot goes back to `pool`).
    pub(super) fn into_bufs(self, pool: &SlotPool) -> Vec<BytesMut> {
        match self {
            RecvMem::Slot(slot) => {
                pool.put(slot);
                Vec::new()
            }
            RecvMem::Registered { mrs, empty } => unregister_before(mrs, empty),
        }
    }

    /// The message `wc` reports in this memory, taken out of it: copied
    /// out of a slot (which is free again), or with the buffers.
    pub(super) fn into_arrived(
        self,
        wc: &WorkCompletion,
        pool: &SlotPool,
        route: &Route,
    ) -> Arrived {
        let len = wc.byte_len as usize;
        let body = if is_remote_write(wc) {
            // Nothing landed in the memory.
            drop(self.into_bufs(pool));
            Body::RemoteWrite { len }
        } else if let Some(e) = recv_error(wc) {
            drop(self.into_bufs(pool));
            Body::Failed(e)
        } else {
            let bufs = match self {
                RecvMem::Slot(slot) => {
                    let mut b = vec![BytesMut::zeroed(len)];
                    pool.scatter_put(slot, len, &mut b)
                        .map(|_| b)
                        .map_err(|(e, _)| e)
                }
                RecvMem::Registered { mrs, empty } => {
                    let (n, k) = (mrs.len(), empty.len());
                    let mut b = unregister_before(mrs, empty);
                    if b.len() - k < n {
                        // A buffer whose registration could not be undone
                        // is leaked with its part of the message.
                        Err(Error::Io)
                    } else {
                        trim_bufs(&mut b, len);
                        Ok(b)
                    }
                }
            };
            match bufs {
                Ok(bufs) => Body::Data { bufs, len },
                Err(e) => Body::Failed(e),
            }
        };
        Arrived {
            body,
            imm: wc.imm_data,
            route: route.clone(),
        }
    }
}

/// Where a completion is reported when its receive names no queue: the
/// CQ and counter of the endpoint a message arrived at (receives of a
/// shared context have none of their own; an endpoint's own receives
/// need none).
#[derive(Clone, Default)]
pub(in crate::msg) struct Route {
    pub cq: Option<Arc<CqShared>>,
    pub cntr: Option<Arc<CounterShared>>,
}

impl Route {
    pub(super) fn apply(&self, done: &mut OpDone) {
        if done.cq.is_none() {
            done.cq.clone_from(&self.cq);
        }
        if done.cntr.is_none() {
            done.cntr.clone_from(&self.cntr);
        }
    }
}

/// A message that did not end in its own receive: held until a receive
/// takes it.
pub(in crate::msg) struct Arrived {
    pub(super) body: Body,
    pub(super) imm: Option<u32>,
    pub(super) route: Route,
}

impl Arrived {
    /// A message (not a failed receive, nor a write's notification).
    pub(in crate::msg) fn is_message(&self) -> bool {
        matches!(self.body, Body::Data { .. })
    }
}

pub(super) enum Body {
    /// `len` bytes, in `bufs` (cut to what they hold).
    Data { bufs: Vec<BytesMut>, len: usize },
    /// A write with remote CQ data of `len` bytes consumed the receive.
    RemoteWrite { len: usize },
    /// The device failed the receive (a message too long for the memory
    /// it landed in is `Trunc`).
    Failed(Error),
}

/// The message of a completion whose receive's future went away, to hand
/// to the next receive (reported on the queues of `route`).
pub(super) fn arrived_back(e: CqEntry, route: Route) -> Arrived {
    let imm = e
        .flags
        .contains(OpFlags::REMOTE_CQ_DATA)
        .then_some(e.data as u32);
    let body = if e.flags.contains(OpFlags::REMOTE_WRITE) {
        Body::RemoteWrite { len: e.len }
    } else {
        Body::Data {
            len: e.len,
            bufs: e.bufs,
        }
    };
    Arrived { body, imm, route }
}
