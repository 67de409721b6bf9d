//! What a named AV may be called. The name becomes part of a file name,
//! so it is held to characters that mean nothing to a file system.

use crate::{Error, Result};

/// Longest name, in bytes: with Weft's prefix it stays well under the
/// 255-byte file-name limit.
pub const MAX_NAME_LEN: usize = 200;

/// Checks a named AV's name: 1 to [`MAX_NAME_LEN`] bytes of ASCII letters,
/// digits, `.`, `_` and `-`, not starting with `.` (so never `.`, `..` or
/// a hidden file). Anything else — a path separator above all — is
/// `Inval`.
pub fn validate_name(name: &str) -> Result<()> {
    let ok_char = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-');
    let b = name.as_bytes();
    if b.is_empty() || b.len() > MAX_NAME_LEN || b[0] == b'.' || !b.iter().all(|&c| ok_char(c)) {
        return Err(Error::Inval);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for good in ["a", "job-42.av_0", "A.b", &"x".repeat(MAX_NAME_LEN)] {
            assert_eq!(validate_name(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "a/b",
            "/abs",
            "a\\b",
            "a b",
            "a\0b",
            "é",
            &"x".repeat(MAX_NAME_LEN + 1),
        ] {
            assert_eq!(validate_name(bad), Err(Error::Inval), "{bad:?}");
        }
    }
}
