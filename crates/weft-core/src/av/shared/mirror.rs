//! A process's view of a named AV: the local table kept equal to the
//! segment's log, and the one way the log grows.

use std::sync::Arc;

use super::layout::{
    commit_off, fnv, record_off, Commit, Record, SharedHeader, COMMIT_LEN, COMMIT_OFF, HEADER_LEN,
    MAX_RECORDS,
};
use super::{Segment, SegmentLock, Validate};
use crate::addr::{FiAddr, FI_ADDR_NOTAVAIL};
use crate::av::AvTable;
use crate::{Error, Result};

/// Records read per positional read while catching up.
const CHUNK_RECORDS: u64 = 1024;

/// How often a reader retries when both commit slots read as invalid: a
/// slot can only be torn while a writer rewrites it, so only a writer
/// committing twice during one read tears both.
const COMMIT_READ_TRIES: usize = 8;

/// The segment side of a shared [`AvTable`]: where it is, and how far the
/// table has replayed its log.
#[derive(Debug, Clone)]
pub(crate) struct Mirror {
    seg: Arc<dyn Segment>,
    read_only: bool,
    record_len: usize,
    max_addr_len: u32,
    map_addr: u64,
    validate: Validate,
    /// The commit the table reflects, and the slot it was read from.
    seq: u64,
    slot: usize,
    /// Records replayed, and the chain hash over them.
    records: u64,
    chain: u64,
    /// The last commit refused as damaged: while it stays the newest,
    /// refusing it again costs one read, not a re-read of its records.
    refused: Option<Commit>,
}

impl Mirror {
    pub(super) fn new(
        seg: Arc<dyn Segment>,
        read_only: bool,
        header: &SharedHeader,
        validate: Validate,
    ) -> Mirror {
        Mirror {
            seg,
            read_only,
            record_len: super::layout::record_len(header.max_addr_len),
            max_addr_len: header.max_addr_len,
            map_addr: header.map_addr,
            validate,
            seq: 0,
            slot: 0,
            records: 0,
            chain: super::layout::CHAIN_START,
            refused: None,
        }
    }

    pub(super) fn read_only(&self) -> bool {
        self.read_only
    }

    pub(super) fn map_addr(&self) -> u64 {
        self.map_addr
    }

    pub(super) fn max_addr_len(&self) -> usize {
        self.max_addr_len as usize
    }

    fn newest_commit(&self) -> Result<(usize, Commit)> {
        let mut slots = [0u8; 2 * COMMIT_LEN];
        for _ in 0..COMMIT_READ_TRIES {
            self.seg.read_at(&mut slots, COMMIT_OFF)?;
            if let Some(found) = Commit::newest(&slots) {
                return Ok(found);
            }
            std::thread::yield_now();
        }
        Err(Error::Io)
    }

    /// Brings `table` up to the newest commit. `table` must not carry this
    /// mirror (it is taken out while it replays). `Io` for a damaged
    /// segment; the table then keeps the last state it verified.
    pub(super) fn sync(&mut self, table: &mut AvTable) -> Result<()> {
        let (slot, c) = self.newest_commit()?;
        if self.refused == Some(c) {
            return Err(Error::Io);
        }
        let r = self.catch_up(table, slot, c);
        if r.is_err() {
            self.refused = Some(c);
        }
        r
    }

    fn catch_up(&mut self, table: &mut AvTable, slot: usize, c: Commit) -> Result<()> {
        if c.seq == self.seq {
            if c.records != self.records || c.chain != self.chain {
                return Err(Error::Io);
            }
            self.slot = slot;
            return Ok(());
        }
        if c.seq < self.seq || c.records < self.records || c.records > MAX_RECORDS {
            return Err(Error::Io);
        }
        let rl = self.record_len;
        if self.seg.size()? < record_off(c.records, rl) {
            return Err(Error::Io);
        }
        // Verify and decode everything new before touching the table, so
        // that a damaged log is refused whole. Catching up on a long log
        // reads it twice rather than holding it all in memory.
        let first = self.records;
        let single = c.records - first <= CHUNK_RECORDS;
        let mut chain = self.chain;
        let mut kept = Vec::new();
        let mut at = first;
        while at < c.records {
            let n = (c.records - at).min(CHUNK_RECORDS);
            let buf = self.read_records(at, n)?;
            for rec in buf.chunks_exact(rl) {
                Record::decode(rec, self.max_addr_len)?;
            }
            chain = fnv(chain, &buf);
            if single {
                kept = buf;
            }
            at += n;
        }
        if chain != c.chain {
            return Err(Error::Io);
        }
        let mut at = first;
        while at < c.records {
            let n = (c.records - at).min(CHUNK_RECORDS);
            let buf = if single {
                std::mem::take(&mut kept)
            } else {
                self.read_records(at, n)?
            };
            for rec in buf.chunks_exact(rl) {
                // Checked above; only a segment rewritten behind the
                // protocol's back differs now, and then the table stays a
                // prefix of what it read.
                let r = Record::decode(rec, self.max_addr_len)?;
                let _ = apply(table, r, None, self.validate);
                self.records += 1;
                self.chain = fnv(self.chain, rec);
            }
            at += n;
        }
        if self.chain != c.chain {
            return Err(Error::Io);
        }
        self.seq = c.seq;
        self.slot = slot;
        Ok(())
    }

    fn read_records(&self, at: u64, n: u64) -> Result<Vec<u8>> {
        let len = usize::try_from(n).map_err(|_| Error::Io)? * self.record_len;
        let mut buf = vec![0u8; len];
        self.seg
            .read_at(&mut buf, record_off(at, self.record_len))?;
        Ok(buf)
    }

    /// Appends `records` (each with the user id this process gives it) to
    /// the log and applies them to `table`, returning one outcome per
    /// record.
    ///
    /// Under the writer lock: catch up, write the records past the last
    /// commit, then publish them with a commit in the other slot. A writer
    /// dying anywhere before that last write leaves the old commit in
    /// force (its records are past it, and the next writer overwrites
    /// them); dying during it leaves a torn slot that fails its check, so
    /// again the old commit stands.
    pub(super) fn append(
        &mut self,
        table: &mut AvTable,
        records: &[(Record<'_>, Option<u64>)],
    ) -> Result<Vec<Result<FiAddr>>> {
        if self.read_only {
            return Err(Error::Perm);
        }
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let seg = self.seg.clone();
        let _lock = SegmentLock::take(&*seg, true)?;
        self.sync(table)?;
        let n = records.len() as u64;
        let total = self.records + n;
        if total > MAX_RECORDS {
            return Err(Error::NoSpc);
        }
        let rl = self.record_len;
        let mut buf = vec![0u8; records.len() * rl];
        for ((r, _), out) in records.iter().zip(buf.chunks_exact_mut(rl)) {
            r.encode_into(out);
        }
        let off = record_off(self.records, rl);
        let end = off + buf.len() as u64;
        let size = self.seg.size()?;
        if size < end {
            // Doubling keeps growth amortised; the cap is the largest log.
            let cap = record_off(MAX_RECORDS, rl);
            self.seg
                .set_len(end.max(size.saturating_mul(2).min(cap)).max(HEADER_LEN))?;
        }
        self.seg.write_at(&buf, off)?;
        let commit = Commit {
            seq: self.seq + 1,
            records: total,
            chain: fnv(self.chain, &buf),
        };
        let slot = 1 - self.slot;
        self.seg.write_at(&commit.encode(), commit_off(slot))?;
        // Published: these are the log's next records, in every process.
        let out = records
            .iter()
            .map(|&(r, uid)| apply(table, r, uid, self.validate))
            .collect();
        self.seq = commit.seq;
        self.slot = slot;
        self.records = total;
        self.chain = commit.chain;
        Ok(out)
    }
}

/// Replays one record on the local table. Every process replays the same
/// records in the same order on a table opened with the same type and
/// receive-context bits, so every outcome — and every handle — is the
/// same everywhere. `uid` is this process's own per-insert user id, which
/// never changes the outcome (callers refuse ids where the table would).
fn apply(
    table: &mut AvTable,
    r: Record<'_>,
    uid: Option<u64>,
    validate: Validate,
) -> Result<FiAddr> {
    match r {
        Record::Insert(a) => {
            let addrs = [a.to_vec()];
            let mut res = match uid {
                Some(id) => table.insert_with_user_ids(&addrs, &[id], &validate),
                None => table.insert(&addrs, &validate),
            };
            res.pop().unwrap_or(Err(Error::Io))
        }
        Record::Reserve => table
            .reserve(1)
            .first()
            .copied()
            .filter(|&h| h != FI_ADDR_NOTAVAIL)
            .ok_or(Error::NoSpc),
        Record::Fill(h, a) => table.fill(h, a.to_vec(), uid).map(|()| h),
        Record::Release(h) => {
            table.release(h);
            Ok(h)
        }
        Record::Remove(h) => table.remove(h).map(|()| h),
    }
}
