//! The other process of `tests/shm_faults.rs`, killed by the test with
//! SIGKILL at a chosen moment. Each mode waits at most 60 s for that and
//! then exits on its own.
//!
//! - `shm-peer idle`: opens an shm RDM endpoint whose unexpected budget
//!   is 64 KiB, prints its address and receives nothing, so senders'
//!   messages pile up in its rings and their sends wait.
//! - `shm-peer partial ADDR`: opens an shm RDM endpoint, maps the
//!   segment of the endpoint at `ADDR` and claims a channel there under
//!   its endpoint's name, writing what a real claim writes (its pid,
//!   start time and endpoint serial, its name, no key proof, its CMA
//!   probe), publishes the first record of a 1 MiB message and never the
//!   rest, prints `ready` and waits: a sender killed in the middle of a
//!   message, judged dead as a real one is.
//! - `shm-peer send ADDR N SIZE`: opens an shm RDM endpoint, sends one
//!   byte with delivery-complete (so the receiver has seen, and probed,
//!   its channel before the rest), posts `N` sends of `SIZE` bytes (`weft_integration::payload(SIZE, i)` for the
//!   `i`th) to the endpoint at `ADDR`, prints `posted`, then waits for
//!   their completions (at most 60 s), prints `sent` and waits: a sender
//!   in another process, for cross-memory attach (`tests/shm_cma.rs`).
//! - `shm-peer target [SIZE [copy]]`: opens an shm RDM endpoint with a
//!   region of SIZE (4096) bytes under key 42 (`FI_REMOTE_READ |
//!   FI_REMOTE_WRITE`, holding `weft_integration::payload(SIZE, 7)`),
//!   prints its address and waits: an RMA target in another process
//!   (`tests/shm_rma.rs`). With `copy`, cross-memory attach is off in
//!   it (`WEFT_SHM_CMA=0`): its RMA goes through the rings.
//! - `shm-peer named NAME SEED`: `target 4096` under the endpoint name
//!   `NAME`, its region holding `weft_integration::payload(4096, SEED)`:
//!   a target restarted under its name (`tests/shm_restart.rs`).
//! - `shm-peer reader NAME ADDR KEY AT AFTER`: opens an shm RDM endpoint
//!   under the name `NAME`, prints `ready`, waits until process `AFTER`
//!   is gone (0: no wait), reads 4096 bytes at `AT` under `KEY` from the
//!   endpoint at `ADDR` (at most 10 s), prints `read` and the first 8
//!   bytes in hex, or `failed` and why, and waits: an initiator
//!   restarted under its name (`tests/shm_restart.rs`).

use std::io::Write;
use std::sync::atomic::Ordering;
use std::time::Duration;

use weft::{AvAttr, EpType, Info, WaitMode};
use weft_shm::layout::*;
use weft_shm::ring::{Chan, RecHead};
use weft_shm::segment::Segment;

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const LIFE: Duration = Duration::from_secs(60);

/// An enabled shm RDM endpoint with an unexpected budget of 64 KiB, and
/// what it is bound to (kept alive with it).
struct Ep {
    ep: weft::Endpoint,
    av: weft::AddressVector,
    cq: weft::CompletionQueue,
    domain: weft::Domain,
    _fabric: weft::Fabric,
}

impl Ep {
    /// `addr` inserted into the endpoint's AV.
    fn insert(&self, addr: &str) -> Res<weft::FiAddr> {
        Ok(self
            .av
            .insert_sync(&[addr.as_bytes().to_vec()], Default::default())?
            .fi_addrs
            .first()
            .copied()
            .ok_or("insert failed")?)
    }
}

fn open_ep() -> Res<Ep> {
    open_named(None)
}

/// [`open_ep`] under the endpoint name `name`, if given.
fn open_named(name: Option<&str>) -> Res<Ep> {
    let mut hints = Info::default();
    hints.ep_attr.ep_type = EpType::Rdm;
    hints.fabric_attr.prov_name = Some("shm".into());
    let mut info = weft::getinfo(Some(&hints))?.remove(0);
    info.rx_attr.total_buffered_recv = 64 << 10;
    if let Some(n) = name {
        info.src_addr = Some(format!("fi_shm://{n}").into_bytes());
    }
    let fabric = weft::Fabric::open(&info)?;
    let domain = fabric.domain(&info)?;
    let av = domain.av(AvAttr::default())?;
    let (ep, cq) = weft_integration::enabled_endpoint(&domain, &info, &av, WaitMode::Interrupt);
    Ok(Ep {
        ep,
        av,
        cq,
        domain,
        _fabric: fabric,
    })
}

fn say(what: &str) -> Res<()> {
    let mut out = std::io::stdout();
    writeln!(out, "{what}")?;
    out.flush()?;
    Ok(())
}

fn idle() -> Res<()> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let e = open_ep()?;
        say(&String::from_utf8_lossy(&e.ep.local_addr()?))?;
        tokio::time::sleep(LIFE).await;
        Ok(())
    })
}

fn target(size: usize, name: Option<&str>, seed: u8) -> Res<()> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let e = open_named(name)?;
        let rw = weft::MrAccess::REMOTE_READ | weft::MrAccess::REMOTE_WRITE;
        let mr = e
            .domain
            .mr_regattr(weft::MrAttr::alloc(size, rw).requested_key(42))
            .map_err(|r| format!("register: {:?}", r.error))?;
        mr.write_at(0, &weft_integration::payload(size, seed))?;
        say(&String::from_utf8_lossy(&e.ep.local_addr()?))?;
        tokio::time::sleep(LIFE).await;
        drop(mr);
        Ok(())
    })
}

fn reader(name: &str, addr: &str, key: u64, at: u64, after: u32) -> Res<()> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let e = open_named(Some(name))?;
        say("ready")?;
        let gone = std::path::PathBuf::from(format!("/proc/{after}"));
        let until = std::time::Instant::now() + LIFE;
        while after != 0 && gone.exists() && std::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let to = e.insert(addr)?;
        let read = e.ep.read(to, bytes::BytesMut::zeroed(4096), at, key);
        match tokio::time::timeout(Duration::from_secs(10), read).await {
            Ok(Ok(c)) => {
                let b = c.into_bytes();
                let hex: String = b.iter().take(8).map(|x| format!("{x:02x}")).collect();
                say(&format!("read {hex}"))?;
            }
            Ok(Err(c)) => say(&format!("failed {:?}", c.err))?,
            Err(_) => say("failed: no answer in 10 s")?,
        }
        tokio::time::sleep(LIFE).await;
        Ok(())
    })
}

fn send(addr: &str, n: u64, size: usize) -> Res<()> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let e = open_ep()?;
        let to = e.insert(addr)?;
        let warm = weft::SendMsg {
            dest: to,
            iov: vec![bytes::Bytes::from_static(b"w")],
            tag: None,
            data: None,
            context: 0,
        };
        e.ep.sendmsg(warm, weft::OpFlags::DELIVERY_COMPLETE)
            .await
            .map_err(|c| format!("warm-up failed: {:?}", c.err))?;
        for i in 0..n {
            e.ep.post_send(to, weft_integration::payload(size, i as u8), i)?;
        }
        say("posted")?;
        for _ in 0..n {
            e.cq.next_timeout(LIFE)
                .await
                .ok_or("no completion")?
                .map_err(|c| format!("send failed: {:?}", c.err))?;
        }
        say("sent")?;
        tokio::time::sleep(LIFE).await;
        Ok(())
    })
}

fn partial(addr: &str) -> Res<()> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        // An endpoint of ours, as a real sender has: its name and serial
        // are what the claim names, and its segment, locked while we
        // run, is what the owner's judgement of a claimer whose pid says
        // nothing looks at (`live::held_by`).
        let e = open_ep()?;
        partial_claim(addr, &e)?;
        say("ready")?;
        tokio::time::sleep(LIFE).await;
        Ok(())
    })
}

/// Claims a channel of the endpoint at `addr` for our endpoint `e`,
/// writing what `Peer::claim` writes for an unkeyed sender, in its
/// order, and publishes the first record of a 1 MiB message.
fn partial_claim(addr: &str, e: &Ep) -> Res<()> {
    use Ordering::{Acquire, Release};
    let name = addr.strip_prefix("fi_shm://").ok_or("not an shm address")?;
    let local = String::from_utf8(e.ep.local_addr()?)?;
    let me = local
        .strip_prefix("fi_shm://")
        .ok_or("not an shm address")?;
    // Our endpoint's serial, as its segment's header holds it (what a
    // real claim writes at `C_SERIAL`).
    let own = Segment::open(&weft_shm::name::seg_name(me), HEADER, 1 << 31)?;
    let serial = own.load64(H_SERIAL, Acquire).ok_or("no serial")?;
    let seg = Segment::open(&weft_shm::name::seg_name(name), HEADER, 1 << 31)?;
    let g = Geometry::check(
        seg.load32(H_CHANNELS, Acquire).unwrap_or(0),
        seg.load32(H_RING, Acquire).unwrap_or(0),
    )
    .ok_or("bad geometry")?;
    if seg.load32(H_KEYED, Acquire) != Some(0) {
        return Err("a partial claim needs an unkeyed owner".into());
    }
    let (pid, start) = weft_shm::live::me();
    let (c, gen) = (0..g.channels)
        .map(|i| Chan { g, i })
        .find_map(|c| Some((c, c.begin_claim(&seg, pid)?)))
        .ok_or("no free channel")?;
    let freed = || -> Res<()> { Err("the claim was freed".into()) };
    seg.store32(c.ctl(C_PID), pid, Release);
    seg.store64(c.ctl(C_START), start, Release);
    seg.store64(c.ctl(C_SERIAL), serial, Release);
    // As `Peer::claim`: each group of writes only while the claim holds.
    if !c.still_claiming(&seg, pid, gen) {
        return freed();
    }
    seg.store32(c.ctl(C_NAME_LEN), me.len() as u32, Release);
    seg.write(c.ctl(C_NAME), me.as_bytes());
    if !c.still_claiming(&seg, pid, gen) {
        return freed();
    }
    c.clear_start(&seg);
    if !c.still_claiming(&seg, pid, gen) {
        return freed();
    }
    // No key: the proof says it proves none (`keyproof::Prepared::write`).
    seg.store32(c.ctl(C_PROVES), 0, Release);
    if !c.still_claiming(&seg, pid, gen) {
        return freed();
    }
    // An unkeyed owner gives no verdict to wait for (`tx_wait` 0); a
    // keyed one would, and a real sender publishes nothing before it.
    seg.store32(c.ctl(C_TX_WAIT), 0, Release);
    let probe = match weft_shm::cma::mode() {
        weft_shm::cma::Mode::Denied => 0,
        _ => weft_shm::cma::probe_addr(),
    };
    seg.store64(c.ctl(C_CMA_PROBE), probe, Release);
    if !c.move_state(&seg, gen, claiming(pid), ACTIVE) {
        return freed();
    }
    let h = RecHead {
        word: K_FIRST | F_TAGGED,
        len: 4096,
        tag: 7,
        data: 0,
        total: 1 << 20,
    };
    let (at, _) = c.write_head(&seg, 0, &h);
    seg.write(at, &[0xAB; 4096]);
    c.publish(&seg, 0, h.word);
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["idle"] => idle(),
        ["partial", addr] => partial(addr),
        ["send", addr, n, size] => send(addr, n.parse()?, size.parse()?),
        ["target"] => target(4096, None, 7),
        ["target", size] => target(size.parse()?, None, 7),
        ["target", size, "copy"] => {
            // Before anything reads it (the mode is found once).
            std::env::set_var("WEFT_SHM_CMA", "0");
            target(size.parse()?, None, 7)
        }
        ["named", name, seed] => target(4096, Some(name), seed.parse()?),
        ["reader", name, addr, key, at, after] => {
            reader(name, addr, key.parse()?, at.parse()?, after.parse()?)
        }
        _ => Err(
            "usage: shm-peer idle | partial ADDR | send ADDR N SIZE | target [SIZE [copy]] \
             | named NAME SEED | reader NAME ADDR KEY AT AFTER"
                .into(),
        ),
    }
}
