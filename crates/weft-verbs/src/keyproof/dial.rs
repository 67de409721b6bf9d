//! The connector's rdma_cm side of a keyed connect (see the parent
//! module): the opening request on an rdma_cm id of its own, and the
//! notice to an acceptor whose challenge proved nothing.
//!
//! An rdma_cm id connects once (a rejected one cannot connect again), so
//! the opening goes out on its own id, resolved beside the id that will
//! carry the connection, and without a queue pair. A request still names
//! one, and the passive side's CM treats a second request naming the
//! queue pair of a live connection from the same device as a stale
//! connection and disconnects that one; so the opening names the queue
//! pair that the proof will bring, which is ours and connected to nothing
//! yet, and which the acceptor has forgotten (its rejection cleared it)
//! by the time the proof arrives.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use weft_core::{Error, Result};

use super::{Answer, Dialer};
use crate::cm_events::{self, CmChannel};
use crate::sys::{CmEvent, CmEventKind, CmId, ConnParam, PortSpace};

type Events = UnboundedReceiver<CmEvent>;

/// The rdma_cm id of an opening request, with its events. Its route on
/// the channel goes when it is dropped (and the id with it).
pub(crate) struct OpeningId {
    chan: Arc<CmChannel>,
    id: CmId,
    events: Events,
}

impl std::fmt::Debug for OpeningId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpeningId").field("id", &self.id).finish()
    }
}

impl OpeningId {
    /// A new id on `chan`, with IP TOS `tos` (before route resolution,
    /// as for the connection's own id).
    pub(crate) fn new(chan: &Arc<CmChannel>, tos: Option<u8>) -> Result<OpeningId> {
        let id = CmId::new(&chan.ch, PortSpace::Tcp)?;
        if let Some(t) = tos {
            id.set_tos(t)?;
        }
        let events = chan.subscribe(id.token());
        Ok(OpeningId {
            chan: chan.clone(),
            id,
            events,
        })
    }

    /// Address and route resolution towards `dest`, from `src` if given.
    pub(crate) async fn resolve(
        &mut self,
        src: Option<SocketAddr>,
        dest: SocketAddr,
    ) -> std::result::Result<(), (Error, Vec<u8>)> {
        cm_events::resolve(&self.id, &mut self.events, src, dest).await
    }
}

impl Drop for OpeningId {
    fn drop(&mut self) {
        self.chan.unsubscribe(self.id.token());
    }
}

/// Sends `pd` on `id` (resolved; without a queue pair, naming `qpn`) and
/// waits at most `t` for the answer: the rejection's error and private
/// data. An acceptor that accepts instead has proven nothing
/// (`KeyRejected`).
async fn ask(
    id: &CmId,
    events: &mut Events,
    pd: &[u8],
    qpn: u32,
    t: Duration,
) -> Result<(Error, Vec<u8>)> {
    id.connect(&ConnParam::new(pd).with_qp_num(qpn))?;
    let answer = async {
        loop {
            let Some(ev) = events.recv().await else {
                return Err(Error::Shutdown);
            };
            match ev.kind {
                CmEventKind::Rejected => {
                    return Ok((ev.error().unwrap_or(Error::ConnRefused), ev.private_data))
                }
                CmEventKind::ConnectResponse | CmEventKind::Established => {
                    return Err(Error::KeyRejected)
                }
                CmEventKind::AddrChange => continue,
                _ => return Err(ev.error().unwrap_or(Error::ConnAborted)),
            }
        }
    };
    tokio::time::timeout(t, answer)
        .await
        .unwrap_or(Err(Error::TimedOut))
}

/// Round 1 of `d`'s keyed connect to `dest` on `opening`, and the private
/// data of round 2: a proof carrying `data`, for the request of `conn`
/// (the id whose queue pair, number `qpn`, will carry the connection;
/// `conn_events` its events). If the acceptor's challenge proves nothing
/// the notice goes out on `conn` and the result is `KeyRejected`. Each
/// round is bounded by `t`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn prove(
    d: &Dialer,
    mut opening: OpeningId,
    conn: &CmId,
    conn_events: &mut Events,
    qpn: u32,
    dest: SocketAddr,
    data: &[u8],
    t: Duration,
) -> Result<Vec<u8>> {
    let me = opening
        .id
        .local_addr()
        .map(|a| a.ip())
        .ok_or(Error::AddrNotAvail)?;
    let asked = ask(&opening.id, &mut opening.events, &d.opening()?, qpn, t).await;
    drop(opening);
    let (err, rejected) = asked?;
    match d.answer(err, &rejected, me, dest, data) {
        Answer::Prove(pd) => Ok(pd),
        Answer::Refuse(notice) => {
            tracing::debug!(%dest, "verbs: the acceptor's challenge proved nothing; refused");
            // Best effort: the acceptor reports the failure too. Its
            // answer changes nothing here.
            let _ = ask(conn, conn_events, &notice, qpn, t).await;
            Err(Error::KeyRejected)
        }
        Answer::Fail(e) => Err(e),
    }
}
