//! Tables distributed by Citus: refused before any work. On a Citus node the table a user names
//! is a shell; its rows are in its shards, tables of their own named after it with a shard id
//! (on the worker nodes, or on the coordinator for a reference table's or a local table's
//! placement there). The shell's own pages are empty, or hold the rows it had before
//! `create_distributed_table`, which Citus leaves on disk. corgipile reads a table's own pages,
//! so training on a shell would read nothing, or stale rows, without a word.
//!
//! Citus records every table it manages in `pg_catalog.pg_dist_partition` (`logicalrelid`
//! regclass, `partmethod` "char": 'h' hash, 'r' range, 'a' append, 'n' none: a reference
//! table, a single-shard table or a local table added to its metadata; `repmodel` "char";
//! `colocationid` integer). Only that catalog counts: it is looked up in pg_catalog by name
//! in the syscache, never through the search path, and creating anything in pg_catalog needs
//! a superuser, so no other role can add a look-alike that makes a training fail or pass. It
//! is read directly (a heap scan of its rows, no SQL), so a role's privileges on it do not
//! matter. docs/scale-out.md says what training over Citus would take.

use crate::pg::error::raise;
use crate::pg::names::{qualified_name, relation_name};
use pgrx::{pg_sys, PgSqlErrorCode};
use std::collections::HashMap;
use std::ffi::CStr;

/// How Citus distributes a table: its `pg_dist_partition` row.
#[derive(Clone, Copy)]
struct Distribution {
    method: u8,
    repmodel: Option<u8>,
    colocationid: Option<i32>,
}

impl Distribution {
    /// The kind of Citus table, as Citus's own `IsCitusTableTypeInternal` tells them apart.
    fn kind(self) -> &'static str {
        match self.method {
            b'h' => "a hash-distributed table",
            b'r' => "a range-distributed table",
            b'a' => "an append-distributed table",
            b'n' => match (self.repmodel, self.colocationid) {
                (Some(b't'), _) => "a reference table",
                (_, Some(0)) => "a local table added to its metadata",
                (_, Some(_)) => "a single-shard distributed table",
                _ => "a table of one shard",
            },
            _ => "a Citus table",
        }
    }
}

/// An ERROR (0A000) if a training of `named` reads a table Citus manages: `table` (what
/// `named` resolves to: itself, or a simple view's base table) or, unless `only`, a table of
/// its partition or inheritance tree. `verb` is what the caller cannot do ("read", "shuffle").
pub fn refuse_distributed(
    named: pg_sys::Oid,
    shown: &str,
    table: pg_sys::Oid,
    only: bool,
    verb: &str,
) {
    let Some(catalog) = dist_partition() else {
        return;
    };
    let distributed = distributed_tables(catalog);
    if distributed.is_empty() {
        return;
    }
    // SAFETY: a syscache lookup on the backend thread, inside the transaction of the SQL call.
    let table_kind = unsafe { pg_sys::get_rel_relkind(table) } as u8;
    let tree = if only {
        vec![table]
    } else {
        // Locked as the scan will lock them (a SELECT on the parent locks its children).
        crate::exec::block_shuffle::all_inheritors(
            table,
            pg_sys::AccessShareLock as pg_sys::LOCKMODE,
        )
    };
    let Some((dist, how)) = tree
        .iter()
        .find_map(|oid| distributed.get(oid).map(|d| (*oid, *d)))
    else {
        return;
    };
    let name = relation_name(dist);
    let subject = if dist == named {
        "it".to_owned()
    } else if dist == table {
        format!("its table {name}")
    } else if table_kind == pg_sys::RELKIND_PARTITIONED_TABLE {
        format!("its partition {name}")
    } else {
        format!("its child table {name}")
    };
    // SAFETY: a syscache lookup on the backend thread, inside the transaction of the SQL call.
    let named_kind = unsafe { pg_sys::get_rel_relkind(named) } as u8;
    let shown = if named_kind == pg_sys::RELKIND_VIEW {
        format!("view {shown}")
    } else {
        shown.to_owned()
    };
    raise(
        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
        format!(
            "cannot {verb} {shown}: {subject} is distributed by Citus ({}), so its rows are in its shards, not in its own pages",
            how.kind()
        ),
        Some(format!(
            "corgipile reads a table's own pages, which Citus leaves empty (or holding the rows from before create_distributed_table). Use a postgres_fdw sharded table over its shard tables on the Citus nodes instead (see docs/scale-out.md), or a local copy: CREATE TABLE ... AS SELECT * FROM {}.",
            qualified_name(named)
        )),
    )
}

/// `pg_catalog.pg_dist_partition`, if this database has it (Citus installed).
fn dist_partition() -> Option<pg_sys::Oid> {
    // SAFETY: a syscache lookup by name and schema on the backend thread, inside the transaction
    // of the SQL call; the name is a NUL-terminated literal.
    let oid = unsafe {
        pg_sys::get_relname_relid(
            c"pg_dist_partition".as_ptr(),
            pg_sys::Oid::from(pg_sys::PG_CATALOG_NAMESPACE),
        )
    };
    (oid != pg_sys::InvalidOid).then_some(oid)
}

/// The column of `desc` named `name`: its number (1-based) and type, if it has one.
///
/// # Safety
/// `desc` is the tuple descriptor of an open relation.
unsafe fn column(desc: pg_sys::TupleDesc, name: &str) -> Option<(i32, pg_sys::Oid)> {
    crate::pg::compat::tuple_desc_attrs(desc)
        .iter()
        .enumerate()
        .find(|(_, a)| {
            !a.attisdropped && CStr::from_ptr(a.attname.data.as_ptr()).to_bytes() == name.as_bytes()
        })
        .map(|(i, a)| (i as i32 + 1, a.atttypid))
}

/// Every table `catalog` (Citus's pg_dist_partition) lists, with how it is distributed. A
/// catalog of another shape is an ERROR: corgipile cannot tell which tables it may read.
fn distributed_tables(catalog: pg_sys::Oid) -> HashMap<pg_sys::Oid, Distribution> {
    fn unreadable(why: &str) -> ! {
        raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("cannot read pg_catalog.pg_dist_partition, Citus's catalog of distributed tables: {why}"),
            Some("corgipile reads it before reading any table, to refuse the tables Citus distributes (their own pages are not their rows). Check the Citus installation of this database.".into()),
        )
    }
    let mut found = HashMap::new();
    // SAFETY: on the backend thread inside the transaction of the SQL call. The relation is
    // opened (and locked as a SELECT locks it) for the scan and closed after it; the scan uses
    // a fresh catalog snapshot (snapshot NULL, as Citus reads this catalog itself); each
    // attribute is read with the relation's own tuple descriptor from a tuple the scan
    // returned, before the next one is asked for; a "char" datum is one byte, an integer one
    // four, a regclass (or oid) one an Oid.
    unsafe {
        if pg_sys::get_rel_relkind(catalog) as u8 != pg_sys::RELKIND_RELATION {
            unreadable("it is not a table");
        }
        let lock = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
        let rel = pg_sys::table_open(catalog, lock);
        let desc = (*rel).rd_att;
        let relid = column(desc, "logicalrelid")
            .filter(|(_, t)| *t == pg_sys::REGCLASSOID || *t == pg_sys::OIDOID);
        let Some((relid_at, _)) = relid else {
            pg_sys::table_close(rel, lock);
            unreadable("it has no column logicalrelid of type regclass");
        };
        let method_at = column(desc, "partmethod")
            .filter(|(_, t)| *t == pg_sys::CHAROID)
            .map(|(at, _)| at);
        let repmodel_at = column(desc, "repmodel")
            .filter(|(_, t)| *t == pg_sys::CHAROID)
            .map(|(at, _)| at);
        let colocation_at = column(desc, "colocationid")
            .filter(|(_, t)| *t == pg_sys::INT4OID)
            .map(|(at, _)| at);
        let scan = pg_sys::systable_beginscan(
            rel,
            pg_sys::InvalidOid,
            false,
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
        );
        loop {
            let tuple = pg_sys::systable_getnext(scan);
            if tuple.is_null() {
                break;
            }
            let get = |at: i32| {
                let mut isnull = false;
                let datum = pg_sys::heap_getattr(tuple, at, desc, &mut isnull);
                (!isnull).then_some(datum)
            };
            let Some(oid) = get(relid_at) else { continue };
            let char_at = |at: Option<i32>| at.and_then(get).map(|d| d.value() as u8);
            found.insert(
                pg_sys::Oid::from(oid.value() as u32),
                Distribution {
                    method: char_at(method_at).unwrap_or(0),
                    repmodel: char_at(repmodel_at),
                    colocationid: colocation_at.and_then(get).map(|d| d.value() as i32),
                },
            );
        }
        pg_sys::systable_endscan(scan);
        pg_sys::table_close(rel, lock);
    }
    found
}
