//! What a tcp atomic round trip costs next to a message round trip: an
//! 8-byte fetch-add (`fi_fetch_atomic`, `FI_SUM` on one `UINT64`,
//! answered by the target's reader) against a 64-byte send answered by
//! a 64-byte send (ping-pong), between two RDM endpoints on loopback in
//! one process, alternated in rounds so load changes hit both alike.
//!
//! usage: `atomic-rtt [ITERS]` (default 20000 per kind)
//!
//! Prints the median and 99th percentile of each in microseconds.

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use weft::{AvAttr, AvFlags, Caps, Domain, EpType, Info, MrAccess, MrAttr, WaitMode};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

type Opened = (weft::Endpoint, weft::AddressVector, weft::CompletionQueue);

fn open(domain: &Domain, info: &Info) -> Res<Opened> {
    let av = domain.av(AvAttr::default())?;
    let (ep, cq) = weft_integration::enabled_endpoint(domain, info, &av, WaitMode::Interrupt);
    Ok((ep, av, cq))
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v.get(i).copied().unwrap_or(f64::NAN)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let iters: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(20_000);
    let mut hints = Info::default();
    hints.ep_attr.ep_type = EpType::Rdm;
    hints.caps = Caps::MSG | Caps::ATOMIC;
    hints.fabric_attr.prov_name = Some("tcp".into());
    let info = weft::getinfo(Some(&hints))?.remove(0);
    let fabric = weft::Fabric::open(&info)?;
    let domain = fabric.domain(&info)?;
    let (a, av_a, _cqa) = open(&domain, &info)?;
    let (b, av_b, _cqb) = open(&domain, &info)?;
    let to_b = av_a
        .insert(&[b.local_addr()?], AvFlags::empty(), 0)?
        .await
        .fi_addrs[0];
    let to_a = av_b
        .insert(&[a.local_addr()?], AvFlags::empty(), 0)?
        .await
        .fi_addrs[0];
    let mr = domain.mr_regattr(
        MrAttr::alloc(64, MrAccess::REMOTE_READ | MrAccess::REMOTE_WRITE).requested_key(1),
    )?;
    let msg = Bytes::from_static(&[7u8; 64]);
    let send_rtt = || async {
        let t0 = Instant::now();
        let (got_b, sent_a) = tokio::join!(b.recv(BytesMut::zeroed(64)), a.send(to_b, msg.clone()));
        sent_a.map_err(|e| format!("send: {:?}", e.err))?;
        got_b.map_err(|e| format!("recv: {:?}", e.err))?;
        let (got_a, sent_b) = tokio::join!(a.recv(BytesMut::zeroed(64)), b.send(to_a, msg.clone()));
        sent_b.map_err(|e| format!("send back: {:?}", e.err))?;
        got_a.map_err(|e| format!("recv back: {:?}", e.err))?;
        Ok::<f64, Box<dyn std::error::Error + Send + Sync>>(t0.elapsed().as_secs_f64() * 1e6)
    };
    let atomic_rtt = || async {
        let t0 = Instant::now();
        a.fetch_add(to_b, mr.addr(), mr.key(), 1)
            .await
            .map_err(|e| format!("fetch_add: {:?}", e.err))?;
        Ok::<f64, Box<dyn std::error::Error + Send + Sync>>(t0.elapsed().as_secs_f64() * 1e6)
    };
    // Warm-up: connection set-up and allocator.
    for _ in 0..1000 {
        send_rtt().await?;
        atomic_rtt().await?;
    }
    let (mut sends, mut atomics) = (Vec::with_capacity(iters), Vec::with_capacity(iters));
    let round = 1000.min(iters.max(1));
    while sends.len() < iters {
        for _ in 0..round {
            sends.push(send_rtt().await?);
        }
        for _ in 0..round {
            atomics.push(atomic_rtt().await?);
        }
    }
    let mut count = [0u8; 8];
    mr.read_at(0, &mut count)?;
    println!(
        "{} round trips each: 64 B send/send median {:.1} us p99 {:.1} us; \
         8 B fetch-add median {:.1} us p99 {:.1} us (counter {})",
        sends.len(),
        percentile(&mut sends, 0.5),
        percentile(&mut sends, 0.99),
        percentile(&mut atomics, 0.5),
        percentile(&mut atomics, 0.99),
        u64::from_ne_bytes(count),
    );
    Ok(())
}
