//! `many-peers --srx`: the hub's message rate when its receives are one
//! shared receive context's, fed by `HUB_EPS` endpoints (default 4) that
//! the peers are spread over, against one hub endpoint with the same
//! receives posted (`multi::hub_rate`, posted form), next to the raw
//! floor. Both hubs keep the same number of `MAXSIZE` receives posted
//! (16 per peer, clamped to 64..1024): with the context that number no
//! longer has to be per endpoint.

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use weft::{AvAttr, BindFlags, CqAttr, Domain, Info};

use super::{env, hub_loop, join_senders, open, spawn_senders, Ep, Load, Res};

/// One run's figures.
pub struct Rates {
    pub raw: f64,
    pub lone: f64,
    pub shared: f64,
    pub posted_mem: usize,
}

/// `hubs` endpoints bound to one shared receive context (one AV, one
/// CQ), `load.peers` peers spread over them; messages per second.
async fn srx_rate(domain: &Domain, info: &Info, load: Load, hubs: usize) -> Res<f64> {
    let maxsize = env("MAXSIZE", 4096);
    let posted = (load.window * load.peers).clamp(64, info.rx_attr.size);
    let srx = domain.srx_context(posted)?;
    let av = domain.av(AvAttr::default())?;
    let cq = domain.cq(CqAttr::default())?;
    let mut addrs = Vec::with_capacity(hubs);
    let mut eps = Vec::with_capacity(hubs);
    for _ in 0..hubs {
        let ep = domain.endpoint(info)?;
        ep.bind_av(&av)?;
        ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)?;
        ep.bind_srx(&srx)?;
        ep.enable()?;
        addrs.push(ep.local_addr()?);
        eps.push(ep);
    }
    let mut peers = Vec::with_capacity(load.peers);
    for k in 0..load.peers {
        let p: Ep = open(domain, info)?;
        let dest =
            p.av.insert_sync(&[addrs[k % hubs].clone()], Default::default())?
                .fi_addrs[0];
        peers.push((p, dest));
    }
    // Connect every peer first.
    for (p, dest) in &peers {
        let (got, sent) = tokio::join!(
            srx.recv(BytesMut::zeroed(maxsize)),
            p.ep.send(*dest, Bytes::from(vec![1u8; load.size]))
        );
        sent.map_err(|e| format!("connect send: {e:?}"))?;
        got.map_err(|e| format!("connect recv: {e:?}"))?;
    }
    let per_peer = load.total / load.peers;
    let expected = per_peer * load.peers;
    for i in 0..posted {
        srx.post_recv(BytesMut::zeroed(maxsize), i as u64)?;
    }
    let start = Instant::now();
    let senders = spawn_senders(&peers, per_peer, load, None);
    let mut live = posted;
    let got = hub_loop(&cq, expected, |e, got| {
        live -= 1;
        if got + 1 + live < expected {
            live += 1;
            srx.post_recv(BytesMut::zeroed(maxsize), e.context)?;
        }
        Ok(true)
    })
    .await?;
    let secs = start.elapsed().as_secs_f64();
    join_senders(senders).await?;
    drop(peers);
    for ep in &eps {
        ep.close()?;
    }
    srx.close()?;
    Ok(got as f64 / secs)
}

/// Raw floor, one hub endpoint (of `lone`), and `HUB_EPS` on a shared
/// context (of `shared`, an offer matched with `rx_ctx_cnt =
/// FI_SHARED_CONTEXT`).
pub async fn compare(domain: &Domain, lone: &Info, shared: &Info, load: Load) -> Res<Rates> {
    let raw = super::multi::raw_rate(load.peers, load.total, load.size).await?;
    let (lone, posted_mem) = super::multi::hub_rate(domain, lone, load, false).await?;
    let shared = srx_rate(domain, shared, load, env("HUB_EPS", 4)).await?;
    Ok(Rates {
        raw,
        lone,
        shared,
        posted_mem,
    })
}
