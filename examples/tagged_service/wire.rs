//! The request and reply formats (inside the tagged messages).

use super::*;

/// A request: magic, sequence number, client id, the client's endpoint
/// address (first request only; empty otherwise), payload.
#[derive(Debug)]
pub(crate) struct Request {
    pub(crate) seq: u64,
    pub(crate) client: u64,
    pub(crate) addr: Vec<u8>,
    pub(crate) payload: Bytes,
}

pub(crate) fn encode_request(seq: u64, client: u64, addr: &[u8], payload: &[u8]) -> Res<Bytes> {
    let alen = u16::try_from(addr.len()).map_err(|_| "endpoint address too long")?;
    let mut b = BytesMut::with_capacity(4 + 8 + 8 + 2 + addr.len() + payload.len());
    b.put_slice(REQUEST_MAGIC);
    b.put_u64(seq);
    b.put_u64(client);
    b.put_u16(alen);
    b.put_slice(addr);
    b.put_slice(payload);
    Ok(b.freeze())
}

/// Splits `n` bytes off the front of `b`, or says what is missing.
pub(crate) fn take(b: &mut Bytes, n: usize, what: &str) -> Result<Bytes, String> {
    if b.len() < n {
        return Err(format!("message too short for its {what}"));
    }
    Ok(b.split_to(n))
}

pub(crate) fn be_u64(b: &[u8]) -> u64 {
    b.iter().fold(0, |v, &x| (v << 8) | u64::from(x))
}

pub(crate) fn decode_request(mut b: Bytes) -> Result<Request, String> {
    if take(&mut b, 4, "magic")?[..] != REQUEST_MAGIC[..] {
        return Err("not a request (bad magic)".into());
    }
    let seq = be_u64(&take(&mut b, 8, "sequence number")?);
    let client = be_u64(&take(&mut b, 8, "client id")?);
    let alen = usize::from(
        take(&mut b, 2, "address length")?
            .iter()
            .fold(0u16, |v, &x| (v << 8) | u16::from(x)),
    );
    let addr = take(&mut b, alen, "address")?.to_vec();
    Ok(Request {
        seq,
        client,
        addr,
        payload: b,
    })
}

pub(crate) fn encode_reply(seq: u64, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(4 + 8 + payload.len());
    b.put_slice(REPLY_MAGIC);
    b.put_u64(seq);
    b.extend(payload.iter().map(|x| x ^ REPLY_XOR));
    b.freeze()
}

/// The payload of request `seq` from `client`: differs per request and
/// per byte, so a reply to the wrong request or a shifted buffer is caught.
pub(crate) fn pattern(client: u64, seq: u64, size: usize) -> Vec<u8> {
    let salt = client.to_le_bytes();
    (0..size)
        .map(|j| {
            (seq as u8).wrapping_mul(31) ^ (j as u8).wrapping_mul(7) ^ salt[j % 8] ^ (j >> 8) as u8
        })
        .collect()
}

/// The received bytes of a completion, truncated to what arrived.
pub(crate) fn received(e: CqEntry) -> Bytes {
    let len = e.len;
    let mut b = e.into_bytes();
    b.truncate(len);
    b.freeze()
}

// -------------------------------------------------------------- server
