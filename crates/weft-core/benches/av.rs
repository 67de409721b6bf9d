//! Address vector hot paths at a million peers: bulk insert, handle lookup,
//! reverse lookup (address bytes -> handle) and remove/re-insert churn.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(missing_docs)]

use std::hint::black_box;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, SamplingMode, Throughput};
use weft_core::addr::{decode_sockaddr, encode_sockaddr, FiAddr};
use weft_core::attr::AvType;
use weft_core::av::{AvAttr, AvTable};

const PEERS: u32 = 1_000_000;
/// Operations per iteration of the lookup benches.
const BATCH: usize = 1024;

/// `sockaddr_in` bytes of peer `i`: 10.x.y.z, distinct for every `i` < 2^24.
fn peer(i: u32) -> Vec<u8> {
    let ip = Ipv4Addr::from(0x0A00_0000 | i);
    encode_sockaddr(&SocketAddr::V4(SocketAddrV4::new(ip, 7000)))
}

fn peers(n: u32) -> Vec<Vec<u8>> {
    (0..n).map(peer).collect()
}

/// What a provider's insert does with each address: decode it.
fn validate(b: &[u8]) -> weft_core::Result<()> {
    decode_sockaddr(b).map(|_| ())
}

fn open(count: usize) -> AvTable {
    AvTable::open(&AvAttr {
        av_type: AvType::Table,
        count,
        ..AvAttr::default()
    })
    .unwrap()
}

/// A table holding `PEERS` addresses, and their handles.
fn full_table() -> (AvTable, Vec<FiAddr>) {
    let mut av = open(0);
    let handles = av
        .insert(&peers(PEERS), &validate)
        .into_iter()
        .collect::<weft_core::Result<Vec<_>>>()
        .unwrap();
    (av, handles)
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u32) -> u32 {
        (self.next() % u64::from(n)) as u32
    }
}

fn insert(c: &mut Criterion) {
    let mut g = c.benchmark_group("av/insert_1m");
    g.throughput(Throughput::Elements(u64::from(PEERS)));
    // One iteration is ~0.1-0.2 s: criterion's minimum of 10 samples, each
    // of the same iteration count (flat sampling suits long iterations).
    g.sample_size(10);
    g.sampling_mode(SamplingMode::Flat);
    g.measurement_time(Duration::from_secs(4));
    for (name, hint) in [("no_hint", 0), ("count_hint", PEERS as usize)] {
        g.bench_function(name, |b| {
            b.iter_batched(
                // Fresh table and address list per iteration; neither is timed.
                || (open(hint), peers(PEERS)),
                // Table and results are returned so their drop is not timed.
                |(mut av, addrs)| {
                    let res = av.insert(&addrs, &validate);
                    (av, res, addrs)
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

fn lookups(c: &mut Criterion) {
    let (mut av, mut handles) = full_table();
    let mut rng = Rng(0x5eed_0001);
    let picks: Vec<u32> = (0..BATCH).map(|_| rng.below(PEERS)).collect();
    let pick_handles: Vec<FiAddr> = picks.iter().map(|&i| handles[i as usize]).collect();
    let pick_addrs: Vec<Vec<u8>> = picks.iter().map(|&i| peer(i)).collect();
    // Addresses of the same shape that were never inserted.
    let miss_addrs: Vec<Vec<u8>> = picks.iter().map(|&i| peer(PEERS + i)).collect();

    let mut g = c.benchmark_group("av/1m_table");
    g.throughput(Throughput::Elements(BATCH as u64));
    g.sample_size(30);

    g.bench_function("lookup_random", |b| {
        b.iter(|| {
            for &h in &pick_handles {
                black_box(av.lookup(black_box(h)).unwrap());
            }
        })
    });
    g.bench_function("find_random_hit", |b| {
        b.iter(|| {
            for a in &pick_addrs {
                black_box(av.find(black_box(a)).unwrap());
            }
        })
    });
    g.bench_function("find_random_miss", |b| {
        b.iter(|| {
            for a in &miss_addrs {
                black_box(av.find(black_box(a)));
            }
        })
    });
    g.bench_function("source_addr_random", |b| {
        b.iter(|| {
            for a in &pick_addrs {
                black_box(av.source_addr(black_box(a)));
            }
        })
    });

    // fi_av_remove of a random peer then re-insert of its address (the
    // TABLE hands the freed index straight back).
    g.throughput(Throughput::Elements(1));
    let mut k = 0;
    g.bench_function("remove_reinsert_random", |b| {
        b.iter(|| {
            k = (k + 1) % BATCH;
            let i = picks[k] as usize;
            av.remove(handles[i]).unwrap();
            let h = av
                .insert(std::slice::from_ref(&pick_addrs[k]), &validate)
                .pop()
                .unwrap()
                .unwrap();
            handles[i] = black_box(h);
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    targets = insert, lookups
}
criterion_main!(benches);
