//! Where a domain's TLS certificates come from (`docs/design.md`, "TLS on
//! tcp"): three PEM files, named in code by [`TlsFiles`] on
//! `domain_attr.tls` or, in libfabric's style, by environment variables
//! read when a domain, endpoint or passive endpoint is created.
//!
//! This module only names and resolves the files; the provider that runs
//! TLS (tcp) loads and checks them, so a missing or unparsable file is an
//! error of the call that opens the object, never a silent fall-back to
//! plain text.

use std::path::PathBuf;

use crate::{Error, Result};

/// The variable naming this endpoint's certificate chain (PEM, leaf
/// first).
pub const ENV_CERT: &str = "FI_TCP_TLS_CERT";
/// The variable naming the private key of that certificate (PEM: PKCS#8,
/// PKCS#1 or SEC1).
pub const ENV_KEY: &str = "FI_TCP_TLS_KEY";
/// The variable naming the CA certificates peers' chains must lead to
/// (PEM, one or more).
pub const ENV_CA: &str = "FI_TCP_TLS_CA";

/// A domain's TLS configuration: its certificate chain and key, and the
/// CA certificates peers' certificates must be signed by. Every connection
/// of the domain's endpoints is then TLS 1.3 with both sides presenting a
/// certificate and checking the other's against `ca`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct TlsFiles {
    /// This side's certificate chain, PEM (leaf first).
    pub cert: PathBuf,
    /// The leaf certificate's private key, PEM.
    pub key: PathBuf,
    /// The trusted CA certificates, PEM.
    pub ca: PathBuf,
}

impl TlsFiles {
    /// The three files, by path.
    pub fn new(cert: impl Into<PathBuf>, key: impl Into<PathBuf>, ca: impl Into<PathBuf>) -> Self {
        TlsFiles {
            cert: cert.into(),
            key: key.into(),
            ca: ca.into(),
        }
    }

    /// From [`ENV_CERT`], [`ENV_KEY`] and [`ENV_CA`]: `None` when none of
    /// them is set, the files when all three are.
    ///
    /// # Errors
    ///
    /// `Inval` when only some are set (or one is empty): a half-made
    /// configuration must not be taken as "TLS off".
    pub fn from_env() -> Result<Option<TlsFiles>> {
        Self::from_vars(|k| std::env::var_os(k).map(PathBuf::from))
    }

    /// [`from_env`](Self::from_env) over `var` (a name to its value).
    ///
    /// # Errors
    ///
    /// As [`from_env`](Self::from_env).
    pub fn from_vars(var: impl Fn(&str) -> Option<PathBuf>) -> Result<Option<TlsFiles>> {
        match (var(ENV_CERT), var(ENV_KEY), var(ENV_CA)) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(ca))
                if [&cert, &key, &ca].iter().all(|p| !p.as_os_str().is_empty()) =>
            {
                Ok(Some(TlsFiles { cert, key, ca }))
            }
            _ => Err(Error::Inval),
        }
    }

    /// What an object opened with `attr` (its `domain_attr.tls`) uses:
    /// the attribute when given (code wins over the environment, as for
    /// connection limits), else the environment.
    ///
    /// # Errors
    ///
    /// As [`from_env`](Self::from_env), when the environment is read.
    pub fn resolve(attr: Option<&TlsFiles>) -> Result<Option<TlsFiles>> {
        match attr {
            Some(f) => Ok(Some(f.clone())),
            None => Self::from_env(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn vars<'a>(set: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<PathBuf> + 'a {
        move |k| {
            set.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| PathBuf::from(v))
        }
    }

    #[test]
    fn all_three_or_none() {
        assert_eq!(TlsFiles::from_vars(vars(&[])), Ok(None));
        let all = [(ENV_CERT, "c.pem"), (ENV_KEY, "k.pem"), (ENV_CA, "ca.pem")];
        assert_eq!(
            TlsFiles::from_vars(vars(&all)),
            Ok(Some(TlsFiles::new("c.pem", "k.pem", "ca.pem")))
        );
        for skip in 0..3 {
            let some: Vec<_> = (0..3).filter(|i| *i != skip).map(|i| all[i]).collect();
            assert_eq!(TlsFiles::from_vars(vars(&some)), Err(Error::Inval));
        }
        let empty = [(ENV_CERT, "c.pem"), (ENV_KEY, ""), (ENV_CA, "ca.pem")];
        assert_eq!(TlsFiles::from_vars(vars(&empty)), Err(Error::Inval));
    }

    #[test]
    fn the_attribute_wins() {
        let f = TlsFiles::new("a", "b", "c");
        assert_eq!(TlsFiles::resolve(Some(&f)).unwrap(), Some(f));
    }
}
