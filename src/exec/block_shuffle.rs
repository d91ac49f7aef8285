//! CorgiPile BlockShuffle: scans the relation one block (a range of pages) at a time, visiting
//! the blocks in a fresh seeded random order every epoch. Pages are read through the buffer
//! manager by PostgreSQL's heap scan (`heap_setscanlimits` over each page range) with the
//! query's MVCC snapshot; WHERE/RLS quals and the projection are applied by `ExecScan`.

use super::explain;
use super::node::{state_of, Node};
use crate::pipeline::PipelineConfig;
use crate::progress;
use corgipile_ml::params::{resolve_block_pages, BufferSize};
use corgipile_ml::shuffle::{block_order, split_blocks};
use pgrx::{check_for_interrupts, pg_guard, pg_sys};

pub struct BlockShuffle {
    config: PipelineConfig,
    scan: pg_sys::TableScanDesc,
    n_pages: u32,
    /// Pages of the table's TOAST relation: wide feature arrays live there, and a buffer of
    /// "10% of the table" must mean 10% of the data, not of the pointers to it.
    toast_pages: u32,
    block_pages: u32,
    blocks: Vec<(u32, u32)>,
    order: Vec<usize>,
    next_block: usize,
    in_block: bool,
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
    /// The table's size with its TOAST data.
    pub fn table_bytes(&self) -> u64 {
        (self.n_pages as u64 + self.toast_pages as u64) * pg_sys::BLCKSZ as u64
    }

    fn draw_order(&mut self) {
        let shuffle = self.config.params.shuffle.shuffles_blocks();
        self.order = block_order(self.blocks.len(), self.config.seed(), self.epoch, shuffle);
        self.next_block = 0;
        self.in_block = false;
        self.tuples_this_epoch = 0;
    }
}

/// The shuffle buffer's size in table pages, estimated before any tuple is decoded (the auto
/// block size makes a buffer hold many blocks).
unsafe fn buffer_pages(config: &PipelineConfig, rel: pg_sys::Relation, n_pages: u32) -> u64 {
    let n_buffers = if config.params.double_buffer { 2 } else { 1 };
    let limit = config.max_buffer_bytes / n_buffers / pg_sys::BLCKSZ as u64;
    let pages = match config.params.buffer_size {
        BufferSize::Fraction(f) => (f * n_pages as f64) as u64,
        BufferSize::Bytes(b) => b / pg_sys::BLCKSZ as u64,
        BufferSize::Tuples(t) => {
            // SAFETY: rd_rel is valid for an open relation; reltuples is -1 before ANALYZE.
            let (reltuples, relpages) = ((*(*rel).rd_rel).reltuples, (*(*rel).rd_rel).relpages);
            let per_page = if reltuples > 0.0 && relpages > 0 {
                reltuples as f64 / relpages as f64
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

/// BeginCustomScan (see `Node::begin`).
unsafe fn begin(
    node: *mut pg_sys::CustomScanState,
    estate: *mut pg_sys::EState,
    config: PipelineConfig,
) -> BlockShuffle {
    // SAFETY: ExecInitCustomScan has opened the relation into ss_currentRelation.
    let rel = (*node).ss.ss_currentRelation;
    // PostgreSQL 15 gives a custom scan a virtual scan slot, but heap_getnextslot needs the
    // table's own (buffer heap tuple) slot. Swap it in, then rebuild the projection and quals,
    // whose compiled steps depend on the scan slot's type.
    let ops = pg_sys::table_slot_callbacks(rel);
    (*node).ss.ss_ScanTupleSlot =
        pg_sys::ExecAllocTableSlot(&mut (*estate).es_tupleTable, (*rel).rd_att, ops);
    (*node).ss.ps.scanops = ops;
    (*node).ss.ps.scanopsfixed = true;
    (*node).ss.ps.scanopsset = true;
    let plan = (*node).ss.ps.plan.cast::<pg_sys::CustomScan>();
    crate::compat::assign_scan_projection(&mut (*node).ss, (*plan).scan.scanrelid);
    (*node).ss.ps.qual = pg_sys::ExecInitQual((*plan).scan.plan.qual, node.cast());
    let n_pages = pg_sys::RelationGetNumberOfBlocksInFork(rel, pg_sys::ForkNumber::MAIN_FORKNUM);
    let toast_pages = toast_pages(rel);
    let block_pages = resolve_block_pages(
        config.params.block_size,
        n_pages,
        pg_sys::BLCKSZ,
        buffer_pages(&config, rel, n_pages),
    );
    let mut state = BlockShuffle {
        config,
        scan: std::ptr::null_mut(),
        n_pages,
        toast_pages,
        block_pages,
        blocks: split_blocks(n_pages, block_pages),
        order: Vec::new(),
        next_block: 0,
        in_block: false,
        epoch: 1,
        tuples_this_epoch: 0,
        last_tid: pg_sys::ItemPointerData::default(),
        plain_columns: plain_columns(plan, (*node).ss.ps.qual),
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
    let slot = (*ss).ss_ScanTupleSlot;
    if state.scan.is_null() {
        // SAFETY: a plain heap scan under the query's snapshot; the relation is locked and
        // kept open by the executor. No sync scan: every scan must start where we say.
        let flags = pg_sys::ScanOptions::SO_TYPE_SEQSCAN
            | pg_sys::ScanOptions::SO_ALLOW_STRAT
            | pg_sys::ScanOptions::SO_ALLOW_PAGEMODE;
        state.scan = pg_sys::heap_beginscan(
            (*ss).ss_currentRelation,
            (*(*ss).ps.state).es_snapshot,
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            flags,
        );
    }
    loop {
        if !state.in_block {
            if state.next_block >= state.order.len() {
                return std::ptr::null_mut();
            }
            if state.next_block == 0 {
                state.epochs_started += 1;
            }
            // Cancel and statement_timeout act at least once per block.
            check_for_interrupts!();
            progress::scanning(state.next_block, state.order.len(), state.tuples_this_epoch);
            let (start, len) = state.blocks[state.order[state.next_block]];
            state.next_block += 1;
            // SAFETY: rescan resets the scan (and its limits) before new limits are set, as
            // heap_setscanlimits requires a scan that has not started.
            pg_sys::heap_rescan(state.scan, std::ptr::null_mut(), false, false, false, false);
            pg_sys::heap_setscanlimits(state.scan, start, len);
            state.in_block = true;
            state.blocks_read += 1;
            state.pages_read += len as u64;
        }
        // SAFETY: the scan slot was created by ExecInitCustomScan with the heap's slot ops.
        if pg_sys::heap_getnextslot(
            state.scan,
            pg_sys::ScanDirection::ForwardScanDirection,
            slot,
        ) {
            state.last_tid = (*slot).tts_tid;
            state.tuples_this_epoch += 1;
            return slot;
        }
        state.in_block = false;
    }
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
        if !self.scan.is_null() {
            // SAFETY: the scan was begun by us and is ended exactly once.
            pg_sys::heap_endscan(self.scan);
            self.scan = std::ptr::null_mut();
        }
    }

    unsafe fn explain(&self, es: *mut pg_sys::ExplainState) {
        let state = self;
        let order = if state.config.params.shuffle.shuffles_blocks() {
            "shuffled per epoch"
        } else {
            "sequential"
        };
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
