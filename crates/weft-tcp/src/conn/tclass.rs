//! Traffic class marking of a connection's packets (DSCP in `IP_TOS` or
//! `IPV6_TCLASS`).

use weft_core::Result;

/// Marks a connection's packets with `dscp` (the endpoint's traffic
/// class): `IP_TOS` or `IPV6_TCLASS`, whose upper six bits are the DSCP.
pub fn mark(stream: &tokio::net::TcpStream, dscp: Option<u8>) -> Result<()> {
    let Some(d) = dscp else { return Ok(()) };
    let s = socket2::SockRef::from(stream);
    let v = u32::from(d) << 2;
    if stream.local_addr()?.is_ipv4() {
        s.set_tos_v4(v)?;
    } else {
        s.set_tclass_v6(v)?;
    }
    Ok(())
}

/// What a connection's packets are marked with (`IP_TOS`/`IPV6_TCLASS`).
#[cfg(test)]
fn marked(stream: &std::net::TcpStream) -> Result<u32> {
    let s = socket2::SockRef::from(stream);
    Ok(if stream.local_addr()?.is_ipv4() {
        s.tos_v4()?
    } else {
        s.tclass_v6()?
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[tokio::test]
    async fn connections_carry_the_traffic_class() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        mark(
            &a,
            weft_core::tclass::to_dscp(weft_core::tclass::LOW_LATENCY).unwrap(),
        )
        .unwrap();
        let std = a.into_std().unwrap();
        assert_eq!(marked(&std).unwrap(), 46 << 2, "EF");
        let b = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        mark(&b, None).unwrap();
        assert_eq!(marked(&b.into_std().unwrap()).unwrap(), 0, "left alone");
    }
}
