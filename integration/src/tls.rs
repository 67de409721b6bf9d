//! Throw-away certificates for the TLS tests and the TLS benchmark: a CA
//! and one leaf it signed, written as PEM files into a directory of the
//! system's temporary directory that is removed when the [`TestPki`] goes.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, KeyUsagePurpose};
use weft::TlsFiles;

/// A directory of generated PEM files.
#[derive(Debug)]
pub struct TestPki {
    dir: PathBuf,
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Default for TestPki {
    fn default() -> Self {
        TestPki::new()
    }
}

impl TestPki {
    /// An empty directory of this process's own.
    pub fn new() -> TestPki {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "weft-tls-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TestPki { dir }
    }

    /// A file of this directory (it may not exist).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Writes `text` to the file `name`.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// A new CA named `ca` and a leaf certificate it signed (no name
    /// checks apply, no extended key usage: good for both ends of a
    /// connection): the files an endpoint of that CA runs with.
    pub fn issue(&self, ca: &str) -> TlsFiles {
        let ca_key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let ca_cert = p.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec![format!("{ca}-endpoint")])
            .unwrap()
            .signed_by(&key, &ca_cert, &ca_key)
            .unwrap();
        TlsFiles::new(
            self.write(&format!("{ca}-leaf.pem"), &leaf.pem()),
            self.write(&format!("{ca}-leaf.key"), &key.serialize_pem()),
            self.write(&format!("{ca}.pem"), &ca_cert.pem()),
        )
    }
}
