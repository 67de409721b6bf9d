//! The close of a MSG endpoint, and the last poll of one bound to a
//! shared receive context.
//!
//! A close moves the queue pair to the error state and stops the CQ
//! driver; what the endpoint had posted is discarded without completions.
//! A shared receive context's receives are not the endpoint's, though,
//! and its queue pair may hold some:
//!
//! * one a message filled just before the close: its completion is on
//!   the CQ already, and the close polls the CQ once at once, handing it
//!   to the context;
//! * one it was filling at the move to the error state: the device
//!   flushes it later, onto the CQ nobody polls any more. So the queue
//!   pair and CQ are not dropped with the endpoint: a task keeps them
//!   until the device says it consumes nothing more from the shared
//!   queue (`IBV_EVENT_QP_LAST_WQE_REACHED`, from the device's async
//!   events: `crate::async_reader`), or [`LAST_WQE_WAIT`] passes, then
//!   polls the CQ empty once more, and lets them go. What it finds
//!   completes as above, on the closed endpoint's rx CQ: a flushed
//!   receive ends `Canceled`, a filled one with its message (lost if the
//!   user closed that CQ meanwhile).
//!
//! A connect or accept that fails after building its queue pair
//! (`give_up`) waits for the same event and bound, in a task of its own
//! that also ends what the endpoint posted on the queue pair: librdmacm
//! moves it to RTR before the connection is established, so it may hold
//! shared receives although no CQ driver ever ran. For the same reason a
//! close with no driver polls through a driverless poller of the CQ.
//!
//! A close's last-poll task (not the give-up's, which holds the whole
//! link and destroys its queue pair itself: `give_up`) keeps only what
//! that poll needs: the queue pair (which holds its CQ, protection
//! domain, SRQ and the cm id's C object alive), the poller of its CQ,
//! the shared receive context (whose receives the poll completes) and
//! the device's event reader. The endpoint's slot pools,
//! the registrations of a megabyte or more each, go when the endpoint is
//! dropped, as before: deregistering memory under a queue pair in the
//! error state is safe (a late access of the device fails, it does not
//! land).
//!
//! A connection that ended before the close (the peer's disconnect, a
//! critical error) moved its queue pair to the error state then
//! ([`MsgShared::end_qp`]), and the last-WQE event may have come before
//! the close. So the wait is registered at that move, not at the close,
//! and the bound counts from it. Which of the two registers is decided
//! under one lock ([`QpEnd`](crate::device_events::QpEnd)): the first to
//! come registers the one wait (and the end moves the queue pair), the
//! close takes it whichever came first, and the other registers nothing
//! (a close racing the peer's disconnect keeps its wait). The device
//! flushes in answer to the move to the error state, not to the close,
//! and until the close the endpoint's own CQ driver still runs and hands
//! such a flush to the context as any completion. A close more than
//! [`LAST_WQE_WAIT`] after the end (or after the event) polls the CQ at
//! once, as much as a fresh close would have waited. Where the device moved the queue pair to the
//! error state itself before we did (a failed work request, or the kernel
//! on the peer's disconnect request), its event may precede the wait:
//! the bound, from our move, then stands in, as on a device without the
//! event.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;

use tokio::runtime::Handle;
use tokio::time::Instant;
use weft_core::provider::ProviderSrx;
use weft_core::sync::lock;

use weft_core::completion::CqErrEntry;
use weft_core::flags::OpFlags;
use weft_core::Error;

use super::complete::{RecvMem, Route, Waiting};
use super::srx::{route_of, MsgSrx, SRX_WR_BIT};
use super::{Link, MsgShared};
use crate::async_reader::DeviceEvents;
use crate::cq_poller::{self, CqPoller};
use crate::device_events::{Closing, LastWqe};
use crate::sys::QueuePair;

/// How long a closed endpoint bound to a shared receive context waits
/// for its queue pair's last-WQE event before the last poll. A device
/// that raises the event ends the wait at once; soft-RoCE raises none
/// (its responder flushes the receive it holds as it handles the move to
/// the error state, in its own task: microseconds on a host, a few
/// milliseconds in an emulated VM), so there this is the wait, and it
/// must cover that task being scheduled late on a loaded machine. Half a
/// second does, with room; what it costs is a queue pair and CQ kept
/// that long after the close (the whole half second on soft-RoCE), and
/// nothing waits for the task: neither the close, nor the context's
/// close (whose receives end `Canceled` meanwhile as always; a
/// completion the task finds then belongs to no receive), nor a runtime
/// dropped meanwhile (the task is dropped with it, and the queue pair
/// and CQ with the task). Counted from the queue pair's move to the
/// error state, which may precede the close (see the module).
pub(super) const LAST_WQE_WAIT: Duration = Duration::from_millis(500);

impl MsgShared {
    /// Moves the queue pair of a connection that ended (not closed) to
    /// the error state, waiting for its last WQE first if the close will;
    /// nothing if the close came first (it moves the queue pair itself).
    pub(super) fn end_qp(&self, l: &Link) {
        lock(&self.qp_end).end(
            || self.last_wqe_of(l),
            || {
                let _ = l.qp.to_error();
            },
        );
    }

    /// The wait for `l`'s last WQE, if its close waits for one: bound to a
    /// shared receive context whose device's events are read (`events`
    /// is set only for an endpoint bound to one).
    fn last_wqe_of(&self, l: &Link) -> Option<LastWqe> {
        let events = lock(&self.events).clone()?;
        Some(events.last_wqe(l.qp.qp_num()))
    }

    /// Ends the connection and drops what is posted.
    pub(super) fn close_now(&self) {
        let ep = self;
        if ep.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let link = lock(&ep.link).clone();
        let msg_srx = ep.srx();
        let events = lock(&ep.events).clone();
        // Waited for before the move to the error state, which raises it:
        // at the end of the connection if it ended first. Registered under
        // the lock the end takes, so an end racing this close registers
        // nothing over it.
        let closing = lock(&ep.qp_end).close(|| link.as_ref().and_then(|l| ep.last_wqe_of(l)));
        let Closing { last_wqe, moved_at } = closing.unwrap_or_default();
        if let Some(l) = &link {
            let _ = l.id.disconnect();
            let _ = l.qp.to_error();
        }
        // From the move to the error state (this one's, unless the end's
        // came first): the bound never counts from before it.
        let since = moved_at.unwrap_or_else(Instant::now);
        // No driver ran yet (a close during a connect or accept; one that
        // fails after this close leaves its link to it): librdmacm moves
        // the queue pair to RTR as it handles the reply or the accept, so
        // it may have taken shared receives all the same, and only a
        // poller of our own finds them.
        let poller = ep.stop_drivers().or_else(|| {
            link.as_ref()
                .filter(|_| msg_srx.is_some())
                .map(|l| cq_poller::detached(l.cq.clone()))
        });
        if let (Some(p), Some(l)) = (poller, &link) {
            ep.hand_off(p, l, last_wqe, since, events);
        }
        // Outstanding operations are discarded without completions; their
        // buffers stay registered until the endpoint, and its link, go.
        lock(&ep.early_recvs).clear();
        let waiting = lock(&ep.rxq).forget();
        drop(waiting);
        // The link read above: once closed, neither `build_link` nor
        // `give_up_link` changes it (both look under its lock).
        let cm = lock(&ep.cm).take();
        if let (Some(c), Some(l)) = (cm, &link) {
            c.unsubscribe(l.id.token());
        }
    }
}

impl MsgShared {
    /// Aborts the endpoint's tasks (the CQ driver's, the watcher's) and
    /// stops its poller, which it returns: a close and a `start` that
    /// finds itself closed both stop them so.
    pub(super) fn stop_drivers(&self) -> Option<Arc<CqPoller>> {
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
        cq_poller::stop(&self.poller)
    }

    /// Hands what `l`'s queue pair, in the error state since `since`,
    /// took of the shared receive context back to it: what is on the CQ
    /// at once, what the device flushes later by the last poll. Nothing
    /// for an endpoint with its own receive queue (its receives go with
    /// it).
    fn hand_off(
        &self,
        p: Arc<CqPoller>,
        l: &Link,
        last_wqe: Option<LastWqe>,
        since: Instant,
        events: Option<Arc<DeviceEvents>>,
    ) {
        let (Some(x), Some(srx)) = (self.srx(), self.cfg.srx.clone()) else {
            return;
        };
        // A message that arrived before the move took one of the
        // context's receives, and its completion waits on this CQ, which
        // nobody polls from now on: hand it to the context, or that
        // receive would wait for good (and its work request count as
        // posted). The queue pair is in the error state, so it takes no
        // more. Completions of the endpoint's own operations are
        // dropped, as the rest of what it had posted.
        p.drain_into(&|wc| {
            if wc.wr_id & SRX_WR_BIT != 0 {
                x.on_completion(wc, &self.cfg);
            }
        });
        // What the device flushes later is found by the last poll.
        last_poll(
            &self.rt,
            Leftover {
                poller: p,
                qp: l.qp.clone(),
                srx,
                route: route_of(&self.cfg),
                last_wqe,
                until: since + LAST_WQE_WAIT,
                _events: events,
            },
        );
    }
}

/// Fails each of `waiting` `Canceled` with its buffers; a receive whose
/// buffers are its work request's memory (registered: its own, or a pool
/// buffer, which is not deregistered and would go back to the
/// application) gets buffers like them instead, as a withdrawn receive
/// does, since that work request is still posted. Returns that memory,
/// and the bounce slots, for the caller to keep until the device is done
/// with the work requests.
pub(super) fn fail_withdrawn(waiting: Vec<(Waiting, Option<RecvMem>)>) -> Vec<RecvMem> {
    let mut kept = Vec::new();
    for (mut w, mem) in waiting {
        let mut bufs = w.bufs.take().unwrap_or_default();
        match mem {
            Some(RecvMem::Registered { mrs, empty }) => {
                bufs = mrs.iter().map(|m| BytesMut::zeroed(m.len())).collect();
                // Zero-length ones were never registered.
                bufs.extend(empty);
                kept.push(RecvMem::Registered {
                    mrs,
                    empty: Vec::new(),
                });
            }
            Some(m @ RecvMem::Slot(_)) => kept.push(m),
            None => {}
        }
        w.done.fail(
            CqErrEntry::new(0, OpFlags::RECV | OpFlags::MSG, Error::Canceled).with_bufs(bufs),
        );
    }
    kept
}

/// What a closed endpoint bound to a shared receive context keeps for
/// its last poll.
struct Leftover {
    poller: Arc<CqPoller>,
    /// Its queue pair, and with it its CQ, destroyed when this goes
    /// (unless the endpoint, not dropped yet, still holds them).
    qp: Arc<QueuePair>,
    srx: Arc<dyn ProviderSrx>,
    route: Route,
    last_wqe: Option<LastWqe>,
    /// The end of the wait: [`LAST_WQE_WAIT`] after the move to the
    /// error state.
    until: Instant,
    /// Keeps the device's event reader running through the wait.
    _events: Option<Arc<DeviceEvents>>,
}

/// Waits for the queue pair's last WQE (until [`LAST_WQE_WAIT`] after
/// its move to the error state), then hands every shared receive's
/// completion left on the CQ to the context.
fn last_poll(rt: &Handle, left: Leftover) {
    rt.spawn(async move {
        let until = left.until;
        let heard = match left.last_wqe {
            Some(w) => tokio::time::timeout_at(until, w).await.is_ok(),
            None => {
                tokio::time::sleep_until(until).await;
                false
            }
        };
        let Some(x) = left.srx.as_any().downcast_ref::<MsgSrx>() else {
            return;
        };
        let route = &left.route;
        let n = left.poller.drain_into(&|wc| {
            if wc.wr_id & SRX_WR_BIT != 0 {
                x.complete(wc, route);
            }
        });
        tracing::debug!(
            qp = left.qp.qp_num(),
            last_wqe = heard,
            completions = n,
            "verbs msg: closed endpoint's last poll"
        );
    });
}
