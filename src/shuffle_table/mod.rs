//! corgipile_shuffle: a full, uniform shuffle of a table into a new table, in two sequential
//! passes and memory bounded by one pile (the pile shuffle, Rao's algorithm; see
//! `corgipile_ml::shuffle::PileShuffler`), instead of `ORDER BY random()`'s external sort.
//!
//! Pass 1 runs `SELECT cols FROM source` through the executor (privileges, row-level security
//! and the statement's snapshot as for any query) into a receiver that appends each row, as a
//! minimal tuple, to one of M piles (for a plain table whose stored tuples are exactly those
//! rows for the caller, `piles::rows_as_stored`, a heap scan of our own gives the same tuples
//! in the same snapshot and order, without the executor's slot per row). The piles are
//! PostgreSQL temporary files (`BufFile`), so
//! temp_tablespaces and temp_file_limit apply and an ERROR or cancel deletes them. Pass 2
//! reads one pile at a time into memory, shuffles it and appends it to the new table with the
//! bulk insert path, as CREATE TABLE AS does. A pile larger than the memory bound is split
//! again into sub-piles, never loaded whole.

use crate::catalog::check_writable;
use crate::pg::error::raise;
use crate::pg::guc::max_buffer_bytes;
use crate::pg::names::{qualified_name, relation_name};
use crate::request::args::ParamsArg;
use crate::request::random_seed;
use corgipile_ml::limits::pretty_bytes;
use corgipile_ml::params::parse_bytes;
use corgipile_ml::shuffle::{pile_count, PileShuffler};
use pgrx::prelude::*;
use pgrx::spi::quote_identifier;
use pgrx::PgSqlErrorCode;
use std::ffi::{CStr, CString};

mod write;
use write::{receive_slot, receiver_noop, receiver_startup, PileReceiver, Writer};

mod piles;
pub mod spill;
use piles::{shuffle_pile, split_into_piles, to_random_pile, tuple_body, LoadedPile, Pile};

/// Most piles one pass writes (each open temporary file buffers one 8 kB block).
const MAX_PILES: usize = 4096;

struct ShuffleParams {
    seed: u64,
    memory: u64,
    columns: Option<Vec<String>>,
}

/// The params as given: every key optional, none null, no other key.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct GivenParams {
    #[serde(default, deserialize_with = "given")]
    seed: Option<u64>,
    #[serde(default, deserialize_with = "given")]
    memory: Option<Size>,
    #[serde(default, deserialize_with = "given")]
    columns: Option<Vec<String>>,
}

/// A size: a text such as "64MB", or a number of bytes.
enum Size {
    Text(String),
    Bytes(u64),
}

impl<'de> serde::Deserialize<'de> for Size {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Size, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Size;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a size such as \"64MB\", or a number of bytes")
            }
            fn visit_str<E>(self, v: &str) -> Result<Size, E> {
                Ok(Size::Text(v.to_owned()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Size, E> {
                Ok(Size::Bytes(v))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// A key that is present holds a value of its type (null is not one).
fn given<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

fn bad(message: String, hint: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        message,
        Some(hint.into()),
    )
}

fn parse_params(json: &serde_json::Value) -> ShuffleParams {
    const EXAMPLE: &str = "For example '{\"seed\": 1, \"memory\": \"256MB\", \"columns\": [\"id\", \"features\", \"label\"]}': seed an integer from 0 to 2^63-1, memory a size, columns a non-empty array of column names.";
    if !json.is_object() {
        bad("params must be a JSON object".into(), EXAMPLE);
    }
    let given: GivenParams = serde_json::from_value(json.clone())
        .unwrap_or_else(|e| bad(format!("params of corgipile_shuffle: {e}"), EXAMPLE));
    let limit = max_buffer_bytes();
    let seed = match given.seed {
        Some(s) if s > i64::MAX as u64 => bad(
            format!(
                "\"seed\" must be an integer from 0 to {}, got {s}",
                i64::MAX
            ),
            "Same seed and same data give the same order.",
        ),
        Some(s) => s,
        None => random_seed(),
    };
    let memory = match given.memory {
        None => limit,
        Some(Size::Bytes(n)) => n,
        Some(Size::Text(text)) => parse_bytes(&text).unwrap_or_else(|e| {
            bad(
                format!("\"memory\": {e}"),
                "A size such as \"64MB\" or \"1GB\".",
            )
        }),
    };
    if memory < 1 << 20 || memory > limit {
        bad(
            format!(
                "\"memory\" must be from 1 MB to corgipile.max_buffer_memory ({}), got {}",
                pretty_bytes(limit),
                pretty_bytes(memory)
            ),
            "The memory of one pile in pass 2; the default is corgipile.max_buffer_memory.",
        );
    }
    if given.columns.as_ref().is_some_and(Vec::is_empty) {
        bad(
            "\"columns\" must be a non-empty array of column names".into(),
            "For example '{\"columns\": [\"id\", \"features\", \"label\"]}'.",
        );
    }
    ShuffleParams {
        seed,
        memory,
        columns: given.columns,
    }
}

/// Creates table `target` holding every row of `source` visible to this statement exactly once,
/// in a uniformly random order; returns the number of rows.
#[pg_extern(volatile, parallel_unsafe)]
fn corgipile_shuffle(
    source: crate::request::args::RelationArg,
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
        let whole_table = (p.columns.is_none() && piles::rows_as_stored(relid)).then_some(relid);
        shuffle_into(
            &select,
            whole_table,
            target_relid,
            p.seed,
            p.memory,
            piles,
            max_piles,
        )
    }
}

/// Both passes: `select`'s rows (run as the caller; or `whole_table` read from its pages, see
/// `piles::rows_as_stored`) through `piles` piles of temporary files into the table `target`
/// in a uniformly random order drawn from `seed`, each pass-2 pile in at most `memory` (split
/// again into up to `max_piles` sub-piles if larger); the rows written.
///
/// # Safety
/// `target` is a heap table whose row type is `select`'s: the rows are copied into it as they
/// are, unchecked.
pub(super) unsafe fn shuffle_into(
    select: &str,
    whole_table: Option<pg_sys::Oid>,
    target: pg_sys::Oid,
    seed: u64,
    memory: u64,
    piles: usize,
    max_piles: usize,
) -> i64 {
    let mut shuffler = PileShuffler::new(seed);
    let pass1 = split_into_piles(select, whole_table, piles, &mut shuffler, memory);
    let mut writer = Writer::open(target);
    let mut loaded = LoadedPile::default();
    for (k, pile) in pass1.into_iter().enumerate() {
        shuffle_pile(
            pile,
            k as u64,
            &shuffler,
            memory,
            max_piles,
            &mut loaded,
            &mut writer,
            0,
        );
    }
    writer.close()
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
    // A table Citus distributes: its own pages are not its rows (see request::citus).
    crate::request::citus::refuse_distributed(relid, relname, relid, false, "shuffle");
    if kind == pg_sys::RELKIND_PARTITIONED_TABLE {
        let lock = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
        for leaf in crate::exec::block_shuffle::all_inheritors(relid, lock) {
            if pg_sys::get_rel_relkind(leaf) as u8 == pg_sys::RELKIND_FOREIGN_TABLE {
                raise(
                    PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                    format!(
                        "cannot shuffle {relname}: its partition {} is a foreign table",
                        crate::pg::names::relation_name(leaf)
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
        true => quote_identifier(&rel),
        false => format!(
            "{}.{}",
            quote_identifier(CStr::from_ptr((*rv).schemaname).to_string_lossy()),
            quote_identifier(&rel)
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
    quote_identifier(column)
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
