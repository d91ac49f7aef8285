//! The tables a BlockShuffle reads: the scanned relation, or every leaf of its partition or
//! inheritance tree, opened, locked and closed as a SELECT on the parent does.

use crate::exec::page_reader::Attr;
use pgrx::pg_sys;

/// One table whose pages are read: the scanned relation itself, or a leaf of its partition or
/// inheritance tree.
pub(super) struct TableScan {
    pub(super) rel: pg_sys::Relation,
    /// Opened (so closed) by us; the scanned relation itself belongs to the executor.
    pub(super) opened: bool,
    pub(super) scan: pg_sys::TableScanDesc,
    /// The leaf's own slot (of its table's slot type), filled by the heap scan.
    pub(super) slot: *mut pg_sys::TupleTableSlot,
    /// TableScan columns → the parent's, when they differ (column order, dropped columns).
    pub(super) map: *mut pg_sys::TupleConversionMap,
    /// The page reader's view of this leaf: its attribute numbers of the plain columns, and
    /// the storage of its attributes up to the largest of them.
    pub(super) columns: Vec<usize>,
    pub(super) attrs: Vec<Attr>,
    /// Its attribute numbers of the columns the page reader's filter reads.
    pub(super) filter_columns: Vec<usize>,
    /// A tuple the page reader hands to PostgreSQL's deforming (see `deform_slowly`); the slot
    /// keeps a pointer to it, so it lives here, at an address that does not move.
    pub(super) slow_tuple: pg_sys::HeapTupleData,
    /// The page reader's read-ahead: this epoch's page ranges of this leaf, in reading order,
    /// and the stream that reads them ahead (started at the leaf's first block of the epoch).
    pub(super) ranges: Vec<(u32, u32)>,
    pub(super) stream: crate::pg::compat::PageStream,
    pub(super) stream_started: bool,
    /// Hints each buffer's page ranges to the kernel before they are read (before 17).
    pub(super) prefetch: crate::pg::prefetch::RangePrefetch,
}

unsafe extern "C-unwind" {
    /// catalog/pg_inherits.h (not in pgrx's bindings): `relid` and every table below it in its
    /// partition or inheritance tree, each locked with `lockmode`. Can raise an ERROR: call it
    /// through `all_inheritors`.
    #[link_name = "find_all_inheritors"]
    fn find_all_inheritors_unguarded(
        relid: pg_sys::Oid,
        lockmode: pg_sys::LOCKMODE,
        numparents: *mut *mut pg_sys::List,
    ) -> *mut pg_sys::List;
}

/// `relid` and every table below it, each locked with `lockmode`, as an OID list.
pub fn all_inheritors(relid: pg_sys::Oid, lockmode: pg_sys::LOCKMODE) -> Vec<pg_sys::Oid> {
    // SAFETY: an FFI call on the backend thread, inside the transaction of the SQL call (every
    // caller is a SQL function or the executor); the guard turns an ERROR raised inside into a
    // Rust panic that pgrx re-raises at the FFI boundary (no longjmp across Rust frames). The
    // list it returns is a valid OID List of `length` elements, read at once.
    unsafe {
        let list = pg_sys::ffi::pg_guard_ffi_boundary(|| {
            find_all_inheritors_unguarded(relid, lockmode, std::ptr::null_mut())
        });
        (0..(*list).length as usize)
            .map(|i| (*(*list).elements.add(i)).oid_value)
            .collect()
    }
}

/// Why a table of the tree cannot be read page by page (None: it can, or it has no pages).
pub(super) fn unreadable(kind: u8, am: pg_sys::Oid) -> Option<&'static str> {
    match kind {
        pg_sys::RELKIND_RELATION | pg_sys::RELKIND_MATVIEW if am == pg_sys::HEAP_TABLE_AM_OID => {
            None
        }
        pg_sys::RELKIND_RELATION | pg_sys::RELKIND_MATVIEW => {
            Some("does not use the heap access method")
        }
        pg_sys::RELKIND_PARTITIONED_TABLE => None,
        pg_sys::RELKIND_FOREIGN_TABLE => Some("is a foreign table"),
        _ => Some("is not a table"),
    }
}

/// The tables whose pages the scan reads: the scanned relation (`rel`) alone, or with
/// `include_children` every heap table of its partition or inheritance tree (partitioned
/// tables themselves have no pages). Leaves are locked as a SELECT on the parent locks them;
/// privileges and row-level security are the parent's, checked by the executor already.
///
/// `only_leaf`: read that one leaf of the tree (a local partition of a sharded table; the
/// others, foreign ones among them, are not opened).
///
/// # Safety
/// `rel` is the node's open scan relation and `scan_slot` its scan slot, both valid while the
/// leaves are (until `close_leaves`).
pub(super) unsafe fn open_leaves(
    rel: pg_sys::Relation,
    scan_slot: *mut pg_sys::TupleTableSlot,
    include_children: bool,
    only_leaf: Option<u32>,
    relname: &str,
) -> Vec<TableScan> {
    // SAFETY: rel is the executor's open scan relation; rd_id/rd_rel are valid while it is open.
    let relid = (*rel).rd_id;
    let lock = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
    let mut oids = if include_children {
        all_inheritors(relid, lock)
    } else {
        vec![relid]
    };
    if let Some(leaf) = only_leaf {
        oids.retain(|&oid| u32::from(oid) == leaf);
        if oids.is_empty() {
            crate::pg::error::raise(
                pgrx::PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
                format!("relation with OID {leaf} is no longer a partition of {relname}"),
                None,
            );
        }
    }
    let mut leaves = Vec::with_capacity(oids.len());
    for oid in oids {
        let leaf_rel = if oid == relid {
            rel
        } else {
            // Locked by find_all_inheritors; held to the end of the transaction.
            pg_sys::table_open(oid, pg_sys::NoLock as pg_sys::LOCKMODE)
        };
        let opened = leaf_rel != rel;
        // Another session's temporary child: its rows are in that session's local buffers,
        // and SELECT leaves it out too.
        let other_temp = (*(*leaf_rel).rd_rel).relpersistence as u8 == pg_sys::RELPERSISTENCE_TEMP
            && !(*leaf_rel).rd_islocaltemp;
        if opened && other_temp {
            pg_sys::table_close(leaf_rel, pg_sys::NoLock as pg_sys::LOCKMODE);
            continue;
        }
        let (kind, am) = (
            (*(*leaf_rel).rd_rel).relkind as u8,
            (*(*leaf_rel).rd_rel).relam,
        );
        if let Some(why) = unreadable(kind, am) {
            let leaf_name = crate::pg::names::qualified_name(oid);
            if opened {
                pg_sys::table_close(leaf_rel, pg_sys::NoLock as pg_sys::LOCKMODE);
            }
            close_leaves(&mut leaves);
            crate::pg::error::raise(
                pgrx::PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                if opened {
                    format!("cannot read {relname}: its partition or child table {leaf_name} {why}")
                } else {
                    format!("cannot read {relname}: it {why}")
                },
                Some(if kind == pg_sys::RELKIND_FOREIGN_TABLE {
                    "corgipile reads the pages of local heap tables; train on a table (or partitions) stored on this server.".into()
                } else {
                    "corgipile reads the pages of heap tables: CREATE TABLE ... AS SELECT from it first.".into()
                }),
            );
        }
        if kind == pg_sys::RELKIND_PARTITIONED_TABLE {
            if opened {
                pg_sys::table_close(leaf_rel, pg_sys::NoLock as pg_sys::LOCKMODE);
            }
            continue;
        }
        leaves.push(TableScan {
            rel: leaf_rel,
            opened,
            scan: std::ptr::null_mut(),
            slot: scan_slot,
            map: std::ptr::null_mut(),
            columns: Vec::new(),
            attrs: Vec::new(),
            filter_columns: Vec::new(),
            slow_tuple: pg_sys::HeapTupleData::default(),
            ranges: Vec::new(),
            stream: crate::pg::compat::PageStream::new(),
            stream_started: false,
            prefetch: crate::pg::prefetch::RangePrefetch::new(leaf_rel),
        });
    }
    leaves
}

/// Ends the leaves' scans and closes the tables we opened (locks stay to the end of the
/// transaction, as for any table a query read).
///
/// # Safety
/// The leaves were made by `open_leaves` in this query, which has not ended (their scans,
/// streams and relations are still valid; an aborted query's are released by PostgreSQL and
/// must not be closed here).
pub(super) unsafe fn close_leaves(leaves: &mut Vec<TableScan>) {
    for mut leaf in leaves.drain(..) {
        // SAFETY: each scan was begun by us and each opened table opened by us, exactly once;
        // the stream ends before its relation closes.
        leaf.stream.end();
        if !leaf.scan.is_null() {
            pg_sys::heap_endscan(leaf.scan);
        }
        if leaf.opened {
            pg_sys::table_close(leaf.rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        }
    }
}

/// The leaf's attribute numbers of the parent's `columns` (the same without a conversion map).
///
/// # Safety
/// `map` is null or a valid conversion map from the parent's row type to the leaf's, of which
/// every entry of `columns` is an attribute number (1..=natts).
pub(super) unsafe fn leaf_columns(
    map: *mut pg_sys::TupleConversionMap,
    columns: &[usize],
) -> Vec<usize> {
    if map.is_null() {
        return columns.to_vec();
    }
    // SAFETY: attrMap->attnums[i] is the leaf attribute of parent attribute i + 1. A partition
    // or inheritance child has every column of its parent, so none is 0.
    let attr_map = (*map).attrMap;
    columns
        .iter()
        .map(|&c| *(*attr_map).attnums.add(c - 1) as usize)
        .collect()
}
