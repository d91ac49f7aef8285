//! CorgiPile BlockShuffle: scans the relation one block (a range of pages) at a time, visiting
//! the blocks in a fresh seeded random order every epoch. Pages are read through the buffer
//! manager by PostgreSQL's heap scan (`heap_setscanlimits` over each page range) with the
//! query's MVCC snapshot; WHERE/RLS quals and the projection are applied by `ExecScan`.
//!
//! A partitioned table, or a table with inheritance children, is read as `SELECT` reads it: the
//! blocks of every leaf table form one pool, visited in one random order per epoch (so a table
//! partitioned by month is shuffled across months). Rows of a leaf are converted to the
//! parent's columns (order, dropped columns) before the parent's quals and projection see them.

use super::explain;
use super::node::{state_of, Node};
use super::page_reader::{self, Attr};
use crate::pg::progress;
use crate::pipeline::{BlockShare, PipelineConfig};
use corgipile_ml::params::{resolve_block_pages, BufferSize};
use corgipile_ml::shuffle::{block_order, split_blocks};
use pgrx::{check_for_interrupts, pg_guard, pg_sys};

/// One table whose pages are read: the scanned relation itself, or a leaf of its partition or
/// inheritance tree.
struct TableScan {
    rel: pg_sys::Relation,
    /// Opened (so closed) by us; the scanned relation itself belongs to the executor.
    opened: bool,
    scan: pg_sys::TableScanDesc,
    /// The leaf's own slot (of its table's slot type), filled by the heap scan.
    slot: *mut pg_sys::TupleTableSlot,
    /// TableScan columns → the parent's, when they differ (column order, dropped columns).
    map: *mut pg_sys::TupleConversionMap,
    /// The page reader's view of this leaf: its attribute numbers of the plain columns, and
    /// the storage of its attributes up to the largest of them.
    columns: Vec<usize>,
    attrs: Vec<Attr>,
    /// A tuple the page reader hands to PostgreSQL's deforming (see `deform_slowly`); the slot
    /// keeps a pointer to it, so it lives here, at an address that does not move.
    slow_tuple: pg_sys::HeapTupleData,
    /// The page reader's read-ahead: this epoch's page ranges of this leaf, in reading order,
    /// and the stream that reads them ahead (started at the leaf's first block of the epoch).
    ranges: Vec<(u32, u32)>,
    stream: crate::pg::compat::PageStream,
    stream_started: bool,
}

/// Where the page reader is: pages `page..end` of the current block are still to be read, and
/// visible tuples `tuple..ntuples` of the page read last.
#[derive(Default)]
struct PageCursor {
    page: u32,
    end: u32,
    tuple: usize,
    ntuples: usize,
    /// Deformed attributes of the current tuple (up to the largest plain column).
    values: Vec<pg_sys::Datum>,
    nulls: Vec<bool>,
}

/// One block: a range of pages of one leaf.
#[derive(Clone, Copy)]
struct Block {
    leaf: u32,
    start: u32,
    len: u32,
}

pub struct BlockShuffle {
    config: PipelineConfig,
    leaves: Vec<TableScan>,
    /// Rows are converted into the node's own scan slot (more than one leaf, or a leaf that is
    /// not the scanned relation); otherwise the leaf's slot is the scan slot.
    converts: bool,
    current_leaf: usize,
    n_pages: u64,
    /// Pages of the tables' TOAST relations: wide feature arrays live there, and a buffer of
    /// "10% of the table" must mean 10% of the data, not of the pointers to it.
    toast_pages: u64,
    block_pages: u32,
    blocks: Vec<Block>,
    /// This process's part of every epoch's blocks (parallel training).
    share: BlockShare,
    order: Vec<usize>,
    next_block: usize,
    in_block: bool,
    cursor: PageCursor,
    epoch: u32,
    /// Heap tuples read this epoch (for the progress line).
    tuples_this_epoch: u64,
    /// Tuple id of the tuple returned last (for messages and the validation hash; reading it
    /// from the scan, not as a ctid column, keeps column privileges on user columns enough).
    pub last_tid: pg_sys::ItemPointerData,
    /// The table columns (attribute numbers) of this node's output, in order, when the output
    /// is plain columns and nothing filters rows: TupleShuffle then reads them straight from the
    /// heap tuple (`fetch`), without ExecScan's projection and two guarded calls per row.
    pub plain_columns: Option<Vec<usize>>,
    // What EXPLAIN ANALYZE reports.
    pub blocks_read: u64,
    pub pages_read: u64,
    pub epochs_started: u32,
}

impl BlockShuffle {
    /// The leaf table of the row returned last, when rows come from a partition or
    /// inheritance tree (None for a plain table).
    pub fn row_table(&self) -> Option<pg_sys::Oid> {
        // SAFETY: leaves are open relations for as long as the node runs.
        self.converts
            .then(|| unsafe { (*self.leaves[self.current_leaf].rel).rd_id })
    }

    /// Reads only `share` of every epoch's blocks from now on, starting over with the block
    /// order of `epoch` (the leader's current one: every process must draw the same orders).
    /// Called before the epoch's first row.
    pub fn set_share(&mut self, share: BlockShare, epoch: u32) {
        self.share = share;
        self.epoch = epoch;
        self.draw_order();
    }

    /// The epoch whose block order is being read (a statistics pass counts as one).
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// The table's size with its TOAST data.
    pub fn table_bytes(&self) -> u64 {
        (self.n_pages + self.toast_pages) * pg_sys::BLCKSZ as u64
    }

    fn draw_order(&mut self) {
        let shuffle = self.config.params.shuffle.shuffles_blocks();
        self.order = block_order(self.blocks.len(), self.config.seed(), self.epoch, shuffle);
        if self.share.processes > 1 {
            // Every process draws the same order and keeps its positions of it.
            let BlockShare { rank, processes } = self.share;
            let mut position = 0u32;
            self.order.retain(|_| {
                let mine = position % processes == rank;
                position += 1;
                mine
            });
        }
        self.next_block = 0;
        self.in_block = false;
        self.cursor.page = 0;
        self.cursor.end = 0;
        self.cursor.tuple = 0;
        self.cursor.ntuples = 0;
        self.tuples_this_epoch = 0;
        for leaf in &mut self.leaves {
            leaf.ranges.clear();
            leaf.stream_started = false;
        }
        for &b in &self.order {
            let block = self.blocks[b];
            self.leaves[block.leaf as usize]
                .ranges
                .push((block.start, block.len));
        }
    }

    /// Moves to the next block of this epoch's order (beginning its leaf's scan the first
    /// time); false at the end of the epoch. Cancel and statement_timeout act here, at least
    /// once per block.
    unsafe fn next_block(&mut self, snapshot: pg_sys::Snapshot) -> Option<Block> {
        if self.next_block >= self.order.len() {
            return None;
        }
        if self.next_block == 0 {
            self.epochs_started += 1;
        }
        check_for_interrupts!();
        progress::scanning(self.next_block, self.order.len(), self.tuples_this_epoch);
        let block = self.blocks[self.order[self.next_block]];
        self.next_block += 1;
        if self.epochs_started == 1 && self.next_block == 1 {
            // Every leaf's scan begins before the first row is read, empty leaves too: beginning
            // a scan takes the relation's SERIALIZABLE predicate lock, as a SELECT's scan does.
            // Once: scans stay begun for every later block and epoch.
            for i in 0..self.leaves.len() {
                self.begin_scan(i, snapshot);
            }
        }
        Some(self.start_block(block))
    }

    /// Begins leaf `i`'s heap scan, once.
    unsafe fn begin_scan(&mut self, i: usize, snapshot: pg_sys::Snapshot) {
        let leaf = &mut self.leaves[i];
        if leaf.scan.is_null() {
            // SAFETY: a plain heap scan under the query's snapshot; the table is locked and
            // open. No sync scan: every scan must start where we say. Page mode: the page
            // reader relies on it (it is kept for an MVCC snapshot, which a query has).
            let flags = pg_sys::ScanOptions::SO_TYPE_SEQSCAN
                | pg_sys::ScanOptions::SO_ALLOW_STRAT
                | pg_sys::ScanOptions::SO_ALLOW_PAGEMODE;
            leaf.scan = pg_sys::heap_beginscan(
                leaf.rel,
                snapshot,
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                flags,
            );
        }
    }

    /// Makes `block` the current one. Leaving a leaf for another releases what it holds
    /// pinned (its last page, its read-ahead), so a tree of many partitions does not keep
    /// pages of every leaf pinned.
    unsafe fn start_block(&mut self, block: Block) -> Block {
        let next = block.leaf as usize;
        if next != self.current_leaf {
            let leaf = &mut self.leaves[self.current_leaf];
            let scan = leaf.scan.cast::<pg_sys::HeapScanDescData>();
            // SAFETY: the leaf's last row was decoded before this call (rows are handed over
            // one at a time), so nothing points into its page any more.
            if !scan.is_null() && (*scan).rs_cbuf != pg_sys::InvalidBuffer as pg_sys::Buffer {
                pg_sys::ReleaseBuffer((*scan).rs_cbuf);
                (*scan).rs_cbuf = pg_sys::InvalidBuffer as pg_sys::Buffer;
            }
            leaf.stream.pause();
        }
        self.current_leaf = next;
        self.in_block = true;
        self.blocks_read += 1;
        self.pages_read += block.len as u64;
        block
    }
}

/// The shuffle buffer's size in table pages, estimated before any tuple is decoded (the auto
/// block size makes a buffer hold many blocks).
unsafe fn buffer_pages(config: &PipelineConfig, leaves: &[TableScan], n_pages: u64) -> u64 {
    let n_buffers = if config.params.double_buffer { 2 } else { 1 };
    let limit = config.max_buffer_bytes / n_buffers / pg_sys::BLCKSZ as u64;
    let pages = match config.params.buffer_size {
        BufferSize::Fraction(f) => (f * n_pages as f64) as u64,
        BufferSize::Bytes(b) => b / pg_sys::BLCKSZ as u64,
        BufferSize::Tuples(t) => {
            let (mut reltuples, mut relpages) = (0.0f64, 0u64);
            for leaf in leaves {
                // SAFETY: rd_rel is valid for an open relation; reltuples is -1 before ANALYZE.
                let (tuples, pages) = (
                    (*(*leaf.rel).rd_rel).reltuples,
                    (*(*leaf.rel).rd_rel).relpages,
                );
                if tuples > 0.0 && pages > 0 {
                    reltuples += tuples as f64;
                    relpages += pages as u64;
                }
            }
            let per_page = if relpages > 0 {
                reltuples / relpages as f64
            } else {
                50.0
            };
            (t as f64 / per_page.max(1.0)) as u64
        }
    };
    pages.min(limit)
}

/// Size in pages of the relation's TOAST table (0 without one).
unsafe fn toast_pages(rel: pg_sys::Relation) -> u32 {
    // SAFETY: rd_rel is valid for an open relation. Reading a table reads its TOAST table, so
    // the AccessShareLock taken here is one the scan would take anyway.
    let toast = (*(*rel).rd_rel).reltoastrelid;
    if toast == pg_sys::InvalidOid {
        return 0;
    }
    let lock = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
    let toast_rel = pg_sys::table_open(toast, lock);
    let pages =
        pg_sys::RelationGetNumberOfBlocksInFork(toast_rel, pg_sys::ForkNumber::MAIN_FORKNUM);
    pg_sys::table_close(toast_rel, lock);
    pages
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
pub unsafe fn all_inheritors(relid: pg_sys::Oid, lockmode: pg_sys::LOCKMODE) -> Vec<pg_sys::Oid> {
    // SAFETY: the guard turns an ERROR raised inside into a Rust panic that pgrx re-raises at
    // the FFI boundary (no longjmp across Rust frames); backend thread, in a transaction.
    let list = pg_sys::ffi::pg_guard_ffi_boundary(|| {
        find_all_inheritors_unguarded(relid, lockmode, std::ptr::null_mut())
    });
    (0..(*list).length as usize)
        .map(|i| (*(*list).elements.add(i)).oid_value)
        .collect()
}

/// Why a table of the tree cannot be read page by page (None: it can, or it has no pages).
unsafe fn unreadable(kind: u8, am: pg_sys::Oid) -> Option<&'static str> {
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
unsafe fn open_leaves(
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
            let leaf_name = crate::request::query::qualified_name(oid);
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
            slow_tuple: pg_sys::HeapTupleData::default(),
            ranges: Vec::new(),
            stream: crate::pg::compat::PageStream::new(),
            stream_started: false,
        });
    }
    leaves
}

/// Ends the leaves' scans and closes the tables we opened (locks stay to the end of the
/// transaction, as for any table a query read).
unsafe fn close_leaves(leaves: &mut Vec<TableScan>) {
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
unsafe fn leaf_columns(map: *mut pg_sys::TupleConversionMap, columns: &[usize]) -> Vec<usize> {
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

/// BeginCustomScan (see `Node::begin`).
unsafe fn begin(
    node: *mut pg_sys::CustomScanState,
    estate: *mut pg_sys::EState,
    config: PipelineConfig,
) -> BlockShuffle {
    // SAFETY: ExecInitCustomScan has opened the relation into ss_currentRelation.
    let rel = (*node).ss.ss_currentRelation;
    // The scan slot: PostgreSQL 15 gives a custom scan a virtual slot, but heap_getnextslot
    // needs the table's own (buffer heap tuple) slot. A scan over one table fills that slot
    // directly; over a tree, each leaf has its own and rows are converted into a virtual slot
    // with the parent's columns. The projection and quals are then rebuilt, because their
    // compiled steps depend on the scan slot's type.
    let relname = config.relation.clone();
    let mut leaves = open_leaves(
        rel,
        std::ptr::null_mut(),
        !config.params.only,
        config.leaf,
        &relname,
    );
    let converts = !(leaves.len() == 1 && leaves[0].rel == rel);
    let ops = if converts {
        &raw const pg_sys::TTSOpsVirtual
    } else {
        pg_sys::table_slot_callbacks(rel)
    };
    let scan_slot = pg_sys::ExecAllocTableSlot(&mut (*estate).es_tupleTable, (*rel).rd_att, ops);
    (*node).ss.ss_ScanTupleSlot = scan_slot;
    (*node).ss.ps.scanops = ops;
    (*node).ss.ps.scanopsfixed = true;
    (*node).ss.ps.scanopsset = true;
    let plan = (*node).ss.ps.plan.cast::<pg_sys::CustomScan>();
    crate::pg::compat::assign_scan_projection(&mut (*node).ss, (*plan).scan.scanrelid);
    (*node).ss.ps.qual = pg_sys::ExecInitQual((*plan).scan.plan.qual, node.cast());
    let plain = plain_columns(plan, (*node).ss.ps.qual);
    let (mut n_pages, mut toast) = (0u64, 0u64);
    let mut leaf_pages = Vec::with_capacity(leaves.len());
    for leaf in &mut leaves {
        if converts {
            // Slots in es_tupleTable are released (buffer pins too) when the executor ends.
            let leaf_desc = (*leaf.rel).rd_att;
            leaf.slot = pg_sys::ExecAllocTableSlot(
                &mut (*estate).es_tupleTable,
                leaf_desc,
                pg_sys::table_slot_callbacks(leaf.rel),
            );
            // Null when the columns are the same (same order, no dropped ones in between).
            leaf.map = pg_sys::convert_tuples_by_name(leaf_desc, (*rel).rd_att);
        } else {
            leaf.slot = scan_slot;
        }
        if let Some(columns) = &plain {
            leaf.columns = leaf_columns(leaf.map, columns);
            let deform_to = leaf.columns.iter().copied().max().unwrap_or(0);
            leaf.attrs = page_reader::attrs((*leaf.rel).rd_att, deform_to);
        }
        let pages =
            pg_sys::RelationGetNumberOfBlocksInFork(leaf.rel, pg_sys::ForkNumber::MAIN_FORKNUM);
        leaf_pages.push(pages);
        n_pages += pages as u64;
        toast += toast_pages(leaf.rel) as u64;
    }
    let block_pages = resolve_block_pages(
        config.params.block_size,
        n_pages.min(u32::MAX as u64) as u32,
        pg_sys::BLCKSZ,
        buffer_pages(&config, &leaves, n_pages),
    );
    let blocks = leaf_pages
        .iter()
        .enumerate()
        .flat_map(|(leaf, &pages)| {
            split_blocks(pages, block_pages)
                .into_iter()
                .map(move |(start, len)| Block {
                    leaf: leaf as u32,
                    start,
                    len,
                })
        })
        .collect();
    let mut state = BlockShuffle {
        config,
        leaves,
        converts,
        current_leaf: 0,
        n_pages,
        toast_pages: toast,
        block_pages,
        blocks,
        share: BlockShare::ALL,
        order: Vec::new(),
        next_block: 0,
        in_block: false,
        cursor: PageCursor::default(),
        epoch: 1,
        tuples_this_epoch: 0,
        last_tid: pg_sys::ItemPointerData::default(),
        plain_columns: plain,
        blocks_read: 0,
        pages_read: 0,
        epochs_started: 0,
    };
    state.draw_order();
    state
}

/// The attribute numbers behind `plan`'s output when every output column is a plain column
/// of the scanned table and there is no qual (no WHERE, no row-level security filter).
unsafe fn plain_columns(
    plan: *mut pg_sys::CustomScan,
    qual: *mut pg_sys::ExprState,
) -> Option<Vec<usize>> {
    if !qual.is_null() {
        return None;
    }
    // SAFETY: a finished plan: targetlist is a List of TargetEntry nodes.
    let tlist = (*plan).scan.plan.targetlist;
    if tlist.is_null() {
        return None;
    }
    let mut columns = Vec::new();
    for i in 0..(*tlist).length as usize {
        let entry = (*(*tlist).elements.add(i))
            .ptr_value
            .cast::<pg_sys::TargetEntry>();
        let expr = (*entry).expr;
        if (*entry).resjunk || expr.is_null() || (*expr).type_ != pg_sys::NodeTag::T_Var {
            return None;
        }
        let var = expr.cast::<pg_sys::Var>();
        if (*var).varno as u32 != (*plan).scan.scanrelid
            || (*var).varlevelsup != 0
            || (*var).varattno <= 0
        {
            return None;
        }
        columns.push((*var).varattno as usize);
    }
    Some(columns)
}

/// ExecScan access method: the next heap tuple of the current block, moving to the next block
/// of this epoch's order when one is exhausted.
#[pg_guard]
unsafe extern "C-unwind" fn next_tuple(ss: *mut pg_sys::ScanState) -> *mut pg_sys::TupleTableSlot {
    fetch(ss)
}

/// The next heap tuple in the scan slot, or null at the end of the epoch. Also called
/// directly by TupleShuffle when the output is `plain_columns`.
///
/// # Safety
/// `ss` is an initialized BlockShuffle node; on the backend thread.
pub unsafe fn fetch(ss: *mut pg_sys::ScanState) -> *mut pg_sys::TupleTableSlot {
    let node = ss.cast::<pg_sys::CustomScanState>();
    let state = state_of::<BlockShuffle>(node);
    loop {
        if !state.in_block {
            let Some(block) = state.next_block((*(*ss).ps.state).es_snapshot) else {
                return std::ptr::null_mut();
            };
            let scan = state.leaves[block.leaf as usize].scan;
            // SAFETY: rescan resets the scan (and its limits) before new limits are set, as
            // heap_setscanlimits requires a scan that has not started.
            pg_sys::heap_rescan(scan, std::ptr::null_mut(), false, false, false, false);
            pg_sys::heap_setscanlimits(scan, block.start, block.len);
        }
        let leaf = &state.leaves[state.current_leaf];
        // SAFETY: the leaf's slot was created with its table's slot ops (see begin).
        if pg_sys::heap_getnextslot(
            leaf.scan,
            pg_sys::ScanDirection::ForwardScanDirection,
            leaf.slot,
        ) {
            state.last_tid = (*leaf.slot).tts_tid;
            state.tuples_this_epoch += 1;
            if !state.converts {
                return leaf.slot;
            }
            return to_parent_columns(leaf, (*ss).ss_ScanTupleSlot);
        }
        state.in_block = false;
    }
}

/// The page reader: the next row's `plain_columns` into `values`/`nulls` (in their order);
/// false at the end of the epoch. The same rows in the same order as `fetch`; values of
/// by-reference types point into the row's page, pinned until the next call.
///
/// # Safety
/// `ss` is an initialized BlockShuffle node whose `plain_columns` is set, with as many entries
/// in `values` and `nulls`; on the backend thread.
pub unsafe fn fetch_columns(
    ss: *mut pg_sys::ScanState,
    values: &mut [pg_sys::Datum],
    nulls: &mut [bool],
) -> bool {
    let node = ss.cast::<pg_sys::CustomScanState>();
    let state = state_of::<BlockShuffle>(node);
    loop {
        let cursor = &mut state.cursor;
        if cursor.tuple < cursor.ntuples {
            let leaf = &mut state.leaves[state.current_leaf];
            let scan = leaf.scan.cast::<pg_sys::HeapScanDescData>();
            // SAFETY: read_heap_page listed the page's visible tuples and holds its pin (see
            // the module comment of page_reader); offsets come from that list.
            let offset = (*scan).rs_vistuples[cursor.tuple];
            cursor.tuple += 1;
            let page = pg_sys::BufferGetPage((*scan).rs_cbuf);
            let item = (*page.cast::<pg_sys::PageHeaderData>())
                .pd_linp
                .as_ptr()
                .add(offset as usize - 1);
            let tup = page
                .cast::<u8>()
                .add((*item).lp_off() as usize)
                .cast::<pg_sys::HeapTupleHeaderData>();
            let len = (*item).lp_len() as usize;
            let block = (*scan).rs_cblock;
            state.last_tid = pg_sys::ItemPointerData {
                ip_blkid: pg_sys::BlockIdData {
                    bi_hi: (block >> 16) as u16,
                    bi_lo: (block & 0xffff) as u16,
                },
                ip_posid: offset,
            };
            state.tuples_this_epoch += 1;
            let n = leaf.attrs.len();
            if page_reader::deform(
                tup,
                len,
                &leaf.attrs,
                &mut cursor.values[..n],
                &mut cursor.nulls[..n],
            ) {
                for (k, &attno) in leaf.columns.iter().enumerate() {
                    values[k] = cursor.values[attno - 1];
                    nulls[k] = cursor.nulls[attno - 1];
                }
            } else {
                deform_slowly(leaf, tup, len, state.last_tid, values, nulls);
            }
            return true;
        }
        if state.in_block && cursor.page < cursor.end {
            // As heapam checks per page (a block of many empty or dead pages, or slow I/O).
            check_for_interrupts!();
            let leaf = &mut state.leaves[state.current_leaf];
            let scan = leaf.scan.cast::<pg_sys::HeapScanDescData>();
            // SAFETY: the page is within the relation as it was when the executor started,
            // and the relation cannot shrink while we hold our lock (truncation needs an
            // AccessExclusiveLock); the scan is in page mode (checked in next_block's caller).
            cursor.ntuples = crate::pg::compat::read_heap_page(scan, cursor.page, &mut leaf.stream);
            crate::pg::compat::count_tuples_returned(leaf.rel, cursor.ntuples);
            cursor.page += 1;
            cursor.tuple = 0;
            continue;
        }
        let Some(block) = state.next_block((*(*ss).ps.state).es_snapshot) else {
            return false;
        };
        let leaf = &mut state.leaves[block.leaf as usize];
        let scan = leaf.scan;
        if !leaf.stream_started {
            leaf.stream
                .start(scan.cast(), std::mem::take(&mut leaf.ranges));
            leaf.stream_started = true;
        }
        leaf.stream.range_started();
        if (*scan).rs_flags & pg_sys::ScanOptions::SO_ALLOW_PAGEMODE == 0 {
            crate::pg::error::raise(
                pgrx::PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                "corgipile: the scan is not in page mode (not an MVCC snapshot)",
                Some("This is a bug; please report it.".into()),
            );
        }
        let deform_to = state
            .leaves
            .iter()
            .map(|l| l.attrs.len())
            .max()
            .unwrap_or(0);
        let cursor = &mut state.cursor;
        cursor.values.resize(deform_to, pg_sys::Datum::from(0usize));
        cursor.nulls.resize(deform_to, true);
        cursor.page = block.start;
        cursor.end = block.start + block.len;
        cursor.tuple = 0;
        cursor.ntuples = 0;
    }
}

/// A tuple the page reader does not deform itself (fewer attributes than the columns read:
/// a column added later may have a stored default), deformed by PostgreSQL through the leaf's
/// slot, which pins the page for as long as it holds the tuple.
unsafe fn deform_slowly(
    leaf: &mut TableScan,
    tup: *mut pg_sys::HeapTupleHeaderData,
    len: usize,
    tid: pg_sys::ItemPointerData,
    values: &mut [pg_sys::Datum],
    nulls: &mut [bool],
) {
    let scan = leaf.scan.cast::<pg_sys::HeapScanDescData>();
    leaf.slow_tuple = pg_sys::HeapTupleData {
        t_len: len as u32,
        t_self: tid,
        t_tableOid: (*leaf.rel).rd_id,
        t_data: tup,
    };
    // SAFETY: the slot has the leaf's buffer heap tuple ops; slow_tuple outlives its use by
    // the slot (it is replaced only when the slot is next filled); the buffer is pinned.
    pg_sys::ExecStoreBufferHeapTuple(&mut leaf.slow_tuple, leaf.slot, (*scan).rs_cbuf);
    let deform_to = leaf.columns.iter().copied().max().unwrap_or(0);
    pg_sys::slot_getsomeattrs_int(leaf.slot, deform_to as i32);
    for (k, &attno) in leaf.columns.iter().enumerate() {
        values[k] = *(*leaf.slot).tts_values.add(attno - 1);
        nulls[k] = *(*leaf.slot).tts_isnull.add(attno - 1);
    }
}

/// A leaf's row as a row of the parent (the virtual scan slot). The values point into the
/// leaf slot's buffer page, which stays pinned until the leaf slot is next filled: the same
/// lifetime a row of the scan slot has without conversion.
unsafe fn to_parent_columns(
    leaf: &TableScan,
    parent: *mut pg_sys::TupleTableSlot,
) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: both slots are valid; a null map means the leaf's descriptor matches the parent's
    // attribute for attribute (convert_tuples_by_name), so natts and types agree.
    let row = if !leaf.map.is_null() {
        pg_sys::execute_attr_map_slot((*leaf.map).attrMap, leaf.slot, parent)
    } else {
        pg_sys::ExecClearTuple(parent);
        let natts = (*(*parent).tts_tupleDescriptor).natts as usize;
        pg_sys::slot_getallattrs(leaf.slot);
        std::ptr::copy_nonoverlapping((*leaf.slot).tts_values, (*parent).tts_values, natts);
        std::ptr::copy_nonoverlapping((*leaf.slot).tts_isnull, (*parent).tts_isnull, natts);
        pg_sys::ExecStoreVirtualTuple(parent)
    };
    // Quals (row-level security, a validation predicate) may read tableoid and ctid, which a
    // virtual slot keeps in these fields (other system columns are an ERROR from the executor).
    (*row).tts_tableOid = (*leaf.slot).tts_tableOid;
    (*row).tts_tid = (*leaf.slot).tts_tid;
    row
}

#[pg_guard]
unsafe extern "C-unwind" fn recheck(
    _ss: *mut pg_sys::ScanState,
    _slot: *mut pg_sys::TupleTableSlot,
) -> bool {
    true
}

impl Node for BlockShuffle {
    const NAME: &'static std::ffi::CStr = c"CorgiPile BlockShuffle";

    fn exec_methods() -> &'static pg_sys::CustomExecMethods {
        &super::methods().block_exec
    }

    unsafe fn begin(
        css: *mut pg_sys::CustomScanState,
        estate: *mut pg_sys::EState,
        _eflags: i32,
        config: PipelineConfig,
    ) -> Self {
        begin(css, estate, config)
    }

    unsafe fn exec(&mut self, css: *mut pg_sys::CustomScanState) -> *mut pg_sys::TupleTableSlot {
        // SAFETY: ExecScan applies the node's quals and projection around our access method.
        pg_sys::ExecScan(&mut (*css).ss, Some(next_tuple), Some(recheck))
    }

    /// Next epoch: a new block order (seed and epoch number give a reproducible permutation).
    unsafe fn rescan(&mut self) {
        self.epoch += 1;
        self.draw_order();
    }

    unsafe fn end(&mut self) {
        close_leaves(&mut self.leaves);
    }

    unsafe fn explain(&self, es: *mut pg_sys::ExplainState) {
        let state = self;
        let order = if state.config.params.shuffle.shuffles_blocks() {
            "shuffled per epoch"
        } else {
            "sequential"
        };
        if state.converts {
            explain::int(es, "Tables", state.leaves.len() as i64);
        }
        explain::int(es, "Table Pages", state.n_pages as i64);
        if state.toast_pages > 0 {
            explain::int(es, "TOAST Pages", state.toast_pages as i64);
        }
        explain::text(
            es,
            "Block Size",
            &format!(
                "{} pages ({:.3} MB)",
                state.block_pages,
                state.block_pages as f64 * pg_sys::BLCKSZ as f64 / 1048576.0
            ),
        );
        explain::int(es, "Blocks", state.blocks.len() as i64);
        explain::text(es, "Block Order", order);
        explain::int(es, "Seed", state.config.seed() as i64);
        if explain::analyzing(es) {
            explain::int(es, "Epochs Scanned", state.epochs_started as i64);
            explain::int(es, "Blocks Read", state.blocks_read as i64);
            explain::int(es, "Pages Read", state.pages_read as i64);
        }
    }
}
