//! The attack classes. Each opens its own victim, measures the baseline,
//! attacks, asserts the bound while the attack holds and after the
//! attackers are gone, and reports the figures.

use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use weft::Error;
use weft_core::wire::{FrameKind, Header};

use super::raw::{self, closed_within, handshaken, tagged_header, trickle};
use super::{
    check, new_client_connects, victim_limits, HeapProbe, Outcome, Report, Scale, Usage, Victim,
    BUDGET, PEER_SHARE, REQ_TAG, STRAY_TAG,
};

/// Every class, in the order the long form runs them.
pub const CLASSES: &[&str] = &[
    "garbage",
    "absurd_lengths",
    "slowloris_handshake",
    "slowloris_frames",
    "idle_flood",
    "zero_length_flood",
    "tiny_flood",
    "huge_unexpected",
    "ghost_announcements",
    "stalled_payload",
    "parked_storm",
    "churn",
    "kill9",
];

/// Heap the process may hold beyond its baseline once an attack is over.
const HEAP_SLACK: usize = 1 << 20;
/// Descriptors likewise.
const FD_SLACK: usize = 2;
/// How long reaping may take after the attackers leave (the victim's
/// timeouts are well under a second).
const REAP: Duration = Duration::from_secs(10);

/// Runs one class.
pub async fn run(class: &str, scale: &Scale, heap: HeapProbe) -> Outcome {
    match class {
        "garbage" => garbage(scale, heap).await,
        "absurd_lengths" => absurd_lengths(heap).await,
        "slowloris_handshake" => slowloris_handshake(scale, heap).await,
        "slowloris_frames" => slowloris_frames(scale, heap).await,
        "idle_flood" => idle_flood(scale, heap).await,
        "zero_length_flood" => unexpected_flood(scale, heap, 0, 1).await,
        "tiny_flood" => unexpected_flood(scale, heap, 1, 12).await,
        "huge_unexpected" => huge_unexpected(heap).await,
        "ghost_announcements" => ghosts(scale, heap).await,
        "stalled_payload" => stalled_payload(heap).await,
        "parked_storm" => parked_storm(scale, heap).await,
        "churn" => churn(scale, heap).await,
        "kill9" => kill9(scale, heap).await,
        other => Err(format!("no attack class {other}")),
    }
}

/// The victim is back where it started: its connections reaped, nothing
/// buffered for peers, descriptors and heap at the baseline, and its
/// client served.
async fn back_to_baseline(
    v: &Victim,
    base: Usage,
    base_conns: usize,
    r: &mut Report,
) -> Result<(), String> {
    let took = v.settled(base_conns, REAP).await?;
    let left = v.discard_leftovers().await;
    let s = v.stats();
    check(s.unexpected_bytes == 0, || {
        format!(
            "{} bytes still charged after discarding {left}",
            s.unexpected_bytes
        )
    })?;
    let after = settle_usage(v, base).await;
    r.line(format!("reaped in {took:.2?}; leftovers discarded: {left}"));
    r.line(format!("before: {base}"));
    r.line(format!("after:  {after}"));
    check(after.fds <= base.fds + FD_SLACK, || {
        format!("descriptors {} -> {}", base.fds, after.fds)
    })?;
    check(after.heap <= base.heap + HEAP_SLACK, || {
        format!("heap {} -> {} bytes", base.heap, after.heap)
    })?;
    v.client.request().await?;
    Ok(())
}

/// Usage once closing sockets and finishing tasks have let go (bounded).
async fn settle_usage(v: &Victim, base: Usage) -> Usage {
    let mut u = v.usage();
    for _ in 0..50 {
        if u.fds <= base.fds + FD_SLACK && u.heap <= base.heap + HEAP_SLACK {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        u = v.usage();
    }
    u
}

async fn open(max_conns: usize, heap: HeapProbe) -> (Victim, Usage, usize) {
    let v = Victim::open(victim_limits(max_conns), heap).await;
    let base = v.usage();
    let conns = v.stats().conns;
    (v, base, conns)
}

/// The longest time any of `tasks` took to see its connection closed;
/// `what` if one never saw it.
async fn slowest(
    tasks: Vec<tokio::task::JoinHandle<Option<Duration>>>,
    what: &str,
) -> Result<Duration, String> {
    let mut worst = Duration::ZERO;
    for t in tasks {
        let e = t.await.ok().flatten().ok_or_else(|| what.to_string())?;
        worst = worst.max(e);
    }
    Ok(worst)
}

/// Random-looking bytes from a small generator (no dependency, repeatable).
fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Garbage before and after the handshake: every such connection is
/// closed, nothing else notices.
async fn garbage(scale: &Scale, heap: HeapProbe) -> Outcome {
    let (v, base, conns) = open(4096, heap).await;
    let mut r = Report::default();
    let mut tasks = Vec::new();
    for i in 0..scale.swarm {
        let addr = v.addr;
        tasks.push(tokio::spawn(async move {
            let s = if i % 2 == 0 {
                raw::connect(addr).await.ok()
            } else {
                handshaken(addr).await.ok().flatten().map(TcpStream::from)
            };
            let Some(mut s) = s else { return false };
            let _ = s.write_all(&noise(i as u64, 64)).await;
            closed_within(&mut s, Duration::from_secs(3)).await
        }));
    }
    let mut closed = 0;
    for t in tasks {
        closed += usize::from(t.await.unwrap_or(false));
    }
    r.line(format!(
        "{closed} of {} garbage connections closed by the victim",
        scale.swarm
    ));
    check(closed == scale.swarm, || {
        format!("only {closed} of {} closed", scale.swarm)
    })?;
    back_to_baseline(&v, base, conns, &mut r).await?;
    Ok(r)
}

/// Lengths no frame may have: closed at the header.
async fn absurd_lengths(heap: HeapProbe) -> Outcome {
    let (v, base, conns) = open(4096, heap).await;
    let mut r = Report::default();
    for len in [u64::MAX, (1u64 << 30) + 1, 1 << 62] {
        let mut s = handshaken(v.addr)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("refused")?;
        s.write_all(&tagged_header(REQ_TAG, len, 1))
            .await
            .map_err(|e| e.to_string())?;
        check(closed_within(&mut s, Duration::from_secs(2)).await, || {
            format!("a header announcing {len} bytes was not refused")
        })?;
        r.line(format!("header announcing {len} bytes: connection closed"));
    }
    // A handshake frame announcing 1 TiB of address.
    let mut s = raw::connect(v.addr).await.map_err(|e| e.to_string())?;
    let mut h = Header::new(FrameKind::Hello);
    h.len = 1 << 40;
    s.write_all(&h.encode()).await.map_err(|e| e.to_string())?;
    check(closed_within(&mut s, Duration::from_secs(2)).await, || {
        "a Hello announcing 1 TiB was not refused".to_string()
    })?;
    r.line("Hello announcing 1 TiB: connection closed");
    back_to_baseline(&v, base, conns, &mut r).await?;
    Ok(r)
}

/// Handshakes sent a byte at a time: each dies at the handshake timeout,
/// and the client is served meanwhile.
async fn slowloris_handshake(scale: &Scale, heap: HeapProbe) -> Outcome {
    let (v, base, conns) = open(4096, heap).await;
    let mut r = Report::default();
    let mut tasks = Vec::new();
    for _ in 0..scale.swarm {
        let addr = v.addr;
        tasks.push(tokio::spawn(async move {
            let Ok(mut s) = raw::connect(addr).await else {
                return None;
            };
            let t0 = Instant::now();
            let hello = Header::new(FrameKind::Hello).encode();
            trickle(&mut s, &hello, Duration::from_millis(50)).await;
            closed_within(&mut s, Duration::from_secs(3))
                .await
                .then(|| t0.elapsed())
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let during = v.client.request().await?;
    let worst = slowest(tasks, "a slow handshake was never closed").await?;
    r.line(format!(
        "{} slow handshakes, each closed; slowest after {worst:.2?}",
        scale.swarm
    ));
    r.line(format!("client request during the attack: {during:.2?}"));
    back_to_baseline(&v, base, conns, &mut r).await?;
    Ok(r)
}

/// Headers and payloads trickled after the handshake: closed by the stall
/// rule, reported with the peer's address, and what they had buffered is
/// given back.
async fn slowloris_frames(scale: &Scale, heap: HeapProbe) -> Outcome {
    let (v, base, conns) = open(4096, heap).await;
    let mut r = Report::default();
    let mut tasks = Vec::new();
    for i in 0..scale.swarm {
        let addr = v.addr;
        tasks.push(tokio::spawn(async move {
            let mut s = handshaken(addr).await.ok().flatten()?;
            let t0 = Instant::now();
            if i % 2 == 0 {
                trickle(
                    &mut s,
                    &tagged_header(STRAY_TAG, 8, 1),
                    Duration::from_millis(50),
                )
                .await;
            } else {
                s.write_all(&tagged_header(STRAY_TAG, 64 << 10, 1))
                    .await
                    .ok()?;
                trickle(&mut s, &[7u8; 200], Duration::from_millis(50)).await;
            }
            closed_within(&mut s, Duration::from_secs(3))
                .await
                .then(|| t0.elapsed())
        }));
    }
    let worst = slowest(tasks, "a trickling peer was never closed").await?;
    let timed_out = v
        .refusals()
        .into_iter()
        .filter(|(e, p)| *e == Error::TimedOut && p.is_some())
        .count();
    r.line(format!(
        "{} trickling peers closed; slowest after {worst:.2?}",
        scale.swarm
    ));
    r.line(format!("EQ: {timed_out} TimedOut reports naming the peer"));
    check(timed_out == scale.swarm, || {
        format!("{timed_out} of {} stalls reported", scale.swarm)
    })?;
    v.settled(conns, REAP).await?;
    let held = v.stats().unexpected_bytes;
    check(held == 0, || {
        format!("{held} bytes of dead messages still charged")
    })?;
    back_to_baseline(&v, base, conns, &mut r).await?;
    Ok(r)
}

/// Handshaken peers that never send: the connection limit refuses the
/// excess (reported), the idle timeout reaps the rest, and a new client
/// gets in afterwards.
async fn idle_flood(scale: &Scale, heap: HeapProbe) -> Outcome {
    let (v, base, conns) = open(scale.idle_limit, heap).await;
    let mut r = Report::default();
    let mut held: Vec<raw::Handshaken> = Vec::new();
    let mut refused = 0;
    let mut peak = 0;
    for chunk in 0..scale.idle.div_ceil(64) {
        let n = 64.min(scale.idle - chunk * 64);
        let mut tasks = Vec::new();
        for _ in 0..n {
            tasks.push(tokio::spawn(handshaken(v.addr)));
        }
        for t in tasks {
            match t.await {
                Ok(Ok(Some(s))) => held.push(s),
                _ => refused += 1,
            }
        }
        peak = peak.max(v.stats().conns);
    }
    r.line(format!(
        "{} idle peers: {} held, {refused} refused at the limit of {}; peak {peak} connections",
        scale.idle,
        held.len(),
        scale.idle_limit
    ));
    check(peak <= scale.idle_limit, || {
        format!("{peak} connections past the limit")
    })?;
    check(refused > 0, || "nothing was refused".to_string())?;
    let reports = v
        .refusals()
        .into_iter()
        .filter(|(e, p)| *e == Error::ConnRefused && p.is_some())
        .count();
    r.line(format!("EQ: {reports} ConnRefused reports naming the peer"));
    check(reports > 0, || "no refusal was reported".to_string())?;
    let during = v.client.request().await?;
    r.line(format!("known client during the flood: {during:.2?}"));
    let took = v.settled(conns, REAP).await?;
    r.line(format!("idle peers reaped {took:.2?} after the flood"));
    drop(held);
    new_client_connects(&v).await?;
    r.line("a new client connects after the flood");
    back_to_baseline(&v, base, conns, &mut r).await?;
    Ok(r)
}

/// Unexpected messages of `len` bytes from `peers` attackers as fast as
/// they go: what the endpoint buffers stays within one peer's share each
/// and the budget in all, and the client is served throughout.
async fn unexpected_flood(scale: &Scale, heap: HeapProbe, len: usize, peers: usize) -> Outcome {
    let (v, base, conns) = open(4096, heap).await;
    let mut r = Report::default();
    let per_peer = scale.tiny / peers;
    let mut tasks = Vec::new();
    for p in 0..peers {
        let addr = v.addr;
        tasks.push(tokio::spawn(async move {
            let mut s = handshaken(addr).await.ok().flatten()?;
            let mut frame = Vec::with_capacity(per_peer * (40 + len));
            for i in 0..per_peer {
                frame.extend_from_slice(&tagged_header(STRAY_TAG, len as u64, i as u64));
                frame.extend(std::iter::repeat_n(p as u8, len));
            }
            // The victim stops reading once the share is spent: the write
            // is bounded in time, not expected to finish.
            let _ = tokio::time::timeout(Duration::from_secs(3), s.write_all(&frame)).await;
            Some(s)
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let during = v.client.request().await?;
    let mut socks = Vec::new();
    for t in tasks {
        socks.extend(t.await.ok().flatten());
    }
    let s = v.stats();
    let u = v.usage();
    let cap = (PEER_SHARE * peers).min(BUDGET);
    r.line(format!(
        "{peers} peer(s) x {per_peer} messages of {len} B: {} B buffered (cap {cap}), {} parked",
        s.unexpected_bytes, s.parked
    ));
    r.line(format!("during: {u}; client request {during:.2?}"));
    let msgs = s.unexpected_bytes / (weft::UNEXPECTED_OVERHEAD + len);
    if let Some(each) = u.heap.saturating_sub(base.heap).checked_div(msgs) {
        r.line(format!(
            "heap per buffered message: {each} B (charged {} B)",
            weft::UNEXPECTED_OVERHEAD + len
        ));
    }
    check(s.unexpected_bytes <= cap, || {
        format!("{} B buffered past the cap of {cap}", s.unexpected_bytes)
    })?;
    let held = u.heap.saturating_sub(base.heap);
    check(held <= cap + HEAP_SLACK + peers * 128 * 1024, || {
        format!("heap grew by {held} B during the flood")
    })?;
    socks.into_iter().for_each(raw::reset);
    back_to_baseline(&v, base, conns, &mut r).await?;
    Ok(r)
}

/// Messages announced larger than a peer's share: nothing is buffered for
/// them and no memory is reserved, however large the announcement.
async fn huge_unexpected(heap: HeapProbe) -> Outcome {
    let (v, base, conns) = open(4096, heap).await;
    let mut r = Report::default();
    let mut socks = Vec::new();
    for (i, len) in [512u64 << 20, (1 << 30) - 1, 64 << 20]
        .into_iter()
        .enumerate()
    {
        let mut s = handshaken(v.addr)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("refused")?;
        s.write_all(&tagged_header(STRAY_TAG, len, 1))
            .await
            .map_err(|e| e.to_string())?;
        let _ = s.write_all(&vec![i as u8; 1 << 20]).await;
        socks.push(s);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let s = v.stats();
    let u = v.usage();
    r.line(format!(
        "3 announcements of 64 MiB..1 GiB: {} B buffered, {} parked; {u}",
        s.unexpected_bytes, s.parked
    ));
    check(s.unexpected_bytes == 0, || {
        format!("{} B buffered", s.unexpected_bytes)
    })?;
    check(u.heap <= base.heap + HEAP_SLACK, || {
        format!("heap {} -> {}", base.heap, u.heap)
    })?;
    v.client.request().await?;
    socks.into_iter().for_each(raw::reset);
    back_to_baseline(&v, base, conns, &mut r).await?;
    Ok(r)
}

/// A header, a few bytes, then gone: the budget comes back at once.
async fn ghosts(scale: &Scale, heap: HeapProbe) -> Outcome {
    let (v, base, conns) = open(4096, heap).await;
    let mut r = Report::default();
    let n = scale.swarm;
    for i in 0..n {
        let mut s = handshaken(v.addr)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("refused")?;
        let len = if i % 2 == 0 { 400 << 10 } else { 1 << 30 };
        s.write_all(&tagged_header(STRAY_TAG, len, 1))
            .await
            .map_err(|e| e.to_string())?;
        let _ = s.write_all(b"0123456789").await;
    }
    let t0 = Instant::now();
    loop {
        let s = v.stats();
        if s.unexpected_bytes == 0 && s.conns <= conns {
            break;
        }
        check(t0.elapsed() < Duration::from_secs(5), || {
            format!("ghosts still held after 5 s: {s:?}")
        })?;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    r.line(format!(
        "{n} ghost announcements (400 KiB and 1 GiB): budget back to 0 in {:.2?}",
        t0.elapsed()
    ));
    back_to_baseline(&v, base, conns, &mut r).await?;
    Ok(r)
}

/// A header that matches the service's only posted receive, then
/// nothing: the stall timeout closes that peer and the receive goes back
/// (not failed) for the client's request.
async fn stalled_payload(heap: HeapProbe) -> Outcome {
    let (v, base, conns) = open(4096, heap).await;
    let mut r = Report::default();
    let mut s = handshaken(v.addr)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("refused")?;
    let attacker = s.local_addr().map_err(|e| e.to_string())?;
    s.write_all(&tagged_header(REQ_TAG, 1000, 1))
        .await
        .map_err(|e| e.to_string())?;
    s.write_all(b"0123456789")
        .await
        .map_err(|e| e.to_string())?;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let held_for = v.client.request().await?;
    r.line(format!(
        "client request behind a stalled sender: {held_for:.2?} (stall timeout 300 ms)"
    ));
    check(held_for < Duration::from_secs(2), || {
        format!("held for {held_for:?}")
    })?;
    let reported = v
        .refusals()
        .into_iter()
        .any(|(e, p)| e == Error::TimedOut && p == Some(attacker));
    check(reported, || {
        "the stall was not reported with the peer's address".to_string()
    })?;
    let failed = v.failed.load(std::sync::atomic::Ordering::Relaxed);
    check(failed == 0, || format!("{failed} service receives failed"))?;
    r.line("EQ: TimedOut naming the stalled peer; no service receive failed");
    drop(s);
    back_to_baseline(&v, base, conns, &mut r).await?;
    Ok(r)
}

/// Thousands of parked connections beside a service that posts a receive
/// per request: requests cost no more than 1.5x as long (a bound of the
/// long form; the short one reports the ratio).
async fn parked_storm(scale: &Scale, heap: HeapProbe) -> Outcome {
    let (v, base, conns) = open(scale.parked + 64, heap).await;
    let mut r = Report::default();
    let quiet = v.client.median_latency(scale.rounds).await?;
    let mut socks = Vec::new();
    for chunk in 0..scale.parked.div_ceil(64) {
        let n = 64.min(scale.parked - chunk * 64);
        let mut tasks = Vec::new();
        for _ in 0..n {
            let addr = v.addr;
            tasks.push(tokio::spawn(async move {
                let mut s = handshaken(addr)
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or("refused")?;
                // Larger than a peer's share: parks at the header.
                s.write_all(&tagged_header(STRAY_TAG, 2 << 20, 1))
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(s)
            }));
        }
        for t in tasks {
            let s = t.await.map_err(|e| e.to_string())?;
            socks.push(s.map_err(|e| format!("a parking peer failed: {e}"))?);
        }
    }
    let t0 = Instant::now();
    while v.stats().parked < scale.parked {
        check(t0.elapsed() < Duration::from_secs(10), || {
            format!("only {} of {} parked", v.stats().parked, scale.parked)
        })?;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let u = v.usage();
    let mut stormy = v.client.median_latency(scale.rounds).await?;
    let mut ratio = stormy.as_secs_f64() / quiet.as_secs_f64();
    if ratio > 1.5 {
        // One more sample of each, back to back, before calling it.
        let q2 = v.client.median_latency(scale.rounds).await?;
        stormy = stormy.min(q2);
        ratio = stormy.as_secs_f64() / quiet.as_secs_f64();
    }
    let per_conn = u.heap.saturating_sub(base.heap) / scale.parked.max(1);
    r.line(format!(
        "{} parked: median request {stormy:.2?} vs {quiet:.2?} without (ratio {ratio:.2}, bound 1.5)",
        scale.parked
    ));
    r.line(format!(
        "while parked: {u}; about {per_conn} B of heap per parked connection"
    ));
    if scale.timing_bounds {
        check(ratio <= 1.5, || format!("ratio {ratio:.2}"))?;
    }
    socks.into_iter().for_each(raw::reset);
    back_to_baseline(&v, base, conns, &mut r).await?;
    Ok(r)
}

/// Connect/close cycles, half of them after the handshake.
async fn churn(scale: &Scale, heap: HeapProbe) -> Outcome {
    let (v, base, conns) = open(4096, heap).await;
    let base_peers = v.stats().peers;
    let mut r = Report::default();
    let workers = 16;
    let mut tasks = Vec::new();
    for w in 0..workers {
        let addr = v.addr;
        let n = scale.churn / workers;
        tasks.push(tokio::spawn(async move {
            for i in 0..n {
                if (i + w) % 2 == 0 {
                    let _ = handshaken(addr).await;
                } else {
                    let _ = raw::connect(addr).await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())?;
    }
    r.line(format!("{} connect/close cycles", scale.churn));
    back_to_baseline(&v, base, conns, &mut r).await?;
    let peers = v.stats().peers;
    r.line(format!("peer entries: {base_peers} -> {peers}"));
    check(peers <= base_peers, || {
        format!("peer entries {base_peers} -> {peers}")
    })?;
    Ok(r)
}

/// A peer process killed with SIGKILL in the middle of a large message
/// that matched the service's receive: the receive goes back, nothing
/// fails, nothing is held.
async fn kill9(scale: &Scale, heap: HeapProbe) -> Outcome {
    let Some(exe) = &scale.peer_exe else {
        return Err("no peer executable to kill".into());
    };
    let (v, base, conns) = open(4096, heap).await;
    let mut r = Report::default();
    let mut child = std::process::Command::new(exe)
        .arg("peer")
        .arg(v.addr.to_string())
        .spawn()
        .map_err(|e| format!("spawning {}: {e}", exe.display()))?;
    let t0 = Instant::now();
    while v.stats().conns <= conns {
        if t0.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            return Err("the peer never connected".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // `kill` is SIGKILL: the peer gets no chance to close cleanly.
    child.kill().map_err(|e| e.to_string())?;
    let _ = child.wait();
    r.line("peer killed with SIGKILL mid-message");
    back_to_baseline(&v, base, conns, &mut r).await?;
    let failed = v.failed.load(std::sync::atomic::Ordering::Relaxed);
    check(failed == 0, || format!("{failed} service receives failed"))?;
    r.line("no service receive failed; the client is served");
    Ok(r)
}

/// The killed peer's side (`hostile-campaign peer ADDR`): a request header
/// announcing 64 MiB, then payload at a steady pace until killed (or for
/// at most a minute).
pub async fn peer(addr: std::net::SocketAddr) -> std::io::Result<()> {
    let mut s = handshaken(addr)
        .await?
        .ok_or_else(|| std::io::Error::other("refused"))?;
    s.write_all(&tagged_header(REQ_TAG, 64 << 20, 1)).await?;
    let chunk = vec![0x5a; 64 << 10];
    let end = Instant::now() + Duration::from_secs(60);
    while Instant::now() < end {
        s.write_all(&chunk).await?;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}
