//! CorgiPile BlockShuffle: scans the relation one block (a range of pages) at a time, visiting
//! the blocks in a fresh seeded random order every epoch. Pages are read through the buffer
//! manager by PostgreSQL's heap scan (`heap_setscanlimits` over each page range) with the
//! query's MVCC snapshot; WHERE/RLS quals and the projection are applied by `ExecScan`.
//!
//! A partitioned table, or a table with inheritance children, is read as `SELECT` reads it: the
//! blocks of every leaf table form one pool, visited in one random order per epoch (so a table
//! partitioned by month is shuffled across months). Rows of a leaf are converted to the
//! parent's columns (order, dropped columns) before the parent's quals and projection see them.

use crate::exec::explain;
use crate::exec::node::Node;
use crate::exec::page_reader::{self};
use crate::pg::progress;
use crate::pipeline::{BlockShare, PipelineConfig};
use corgipile_ml::params::{resolve_block_pages, BufferSize};
use corgipile_ml::shuffle::{block_order, split_blocks};
use pgrx::{check_for_interrupts, pg_guard, pg_sys};

mod fetch;
mod filter;
pub use fetch::{fetch_columns, rows_on_page};
use fetch::{next_tuple, plain_columns};
use filter::PageFilter;

mod leaves;
mod read_ahead;
pub use leaves::all_inheritors;
use leaves::{close_leaves, leaf_columns, open_leaves, TableScan};
use read_ahead::ReadAhead;

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

/// An incremental training's blocks: `blocks[..old_blocks]` end before page `page`, the others
/// were added since; each epoch reads every new block and a fresh `replay` share of the old.
#[derive(Clone, Copy)]
struct Since {
    page: u32,
    old_blocks: usize,
    replay: f64,
}

/// A pass over a uniform sample of the blocks: at least the first `blocks` of the pass's
/// order, then on (block by block) until `min_rows` training rows were taken.
#[derive(Clone, Copy)]
struct Sample {
    blocks: usize,
    min_rows: u64,
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
    /// The shuffle buffer's size in pages, all processes' together (it sets how far the hints
    /// run ahead of the reader: `read_ahead`).
    buffer_pages: u64,
    blocks: Vec<Block>,
    /// This process's part of every epoch's blocks (parallel training).
    share: BlockShare,
    order: Vec<usize>,
    /// Hints of the pages to be read next (see `read_ahead`).
    read_ahead: ReadAhead,
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
    /// is plain columns and any quals can be evaluated on the page reader's rows: TupleShuffle
    /// then reads them straight from the heap tuple (`fetch_columns`), without ExecScan's
    /// projection and two guarded calls per row.
    pub plain_columns: Option<Vec<usize>>,
    /// The page reader's quals (a `"where"` filter, row-level security), if any.
    filter: Option<PageFilter>,
    /// `"since"`: the new blocks every epoch, and a sample of the old ones.
    since: Option<Since>,
    /// A sampled statistics pass (see `sample_this_pass`), until the next rescan.
    sample: Option<Sample>,
    /// Training rows TupleShuffle has taken from this pass (a sample reads on until enough).
    pub rows_taken: u64,
    /// The blocks a sampled statistics pass read at least (EXPLAIN).
    sampled_blocks: Option<usize>,
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

    /// This pass (not begun yet) reads a uniform sample of the blocks: at least `fraction` of
    /// the pages and `min_pages` of them, the first blocks of a seeded permutation, in ascending
    /// order (a pass of sums does not care about order, and storage likes it); then more of
    /// that permutation until TupleShuffle has taken `min_rows` rows. The block shuffle's own
    /// order is not used: without `shuffle` its first blocks would be the table's first.
    /// Returns the sample's blocks (before any reading on), for EXPLAIN.
    pub fn sample_this_pass(&mut self, fraction: f64, min_pages: u64, min_rows: u64) -> usize {
        let total = self.order.len();
        let pages = ((fraction * self.n_pages as f64).ceil() as u64).max(min_pages);
        let blocks = pages.div_ceil(self.block_pages.max(1) as u64) as usize;
        if blocks >= total {
            return total;
        }
        let salt = self.config.seed() ^ 0x57a7_15e5_5a4b_1e00;
        let permutation = block_order(total, salt, self.epoch, true);
        let mut order: Vec<usize> = permutation.iter().map(|&i| self.order[i]).collect();
        order[..blocks].sort_unstable();
        self.order = order;
        self.read_ahead = self.new_read_ahead(true);
        self.set_leaf_ranges();
        self.sample = Some(Sample { blocks, min_rows });
        self.sampled_blocks = Some(blocks);
        blocks
    }

    /// Hints for a pass (`enabled`: its order is not the table's), about one of this process's
    /// buffers ahead (parallel workers split the buffer between them).
    fn new_read_ahead(&self, enabled: bool) -> ReadAhead {
        let pages = self.buffer_pages / u64::from(self.share.processes.max(1));
        ReadAhead::new(enabled, read_ahead::hint_window(pages))
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
        self.order = match self.since {
            None => block_order(self.blocks.len(), self.config.seed(), self.epoch, shuffle),
            Some(since) => {
                // A uniform sample of the old blocks (its own seeded permutation's first k),
                // with every new block, in the epoch's order.
                let old = since.old_blocks;
                let k = ((since.replay * old as f64).round() as usize).min(old);
                let salt = self.config.seed() ^ 0x5eed_0f01_db10_c0de;
                let mut chosen: Vec<usize> = block_order(old, salt, self.epoch, true)[..k].to_vec();
                chosen.sort_unstable();
                chosen.extend(old..self.blocks.len());
                block_order(chosen.len(), self.config.seed(), self.epoch, shuffle)
                    .into_iter()
                    .map(|i| chosen[i])
                    .collect()
            }
        };
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
        self.read_ahead = self.new_read_ahead(self.config.params.shuffle.shuffles_blocks());
        self.next_block = 0;
        self.sample = None;
        self.rows_taken = 0;
        self.in_block = false;
        self.cursor.page = 0;
        self.cursor.end = 0;
        self.cursor.tuple = 0;
        self.cursor.ntuples = 0;
        self.tuples_this_epoch = 0;
        for leaf in &mut self.leaves {
            leaf.stream_started = false;
        }
        self.set_leaf_ranges();
    }

    /// Each leaf's page ranges in this pass's order (what its read-ahead reads).
    fn set_leaf_ranges(&mut self) {
        for leaf in &mut self.leaves {
            leaf.ranges.clear();
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
        if let Some(s) = self.sample {
            if self.next_block >= s.blocks && self.rows_taken >= s.min_rows {
                return None;
            }
        }
        if self.next_block == 0 {
            self.epochs_started += 1;
        }
        check_for_interrupts!();
        self.read_ahead
            .advance(self.next_block, &self.order, &self.blocks, &mut self.leaves);
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
    let mut plain = plain_columns(plan);
    let filter = match plain {
        Some(_) => PageFilter::new(node, estate),
        None => None,
    };
    if !(*plan).scan.plan.qual.is_null() && filter.is_none() {
        plain = None; // quals the page reader cannot evaluate: ExecScan's path
    }
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
            if let Some(f) = &filter {
                leaf.filter_columns = leaf_columns(leaf.map, &f.columns);
            }
            let deform_to = leaf
                .columns
                .iter()
                .chain(&leaf.filter_columns)
                .copied()
                .max()
                .unwrap_or(0);
            leaf.attrs = page_reader::attrs((*leaf.rel).rd_att, deform_to);
        }
        let pages =
            pg_sys::RelationGetNumberOfBlocksInFork(leaf.rel, pg_sys::ForkNumber::MAIN_FORKNUM);
        leaf_pages.push(pages);
        n_pages += pages as u64;
        toast += toast_pages(leaf.rel) as u64;
    }
    let buffer_pages = buffer_pages(&config, &leaves, n_pages);
    let block_pages = resolve_block_pages(
        config.params.block_size,
        n_pages.min(u32::MAX as u64) as u32,
        pg_sys::BLCKSZ,
        buffer_pages,
    );
    // "since" (one table): the blocks before its first new page, then the new ones.
    let from = match (config.read_from, leaf_pages.as_slice()) {
        (Some(r), [pages]) => Some(r.pages.min(*pages)),
        _ => None,
    };
    let blocks: Vec<Block> = match from {
        Some(from) => {
            let old = split_blocks(from, block_pages);
            let new = split_blocks(leaf_pages[0] - from, block_pages);
            old.into_iter()
                .chain(new.into_iter().map(|(start, len)| (start + from, len)))
                .map(|(start, len)| Block {
                    leaf: 0,
                    start,
                    len,
                })
                .collect()
        }
        None => leaf_pages
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
            .collect(),
    };
    let since = from.map(|from| Since {
        page: from,
        old_blocks: blocks.iter().take_while(|b| b.start < from).count(),
        replay: config.read_from.map_or(0.0, |r| r.replay),
    });
    let mut state = BlockShuffle {
        config,
        leaves,
        converts,
        current_leaf: 0,
        n_pages,
        toast_pages: toast,
        block_pages,
        buffer_pages,
        blocks,
        share: BlockShare::ALL,
        order: Vec::new(),
        read_ahead: ReadAhead::new(false, 0), // replaced when a pass's order is drawn
        next_block: 0,
        in_block: false,
        cursor: PageCursor::default(),
        epoch: 1,
        tuples_this_epoch: 0,
        last_tid: pg_sys::ItemPointerData::default(),
        plain_columns: plain,
        filter,
        since,
        sample: None,
        rows_taken: 0,
        sampled_blocks: None,
        blocks_read: 0,
        pages_read: 0,
        epochs_started: 0,
    };
    state.draw_order();
    state
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
        if let Some(since) = state.since {
            let old = since.old_blocks;
            let replayed = ((since.replay * old as f64).round() as usize).min(old);
            explain::text(
                es,
                "Since",
                &format!(
                    "page {}: {} new blocks and {} of {} older ones ({}) per epoch",
                    since.page,
                    state.blocks.len() - old,
                    replayed,
                    old,
                    since.replay
                ),
            );
        }
        explain::text(es, "Block Order", order);
        if let Some(blocks) = state.sampled_blocks {
            explain::text(
                es,
                "Statistics Sample",
                &format!("{blocks} of {} blocks", state.blocks.len()),
            );
        }
        explain::int(es, "Seed", state.config.seed() as i64);
        if explain::analyzing(es) {
            explain::int(es, "Epochs Scanned", state.epochs_started as i64);
            explain::int(es, "Blocks Read", state.blocks_read as i64);
            explain::int(es, "Pages Read", state.pages_read as i64);
        }
    }
}
