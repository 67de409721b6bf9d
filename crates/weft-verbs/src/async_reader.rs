//! The reader of a device context's async events: at most one OS thread
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
//! One thread per context: the context has one async fd and each event
//! is read once. A user that comes while the thread has been told to
//! stop but has not acted on it yet takes that thread back (the count of
//! users under `Reader::state`, which the thread checks under the same
//! lock before it ends); only once the thread has decided to end, and
//! reads no more, is a new one started. So a context never has two
//! threads reading, nor a thread queued behind another. The thread holds
//! the context open (a context librdmacm closes once unused could
//! otherwise be closed, its fd reused, under the reader).
//!
//! A failed `poll` or read of the fd that may pass (`ENOMEM`: see
//! [`FdFault::is_transient`]) is retried after a pause that doubles
//! from 1 ms to 500 ms, up to 16 times in a row ([`Backoff`]; a stop
//! ends the pause). A thread that ended on an error of the fd (the
//! device removed: a hang-up, `EIO`; `EBADF`; or transient failures past
//! the retries) is not started again for the same context: its slot
//! remembers the failure and [`watch`] answers `None` (its users fall
//! back to their bound), and the thread logs the failure once. The failed slot keeps a handle
//! of the context for the process's life, so its pointer can never name
//! another context (a device added again gets a new one, and a reader):
//! a few hundred bytes and librdmacm's reference per removed device.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use weft_core::Result;

use crate::device_events::{Backoff, FdFault, LastWqe, Router};
use crate::sys::async_event::Woken;
use crate::sys::{AsyncEvents, Context};

/// A context the process reads the events of, by its pointer.
struct Slot {
    key: usize,
    /// The thread's, which holds the context open while it lives.
    reader: Weak<Reader>,
    /// A reader of this context ended on an error: none is started
    /// again. Held so that the key names this context for good.
    failed: Option<Arc<Context>>,
}

static READERS: Mutex<Vec<Slot>> = Mutex::new(Vec::new());

/// One reader thread's, shared with it and its users.
#[derive(Debug)]
struct Reader {
    events: AsyncEvents,
    router: Router,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Live [`DeviceEvents`] of this reader.
    users: usize,
    /// The thread has decided to end (its stop with no users, or an
    /// error): it reads no more.
    ended: bool,
}

impl Reader {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A device context's async events, read for as long as this is held.
#[derive(Debug)]
pub struct DeviceEvents {
    reader: Arc<Reader>,
}

impl DeviceEvents {
    /// Waits for queue pair `qp_num`'s last-WQE event (see
    /// [`Router::last_wqe`]).
    pub fn last_wqe(&self, qp_num: u32) -> LastWqe {
        self.reader.router.last_wqe(qp_num)
    }
}

impl Drop for DeviceEvents {
    fn drop(&mut self) {
        let mut s = self.reader.state();
        s.users -= 1;
        if s.users == 0 {
            // Under the lock: a user taking the thread back meanwhile is
            // seen by the thread when it wakes for this stop.
            self.reader.events.stop();
        }
    }
}

/// The events of `ctx`, read by a thread unless one already reads them.
/// `None` when no reader can be started (logged), or one of this context
/// failed before: its users then fall back to what they do without
/// events.
pub fn watch(ctx: &Arc<Context>) -> Option<Arc<DeviceEvents>> {
    let key = ctx.as_ptr() as usize;
    let mut readers = READERS.lock().unwrap_or_else(PoisonError::into_inner);
    readers.retain(|s| s.failed.is_some() || s.reader.strong_count() > 0);
    let slot = readers.iter().position(|s| s.key == key);
    if let Some(s) = slot.map(|i| &readers[i]) {
        if s.failed.is_some() {
            return None;
        }
        if let Some(r) = s.reader.upgrade() {
            let mut st = r.state();
            if !st.ended {
                // Running, or told to stop and not acted on it yet: it
                // sees the user when it wakes, and goes on.
                st.users += 1;
                drop(st);
                return Some(Arc::new(DeviceEvents { reader: r }));
            }
        }
    }
    match start(ctx) {
        Ok(d) => {
            let entry = Slot {
                key,
                reader: Arc::downgrade(&d.reader),
                failed: None,
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

/// Marks the reader ended however its thread ends (a panic included).
struct Ended(Arc<Reader>);

impl Drop for Ended {
    fn drop(&mut self) {
        self.0.state().ended = true;
    }
}

fn start(ctx: &Arc<Context>) -> Result<Arc<DeviceEvents>> {
    let reader = Arc::new(Reader {
        events: AsyncEvents::new(ctx)?,
        router: Router::new(ctx.name()),
        state: Mutex::new(State {
            users: 1,
            ended: false,
        }),
    });
    let r = reader.clone();
    let device = ctx.name().to_owned();
    std::thread::Builder::new()
        .name("weft-verbs-async-ev".into())
        .spawn(move || {
            let ended = Ended(r);
            if let Err(what) = run(&ended.0) {
                tracing::warn!(
                    device,
                    "verbs: async event reader stops: {what}; none is started again for this \
                     device context (closes of SRX-bound endpoints wait their bound)"
                );
            }
        })
        .map_err(|e| weft_core::Error::from_io(&e))?;
    Ok(Arc::new(DeviceEvents { reader }))
}

/// Reads, routes and acknowledges events until stopped with no users
/// left, or the fd fails past its retries (what failed, with the error).
fn run(r: &Reader) -> std::result::Result<(), String> {
    let mut backoff = Backoff::default();
    loop {
        let (what, fault) = match r.events.wait() {
            Ok(Woken::Stop) => {
                let mut st = r.state();
                if st.users == 0 {
                    st.ended = true;
                    return Ok(());
                }
                // Taken back after the stop: rearm and go on.
                r.events.clear_stop();
                continue;
            }
            Ok(Woken::Event) => match r.events.read(|ev| {
                r.router.route(ev);
            }) {
                // Only an event read shows the fd working again: a read
                // that found none (`EAGAIN`, `EINTR`) says nothing of it,
                // so it leaves the count of failures in a row as it was.
                Ok(true) => {
                    backoff.reset();
                    continue;
                }
                Ok(false) => continue,
                Err(f) => ("read", f),
            },
            Err(f) => ("wait", f),
        };
        match backoff.after(&fault) {
            Some(pause) => {
                tracing::debug!(
                    device = r.events.context().name(),
                    error = %fault,
                    ?pause,
                    "verbs: async event {what} failed, retried"
                );
                r.events.pause(pause);
            }
            None => {
                failed(r);
                return Err(format!("{what} failed: {}", describe(&fault)));
            }
        }
    }
}

/// `fault`, saying whether it was the last of the retries.
fn describe(fault: &FdFault) -> String {
    if fault.is_transient() {
        format!("{fault} (after {} retries)", Backoff::MAX_RETRIES)
    } else {
        fault.to_string()
    }
}

/// Remembers that `r`'s context failed, then ends `r`: [`watch`], which
/// holds `READERS` while it looks at both, never sees the reader ended
/// without the failure and starts another.
fn failed(r: &Reader) {
    let ctx = r.events.context();
    let key = ctx.as_ptr() as usize;
    let mut readers = READERS.lock().unwrap_or_else(PoisonError::into_inner);
    // The slot is there: `watch` put it in, naming this reader, before
    // the thread could take `READERS`; only a slot with neither a failure
    // nor a live reader is removed, and this thread holds its reader; a
    // slot is handed to another reader only once this one has ended,
    // which it does below, under the same lock.
    if let Some(s) = readers.iter_mut().find(|s| s.key == key) {
        s.failed = Some(ctx.clone());
    }
    r.state().ended = true;
}
