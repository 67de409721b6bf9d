//! Links once the peer is known: a connectionless one from the peer's
//! address, the next connection request of a MSG listener, and both
//! sides of `--self` in this process.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::net::TcpStream;
use weft::{
    AddressVector, CompletionQueue, ConnRequest, Endpoint, EpType, EqEventKind, EventQueue,
};

use super::{Fab, Link};
use crate::fail::{within, Context, Failure, Res};

/// A connectionless (RDM or DGRAM) link once the peer's address is
/// known. The insert is awaited: on a verbs DGRAM domain it resolves the
/// address through rdma_cm (`insert_sync` would say `Again` there); on
/// the others it is ready at once.
pub(crate) async fn connless_link(
    fab: &Fab,
    (ep, cq, av): (Endpoint, CompletionQueue, AddressVector),
    peer: &[u8],
    ctrl: Option<TcpStream>,
) -> Res<Link> {
    let rep = av
        .insert(&[peer.to_vec()], Default::default(), 0)
        .ctx("insert peer address")?
        .await;
    match rep.results.first() {
        Some(Ok(fi)) => Ok(Link {
            ep,
            cq,
            peer: *fi,
            domain: fab.domain.clone(),
            ep_type: fab.info.ep_attr.ep_type,
            tagged: fab.info.ep_attr.ep_type != EpType::Dgram,
            mode: fab.mode,
            idle: fab.idle(),
            _av: Some(av),
            _eq: None,
            _pep: None,
            ctrl,
        }),
        Some(Err(e)) => Err(Failure::new("insert peer address", *e)),
        None => Err(Failure::new("insert peer address", "nothing inserted")),
    }
}

/// The next connection request on a passive endpoint's `eq`; other
/// events are skipped. The inner error is one request gone wrong (its
/// peer's doing, or its connection's); the outer one, the queue itself.
pub(crate) async fn conn_req(eq: &mut EventQueue) -> Res<Result<ConnRequest, String>> {
    loop {
        match eq.next().await {
            Some(Ok(ev)) if ev.kind == EqEventKind::ConnReq => {
                return Ok(ConnRequest::from_event(&ev)
                    .map_err(|e| format!("unreadable connection request: {e}")));
            }
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Ok(Err(format!("connection request failed: {}", e.err))),
            None => return Err(Failure::new("wait for connection", "event queue closed")),
        }
    }
}

/// Both sides in this process over loopback: (server, client), each on
/// its own fabric; each step of the set-up may take `limit`.
pub async fn self_pair(sfab: &Fab, cfab: &Fab, limit: Duration) -> Res<(Link, Link)> {
    let lo = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    match sfab.info.ep_attr.ep_type {
        EpType::Msg => {
            let (pep, mut eq) = sfab.listen(lo)?;
            let addr = pep.local_addr().ctx("passive endpoint address")?;
            let addr = weft::decode_sockaddr(&addr).ctx("passive endpoint address")?;
            let pep = Arc::new(pep);
            let server = async {
                let req = conn_req(&mut eq)
                    .await?
                    .map_err(|why| Failure::new("wait for connection", why))?;
                sfab.accept_req(&req, pep, limit).await
            };
            let (s, c) = tokio::join!(server, cfab.connect(addr, limit));
            Ok((s?, c?))
        }
        _ => {
            let (sep, scq, sav) = sfab.connless(lo)?;
            let (cep, ccq, cav) = cfab.connless(lo)?;
            let saddr = sep.local_addr().ctx("endpoint address")?;
            let caddr = cep.local_addr().ctx("endpoint address")?;
            // Both at once: each resolution (verbs DGRAM) needs the other
            // endpoint to answer, which it does as soon as it is enabled.
            let what = "insert peer address";
            let (s, c) = tokio::join!(
                within(
                    limit,
                    what,
                    connless_link(sfab, (sep, scq, sav), &caddr, None)
                ),
                within(
                    limit,
                    what,
                    connless_link(cfab, (cep, ccq, cav), &saddr, None)
                ),
            );
            Ok((s?, c?))
        }
    }
}
