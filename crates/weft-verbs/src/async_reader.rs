//! The reader of each device context's async events: one Tokio task per
//! `ibv_context` in the process, started by the first endpoint that
//! needs it and ended when the last one lets it go (or its runtime
//! ends). What an event does is `device_events`'s.
//!
//! One per context, not per endpoint: the context has one async fd, each
//! event is read once, and an fd cannot be registered twice with one
//! reactor. The task holds the context open (a context librdmacm closes
//! once unused could otherwise be closed, its fd reused, under the
//! reader).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use tokio::runtime::Handle;
use tokio::task::AbortHandle;
use weft_core::sync::{lock, FastMutex};
use weft_core::Result;

use crate::device_events::{LastWqe, Router};
use crate::sys::{AsyncEvents, Context};

/// The readers running, one per context (by its pointer).
static READERS: Mutex<Vec<Weak<DeviceEvents>>> = Mutex::new(Vec::new());

/// A device context's async events, read for as long as this is held.
#[derive(Debug)]
pub struct DeviceEvents {
    key: usize,
    router: Router,
    /// The reader task still runs (its runtime may have ended it).
    live: AtomicBool,
    task: FastMutex<Option<AbortHandle>>,
}

impl DeviceEvents {
    /// Waits for queue pair `qp_num`'s last-WQE event (see
    /// [`Router::last_wqe`]).
    pub fn last_wqe(&self, qp_num: u32) -> LastWqe {
        self.router.last_wqe(qp_num)
    }
}

impl Drop for DeviceEvents {
    fn drop(&mut self) {
        if let Some(t) = lock(&self.task).take() {
            t.abort();
        }
    }
}

/// The events of `ctx`, read by a task on `rt` unless one already reads
/// them. `None` when no reader can be started (logged): its users then
/// fall back to what they do without events.
pub fn watch(ctx: &Arc<Context>, rt: &Handle) -> Option<Arc<DeviceEvents>> {
    let key = ctx.as_ptr() as usize;
    let mut readers = READERS.lock().unwrap_or_else(PoisonError::into_inner);
    readers.retain(|w| w.strong_count() > 0);
    let running = readers
        .iter()
        .filter_map(Weak::upgrade)
        .find(|d| d.key == key && d.live.load(Ordering::Acquire));
    if running.is_some() {
        return running;
    }
    match start(ctx, rt, key) {
        Ok(d) => {
            readers.push(Arc::downgrade(&d));
            Some(d)
        }
        Err(e) => {
            tracing::debug!(device = ctx.name(), error = %e, "verbs: no async event reader");
            None
        }
    }
}

/// Marks the reader gone when its task ends, however it ends.
struct Ended(Weak<DeviceEvents>);

impl Drop for Ended {
    fn drop(&mut self) {
        if let Some(d) = self.0.upgrade() {
            d.live.store(false, Ordering::Release);
        }
    }
}

fn start(ctx: &Arc<Context>, rt: &Handle, key: usize) -> Result<Arc<DeviceEvents>> {
    let events = AsyncEvents::new(ctx)?;
    let afd = {
        let _g = rt.enter();
        events.register_async()?
    };
    let d = Arc::new(DeviceEvents {
        key,
        router: Router::new(ctx.name()),
        live: AtomicBool::new(true),
        task: FastMutex::new(None),
    });
    let me = Arc::downgrade(&d);
    let t = rt.spawn(async move {
        let _ended = Ended(me.clone());
        loop {
            let mut guard = match afd.readable().await {
                Ok(g) => g,
                Err(e) => {
                    tracing::warn!(error = %e, "verbs: async event reader stops: wait failed");
                    return;
                }
            };
            loop {
                let Some(d) = me.upgrade() else { return };
                match afd.get_ref().read(|ev| {
                    d.router.route(ev);
                }) {
                    Ok(true) => {}
                    Ok(false) => {
                        guard.clear_ready();
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "verbs: async event reader stops: read failed");
                        return;
                    }
                }
            }
        }
    });
    *lock(&d.task) = Some(t.abort_handle());
    Ok(d)
}
