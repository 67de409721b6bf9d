//! An `FI_EVENT` address-vector insert: the insert returns at once, its
//! result is a future, and the same results stream as events on the EQ
//! bound to the AV (one error per address that failed, then one
//! completion whose data is the number inserted).
//!
//! `cargo run --example av_events`

use futures::StreamExt;
use weft::{AvAttr, AvFlags, EpType, EqEventKind, Info};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut hints = Info::default();
    hints.ep_attr.ep_type = EpType::Rdm;
    let info = weft::getinfo(Some(&hints))?.remove(0);
    let fabric = weft::Fabric::open(&info)?;
    let domain = fabric.domain(&info)?;

    let eq = fabric.eq(64)?;
    let av = domain.av(AvAttr {
        flags: AvFlags::EVENT,
        ..AvAttr::default()
    })?;
    av.bind_eq(&eq, 0)?;

    // Two good addresses and one that is not an address at all.
    let good = |port: u16| weft::encode_sockaddr(&([127, 0, 0, 1], port).into());
    let addrs = vec![good(7001), b"not an address".to_vec(), good(7002)];
    let insert = av.insert(&addrs, AvFlags::empty(), 42)?;

    // The events stream on the EQ while the insert's future is pending.
    let mut events = eq.clone();
    let watcher = tokio::spawn(async move {
        let mut failed = Vec::new();
        while let Some(item) = events.next().await {
            match item {
                Err(e) => failed.push((e.data, e.err)),
                Ok(ev) if ev.kind == EqEventKind::AvComplete => {
                    return (failed, ev.data, ev.context);
                }
                Ok(_) => {}
            }
        }
        (failed, 0, 0)
    });

    let report = insert.await;
    println!(
        "insert: {} of {} inserted, handles {:?}",
        report.count,
        addrs.len(),
        report.fi_addrs
    );
    let (failed, count, context) = watcher.await?;
    println!("EQ: failed indices {failed:?}, then a completion for {count} (context {context})");
    if report.count != 2 || count != 2 || failed.len() != 1 || failed[0].0 != 1 || context != 42 {
        return Err("the events do not match the insert".into());
    }
    for &a in report
        .fi_addrs
        .iter()
        .filter(|&&a| a != weft::FI_ADDR_NOTAVAIL)
    {
        println!("  {} -> {}", a, av.straddr(&av.lookup(a)?));
    }
    // The EQ closes once nothing is bound to it.
    av.close()?;
    eq.close()?;
    Ok(())
}
