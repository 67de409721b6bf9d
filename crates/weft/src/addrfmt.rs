//! `FI_ADDR_STR`: on a domain whose `addr_format` is the string format,
//! addresses cross the API as libfabric's address strings
//! (`fi_sockaddr_in://10.0.0.1:7000`, `fi_sockaddr_in6://[::1]:7000`) and
//! are kept as raw socket addresses inside, so providers and AV tables
//! never see the difference. A trailing NUL (as C callers send) is
//! accepted; strings given back carry none.

use weft_core::addr::{decode_sockaddr, encode_sockaddr, parse_sockaddr_str, sockaddr_to_str};
use weft_core::attr::{AddrFormat, Info};
use weft_core::{Error, Result};

/// The scheme of shm addresses (`fi_shm://<name>`), whose raw form is
/// the string itself.
const SHM_SCHEME: &[u8] = b"fi_shm://";

/// Whether `info` names addresses by strings.
pub(crate) fn is_str(info: &Info) -> bool {
    info.addr_format == AddrFormat::Str
}

/// An address as the provider takes it: parsed from its string form on a
/// string-format domain, else as given. A string that does not parse is
/// `Inval`.
pub(crate) fn to_raw(info: &Info, bytes: &[u8]) -> Result<Vec<u8>> {
    if !is_str(info) {
        return Ok(bytes.to_vec());
    }
    let bytes = bytes.strip_suffix(&[0]).unwrap_or(bytes);
    if bytes.starts_with(SHM_SCHEME) {
        // shm addresses are names: the string is the raw form.
        return Ok(bytes.to_vec());
    }
    let s = std::str::from_utf8(bytes).map_err(|_| Error::Inval)?;
    Ok(encode_sockaddr(&parse_sockaddr_str(s)?))
}

/// An address as the application sees it: its string form on a
/// string-format domain, else the provider's bytes.
pub(crate) fn to_user(info: &Info, raw: Vec<u8>) -> Vec<u8> {
    if !is_str(info) {
        return raw;
    }
    match decode_sockaddr(&raw) {
        Ok(a) => sockaddr_to_str(&a).into_bytes(),
        Err(_) => raw,
    }
}

/// The attributes a provider gets: on a string-format domain, the
/// addresses in them raw and the format the socket one.
pub(crate) fn provider_info(info: &Info) -> Result<Info> {
    if !is_str(info) {
        return Ok(info.clone());
    }
    let mut p = info.clone();
    p.addr_format = AddrFormat::Sockaddr;
    p.src_addr = info
        .src_addr
        .as_deref()
        .map(|a| to_raw(info, a))
        .transpose()?;
    p.dest_addr = info
        .dest_addr
        .as_deref()
        .map(|a| to_raw(info, a))
        .transpose()?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn strings_round_trip_on_string_domains_only() {
        let mut info = Info::default();
        let raw = encode_sockaddr(&"10.0.0.1:7000".parse().unwrap());
        assert_eq!(
            to_raw(&info, &raw).unwrap(),
            raw,
            "raw domains pass through"
        );
        info.addr_format = AddrFormat::Str;
        let s = b"fi_sockaddr_in://10.0.0.1:7000";
        assert_eq!(to_raw(&info, s).unwrap(), raw);
        assert_eq!(
            to_raw(&info, b"fi_sockaddr_in://10.0.0.1:7000\0").unwrap(),
            raw
        );
        assert_eq!(to_user(&info, raw.clone()), s.to_vec());
        assert_eq!(
            to_raw(&info, b"fi_sockaddr_in://nowhere").unwrap_err(),
            Error::Inval
        );
        assert_eq!(to_raw(&info, &[0xff, 0xfe]).unwrap_err(), Error::Inval);
        assert_eq!(to_raw(&info, b"fi_shm://a-1\0").unwrap(), b"fi_shm://a-1");
        assert_eq!(to_user(&info, b"fi_shm://a-1".to_vec()), b"fi_shm://a-1");
    }
}
