//! Endpoint names and the addresses made of them. An shm address is the
//! string `fi_shm://<name>` (libfabric's `FI_ADDR_STR` form), the same
//! bytes in raw and string form; the name picks the endpoint's segment,
//! `/dev/shm/weft-shm.<name>`, and its doorbell, `/dev/shm/weft-shmbell.<name>`.

use std::sync::atomic::{AtomicU32, Ordering};

use weft_core::{Error, Result};

use crate::layout::NAME_MAX;

/// The scheme of shm addresses.
pub const SCHEME: &str = "fi_shm://";
/// Prefix of segment files in `/dev/shm`.
pub const SEG_PREFIX: &str = "weft-shm.";
/// Prefix of segment files being made, in `/dev/shm`:
/// `weft-shmtmp.<name>.<unique>` (`create::create_segment`). No segment
/// path (`weft-shm.<name>`) starts with it, whatever the name, so a file
/// under it is never taken for an endpoint's segment, and the sweep
/// tells the two apart by the prefix alone.
pub const TMP_PREFIX: &str = "weft-shmtmp.";
/// Prefix of doorbell FIFOs in `/dev/shm`.
pub const BELL_PREFIX: &str = "weft-shmbell.";
/// Where POSIX shared memory lives on Linux.
pub const SHM_DIR: &str = "/dev/shm";

/// Whether `name` is a valid endpoint name: 1 to 48 of `[A-Za-z0-9_.-]`,
/// not starting with a dot.
pub fn valid(name: &[u8]) -> bool {
    (1..=NAME_MAX).contains(&name.len())
        && name[0] != b'.'
        && name
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

/// The name an address carries (`Inval` if it is not a valid one). A
/// trailing NUL, as C callers pass strings, is accepted.
pub fn parse(addr: &[u8]) -> Result<&str> {
    let a = canonical(addr);
    let n = a.strip_prefix(SCHEME.as_bytes()).ok_or(Error::Inval)?;
    if !valid(n) {
        return Err(Error::Inval);
    }
    std::str::from_utf8(n).map_err(|_| Error::Inval)
}

/// `addr` without the trailing NUL [`parse`] accepts: one spelling per
/// endpoint, so that peer records, keyed by address, are one per
/// endpoint (two would give two id spaces to one target's answers, which
/// name us by the plain address).
pub fn canonical(addr: &[u8]) -> &[u8] {
    addr.strip_suffix(&[0]).unwrap_or(addr)
}

/// The address of `name`.
pub fn addr(name: &str) -> Vec<u8> {
    format!("{SCHEME}{name}").into_bytes()
}

/// The shm_open(3) name of `name`'s segment.
pub fn seg_name(name: &str) -> String {
    format!("/{SEG_PREFIX}{name}")
}

/// The path of `name`'s doorbell.
pub fn bell_path(name: &str) -> String {
    format!("{SHM_DIR}/{BELL_PREFIX}{name}")
}

/// A name no other endpoint is likely to have: `<pid>-<n>-<random>`.
///
/// The pid and counter alone are unique only inside one pid namespace:
/// two containers sharing `/dev/shm` but not their pids each run as pid 1,
/// and the second would take the first one's name (and, judging the
/// owner by a pid that names itself there, its segment). 64 random bits
/// (from the standard library's per-process hash seed, which the OS
/// provides) keep them apart.
pub fn unique() -> String {
    use std::hash::{BuildHasher, Hasher};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(n);
    format!("{}-{n}-{:016x}", std::process::id(), h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_addresses() {
        assert_eq!(parse(b"fi_shm://a-1.b_2"), Ok("a-1.b_2"));
        assert_eq!(parse(b"fi_shm://a\0"), Ok("a"));
        assert_eq!(canonical(b"fi_shm://a\0"), b"fi_shm://a");
        assert_eq!(canonical(b"fi_shm://a"), b"fi_shm://a");
        assert_eq!(parse(b"fi_shm://"), Err(Error::Inval));
        assert_eq!(parse(b"fi_shm://../x"), Err(Error::Inval));
        assert_eq!(parse(b"fi_shm://a/b"), Err(Error::Inval));
        assert_eq!(parse(b"fi_sockaddr_in://1.2.3.4:5"), Err(Error::Inval));
        assert_eq!(parse(&[0xff; 20]), Err(Error::Inval));
        let long = format!("fi_shm://{}", "x".repeat(NAME_MAX + 1));
        assert_eq!(parse(long.as_bytes()), Err(Error::Inval));
        assert_eq!(addr("p"), b"fi_shm://p".to_vec());
        assert!(valid(unique().as_bytes()));
        assert_ne!(unique(), unique());
        assert!(unique().len() <= NAME_MAX);
    }
}
