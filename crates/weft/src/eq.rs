//! Event queues as streams, and connection requests.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use weft_core::eventq::{ConnHandle, EqErrEntry, EqEvent, EqEventKind, EqItem, EqShared};
use weft_core::{Error, Result};

/// An event queue. As a [`Stream`] it yields control events and error
/// events in order.
#[derive(Debug, Clone)]
pub struct EventQueue {
    pub(crate) shared: Arc<EqShared>,
}

impl EventQueue {
    pub(crate) fn new(shared: Arc<EqShared>) -> EventQueue {
        EventQueue { shared }
    }

    /// The object id.
    pub fn fid(&self) -> u64 {
        self.shared.id()
    }

    /// `fi_eq_write`: queues an application event; `Again` when full.
    pub fn write(&self, item: EqItem) -> Result<()> {
        self.shared.write(item)
    }

    /// `fi_eq_read`: `Again` when empty, `Avail` when an error is at the
    /// head. `peek` leaves the event queued.
    pub fn read(&self, peek: bool) -> Result<EqEvent> {
        self.shared.read(peek)
    }

    /// `fi_eq_readerr`.
    pub fn read_err(&self) -> Result<EqErrEntry> {
        self.shared.read_err()
    }

    /// `fi_eq_sread`: the next item, or `Again` after `timeout`.
    pub async fn next_timeout(&self, timeout: std::time::Duration) -> Result<EqItem> {
        let fut = std::future::poll_fn(|cx| self.shared.poll_next(cx));
        match tokio::time::timeout(timeout, fut).await {
            Ok(Some(it)) => Ok(it),
            Ok(None) => Err(Error::Shutdown),
            Err(_) => Err(Error::Again),
        }
    }

    /// `fi_close`: readers take what is queued, then the stream ends
    /// (`None`) for every handle of the queue. `Busy` while an endpoint,
    /// AV or passive endpoint that is not closed is bound to it.
    pub fn close(&self) -> Result<()> {
        if self.shared.bound.count() > 0 {
            return Err(Error::Busy);
        }
        self.shared.close();
        Ok(())
    }

    /// Number of queued entries.
    pub fn len(&self) -> usize {
        self.shared.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.shared.is_empty()
    }
}

impl Stream for EventQueue {
    type Item = EqItem;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<EqItem>> {
        self.shared.poll_next(cx)
    }
}

/// A connection request taken from a `ConnReq` event.
#[derive(Clone)]
pub struct ConnRequest {
    handle: ConnHandle,
    /// The CM data the peer sent.
    pub cm_data: Vec<u8>,
    /// The peer's address, raw bytes.
    pub peer_addr: Option<Vec<u8>>,
    /// The passive endpoint that received it.
    pub pep_fid: u64,
}

impl std::fmt::Debug for ConnRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnRequest")
            .field("cm_data_len", &self.cm_data.len())
            .field("pep_fid", &self.pep_fid)
            .finish()
    }
}

impl ConnRequest {
    /// Extracts the request from a `ConnReq` event; `Inval` for others.
    pub fn from_event(ev: &EqEvent) -> Result<ConnRequest> {
        match (&ev.kind, &ev.conn) {
            (EqEventKind::ConnReq, Some(h)) => Ok(ConnRequest {
                handle: h.clone(),
                cm_data: ev.cm_data.clone(),
                peer_addr: ev.peer_addr.clone(),
                pep_fid: ev.fid,
            }),
            _ => Err(Error::Inval),
        }
    }

    pub(crate) fn handle(&self) -> ConnHandle {
        self.handle.clone()
    }
}
