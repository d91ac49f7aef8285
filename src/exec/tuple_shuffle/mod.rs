//! CorgiPile TupleShuffle: pulls tuples from BlockShuffle into a buffer (a contiguous arena of
//! decoded features and labels), shuffles the buffer, and hands whole buffers to the SGD node.
//! Buffers are owned Rust values so that the SGD node can pass them to its worker thread.

use super::block_shuffle::{self, BlockShuffle};
use super::explain;
use super::node::{init_child, state_of, Node};
mod pull;
mod sizing;

use crate::decode::RowDecoder;
use crate::pg::error::raise;
use crate::pipeline::LabelKind;
use crate::pipeline::PipelineConfig;
use crate::pipeline::{BlockShare, EpochCounts, FeatureLayout};
use corgipile_ml::arena::TupleArena;
use corgipile_ml::params::ShuffleMode;
use corgipile_ml::shuffle::{BufferShuffle, TupleShuffler};
use corgipile_ml::streams::{Reservoir, SlidingWindow};
use pgrx::{pg_sys, PgSqlErrorCode};
use sizing::{buffer_size_text, over_limit_text, planned_buffer_bytes};
use std::sync::{Arc, Mutex};

/// One filled buffer: its tuples, in the order they were read, and how to visit them.
pub struct ShuffledBuffer {
    pub arena: TupleArena,
    /// The order to visit the tuples in, once drawn (empty: storage order).
    order: Vec<u32>,
    /// The tuple shuffle, not drawn yet (see [`visit`](Self::visit)).
    pending: Option<PendingShuffle>,
}

/// A buffer's tuple shuffle to draw: from its epoch's shuffler, as `plan` says.
struct PendingShuffle {
    shuffler: Arc<Mutex<TupleShuffler>>,
    plan: BufferShuffle,
}

impl ShuffledBuffer {
    /// Rows visited in the order they are stored.
    pub fn in_storage_order(arena: TupleArena) -> ShuffledBuffer {
        ShuffledBuffer {
            arena,
            order: Vec::new(),
            pending: None,
        }
    }

    /// The tuples and the order to visit them in (None: storage order). The first call draws
    /// the tuple shuffle, on the thread that trains on the buffer: the SGD worker when
    /// double-buffered, which has time to spare while the backend, the bottleneck of an epoch,
    /// reads the next buffer. The buffers of an epoch share one random stream, so whoever
    /// visits them visits them in the order they were filled (each consumer takes buffers in
    /// that order); a pass that never asks for the order draws nothing.
    pub fn visit(&mut self) -> (&TupleArena, Option<&[u32]>) {
        if let Some(p) = self.pending.take() {
            // A panic while drawing (never expected) poisons the lock; the stream is then
            // only as good as the other buffers' orders, which the panic's ERROR discards.
            let mut shuffler = p.shuffler.lock().unwrap_or_else(|e| e.into_inner());
            shuffler.visiting_order(p.plan, self.arena.len(), &mut self.order);
        }
        let order = (!self.order.is_empty()).then_some(self.order.as_slice());
        (&self.arena, order)
    }
}

pub struct TupleShuffle {
    /// The rows' decoder; it holds the pipeline's config.
    rows: RowDecoder,
    /// Our own PlanState, for EXPLAIN ANALYZE instrumentation of whole-buffer pulls.
    ///
    /// `node`, `child` and `block` are set in begin and valid as long as this TupleShuffle,
    /// which lives in the node's state: the methods rely on it.
    node: *mut pg_sys::PlanState,
    child: *mut pg_sys::PlanState,
    /// The child's state (BlockShuffle), for the tuple id of each row.
    block: *mut BlockShuffle,
    /// This process's part of the blocks (parallel training); its rank also seeds the tuple
    /// shuffle, so that processes do not shuffle their buffers alike.
    share: BlockShare,
    /// How many `plain_columns` the child has, when rows are read from it by its page reader
    /// (not under EXPLAIN ANALYZE, whose per-node counts need ExecProcNode).
    direct: Option<usize>,
    /// The row the page reader hands over (as many entries as `direct` says).
    direct_values: Vec<pg_sys::Datum>,
    direct_nulls: Vec<bool>,
    epoch: u32,
    /// This epoch's tuple shuffler, shared with the buffers it shuffles (see
    /// `ShuffledBuffer::visit`); and how the buffer being filled is to be shuffled.
    shuffler: Arc<Mutex<TupleShuffler>>,
    plan: BufferShuffle,
    exhausted: bool,
    /// Tuples per buffer, and the estimated bytes per tuple they were sized with; known once
    /// the first row shows how big a tuple is.
    capacity: usize,
    tuple_bytes: usize,
    /// Cancel is answered every ~1 MB of decoded rows (every 4096 small ones).
    rows_between_interrupt_checks: u64,
    until_interrupt_check: u64,
    /// Sparse features' scales, applied to each filled training buffer (see
    /// `scale_sparse_rows`).
    sparse_scale: Option<Vec<f64>>,
    /// The buffer the end of the last pass came back with, empty, for the next pass to fill:
    /// dropping it cost a new allocation every pass, whose pages the next fill faulted in
    /// again (the kernel zeroing them: 8% of a dense epoch).
    kept: Option<ShuffledBuffer>,
    /// sliding_window / mrs: the window or reservoir of this epoch, and a one-row staging arena.
    stream: Option<Stream>,
    staging: Option<TupleArena>,
    // Counters for the SGD node (see `counts`) and EXPLAIN ANALYZE.
    rows_skipped_this_epoch: u64,
    /// Distinct training rows read this epoch (mrs hands SGD more tuples than that).
    rows_this_epoch: u64,
    /// The tuple ids of the rows counted this epoch (see `EpochCounts::tids`).
    tids_this_epoch: u64,
    buffers_filled: u64,
    /// Rows of a next epoch read into the room of an epoch's last buffer (see `fill_ahead`).
    rows_read_ahead: u64,
    tuples_read: u64,
    table_bytes: u64,
}

/// A row's part of `EpochCounts::tids`: its tuple id, mixed (a multiply and a shift: a plain
/// sum of ids would not tell rows {1, 4} from rows {2, 3}).
#[inline(always)]
pub(crate) fn tid_hash(tid: &pg_sys::ItemPointerData) -> u64 {
    let block = (u64::from(tid.ip_blkid.bi_hi) << 16) | u64::from(tid.ip_blkid.bi_lo);
    let x = ((block << 16) | u64::from(tid.ip_posid)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^ (x >> 29)
}

/// What pulling one row from the child gave.
enum Pulled {
    /// A training row, decoded into the arena.
    Row,
    /// A validation row (kept aside).
    Validation,
    /// Skipped (NULL label or features, or a validation row already collected).
    Skipped,
    /// The epoch's scan is over.
    Done,
}

/// The state of a streaming strategy within one epoch.
enum Stream {
    Window(SlidingWindow),
    Reservoir {
        reservoir: Reservoir,
        pass_next: bool,
        final_pass: bool,
    },
}

impl TupleShuffle {
    pub fn config(&self) -> &PipelineConfig {
        self.rows.config()
    }

    /// The rows' decoder: the classes seen, the held-out rows, the preprocessing.
    pub fn rows(&self) -> &RowDecoder {
        &self.rows
    }

    pub fn rows_mut(&mut self) -> &mut RowDecoder {
        &mut self.rows
    }

    /// The rows read and skipped in this epoch's pass so far.
    pub fn counts(&self) -> EpochCounts {
        EpochCounts {
            rows: self.rows_this_epoch,
            rows_skipped: self.rows_skipped_this_epoch,
            tids: self.tids_this_epoch,
        }
    }

    pub fn n_buffers(&self) -> u64 {
        if self.rows.config().params.double_buffer {
            2
        } else {
            1
        }
    }

    /// Parallel training: from now on this process reads `share` of the blocks of the epochs
    /// numbered from `block_epoch` on (see `BlockShuffle::set_share`), into buffers of its part
    /// of the memory (the buffer size and limit are split between the processes). Called
    /// before the epoch's first row.
    pub fn set_share(&mut self, share: BlockShare, block_epoch: u32) {
        self.share = share;
        // SAFETY: the child's state lives as long as this node's.
        unsafe { (*self.block).set_share(share, block_epoch) };
        self.epoch = block_epoch;
        self.shuffler = shuffler(self.tuple_seed(), self.epoch);
        // A capacity fixed already (by a statistics pass) is split too.
        if self.capacity > 0 {
            self.capacity = (self.capacity / share.processes as usize).max(1);
        }
    }

    /// A shard's round (see `crate::shard`): this call reads `share` of the blocks of epoch
    /// `block_epoch`, into buffers of the whole buffer memory.
    pub fn set_round(&mut self, share: BlockShare, block_epoch: u32) {
        // SAFETY: the child's state lives as long as this node's.
        unsafe { (*self.block).set_share(share, block_epoch) };
        self.epoch = block_epoch;
        self.shuffler = shuffler(self.tuple_seed() ^ u64::from(share.rank), self.epoch);
    }

    /// The epoch whose block order the child reads.
    pub fn block_epoch(&self) -> u32 {
        // SAFETY: the child's state lives as long as this node's.
        unsafe { (*self.block).epoch() }
    }

    fn tuple_seed(&self) -> u64 {
        self.rows.config().seed() ^ (u64::from(self.share.rank)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    /// Fill the next buffer of this epoch (reusing `recycled`'s memory), ordered by the
    /// strategy. None when the epoch has no more tuples.
    pub fn next_buffer(&mut self, recycled: Option<ShuffledBuffer>) -> Option<ShuffledBuffer> {
        let buffer = self.recycle(recycled);
        self.fill(buffer)
    }

    /// The buffer to fill next: `recycled` (or the one the last pass came back with) emptied,
    /// and its tuple shuffle planned.
    fn recycle(&mut self, recycled: Option<ShuffledBuffer>) -> Option<ShuffledBuffer> {
        self.plan = BufferShuffle::Whole;
        recycled.or_else(|| self.kept.take()).map(|mut b| {
            b.arena.clear();
            b.order.clear();
            b.pending = None;
            self.plan_shuffle(&b.arena);
            b
        })
    }

    /// Fills `buffer` (from `recycle`, None before the first) on to its capacity; None when
    /// the epoch has no more tuples.
    fn fill(&mut self, buffer: Option<ShuffledBuffer>) -> Option<ShuffledBuffer> {
        // The SGD node pulls whole buffers, bypassing ExecProcNode: count them for EXPLAIN ANALYZE.
        // SAFETY: our PlanState lives as long as this node's state.
        let instrument = unsafe { (*self.node).instrument };
        if !instrument.is_null() {
            // SAFETY: an FFI call on the backend thread, on the node's live instrumentation.
            unsafe { pg_sys::InstrStartNode(instrument) };
        }
        let before = self.tuples_read;
        let buffer = match self.rows.config().params.shuffle {
            ShuffleMode::SlidingWindow | ShuffleMode::Mrs => self.fill_streamed(buffer),
            _ => self.fill_blocked(buffer),
        };
        if !instrument.is_null() {
            // SAFETY: as for InstrStartNode above.
            unsafe { pg_sys::InstrStopNode(instrument, (self.tuples_read - before) as f64) };
        }
        let mut b = buffer?;
        if b.arena.is_empty() {
            self.kept = Some(b);
            return None;
        }
        self.buffers_filled += 1;
        if let Some(scale) = &self.sparse_scale {
            b.arena.scale_values(scale);
        }
        if self.rows.config().params.shuffle.shuffles_tuples() {
            b.pending = Some(PendingShuffle {
                shuffler: self.shuffler.clone(),
                plan: self.plan,
            });
        }
        Some(b)
    }

    /// Whether `last`, the buffer just filled, ended the pass short of full, with room the
    /// next pass's first rows can be read into ahead (`fill_ahead`): a dense, unscaled buffer
    /// of a strategy that fills buffers in scan order.
    pub fn can_fill_ahead(&self, last: &ShuffledBuffer) -> bool {
        self.exhausted
            && !matches!(
                self.rows.config().params.shuffle,
                ShuffleMode::SlidingWindow | ShuffleMode::Mrs
            )
            && self.sparse_scale.is_none()
            && last.arena.can_move_rows()
            && last.arena.len() < self.capacity
    }

    /// The next pass's first buffer begun with the rows `fill_ahead` read into `last` from row
    /// `from` on, moved out of it (leaving `last` as the pass handed it back) into `recycled`;
    /// `fill_on` fills it on. The same rows, in the same order, as `next_buffer` would have
    /// read into `recycled`.
    pub fn take_ahead(
        &mut self,
        recycled: ShuffledBuffer,
        last: &mut ShuffledBuffer,
        from: usize,
    ) -> ShuffledBuffer {
        // Planned while empty, as next_buffer plans it (a buffer planned full is shuffled
        // another way), then given the rows.
        let mut next = self.recycle(Some(recycled)).expect("a buffer to fill");
        self.rows_read_ahead += (last.arena.len() - from) as u64;
        last.arena.move_rows_to(from, &mut next.arena);
        next
    }

    /// Fills the buffer `take_ahead` began on to its capacity.
    pub fn fill_on(&mut self, begun: ShuffledBuffer) -> Option<ShuffledBuffer> {
        self.fill(Some(begun))
    }

    /// corgipile: how the buffer about to be filled into `arena` (empty) is to be shuffled,
    /// decided before its first row as `TupleArena::shuffle_plan` says.
    fn plan_shuffle(&mut self, arena: &TupleArena) {
        if self.rows.config().params.shuffle.shuffles_tuples() {
            self.plan = arena.shuffle_plan(self.capacity);
        }
    }

    /// corgipile, block_only, no_shuffle: the next `capacity` training rows in scan order.
    fn fill_blocked(&mut self, buffer: Option<ShuffledBuffer>) -> Option<ShuffledBuffer> {
        // The arena stays in place while rows are pushed (moving it per row cost a memcpy each).
        let (mut arena, order) = match buffer {
            Some(b) => (Some(b.arena), b.order),
            None => (None, Vec::new()),
        };
        self.pull_rows(&mut arena, || false);
        arena.map(|arena| ShuffledBuffer {
            arena,
            order,
            pending: None,
        })
    }

    /// sliding_window, mrs: rows stream through the window or reservoir; what it lets go of
    /// (and, for mrs, every other buffer a pass over the reservoir) goes to SGD.
    fn fill_streamed(&mut self, buffer: Option<ShuffledBuffer>) -> Option<ShuffledBuffer> {
        let mut out = buffer.map(|b| b.arena);
        if let Some(Stream::Reservoir {
            reservoir,
            pass_next,
            ..
        }) = &mut self.stream
        {
            if *pass_next && !reservoir.is_empty() {
                *pass_next = false;
                let out = out.get_or_insert_with(|| self.rows.empty_arena());
                reservoir.pass(out);
                return Some(ShuffledBuffer::in_storage_order(std::mem::replace(
                    out,
                    TupleArena::new(0, 0),
                )));
            }
        }
        loop {
            if out.as_ref().is_some_and(|o| o.len() >= self.capacity) {
                if let Some(Stream::Reservoir { pass_next, .. }) = &mut self.stream {
                    *pass_next = true;
                }
                break;
            }
            let mut staging = self.staging.take();
            let pulled = self.pull_row(&mut staging);
            if let (Pulled::Row, Some(staging)) = (&pulled, staging.as_mut()) {
                let out = out.get_or_insert_with(|| self.rows.empty_arena());
                let capacity = self.capacity;
                let (seed, epoch) = (self.rows.config().seed(), self.epoch);
                let stream =
                    self.stream
                        .get_or_insert_with(|| match self.rows.config().params.shuffle {
                            ShuffleMode::SlidingWindow => {
                                Stream::Window(SlidingWindow::new(capacity, seed, epoch))
                            }
                            _ => Stream::Reservoir {
                                reservoir: Reservoir::new(capacity, seed, epoch),
                                pass_next: false,
                                final_pass: false,
                            },
                        });
                match stream {
                    Stream::Window(w) => w.push(staging.label(0), staging.row(0), out),
                    Stream::Reservoir { reservoir, .. } => {
                        reservoir.push(staging.label(0), staging.row(0), out)
                    }
                }
                staging.clear();
            }
            self.staging = staging;
            if matches!(pulled, Pulled::Done) {
                // End of the scan: empty the window / one last pass over the reservoir.
                let out = out.get_or_insert_with(|| self.rows.empty_arena());
                match &mut self.stream {
                    Some(Stream::Window(w)) => w.drain(out),
                    Some(Stream::Reservoir {
                        reservoir,
                        final_pass,
                        ..
                    }) if !*final_pass => {
                        *final_pass = true;
                        reservoir.pass(out);
                    }
                    _ => {}
                }
                break;
            }
        }
        out.map(ShuffledBuffer::in_storage_order)
    }

    /// From now on, multiply the values of each filled sparse buffer by their features'
    /// `scale` before SGD gets it (the arena counts its rows as scaled, and SGD skips its
    /// standardizer; see `TupleArena::scale_values`): on a model of millions of features the
    /// scales are as much a cache miss per non-zero as the weights, which bound the SGD
    /// thread, while the backend has time to spare. Not for sliding_window and mrs, whose
    /// rows are copied on through a window (SGD scales them), nor when the copy of the scales
    /// cannot be allocated.
    pub fn scale_sparse_rows(&mut self, scale: &[f64]) {
        let streamed = matches!(
            self.rows.config().params.shuffle,
            ShuffleMode::SlidingWindow | ShuffleMode::Mrs
        );
        if !matches!(self.rows.config().layout, FeatureLayout::Sparse { .. }) || streamed {
            return;
        }
        let mut copy = Vec::new();
        if copy.try_reserve_exact(scale.len()).is_ok() {
            copy.extend_from_slice(scale);
            self.sparse_scale = Some(copy);
        }
    }

    /// This pass (a statistics pass, not begun yet) reads a uniform sample of the blocks (see
    /// `BlockShuffle::sample_this_pass`).
    pub fn sample_this_pass(&mut self, fraction: f64, min_pages: u64, min_rows: u64) {
        // SAFETY: the child's state lives as long as this node's.
        unsafe { (*self.block).sample_this_pass(fraction, min_pages, min_rows) };
    }

    /// Calls `f` on every buffer of this pass (one epoch), recycling each into the next.
    pub fn for_each_buffer(&mut self, mut f: impl FnMut(&mut ShuffledBuffer)) {
        let mut spare = None;
        while let Some(mut b) = self.next_buffer(spare.take()) {
            f(&mut b);
            spare = Some(b);
        }
    }
}

/// BeginCustomScan (see `Node::begin`).
unsafe fn begin(
    node: *mut pg_sys::CustomScanState,
    estate: *mut pg_sys::EState,
    eflags: i32,
    config: PipelineConfig,
) -> TupleShuffle {
    let child = init_child(node, estate, eflags);
    // SAFETY: our plan always has the BlockShuffle node as this node's child.
    let block: *mut BlockShuffle = state_of::<BlockShuffle>(child.cast());
    let table_bytes = (*block).table_bytes();
    let direct = (*block)
        .plain_columns
        .as_ref()
        .map(|c| c.len())
        .filter(|_| (*child).instrument.is_null());
    TupleShuffle {
        node: node.cast(),
        sparse_scale: None,
        kept: None,
        stream: None,
        staging: None,
        shuffler: shuffler(config.seed(), 1),
        plan: BufferShuffle::Whole,
        rows: RowDecoder::new(config, number_kinds(child)),
        child,
        block,
        share: BlockShare::ALL,
        direct,
        direct_values: vec![pg_sys::Datum::from(0usize); direct.unwrap_or(0)],
        direct_nulls: vec![false; direct.unwrap_or(0)],
        epoch: 1,
        exhausted: false,
        capacity: 0,
        tuple_bytes: 0,
        rows_between_interrupt_checks: 4096,
        until_interrupt_check: 4096,
        rows_skipped_this_epoch: 0,
        rows_this_epoch: 0,
        tids_this_epoch: 0,
        buffers_filled: 0,
        rows_read_ahead: 0,
        tuples_read: 0,
        table_bytes,
    }
}
impl Node for TupleShuffle {
    const NAME: &'static std::ffi::CStr = c"CorgiPile TupleShuffle";

    fn exec_methods() -> &'static pg_sys::CustomExecMethods {
        &super::methods().tuple_exec
    }

    unsafe fn begin(
        css: *mut pg_sys::CustomScanState,
        estate: *mut pg_sys::EState,
        eflags: i32,
        config: PipelineConfig,
    ) -> Self {
        begin(css, estate, eflags, config)
    }

    unsafe fn exec(&mut self, _css: *mut pg_sys::CustomScanState) -> *mut pg_sys::TupleTableSlot {
        raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            "CorgiPile TupleShuffle hands whole buffers to CorgiPile SGD and cannot return single rows",
            None,
        )
    }

    unsafe fn rescan(&mut self) {
        self.epoch += 1;
        self.shuffler = shuffler(self.tuple_seed(), self.epoch);
        self.exhausted = false;
        self.stream = None;
        self.rows_skipped_this_epoch = 0;
        self.rows_this_epoch = 0;
        self.tids_this_epoch = 0;
        pg_sys::ExecReScan(self.child);
    }

    unsafe fn end(&mut self) {
        pg_sys::ExecEndNode(self.child);
    }

    unsafe fn explain(&self, es: *mut pg_sys::ExplainState) {
        let state = self;
        let params = &state.rows.config().params;
        let strategy = match params.shuffle {
            ShuffleMode::Corgipile => "corgipile (shuffle each buffer)",
            ShuffleMode::BlockOnly => "block_only (no tuple shuffle)",
            ShuffleMode::NoShuffle => "no_shuffle",
            ShuffleMode::SlidingWindow => {
                "sliding_window (TensorFlow shuffle buffer over a sequential scan)"
            }
            ShuffleMode::Mrs => {
                "mrs (Bismarck multiplexed reservoir sampling over a sequential scan)"
            }
        };
        explain::text(es, "Strategy", strategy);
        explain::text(es, "Buffer Size", &buffer_size_text(params.buffer_size));
        if let Some(bytes) = planned_buffer_bytes(state, params) {
            let mb = |b: f64| b / 1048576.0;
            explain::text(
                es,
                "Buffer Memory",
                &format!(
                    "{:.1} MB per buffer x {} ({:.1}% of the table's {:.1} MB)",
                    mb(bytes),
                    state.n_buffers(),
                    100.0 * bytes / state.table_bytes.max(1) as f64,
                    mb(state.table_bytes as f64)
                ),
            );
            if let Some(text) = over_limit_text(state, params, bytes) {
                explain::text(es, "Memory Limit", &text);
            }
        }
        explain::boolean(es, "Double Buffered", params.double_buffer);
        if explain::analyzing(es) {
            if state.buffers_filled > 0 {
                let bytes = state.capacity as u64 * state.tuple_bytes as u64;
                explain::text(
                    es,
                    "Buffer",
                    &format!(
                        "{} tuples ({:.1} MB, {:.1}% of table) x {}",
                        state.capacity,
                        bytes as f64 / 1048576.0,
                        100.0 * bytes as f64 / state.table_bytes.max(1) as f64,
                        state.n_buffers()
                    ),
                );
            }
            explain::int(es, "Buffers Filled", state.buffers_filled as i64);
            explain::int(es, "Tuples Decoded", state.tuples_read as i64);
            if params.double_buffer {
                explain::int(es, "Rows Read Ahead", state.rows_read_ahead as i64);
            }
            explain::int(
                es,
                "Rows Skipped Per Epoch",
                state.rows_skipped_this_epoch as i64,
            );
        }
    }
}

/// An epoch's tuple shuffler, to share with the buffers it shuffles.
fn shuffler(seed: u64, epoch: u32) -> Arc<Mutex<TupleShuffler>> {
    Arc::new(Mutex::new(TupleShuffler::new(seed, epoch)))
}

/// The number kind of each output column of `child` (float8 for a column that is no number:
/// never read as one).
unsafe fn number_kinds(child: *mut pg_sys::PlanState) -> Vec<LabelKind> {
    // SAFETY: an initialized scan node has its result type; its attributes are the query's
    // output columns, in order.
    let desc = (*child).ps_ResultTupleDesc;
    if desc.is_null() {
        return Vec::new();
    }
    crate::pg::compat::tuple_desc_attrs(desc)
        .iter()
        .map(|a| LabelKind::from_type(pg_sys::getBaseType(a.atttypid)).unwrap_or(LabelKind::Float8))
        .collect()
}
