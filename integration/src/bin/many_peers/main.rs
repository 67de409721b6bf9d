//! Many peers on one RDM endpoint: the aggregate message rate a hub
//! endpoint sustains from N peers (each its own endpoint and connection)
//! against the rate from 4 peers, and the memory an idle connected peer
//! costs. All in one process (the tcp provider on loopback, or the one
//! `PROV` names: `PROV=shm many-peers 1 8`).
//!
//! usage: many-peers [--multi | --srx] [PEERS...]    (default: 4 256)
//! env:   MSGS (total messages per run, 200000), SIZE (64), WINDOW (16 per peer),
//!        PROV (provider, default tcp), DOMAIN (its domain, e.g. rxe1 for
//!        verbs in the rxe VM); with --multi also MAXSIZE (4096) and
//!        MULTI_BUF (262144); with --srx MAXSIZE and HUB_EPS (4)
//!
//! Prints one line per peer count and the rate ratio against the first.
//! `--multi` compares, per peer count, the hub's rate with multi-receive
//! buffers against posted receives and the raw floor (see `multi.rs`);
//! `--srx` the hub's rate when `HUB_EPS` endpoints share one receive
//! context against one endpoint, both with the same receives posted
//! (see `srx.rs`).

mod multi;
mod srx;

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

/// The traffic of one run.
#[derive(Clone, Copy)]
struct Load {
    peers: usize,
    /// Messages in all (rounded down to a multiple of `peers`).
    total: usize,
    size: usize,
    /// Sends in flight per peer.
    window: usize,
}

/// `n` peer endpoints, each with the hub in its AV.
fn open_peers(
    domain: &Domain,
    info: &Info,
    hub_addr: &[u8],
    n: usize,
) -> Res<Vec<(Ep, weft::FiAddr)>> {
    let mut eps = Vec::with_capacity(n);
    for _ in 0..n {
        let p = open(domain, info)?;
        let dest =
            p.av.insert_sync(&[hub_addr.to_vec()], Default::default())?
                .fi_addrs[0];
        eps.push((p, dest));
    }
    Ok(eps)
}

/// Every peer streams `per_peer` messages of `size` bytes to the hub,
/// `window` in flight, tagged with `tag` or untagged.
fn spawn_senders(
    eps: &[(Ep, weft::FiAddr)],
    per_peer: usize,
    load: Load,
    tag: Option<u64>,
) -> Vec<tokio::task::JoinHandle<Result<(), String>>> {
    eps.iter()
        .map(|(p, dest)| {
            let ep = p.ep.clone();
            let dest = *dest;
            tokio::spawn(async move {
                let payload = Bytes::from(vec![7u8; load.size]);
                let mut inflight = FuturesUnordered::new();
                let mut sent = 0;
                while sent < per_peer || !inflight.is_empty() {
                    while sent < per_peer && inflight.len() < load.window {
                        let ep = ep.clone();
                        let b = payload.clone();
                        inflight.push(async move {
                            match tag {
                                Some(t) => ep.tsend(dest, b, t).await,
                                None => ep.send(dest, b).await,
                            }
                        });
                        sent += 1;
                    }
                    if let Some(r) = inflight.next().await {
                        r.map_err(|e| format!("send: {e:?}"))?;
                    }
                }
                Ok::<(), String>(())
            })
        })
        .collect()
}

/// Reads the hub's CQ until `expected` messages were counted: `on_recv`
/// gets each receive completion with the count so far and says whether
/// it was a message (it reposts what the hub needs).
async fn hub_loop(
    cq: &weft::CompletionQueue,
    expected: usize,
    mut on_recv: impl FnMut(weft::CqEntry, usize) -> Res<bool>,
) -> Res<usize> {
    let mut got = 0;
    let mut batch = Vec::with_capacity(64);
    while got < expected {
        batch.clear();
        if cq.read_batch(&mut batch, 64).await == 0 {
            return Err("hub CQ closed".into());
        }
        for item in batch.drain(..) {
            let e = item.map_err(|e| format!("hub recv: {e:?}"))?;
            if e.flags.contains(weft::OpFlags::RECV) && on_recv(e, got)? {
                got += 1;
            }
        }
    }
    Ok(got)
}

/// Waits for the senders, passing on the first failure.
async fn join_senders(senders: Vec<tokio::task::JoinHandle<Result<(), String>>>) -> Res<()> {
    for s in senders {
        s.await?
            .map_err(|e| -> Box<dyn std::error::Error + Send + Sync> { e.into() })?;
    }
    Ok(())
}

async fn run(domain: &Domain, info: &Info, load: Load) -> Res<Outcome> {
    let Load {
        peers,
        total,
        size,
        window,
    } = load;
    let hub = open(domain, info)?;
    let hub_addr = hub.ep.local_addr()?;
    let before = rss();
    let eps = open_peers(domain, info, &hub_addr, peers)?;
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
    let senders = spawn_senders(&eps, per_peer, load, Some(9));
    let mut live = posted;
    let got = hub_loop(&hub.cq, expected, |e, got| {
        live -= 1;
        if got + 1 + live < expected {
            live += 1;
            hub.ep.post_trecv(
                BytesMut::zeroed(size),
                FI_ADDR_UNSPEC,
                0,
                u64::MAX,
                e.context,
            )?;
        }
        Ok(true)
    })
    .await?;
    let secs = start.elapsed().as_secs_f64();
    join_senders(senders).await?;
    drop(eps);
    Ok(Outcome {
        rate: got as f64 / secs,
        rss_per_peer,
    })
}

fn main() -> std::process::ExitCode {
    let with_multi = std::env::args().any(|a| a == "--multi");
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
    let load = |peers| Load {
        peers,
        total,
        size,
        window,
    };
    let res: Res<()> = rt.block_on(async {
        let prov = std::env::var("PROV").ok();
        let dom = std::env::var("DOMAIN").ok();
        let mut hints = Info::default();
        hints.ep_attr.ep_type = EpType::Rdm;
        hints.caps = weft::Caps::TAGGED;
        hints.fabric_attr.prov_name = prov.clone();
        hints.domain_attr.name = dom.clone();
        let info = weft::getinfo(Some(&hints))?.remove(0);
        let fabric = weft::Fabric::open(&info)?;
        let domain = fabric.domain(&info)?;
        if std::env::args().any(|a| a == "--srx") {
            let mut hints = Info::default();
            hints.ep_attr.ep_type = EpType::Rdm;
            hints.caps = weft::Caps::MSG;
            let lone = weft::getinfo(Some(&hints))?.remove(0);
            hints.ep_attr.rx_ctx_cnt = weft::SHARED_CONTEXT;
            let shared = weft::getinfo(Some(&hints))?.remove(0);
            // A domain of untagged receives (the contexts take its caps).
            let fabric = weft::Fabric::open(&shared)?;
            let domain = fabric.domain(&shared)?;
            for &n in &counts {
                let r = srx::compare(&domain, &lone, &shared, load(n)).await?;
                println!(
                    "peers {n:>4}: raw floor {:>9.0} msgs/s; one endpoint {:>9.0} ({:.2}x raw); {} endpoints on a shared context {:>9.0} ({:.2}x raw) = {:.2}x one endpoint; receive memory posted {} KiB each way ({size} B, window {window}/peer)",
                    r.raw,
                    r.lone,
                    r.lone / r.raw,
                    env("HUB_EPS", 4),
                    r.shared,
                    r.shared / r.raw,
                    r.shared / r.lone,
                    r.posted_mem / 1024,
                );
            }
            return Ok(());
        }
        if with_multi {
            let mut hints = Info::default();
            hints.ep_attr.ep_type = EpType::Rdm;
            hints.caps = weft::Caps::MSG | weft::Caps::MULTI_RECV;
            hints.fabric_attr.prov_name = prov;
            hints.domain_attr.name = dom;
            let info = weft::getinfo(Some(&hints))?.remove(0);
            for &n in &counts {
                let r = multi::compare(&domain, &info, load(n)).await?;
                println!(
                    "peers {n:>4}: raw floor {:>9.0} msgs/s; posted {:>9.0} ({:.2}x raw); multi-recv {:>9.0} ({:.2}x raw) = {:.2}x posted; receive memory posted {} KiB, multi-recv {} KiB ({size} B, window {window}/peer)",
                    r.raw,
                    r.posted,
                    r.posted / r.raw,
                    r.multi,
                    r.multi / r.raw,
                    r.multi / r.posted,
                    r.posted_mem / 1024,
                    r.multi_mem / 1024,
                );
            }
            return Ok(());
        }
        let mut first = None;
        for &n in &counts {
            let o = run(&domain, &info, load(n)).await?;
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
