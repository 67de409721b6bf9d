//! A connection-oriented (`FI_EP_MSG`) service: a passive endpoint
//! listens, every connection request is accepted by an endpoint of its own
//! that echoes what it receives, and three clients connect at once.
//!
//! `cargo run --example msg_service`

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use weft::{BindFlags, ConnRequest, CqAttr, EpType, EqEventKind, Info};

const CLIENTS: usize = 3;
const ROUNDS: usize = 5;

/// A MSG endpoint with its own EQ and CQ, for a request if it accepts one.
fn endpoint(
    fabric: &weft::Fabric,
    domain: &weft::Domain,
    info: &Info,
    req: Option<&ConnRequest>,
) -> Result<(weft::Endpoint, weft::EventQueue), weft::Error> {
    let ep = match req {
        Some(r) => domain.accept_endpoint(info, r)?,
        None => domain.endpoint(info)?,
    };
    let eq = fabric.eq(16)?;
    let cq = domain.cq(CqAttr::default())?;
    ep.bind_eq(&eq)?;
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)?;
    Ok((ep, eq))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut hints = Info::default();
    hints.ep_attr.ep_type = EpType::Msg;
    let info = weft::getinfo(Some(&hints))?.remove(0);
    let fabric = weft::Fabric::open(&info)?;
    let domain = fabric.domain(&info)?;

    let listener = fabric.passive_endpoint(&info, None)?;
    let requests = fabric.eq(64)?;
    listener.bind_eq(&requests)?;
    listener.listen()?;
    let addr = listener.local_addr()?;

    // The server: one echo task per accepted connection.
    let (f, d, i) = (fabric.clone(), domain.clone(), info.clone());
    let server = tokio::spawn(async move {
        let mut reqs = requests.clone();
        for _ in 0..CLIENTS {
            let Some(Ok(ev)) = reqs.next().await else {
                break;
            };
            if ev.kind != EqEventKind::ConnReq {
                continue;
            }
            let req = ConnRequest::from_event(&ev)?;
            let (ep, _eq) = endpoint(&f, &d, &i, Some(&req))?;
            // `accept` enables the endpoint.
            ep.accept(b"welcome".to_vec()).await?;
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let Ok(got) = ep.recv(BytesMut::zeroed(64)).await else {
                        return;
                    };
                    let echo = got.into_bytes().freeze();
                    if ep.send(weft::FI_ADDR_UNSPEC, echo).await.is_err() {
                        return;
                    }
                }
            });
        }
        Ok::<_, weft::Error>(())
    });

    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        let (ep, _eq) = endpoint(&fabric, &domain, &info, None)?;
        let addr = addr.clone();
        clients.push(tokio::spawn(async move {
            let hello = ep.connect(addr, Vec::new()).await?;
            let mut ok = hello == b"welcome";
            for r in 0..ROUNDS {
                let msg = Bytes::from(format!("client {c} round {r}"));
                let reply = ep.recv(BytesMut::zeroed(64));
                let (got, sent) = tokio::join!(reply, ep.send(weft::FI_ADDR_UNSPEC, msg.clone()));
                sent.map_err(|e| e.err)?;
                ok &= got.map_err(|e| e.err)?.into_bytes()[..] == msg[..];
            }
            Ok::<_, weft::Error>(ok)
        }));
    }
    let mut all_ok = true;
    for c in clients {
        all_ok &= c.await??;
    }
    server.await??;
    println!(
        "{CLIENTS} clients x {ROUNDS} echoes: {}",
        if all_ok { "all verified" } else { "MISMATCH" }
    );
    if !all_ok {
        return Err("an echo did not match".into());
    }
    Ok(())
}
