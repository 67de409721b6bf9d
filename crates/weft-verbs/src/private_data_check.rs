//! Properties of the rdma_cm private-data decoders (`cm_data`, the key
//! proof's payloads), checked on arbitrary bytes: the fuzz crate's entry
//! into this crate's private codecs. Every check returns what failed
//! instead of panicking, so the library keeps the workspace's lints and
//! the fuzz target decides what a finding is.

use crate::cm_data::{
    cm_decode, cm_encode, hello, parse_hello, parse_keyed_hello, KEYED_HELLO_LEN,
    KEYED_HELLO_V1_LEN,
};
use crate::keyproof::payload::{self, CmAuth, PROOF_DATA_MAX};

/// Runs every private-data decoder on `pd` and checks that what decodes
/// re-encodes to something that decodes the same. `Err` names the broken
/// property.
pub fn check(pd: &[u8]) -> Result<(), String> {
    auth_forms(pd)?;
    plain_forms(pd)?;
    let from = std::net::IpAddr::from([127, 0, 0, 1]);
    match parse_keyed_hello(pd, from) {
        Ok(_) if pd.len() != KEYED_HELLO_LEN && pd.len() != KEYED_HELLO_V1_LEN => {
            Err("keyed hello of another length".into())
        }
        Ok((addr, inc, features)) => {
            let again = crate::cm_data::keyed_hello(addr.port(), inc, features);
            (again[..pd.len()] == pd[..] && (pd.len() == KEYED_HELLO_LEN || features == 0))
                .then_some(())
                .ok_or_else(|| "keyed hello round trip".to_string())
        }
        Err(_) if pd.len() == KEYED_HELLO_LEN || pd.len() == KEYED_HELLO_V1_LEN => {
            Err("keyed hello of its length refused".into())
        }
        Err(_) => Ok(()),
    }
}

fn auth_forms(pd: &[u8]) -> Result<(), String> {
    let Ok(form) = payload::decode(pd) else {
        return Ok(());
    };
    let again = match form {
        CmAuth::Plain | CmAuth::Refused => return Ok(()),
        CmAuth::Open {
            nonce,
            selector,
            key_id,
        } => payload::open(&nonce, &selector, &key_id),
        CmAuth::Challenge { nonce, mac } => payload::challenge(&nonce, &mac),
        CmAuth::Proof { handle, mac, data } => {
            if data.len() > PROOF_DATA_MAX {
                return Err("proof data over its limit".into());
            }
            payload::proof(&handle, &mac, data).map_err(|e| format!("proof re-encode: {e}"))?
        }
        CmAuth::Notice { handle } => payload::notice(&handle),
    };
    match payload::decode(&again) {
        Ok(f) if f == form => Ok(()),
        other => Err(format!("{form:?} decodes again as {other:?}")),
    }
}

fn plain_forms(pd: &[u8]) -> Result<(), String> {
    let data = cm_decode(pd);
    if !data.is_empty() {
        let again = cm_encode(&data).map_err(|e| format!("cm data re-encode: {e}"))?;
        if cm_decode(&again) != data {
            return Err("cm data round trip".into());
        }
    }
    if let Ok((addr, inc, features)) = parse_hello(pd) {
        let again = hello(&addr, inc, features).map_err(|e| format!("hello re-encode: {e}"))?;
        if parse_hello(&again).ok() != Some((addr, inc, features)) {
            return Err("hello round trip".into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_formed_and_hostile_bytes_hold_the_properties() {
        let inputs: Vec<Vec<u8>> = vec![
            Vec::new(),
            vec![0xA1; 33],
            vec![0xA2; 49],
            vec![0xA3, 1, 2, 3],
            vec![0xA3; 56],
            vec![0xA5; 9],
            vec![0xA4],
            vec![3, 1, 2, 3],
            vec![200; 60],
            (0..=255).collect(),
        ];
        for i in inputs {
            assert_eq!(check(&i), Ok(()), "{i:?}");
        }
    }
}
