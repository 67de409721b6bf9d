//! Named AVs over an in-memory segment: several "processes" (tables) on
//! one segment, writers that die at every byte, and damaged or hostile
//! segments.

use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::{Arc, Mutex};

use super::layout::{self, Commit, Record};
use super::*;
use crate::addr::FI_ADDR_NOTAVAIL;

/// The bytes every process sees.
#[derive(Debug, Default)]
struct Mem {
    bytes: Mutex<Vec<u8>>,
    /// Locks held now, over all processes: every operation must give
    /// back what it took.
    held: AtomicIsize,
}

/// One process's handle on [`Mem`]. With a budget it dies once it has
/// written that many bytes (a length change counts one): the write that
/// crosses the budget lands only in part, as a killed writer's would.
#[derive(Debug)]
struct Proc {
    mem: Arc<Mem>,
    budget: Mutex<Option<usize>>,
}

impl Proc {
    fn new(mem: &Arc<Mem>) -> Arc<Proc> {
        Proc::with_budget(mem, None)
    }

    fn with_budget(mem: &Arc<Mem>, budget: Option<usize>) -> Arc<Proc> {
        Arc::new(Proc {
            mem: mem.clone(),
            budget: Mutex::new(budget),
        })
    }

    /// How much of `want` this process may still write; `Io` once dead.
    fn spend(&self, want: usize) -> Result<usize> {
        let mut b = lock(&self.budget);
        match b.as_mut() {
            None => Ok(want),
            Some(0) => Err(Error::Io),
            Some(left) => {
                let n = want.min(*left);
                *left -= n;
                Ok(n)
            }
        }
    }

    fn spent_all(&self) -> bool {
        *lock(&self.budget) == Some(0)
    }
}

impl Segment for Proc {
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        let m = lock(&self.mem.bytes);
        let off = usize::try_from(off).map_err(|_| Error::Io)?;
        let src = m.get(off..off + buf.len()).ok_or(Error::Io)?;
        buf.copy_from_slice(src);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], off: u64) -> Result<()> {
        let n = self.spend(buf.len())?;
        let mut m = lock(&self.mem.bytes);
        let off = off as usize;
        if m.len() < off + n {
            m.resize(off + n, 0);
        }
        m[off..off + n].copy_from_slice(&buf[..n]);
        if n < buf.len() {
            return Err(Error::Io);
        }
        Ok(())
    }

    fn size(&self) -> Result<u64> {
        Ok(lock(&self.mem.bytes).len() as u64)
    }

    fn set_len(&self, len: u64) -> Result<()> {
        if self.spend(1)? == 0 {
            return Err(Error::Io);
        }
        lock(&self.mem.bytes).resize(len as usize, 0);
        Ok(())
    }

    fn lock(&self, _exclusive: bool) -> Result<()> {
        self.mem.held.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn unlock(&self) -> Result<()> {
        self.mem.held.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }
}

fn check_addr(a: &[u8]) -> Result<()> {
    if a.is_empty() || a[0] == 0xFF {
        Err(Error::Inval)
    } else {
        Ok(())
    }
}

fn params() -> SharedParams {
    SharedParams {
        addr_format: AddrFormat::SockaddrIn,
        max_addr_len: 28,
        domain: "tcp/lo".into(),
        validate: check_addr,
    }
}

fn attr(av_type: AvType) -> AvAttr {
    AvAttr {
        av_type,
        name: Some("test-av".into()),
        ..AvAttr::default()
    }
}

fn open(p: &Arc<Proc>, attr: &AvAttr) -> Result<AvTable> {
    AvTable::open_shared(attr, p.clone(), &params())
}

fn proc_open(mem: &Arc<Mem>, av_type: AvType) -> AvTable {
    open(&Proc::new(mem), &attr(av_type)).unwrap()
}

/// A distinct 16-byte address per `n`.
fn a(n: u32) -> Vec<u8> {
    let mut v = vec![2, 0];
    v.extend_from_slice(&n.to_be_bytes());
    v.resize(16, 0);
    v
}

fn ins(t: &mut AvTable, addrs: &[Vec<u8>]) -> Vec<FiAddr> {
    t.insert(addrs, &check_addr)
        .into_iter()
        .map(|r| r.unwrap())
        .collect()
}

/// The live entries of a table, by handle.
type State = Vec<(FiAddr, Vec<u8>)>;

fn entries(t: &AvTable) -> State {
    t.iter().map(|(h, b)| (h, b.to_vec())).collect()
}

const BOTH: [AvType; 2] = [AvType::Table, AvType::Map];

#[test]
fn every_process_gets_the_same_handles() {
    for ty in BOTH {
        let mem = Arc::new(Mem::default());
        let mut p1 = proc_open(&mem, ty);
        let mut p2 = proc_open(&mem, ty);
        let h1 = ins(&mut p1, &[a(0), a(1), a(2)]);
        if ty == AvType::Table {
            assert_eq!(h1, vec![0, 1, 2]);
        }
        // p2 has not re-opened: catching up is enough.
        p2.sync_shared().unwrap();
        for (h, n) in h1.iter().zip(0..) {
            assert_eq!(p2.lookup(*h).unwrap(), &a(n)[..]);
            assert_eq!(p2.find(&a(n)), Some(*h));
        }
        let h2 = ins(&mut p2, &[a(3), a(4)]);
        let p1 = Mutex::new(p1);
        let t = lock_synced(&p1);
        assert_eq!(t.lookup(h2[1]).unwrap(), &a(4)[..]);
        assert_eq!(t.len(), 5);
        let p3 = proc_open(&mem, AvType::Unspec);
        assert_eq!(p3.av_type(), ty);
        // Other processes' changes come in only through the sync under
        // the lock: no lock-free version to read.
        assert!(p3.version_watch().is_none());
        assert_eq!(entries(&p3), entries(&t));
        assert_eq!(mem.held.load(Ordering::SeqCst), 0);
    }
}

#[test]
fn reserve_fill_release_and_remove_are_shared() {
    let mem = Arc::new(Mem::default());
    let mut p1 = proc_open(&mem, AvType::Table);
    let mut p2 = proc_open(&mem, AvType::Table);
    let hs = p1.reserve(3);
    assert_eq!(hs, vec![0, 1, 2]);
    p2.sync_shared().unwrap();
    assert_eq!(p2.lookup(0), Err(Error::Inval), "reserved, not filled");
    p1.fill(0, a(10), None).unwrap();
    p1.release(1);
    assert_eq!(p1.fill(0, a(11), None), Err(Error::Inval), "already filled");
    p1.fill(2, a(12), None).unwrap();
    // The released index is the lowest unused one, for both.
    assert_eq!(ins(&mut p2, &[a(13)]), vec![1]);
    p1.sync_shared().unwrap();
    assert_eq!(p1.lookup(1).unwrap(), &a(13)[..]);
    p2.remove(0).unwrap();
    assert_eq!(p2.remove(0), Err(Error::Inval));
    p1.sync_shared().unwrap();
    assert_eq!(p1.lookup(0), Err(Error::Inval));
    assert_eq!(p1.remove(0), Err(Error::Inval), "removed elsewhere");
    assert_eq!(ins(&mut p1, &[a(14)]), vec![0]);
    p2.sync_shared().unwrap();
    assert_eq!(entries(&p1), entries(&p2));
}

#[test]
fn map_handles_go_stale_everywhere() {
    let mem = Arc::new(Mem::default());
    let mut p1 = proc_open(&mem, AvType::Map);
    let mut p2 = proc_open(&mem, AvType::Map);
    let old = ins(&mut p1, &[a(1)])[0];
    p2.sync_shared().unwrap();
    p2.remove(old).unwrap();
    let new = ins(&mut p2, &[a(2)])[0];
    assert_ne!(old, new);
    p1.sync_shared().unwrap();
    assert_eq!(p1.lookup(old), Err(Error::Inval));
    assert_eq!(p1.lookup(new).unwrap(), &a(2)[..]);
    assert_eq!(p1.map_addr(), p2.map_addr());
    assert_ne!(p1.map_addr(), 0);
}

#[test]
fn read_only_needs_an_existing_av_and_changes_nothing() {
    let mem = Arc::new(Mem::default());
    let ro = AvAttr {
        flags: AvFlags::READ,
        ..attr(AvType::Table)
    };
    assert_eq!(open(&Proc::new(&mem), &ro).unwrap_err(), Error::NoEnt);
    assert!(
        mem.bytes.lock().unwrap().is_empty(),
        "FI_READ creates nothing"
    );
    let mut w = proc_open(&mem, AvType::Table);
    ins(&mut w, &[a(1)]);
    let mut r = open(&Proc::new(&mem), &ro).unwrap();
    assert_eq!(r.check_writable(), Err(Error::Perm));
    assert_eq!(
        r.insert(&[a(2), a(3)], &check_addr),
        vec![Err(Error::Perm); 2]
    );
    assert_eq!(r.reserve(2), vec![FI_ADDR_NOTAVAIL; 2]);
    assert_eq!(r.fill(1, a(2), None), Err(Error::Perm));
    assert_eq!(r.remove(0), Err(Error::Perm));
    r.release(0);
    ins(&mut w, &[a(4)]);
    r.sync_shared().unwrap();
    assert_eq!(entries(&r), vec![(0, a(1)), (1, a(4))]);
    assert_eq!(w.check_writable(), Ok(()));
}

#[test]
fn openers_must_match_the_creator() {
    let mem = Arc::new(Mem::default());
    let p = Proc::new(&mem);
    let created = open(
        &p,
        &AvAttr {
            rx_ctx_bits: 4,
            map_addr: 77,
            ..attr(AvType::Map)
        },
    )
    .unwrap();
    assert_eq!(created.map_addr(), 77);
    let base = AvAttr {
        rx_ctx_bits: 4,
        ..attr(AvType::Map)
    };
    // map_addr 0 takes the segment's; the same one is fine.
    assert_eq!(open(&p, &base).unwrap().map_addr(), 77);
    let same = AvAttr {
        map_addr: 77,
        ..base.clone()
    };
    assert!(open(&p, &same).is_ok());
    let unspec = AvAttr {
        av_type: AvType::Unspec,
        ..base.clone()
    };
    assert_eq!(open(&p, &unspec).unwrap().av_type(), AvType::Map);
    for bad in [
        AvAttr {
            av_type: AvType::Table,
            ..base.clone()
        },
        AvAttr {
            rx_ctx_bits: 5,
            ..base.clone()
        },
        AvAttr {
            map_addr: 78,
            ..base.clone()
        },
    ] {
        assert_eq!(open(&p, &bad).unwrap_err(), Error::Inval, "{bad:?}");
    }
    let other_domain = SharedParams {
        domain: "tcp/eth0".into(),
        ..params()
    };
    assert_eq!(
        AvTable::open_shared(&base, p.clone(), &other_domain).unwrap_err(),
        Error::Inval
    );
    let other_format = SharedParams {
        addr_format: AddrFormat::Str,
        ..params()
    };
    assert_eq!(
        AvTable::open_shared(&base, p.clone(), &other_format).unwrap_err(),
        Error::Inval
    );
    let found = read_header(&*p).unwrap().unwrap();
    assert_eq!(params().mismatch(&found, &base), None);
    assert_eq!(other_domain.mismatch(&found, &base), Some("domain"));
    // Attribute checks come before the segment is touched.
    let empty = Arc::new(Mem::default());
    let q = Proc::new(&empty);
    for (bad, err) in [
        (
            AvAttr {
                name: Some("a/b".into()),
                ..attr(AvType::Table)
            },
            Error::Inval,
        ),
        (
            AvAttr {
                name: None,
                ..attr(AvType::Table)
            },
            Error::Inval,
        ),
        (
            AvAttr {
                rx_ctx_bits: 33,
                ..attr(AvType::Table)
            },
            Error::Inval,
        ),
        (
            AvAttr {
                flags: AvFlags::MORE,
                ..attr(AvType::Table)
            },
            Error::BadFlags,
        ),
    ] {
        assert_eq!(open(&q, &bad).unwrap_err(), err, "{bad:?}");
    }
    assert!(empty.bytes.lock().unwrap().is_empty());
}

#[test]
fn user_ids_stay_with_the_process_that_gave_them() {
    let mem = Arc::new(Mem::default());
    let mut p1 = proc_open(&mem, AvType::Table);
    let mut p2 = proc_open(&mem, AvType::Table);
    let r = p1.insert_with_user_ids(&[a(1), a(2)], &[100], &check_addr);
    assert_eq!(r, vec![Ok(0), Err(Error::Inval)], "no id for the second");
    assert_eq!(p1.reported_addr(0), 100);
    p2.sync_shared().unwrap();
    assert_eq!(p2.reported_addr(0), 0);
    assert_eq!(p2.len(), 1, "the refused address took no record");
    let uid = AvAttr {
        flags: AvFlags::AV_USER_ID,
        ..attr(AvType::Table)
    };
    let mut p3 = open(&Proc::new(&mem), &uid).unwrap();
    assert_eq!(
        p3.insert_with_user_ids(&[a(3)], &[5], &check_addr),
        vec![Err(Error::Inval)]
    );
    assert_eq!(p3.reported_addr(0), FI_ADDR_NOTAVAIL);
    p3.set_user_id(0, 9).unwrap();
    assert_eq!(p3.reported_addr(0), 9);
    p2.sync_shared().unwrap();
    assert_eq!(p2.len(), 1);
    assert_eq!(ins(&mut p2, &[a(4)]), vec![1], "ids cost no handle");
}

#[test]
fn refused_addresses_take_no_handle_anywhere() {
    let mem = Arc::new(Mem::default());
    let mut p1 = proc_open(&mem, AvType::Table);
    let mut p2 = proc_open(&mem, AvType::Table);
    let long = vec![2u8; 29];
    let r = p1.insert(&[vec![0xFF], a(1), long, a(2)], &check_addr);
    assert_eq!(r, vec![Err(Error::Inval), Ok(0), Err(Error::Inval), Ok(1)]);
    assert_eq!(ins(&mut p2, &[a(3)]), vec![2]);
}

type Step = fn(&mut AvTable) -> Result<()>;

fn all_ok(r: Vec<Result<FiAddr>>) -> Result<()> {
    r.into_iter().try_for_each(|x| x.map(|_| ()))
}

/// What a writer does in the crash tests: one commit per step. On a
/// TABLE the handles are known: the reserve gets 3 and 4, the last
/// insert reuses 1 and 4.
const SCRIPT: [Step; 7] = [
    |t| all_ok(t.insert(&[a(0), a(1)], &check_addr)),
    |t| all_ok(t.insert(&[a(2)], &check_addr)),
    |t| match t.reserve(2)[..] {
        [3, 4] => Ok(()),
        _ => Err(Error::Io),
    },
    |t| t.fill(3, a(3), None),
    |t| {
        t.release(4);
        // A dead writer's release says nothing; the caller's check does.
        t.sync_shared()
    },
    |t| t.remove(1),
    |t| all_ok(t.insert(&[a(4), a(5), a(6)], &check_addr)),
];

/// The entries after each step of [`SCRIPT`] (the first: a fresh AV), as
/// a reader sees them, and what the whole script costs a writer.
fn script_states() -> (Vec<State>, usize) {
    let mem = Arc::new(Mem::default());
    let counter = Proc::with_budget(&mem, Some(usize::MAX));
    let mut w = open(&counter, &attr(AvType::Table)).unwrap();
    let mut r = proc_open(&mem, AvType::Table);
    let mut states = vec![entries(&r)];
    for step in SCRIPT {
        step(&mut w).unwrap();
        r.sync_shared().unwrap();
        states.push(entries(&r));
    }
    let used = usize::MAX - lock(&counter.budget).unwrap_or(0);
    (states, used)
}

#[test]
fn a_writer_dying_at_any_byte_leaves_a_committed_state() {
    let (states, used) = script_states();
    for budget in 0..used {
        let mem = Arc::new(Mem::default());
        let dying = Proc::with_budget(&mem, Some(budget));
        let ran = open(&dying, &attr(AvType::Table))
            .and_then(|mut t| SCRIPT.iter().try_for_each(|step| step(&mut t)));
        assert!(ran.is_err(), "budget {budget} is too small to finish");
        assert!(dying.spent_all(), "budget {budget}");
        assert_eq!(mem.held.load(Ordering::SeqCst), 0, "lock left held");
        // A later process opens it, sees one committed state, complete,
        // and goes on inserting; a reader agrees.
        let mut next = proc_open(&mem, AvType::Table);
        let seen = entries(&next);
        assert!(states.contains(&seen), "budget {budget}: {seen:?}");
        let h = ins(&mut next, &[a(99)])[0];
        let reader = proc_open(&mem, AvType::Table);
        assert_eq!(reader.lookup(h).unwrap(), &a(99)[..]);
        assert_eq!(entries(&reader).len(), seen.len() + 1);
    }
}

/// A segment with a few entries, and the entries after each of its
/// commits (the last: now).
fn populated() -> (Arc<Mem>, Vec<State>) {
    let mem = Arc::new(Mem::default());
    let mut t = proc_open(&mem, AvType::Table);
    let mut states = vec![entries(&t)];
    ins(&mut t, &[a(0), a(1), a(2)]);
    states.push(entries(&t));
    t.remove(1).unwrap();
    states.push(entries(&t));
    ins(&mut t, &[a(3)]);
    states.push(entries(&t));
    (mem, states)
}

fn copy_of(bytes: Vec<u8>) -> Arc<Mem> {
    Arc::new(Mem {
        bytes: Mutex::new(bytes),
        held: AtomicIsize::new(0),
    })
}

/// Opens a damaged copy as a writer and as a reader: an error, or one of
/// the `allowed` states.
fn open_damaged(bytes: Vec<u8>, allowed: &[&State], what: &str) -> bool {
    let mut failed = false;
    for flags in [AvFlags::empty(), AvFlags::READ] {
        let mem = copy_of(bytes.clone());
        let at = AvAttr {
            flags,
            ..attr(AvType::Table)
        };
        match open(&Proc::new(&mem), &at) {
            Ok(t) => assert!(allowed.contains(&&entries(&t)), "{what}"),
            Err(e) => {
                assert!(
                    matches!(e, Error::Io | Error::Inval | Error::NoEnt),
                    "{what}: {e:?}"
                );
                failed = true;
            }
        }
    }
    failed
}

#[test]
fn damaged_segments_are_errors_not_panics() {
    let (mem, states) = populated();
    let good = mem.bytes.lock().unwrap().clone();
    let n = states.len();
    // Damage to the newest commit slot reads as a writer's torn commit:
    // the state before stands.
    let last_two = [&states[n - 2], &states[n - 1]];
    let used = layout::record_off(5, layout::record_len(28)) as usize;
    let mut refused = 0;
    for i in 0..used {
        let mut b = good.clone();
        b[i] ^= 0xA5;
        if open_damaged(b, &last_two, &format!("byte {i}")) {
            refused += 1;
        }
    }
    // Anywhere but in the two commit slots, damage refuses the open.
    assert_eq!(refused, used - 64, "{refused} of {used}");
    // Cut short anywhere. Within the magic, it reads as a creator that
    // died: a writer creates the AV afresh.
    let or_new = [&states[0], &states[n - 2], &states[n - 1]];
    for len in 0..used {
        open_damaged(good[..len].to_vec(), &or_new, &format!("cut at {len}"));
    }
    // Garbage runs from a fixed generator.
    let mut x: u64 = 0x1234_5678;
    for _ in 0..500 {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let start = (x >> 33) as usize % used;
        let len = 1 + (x >> 17) as usize % 64;
        let mut b = good.clone();
        for (k, byte) in b.iter_mut().skip(start).take(len).enumerate() {
            *byte = (x >> (k % 56)) as u8;
        }
        open_damaged(b, &or_new, &format!("garbage at {start}+{len}"));
    }
}

#[test]
fn damage_after_open_is_reported_and_the_last_state_kept() {
    let (mem, states) = populated();
    let want = states.last().unwrap().clone();
    let mut t = proc_open(&mem, AvType::Table);
    let mut w = proc_open(&mem, AvType::Table);
    ins(&mut w, &[a(7)]);
    // The record past the commit t has seen is damaged.
    let off = layout::record_off(5, layout::record_len(28)) as usize;
    mem.bytes.lock().unwrap()[off + 20] ^= 1;
    assert_eq!(t.sync_shared(), Err(Error::Io));
    assert_eq!(entries(&t), want);
    assert_eq!(t.insert(&[a(8)], &check_addr), vec![Err(Error::Io)]);
    assert_eq!(t.remove(0), Err(Error::Io));
    let m = Mutex::new(t);
    assert_eq!(entries(&lock_synced(&m)), want);
    // Both commit slots gone.
    mem.bytes.lock().unwrap()[128..192].fill(0);
    assert_eq!(lock(&m).sync_shared(), Err(Error::Io));
}

/// Writes `records` after the log of `mem` with a commit whose checksum
/// and chain are right: what a hostile process could do.
fn forge(mem: &Arc<Mem>, records: &[Record<'_>], commit: impl Fn(Commit) -> Commit) {
    let rl = layout::record_len(28);
    let mut b = mem.bytes.lock().unwrap();
    let (slot, c) = Commit::newest(&b[128..192]).unwrap();
    let start = layout::record_off(c.records, rl) as usize;
    let mut buf = vec![0u8; records.len() * rl];
    for (r, out) in records.iter().zip(buf.chunks_exact_mut(rl)) {
        r.encode_into(out);
    }
    if b.len() < start + buf.len() {
        b.resize(start + buf.len(), 0);
    }
    b[start..start + buf.len()].copy_from_slice(&buf);
    let next = commit(Commit {
        seq: c.seq + 1,
        records: c.records + records.len() as u64,
        chain: layout::fnv(c.chain, &buf),
    });
    let off = layout::commit_off(1 - slot) as usize;
    b[off..off + 32].copy_from_slice(&next.encode());
}

#[test]
fn hostile_commits_are_io_errors() {
    type Forge = Box<dyn Fn(Commit) -> Commit>;
    let cases: Vec<(&str, Forge)> = vec![
        (
            "too many records",
            Box::new(|c| Commit {
                records: MAX_RECORDS + 1,
                ..c
            }),
        ),
        (
            "records past the end",
            Box::new(|c| Commit {
                records: c.records + 100_000,
                ..c
            }),
        ),
        ("fewer records", Box::new(|c| Commit { records: 0, ..c })),
        ("wrong chain", Box::new(|c| Commit { chain: 1, ..c })),
    ];
    for (what, f) in cases {
        let (mem, states) = populated();
        let mut t = proc_open(&mem, AvType::Table);
        forge(&mem, &[Record::Insert(&a(50))], f);
        assert_eq!(t.sync_shared(), Err(Error::Io), "{what}");
        assert_eq!(&entries(&t), states.last().unwrap(), "{what}");
        assert!(open(&Proc::new(&mem), &attr(AvType::Table)).is_err());
    }
    // Same sequence number, other contents.
    let (mem, _) = populated();
    let mut t = proc_open(&mem, AvType::Table);
    forge(&mem, &[Record::Insert(&a(50))], |c| Commit {
        seq: c.seq - 1,
        ..c
    });
    assert_eq!(t.sync_shared(), Err(Error::Io));
}

#[test]
fn hostile_records_with_valid_checksums_stay_harmless() {
    let (mem, _) = populated();
    let mut t = proc_open(&mem, AvType::Table);
    forge(
        &mem,
        &[
            Record::Fill(0, &a(60)),
            Record::Fill(u64::MAX, &a(61)),
            Record::Remove(1 << 40),
            Record::Remove(FI_ADDR_NOTAVAIL),
            Record::Release(0),
            Record::Insert(&[0xFF]),
            Record::Insert(&[]),
            Record::Insert(&a(62)),
        ],
        |c| c,
    );
    t.sync_shared().unwrap();
    let fresh = proc_open(&mem, AvType::Table);
    assert_eq!(entries(&t), entries(&fresh));
    assert_eq!(t.find(&a(62)), fresh.find(&a(62)));
    assert!(t.find(&a(60)).is_none() && t.find(&a(61)).is_none());
}

#[test]
fn a_half_created_segment_is_created_again() {
    let mem = Arc::new(Mem::default());
    // Died with everything but the magic written.
    let dying = Proc::with_budget(&mem, Some(2 + 248));
    assert!(open(&dying, &attr(AvType::Map)).is_err());
    let ro = AvAttr {
        flags: AvFlags::READ,
        ..attr(AvType::Table)
    };
    assert_eq!(open(&Proc::new(&mem), &ro).unwrap_err(), Error::NoEnt);
    // The next creator's attributes win, not the dead one's.
    let t = proc_open(&mem, AvType::Table);
    assert_eq!(t.av_type(), AvType::Table);
    assert!(open(&Proc::new(&mem), &ro).is_ok());
}
