//! What `tests/shared_av.rs` and its peer process (`shared-av-peer`)
//! agree on: the hints, the line protocol's encodings, and the addresses
//! a churning writer inserts.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use weft::{AvAttr, AvFlags, AvType, EpType, Info};

/// Environment of the peer: the AV's name.
pub const ENV_NAME: &str = "WEFT_SHAV_NAME";
/// Environment of the peer: `table`, `map` or `unspec`.
pub const ENV_TYPE: &str = "WEFT_SHAV_TYPE";
/// Environment of the peer: `1` opens with `FI_READ`.
pub const ENV_READ: &str = "WEFT_SHAV_READ";

/// tcp RDM with tagged messages, source addresses and named AVs.
pub fn hints() -> Info {
    let mut h = Info::default();
    h.ep_attr.ep_type = EpType::Rdm;
    h.fabric_attr.prov_name = Some("tcp".into());
    h.caps = weft::Caps::TAGGED | weft::Caps::SOURCE | weft::Caps::SHARED_AV;
    h
}

/// The attributes of the named AV `name`.
pub fn attr(name: &str, av_type: AvType, read_only: bool) -> AvAttr {
    AvAttr {
        av_type,
        name: Some(name.to_string()),
        flags: if read_only {
            AvFlags::READ
        } else {
            AvFlags::empty()
        },
        ..AvAttr::default()
    }
}

/// Lower-case hex of `b`.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The bytes of a hex string; `None` if it is not one.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    let s = s.trim();
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The `i`-th address a churning writer inserts: distinct for every `i`
/// below 2^24, so a reader can tell each entry is the right, whole one.
pub fn churn_addr(i: u32) -> Vec<u8> {
    let [_, a, b, c] = i.to_be_bytes();
    let ip = Ipv4Addr::new(127, a, b, c);
    weft::encode_sockaddr(&SocketAddr::V4(SocketAddrV4::new(ip, 7000)))
}
