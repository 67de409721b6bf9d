//! What a new RDM connection costs: the first message between two fresh
//! tcp endpoints (connection set-up included: connect, handshake, and
//! since wire version 2 the identity check) against the second message
//! on the same connection. Loopback, one process.
//!
//! usage: `conn-setup [PAIRS] [--key KEY] [--av-keys N]` (default 200
//! pairs, no key)
//!
//! With `--key`, both endpoints hold the authorization key KEY, so the
//! set-up includes the key proof (`docs/wire.md` §8.6). With `--av-keys N`
//! as well, the accepting endpoint is on an `FI_AV_AUTH_KEY` domain whose
//! AV holds N keys, KEY last: the worst case of its selector search.
//!
//! Prints the medians in microseconds and their difference: the set-up.

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use weft::{AvAttr, AvFlags, Domain, EpType, Info, WaitMode, FI_ADDR_UNSPEC};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

type Opened = (weft::Endpoint, weft::AddressVector, weft::CompletionQueue);

/// An endpoint with its AV and the CQ it must have bound (every operation
/// here is awaited, so the CQ stays empty).
fn open(domain: &Domain, info: &Info, keys: &[Vec<u8>]) -> Res<Opened> {
    let av = domain.av(AvAttr::default())?;
    for k in keys {
        av.insert_auth_key(k)?;
    }
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
    let mut av_keys = 0usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--key" => key = Some(args.next().ok_or("--key needs a value")?.into_bytes()),
            "--av-keys" => av_keys = args.next().ok_or("--av-keys needs a count")?.parse()?,
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
    // The acceptor: the same domain, or one whose AV holds its keys.
    let (b_domain, b_info, b_keys) = match (&key, av_keys) {
        (Some(k), n) if n > 0 => {
            let mut h = hints.clone();
            h.ep_attr.auth_key = None;
            h.domain_attr.av_auth_key = true;
            let i = weft::getinfo(Some(&h))?.remove(0);
            let mut keys: Vec<Vec<u8>> =
                (1..n).map(|d| format!("decoy {d}").into_bytes()).collect();
            keys.push(k.clone());
            (fabric.domain(&i)?, i, keys)
        }
        (None, n) if n > 0 => return Err("--av-keys needs --key".into()),
        _ => (domain.clone(), info.clone(), Vec::new()),
    };
    let (mut first, mut second) = (Vec::new(), Vec::new());
    for i in 0..pairs {
        let (a, av, _acq) = open(&domain, &info, &[])?;
        let (b, _bav, _bcq) = open(&b_domain, &b_info, &b_keys)?;
        let dest = av
            .insert(&[b.local_addr()?], AvFlags::empty(), 0)?
            .await
            .fi_addrs[0];
        first.push(one(&a, &b, dest, 2 * i as u64).await?);
        second.push(one(&a, &b, dest, 2 * i as u64 + 1).await?);
    }
    let (f, s) = (median(&mut first), median(&mut second));
    let keyed = match (key.is_some(), av_keys) {
        (false, _) => "no key".to_string(),
        (true, 0) => "keyed".to_string(),
        (true, n) => format!("keyed, acceptor holds {n} AV keys"),
    };
    println!(
        "{pairs} pairs ({keyed}): first message {f:.1} us, second {s:.1} us (medians); set-up ~{:.1} us",
        f - s
    );
    Ok(())
}
