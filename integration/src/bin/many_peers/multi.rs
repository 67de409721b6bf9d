//! `many-peers --multi`: the hub's message rate with multi-receive
//! buffers (`FI_MULTI_RECV`) against posted receives, next to the raw
//! floor of the same traffic (bare loopback TCP streams carrying the same
//! frames: no matching, no completions, no acknowledgements), with the
//! memory each way keeps posted for receiving.
//!
//! Posted receives must each hold the largest message the service
//! accepts (`MAXSIZE`, default 4 KiB); multi-receive buffers (`MULTI_BUF`,
//! 256 KiB, four posted, reposted as they are released) pack messages of
//! any size and are released below `MAXSIZE` free.

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weft::{Domain, EpOpt, Info, OpFlags};

use super::{env, open, Res};

/// Buffers of the multi-receive run.
const MULTI_BUFS: usize = 4;

/// One run's figures.
pub struct Rates {
    pub raw: f64,
    pub posted: f64,
    pub multi: f64,
    pub posted_mem: usize,
    pub multi_mem: usize,
}

/// The hub receives with posted receives (`multi` false) or
/// multi-receive buffers; returns messages per second.
async fn hub_rate(
    domain: &Domain,
    info: &Info,
    peers: usize,
    total: usize,
    size: usize,
    window: usize,
    multi: bool,
) -> Res<(f64, usize)> {
    let maxsize = env("MAXSIZE", 4096);
    let buf = env("MULTI_BUF", 256 * 1024);
    let hub = open(domain, info)?;
    let hub_addr = hub.ep.local_addr()?;
    let mut eps = Vec::with_capacity(peers);
    for _ in 0..peers {
        let p = open(domain, info)?;
        let dest =
            p.av.insert_sync(std::slice::from_ref(&hub_addr), Default::default())?
                .fi_addrs[0];
        eps.push((p, dest));
    }
    // Connect every peer first.
    for (p, dest) in &eps {
        let (got, sent) = tokio::join!(
            hub.ep.recv(BytesMut::zeroed(maxsize)),
            p.ep.send(*dest, Bytes::from(vec![1u8; size]))
        );
        sent.map_err(|e| format!("connect send: {e:?}"))?;
        got.map_err(|e| format!("connect recv: {e:?}"))?;
    }
    let per_peer = total / peers;
    let expected = per_peer * peers;
    let posted = (window * peers).clamp(64, info.rx_attr.size);
    let mem = if multi {
        hub.ep.setopt(EpOpt::MinMultiRecv, maxsize)?;
        for i in 0..MULTI_BUFS {
            hub.ep
                .post_recv_multi(BytesMut::zeroed(buf), i as u64)
                .map_err(|(e, _)| e)?;
        }
        MULTI_BUFS * buf
    } else {
        for i in 0..posted {
            hub.ep.post_recv(BytesMut::zeroed(maxsize), i as u64)?;
        }
        posted * maxsize
    };
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
                        inflight.push(async move { ep.send(dest, b).await });
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
            if !e.flags.contains(OpFlags::RECV) {
                continue;
            }
            if multi {
                if e.flags.contains(OpFlags::MSG) {
                    got += 1;
                }
                if e.flags.contains(OpFlags::MULTI_RECV) {
                    hub.ep
                        .post_recv_multi(BytesMut::zeroed(buf), e.context)
                        .map_err(|(e, _)| e)?;
                }
                continue;
            }
            got += 1;
            live -= 1;
            if got + live < expected {
                live += 1;
                hub.ep.post_recv(BytesMut::zeroed(maxsize), e.context)?;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    for s in senders {
        s.await?
            .map_err(|e| -> Box<dyn std::error::Error + Send + Sync> { e.into() })?;
    }
    Ok((got as f64 / secs, mem))
}

/// The raw floor: `peers` loopback TCP connections, each carrying
/// `per_peer` frames of a Weft header and `size` payload bytes written
/// back to back, read whole by one task per connection.
async fn raw_rate(peers: usize, total: usize, size: usize) -> Res<f64> {
    let frame = weft_core::wire::HEADER_LEN + size;
    let per_peer = total / peers;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    let mut pairs = Vec::with_capacity(peers);
    for _ in 0..peers {
        let c = tokio::net::TcpStream::connect(addr).await?;
        let (s, _) = l.accept().await?;
        c.set_nodelay(true)?;
        pairs.push((c, s));
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (mut c, mut s) in pairs {
        tasks.push(tokio::spawn(async move {
            let msg = vec![7u8; frame];
            for _ in 0..per_peer {
                c.write_all(&msg).await?;
            }
            Ok::<(), std::io::Error>(())
        }));
        tasks.push(tokio::spawn(async move {
            let mut buf = vec![0u8; frame];
            for _ in 0..per_peer {
                s.read_exact(&mut buf).await?;
            }
            Ok::<(), std::io::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok((per_peer * peers) as f64 / start.elapsed().as_secs_f64())
}

/// Raw floor, posted receives and multi-receive for `peers` peers.
pub async fn compare(
    domain: &Domain,
    info: &Info,
    peers: usize,
    total: usize,
    size: usize,
    window: usize,
) -> Res<Rates> {
    let raw = raw_rate(peers, total, size).await?;
    let (posted, posted_mem) = hub_rate(domain, info, peers, total, size, window, false).await?;
    let (multi, multi_mem) = hub_rate(domain, info, peers, total, size, window, true).await?;
    Ok(Rates {
        raw,
        posted,
        multi,
        posted_mem,
        multi_mem,
    })
}
