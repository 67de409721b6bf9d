//! Completions as a stream feeding a `futures` pipeline: a sender posts
//! numbered messages, the receiver keeps receives posted, and its CQ
//! stream is decoded, filtered and summed as items arrive — no polling
//! loop, no callbacks.
//!
//! `cargo run --example cq_pipeline`

use bytes::{Bytes, BytesMut};
use futures::{future, StreamExt};
use weft::{AvAttr, BindFlags, CqAttr, EpType, Info};

const N: u64 = 1000;

fn endpoint(
    domain: &weft::Domain,
    info: &Info,
) -> Result<(weft::Endpoint, weft::AddressVector, weft::CompletionQueue), weft::Error> {
    let av = domain.av(AvAttr::default())?;
    let cq = domain.cq(CqAttr::default())?;
    let ep = domain.endpoint(info)?;
    ep.bind_av(&av)?;
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)?;
    ep.enable()?;
    Ok((ep, av, cq))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut hints = Info::default();
    hints.ep_attr.ep_type = EpType::Rdm;
    let info = weft::getinfo(Some(&hints))?.remove(0);
    let fabric = weft::Fabric::open(&info)?;
    let domain = fabric.domain(&info)?;
    let (rx, _rx_av, rx_cq) = endpoint(&domain, &info)?;
    let (tx, tx_av, _tx_cq) = endpoint(&domain, &info)?;
    let dest = tx_av
        .insert_sync(&[rx.local_addr()?], Default::default())?
        .fi_addrs[0];

    // Keep a window of receives posted; each completion hands its buffer
    // back, and the pipeline re-posts it.
    for i in 0..64 {
        rx.post_recv(BytesMut::zeroed(16), i)?;
    }
    let sender = tokio::spawn(async move {
        for i in 0..N {
            tx.send(dest, Bytes::from(i.to_le_bytes().to_vec())).await?;
        }
        Ok::<_, weft::CqErrEntry>(())
    });

    let reposter = rx.clone();
    let (count, sum) = rx_cq
        .clone()
        // Errors are items of the stream too; stop at the first.
        .take_while(|item| future::ready(item.is_ok()))
        .filter_map(|item| future::ready(item.ok()))
        .take(N as usize)
        .map(move |entry| {
            let ctx = entry.context;
            let bytes = entry.into_bytes();
            // Room for the next message before this one is processed.
            let _ = reposter.post_recv(BytesMut::zeroed(16), ctx);
            u64::from_le_bytes(bytes[..8].try_into().unwrap_or([0; 8]))
        })
        .filter(|v| future::ready(v % 2 == 0))
        .fold((0u64, 0u64), |(c, s), v| future::ready((c + 1, s + v)))
        .await;
    sender.await??;

    let want: u64 = (0..N).filter(|v| v % 2 == 0).sum();
    println!("{count} even numbers received, sum {sum} (expected {want})");
    if count != N / 2 || sum != want {
        return Err("the pipeline lost or duplicated messages".into());
    }
    Ok(())
}
