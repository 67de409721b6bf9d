//! A one-sided record store: the server registers a table and tells the
//! client where it is (address and key, in a message); the client then
//! writes records straight into it, reads them back, and rings the server
//! with `writedata`, whose remote CQ data says how many records went in.
//! Any provider with RMA: `cargo run --example rma_service [-- -p verbs]`.

use bytes::{Bytes, BytesMut};
use weft::{
    AvAttr, BindFlags, Caps, CqAttr, Domain, Endpoint, EpType, Info, Mode, MrAccess, MrAttr,
    MrMode, FI_ADDR_UNSPEC,
};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const RECORDS: u64 = 16;
const RECORD: usize = 64;
const WHERE_TAG: u64 = 1;

fn record(i: u64) -> Bytes {
    let mut r = format!("record {i:>3}: ").into_bytes();
    r.resize(RECORD, b'.');
    Bytes::from(r)
}

fn endpoint(
    domain: &Domain,
    info: &Info,
) -> Res<(Endpoint, weft::AddressVector, weft::CompletionQueue)> {
    let av = domain.av(AvAttr::default())?;
    let cq = domain.cq(CqAttr::default())?;
    let ep = domain.endpoint(info)?;
    ep.bind_av(&av)?;
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)?;
    ep.enable()?;
    Ok((ep, av, cq))
}

#[tokio::main]
async fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let mut hints = Info::default();
    hints.ep_attr.ep_type = EpType::Rdm;
    hints.caps = Caps::TAGGED | Caps::RMA;
    // Modes it copes with: provider keys and virtual addresses (verbs),
    // requested keys (tcp), remote CQ data using up a receive.
    hints.domain_attr.mr_mode = MrMode::PROV_KEY | MrMode::VIRT_ADDR | MrMode::LOCAL;
    hints.mode = Mode::RX_CQ_DATA;
    if let Some(p) = args
        .iter()
        .position(|a| a == "-p")
        .and_then(|i| args.get(i + 1))
    {
        hints.fabric_attr.prov_name = Some(p.clone());
    }
    let info = weft::getinfo(Some(&hints))?.remove(0);
    let fabric = weft::Fabric::open(&info)?;
    let domain = fabric.domain(&info)?;
    let (server, server_av, server_cq) = endpoint(&domain, &info)?;
    let (client, client_av, _client_cq) = endpoint(&domain, &info)?;

    // The server's table, open to remote reads and writes.
    let mut attr = MrAttr::alloc(
        RECORD * RECORDS as usize,
        MrAccess::REMOTE_READ | MrAccess::REMOTE_WRITE,
    );
    if !info.domain_attr.mr_mode.contains(MrMode::PROV_KEY) {
        attr = attr.requested_key(7);
    }
    let table = domain.mr_regattr(attr)?;
    println!(
        "server: table of {} bytes, key {:#x}",
        table.len(),
        table.key()
    );

    // Where the table is, told to the client in a message.
    let to_client = server_av
        .insert_sync(&[client.local_addr()?], Default::default())?
        .fi_addrs[0];
    let to_server = client_av
        .insert_sync(&[server.local_addr()?], Default::default())?
        .fi_addrs[0];
    let mut at = table.addr().to_le_bytes().to_vec();
    at.extend_from_slice(&table.key().to_le_bytes());
    let told = client.trecv(BytesMut::zeroed(16), FI_ADDR_UNSPEC, WHERE_TAG, 0);
    let (told, sent) = tokio::join!(told, server.tsend(to_client, Bytes::from(at), WHERE_TAG));
    sent.map_err(|e| format!("telling the client: {e:?}"))?;
    let b = told
        .map_err(|e| format!("learning the table: {e:?}"))?
        .into_bytes();
    let addr = u64::from_le_bytes(b[..8].try_into()?);
    let key = u64::from_le_bytes(b[8..16].try_into()?);

    // Remote CQ data may need a receive at the server to land in.
    if info.mode.contains(Mode::RX_CQ_DATA) {
        server.post_recv(BytesMut::new(), 99)?;
    }

    // Client: write every record, read them all back, ring the server.
    for i in 0..RECORDS {
        let off = i * RECORD as u64;
        client
            .write(to_server, record(i), addr + off, key)
            .await
            .map_err(|e| format!("write {i}: {e:?}"))?;
    }
    let back = client
        .read(to_server, BytesMut::zeroed(table.len()), addr, key)
        .await
        .map_err(|e| format!("read: {e:?}"))?
        .into_bytes();
    for i in 0..RECORDS {
        let off = (i as usize) * RECORD;
        if back[off..off + RECORD] != record(i)[..] {
            return Err(format!("client read back record {i} wrong").into());
        }
    }
    client
        .writedata(to_server, record(0), RECORDS, addr, key)
        .await
        .map_err(|e| format!("writedata: {e:?}"))?;
    println!("client: {RECORDS} records written and read back");
    // Server: the ring says how many records there are; check them.
    let ring = loop {
        match weft_next(&server_cq).await? {
            e if e.flags.contains(weft::OpFlags::REMOTE_CQ_DATA) => break e,
            _ => continue,
        }
    };
    let table_now = table.to_vec()?;
    for i in 0..ring.data {
        let off = (i as usize) * RECORD;
        if table_now[off..off + RECORD] != record(i)[..] {
            return Err(format!("server sees record {i} wrong").into());
        }
    }
    println!("server: ring with {} records; all there", ring.data);
    Ok(())
}

/// The next successful completion of `cq` (within 10 s).
async fn weft_next(cq: &weft::CompletionQueue) -> Res<weft::CqEntry> {
    match cq.next_timeout(std::time::Duration::from_secs(10)).await {
        Some(Ok(e)) => Ok(e),
        Some(Err(e)) => Err(format!("completion error: {e:?}").into()),
        None => Err("no completion within 10 s".into()),
    }
}
