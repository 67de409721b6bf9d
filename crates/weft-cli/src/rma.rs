//! `pingpong --rma`: the latency of RMA on a region of each side, the
//! counterpart of perftest's `ib_write_lat` and `ib_read_lat`.
//!
//! Before each size every side that is written or read allocates a
//! region from its domain and the two swap where they are over an
//! ordinary (control) message.
//!
//! * write: the client writes `size` bytes with remote CQ data into the
//!   server's region (`fi_writedata`); the server waits for the write's
//!   target completion and writes the bytes back the same way. As in the
//!   message ping-pong the row's usec/xfer is half a round trip.
//!   (`ib_write_lat` watches the last byte of its buffer instead: a plain
//!   RDMA write has no target completion; remote CQ data is how a fabric
//!   application learns that a write landed.)
//! * read: the client reads `size` bytes of the server's region, one read
//!   in flight; each read's completion is a whole round trip, which is
//!   what the row's usec/xfer is (as `ib_read_lat` reports it). The
//!   server has nothing to do until the client hands it its time.
//!
//! Every write carries the iteration number as remote CQ data (32 bits,
//! what verbs MSG carries), checked with the length at each target
//! completion; `--verify` also checks every byte that arrived against the
//! iteration's pattern (read: against the region's pattern, in a buffer
//! filled with another one before each read).
//!
//! On verbs MSG a write with remote CQ data completes a receive the
//! target posted (libfabric's `FI_RX_CQ_DATA`, kept in the offer), so a
//! side posts an empty receive before the peer's write can come; RDM,
//! and tcp on either type, report the write on their own.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use weft::{CqEntry, EpType, MemoryRegion, Mode, MrAccess, OpFlags, RmaMsg, RmaOp};

use crate::args::{Api, Rma};
use crate::fail::{Context, Failure, Res};
use crate::link::{reclaim, Link, Reaper};
use crate::meter::Meter;
use crate::negotiate::{self, Params, Region};

/// The empty receive a write with remote CQ data completes on MSG.
const NOTE_CTX: u64 = 3;
/// This side's own write or read.
const RMA_CTX: u64 = 4;
/// The pattern of the server's region in read mode; a read buffer is
/// filled with the next one (which differs in every byte) before each
/// read, so a byte the read did not write is caught.
const READ_SEED: u64 = 0;

/// The client's run of one size: the elapsed time of the timed iterations.
pub async fn client(
    link: &Link,
    p: &Params,
    size: usize,
    op: Rma,
    api: Api,
    m: &Meter,
) -> Res<Duration> {
    match op {
        Rma::Write => write_client(link, p, size, api, m).await,
        Rma::Read => read_client(link, p, size, api, m).await,
    }
}

/// The server's run of one size; a read's has nothing to count.
pub async fn server(
    link: &Link,
    p: &Params,
    size: usize,
    op: Rma,
    api: Api,
    m: &Meter,
) -> Res<Duration> {
    match op {
        Rma::Write => write_server(link, p, size, api, m).await,
        Rma::Read => read_server(link, size).await,
    }
}

async fn write_client(link: &Link, p: &Params, size: usize, api: Api, m: &Meter) -> Res<Duration> {
    let mr = region(link, size, MrAccess::REMOTE_WRITE)?;
    negotiate::send_region(link, Some(described(&mr))).await?;
    let peer = negotiate::recv_region(link, size).await?;
    let mut reaper = link.reaper();
    let fixed = negotiate::pattern(size, 0);
    let mut start = Instant::now();
    for i in 0..p.total()? {
        if i == p.warmup {
            start = Instant::now();
        }
        let data = if p.verify {
            negotiate::pattern(size, i as u64)
        } else {
            fixed.clone()
        };
        // The server's write back needs it, and comes only after ours.
        note_slot(link).await?;
        write(link, &mut reaper, api, data, i, &peer).await?;
        let note = reaper.wait_remote_write().await?;
        check_note(&note, size, i)?;
        if p.verify {
            negotiate::check(&contents(&mr, size)?, size, i as u64)?;
        }
        m.set(i + 1);
    }
    Ok(start.elapsed())
}

async fn write_server(link: &Link, p: &Params, size: usize, api: Api, m: &Meter) -> Res<Duration> {
    let mr = region(link, size, MrAccess::REMOTE_WRITE)?;
    let peer = negotiate::recv_region(link, size).await?;
    // Posted after the control receive above (MSG receives complete in
    // order) and before our region goes out, after which the client's
    // first write may come at any time.
    note_slot(link).await?;
    negotiate::send_region(link, Some(described(&mr))).await?;
    let mut reaper = link.reaper();
    let fixed = negotiate::pattern(size, 0);
    let total = p.total()?;
    let mut start = Instant::now();
    for i in 0..total {
        let note = reaper.wait_remote_write().await?;
        // As in the message ping-pong, the clock starts at the first
        // timed write, as the client's does when it issues it.
        if i == p.warmup {
            start = Instant::now();
        }
        check_note(&note, size, i)?;
        let back = if p.verify {
            let got = contents(&mr, size)?;
            negotiate::check(&got, size, i as u64)?;
            got
        } else {
            fixed.clone()
        };
        if i + 1 < total {
            note_slot(link).await?;
        }
        write(link, &mut reaper, api, back, i, &peer).await?;
        m.set(i + 1);
    }
    Ok(start.elapsed())
}

async fn read_client(link: &Link, p: &Params, size: usize, api: Api, m: &Meter) -> Res<Duration> {
    negotiate::send_region(link, None).await?;
    let peer = negotiate::recv_region(link, size).await?;
    let mut reaper = link.reaper();
    let poison = p.verify.then(|| negotiate::pattern(size, READ_SEED + 1));
    let mut buf = BytesMut::zeroed(size);
    let mut start = Instant::now();
    for i in 0..p.total()? {
        if i == p.warmup {
            start = Instant::now();
        }
        if let Some(x) = &poison {
            buf.copy_from_slice(x);
        }
        let got = read(link, &mut reaper, api, buf, &peer).await?;
        negotiate::check_len(got.len, size, i as u64)?;
        if p.verify {
            let data: Vec<u8> = got.bufs.iter().flat_map(|b| b.iter().copied()).collect();
            negotiate::check_as(&data, size, READ_SEED, &format!("read {i}"))?;
        }
        buf = reclaim(got.bufs, size).pop().unwrap_or_default();
        m.set(i + 1);
    }
    let t = start.elapsed();
    negotiate::send_elapsed(link, t).await?;
    Ok(t)
}

/// Fills a region for the client to read and holds it until the client
/// is done; its time is the client's.
async fn read_server(link: &Link, size: usize) -> Res<Duration> {
    let mr = region(link, size, MrAccess::REMOTE_READ)?;
    mr.write_at(0, &negotiate::pattern(size, READ_SEED))
        .ctx("fill RMA region")?;
    negotiate::recv_region(link, 0).await?;
    negotiate::send_region(link, Some(described(&mr))).await?;
    negotiate::recv_elapsed(link).await
}

fn region(link: &Link, size: usize, access: MrAccess) -> Res<MemoryRegion> {
    link.domain
        .mr_alloc(size, access)
        .with_ctx(|| format!("allocate a {size}-byte RMA region"))
}

fn described(mr: &MemoryRegion) -> Region {
    Region {
        addr: mr.addr(),
        key: mr.key(),
        len: mr.len(),
    }
}

/// The first `size` bytes of a region.
fn contents(mr: &MemoryRegion, size: usize) -> Res<Bytes> {
    let mut v = vec![0u8; size];
    mr.read_at(0, &mut v).ctx("read RMA region")?;
    Ok(v.into())
}

/// On MSG, the receive the peer's next write with remote CQ data will
/// complete (it carries no bytes); RDM needs none.
async fn note_slot(link: &Link) -> Res<()> {
    // Only where the offer kept FI_RX_CQ_DATA (verbs MSG); tcp reports
    // remote CQ data without taking a receive.
    if link.ep_type == EpType::Msg && link.ep.info().mode.contains(Mode::RX_CQ_DATA) {
        link.post_recv(vec![BytesMut::new()], NOTE_CTX).await?;
    }
    Ok(())
}

/// The remote CQ data of iteration `i`: its low 32 bits.
fn note_data(i: usize) -> u64 {
    i as u64 & 0xFFFF_FFFF
}

/// Checks the target completion of the peer's write of iteration `i`.
fn check_note(note: &CqEntry, size: usize, i: usize) -> Res<()> {
    let what = "RMA write";
    if note.len != size {
        return Err(Failure::new(
            what,
            format!(
                "iteration {i}: the peer's write reported {} bytes, expected {size}",
                note.len
            ),
        ));
    }
    if note.data != note_data(i) {
        return Err(Failure::new(
            what,
            format!(
                "iteration {i}: the peer's write carried CQ data {:#x}, expected {:#x} \
                 (a write lost or out of order)",
                note.data,
                note_data(i)
            ),
        ));
    }
    Ok(())
}

/// Writes `data` with iteration `i`'s CQ data at the start of `to`, and
/// waits for the write's own completion.
async fn write(
    link: &Link,
    reaper: &mut Reaper,
    api: Api,
    data: Bytes,
    i: usize,
    to: &Region,
) -> Res<()> {
    let cq_data = note_data(i);
    match api {
        Api::Post => {
            let post = || {
                link.ep
                    .post_writedata(link.peer, data.clone(), cq_data, to.addr, to.key, RMA_CTX)
            };
            weft::post_when_room(post).await.ctx("post RMA write")?;
            reaper.wait(RMA_CTX).await?;
        }
        // Pool: refused with --rma; a server given --api pool serves a
        // client's --rma with the awaited calls.
        Api::Async | Api::Pool => {
            let w = link.ep.writedata(link.peer, data, cq_data, to.addr, to.key);
            link.bounded("RMA write", w).await?;
        }
    }
    Ok(())
}

/// Reads `buf.len()` bytes from the start of `from`; the completion holds
/// the buffer.
async fn read(
    link: &Link,
    reaper: &mut Reaper,
    api: Api,
    buf: BytesMut,
    from: &Region,
) -> Res<CqEntry> {
    match api {
        Api::Post => {
            let post = |op| {
                let msg = RmaMsg {
                    dest: link.peer,
                    op,
                    addr: from.addr,
                    key: from.key,
                    context: RMA_CTX,
                };
                link.ep.post_rmamsg(msg, OpFlags::empty())
            };
            weft::post_when_room_with(RmaOp::Read { bufs: vec![buf] }, post)
                .await
                .map_err(|(e, _)| Failure::new("post RMA read", e))?;
            reaper.wait(RMA_CTX).await
        }
        // Pool: refused with --rma; a server given --api pool serves a
        // client's --rma with the awaited calls.
        Api::Async | Api::Pool => {
            let r = link.ep.read(link.peer, buf, from.addr, from.key);
            link.bounded("RMA read", r).await
        }
    }
}
