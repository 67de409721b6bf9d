//! Planted FIFOs for the shm tests (`live`, `segment`, and the
//! integration tests, which compile this file by path): made, waited on
//! by nothing, and gone whatever the test's outcome. Std and rustix only,
//! so that it builds in either crate.

/// A FIFO made under `/dev/shm` by a test, as a hostile or careless
/// process of the user could make one under any of our prefixes; gone
/// when dropped, on success, failure or panic alike. Left there, it
/// would hang any process of an older build whose sweep opens it for
/// reading without `O_NONBLOCK`.
#[derive(Debug)]
pub struct Fifo(std::path::PathBuf);

impl Fifo {
    pub fn make(path: impl Into<std::path::PathBuf>) -> Fifo {
        use rustix::fs::{FileType, Mode, CWD};
        let path = path.into();
        rustix::fs::mknodat(CWD, &path, FileType::Fifo, Mode::RUSR | Mode::WUSR, 0).unwrap();
        Fifo(path)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0
    }

    /// Removes the FIFO now (dropping it does too), if still there.
    pub fn remove(&self) {
        use rustix::fs::{FileType, Mode, OFlags};
        // Opened for reading and writing (which never waits, on Linux)
        // before the unlink: an open already waiting on the FIFO for a
        // writer or a reader returns (an unlink alone would not wake
        // it), and one racing the unlink finds a peer end and does not
        // wait. Only a FIFO is removed: the test may have put something
        // else of its own under the name since.
        let flags = OFlags::RDWR | OFlags::NONBLOCK | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let Ok(fd) = rustix::fs::open(&self.0, flags, Mode::empty()) else {
            return;
        };
        let fifo = rustix::fs::fstat(&fd)
            .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Fifo);
        if fifo {
            let _ = std::fs::remove_file(&self.0);
        }
        drop(fd);
    }
}

impl Drop for Fifo {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Runs `f`, which must not wait on the FIFOs `fifos`: a failure, not a
/// hang, if it does. After 10 s a watchdog opens them for writing
/// without waiting, which succeeds only when something has one open for
/// reading — an open waiting for a writer, which this releases — and
/// fails the test then; a run merely slow passes.
pub fn without_waiting_on(fifos: &[&Fifo], f: impl FnOnce()) {
    use std::os::unix::fs::OpenOptionsExt;
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use std::time::{Duration, Instant};
    struct Done<'a>(&'a AtomicBool);
    impl Drop for Done<'_> {
        fn drop(&mut self) {
            self.0.store(true, SeqCst);
        }
    }
    let done = AtomicBool::new(false);
    let released = std::thread::scope(|s| {
        let watchdog = s.spawn(|| {
            let until = Instant::now() + Duration::from_secs(10);
            let mut released = false;
            while !done.load(SeqCst) {
                if Instant::now() > until {
                    for p in fifos {
                        released |= std::fs::OpenOptions::new()
                            .write(true)
                            .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
                            .open(p.path())
                            .is_ok();
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            released
        });
        let guard = Done(&done);
        f();
        drop(guard);
        watchdog.join().unwrap()
    });
    assert!(!released, "waited on a FIFO");
}
