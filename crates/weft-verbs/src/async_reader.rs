//! The reader of a device context's async events: one OS thread
//! (`weft-verbs-async-ev`) per `ibv_context` in the process, started by
//! the first user that needs it and stopped when the last one lets it go.
//! What an event does is `device_events`'s.
//!
//! A thread, not a task of some Tokio runtime: the reader is shared by
//! every user of the context in the process, whatever runtime each runs
//! on, and must not end with one of them. It blocks in `poll(2)` on the
//! context's async fd and a stop fd of its own (`sys::AsyncEvents`);
//! the last user's drop writes the stop fd and does not wait for the
//! thread (it may be on a Tokio worker), which ends on its own.
//!
//! One reader per context at a time: the context has one async fd and
//! each event is read once. Each context has one [`Router`], shared by
//! its waiters and by successive readers: a reader started while the one
//! before has not seen its stop yet waits for that one to end (`turn`)
//! before it polls, and whichever reads an event routes it to the same
//! waiters. The thread holds the context open (a context librdmacm
//! closes once unused could otherwise be closed, its fd reused, under
//! the reader).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use weft_core::Result;

use crate::device_events::{LastWqe, Router};
use crate::sys::async_event::Woken;
use crate::sys::{AsyncEvents, Context};

/// One context's: its router, and the turn its readers take.
#[derive(Debug)]
struct PerContext {
    router: Router,
    /// Held by a reader thread for its whole life.
    turn: Mutex<()>,
}

/// A context the process reads the events of, by its pointer.
struct Slot {
    key: usize,
    users: Weak<DeviceEvents>,
    shared: Weak<PerContext>,
}

static READERS: Mutex<Vec<Slot>> = Mutex::new(Vec::new());

/// One reader thread's, shared with it.
#[derive(Debug)]
struct Reader {
    events: AsyncEvents,
    /// The thread has ended (an error, or its stop).
    ended: AtomicBool,
}

/// A device context's async events, read for as long as this is held.
#[derive(Debug)]
pub struct DeviceEvents {
    shared: Arc<PerContext>,
    reader: Arc<Reader>,
}

impl DeviceEvents {
    /// Waits for queue pair `qp_num`'s last-WQE event (see
    /// [`Router::last_wqe`]).
    pub fn last_wqe(&self, qp_num: u32) -> LastWqe {
        self.shared.router.last_wqe(qp_num)
    }
}

impl Drop for DeviceEvents {
    fn drop(&mut self) {
        self.reader.events.stop();
    }
}

/// The events of `ctx`, read by a thread unless one already reads them.
/// `None` when no reader can be started (logged): its users then fall
/// back to what they do without events.
pub fn watch(ctx: &Arc<Context>) -> Option<Arc<DeviceEvents>> {
    let key = ctx.as_ptr() as usize;
    let mut readers = READERS.lock().unwrap_or_else(PoisonError::into_inner);
    readers.retain(|s| s.users.strong_count() > 0 || s.shared.strong_count() > 0);
    let slot = readers.iter().position(|s| s.key == key);
    if let Some(d) = slot
        .and_then(|i| readers[i].users.upgrade())
        .filter(|d| !d.reader.ended.load(Ordering::Acquire))
    {
        return Some(d);
    }
    // The router of the reader still ending, if one is: a wait it hears
    // the event of still wakes.
    let shared = slot
        .and_then(|i| readers[i].shared.upgrade())
        .unwrap_or_else(|| {
            Arc::new(PerContext {
                router: Router::new(ctx.name()),
                turn: Mutex::new(()),
            })
        });
    match start(ctx, &shared) {
        Ok(d) => {
            let entry = Slot {
                key,
                users: Arc::downgrade(&d),
                shared: Arc::downgrade(&shared),
            };
            match slot {
                Some(i) => readers[i] = entry,
                None => readers.push(entry),
            }
            Some(d)
        }
        Err(e) => {
            tracing::debug!(device = ctx.name(), error = %e, "verbs: no async event reader");
            None
        }
    }
}

/// Marks the reader ended however its thread ends.
struct Ended(Arc<Reader>);

impl Drop for Ended {
    fn drop(&mut self) {
        self.0.ended.store(true, Ordering::Release);
    }
}

fn start(ctx: &Arc<Context>, shared: &Arc<PerContext>) -> Result<Arc<DeviceEvents>> {
    let reader = Arc::new(Reader {
        events: AsyncEvents::new(ctx)?,
        ended: AtomicBool::new(false),
    });
    let (r, sh) = (reader.clone(), shared.clone());
    let device = ctx.name().to_owned();
    std::thread::Builder::new()
        .name("weft-verbs-async-ev".into())
        .spawn(move || {
            let ended = Ended(r);
            // The reader before this one (stopped) reads no more once it
            // lets go of the turn.
            let _turn = sh.turn.lock().unwrap_or_else(PoisonError::into_inner);
            run(&ended.0.events, &sh.router, &device);
        })
        .map_err(|e| weft_core::Error::from_io(&e))?;
    Ok(Arc::new(DeviceEvents {
        shared: shared.clone(),
        reader,
    }))
}

/// Reads, routes and acknowledges events until stopped or the fd fails.
fn run(events: &AsyncEvents, router: &Router, device: &str) {
    loop {
        match events.wait() {
            Ok(Woken::Stop) => return,
            Ok(Woken::Event) => {}
            Err(e) => {
                tracing::warn!(device, error = %e, "verbs: async event reader stops: wait failed");
                return;
            }
        }
        if let Err(e) = events.read(|ev| {
            router.route(ev);
        }) {
            tracing::warn!(device, error = %e, "verbs: async event reader stops: read failed");
            return;
        }
    }
}
