//! Streaming bandwidth: the client keeps up to `window` sends in flight,
//! the server keeps up to `window` receives posted; after each phase the
//! server acknowledges, so the client's clock covers delivery, not just
//! handing bytes to the socket.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::stream::{FuturesOrdered, FuturesUnordered};
use futures::StreamExt;

use crate::args::Api;
use crate::fail::{Context, Failure, Res};
use crate::link::{payload, Link, Reaper};
use crate::pingpong::{reclaim, recycle};
use crate::proto::{self, Params};

const ACK: &[u8] = b"ack";

pub async fn client(link: &Link, p: &Params, size: usize, api: Api) -> Res<Duration> {
    let mut reaper = link.reaper();
    send_phase(link, &mut reaper, p, size, api, 0, p.warmup).await?;
    let start = Instant::now();
    send_phase(link, &mut reaper, p, size, api, p.warmup, p.iters).await?;
    Ok(start.elapsed())
}

pub async fn server(link: &Link, p: &Params, size: usize, api: Api) -> Res<Duration> {
    let mut reaper = link.reaper();
    recv_phase(link, &mut reaper, p, size, api, 0, p.warmup).await?;
    let start = Instant::now();
    recv_phase(link, &mut reaper, p, size, api, p.warmup, p.iters).await?;
    Ok(start.elapsed())
}

/// Sends messages `first .. first + n`.
async fn send_phase(
    link: &Link,
    reaper: &mut Reaper,
    p: &Params,
    size: usize,
    api: Api,
    first: usize,
    n: usize,
) -> Res<()> {
    let fixed = proto::pattern(size, 0);
    let payload_of = |i: usize| -> Bytes {
        if p.verify {
            proto::pattern(size, (first + i) as u64)
        } else {
            fixed.clone()
        }
    };
    let (mut sent, mut done) = (0, 0);
    match api {
        Api::Post => {
            while done < n {
                while sent < n && sent - done < p.window {
                    link.post_send(payload_of(sent), sent as u64).await?;
                    sent += 1;
                }
                reaper.next().await?;
                done += 1;
            }
        }
        Api::Async => {
            let mut inflight = FuturesUnordered::new();
            while done < n {
                while sent < n && inflight.len() < p.window {
                    inflight.push(link.send(payload_of(sent)));
                    sent += 1;
                }
                match inflight.next().await {
                    Some(r) => {
                        r.ctx("send")?;
                    }
                    None => break,
                }
                done += 1;
            }
        }
    }
    tracing::debug!(size, first, n, "sends complete, awaiting ack");
    let ack = link.recv_ctrl().await?;
    tracing::debug!(size, first, n, "ack received");
    if ack.as_ref() != ACK {
        return Err(Failure::new(
            "wait for acknowledgement",
            "unexpected message",
        ));
    }
    Ok(())
}

/// Receives messages `first .. first + n`, in order: receives match in
/// the order they were posted, and messages arrive in the order sent.
async fn recv_phase(
    link: &Link,
    reaper: &mut Reaper,
    p: &Params,
    size: usize,
    api: Api,
    first: usize,
    n: usize,
) -> Res<()> {
    let check = |data: &[u8], i: usize| {
        let iter = (first + i) as u64;
        if p.verify {
            proto::check(data, size, iter)
        } else {
            proto::check_len(data.len(), size, iter)
        }
    };
    let depth = p.window.min(n);
    let (mut posted, mut got) = (0, 0);
    match api {
        Api::Post => {
            while posted < depth {
                link.post_recv(BytesMut::zeroed(size), posted as u64)
                    .await?;
                posted += 1;
            }
            while got < n {
                let e = reaper.next().await?;
                let i = e.context as usize;
                let buf = if p.verify {
                    let data = payload(e);
                    check(&data, i)?;
                    recycle(data, size)
                } else {
                    proto::check_len(e.len, size, (first + i) as u64)?;
                    reclaim(e.bufs, size)
                };
                got += 1;
                if posted < n {
                    link.post_recv(buf, posted as u64).await?;
                    posted += 1;
                }
            }
        }
        Api::Async => {
            let mut queue = FuturesOrdered::new();
            while posted < depth {
                queue.push_back(link.recv(BytesMut::zeroed(size)));
                posted += 1;
            }
            while let Some(r) = queue.next().await {
                let e = r.ctx("receive")?;
                let data = payload(e);
                check(&data, got)?;
                got += 1;
                if posted < n {
                    queue.push_back(link.recv(recycle(data, size)));
                    posted += 1;
                }
            }
        }
    }
    tracing::debug!(size, first, n, "all received, acking");
    link.send_ctrl(Bytes::from_static(ACK)).await
}
