//! Streaming bandwidth: the client keeps up to `window` sends in flight,
//! the server keeps up to `window` receives posted; after each phase the
//! server acknowledges, so the client's clock covers delivery, not just
//! handing bytes to the socket.
//!
//! Over DGRAM nothing stops a sender from outrunning its receiver, whose
//! provider drops what it has no room for; so there every window is a
//! phase of its own, acknowledged before the next is sent, and the
//! receiver is never more than one window behind.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::future::Either;
use futures::stream::{FuturesOrdered, FuturesUnordered};
use futures::StreamExt;

use crate::args::Api;
use crate::fail::{Context, Failure, Res};
use crate::link::{payload, reclaim, recycle, Link, Reaper};
use crate::meter::Meter;
use crate::negotiate::{self, Params};

const ACK: &[u8] = b"ack";

pub async fn client(link: &Link, p: &Params, size: usize, api: Api, m: &Meter) -> Res<Duration> {
    let s = Side::open(link, p, size, api)?;
    let mut reaper = link.reaper();
    for phase in phases(link, p, 0, p.warmup) {
        send_phase(&s, &mut reaper, phase, m).await?;
    }
    let start = Instant::now();
    for phase in phases(link, p, p.warmup, p.iters) {
        send_phase(&s, &mut reaper, phase, m).await?;
    }
    Ok(start.elapsed())
}

pub async fn server(link: &Link, p: &Params, size: usize, api: Api, m: &Meter) -> Res<Duration> {
    let s = Side::open(link, p, size, api)?;
    let mut reaper = link.reaper();
    for phase in phases(link, p, 0, p.warmup) {
        recv_phase(&s, &mut reaper, phase, m).await?;
    }
    let start = Instant::now();
    for phase in phases(link, p, p.warmup, p.iters) {
        recv_phase(&s, &mut reaper, phase, m).await?;
    }
    Ok(start.elapsed())
}

/// One side's run of one size.
struct Side<'a> {
    link: &'a Link,
    p: &'a Params,
    size: usize,
    api: Api,
    /// `--api pool`: one window of `size`-byte buffers, registered before
    /// the clock starts.
    pool: Option<weft::BufferPool>,
}

impl<'a> Side<'a> {
    fn open(link: &'a Link, p: &'a Params, size: usize, api: Api) -> Res<Side<'a>> {
        let pool = if api == Api::Pool {
            Some(link.buffer_pool(p.window, size)?)
        } else {
            None
        };
        Ok(Side {
            link,
            p,
            size,
            api,
            pool,
        })
    }
}

/// Messages `first .. first + n` as acknowledged phases `(first, n)`: one
/// phase, or over DGRAM one per window. Both sides split alike (the
/// window is the client's). Always at least one phase, so both sides
/// exchange the acknowledgement even for `n == 0`.
fn phases(link: &Link, p: &Params, first: usize, n: usize) -> Vec<(usize, usize)> {
    split(first, n, if link.lossy() { p.window } else { n })
}

fn split(first: usize, n: usize, step: usize) -> Vec<(usize, usize)> {
    let step = step.max(1);
    let mut v = vec![(first, n.min(step))];
    let mut off = n.min(step);
    while off < n {
        let k = step.min(n - off);
        v.push((first + off, k));
        off += k;
    }
    v
}

/// Sends messages `first .. first + n` (one phase).
async fn send_phase(
    s: &Side<'_>,
    reaper: &mut Reaper,
    (first, n): (usize, usize),
    m: &Meter,
) -> Res<()> {
    let (link, p, size) = (s.link, s.p, s.size);
    let fixed = negotiate::pattern(size, 0);
    let payload_of = |i: usize| -> Bytes {
        if p.verify {
            negotiate::pattern(size, (first + i) as u64)
        } else {
            fixed.clone()
        }
    };
    let (mut sent, mut done) = (0, 0);
    match (s.api, s.pool.as_ref()) {
        (Api::Post, _) => {
            while done < n {
                while sent < n && sent - done < p.window {
                    link.post_send(payload_of(sent), sent as u64).await?;
                    sent += 1;
                }
                reaper.next().await?;
                done += 1;
                m.set(first + done);
            }
        }
        (Api::Async | Api::Pool, pool) => {
            let mut inflight = FuturesUnordered::new();
            while done < n {
                while sent < n && inflight.len() < p.window {
                    let op = match pool {
                        // A buffer of a send that completed is back already.
                        Some(pool) => {
                            let mut b = pool.get().await.ctx("pool buffer")?;
                            b.set_len(size).ctx("pool buffer")?;
                            if p.verify {
                                b.copy_from_slice(&payload_of(sent));
                            }
                            Either::Left(link.send_pooled(b))
                        }
                        None => Either::Right(link.send(payload_of(sent))),
                    };
                    inflight.push(op);
                    sent += 1;
                }
                match inflight.next().await {
                    Some(r) => {
                        r?;
                    }
                    None => break,
                }
                done += 1;
                m.set(first + done);
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
    s: &Side<'_>,
    reaper: &mut Reaper,
    (first, n): (usize, usize),
    m: &Meter,
) -> Res<()> {
    let (link, p, size) = (s.link, s.p, s.size);
    let check = |data: &[u8], i: usize| {
        let iter = (first + i) as u64;
        if p.verify {
            negotiate::check(data, size, iter)
        } else {
            negotiate::check_len(data.len(), size, iter)
        }
    };
    let depth = p.window.min(n);
    let (mut posted, mut got) = (0, 0);
    match (s.api, s.pool.as_ref()) {
        (Api::Post, _) => {
            while posted < depth {
                link.post_recv(vec![BytesMut::zeroed(size)], posted as u64)
                    .await?;
                posted += 1;
            }
            while got < n {
                let e = reaper.next().await?;
                let i = e.context as usize;
                let buf = if p.verify {
                    let data = payload(e);
                    check(&data, i)?;
                    vec![recycle(data, size)]
                } else {
                    negotiate::check_len(e.len, size, (first + i) as u64)?;
                    reclaim(e.bufs, size)
                };
                got += 1;
                m.set(first + got);
                if posted < n {
                    link.post_recv(buf, posted as u64).await?;
                    posted += 1;
                }
            }
        }
        (Api::Pool, Some(pool)) => {
            let mut queue = FuturesOrdered::new();
            while got < n {
                // `depth` receives posted, each into a pool buffer (the
                // one a checked receive dropped is back already).
                while posted < n && posted - got < depth {
                    let b = pool.get().await.ctx("pool buffer")?;
                    queue.push_back(link.recv_pooled(b));
                    posted += 1;
                }
                let Some(r) = queue.next().await else {
                    break;
                };
                check(&r?.buf, got)?;
                got += 1;
                m.set(first + got);
            }
        }
        (Api::Async | Api::Pool, _) => {
            let mut queue = FuturesOrdered::new();
            while posted < depth {
                queue.push_back(link.recv(BytesMut::zeroed(size)));
                posted += 1;
            }
            while let Some(r) = queue.next().await {
                let data = payload(r?);
                check(&data, got)?;
                got += 1;
                m.set(first + got);
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

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn phases_cover_every_message_once() {
        assert_eq!(split(0, 1, 64), vec![(0, 1)]);
        assert_eq!(split(0, 0, 64), vec![(0, 0)]);
        assert_eq!(split(100, 1000, 1000), vec![(100, 1000)]);
        assert_eq!(split(10, 150, 64), vec![(10, 64), (74, 64), (138, 22)]);
        assert_eq!(split(0, 128, 64), vec![(0, 64), (64, 64)]);
    }
}
