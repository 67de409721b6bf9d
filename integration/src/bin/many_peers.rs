//! Many peers on one RDM endpoint: the aggregate message rate a hub
//! endpoint sustains from N peers (each its own endpoint and connection)
//! against the rate from 4 peers, and the memory an idle connected peer
//! costs. All in one process (the tcp provider on loopback, or the one
//! `PROV` names: `PROV=shm many-peers 1 8`).
//!
//! usage: many-peers [PEERS...]    (default: 4 256)
//! env:   MSGS (total messages per run, 200000), SIZE (64), WINDOW (16 per peer),
//!        PROV (provider, default tcp)
//!
//! Prints one line per peer count and the rate ratio against the first.

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use futures::stream::{FuturesUnordered, StreamExt};
use weft::{AvAttr, BindFlags, CqAttr, Domain, EpType, Info, FI_ADDR_UNSPEC};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

struct Ep {
    ep: weft::Endpoint,
    av: weft::AddressVector,
    cq: weft::CompletionQueue,
}

fn open(domain: &Domain, info: &Info) -> Res<Ep> {
    let av = domain.av(AvAttr::default())?;
    let cq = domain.cq(CqAttr::default())?;
    let ep = domain.endpoint(info)?;
    ep.bind_av(&av)?;
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)?;
    ep.enable()?;
    Ok(Ep { ep, av, cq })
}

/// Resident set size in bytes (Linux).
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map_or(0, |pages| pages * 4096)
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Outcome {
    rate: f64,
    rss_per_peer: f64,
}

async fn run(
    domain: &Domain,
    info: &Info,
    peers: usize,
    total: usize,
    size: usize,
    window: usize,
) -> Res<Outcome> {
    let hub = open(domain, info)?;
    let hub_addr = hub.ep.local_addr()?;
    let before = rss();
    let mut eps = Vec::with_capacity(peers);
    for _ in 0..peers {
        let p = open(domain, info)?;
        let dest =
            p.av.insert_sync(std::slice::from_ref(&hub_addr), Default::default())?
                .fi_addrs[0];
        eps.push((p, dest));
    }
    // Connect every peer with one message, so the memory measured is that
    // of connected, idle peers.
    for (i, (p, dest)) in eps.iter().enumerate() {
        let r = hub
            .ep
            .trecv(BytesMut::zeroed(size), FI_ADDR_UNSPEC, i as u64, 0);
        let (got, sent) =
            tokio::join!(r, p.ep.tsend(*dest, Bytes::from(vec![1u8; size]), i as u64));
        sent.map_err(|e| format!("connect send: {e:?}"))?;
        got.map_err(|e| format!("connect recv: {e:?}"))?;
    }
    let rss_per_peer = rss().saturating_sub(before) as f64 / peers as f64;

    let per_peer = total / peers;
    let expected = per_peer * peers;
    // The hub keeps a pool of receives posted and reposts as they complete.
    let posted = (window * peers).clamp(64, info.rx_attr.size);
    for i in 0..posted {
        hub.ep.post_trecv(
            BytesMut::zeroed(size),
            FI_ADDR_UNSPEC,
            0,
            u64::MAX,
            i as u64,
        )?;
    }
    let start = Instant::now();
    let senders: Vec<_> = eps
        .iter()
        .map(|(p, dest)| {
            let ep = p.ep.clone();
            let dest = *dest;
            tokio::spawn(async move {
                let payload = Bytes::from(vec![7u8; size]);
                let mut inflight = FuturesUnordered::new();
                let mut sent = 0;
                while sent < per_peer || !inflight.is_empty() {
                    while sent < per_peer && inflight.len() < window {
                        let ep = ep.clone();
                        let b = payload.clone();
                        inflight.push(async move { ep.tsend(dest, b, 9).await });
                        sent += 1;
                    }
                    if let Some(r) = inflight.next().await {
                        r.map_err(|e| format!("send: {e:?}"))?;
                    }
                }
                Ok::<(), String>(())
            })
        })
        .collect();
    let mut got = 0;
    let mut live = posted;
    let mut batch = Vec::with_capacity(64);
    while got < expected {
        batch.clear();
        if hub.cq.read_batch(&mut batch, 64).await == 0 {
            return Err("hub CQ closed".into());
        }
        for item in batch.drain(..) {
            let e = item.map_err(|e| format!("hub recv: {e:?}"))?;
            if e.flags.contains(weft::OpFlags::RECV) {
                got += 1;
                live -= 1;
                if got + live < expected {
                    live += 1;
                    hub.ep.post_trecv(
                        BytesMut::zeroed(size),
                        FI_ADDR_UNSPEC,
                        0,
                        u64::MAX,
                        e.context,
                    )?;
                }
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    for s in senders {
        s.await?
            .map_err(|e| -> Box<dyn std::error::Error + Send + Sync> { e.into() })?;
    }
    drop(eps);
    Ok(Outcome {
        rate: got as f64 / secs,
        rss_per_peer,
    })
}

fn main() -> std::process::ExitCode {
    let mut counts: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    if counts.is_empty() {
        counts = vec![4, 256];
    }
    let total = env("MSGS", 200_000);
    let size = env("SIZE", 64);
    let window = env("WINDOW", 16);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("many-peers: runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let res: Res<()> = rt.block_on(async {
        let mut hints = Info::default();
        hints.ep_attr.ep_type = EpType::Rdm;
        hints.caps = weft::Caps::TAGGED;
        hints.fabric_attr.prov_name = std::env::var("PROV").ok();
        let info = weft::getinfo(Some(&hints))?.remove(0);
        let fabric = weft::Fabric::open(&info)?;
        let domain = fabric.domain(&info)?;
        let mut first = None;
        for &n in &counts {
            let o = run(&domain, &info, n, total, size, window).await?;
            let base = *first.get_or_insert(o.rate);
            println!(
                "peers {n:>4}: {:>9.0} msgs/s aggregate ({size} B, window {window}/peer) = {:.2}x the {}-peer rate; {:.1} KiB RSS per idle connected peer (both ends in this process)",
                o.rate,
                o.rate / base,
                counts[0],
                o.rss_per_peer / 1024.0
            );
        }
        Ok(())
    });
    match res {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("many-peers: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
