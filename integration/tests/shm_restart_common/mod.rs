//! What the shm restart tests share: peer processes restarted under
//! their name (`shm_restart.rs`, `shm_restart_nosweep.rs`).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use weft::{EpType, MrAccess, MrAttr, WaitMode};
use weft_integration::child::{Reap, START_LIMIT};
use weft_integration::{enabled_endpoint, payload, within, within_for, Harness, Provider};

use crate::shm_common;

/// The target's region key.
pub const KEY: u64 = 42;

/// A peer process and the lines it prints, read as they come.
pub struct Child {
    proc: Reap,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl Child {
    pub fn start(args: &[&str]) -> Child {
        let mut proc = Reap(
            Command::new(env!("CARGO_BIN_EXE_shm-peer"))
                .args(args)
                .stdout(Stdio::piped())
                .spawn()
                .expect("the peer starts"),
        );
        let out = proc.0.stdout.take().expect("a piped stdout");
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { return };
                if tx.send(l.trim().to_owned()).is_err() {
                    return;
                }
            }
        });
        Child { proc, lines }
    }

    /// Its next line, waiting at most `limit`.
    pub async fn line(&mut self, limit: Duration, what: &str) -> String {
        within_for(limit, what, self.lines.recv())
            .await
            .unwrap_or_else(|| panic!("the peer ended before {what}"))
    }

    pub fn pid(&self) -> u32 {
        self.proc.0.id()
    }

    /// SIGKILL, and the zombie reaped (so its pid is gone from `/proc`).
    pub fn kill9(&mut self) -> Instant {
        self.proc.0.kill().unwrap();
        let t = Instant::now();
        self.proc.0.wait().unwrap();
        t
    }
}

/// A name of our own for the restarted peer.
pub fn fresh_name() -> String {
    format!("rs-{}", weft_shm::name::unique())
}

/// Removes `name`'s segment file and doorbell (their mappings stay), so
/// that a new endpoint can take the name while its owner is stopped.
pub fn unlink(name: &str) {
    std::fs::remove_file(format!("/dev/shm/weft-shm.{name}")).unwrap();
    let _ = std::fs::remove_file(format!("/dev/shm/weft-shmbell.{name}"));
}

pub fn hex8(b: &[u8]) -> String {
    b.iter().take(8).map(|x| format!("{x:02x}")).collect()
}

/// An initiator process with a record in our endpoint (we answered its
/// read), stopped, its name taken by a new process, then killed: the new
/// one reads from us once the old one's pid is gone, and gets its
/// answer. With `swept`, our sweeps run, and the old one's channel in
/// our segment must be freed too (within one).
pub async fn restarted_initiator_is_answered(swept: bool) {
    let p = Provider::named("shm");
    let h = Harness::with_info(&p, p.rma_info(EpType::Rdm));
    let (b, _bcq) = enabled_endpoint(&h.domain, &h.info, &h.av(), WaitMode::Interrupt);
    let rw = MrAccess::REMOTE_READ | MrAccess::REMOTE_WRITE;
    let mr = h
        .domain
        .mr_regattr(MrAttr::alloc(4096, rw).requested_key(KEY))
        .map_err(|r| r.error)
        .unwrap();
    mr.write_at(0, &payload(4096, 5)).unwrap();
    let me = String::from_utf8(b.local_addr().unwrap()).unwrap();
    let (key, at) = (mr.key().to_string(), mr.addr().to_string());
    let want = format!("read {}", hex8(&payload(4096, 5)));
    let name = fresh_name();

    let mut old = Child::start(&["reader", &name, &me, &key, &at, "0"]);
    assert_eq!(old.line(START_LIMIT, "the old initiator").await, "ready");
    assert_eq!(old.line(START_LIMIT, "the old read").await, want);
    assert_eq!(b.stats().unwrap().peers, 1, "we answered it");
    shm_common::stop(old.pid()).await;
    unlink(&name);
    // The new one reads once the old one is gone.
    let mut new = Child::start(&["reader", &name, &me, &key, &at, &old.pid().to_string()]);
    assert_eq!(new.line(START_LIMIT, "the new initiator").await, "ready");
    old.kill9();
    // It reads at once, maybe before our sweep saw the old one die.
    assert_eq!(
        new.line(Duration::from_secs(15), "the new read").await,
        want
    );
    // The old one's channel in our segment is freed (within a sweep).
    if swept {
        within("the dead initiator's channel freed", async {
            while b.stats().unwrap().conns != 1 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
    }
    new.kill9();
}
