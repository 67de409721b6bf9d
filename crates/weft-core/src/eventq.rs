//! Event queues (`fi_eq`): control-path events (connection management, AV
//! and MR completions) and their error entries.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use crate::error::{Error, Result};
use crate::sync::{lock, wake_all, WakerSet};

/// Event kinds (`FI_NOTIFY`, `FI_CONNREQ`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EqEventKind {
    /// Generic notification (also what `write` uses by default).
    Notify,
    /// A connection request reached a passive endpoint.
    ConnReq,
    /// A connection is established.
    Connected,
    /// The peer shut the connection down.
    Shutdown,
    /// An asynchronous MR registration completed.
    MrComplete,
    /// An asynchronous AV insert completed; `data` = success count.
    AvComplete,
    /// A multicast join completed.
    JoinComplete,
}

/// Provider state that travels with a `ConnReq` event (`fi_info::handle`).
pub type ConnHandle = Arc<dyn Any + Send + Sync>;

/// A control event (`struct fi_eq_entry` / `fi_eq_cm_entry`).
#[derive(Clone)]
pub struct EqEvent {
    /// What happened.
    pub kind: EqEventKind,
    /// The object it happened to (AV, endpoint, passive endpoint).
    pub fid: u64,
    /// The context given with the request or the object.
    pub context: u64,
    /// Event data (e.g. the number of inserted addresses).
    pub data: u64,
    /// Connection-manager data from the peer.
    pub cm_data: Vec<u8>,
    /// Connection request handle (only `ConnReq`).
    pub conn: Option<ConnHandle>,
    /// The peer's address (CM events), raw bytes.
    pub peer_addr: Option<Vec<u8>>,
}

impl std::fmt::Debug for EqEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EqEvent")
            .field("kind", &self.kind)
            .field("fid", &self.fid)
            .field("context", &self.context)
            .field("data", &self.data)
            .field("cm_data_len", &self.cm_data.len())
            .field("has_conn", &self.conn.is_some())
            .finish()
    }
}

impl EqEvent {
    /// An event with no CM data.
    pub fn new(kind: EqEventKind, fid: u64, context: u64, data: u64) -> EqEvent {
        EqEvent {
            kind,
            fid,
            context,
            data,
            cm_data: Vec::new(),
            conn: None,
            peer_addr: None,
        }
    }
}

/// An error event (`struct fi_eq_err_entry`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EqErrEntry {
    /// The object the error belongs to.
    pub fid: u64,
    /// Its context.
    pub context: u64,
    /// Event data (AV inserts: the index of the failed address).
    pub data: u64,
    /// The error.
    pub err: Error,
    /// Provider errno.
    pub prov_errno: i32,
    /// Error data (e.g. reject CM data).
    pub err_data: Vec<u8>,
    /// The peer the error concerns, raw address bytes (connection
    /// refusals and closes by the provider's limits).
    pub peer_addr: Option<Vec<u8>>,
}

impl std::fmt::Display for EqErrEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "event error on fid {}: {}", self.fid, self.err)
    }
}

impl std::error::Error for EqErrEntry {}

/// One item of an event queue.
pub type EqItem = std::result::Result<EqEvent, EqErrEntry>;

#[derive(Debug, Default)]
struct EqInner {
    items: VecDeque<EqItem>,
    readers: WakerSet,
    closed: bool,
}

/// The shared state of an event queue.
#[derive(Debug)]
pub struct EqShared {
    id: u64,
    size: usize,
    inner: Mutex<EqInner>,
    /// Objects bound to the queue (endpoints, AVs, passive endpoints).
    pub bound: crate::sync::BindCount,
}

impl EqShared {
    /// A new queue holding at most `size` entries written by the
    /// application; provider events are never dropped (they are bounded by
    /// the operations that cause them).
    pub fn new(id: u64, size: usize) -> Arc<EqShared> {
        Arc::new(EqShared {
            id,
            size: size.max(1),
            inner: Mutex::new(EqInner::default()),
            bound: crate::sync::BindCount::default(),
        })
    }

    /// The object id (fid).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Configured size.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Provider-side push: never fails.
    pub fn push(&self, item: EqItem) {
        let ws = {
            let mut g = lock(&self.inner);
            g.items.push_back(item);
            g.readers.take()
        };
        wake_all(ws);
    }

    /// Pushes several items atomically, so readers see them in order and
    /// never a partial sequence.
    pub fn push_all(&self, items: impl IntoIterator<Item = EqItem>) {
        let ws = {
            let mut g = lock(&self.inner);
            g.items.extend(items);
            g.readers.take()
        };
        wake_all(ws);
    }

    /// Reports a peer the provider refused or dropped (a limit, a
    /// timeout), with its raw address. Unlike the application's own
    /// events these come from peers, so they are dropped once the queue
    /// holds `size` entries: a flood of refusals cannot grow a queue that
    /// nobody reads.
    pub fn report_peer(&self, fid: u64, context: u64, err: Error, peer: Vec<u8>) {
        let _ = self.write(Err(EqErrEntry {
            fid,
            context,
            data: 0,
            err,
            prov_errno: err.code(),
            err_data: Vec::new(),
            peer_addr: Some(peer),
        }));
    }

    /// `fi_eq_write`: `Again` when the queue holds `size` entries.
    pub fn write(&self, item: EqItem) -> Result<()> {
        let ws = {
            let mut g = lock(&self.inner);
            if g.items.len() >= self.size {
                return Err(Error::Again);
            }
            g.items.push_back(item);
            g.readers.take()
        };
        wake_all(ws);
        Ok(())
    }

    /// `fi_eq_read`: the head event; `Avail` if the head is an error,
    /// `Again` if empty. `peek` leaves it queued.
    pub fn read(&self, peek: bool) -> Result<EqEvent> {
        let mut g = lock(&self.inner);
        match g.items.front() {
            None => Err(Error::Again),
            Some(Err(_)) => Err(Error::Avail),
            Some(Ok(ev)) if peek => Ok(ev.clone()),
            Some(Ok(_)) => match g.items.pop_front() {
                Some(Ok(ev)) => Ok(ev),
                _ => Err(Error::Again),
            },
        }
    }

    /// `fi_eq_readerr`: the head error entry, or `Again`.
    pub fn read_err(&self) -> Result<EqErrEntry> {
        let mut g = lock(&self.inner);
        if matches!(g.items.front(), Some(Err(_))) {
            if let Some(Err(e)) = g.items.pop_front() {
                return Ok(e);
            }
        }
        Err(Error::Again)
    }

    /// Number of queued entries.
    pub fn len(&self) -> usize {
        lock(&self.inner).items.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Polls for the next item; `Ready(None)` once closed and drained.
    pub fn poll_next(&self, cx: &mut Context<'_>) -> Poll<Option<EqItem>> {
        let mut g = lock(&self.inner);
        if let Some(it) = g.items.pop_front() {
            return Poll::Ready(Some(it));
        }
        if g.closed {
            return Poll::Ready(None);
        }
        g.readers.register(cx.waker());
        Poll::Pending
    }

    /// Ends streams after the remaining items.
    pub fn close(&self) {
        let ws = {
            let mut g = lock(&self.inner);
            g.closed = true;
            g.readers.take()
        };
        wake_all(ws);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_read_peek_size() {
        let eq = EqShared::new(1, 2);
        assert_eq!(eq.read(false).unwrap_err(), Error::Again);
        eq.write(Ok(EqEvent::new(EqEventKind::Notify, 1, 5, 6)))
            .unwrap();
        eq.write(Ok(EqEvent::new(EqEventKind::Notify, 1, 7, 8)))
            .unwrap();
        assert_eq!(
            eq.write(Ok(EqEvent::new(EqEventKind::Notify, 1, 9, 9)))
                .unwrap_err(),
            Error::Again
        );
        assert_eq!(eq.read(true).unwrap().context, 5);
        assert_eq!(eq.read(false).unwrap().context, 5);
        assert_eq!(eq.read_err().unwrap_err(), Error::Again);
        assert_eq!(eq.read(false).unwrap().data, 8);
    }

    #[test]
    fn error_at_head_is_avail() {
        let eq = EqShared::new(1, 4);
        eq.push(Err(EqErrEntry {
            fid: 1,
            context: 2,
            data: 3,
            err: Error::Inval,
            prov_errno: 22,
            err_data: vec![],
            peer_addr: None,
        }));
        assert_eq!(eq.read(false).unwrap_err(), Error::Avail);
        assert_eq!(eq.read_err().unwrap().data, 3);
        assert_eq!(eq.read_err().unwrap_err(), Error::Again);
    }
}
