//! One rdma_cm event channel, read by a Tokio task, its events routed to
//! whoever owns the id they concern.
//!
//! Ids created for incoming requests report on the listener's channel, so a
//! passive endpoint's channel carries the events of every connection it
//! accepted; each accepting endpoint subscribes to its id's token. Events
//! that arrive before their owner subscribes are kept for it: those of a
//! listener, and those of a request's new id from the request on. Whoever
//! takes a request's id and lets it go without subscribing unsubscribes
//! it. Events of any other id nobody subscribes to (one whose owner has
//! let it go, e.g. the time-wait end of a connection already dropped) are
//! dropped: kept, they would pile up for every connection that came and
//! went.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::runtime::Handle;
use tokio::sync::mpsc;
use weft_core::hash::{fast_map, FastMap};
use weft_core::sync::lock;
use weft_core::{Error, Result};

use crate::sys::{CmEvent, CmEventKind, EventChannel};

enum Route {
    To(mpsc::UnboundedSender<CmEvent>),
    Held(VecDeque<CmEvent>),
}

/// A channel and its event router.
pub struct CmChannel {
    pub ch: Arc<EventChannel>,
    routes: Mutex<FastMap<u64, Route>>,
    task: Mutex<Option<tokio::task::AbortHandle>>,
}

impl std::fmt::Debug for CmChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmChannel").field("ch", &self.ch).finish()
    }
}

impl CmChannel {
    /// A new channel whose reader runs on `rt`.
    pub fn open(rt: &Handle) -> Result<Arc<CmChannel>> {
        let ch = EventChannel::new()?;
        let me = Arc::new(CmChannel {
            ch,
            routes: Mutex::new(fast_map()),
            task: Mutex::new(None),
        });
        let afd = {
            let _g = rt.enter();
            me.ch.register_async()?
        };
        let weak = Arc::downgrade(&me);
        let t = rt.spawn(async move {
            loop {
                let Ok(mut guard) = afd.readable().await else {
                    return;
                };
                let Some(me) = weak.upgrade() else { return };
                loop {
                    match me.ch.get_event() {
                        Ok(Some(ev)) => me.dispatch(ev),
                        Ok(None) => {
                            guard.clear_ready();
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "rdma_cm event channel failed");
                            return;
                        }
                    }
                }
            }
        });
        *lock(&me.task) = Some(t.abort_handle());
        Ok(me)
    }

    fn dispatch(&self, ev: CmEvent) {
        // A request belongs to the listener, every other event to its id.
        let token = match (ev.kind, ev.listen_token) {
            (CmEventKind::ConnectRequest, Some(l)) => l,
            _ => ev.id_token,
        };
        let mut g = lock(&self.routes);
        let new_id = ev.new_id.as_ref().map(|id| id.token());
        if let Some(t) = new_id {
            g.entry(t).or_insert_with(|| Route::Held(VecDeque::new()));
        }
        match g.get_mut(&token) {
            Some(Route::To(tx)) => {
                if tx.send(ev).is_err() {
                    // The owner is gone; nothing to deliver to (a request's
                    // id is destroyed with the event).
                    g.remove(&token);
                    if let Some(t) = new_id {
                        g.remove(&t);
                    }
                }
            }
            Some(Route::Held(q)) => q.push_back(ev),
            // A request before its listener subscribed (it does at once).
            None if ev.kind == CmEventKind::ConnectRequest => {
                g.insert(token, Route::Held(VecDeque::from([ev])));
            }
            None => {
                tracing::trace!(kind = ?ev.kind, "rdma_cm event for an id nobody owns; dropped");
            }
        }
    }

    /// Events of the id with `token` from now on (and any held for it).
    pub fn subscribe(&self, token: u64) -> mpsc::UnboundedReceiver<CmEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut g = lock(&self.routes);
        if let Some(Route::Held(q)) = g.remove(&token) {
            for ev in q {
                let _ = tx.send(ev);
            }
        }
        g.insert(token, Route::To(tx));
        rx
    }

    /// Stops routing (and holding) events of `token`.
    pub fn unsubscribe(&self, token: u64) {
        let mut g = lock(&self.routes);
        g.remove(&token);
        // The room a crowd of connections needed goes back once they did.
        let len = g.len();
        if g.capacity() > 64 && len * 4 < g.capacity() {
            g.shrink_to(len * 2);
        }
    }

    /// Stops the reader.
    pub fn close(&self) {
        if let Some(t) = lock(&self.task).take() {
            t.abort();
        }
        lock(&self.routes).clear();
    }
}

impl Drop for CmChannel {
    fn drop(&mut self) {
        self.close();
    }
}

/// How long address and route resolution may each take.
pub const RESOLVE_MS: u32 = 2000;

/// rdma_cm address then route resolution of `id` towards `dest` (from
/// `src`, if given), awaited on `rx`, the id's events.
pub async fn resolve(
    id: &crate::sys::CmId,
    rx: &mut mpsc::UnboundedReceiver<CmEvent>,
    src: Option<std::net::SocketAddr>,
    dest: std::net::SocketAddr,
) -> std::result::Result<(), (Error, Vec<u8>)> {
    id.resolve_addr(src, dest, RESOLVE_MS)
        .map_err(|e| (e, Vec::new()))?;
    expect(rx, CmEventKind::AddrResolved).await?;
    id.resolve_route(RESOLVE_MS).map_err(|e| (e, Vec::new()))?;
    expect(rx, CmEventKind::RouteResolved).await?;
    Ok(())
}

/// Waits for the next event on `rx` of kind `want`. Any other event that
/// ends the attempt is an error, with the event's private data (a
/// rejection's reason); the channel closing is `Shutdown`.
pub async fn expect(
    rx: &mut mpsc::UnboundedReceiver<CmEvent>,
    want: CmEventKind,
) -> std::result::Result<CmEvent, (Error, Vec<u8>)> {
    loop {
        let Some(ev) = rx.recv().await else {
            return Err((Error::Shutdown, Vec::new()));
        };
        if ev.kind == want {
            return Ok(ev);
        }
        match ev.kind {
            // Informational while connecting.
            CmEventKind::ConnectResponse | CmEventKind::AddrChange => continue,
            _ => {
                let err = ev.error().unwrap_or(Error::Other);
                return Err((err, ev.private_data));
            }
        }
    }
}
