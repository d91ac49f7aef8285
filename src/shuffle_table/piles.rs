//! Pile files (PostgreSQL temporary files of minimal tuples) and the two passes over them: pass 1
//! sends every row to a random pile, pass 2 loads one pile at a time, shuffles it and writes it out
//! (splitting a pile too big for memory into sub-piles).

use crate::pg::error::raise;
use corgipile_ml::limits::pretty_bytes;
use corgipile_ml::prefetch::prefetch_bytes;
use corgipile_ml::shuffle::{pile_count, PileShuffler};
use pgrx::prelude::*;
use pgrx::{check_for_interrupts, PgSqlErrorCode};
use std::ffi::{c_char, CString};

use super::*;

/// Bytes at the start of a heap tuple that insertion overwrites (xmin, xmax, cid): a pile
/// record keeps the tuple's length there, so a loaded record is a heap tuple in place.
pub(super) const HEADER_SCRATCH: usize = 12;

pub(super) fn record_len(t_len: u32) -> usize {
    (t_len as usize).div_ceil(8) * 8
}

/// Most bytes one FileRead or FileWrite call moves (their length is an int before PostgreSQL 16).
pub(super) const IO_CHUNK: usize = 1 << 30;

pub(super) fn io_error(what: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_IO_ERROR,
        format!(
            "could not {what} a corgipile_shuffle pile: {}",
            std::io::Error::last_os_error()
        ),
        None,
    )
}

/// # Safety (every method of Pile, PileReader, LoadedPile and Writer)
/// Called on the backend thread, inside the transaction that created the pile or writer: the
/// temporary file, the relation and the bulk insert state belong to it (abort closes and
/// deletes them).
///
/// One pile: a PostgreSQL temporary file (`OpenTemporaryFile`: placed by temp_tablespaces,
/// counted against temp_file_limit, deleted when closed or when the transaction ends, ERROR and
/// cancel included) of records, each a heap tuple padded to 8 bytes whose first bytes hold its
/// length. Appends go through a buffer of our own that is written in one call when full.
pub(super) struct Pile {
    /// This pile's temporary file, opened by `new` and open until `close` (its methods rely on
    /// it: set nowhere else).
    pub(super) file: pg_sys::File,
    pub(super) buffer: Vec<u8>,
    /// Bytes in the file; the buffer's follow them.
    pub(super) written: u64,
    pub(super) rows: u64,
}

impl Pile {
    pub(super) fn new(buffer_bytes: usize) -> Pile {
        // SAFETY: the file is this pile's own temporary file (a virtual fd of this backend), open from
        // `new` until `close`; FFI calls on the backend thread.
        unsafe {
            Pile {
                file: pg_sys::OpenTemporaryFile(false),
                buffer: Vec::with_capacity(buffer_bytes),
                written: 0,
                rows: 0,
            }
        }
    }

    pub(super) fn bytes(&self) -> u64 {
        self.written + self.buffer.len() as u64
    }

    /// Appends one record: the tuple's length, then its bytes after the scratch header
    /// (`body`), then padding.
    pub(super) fn append(&mut self, t_len: u32, body: &[u8]) {
        // SAFETY: the file is this pile's own temporary file (a virtual fd of this backend), open from
        // `new` until `close`; FFI calls on the backend thread.
        unsafe {
            let len = record_len(t_len);
            if self.buffer.len() + len > self.buffer.capacity() {
                self.flush();
            }
            let mut header = [0u8; HEADER_SCRATCH];
            header[..4].copy_from_slice(&t_len.to_ne_bytes());
            let pad = &[0u8; 8][..len - t_len as usize];
            for part in [&header[..], body, pad] {
                if len > self.buffer.capacity() {
                    self.written += write_at(self.file, part, self.written);
                } else {
                    self.buffer.extend_from_slice(part);
                }
            }
            self.rows += 1;
        }
    }

    pub(super) fn flush(&mut self) {
        // SAFETY: the file is this pile's own temporary file (a virtual fd of this backend), open from
        // `new` until `close`; FFI calls on the backend thread.
        unsafe {
            self.written += write_at(self.file, &self.buffer, self.written);
            self.buffer.clear();
        }
    }

    /// Ends appending: the last records to the file, the write buffer freed.
    pub(super) fn finish(&mut self) {
        self.flush();
        self.buffer = Vec::new();
    }

    /// Fills `to` from the file at `offset` (after `finish`).
    pub(super) fn read_at(&self, to: &mut [u8], offset: u64) {
        // SAFETY: the file is this pile's own temporary file (a virtual fd of this backend), open from
        // `new` until `close`; FFI calls on the backend thread.
        unsafe {
            let mut offset = offset;
            for chunk in to.chunks_mut(IO_CHUNK) {
                let n = pg_sys::FileRead(
                    self.file,
                    chunk.as_mut_ptr().cast(),
                    chunk.len() as _,
                    offset as _,
                    0,
                );
                if n < 0 || n as usize != chunk.len() {
                    io_error("read back");
                }
                offset += chunk.len() as u64;
            }
        }
    }

    /// Deletes the file.
    pub(super) fn close(self) {
        // SAFETY: the file is this pile's own temporary file (a virtual fd of this backend), open from
        // `new` until `close`; FFI calls on the backend thread.
        unsafe {
            pg_sys::FileClose(self.file);
        }
    }
}

/// Writes `bytes` at `offset`; returns how many (all of them, or an ERROR).
///
/// # Safety
/// `file` is an open temporary file of this transaction; backend thread.
pub(super) unsafe fn write_at(file: pg_sys::File, bytes: &[u8], offset: u64) -> u64 {
    let mut done = 0u64;
    for chunk in bytes.chunks(IO_CHUNK) {
        // FileWrite raises the ERROR itself when temp_file_limit would be exceeded.
        let n = pg_sys::FileWrite(
            file,
            chunk.as_ptr() as *mut _,
            chunk.len() as _,
            (offset + done) as _,
            0,
        );
        if n < 0 || n as usize != chunk.len() {
            io_error("write");
        }
        done += chunk.len() as u64;
    }
    done
}

/// Reads a pile's records in order through a buffer (to split a pile too large to load).
pub(super) struct PileReader<'a> {
    pub(super) pile: &'a Pile,
    pub(super) buffer: Vec<u8>,
    /// File offset of `buffer[0]`.
    pub(super) at: u64,
    pub(super) pos: usize,
}

impl<'a> PileReader<'a> {
    pub(super) fn new(pile: &'a Pile, buffer_bytes: usize) -> PileReader<'a> {
        PileReader {
            pile,
            buffer: Vec::with_capacity(buffer_bytes),
            at: 0,
            pos: 0,
        }
    }

    /// Makes at least `n` unread bytes available (the file has them: records are whole).
    pub(super) fn fill(&mut self, n: usize) {
        if self.buffer.len() - self.pos >= n {
            return;
        }
        self.buffer.drain(..self.pos);
        self.at += self.pos as u64;
        self.pos = 0;
        if self.buffer.capacity() < n && self.buffer.try_reserve_exact(n).is_err() {
            raise(
                PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
                "out of memory for a corgipile_shuffle pile",
                None,
            );
        }
        let have = self.buffer.len();
        let left = self.pile.written - self.at - have as u64;
        let take = (self.buffer.capacity() - have).min(left as usize);
        self.buffer.resize(have + take, 0);
        self.pile
            .read_at(&mut self.buffer[have..], self.at + have as u64);
        if self.buffer.len() < n {
            io_error("read back");
        }
    }

    /// The next record's tuple length and body (its bytes after the scratch header), or None.
    pub(super) fn next(&mut self) -> Option<(u32, &[u8])> {
        if self.at + self.pos as u64 >= self.pile.written {
            return None;
        }
        self.fill(HEADER_SCRATCH);
        let t_len = u32::from_ne_bytes(
            self.buffer[self.pos..self.pos + 4]
                .try_into()
                .unwrap_or_default(),
        );
        let len = record_len(t_len);
        self.fill(len);
        let body = &self.buffer[self.pos + HEADER_SCRATCH..self.pos + t_len as usize];
        self.pos += len;
        Some((t_len, body))
    }
}

/// Pass 2's memory, reused from pile to pile: one pile's records and a heap tuple for each.
#[derive(Default)]
pub(super) struct LoadedPile {
    pub(super) words: Vec<u64>,
    pub(super) rows: Vec<pg_sys::HeapTupleData>,
    pub(super) order: Vec<u32>,
}

impl LoadedPile {
    /// Reads all of `pile` (after `finish`) into memory.
    pub(super) fn load(&mut self, pile: &Pile) {
        // SAFETY: the file is this pile's own temporary file (a virtual fd of this backend), open from
        // `new` until `close`; FFI calls on the backend thread.
        unsafe {
            let bytes = pile.written as usize;
            self.words.clear();
            self.rows.clear();
            self.order.clear();
            if self.words.try_reserve_exact(bytes / 8).is_err()
                || self.rows.try_reserve_exact(pile.rows as usize).is_err()
                || self.order.try_reserve_exact(pile.rows as usize).is_err()
            {
                raise(
                    PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
                    "out of memory for a corgipile_shuffle pile",
                    None,
                );
            }
            // SAFETY of the set_len: read_at fills every byte (or raises), so nothing
            // uninitialized is ever read; records are padded to 8 bytes, so bytes / 8 is exact.
            let base = self.words.as_mut_ptr().cast::<u8>();
            pile.read_at(std::slice::from_raw_parts_mut(base, bytes), 0);
            self.words.set_len(bytes / 8);
            let mut offset = 0usize;
            while offset < bytes {
                let t_len = u32::from_ne_bytes(
                    std::slice::from_raw_parts(base.add(offset), 4)
                        .try_into()
                        .unwrap_or_default(),
                );
                let mut tuple = pg_sys::HeapTupleData {
                    t_len,
                    ..Default::default()
                };
                tuple.t_data = base.add(offset).cast();
                self.rows.push(tuple);
                offset += record_len(t_len.max(HEADER_SCRATCH as u32));
            }
            self.order.extend(0..self.rows.len() as u32);
        }
    }
}

/// A heap tuple's bytes after the scratch header (all a pile record keeps besides the length).
///
/// # Safety
/// `tuple` is a valid heap tuple of at least HEADER_SCRATCH bytes; the slice borrows its memory
/// and must not outlive it.
pub(super) unsafe fn tuple_body<'a>(tuple: pg_sys::HeapTuple) -> &'a [u8] {
    std::slice::from_raw_parts(
        (*tuple).t_data.cast::<u8>().add(HEADER_SCRATCH),
        (*tuple).t_len as usize - HEADER_SCRATCH,
    )
}

/// Pass 1: `select`'s rows spread over `n` new piles. `whole_table`: the table `select` reads
/// every column of, when its stored tuples are the rows (`rows_as_stored`): read with a heap
/// scan of our own, which gives the same tuples in the same order as the query would, without
/// the executor's slot per row.
pub(super) fn split_into_piles(
    select: &str,
    whole_table: Option<pg_sys::Oid>,
    n: usize,
    shuffler: &mut PileShuffler,
    memory: u64,
) -> Vec<Pile> {
    // SAFETY: FFI calls, and reads of what they return, on the backend thread inside the transaction
    // of the SQL call (every caller is a SQL function); no raw pointer comes from the caller.
    unsafe {
        let mut piles: Vec<Pile> = (0..n).map(|_| Pile::new(pile_buffer(memory, n))).collect();
        if let Some(relid) = whole_table {
            split_table(relid, &mut piles, shuffler);
            return piles;
        }
        let mut receiver = PileReceiver {
            dest: pg_sys::DestReceiver {
                receiveSlot: Some(receive_slot),
                rStartup: Some(receiver_startup),
                rShutdown: Some(receiver_noop),
                rDestroy: Some(receiver_noop),
                mydest: pg_sys::CommandDest::DestNone,
            },
            piles: &mut piles,
            shuffler,
            bytes_since_check: 0,
        };
        let sql =
            CString::new(select).unwrap_or_else(|_| bad("a name contains a NUL byte".into(), ""));
        // A synchronized scan would start wherever another scan is: the same seed must give the
        // same order, so this scan starts at the first page (as a plain SELECT does when alone).
        let nest = pg_sys::NewGUCNestLevel();
        pg_sys::set_config_option(
            c"synchronize_seqscans".as_ptr(),
            c"off".as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_SAVE,
            true,
            0,
            false,
        );
        let raw = pg_sys::pg_parse_query(sql.as_ptr());
        let query = crate::pg::compat::analyze_and_rewrite(
            (*(*raw).elements).ptr_value.cast(),
            sql.as_ptr(),
        );
        // No parallel plan: rows must arrive in one reproducible order.
        let stmt = pg_sys::pg_plan_query(
            (*(*query).elements).ptr_value.cast(),
            sql.as_ptr(),
            0,
            std::ptr::null_mut(),
        );
        let qd = pg_sys::CreateQueryDesc(
            stmt,
            sql.as_ptr(),
            pg_sys::GetActiveSnapshot(),
            std::ptr::null_mut(),
            &mut receiver.dest,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        );
        pg_sys::ExecutorStart(qd, 0);
        crate::pg::compat::executor_run_all(qd);
        pg_sys::ExecutorFinish(qd);
        pg_sys::ExecutorEnd(qd);
        pg_sys::FreeQueryDesc(qd);
        pg_sys::AtEOXact_GUC(true, nest);
        piles
    }
}

/// A row (a heap tuple's length and `tuple_body`) appended to a random one of `piles`; cancel is
/// answered every ~1 MB of rows (`bytes_since_check` counts them).
pub(super) fn to_random_pile(
    piles: &mut [Pile],
    shuffler: &mut PileShuffler,
    t_len: u32,
    body: &[u8],
    bytes_since_check: &mut u64,
) {
    let k = shuffler.pile(piles.len());
    piles[k].append(t_len, body);
    *bytes_since_check += t_len as u64;
    if *bytes_since_check > 1 << 20 {
        *bytes_since_check = 0;
        check_for_interrupts!();
    }
}

/// Whether `relid`'s stored tuples are exactly the rows of `SELECT * FROM relid` as the caller
/// sees them, so that pass 1 may copy them from the pages: a heap table without inheritance
/// children (the query reads theirs too) that the caller may read whole (SELECT on the table,
/// no row-level security in force), with no dropped column (`*` leaves it out), no column
/// added with a default since rows were written (older tuples lack it: the query fills it in)
/// and no virtual generated column (PostgreSQL 18 stores NULL: the query computes it); and no
/// executor permission hook loaded (sepgsql decides, pgaudit logs, through it: only the query
/// calls it). Anything else (partitioned tables, materialized views, column privileges) runs
/// the query.
pub(super) fn rows_as_stored(relid: pg_sys::Oid) -> bool {
    // SAFETY: FFI calls, and reads of what they return, on the backend thread inside the transaction
    // of the SQL call (every caller is a SQL function); no raw pointer comes from the caller.
    unsafe {
        // SAFETY (every call here): catalog and relcache lookups of a locked relation on the
        // backend thread; the relation is opened and closed with the lock already held.
        // The hook is read by value, once (a plain load of the backend's global).
        let perms_hook = std::ptr::addr_of!(pg_sys::ExecutorCheckPerms_hook).read();
        if perms_hook.is_some()
            || pg_sys::get_rel_relkind(relid) as u8 != pg_sys::RELKIND_RELATION
            || pg_sys::pg_class_aclcheck(
                relid,
                pg_sys::GetUserId(),
                pg_sys::ACL_SELECT as pg_sys::AclMode,
            ) != pg_sys::AclResult::ACLCHECK_OK
            || pg_sys::check_enable_rls(relid, pg_sys::InvalidOid, true)
                != pg_sys::CheckEnableRlsResult::RLS_NONE as i32
        {
            return false;
        }
        let rel = pg_sys::table_open(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let plain_columns = crate::pg::compat::tuple_desc_attrs((*rel).rd_att)
            .iter()
            .all(|a| !a.attisdropped && !a.atthasmissing && a.attgenerated != b'v' as c_char);
        // relhassubclass may stay set after the last child is dropped: then the query runs.
        let heap_without_children =
            (*(*rel).rd_rel).relam == pg_sys::HEAP_TABLE_AM_OID && !(*(*rel).rd_rel).relhassubclass;
        pg_sys::table_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        plain_columns && heap_without_children
    }
}

/// Pass 1 over a table whose tuples are its rows (`rows_as_stored`): a sequential heap scan
/// from the first page, in the query's snapshot, each visible tuple to a random pile.
///
/// # Safety
/// Backend thread, in a transaction with an active snapshot; `relid` is locked.
unsafe fn split_table(relid: pg_sys::Oid, piles: &mut [Pile], shuffler: &mut PileShuffler) {
    // SAFETY: as for rows_as_stored; the scan is ended and the relation closed below, or, on
    // ERROR, released by the transaction's abort (buffer pins, relcache reference) like any
    // executor scan's.
    let rel = pg_sys::table_open(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
    // Not SO_ALLOW_SYNC: a synchronized scan would start wherever another scan is, and the
    // same seed must give the same order (as the query path, which turns it off).
    let flags = pg_sys::ScanOptions::SO_TYPE_SEQSCAN
        | pg_sys::ScanOptions::SO_ALLOW_STRAT
        | pg_sys::ScanOptions::SO_ALLOW_PAGEMODE;
    let scan = pg_sys::heap_beginscan(
        rel,
        pg_sys::GetActiveSnapshot(),
        0,
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        flags,
    );
    let mut bytes_since_check = 0u64;
    loop {
        // SAFETY: the returned tuple points into the scan's pinned page, valid until the next
        // call; its bytes are copied into the pile before that.
        let tuple = pg_sys::heap_getnext(scan, pg_sys::ScanDirection::ForwardScanDirection);
        if tuple.is_null() {
            break;
        }
        to_random_pile(
            piles,
            shuffler,
            (*tuple).t_len,
            tuple_body(tuple),
            &mut bytes_since_check,
        );
    }
    pg_sys::heap_endscan(scan);
    pg_sys::table_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
}

/// The write buffer of each of `n` piles: together at most a quarter of the memory bound.
pub(super) fn pile_buffer(memory: u64, n: usize) -> usize {
    ((memory / 4) / n.max(1) as u64).clamp(8192, 256 * 1024) as usize
}

/// Pass 2 of one pile: shuffled in memory and appended to the table, or, when it is larger
/// than `memory`, split into sub-piles first.
#[allow(clippy::too_many_arguments)]
pub(super) fn shuffle_pile(
    mut pile: Pile,
    path: u64,
    shuffler: &PileShuffler,
    memory: u64,
    max_piles: usize,
    loaded: &mut LoadedPile,
    writer: &mut Writer,
    depth: u32,
) {
    // SAFETY: FFI calls, and reads of what they return, on the backend thread inside the transaction
    // of the SQL call (every caller is a SQL function); no raw pointer comes from the caller.
    unsafe {
        check_for_interrupts!();
        pile.finish();
        // In memory a pile is its records plus one HeapTupleData and one position per row.
        let row_bytes = (std::mem::size_of::<pg_sys::HeapTupleData>() + 4) as u64;
        let loaded_bytes = pile.bytes() + pile.rows * row_bytes;
        if loaded_bytes > memory {
            if pile.rows <= 1 || depth >= 8 {
                raise(
                    PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                    format!(
                        "a row of {} does not fit in corgipile_shuffle's memory ({})",
                        pretty_bytes(pile.bytes()),
                        pretty_bytes(memory)
                    ),
                    Some("Give a larger \"memory\" (up to corgipile.max_buffer_memory).".into()),
                );
            }
            // The pile's memory is free while it is split: drop it, so the split stays in bound.
            *loaded = LoadedPile::default();
            let n = pile_count(loaded_bytes, memory, max_piles).max(2);
            let mut sub_shuffler = shuffler.subpiles(path);
            let mut subs: Vec<Pile> = (0..n).map(|_| Pile::new(pile_buffer(memory, n))).collect();
            {
                let mut reader = PileReader::new(&pile, (memory / 4) as usize);
                let mut bytes_since_check = 0u64;
                while let Some((t_len, body)) = reader.next() {
                    to_random_pile(
                        &mut subs,
                        &mut sub_shuffler,
                        t_len,
                        body,
                        &mut bytes_since_check,
                    );
                }
            }
            pile.close();
            for (k, sub) in subs.into_iter().enumerate() {
                // Sub-pile streams: bit 63 set (top-level piles are 0..MAX_PILES), the rest a hash
                // of the parent and the index, so no two piles share a stream.
                let sub_path = (path.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
                    ^ (k as u64 + 1).wrapping_mul(0xc2b2_ae3d_27d4_eb4f))
                    | 1 << 63;
                shuffle_pile(
                    sub,
                    sub_path,
                    shuffler,
                    memory,
                    max_piles,
                    loaded,
                    writer,
                    depth + 1,
                );
            }
            return;
        }
        loaded.load(&pile);
        pile.close();
        // Shuffle 4-byte positions (they stay in cache), not the rows themselves.
        shuffler.shuffle_pile(path, &mut loaded.order);
        let (rows, order) = (&mut loaded.rows, &loaded.order);
        for k in 0..order.len() {
            // The rows are scattered over the pile's memory: start loading their headers sixteen
            // rows ahead (addresses known from the order alone) and their data eight ahead.
            if let Some(&far) = order.get(k + 16) {
                prefetch_bytes(rows.as_ptr().wrapping_add(far as usize).cast(), 24);
            }
            if let Some(&ahead) = order.get(k + 8) {
                let ahead = &rows[ahead as usize];
                prefetch_bytes(ahead.t_data.cast(), ahead.t_len as usize);
            }
            writer.insert(&mut rows[order[k] as usize]);
        }
        // The rows live in `loaded`, which the next pile reuses: they must be in the table first.
        writer.flush();
    }
}
