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
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weft::{Domain, EpOpt, Info, OpFlags};

use super::{env, hub_loop, join_senders, open, open_peers, spawn_senders, Load, Res};

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
/// multi-receive buffers; returns messages per second and the bytes
/// posted for receiving.
pub async fn hub_rate(domain: &Domain, info: &Info, load: Load, multi: bool) -> Res<(f64, usize)> {
    let (peers, size) = (load.peers, load.size);
    let maxsize = env("MAXSIZE", 4096);
    let buf = env("MULTI_BUF", 256 * 1024);
    let hub = open(domain, info)?;
    let hub_addr = hub.ep.local_addr()?;
    let eps = open_peers(domain, info, &hub_addr, peers)?;
    // Connect every peer first.
    for (p, dest) in &eps {
        let (got, sent) = tokio::join!(
            hub.ep.recv(BytesMut::zeroed(maxsize)),
            p.ep.send(*dest, Bytes::from(vec![1u8; size]))
        );
        sent.map_err(|e| format!("connect send: {e:?}"))?;
        got.map_err(|e| format!("connect recv: {e:?}"))?;
    }
    let per_peer = load.total / peers;
    let expected = per_peer * peers;
    let posted = (load.window * peers).clamp(64, info.rx_attr.size);
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
    let senders = spawn_senders(&eps, per_peer, load, None);
    let mut live = posted;
    let got = hub_loop(&hub.cq, expected, |e, got| {
        if multi {
            if e.flags.contains(OpFlags::MULTI_RECV) {
                hub.ep
                    .post_recv_multi(BytesMut::zeroed(buf), e.context)
                    .map_err(|(e, _)| e)?;
            }
            // A release without a message carries no FI_MSG.
            return Ok(e.flags.contains(OpFlags::MSG));
        }
        live -= 1;
        if got + 1 + live < expected {
            live += 1;
            hub.ep.post_recv(BytesMut::zeroed(maxsize), e.context)?;
        }
        Ok(true)
    })
    .await?;
    let secs = start.elapsed().as_secs_f64();
    join_senders(senders).await?;
    Ok((got as f64 / secs, mem))
}

/// The raw floor: `peers` loopback TCP connections, each carrying
/// `per_peer` frames of a Weft header and `size` payload bytes written
/// back to back, read whole by one task per connection.
pub async fn raw_rate(peers: usize, total: usize, size: usize) -> Res<f64> {
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

/// Raw floor, posted receives and multi-receive for `load`.
pub async fn compare(domain: &Domain, info: &Info, load: Load) -> Res<Rates> {
    let raw = raw_rate(load.peers, load.total, load.size).await?;
    let (posted, posted_mem) = hub_rate(domain, info, load, false).await?;
    let (multi, multi_mem) = hub_rate(domain, info, load, true).await?;
    Ok(Rates {
        raw,
        posted,
        multi,
        posted_mem,
        multi_mem,
    })
}
