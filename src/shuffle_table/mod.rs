//! corgipile_shuffle: a full, uniform shuffle of a table into a new table, in two sequential
//! passes and memory bounded by one pile (the pile shuffle, Rao's algorithm; see
//! `corgipile_ml::shuffle::PileShuffler`), instead of `ORDER BY random()`'s external sort.
//!
//! Pass 1 runs `SELECT cols FROM source` through the executor (privileges, row-level security
//! and the statement's snapshot as for any query) into a receiver that appends each row, as a
//! minimal tuple, to one of M piles: PostgreSQL temporary files (`BufFile`), so
//! temp_tablespaces and temp_file_limit apply and an ERROR or cancel deletes them. Pass 2
//! reads one pile at a time into memory, shuffles it and appends it to the new table with the
//! bulk insert path, as CREATE TABLE AS does. A pile larger than the memory bound is split
//! again into sub-piles, never loaded whole.

use crate::catalog::check_writable;
use crate::pg::error::raise;
use crate::pg::guc::max_buffer_bytes;
use crate::pipeline::decode::ParamsArg;
use crate::request::query::{qualified_name, quote_ident, relation_name};
use crate::request::random_seed;
use corgipile_ml::limits::pretty_bytes;
use corgipile_ml::params::parse_bytes;
use corgipile_ml::prefetch::prefetch_bytes;
use corgipile_ml::shuffle::{pile_count, PileShuffler};
use pgrx::prelude::*;
use pgrx::{check_for_interrupts, pg_guard, PgMemoryContexts, PgSqlErrorCode};
use std::ffi::{CStr, CString};

const KEYS: [&str; 3] = ["seed", "memory", "columns"];
/// Most piles one pass writes (each open temporary file buffers one 8 kB block).
const MAX_PILES: usize = 4096;

struct ShuffleParams {
    seed: u64,
    memory: u64,
    columns: Option<Vec<String>>,
}

fn bad(message: String, hint: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        message,
        Some(hint.into()),
    )
}

fn parse_params(json: &serde_json::Value) -> ShuffleParams {
    let serde_json::Value::Object(map) = json else {
        bad(
            "params must be a JSON object".into(),
            "For example '{\"seed\": 1, \"memory\": \"256MB\"}'.",
        )
    };
    let limit = max_buffer_bytes();
    let mut p = ShuffleParams {
        seed: random_seed(),
        memory: limit,
        columns: None,
    };
    for (key, value) in map {
        match key.as_str() {
            "seed" => {
                p.seed = match value.as_u64() {
                    Some(s) if s <= i64::MAX as u64 => s,
                    _ => bad(
                        format!(
                            "\"seed\" must be an integer from 0 to {}, got {value}",
                            i64::MAX
                        ),
                        "Same seed and same data give the same order.",
                    ),
                }
            }
            "memory" => {
                let bytes = match value {
                    serde_json::Value::String(s) => parse_bytes(s).unwrap_or_else(|e| {
                        bad(
                            format!("\"memory\": {e}"),
                            "A size such as \"64MB\" or \"1GB\".",
                        )
                    }),
                    serde_json::Value::Number(n) => n.as_u64().unwrap_or_else(|| {
                        bad(
                            format!("\"memory\" must be a size, got {n}"),
                            "A size such as \"64MB\" or \"1GB\" (a number is bytes).",
                        )
                    }),
                    other => bad(
                        format!("\"memory\" must be a size, got {other}"),
                        "A size such as \"64MB\" or \"1GB\".",
                    ),
                };
                if bytes < 1 << 20 || bytes > limit {
                    raise(
                        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                        format!("\"memory\" must be from 1 MB to corgipile.max_buffer_memory ({}), got {}", pretty_bytes(limit), pretty_bytes(bytes)),
                        Some("The memory of one pile in pass 2; the default is corgipile.max_buffer_memory.".into()),
                    );
                }
                p.memory = bytes;
            }
            "columns" => {
                let names: Option<Vec<String>> = value
                    .as_array()
                    .and_then(|a| a.iter().map(|c| c.as_str().map(str::to_owned)).collect());
                match names {
                    Some(n) if !n.is_empty() => p.columns = Some(n),
                    _ => bad(
                        format!(
                            "\"columns\" must be a non-empty array of column names, got {value}"
                        ),
                        "For example '{\"columns\": [\"id\", \"features\", \"label\"]}'.",
                    ),
                }
            }
            other => raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("unknown parameter \"{other}\" for corgipile_shuffle"),
                Some(format!("Valid parameters are: {}.", KEYS.join(", "))),
            ),
        }
    }
    p
}

/// Creates table `target` holding every row of `source` visible to this statement exactly once,
/// in a uniformly random order; returns the number of rows.
#[pg_extern(volatile, parallel_unsafe)]
fn corgipile_shuffle(
    source: crate::pipeline::decode::RelationArg,
    target: &str,
    params: default!(ParamsArg, "'{}'"),
) -> i64 {
    let p = parse_params(&params.0);
    check_writable(c"corgipile_shuffle()");
    // SAFETY: catalog lookups, SPI and executor calls on the backend thread inside a
    // transaction; on ERROR the abort drops the new table and deletes the temporary files.
    unsafe {
        let relid = source.oid();
        let relname = relation_name(relid);
        check_source(relid, &relname);
        let target_sql = target_name(target);
        let columns = match &p.columns {
            Some(cols) => cols
                .iter()
                .map(|c| checked_column(relid, &relname, c))
                .collect::<Vec<_>>()
                .join(", "),
            None => "*".to_owned(),
        };
        let select = format!("SELECT {columns} FROM {}", qualified_name(relid));
        // The new table has the query's columns and types, as CREATE TABLE AS gives them;
        // CREATE privilege on its schema is checked here, as the caller.
        Spi::run(&format!(
            "CREATE TABLE {target_sql} USING heap AS {select} WITH NO DATA"
        ))
        .unwrap_or_else(|e| {
            raise(
                PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                format!("could not create {target_sql}: {e}"),
                None,
            )
        });
        let target_rv = range_var(target);
        let target_relid = pg_sys::RangeVarGetRelidExtended(
            target_rv,
            pg_sys::NoLock as i32,
            0,
            None,
            std::ptr::null_mut(),
        );
        let data_bytes = source_bytes(relid);
        // Each open pile buffers one block in memory: keep that within a quarter of the bound.
        let max_piles =
            ((p.memory / 4) / pg_sys::BLCKSZ as u64).clamp(1, MAX_PILES as u64) as usize;
        let piles = pile_count(data_bytes, p.memory, max_piles);
        let mut shuffler = PileShuffler::new(p.seed);
        let pass1 = split_into_piles(&select, piles, &mut shuffler, p.memory);
        let mut writer = Writer::open(target_relid);
        let mut loaded = LoadedPile::default();
        for (k, pile) in pass1.into_iter().enumerate() {
            shuffle_pile(
                pile,
                k as u64,
                &shuffler,
                p.memory,
                max_piles,
                &mut loaded,
                &mut writer,
                0,
            );
        }
        writer.close()
    }
}

/// Sources a query can read as a table: plain, partitioned and materialized.
unsafe fn check_source(relid: pg_sys::Oid, relname: &str) {
    let kind = pg_sys::get_rel_relkind(relid) as u8;
    if !matches!(
        kind,
        pg_sys::RELKIND_RELATION | pg_sys::RELKIND_MATVIEW | pg_sys::RELKIND_PARTITIONED_TABLE
    ) {
        let what = match kind {
            pg_sys::RELKIND_VIEW => "a view",
            pg_sys::RELKIND_FOREIGN_TABLE => "a foreign table",
            pg_sys::RELKIND_SEQUENCE => "a sequence",
            pg_sys::RELKIND_INDEX | pg_sys::RELKIND_PARTITIONED_INDEX => "an index",
            _ => "not a table",
        };
        raise(
            PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE,
            format!("cannot shuffle {relname}: it is {what}"),
            Some(
                "corgipile_shuffle copies a table; CREATE TABLE ... AS SELECT from it first."
                    .into(),
            ),
        );
    }
    if kind == pg_sys::RELKIND_PARTITIONED_TABLE {
        let lock = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
        for leaf in crate::exec::block_shuffle::all_inheritors(relid, lock) {
            if pg_sys::get_rel_relkind(leaf) as u8 == pg_sys::RELKIND_FOREIGN_TABLE {
                raise(
                    PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                    format!(
                        "cannot shuffle {relname}: its partition {} is a foreign table",
                        crate::request::query::relation_name(leaf)
                    ),
                    Some("corgipile_shuffle copies the rows of local tables only.".into()),
                );
            }
        }
    }
}

unsafe fn range_var(name: &str) -> *mut pg_sys::RangeVar {
    let c = CString::new(name).unwrap_or_else(|_| {
        bad(
            "the target name contains a NUL byte".into(),
            "Name a new table, e.g. 'public.t_shuffled'.",
        )
    });
    // Parses a possibly schema-qualified, possibly quoted name, as regclass input does.
    pg_sys::makeRangeVarFromNameList(crate::pg::compat::qualified_name_list(c.as_ptr()))
}

/// The target as quoted SQL; an existing relation of that name is an ERROR.
unsafe fn target_name(name: &str) -> String {
    let rv = range_var(name);
    let existing = pg_sys::RangeVarGetRelidExtended(
        rv,
        pg_sys::NoLock as i32,
        pg_sys::RVROption::RVR_MISSING_OK,
        None,
        std::ptr::null_mut(),
    );
    if existing != pg_sys::InvalidOid {
        raise(
            PgSqlErrorCode::ERRCODE_DUPLICATE_TABLE,
            format!("relation \"{name}\" already exists"),
            Some("corgipile_shuffle creates its target table: name a new one, or DROP TABLE the old one first.".into()),
        );
    }
    let rel = CStr::from_ptr((*rv).relname).to_string_lossy().into_owned();
    match (*rv).schemaname.is_null() {
        true => quote_ident(&rel),
        false => format!(
            "{}.{}",
            quote_ident(&CStr::from_ptr((*rv).schemaname).to_string_lossy()),
            quote_ident(&rel)
        ),
    }
}

unsafe fn checked_column(relid: pg_sys::Oid, relname: &str, column: &str) -> String {
    let c = CString::new(column).unwrap_or_else(|_| {
        bad(
            "a column name contains a NUL byte".into(),
            "Name columns of the source table.",
        )
    });
    if pg_sys::get_attnum(relid, c.as_ptr()) <= 0 {
        raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN,
            format!("column \"{column}\" of {relname} does not exist"),
            Some("\"columns\" names columns of the source table.".into()),
        );
    }
    quote_ident(column)
}

/// The source's size with TOAST (all partitions of a partitioned table), for the pile count.
unsafe fn source_bytes(relid: pg_sys::Oid) -> u64 {
    Spi::get_one_with_args::<i64>(
        "SELECT COALESCE(pg_catalog.sum(pg_catalog.pg_table_size(c.oid)), 0)::pg_catalog.int8 FROM pg_catalog.pg_class c
         WHERE c.oid OPERATOR(pg_catalog.=) $1
            OR c.oid IN (SELECT relid FROM pg_catalog.pg_partition_tree($1))
            OR c.oid IN (SELECT inhrelid FROM pg_catalog.pg_inherits WHERE inhparent OPERATOR(pg_catalog.=) $1)",
        &[relid.into()],
    )
    .ok()
    .flatten()
    .unwrap_or(0)
    .max(0) as u64
}

/// Bytes at the start of a heap tuple that insertion overwrites (xmin, xmax, cid): a pile
/// record keeps the tuple's length there, so a loaded record is a heap tuple in place.
const HEADER_SCRATCH: usize = 12;

fn record_len(t_len: u32) -> usize {
    (t_len as usize).div_ceil(8) * 8
}

/// Most bytes one FileRead or FileWrite call moves (their length is an int before PostgreSQL 16).
const IO_CHUNK: usize = 1 << 30;

fn io_error(what: &str) -> ! {
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
struct Pile {
    file: pg_sys::File,
    buffer: Vec<u8>,
    /// Bytes in the file; the buffer's follow them.
    written: u64,
    rows: u64,
}

impl Pile {
    unsafe fn new(buffer_bytes: usize) -> Pile {
        Pile {
            file: pg_sys::OpenTemporaryFile(false),
            buffer: Vec::with_capacity(buffer_bytes),
            written: 0,
            rows: 0,
        }
    }

    fn bytes(&self) -> u64 {
        self.written + self.buffer.len() as u64
    }

    /// Appends one record: the tuple's length, then its bytes after the scratch header
    /// (`body`), then padding.
    unsafe fn append(&mut self, t_len: u32, body: &[u8]) {
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

    unsafe fn flush(&mut self) {
        self.written += write_at(self.file, &self.buffer, self.written);
        self.buffer.clear();
    }

    /// Ends appending: the last records to the file, the write buffer freed.
    unsafe fn finish(&mut self) {
        self.flush();
        self.buffer = Vec::new();
    }

    /// Fills `to` from the file at `offset` (after `finish`).
    unsafe fn read_at(&self, to: &mut [u8], offset: u64) {
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

    /// Deletes the file.
    unsafe fn close(self) {
        pg_sys::FileClose(self.file);
    }
}

/// Writes `bytes` at `offset`; returns how many (all of them, or an ERROR).
///
/// # Safety
/// `file` is an open temporary file of this transaction; backend thread.
unsafe fn write_at(file: pg_sys::File, bytes: &[u8], offset: u64) -> u64 {
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
struct PileReader<'a> {
    pile: &'a Pile,
    buffer: Vec<u8>,
    /// File offset of `buffer[0]`.
    at: u64,
    pos: usize,
}

impl<'a> PileReader<'a> {
    fn new(pile: &'a Pile, buffer_bytes: usize) -> PileReader<'a> {
        PileReader {
            pile,
            buffer: Vec::with_capacity(buffer_bytes),
            at: 0,
            pos: 0,
        }
    }

    /// Makes at least `n` unread bytes available (the file has them: records are whole).
    unsafe fn fill(&mut self, n: usize) {
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
    unsafe fn next(&mut self) -> Option<(u32, &[u8])> {
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
struct LoadedPile {
    words: Vec<u64>,
    rows: Vec<pg_sys::HeapTupleData>,
    order: Vec<u32>,
}

impl LoadedPile {
    /// Reads all of `pile` (after `finish`) into memory.
    unsafe fn load(&mut self, pile: &Pile) {
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

/// A heap tuple's bytes after the scratch header (all a pile record keeps besides the length).
///
/// # Safety
/// `tuple` is a valid heap tuple of at least HEADER_SCRATCH bytes; the slice borrows its memory
/// and must not outlive it.
unsafe fn tuple_body<'a>(tuple: pg_sys::HeapTuple) -> &'a [u8] {
    std::slice::from_raw_parts(
        (*tuple).t_data.cast::<u8>().add(HEADER_SCRATCH),
        (*tuple).t_len as usize - HEADER_SCRATCH,
    )
}

/// The executor's receiver of pass 1: every row to a random pile.
#[repr(C)]
struct PileReceiver {
    dest: pg_sys::DestReceiver,
    piles: *mut Vec<Pile>,
    shuffler: *mut PileShuffler,
    bytes_since_check: u64,
}

#[pg_guard]
unsafe extern "C-unwind" fn receive_slot(
    slot: *mut pg_sys::TupleTableSlot,
    dest: *mut pg_sys::DestReceiver,
) -> bool {
    let receiver = &mut *dest.cast::<PileReceiver>();
    let (piles, shuffler) = (&mut *receiver.piles, &mut *receiver.shuffler);
    // A row straight from the table's buffer needs no copy; a projected one is formed here.
    let mut should_free = false;
    let tuple = pg_sys::ExecFetchSlotHeapTuple(slot, false, &mut should_free);
    let k = shuffler.pile(piles.len());
    let t_len = (*tuple).t_len;
    piles[k].append(t_len, tuple_body(tuple));
    receiver.bytes_since_check += (*tuple).t_len as u64;
    if should_free {
        pg_sys::heap_freetuple(tuple);
    }
    // Cancel is answered every ~1 MB of rows.
    if receiver.bytes_since_check > 1 << 20 {
        receiver.bytes_since_check = 0;
        check_for_interrupts!();
    }
    true
}

#[pg_guard]
unsafe extern "C-unwind" fn receiver_startup(
    _dest: *mut pg_sys::DestReceiver,
    _operation: i32,
    _typeinfo: pg_sys::TupleDesc,
) {
}

#[pg_guard]
unsafe extern "C-unwind" fn receiver_noop(_dest: *mut pg_sys::DestReceiver) {}

/// Pass 1: runs `select` and spreads its rows over `n` new piles.
unsafe fn split_into_piles(
    select: &str,
    n: usize,
    shuffler: &mut PileShuffler,
    memory: u64,
) -> Vec<Pile> {
    let mut piles: Vec<Pile> = (0..n).map(|_| Pile::new(pile_buffer(memory, n))).collect();
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
    let sql = CString::new(select).unwrap_or_else(|_| bad("a name contains a NUL byte".into(), ""));
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
    let query =
        crate::pg::compat::analyze_and_rewrite((*(*raw).elements).ptr_value.cast(), sql.as_ptr());
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

/// The write buffer of each of `n` piles: together at most a quarter of the memory bound.
fn pile_buffer(memory: u64, n: usize) -> usize {
    ((memory / 4) / n.max(1) as u64).clamp(8192, 256 * 1024) as usize
}

/// Pass 2 of one pile: shuffled in memory and appended to the table, or, when it is larger
/// than `memory`, split into sub-piles first.
#[allow(clippy::too_many_arguments)]
unsafe fn shuffle_pile(
    mut pile: Pile,
    path: u64,
    shuffler: &PileShuffler,
    memory: u64,
    max_piles: usize,
    loaded: &mut LoadedPile,
    writer: &mut Writer,
    depth: u32,
) {
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
                let k = sub_shuffler.pile(n);
                subs[k].append(t_len, body);
                bytes_since_check += t_len as u64;
                if bytes_since_check > 1 << 20 {
                    bytes_since_check = 0;
                    check_for_interrupts!();
                }
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

/// Rows inserted by one heap_multi_insert call (COPY's batch size).
const INSERT_BATCH: usize = 1000;

/// Inserts into the new table in batches with heap_multi_insert (one WAL record per page, as
/// COPY does; CREATE TABLE AS inserts row by row), with a bulk insert state and no free-space
/// map lookups (WAL is skipped when wal_level = minimal for a table created in this
/// transaction).
struct Writer {
    rel: pg_sys::Relation,
    bistate: pg_sys::BulkInsertState,
    cid: pg_sys::CommandId,
    slots: Vec<*mut pg_sys::TupleTableSlot>,
    pending: usize,
    /// What heap_multi_insert allocates for a batch (its tuple array, TOASTed copies).
    batch_memory: PgMemoryContexts,
    rows: i64,
}

impl Writer {
    unsafe fn open(relid: pg_sys::Oid) -> Writer {
        let rel = pg_sys::table_open(relid, pg_sys::RowExclusiveLock as i32);
        let slots = (0..INSERT_BATCH)
            .map(|_| {
                pg_sys::MakeSingleTupleTableSlot((*rel).rd_att, &raw const pg_sys::TTSOpsHeapTuple)
            })
            .collect();
        Writer {
            rel,
            bistate: pg_sys::GetBulkInsertState(),
            cid: pg_sys::GetCurrentCommandId(true),
            slots,
            pending: 0,
            batch_memory: PgMemoryContexts::new("corgipile_shuffle insert"),
            rows: 0,
        }
    }

    /// Queues one row for insertion; `tuple` must stay valid until the next `flush`.
    unsafe fn insert(&mut self, tuple: *mut pg_sys::HeapTupleData) {
        // heap_multi_insert materializes every slot, which copies a row the slot does not
        // own. These rows are ours until the flush: the slot is told it owns the row (no copy)
        // and told otherwise right after the insert, before anything could free it.
        pg_sys::ExecStoreHeapTuple(tuple, self.slots[self.pending], true);
        self.pending += 1;
        if self.pending == INSERT_BATCH {
            self.flush();
        }
    }

    /// Inserts the queued rows (their headers are overwritten in place: a record's length is
    /// no longer needed).
    unsafe fn flush(&mut self) {
        if self.pending == 0 {
            return;
        }
        let (rel, slots, n, cid, bistate) = (
            self.rel,
            self.slots.as_mut_ptr(),
            self.pending as i32,
            self.cid,
            self.bistate,
        );
        self.batch_memory.switch_to(|_| {
            pg_sys::heap_multi_insert(
                rel,
                slots,
                n,
                cid,
                pg_sys::TABLE_INSERT_SKIP_FSM as i32,
                bistate,
            )
        });
        for &slot in &self.slots[..self.pending] {
            (*slot).tts_flags &= !(pg_sys::TTS_FLAG_SHOULDFREE as u16);
        }
        self.batch_memory.reset();
        self.rows += self.pending as i64;
        self.pending = 0;
        check_for_interrupts!();
    }

    unsafe fn close(mut self) -> i64 {
        self.flush();
        for &slot in &self.slots {
            pg_sys::ExecDropSingleTupleTableSlot(slot);
        }
        pg_sys::FreeBulkInsertState(self.bistate);
        pg_sys::table_finish_bulk_insert(self.rel, pg_sys::TABLE_INSERT_SKIP_FSM as i32);
        pg_sys::table_close(self.rel, pg_sys::NoLock as i32);
        self.rows
    }
}
