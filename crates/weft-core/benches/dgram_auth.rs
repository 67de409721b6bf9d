//! The per-datagram cost of authorization keys on udp DGRAM
//! (`weft_core::dgram_auth`): sealing a datagram (its trailer's MAC),
//! opening one (the MAC checked), the anti-replay window, and opening a
//! datagram that names its key among 1 or 256 held keys
//! (`FI_AV_AUTH_KEY`: the identifier finds the key, so both cost one MAC).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(missing_docs)]

use std::hint::black_box;
use std::net::SocketAddr;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use weft_core::auth::AuthKey;
use weft_core::dgram_auth::{addr_bytes, DgramKey, NamedKeys, Replay};

fn dgram(c: &mut Criterion) {
    let mut g = c.benchmark_group("dgram_auth");
    g.throughput(Throughput::Elements(1));
    let k = DgramKey::new(&AuthKey::new(b"job-a key").unwrap()).unwrap();
    let from: SocketAddr = "127.0.0.1:40000".parse().unwrap();
    let src = addr_bytes(&from);
    let dst = addr_bytes(&"127.0.0.1:40001".parse().unwrap());
    let header = [0x57u8; 24];
    for size in [64usize, 4096] {
        let payload = vec![0xA5u8; size];
        g.bench_function(format!("seal/{size}"), |b| {
            let mut seq = 0u64;
            b.iter(|| {
                seq += 1;
                black_box(k.seal(&src, &dst, &header, seq, [black_box(&payload[..])]))
            })
        });
        let t = k.seal(&src, &dst, &header, 7, [&payload[..]]);
        g.bench_function(format!("open/{size}"), |b| {
            b.iter(|| {
                black_box(
                    k.open(&src, &dst, &header, black_box(&payload), &t)
                        .unwrap(),
                )
            })
        });
    }
    // A datagram naming the last of `n` held keys; and one naming a key
    // not held (refused after the identifier search, no MAC computed).
    let payload = vec![0xA5u8; 64];
    for n in [1u64, 256] {
        let keys: Vec<(u64, AuthKey)> = (0..n)
            .map(|h| (h, AuthKey::new(format!("job-{h}").as_bytes()).unwrap()))
            .collect();
        let held = NamedKeys::new(&keys).unwrap();
        let t = held
            .get(n - 1)
            .unwrap()
            .seal_with_id(&src, &dst, &header, 7, [&payload[..]]);
        g.bench_function(format!("open_named/64/of_{n}"), |b| {
            b.iter(|| {
                black_box(
                    held.open((&src, &dst), &header, black_box(&payload), &t)
                        .unwrap(),
                )
            })
        });
        let stranger = DgramKey::new(&AuthKey::new(b"job-x").unwrap())
            .unwrap()
            .seal_with_id(&src, &dst, &header, 7, [&payload[..]]);
        g.bench_function(format!("refuse_unknown_id/of_{n}"), |b| {
            b.iter(|| {
                black_box(
                    held.open((&src, &dst), &header, black_box(&payload), &stranger)
                        .is_err(),
                )
            })
        });
    }
    // One source, in order: the common case.
    g.bench_function("replay/in_order", |b| {
        let mut r = Replay::default();
        let mut seq = 0u64;
        b.iter(|| {
            seq += 1;
            black_box(r.accept(from, seq))
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = dgram
}
criterion_main!(benches);
