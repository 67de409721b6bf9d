//! What a new RDM connection costs: the first message between two fresh
//! tcp endpoints (connection set-up included: connect, handshake, and
//! since wire version 2 the identity check) against the second message
//! on the same connection. Loopback, one process.
//!
//! usage: `conn-setup [PAIRS] [--key KEY]` (default 200 pairs, no key)
//!
//! With `--key`, both endpoints hold the authorization key KEY, so the
//! set-up includes the key proof (`docs/wire.md` §8.6).
//!
//! Prints the medians in microseconds and their difference: the set-up.

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use weft::{AvAttr, AvFlags, Domain, EpType, Info, WaitMode, FI_ADDR_UNSPEC};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

type Opened = (weft::Endpoint, weft::AddressVector, weft::CompletionQueue);

/// An endpoint with its AV and the CQ it must have bound (every operation
/// here is awaited, so the CQ stays empty).
fn open(domain: &Domain, info: &Info) -> Res<Opened> {
    let av = domain.av(AvAttr::default())?;
    let (ep, cq) = weft_integration::enabled_endpoint(domain, info, &av, WaitMode::Interrupt);
    Ok((ep, av, cq))
}

/// One tagged message from `a` to `b`, awaited on both sides; microseconds.
async fn one(a: &weft::Endpoint, b: &weft::Endpoint, dest: weft::FiAddr, tag: u64) -> Res<f64> {
    let t0 = Instant::now();
    let recv = b.trecv(BytesMut::zeroed(64), FI_ADDR_UNSPEC, tag, 0);
    let send = a.tsend(dest, Bytes::from_static(&[7u8; 64]), tag);
    let (got, sent) = tokio::join!(recv, send);
    sent.map_err(|e| format!("send: {e:?}"))?;
    got.map_err(|e| format!("recv: {e:?}"))?;
    Ok(t0.elapsed().as_secs_f64() * 1e6)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let mut pairs = 200;
    let mut key = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--key" => key = Some(args.next().ok_or("--key needs a value")?.into_bytes()),
            n => pairs = n.parse()?,
        }
    }
    let mut hints = Info::default();
    hints.ep_attr.ep_type = EpType::Rdm;
    hints.caps = weft::Caps::TAGGED;
    hints.ep_attr.auth_key = key.clone();
    let info = weft::getinfo(Some(&hints))?.remove(0);
    let fabric = weft::Fabric::open(&info)?;
    let domain = fabric.domain(&info)?;
    let (mut first, mut second) = (Vec::new(), Vec::new());
    for i in 0..pairs {
        let (a, av, _acq) = open(&domain, &info)?;
        let (b, _bav, _bcq) = open(&domain, &info)?;
        let dest = av
            .insert(&[b.local_addr()?], AvFlags::empty(), 0)?
            .await
            .fi_addrs[0];
        first.push(one(&a, &b, dest, 2 * i as u64).await?);
        second.push(one(&a, &b, dest, 2 * i as u64 + 1).await?);
    }
    let (f, s) = (median(&mut first), median(&mut second));
    let keyed = if key.is_some() { "keyed" } else { "no key" };
    println!(
        "{pairs} pairs ({keyed}): first message {f:.1} us, second {s:.1} us (medians); set-up ~{:.1} us",
        f - s
    );
    Ok(())
}
