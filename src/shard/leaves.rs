//! The leaves of a sharded table: which partitions are postgres_fdw foreign tables (on which
//! server, which remote table) and which are local, and how EXPLAIN names them.

use crate::pg::error::raise;
use pgrx::{pg_sys, PgSqlErrorCode};
use std::ffi::{CStr, CString};

/// One leaf of the sharded table.
pub enum Leaf {
    Local(pg_sys::Oid),
    /// A foreign table (`foreign`, this server's oid of it): its server and the remote
    /// table's qualified name.
    Remote {
        foreign: pg_sys::Oid,
        server: pg_sys::Oid,
        table: String,
    },
}

impl Leaf {
    /// This server's oid of the leaf: the local partition, or the foreign table.
    pub fn oid(&self) -> pg_sys::Oid {
        match self {
            Leaf::Local(oid) | Leaf::Remote { foreign: oid, .. } => *oid,
        }
    }
}

/// The leaves of `relid` if it is a partitioned table with at least one postgres_fdw foreign
/// partition (None otherwise: the table is read locally).
pub fn sharded_leaves(relid: pg_sys::Oid) -> Option<Vec<Leaf>> {
    // SAFETY: FFI calls, and reads of what they return, on the backend thread inside the transaction
    // of the SQL call (every caller is a SQL function); no raw pointer comes from the caller.
    unsafe {
        if pg_sys::get_rel_relkind(relid) as u8 != pg_sys::RELKIND_PARTITIONED_TABLE {
            return None;
        }
        let tree = crate::exec::block_shuffle::all_inheritors(
            relid,
            pg_sys::AccessShareLock as pg_sys::LOCKMODE,
        );
        let mut leaves = Vec::new();
        let mut any_foreign = false;
        for oid in tree {
            match pg_sys::get_rel_relkind(oid) as u8 {
                pg_sys::RELKIND_FOREIGN_TABLE => {
                    any_foreign = true;
                    let ft = pg_sys::GetForeignTable(oid);
                    let server = (*ft).serverid;
                    let fdw =
                        pg_sys::GetForeignDataWrapper((*pg_sys::GetForeignServer(server)).fdwid);
                    let fdw_name = CStr::from_ptr((*fdw).fdwname)
                        .to_string_lossy()
                        .into_owned();
                    if fdw_name != "postgres_fdw" {
                        raise(
                        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                        format!(
                            "cannot train on partition {}: its foreign data wrapper is {fdw_name}",
                            crate::pg::names::relation_name(oid)
                        ),
                        Some("Shards must be postgres_fdw foreign tables on servers with corgipile installed.".into()),
                    );
                    }
                    let mut schema =
                        CStr::from_ptr(pg_sys::get_namespace_name(pg_sys::get_rel_namespace(oid)))
                            .to_string_lossy()
                            .into_owned();
                    let mut table = CStr::from_ptr(pg_sys::get_rel_name(oid))
                        .to_string_lossy()
                        .into_owned();
                    let list = (*ft).options;
                    if !list.is_null() {
                        for j in 0..(*list).length {
                            let def = (*(*list).elements.add(j as usize))
                                .ptr_value
                                .cast::<pg_sys::DefElem>();
                            let key = CStr::from_ptr((*def).defname)
                                .to_string_lossy()
                                .into_owned();
                            let value = CStr::from_ptr(pg_sys::defGetString(def))
                                .to_string_lossy()
                                .into_owned();
                            match key.as_str() {
                                "schema_name" => schema = value,
                                "table_name" => table = value,
                                _ => {}
                            }
                        }
                    }
                    leaves.push(Leaf::Remote {
                        foreign: oid,
                        server,
                        table: format!("{}.{}", quote(&schema), quote(&table)),
                    });
                }
                pg_sys::RELKIND_RELATION | pg_sys::RELKIND_MATVIEW => leaves.push(Leaf::Local(oid)),
                _ => {} // partitioned tables in between
            }
        }
        any_foreign.then_some(leaves)
    }
}

fn quote(ident: &str) -> String {
    let c = CString::new(ident).expect("identifier without NUL");
    // SAFETY: quote_identifier returns its argument or a palloc'd copy.
    unsafe {
        CStr::from_ptr(pg_sys::quote_identifier(c.as_ptr()))
            .to_string_lossy()
            .into_owned()
    }
}

/// What EXPLAIN (without ANALYZE) shows of each shard: its server (or local partition) and
/// table, without connecting.
pub fn describe(leaves: &[Leaf]) -> Vec<String> {
    // SAFETY: FFI calls, and reads of what they return, on the backend thread inside the transaction
    // of the SQL call (every caller is a SQL function); no raw pointer comes from the caller.
    unsafe {
        leaves
            .iter()
            .map(|leaf| match leaf {
                Leaf::Local(oid) => {
                    format!("local partition {}", crate::pg::names::relation_name(*oid))
                }
                Leaf::Remote { server, table, .. } => {
                    let name = CStr::from_ptr((*pg_sys::GetForeignServer(*server)).servername);
                    format!("server {} table {table}", name.to_string_lossy())
                }
            })
            .collect()
    }
}
