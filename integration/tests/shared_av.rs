//! Named (shared) AVs across processes: this test process and
//! `shared-av-peer` processes open the same name and must agree on every
//! handle, see each other's inserts and removes without re-opening, send
//! to handles only another process inserted, honour `FI_READ`, survive a
//! writer killed mid-insert and refuse a damaged segment. tcp, loopback.
//! Every name is unique to its test and unlinked when the test ends.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use weft::{AvAttr, AvType, Domain, Error, Fabric, FiAddr, Info, FI_ADDR_UNSPEC};
use weft_integration::shared_av::{
    attr, churn_addr, hex, hints, unhex, ENV_NAME, ENV_READ, ENV_TYPE,
};

/// No single wait may take longer. A hang guard, not a speed check: in
/// the rxe VM (TCG emulation) on a loaded host, starting a peer process
/// took more than 10 s once.
const T: Duration = Duration::from_secs(60);

/// A name no other test (or test run) uses, removed when dropped.
struct Name(String);

impl Name {
    fn new(tag: &str) -> Name {
        static N: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let n = N.fetch_add(1, Ordering::Relaxed);
        Name(format!("t-{tag}-{}-{n}-{nanos}", std::process::id()))
    }
}

impl Drop for Name {
    fn drop(&mut self) {
        let _ = weft::unlink_shared_av(&self.0);
    }
}

/// A `shared-av-peer` process, killed if still running when dropped.
struct Peer {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    /// Its first line: `ready <map_addr> <address>` or `err <error>`.
    first: String,
}

impl Peer {
    fn start(name: &str, av_type: AvType, read_only: bool) -> Peer {
        let mut child = Command::new(env!("CARGO_BIN_EXE_shared-av-peer"))
            .env(ENV_NAME, name)
            .env(
                ENV_TYPE,
                match av_type {
                    AvType::Map => "map",
                    AvType::Table => "table",
                    AvType::Unspec => "unspec",
                },
            )
            .env(ENV_READ, if read_only { "1" } else { "0" })
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut p = Peer {
            child,
            stdin,
            lines,
            first: String::new(),
        };
        p.first = p.line();
        p
    }

    /// A peer whose open succeeded.
    fn open(name: &str, av_type: AvType, read_only: bool) -> Peer {
        let p = Peer::start(name, av_type, read_only);
        assert!(p.first.starts_with("ready "), "peer: {}", p.first);
        p
    }

    fn map_addr(&self) -> u64 {
        self.first.split(' ').nth(1).unwrap().parse().unwrap()
    }

    fn addr(&self) -> Vec<u8> {
        unhex(self.first.split(' ').nth(2).unwrap()).unwrap()
    }

    fn line(&mut self) -> String {
        let lines = &self.lines;
        tokio::task::block_in_place(|| lines.recv_timeout(T)).expect("peer answered nothing")
    }

    fn cmd(&mut self, line: &str) -> String {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
        self.line()
    }

    /// The answer of a command that must succeed, without its `ok`.
    fn ok(&mut self, line: &str) -> String {
        let r = self.cmd(line);
        match r.strip_prefix("ok") {
            Some(rest) => rest.trim().to_string(),
            None => panic!("{line}: {r}"),
        }
    }

    fn handles(&mut self, addrs: &[Vec<u8>]) -> Vec<FiAddr> {
        let words: Vec<String> = addrs.iter().map(|a| hex(a)).collect();
        self.ok(&format!("insert {}", words.join(" ")))
            .split(' ')
            .map(|h| h.parse().unwrap())
            .collect()
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

fn domain_for(hints: &Info) -> (Fabric, Domain, Info) {
    let info = weft::getinfo(Some(hints)).unwrap().remove(0);
    let fabric = Fabric::open(&info).unwrap();
    let domain = fabric.domain(&info).unwrap();
    (fabric, domain, info)
}

fn insert(av: &weft::AddressVector, addrs: &[Vec<u8>]) -> Vec<FiAddr> {
    let r = av.insert_sync(addrs, Default::default()).unwrap();
    assert_eq!(r.count, addrs.len(), "{:?}", r.results);
    r.fi_addrs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_process_gets_the_same_handles() {
    for av_type in [AvType::Table, AvType::Map] {
        let name = Name::new("agree");
        let (_f, d, _) = domain_for(&hints());
        let av = d.av(attr(&name.0, av_type, false)).unwrap();
        assert!(av.is_shared());
        let mut b = Peer::open(&name.0, av_type, false);
        let mut c = Peer::open(&name.0, av_type, false);
        assert_eq!(b.map_addr(), av.map_addr());
        assert_eq!(c.map_addr(), av.map_addr());
        assert_eq!(av.map_addr() != 0, av_type == AvType::Map);

        let addrs: Vec<Vec<u8>> = (0..5).map(churn_addr).collect();
        let from_b = b.handles(&addrs[..3]);
        if av_type == AvType::Table {
            assert_eq!(from_b, vec![0, 1, 2]);
        }
        // Neither this process nor c re-opened.
        for (h, a) in from_b.iter().zip(&addrs) {
            assert_eq!(&av.lookup(*h).unwrap(), a);
            assert_eq!(c.ok(&format!("lookup {h}")), hex(a));
        }
        let from_a = insert(&av, &addrs[3..]);
        for (h, a) in from_a.iter().zip(&addrs[3..]) {
            assert_eq!(b.ok(&format!("lookup {h}")), hex(a));
        }
        // One opening later finds every address under the same handle.
        let mut late = Peer::open(&name.0, AvType::Unspec, false);
        assert_eq!(late.ok("len"), "5");
        for (h, a) in from_b.iter().chain(&from_a).zip(&addrs) {
            assert_eq!(late.ok(&format!("lookup {h}")), hex(a));
        }
        assert_eq!(b.ok("quit"), "");
        assert!(b.child.wait().unwrap().success());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_reach_the_peer_another_process_inserted() {
    let name = Name::new("send");
    let (_f, d, info) = domain_for(&hints());
    let av = d.av(attr(&name.0, AvType::Table, false)).unwrap();
    let (ep, _cq) = weft_integration::enabled_endpoint(&d, &info, &av, weft::WaitMode::Interrupt);
    let mut b = Peer::open(&name.0, AvType::Table, false);
    // Only b inserts: this process's address at 0, its own at 1.
    let hs = b.handles(&[ep.local_addr().unwrap(), b.addr()]);
    assert_eq!(hs, vec![0, 1]);

    // A send to a handle this process never inserted reaches b, which
    // names the sender by the handle it gave it.
    tokio::time::timeout(T, ep.tsend(1, Bytes::from_static(b"from-a"), 7))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(b.ok("recv 7"), "0 from-a");

    // And what b sends back names b by b's handle here (FI_SOURCE).
    assert_eq!(b.ok("send 0 8 from-b"), "");
    let got = tokio::time::timeout(T, ep.trecv(BytesMut::zeroed(64), FI_ADDR_UNSPEC, 8, 0))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.src, 1);
    assert_eq!(&got.into_bytes()[..], b"from-b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_opens_need_the_av_and_change_nothing() {
    let name = Name::new("ro");
    let (_f, d, _) = domain_for(&hints());
    assert_eq!(
        d.av(attr(&name.0, AvType::Table, true)).unwrap_err(),
        Error::NoEnt
    );
    let refused = Peer::start(&name.0, AvType::Table, true);
    assert_eq!(refused.first, "err NoEnt");
    assert!(
        !weft::shared_av_path(&name.0).unwrap().exists(),
        "FI_READ created nothing"
    );

    let w = d.av(attr(&name.0, AvType::Table, false)).unwrap();
    insert(&w, &[churn_addr(0)]);
    let mut r = Peer::open(&name.0, AvType::Table, true);
    assert_eq!(
        r.cmd(&format!("insert {}", hex(&churn_addr(1)))),
        "err Perm"
    );
    assert_eq!(r.cmd("remove 0"), "err Perm");
    assert_eq!(r.ok("lookup 0"), hex(&churn_addr(0)));
    // It still follows the writers.
    assert_eq!(insert(&w, &[churn_addr(1)]), vec![1]);
    assert_eq!(r.ok("lookup 1"), hex(&churn_addr(1)));

    let ro = d.av(attr(&name.0, AvType::Table, true)).unwrap();
    assert_eq!(
        ro.insert_sync(&[churn_addr(2)], Default::default())
            .unwrap_err(),
        Error::Perm
    );
    assert_eq!(ro.remove(&[0]).unwrap_err(), Error::Perm);
    assert_eq!(ro.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removes_are_seen_by_every_process() {
    for av_type in [AvType::Table, AvType::Map] {
        let name = Name::new("remove");
        let (_f, d, _) = domain_for(&hints());
        let av = d.av(attr(&name.0, av_type, false)).unwrap();
        let hs = insert(&av, &[churn_addr(0), churn_addr(1), churn_addr(2)]);
        let mut b = Peer::open(&name.0, av_type, false);
        assert_eq!(b.ok(&format!("remove {}", hs[1])), "");
        assert_eq!(av.lookup(hs[1]).unwrap_err(), Error::Inval);
        assert_eq!(av.remove(&[hs[1]]).unwrap_err(), Error::Inval);
        assert_eq!(av.len(), 2);
        let again = b.handles(&[churn_addr(9)])[0];
        match av_type {
            // The lowest free index, for everyone.
            AvType::Table => assert_eq!(again, hs[1]),
            // A new handle: the removed one stays invalid everywhere.
            _ => assert_ne!(again, hs[1]),
        }
        assert_eq!(av.lookup(again).unwrap(), churn_addr(9));
        assert_eq!(av.remove(&[hs[0]]), Ok(()));
        assert_eq!(b.cmd(&format!("lookup {}", hs[0])), "err Inval");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolving_inserts_hand_out_handles_every_process_sees() {
    let name = Name::new("svc");
    let (_f, d, _) = domain_for(&hints());
    let av = d.av(attr(&name.0, AvType::Table, false)).unwrap();
    let mut b = Peer::open(&name.0, AvType::Table, false);
    // A host name: the handle is reserved now and filled once resolved,
    // both through the log.
    let pending = av
        .insert_svc("localhost", "7000", Default::default(), 0)
        .unwrap();
    let report = tokio::time::timeout(T, pending).await.unwrap();
    assert_eq!(report.results, vec![Ok(0)]);
    let resolved = av.lookup(0).unwrap();
    assert_eq!(b.ok("lookup 0"), hex(&resolved));
    assert_eq!(b.handles(&[churn_addr(1)]), vec![1]);
}

/// Where the records of a tcp named AV start, and how long each is
/// (docs/design.md, "Named shared AVs").
const RECORDS_OFF: usize = 256;
const RECORD_LEN: usize = 48;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_killed_mid_insert_leaves_a_whole_av() {
    let name = Name::new("kill");
    let path = weft::shared_av_path(&name.0).unwrap();
    let (_f, d, _) = domain_for(&hints());
    let mut seen = 0;
    // Kills that landed after a writer wrote records and before it
    // committed them: the case the commit protocol exists for. Between
    // one kill in ten and one in four lands there; keep killing until one
    // has.
    let mut mid_insert = 0;
    let mut round = 0u64;
    while round < 6 || (mid_insert == 0 && round < 80) {
        let mut w = Peer::open(&name.0, AvType::Table, false);
        assert_eq!(w.cmd("churn"), "churning");
        std::thread::sleep(Duration::from_millis(5 + 7 * (round % 8)));
        w.kill();

        // Opened after the kill: every entry is whole and where it belongs.
        let av = d.av(attr(&name.0, AvType::Table, false)).unwrap();
        let n = av.len();
        assert!(n >= seen + 8, "round {round}: {n} entries after {seen}");
        for i in 0..n {
            assert_eq!(
                av.lookup(i as u64).unwrap(),
                churn_addr(i as u32),
                "entry {i}"
            );
        }
        let bytes = std::fs::read(&path).unwrap();
        let committed_end = RECORDS_OFF + n * RECORD_LEN;
        if bytes
            .get(committed_end..)
            .is_some_and(|rest| rest.iter().any(|&b| b != 0))
        {
            mid_insert += 1;
        }
        // The dead writer's lock went with it: the next insert goes
        // through at once, at the next index.
        let next = churn_addr(n as u32);
        let h = tokio::time::timeout(
            T,
            tokio::task::spawn_blocking({
                let av = av.clone();
                move || av.insert_sync(&[next], Default::default())
            }),
        )
        .await
        .expect("the writer lock outlived the writer")
        .unwrap()
        .unwrap();
        assert_eq!(h.fi_addrs, vec![n as u64]);
        let mut other = Peer::open(&name.0, AvType::Table, true);
        assert_eq!(other.ok("len"), (n + 1).to_string());
        seen = n + 1;
        av.close().unwrap();
        round += 1;
    }
    assert!(
        mid_insert > 0,
        "no kill in {round} rounds landed between a writer's records and its commit"
    );
}

/// The segment's bytes with `f` applied, written back.
fn damage(path: &std::path::Path, good: &[u8], f: impl FnOnce(&mut Vec<u8>)) {
    let mut b = good.to_vec();
    f(&mut b);
    std::fs::write(path, &b).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_segment_gives_errors() {
    let name = Name::new("damage");
    let (_f, d, _) = domain_for(&hints());
    let table = attr(&name.0, AvType::Table, false);
    let av = d.av(table.clone()).unwrap();
    insert(&av, &[churn_addr(0), churn_addr(1)]);
    let path = weft::shared_av_path(&name.0).unwrap();
    let good = std::fs::read(&path).unwrap();

    // Not a Weft AV at all.
    damage(&path, &good, |b| b[..8].copy_from_slice(b"GARBAGE!"));
    assert_eq!(d.av(table.clone()).unwrap_err(), Error::Inval);
    // A header field, caught by the header's checksum.
    damage(&path, &good, |b| b[16] ^= 3);
    assert_eq!(d.av(table.clone()).unwrap_err(), Error::Io);
    // The records, caught by the chain hash; another process says so too
    // (and does not crash).
    damage(&path, &good, |b| b[256 + 20] ^= 0xFF);
    assert_eq!(d.av(table.clone()).unwrap_err(), Error::Io);
    assert_eq!(Peer::start(&name.0, AvType::Table, true).first, "err Io");
    // Cut short.
    damage(&path, &good, |b| b.truncate(100));
    assert_eq!(d.av(table.clone()).unwrap_err(), Error::Io);
    // Both commit slots: the open AV reports it on its next call.
    damage(&path, &good, |b| b[128..192].fill(0x5A));
    assert_eq!(av.lookup(0).unwrap_err(), Error::Io);
    let r = av
        .insert_sync(&[churn_addr(2)], Default::default())
        .unwrap();
    assert_eq!(r.results, vec![Err(Error::Io)]);

    // Repaired, everything works again.
    std::fs::write(&path, &good).unwrap();
    assert_eq!(av.lookup(1).unwrap(), churn_addr(1));
    assert_eq!(insert(&av, &[churn_addr(2)]), vec![2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_attributes_and_unlink() {
    let (_f, d, _) = domain_for(&hints());
    let long = "x".repeat(201);
    for bad in ["", "a/b", "/abs", "..", ".hidden", "a b", long.as_str()] {
        assert_eq!(
            d.av(attr(bad, AvType::Table, false)).unwrap_err(),
            Error::Inval,
            "{bad:?}"
        );
        assert_eq!(weft::unlink_shared_av(bad), Err(Error::Inval));
    }

    let name = Name::new("attrs");
    let av = d.av(attr(&name.0, AvType::Table, false)).unwrap();
    let map = attr(&name.0, AvType::Map, false);
    assert_eq!(d.av(map).unwrap_err(), Error::Inval);
    let bits = AvAttr {
        rx_ctx_bits: 4,
        ..attr(&name.0, AvType::Table, false)
    };
    assert_eq!(d.av(bits).unwrap_err(), Error::Inval);
    let unspec = d.av(attr(&name.0, AvType::Unspec, false)).unwrap();
    assert_eq!(unspec.av_type(), AvType::Table);

    let m = Name::new("mapaddr");
    let chosen = d.av(attr(&m.0, AvType::Map, false)).unwrap().map_addr();
    assert_ne!(chosen, 0);
    let same = AvAttr {
        map_addr: chosen,
        ..attr(&m.0, AvType::Map, false)
    };
    assert_eq!(d.av(same).unwrap().map_addr(), chosen);
    let other = AvAttr {
        map_addr: chosen ^ 0x10,
        ..attr(&m.0, AvType::Map, false)
    };
    assert_eq!(d.av(other).unwrap_err(), Error::Inval);

    // Unlinking removes the name; who has it open keeps the old AV.
    let h = insert(&av, &[churn_addr(0)])[0];
    weft::unlink_shared_av(&name.0).unwrap();
    assert!(!weft::shared_av_path(&name.0).unwrap().exists());
    assert_eq!(weft::unlink_shared_av(&name.0), Err(Error::NoEnt));
    assert_eq!(
        d.av(attr(&name.0, AvType::Table, true)).unwrap_err(),
        Error::NoEnt
    );
    assert_eq!(av.lookup(h).unwrap(), churn_addr(0));
    let fresh = d.av(attr(&name.0, AvType::Table, false)).unwrap();
    assert_eq!(fresh.len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_avs_need_the_capability() {
    // getinfo is honest: only offers that share AVs match the request.
    let mut any = hints();
    any.fabric_attr.prov_name = None;
    let offers = weft::getinfo(Some(&any)).unwrap();
    assert!(offers.iter().all(|i| {
        i.fabric_attr.prov_name.as_deref() == Some("tcp") && i.caps.contains(weft::Caps::SHARED_AV)
    }));
    // A domain opened without asking for FI_SHARED_AV has none.
    let mut plain = hints();
    plain.caps = weft::Caps::TAGGED;
    let (_f, d, info) = domain_for(&plain);
    assert!(!info.caps.contains(weft::Caps::SHARED_AV));
    let name = Name::new("nocap");
    assert_eq!(
        d.av(attr(&name.0, AvType::Table, false)).unwrap_err(),
        Error::OpNotSupp
    );
    assert!(!weft::shared_av_path(&name.0).unwrap().exists());
}

/// Verbs offers do not claim `FI_SHARED_AV`, and a verbs domain refuses a
/// named AV rather than keep it unshared.
#[cfg(feature = "verbs")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verbs_refuses_named_avs() {
    let p = weft_integration::Provider::named("verbs");
    let h = weft_integration::Harness::rdm(&p);
    assert!(!h.info.caps.contains(weft::Caps::SHARED_AV));
    let name = Name::new("verbs");
    assert_eq!(
        h.domain
            .av(attr(&name.0, AvType::Table, false))
            .unwrap_err(),
        Error::OpNotSupp
    );
}
