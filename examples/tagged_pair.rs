//! Two RDM endpoints in one process exchange tagged messages: the awaited
//! form on one side, post-and-stream-the-CQ on the other.
//!
//! `cargo run --example tagged_pair`

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use weft::{AvAttr, BindFlags, CqAttr, EpType, Info};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut hints = Info::default();
    hints.ep_attr.ep_type = EpType::Rdm;
    hints.caps = weft::Caps::TAGGED;
    let info = weft::getinfo(Some(&hints))?.remove(0);
    let fabric = weft::Fabric::open(&info)?;
    let domain = fabric.domain(&info)?;

    let server_av = domain.av(AvAttr::default())?;
    let server_cq = domain.cq(CqAttr::default())?;
    let server = domain.endpoint(&info)?;
    server.bind_av(&server_av)?;
    server.bind_cq(&server_cq, BindFlags::TRANSMIT | BindFlags::RECV)?;
    server.enable()?;

    let client_av = domain.av(AvAttr::default())?;
    let client_cq = domain.cq(CqAttr::default())?;
    let client = domain.endpoint(&info)?;
    client.bind_av(&client_av)?;
    client.bind_cq(&client_cq, BindFlags::TRANSMIT | BindFlags::RECV)?;
    client.enable()?;

    let to_server = client_av
        .insert_sync(&[server.local_addr()?], Default::default())?
        .fi_addrs[0];
    println!("server at {}", server_av.straddr(&server.local_addr()?));

    // Server: pre-post 10 receives; each completion carries its context.
    for i in 0..10u64 {
        server.post_trecv(BytesMut::zeroed(128), weft::FI_ADDR_UNSPEC, i, 0, i)?;
    }
    // Client: awaited sends.
    for i in 0..10u64 {
        client
            .tsend(to_server, Bytes::from(format!("message {i}")), i)
            .await?;
    }
    let mut cq = server_cq.clone();
    let mut seen = 0;
    while seen < 10 {
        match cq.next().await {
            Some(Ok(entry)) => {
                let ctx = entry.context;
                let text = String::from_utf8_lossy(&entry.into_bytes()).into_owned();
                println!("context {ctx}: {text}");
                seen += 1;
            }
            Some(Err(e)) => return Err(e.into()),
            None => break,
        }
    }
    Ok(())
}
