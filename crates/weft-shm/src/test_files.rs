//! Files a test puts under `/dev/shm`, gone whatever its outcome.

/// Paths removed when dropped — on success, failure or panic alike —
/// if still there. For files no sweep removes (a header-less segment, a
/// live owner's, one outside every prefix), which a test that panics
/// midway would otherwise leave for good.
#[derive(Debug, Default)]
pub struct Leftovers(Vec<std::path::PathBuf>);

impl Leftovers {
    /// Adds `path` to those removed on drop; returns it.
    pub fn add(&mut self, path: impl Into<std::path::PathBuf>) -> std::path::PathBuf {
        let path = path.into();
        self.0.push(path.clone());
        path
    }
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}
