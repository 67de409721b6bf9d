//! Latency: the client sends `size` bytes, the server echoes them back,
//! one message in flight per direction. Each side pre-posts its receive
//! before the send that provokes the peer's message, so payloads land in
//! posted buffers instead of taking the provider's unexpected path.
//!
//! `--api post` sends the messages below the inject size with
//! `fi_inject`, as `fi_pingpong` does: no send completion is made or read
//! ([`inject_for`]; `WEFT_PINGPONG_INJECT=0` sends them with completions).
//!
//! `--api pool` sends from and receives into buffers of a pool registered
//! before the clock starts (as fi_pingpong uses its own registered
//! buffers), posted as `--api post` posts and with completions read the
//! same way: no copy through a provider's bounce buffers, and the server
//! echoes the very buffer a message arrived in.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use weft::{BufferPool, PoolBuf};

use crate::args::Api;
use crate::fail::{Context, Failure, Res};
use crate::link::{payload_keep, reclaim, recycle, Link, Received};
use crate::meter::Meter;
use crate::negotiate::{self, Params};

const RECV_CTX: u64 = 1;
const SEND_CTX: u64 = 2;

/// The client's run of one size: the elapsed time of the timed iterations.
pub async fn client(link: &Link, p: &Params, size: usize, api: Api, m: &Meter) -> Res<Duration> {
    if api == Api::Pool {
        return pooled_client(link, p, size, m).await;
    }
    let total = p.total()?;
    let fixed = negotiate::pattern(size, 0);
    let mut reaper = link.reaper();
    let inject = inject_for(link, size);
    let mut rbuf = vec![BytesMut::zeroed(size)];
    let mut start = Instant::now();
    for i in 0..total {
        if i == p.warmup {
            start = Instant::now();
        }
        // Borrowed: the post takes its own reference (a clone per
        // message, not two).
        let patterned;
        let sbuf = if p.verify {
            patterned = negotiate::pattern(size, i as u64);
            &patterned
        } else {
            &fixed
        };
        let got = match api {
            Api::Post => {
                // The posts' first tries outside their futures (see
                // `Link::post_send_now`).
                if let Err((e, back)) = link.post_recv_now(rbuf, RECV_CTX) {
                    fail_or_wait_recv(link, e, back).await?;
                }
                // A refused inject (a full queue) goes as a send.
                let inj = inject && link.inject_now(sbuf).is_ok();
                if !inj {
                    if let Err(e) = link.post_send_now(sbuf, SEND_CTX) {
                        fail_or_wait_send(link, e, sbuf.clone()).await?;
                    }
                }
                // Mostly both completions are there already: taken
                // without building the waits' futures. The answer first:
                // it is the batch's last, taken without moving the
                // send's, which is then the last (`Reaper::take_batched_received`).
                let got = match reaper.try_wait_received(RECV_CTX)? {
                    Some(r) => r,
                    None => reaper.wait_unread(RECV_CTX).await?.into(),
                };
                if !inj && !reaper.try_done(SEND_CTX)? {
                    reaper.wait_unread(SEND_CTX).await?;
                }
                got
            }
            // Pool runs in `pooled_client` / `pooled_server`.
            Api::Async | Api::Pool => {
                // join! polls in order: the receive is posted first.
                let buf = rbuf.pop().unwrap_or_default();
                let (r, s) = tokio::join!(link.recv(buf), link.send(sbuf.clone()));
                s?;
                Received::from(r?)
            }
        };
        if p.verify {
            negotiate::check(&payload_ref(&got.bufs, got.len), size, i as u64)?;
        } else {
            negotiate::check_len(got.len, size, i as u64)?;
        }
        rbuf = reclaim(got.bufs, size);
        m.set(i + 1);
    }
    Ok(start.elapsed())
}

/// The server's run of one size: receive, then echo the very buffer back.
pub async fn server(link: &Link, p: &Params, size: usize, api: Api, m: &Meter) -> Res<Duration> {
    if api == Api::Pool {
        return pooled_server(link, p, size, m).await;
    }
    let total = p.total()?;
    let mut reaper = link.reaper();
    let inject = inject_for(link, size);
    // Two buffers circulate: one being echoed, one posted for the next
    // message. The receive `Vec`s circulate with them.
    let mut spare = vec![BytesMut::zeroed(size)];
    let mut start = Instant::now();
    let mut pending = match api {
        Api::Post => {
            link.post_recv(vec![BytesMut::zeroed(size)], RECV_CTX)
                .await?;
            None
        }
        // Pool runs in `pooled_client` / `pooled_server`.
        Api::Async | Api::Pool => Some(link.recv(BytesMut::zeroed(size)).await?),
    };
    for i in 0..total {
        let got = match pending.take() {
            Some(e) => e,
            None => match reaper.try_wait(RECV_CTX)? {
                Some(e) => e,
                None => reaper.wait_unread(RECV_CTX).await?,
            },
        };
        // The clock starts at the first timed message, as the client's does
        // when it sends it; the difference is one one-way trip in total.
        if i == p.warmup {
            start = Instant::now();
        }
        let (data, mut emptied) = payload_keep(got);
        check_payload(p, &data, size, i)?;
        let last = i + 1 == total;
        match api {
            Api::Post => {
                if !last {
                    if let Err((e, back)) = link.post_recv_now(spare, RECV_CTX) {
                        fail_or_wait_recv(link, e, back).await?;
                    }
                }
                // A refused inject (a full queue) goes as a send.
                let inj = inject && link.inject_now(&data).is_ok();
                if !inj {
                    if let Err(e) = link.post_send_now(&data, SEND_CTX) {
                        fail_or_wait_send(link, e, data.clone()).await?;
                    }
                    if !reaper.try_done(SEND_CTX)? {
                        reaper.wait_unread(SEND_CTX).await?;
                    }
                }
            }
            Api::Async | Api::Pool if last => {
                link.send(data.clone()).await?;
            }
            // Pool runs in `pooled_client` / `pooled_server`.
            Api::Async | Api::Pool => {
                let buf = spare.pop().unwrap_or_default();
                let (r, s) = tokio::join!(link.recv(buf), link.send(data.clone()));
                s?;
                pending = Some(r?);
                emptied = spare;
            }
        }
        emptied.clear();
        emptied.push(recycle(data, size));
        spare = emptied;
        m.set(i + 1);
    }
    Ok(start.elapsed())
}

/// Buffers in the pool: the two a side holds (one receiving, one
/// sending) and room for a sent one that has not come back yet.
const POOL_BUFS: usize = 4;

/// `--api pool`'s client: each message goes out of a pool buffer and the
/// echo lands in another, both posted as `--api post` posts (completions
/// read from the CQ by the reaper), without a copy.
async fn pooled_client(link: &Link, p: &Params, size: usize, m: &Meter) -> Res<Duration> {
    let total = p.total()?;
    let pool = link.buffer_pool(POOL_BUFS, size)?;
    let mut reaper = link.reaper();
    // Each echo goes out again as the next message: one buffer from the
    // pool per message, as on the server. Without --verify the first
    // message's bytes are the only ones written: the echoes carry them.
    let mut sbuf = pool_buf(&pool).await?;
    sbuf.set_len(size).ctx("pool buffer")?;
    negotiate::fill(&mut sbuf, 0);
    let mut start = Instant::now();
    for i in 0..total {
        if i == p.warmup {
            start = Instant::now();
        }
        if p.verify {
            negotiate::fill(&mut sbuf, i as u64);
        }
        let rbuf = pool_buf(&pool).await?;
        if let Err((e, back)) = link.post_recv_pooled_now(rbuf, RECV_CTX) {
            fail_or_wait_pooled_recv(link, e, back).await?;
        }
        if let Err((e, back)) = link.post_send_pooled_now(sbuf, SEND_CTX) {
            fail_or_wait_send(link, e, back).await?;
        }
        if !reaper.try_done(SEND_CTX)? {
            reaper.wait_unread(SEND_CTX).await?;
        }
        let got = match reaper.try_wait(RECV_CTX)? {
            Some(e) => e,
            None => reaper.wait_unread(RECV_CTX).await?,
        };
        let got = reclaimed(&pool, got)?;
        check_payload(p, &got, size, i)?;
        sbuf = got;
        m.set(i + 1);
    }
    Ok(start.elapsed())
}

/// `--api pool`'s server: receives into a pool buffer and sends that very
/// buffer back, posted as in [`pooled_client`].
async fn pooled_server(link: &Link, p: &Params, size: usize, m: &Meter) -> Res<Duration> {
    let total = p.total()?;
    let pool = link.buffer_pool(POOL_BUFS, size)?;
    let mut reaper = link.reaper();
    link.post_recv_pooled_full(pool_buf(&pool).await?, RECV_CTX)
        .await?;
    let mut start = Instant::now();
    for i in 0..total {
        let got = match reaper.try_wait(RECV_CTX)? {
            Some(e) => e,
            None => reaper.wait_unread(RECV_CTX).await?,
        };
        // As in the other branches: the clock starts at the first timed
        // message.
        if i == p.warmup {
            start = Instant::now();
        }
        let got = reclaimed(&pool, got)?;
        check_payload(p, &got, size, i)?;
        if i + 1 != total {
            let next = pool_buf(&pool).await?;
            if let Err((e, back)) = link.post_recv_pooled_now(next, RECV_CTX) {
                fail_or_wait_pooled_recv(link, e, back).await?;
            }
        }
        if let Err((e, back)) = link.post_send_pooled_now(got, SEND_CTX) {
            fail_or_wait_send(link, e, back).await?;
        }
        if !reaper.try_done(SEND_CTX)? {
            reaper.wait_unread(SEND_CTX).await?;
        }
        m.set(i + 1);
    }
    Ok(start.elapsed())
}

/// The pool buffer a receive's completion carries back.
fn reclaimed(pool: &BufferPool, mut got: weft::CqEntry) -> Res<PoolBuf> {
    pool.reclaim(&mut got.bufs)
        .ok_or_else(|| Failure::new("receive", "the completion carries no pool buffer"))
}

/// [`fail_or_wait_recv`] for a pool receive.
async fn fail_or_wait_pooled_recv(link: &Link, e: weft::Error, back: Option<PoolBuf>) -> Res<()> {
    match (e, back) {
        (weft::Error::Again, Some(b)) => link.post_recv_pooled_full(b, RECV_CTX).await,
        (e, _) => Err(Failure::new("post receive", e)),
    }
}

/// A free buffer: mostly there already, else the one a finished send is
/// about to give back.
async fn pool_buf(pool: &BufferPool) -> Res<PoolBuf> {
    pool.get().await.ctx("pool buffer")
}

/// Whether `--api post` sends a message of `size` bytes with `fi_inject`
/// (no send completion to make or read): below the endpoint's
/// `inject_size`, as `fi_pingpong` sends every message below it, unless
/// `WEFT_PINGPONG_INJECT=0` (each side decides for its own sends; runs
/// before 2026-12-03 sent every message with a completion).
fn inject_for(link: &Link, size: usize) -> bool {
    let off = std::env::var_os("WEFT_PINGPONG_INJECT").is_some_and(|v| v == "0");
    !off && size < link.ep.info().tx_attr.inject_size
}

/// What arrived: its length, and with --verify its bytes.
fn check_payload(p: &Params, got: &[u8], size: usize, i: usize) -> Res<()> {
    if p.verify {
        negotiate::check(got, size, i as u64)
    } else {
        negotiate::check_len(got.len(), size, i as u64)
    }
}

/// A first try at posting a receive that did not take: wait out a full
/// queue, fail on anything else.
async fn fail_or_wait_recv(link: &Link, e: weft::Error, back: Vec<BytesMut>) -> Res<()> {
    match e {
        weft::Error::Again => link.post_recv_full(back, RECV_CTX).await,
        e => Err(Failure::new("post receive", e)),
    }
}

/// [`fail_or_wait_recv`] for a send.
async fn fail_or_wait_send(link: &Link, e: weft::Error, buf: Bytes) -> Res<()> {
    match e {
        weft::Error::Again => link.post_send_full(buf, SEND_CTX).await,
        e => Err(Failure::new("post send", e)),
    }
}

fn payload_ref(bufs: &[BytesMut], len: usize) -> Bytes {
    let mut out = BytesMut::with_capacity(len);
    for b in bufs {
        out.extend_from_slice(b);
    }
    out.truncate(len);
    out.freeze()
}
