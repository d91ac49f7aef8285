//! CorgiPile TupleShuffle: pulls tuples from BlockShuffle into a buffer (a contiguous arena of
//! decoded features and labels), shuffles the buffer, and hands whole buffers to the SGD node.
//! Buffers are owned Rust values so that the SGD node can pass them to its worker thread.

use super::block_shuffle::{self, BlockShuffle};
use super::explain;
use super::rows::{decode_features, tid_fraction};
use super::node::{init_child, state_of, Node};
use crate::classes::{ClassDictionary, UNKNOWN_CLASS};
use crate::decode::{format_tid, with_float_array, with_int4_array};
use crate::pipeline::{FeatureLayout, LabelCoding};
use crate::pipeline::{Holdout, Mode};
use crate::error::raise;
use crate::pipeline::PipelineConfig;
use corgipile_ml::arena::TupleArena;
use corgipile_ml::params::{resolve_buffer_tuples, BufferSize, ShuffleMode, TrainParams};
use corgipile_ml::shuffle::{Reservoir, SlidingWindow, TupleShuffler};
use corgipile_ml::model::ModelKind;
use corgipile_ml::trainer::MAX_CLASSES;
use pgrx::{check_for_interrupts, pg_sys, FromDatum, PgSqlErrorCode};

/// One filled buffer: its tuples and the order to visit them in (empty = storage order).
pub struct ShuffledBuffer {
    pub arena: TupleArena,
    pub order: Vec<u32>,
}

pub struct TupleShuffle {
    config: PipelineConfig,
    /// Our own PlanState, for EXPLAIN ANALYZE instrumentation of whole-buffer pulls.
    node: *mut pg_sys::PlanState,
    child: *mut pg_sys::PlanState,
    /// The child's state (BlockShuffle), for the tuple id of each row.
    block: *const BlockShuffle,
    /// The child's `plain_columns`, when rows are read from it directly (not under EXPLAIN
    /// ANALYZE, whose per-node counts need ExecProcNode).
    direct: Option<DirectColumns>,
    epoch: u32,
    shuffler: TupleShuffler,
    exhausted: bool,
    /// Dense: the feature dimension, fixed by the first row. Sparse: unused.
    n_features: Option<usize>,
    /// Training: the model shape (features, classes) already checked against
    /// corgipile.max_model_memory; a row that needs more is checked before the trainer or the
    /// statistics pass allocate. (Other modes score or collect rows: no model grows.)
    checked_features: usize,
    checked_classes: usize,
    /// Tuples per buffer, and the estimated bytes per tuple they were sized with; known once
    /// the first row shows how big a tuple is.
    capacity: usize,
    tuple_bytes: usize,
    /// Cancel is answered every ~1 MB of decoded rows (every 4096 small ones).
    rows_between_interrupt_checks: u64,
    until_interrupt_check: u64,
    /// Label values → class indices (softmax, text labels); pre-filled for evaluation.
    pub classes: ClassDictionary,
    /// Held-out validation rows, collected during the first pass over the table.
    pub validation: Option<TupleArena>,
    first_pass_done: bool,
    /// sliding_window / mrs: the window or reservoir of this epoch, and a one-row staging arena.
    stream: Option<Stream>,
    staging: Option<TupleArena>,
    // Counters for the SGD node and EXPLAIN ANALYZE.
    pub rows_skipped_this_epoch: u64,
    /// Distinct training rows read this epoch (mrs hands SGD more tuples than that).
    pub rows_this_epoch: u64,
    pub buffers_filled: u64,
    pub tuples_read: u64,
    table_bytes: u64,
}

/// Most columns a training query has: label, indices, values, holdout flag.
const MAX_COLUMNS: usize = 4;

/// Table columns read straight from the heap tuple, in the query's order.
struct DirectColumns {
    attnos: Vec<usize>,
    /// The largest of them: how far each tuple is deformed.
    deform_to: i32,
}

/// Where a decoded row goes.
#[derive(Clone, Copy)]
enum Target {
    Train,
    Validation,
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
    Reservoir { reservoir: Reservoir, pass_next: bool, final_pass: bool },
}

impl TupleShuffle {
    pub fn n_buffers(&self) -> u64 {
        if self.config.params.double_buffer {
            2
        } else {
            1
        }
    }

    /// Fill the next buffer of this epoch (reusing `recycled`'s memory), ordered by the
    /// strategy. None when the epoch has no more tuples.
    pub unsafe fn next_buffer(&mut self, recycled: Option<ShuffledBuffer>) -> Option<ShuffledBuffer> {
        // The SGD node pulls whole buffers, bypassing ExecProcNode: count them for EXPLAIN ANALYZE.
        let instrument = (*self.node).instrument;
        if !instrument.is_null() {
            pg_sys::InstrStartNode(instrument);
        }
        let before = self.tuples_read;
        let buffer = recycled.map(|mut b| {
            b.arena.clear();
            b
        });
        let buffer = match self.config.params.shuffle {
            ShuffleMode::SlidingWindow | ShuffleMode::Mrs => self.fill_streamed(buffer),
            _ => self.fill_blocked(buffer),
        };
        if !instrument.is_null() {
            pg_sys::InstrStopNode(instrument, (self.tuples_read - before) as f64);
        }
        let mut b = buffer?;
        if b.arena.is_empty() {
            return None;
        }
        self.buffers_filled += 1;
        if self.config.params.shuffle.shuffles_tuples() {
            self.shuffler.permutation(b.arena.len(), &mut b.order);
        } else {
            b.order.clear();
        }
        Some(b)
    }

    /// corgipile, block_only, no_shuffle: the next `capacity` training rows in scan order.
    unsafe fn fill_blocked(&mut self, buffer: Option<ShuffledBuffer>) -> Option<ShuffledBuffer> {
        // The arena stays in place while rows are pushed (moving it per row cost a memcpy each).
        let (mut arena, order) = match buffer {
            Some(b) => (Some(b.arena), b.order),
            None => (None, Vec::new()),
        };
        while arena.as_ref().is_none_or(|a| a.len() < self.capacity) {
            if matches!(self.pull_row(&mut arena), Pulled::Done) {
                break;
            }
        }
        arena.map(|arena| ShuffledBuffer { arena, order })
    }

    /// sliding_window, mrs: rows stream through the window or reservoir; what it lets go of
    /// (and, for mrs, every other buffer a pass over the reservoir) goes to SGD.
    unsafe fn fill_streamed(&mut self, buffer: Option<ShuffledBuffer>) -> Option<ShuffledBuffer> {
        let mut out = buffer.map(|b| b.arena);
        if let Some(Stream::Reservoir { reservoir, pass_next, .. }) = &mut self.stream {
            if *pass_next && !reservoir.is_empty() {
                *pass_next = false;
                let out = out.get_or_insert_with(|| empty_arena(&self.config.layout, self.n_features));
                reservoir.pass(out);
                return Some(ShuffledBuffer { arena: std::mem::replace(out, TupleArena::new(0, 0)), order: Vec::new() });
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
                let out = out.get_or_insert_with(|| empty_arena(&self.config.layout, self.n_features));
                let capacity = self.capacity;
                let (seed, epoch) = (self.config.seed(), self.epoch);
                let stream = self.stream.get_or_insert_with(|| match self.config.params.shuffle {
                    ShuffleMode::SlidingWindow => Stream::Window(SlidingWindow::new(capacity, seed, epoch)),
                    _ => Stream::Reservoir { reservoir: Reservoir::new(capacity, seed, epoch), pass_next: false, final_pass: false },
                });
                match stream {
                    Stream::Window(w) => w.push(staging.label(0), staging.row(0), out),
                    Stream::Reservoir { reservoir, .. } => reservoir.push(staging.label(0), staging.row(0), out),
                }
                staging.clear();
            }
            self.staging = staging;
            if matches!(pulled, Pulled::Done) {
                // End of the scan: empty the window / one last pass over the reservoir.
                let out = out.get_or_insert_with(|| empty_arena(&self.config.layout, self.n_features));
                match &mut self.stream {
                    Some(Stream::Window(w)) => w.drain(out),
                    Some(Stream::Reservoir { reservoir, final_pass, .. }) if !*final_pass => {
                        *final_pass = true;
                        reservoir.pass(out);
                    }
                    _ => {}
                }
                break;
            }
        }
        out.map(|arena| ShuffledBuffer { arena, order: Vec::new() })
    }

    /// Calls `f` on every buffer of this pass (one epoch), recycling each into the next.
    pub unsafe fn for_each_buffer(&mut self, mut f: impl FnMut(&ShuffledBuffer)) {
        let mut spare = None;
        while let Some(b) = self.next_buffer(spare.take()) {
            f(&b);
            spare = Some(b);
        }
    }

    /// Pull the next row from BlockShuffle. A training row is decoded into `arena` (created,
    /// and the buffer capacity fixed, on the first row); a validation row into the validation
    /// arena during the first pass.
    unsafe fn pull_row(&mut self, arena: &mut Option<TupleArena>) -> Pulled {
        if self.exhausted {
            return Pulled::Done;
        }
        // The query's columns (label, features..., holdout) in order.
        let mut direct_values = [pg_sys::Datum::from(0usize); MAX_COLUMNS];
        let mut direct_nulls = [false; MAX_COLUMNS];
        let (values, nulls) = if let Some(direct) = &self.direct {
            // SAFETY: child is our initialized BlockShuffle node, whose output is exactly these
            // table columns (plain_columns); the heap slot and the page its datums point into
            // stay valid until the next fetch.
            let slot = block_shuffle::fetch(self.child.cast());
            if slot.is_null() || ((*slot).tts_flags & pg_sys::TTS_FLAG_EMPTY as u16) != 0 {
                return self.end_of_scan();
            }
            if ((*slot).tts_nvalid as i32) < direct.deform_to {
                pg_sys::slot_getsomeattrs_int(slot, direct.deform_to);
            }
            for (k, &attno) in direct.attnos.iter().enumerate() {
                direct_values[k] = *(*slot).tts_values.add(attno - 1);
                direct_nulls[k] = *(*slot).tts_isnull.add(attno - 1);
            }
            (direct_values.as_mut_ptr(), direct_nulls.as_mut_ptr())
        } else {
            // SAFETY: child is our initialized BlockShuffle node; its result slot stays valid
            // until the next ExecProcNode call.
            let slot = pg_sys::ExecProcNode(self.child);
            if slot.is_null() || ((*slot).tts_flags & pg_sys::TTS_FLAG_EMPTY as u16) != 0 {
                return self.end_of_scan();
            }
            let natts = (*(*slot).tts_tupleDescriptor).natts;
            if ((*slot).tts_nvalid as i32) < natts {
                pg_sys::slot_getsomeattrs_int(slot, natts);
            }
            ((*slot).tts_values, (*slot).tts_isnull)
        };
        // SAFETY: the child is our BlockShuffle node (see begin).
        let tid = &(*self.block).last_tid;
        let target = match self.config.holdout {
            Holdout::None => Target::Train,
            Holdout::Column(c) => {
                if !*nulls.add(c) && (*values.add(c)).value() & 0xff != 0 { Target::Validation } else { Target::Train }
            }
            Holdout::Fraction(f) => {
                if tid_fraction(tid) < f { Target::Validation } else { Target::Train }
            }
        };
        if matches!(target, Target::Validation) && self.first_pass_done {
            return Pulled::Skipped; // collected during the first pass already
        }
        let feature_nulls = match self.config.layout {
            FeatureLayout::Dense { .. } => *nulls.add(1),
            FeatureLayout::Sparse { .. } => *nulls.add(1) || *nulls.add(2),
        };
        if *nulls.add(0) || feature_nulls {
            self.rows_skipped_this_epoch += 1;
            return Pulled::Skipped;
        }
        let label = self.decode_label(*values.add(0), tid);
        let pushed = match target {
            Target::Train => {
                let a = arena.get_or_insert_with(|| self.new_arena_like(values));
                decode_features(&self.config.layout, &mut self.n_features, a, label, values, tid)
            }
            Target::Validation => {
                let v = self.validation.get_or_insert_with(|| empty_arena(&self.config.layout, self.n_features));
                let pushed = decode_features(&self.config.layout, &mut self.n_features, v, label, values, tid);
                // Held-out rows stay in memory for the whole training: same bound as the buffers.
                if v.bytes_used() as u64 > self.config.max_buffer_bytes {
                    raise(
                        PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                        format!("the validation rows of {} do not fit in corgipile.max_buffer_memory", self.config.relation),
                        Some("Hold out a smaller fraction, or evaluate afterwards with corgipile_evaluate().".into()),
                    );
                }
                pushed
            }
        };
        if !pushed {
            self.rows_skipped_this_epoch += 1;
            return Pulled::Skipped;
        }
        let dimension = match (self.config.layout, target) {
            (FeatureLayout::Dense { .. }, _) => self.n_features.unwrap_or(0),
            (FeatureLayout::Sparse { .. }, Target::Train) => arena.as_ref().map_or(0, |a| a.n_features()),
            (FeatureLayout::Sparse { .. }, Target::Validation) => self.validation.as_ref().map_or(0, |a| a.n_features()),
        };
        if dimension > self.checked_features && self.config.mode == Mode::Train {
            self.check_model_size(dimension, self.checked_classes, tid);
            self.checked_features = dimension;
        }
        if matches!(target, Target::Validation) {
            return Pulled::Validation;
        }
        self.tuples_read += 1;
        self.rows_this_epoch += 1;
        self.until_interrupt_check -= 1;
        if self.until_interrupt_check == 0 {
            self.until_interrupt_check = self.rows_between_interrupt_checks;
            check_for_interrupts!();
        }
        Pulled::Row
    }

    fn end_of_scan(&mut self) -> Pulled {
        self.exhausted = true;
        self.first_pass_done = true;
        Pulled::Done
    }

    /// The f64 the trainer sees for this label datum (a value or a class index).
    unsafe fn decode_label(&mut self, datum: pg_sys::Datum, tid: &pg_sys::ItemPointerData) -> f64 {
        let finite = |v: f64| -> f64 {
            if !v.is_finite() {
                raise(
                    PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
                    format!("row at ctid {}: label is {}", format_tid(tid), v),
                    Some("Labels must be finite numbers. Train on a copy without such rows, e.g. CREATE TABLE t2 AS SELECT * FROM t WHERE label NOT IN ('NaN', 'Infinity', '-Infinity').".into()),
                );
            }
            v
        };
        let class = match self.config.label {
            LabelCoding::Value(kind) => return finite(kind.to_f64(datum)),
            LabelCoding::ClassOfValue(kind) => self.classes.index_of_number(finite(kind.to_f64(datum))),
            LabelCoding::ClassOfText => {
                // SAFETY: the label column was cast to text in the query; the datum is non-NULL.
                let text = <&str as FromDatum>::from_datum(datum, false).unwrap_or("");
                self.classes.index_of_text(text.as_bytes())
            }
        };
        if class == UNKNOWN_CLASS {
            return class as f64; // evaluation: a label the model does not know
        }
        // A binary classifier over text labels: a third class is an error now, before the
        // dictionary grows with every distinct label of the table.
        if self.config.model.is_binary() && class >= 2 && self.config.mode == Mode::Train {
            let c = &self.classes.classes;
            raise(
                PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
                format!(
                    "the label column has more than two distinct values (saw {}, {} and {})",
                    c[0].to_text(), c[1].to_text(), c[class as usize].to_text()
                ),
                Some("svm and logistic are binary classifiers: the label must have exactly two distinct values (softmax handles more).".into()),
            );
        }
        if class as usize >= MAX_CLASSES {
            raise(
                PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                format!("the label column of {} has more than {MAX_CLASSES} distinct values (row at ctid {})", self.config.relation, format_tid(tid)),
                Some(format!("softmax supports at most {MAX_CLASSES} classes.")),
            );
        }
        // Softmax has one output per class: check each new class before the trainer grows.
        if self.config.model == ModelKind::Softmax && class as usize >= self.checked_classes && self.config.mode == Mode::Train {
            let classes = class as usize + 1;
            self.check_model_size(self.checked_features, classes, tid);
            self.checked_classes = classes;
        }
        class as f64
    }

    /// Raise unless a model of `features` × `classes` fits corgipile.max_model_memory.
    fn check_model_size(&self, features: usize, classes: usize, tid: &pg_sys::ItemPointerData) {
        let source = match self.config.layout {
            _ if classes > self.checked_classes => format!("the classes of the label column, up to the row at ctid {}", format_tid(tid)),
            FeatureLayout::Sparse { n_features: Some(_), .. } => "the n_features param".to_string(),
            FeatureLayout::Sparse { .. } => format!("the largest feature index, in the row at ctid {}", format_tid(tid)),
            FeatureLayout::Dense { .. } => format!("the length of the features, in the row at ctid {}", format_tid(tid)),
        };
        crate::guc::check_model_size(features as u64, classes as u64, self.config.max_model_bytes, &source);
    }

    /// The first training arena: the buffer capacity comes from the first row (dense: its
    /// length; sparse: its number of non-zeros).
    unsafe fn new_arena_like(&mut self, values: *mut pg_sys::Datum) -> TupleArena {
        let bytes_per_tuple = match self.config.layout {
            FeatureLayout::Dense { .. } => {
                let n = with_float_array(*values.add(1), |f| f.len()).unwrap_or(0);
                TupleArena::bytes_per_tuple(self.n_features.unwrap_or(n))
            }
            FeatureLayout::Sparse { .. } => {
                let nnz = with_int4_array(*values.add(1), |i| i.len()).unwrap_or(0);
                TupleArena::bytes_per_sparse_tuple(nnz.max(1))
            }
        };
        // resolve_buffer_tuples works in dense-equivalent features: (n + 1) * 8 bytes per tuple.
        let equivalent_features = bytes_per_tuple.div_ceil(8).saturating_sub(1).max(1);
        let params = &self.config.params;
        let tuples = match resolve_buffer_tuples(
            params.buffer_size,
            params.buffer_size_explicit,
            equivalent_features,
            self.table_bytes,
            self.n_buffers(),
            self.config.max_buffer_bytes,
        ) {
            Ok(t) => t,
            Err(e) => raise(PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED, e.message, e.hint),
        };
        self.capacity = tuples.max(1) as usize;
        self.tuple_bytes = bytes_per_tuple;
        self.rows_between_interrupt_checks = ((1usize << 20) / bytes_per_tuple.max(1)).clamp(1, 4096) as u64;
        self.until_interrupt_check = self.until_interrupt_check.min(self.rows_between_interrupt_checks);
        // Streaming strategies keep their rows in the window/reservoir instead.
        let reserve = if self.config.params.shuffle.shuffles_blocks() || self.config.params.shuffle == ShuffleMode::NoShuffle { self.capacity } else { 1 };
        let arena = match self.config.layout {
            FeatureLayout::Dense { .. } => {
                let n = bytes_per_tuple / 8 - 1;
                TupleArena::try_new(n, reserve)
            }
            FeatureLayout::Sparse { .. } => {
                let nnz = (bytes_per_tuple.saturating_sub(16)) / 12;
                TupleArena::try_new_sparse(reserve, reserve.saturating_mul(nnz.max(1)))
            }
        };
        arena.unwrap_or_else(|_| {
            raise(
                PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
                format!("out of memory for a tuple buffer of {} rows ({} bytes each)", reserve, bytes_per_tuple),
                Some("Use a smaller buffer_size, or ask a superuser to lower corgipile.max_buffer_memory.".into()),
            )
        })
    }
}

fn empty_arena(layout: &FeatureLayout, n_features: Option<usize>) -> TupleArena {
    match layout {
        FeatureLayout::Dense { .. } => TupleArena::new(n_features.unwrap_or(0), 0),
        FeatureLayout::Sparse { .. } => TupleArena::new_sparse(0, 0),
    }
}

/// BeginCustomScan (see `Node::begin`).
unsafe fn begin(node: *mut pg_sys::CustomScanState, estate: *mut pg_sys::EState, eflags: i32, config: PipelineConfig) -> TupleShuffle {
    // An n_features param sizes the model from the start (checked up front, see api.rs).
    let declared_features = match config.layout {
        FeatureLayout::Sparse { n_features: Some(n), .. } => n as usize,
        _ => 0,
    };
    let child = init_child(node, estate, eflags);
    // SAFETY: our plan always has the BlockShuffle node as this node's child.
    let block: *const BlockShuffle = state_of::<BlockShuffle>(child.cast());
    let table_bytes = (*block).table_bytes();
    let direct = (*block)
        .plain_columns
        .clone()
        .filter(|c| (*child).instrument.is_null() && c.len() <= MAX_COLUMNS)
        .map(|attnos| DirectColumns { deform_to: attnos.iter().copied().max().unwrap_or(0) as i32, attnos });
    let classes = if config.mode == Mode::Evaluate {
        ClassDictionary::frozen(&config.known_classes)
    } else {
        ClassDictionary::with_classes(&config.known_classes)
    };
    TupleShuffle {
        node: node.cast(),
        classes,
        validation: None,
        first_pass_done: false,
        stream: None,
        staging: None,
        shuffler: TupleShuffler::new(config.seed(), 1),
        config,
        child,
        block,
        direct,
        epoch: 1,
        exhausted: false,
        n_features: None,
        checked_features: declared_features,
        checked_classes: 1,
        capacity: 0,
        tuple_bytes: 0,
        rows_between_interrupt_checks: 4096,
        until_interrupt_check: 4096,
        rows_skipped_this_epoch: 0,
        rows_this_epoch: 0,
        buffers_filled: 0,
        tuples_read: 0,
        table_bytes,
    }
}

/// One buffer's memory as planned (before any row is decoded): the default is clamped to
/// corgipile.max_buffer_memory; a size in tuples is known only once a row's width is.
fn planned_buffer_bytes(state: &TupleShuffle, params: &TrainParams) -> Option<f64> {
    let bytes = match params.buffer_size {
        BufferSize::Fraction(f) => f * state.table_bytes as f64,
        BufferSize::Bytes(b) => b as f64,
        BufferSize::Tuples(_) => return None,
    };
    let limit = (state.config.max_buffer_bytes / state.n_buffers() as u64) as f64;
    Some(if params.buffer_size_explicit { bytes } else { bytes.min(limit) })
}

fn buffer_size_text(spec: BufferSize) -> String {
    match spec {
        BufferSize::Fraction(f) => format!("{}% of table", f * 100.0),
        BufferSize::Bytes(b) => format!("{:.1} MB", b as f64 / 1048576.0),
        BufferSize::Tuples(t) => format!("{t} tuples"),
    }
}

impl Node for TupleShuffle {
    const NAME: &'static std::ffi::CStr = c"CorgiPile TupleShuffle";

    fn exec_methods() -> &'static pg_sys::CustomExecMethods {
        &super::methods().tuple_exec
    }

    unsafe fn begin(css: *mut pg_sys::CustomScanState, estate: *mut pg_sys::EState, eflags: i32, config: PipelineConfig) -> Self {
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
        self.shuffler = TupleShuffler::new(self.config.seed(), self.epoch);
        self.exhausted = false;
        self.stream = None;
        self.rows_skipped_this_epoch = 0;
        self.rows_this_epoch = 0;
        pg_sys::ExecReScan(self.child);
    }

    unsafe fn end(&mut self) {
        pg_sys::ExecEndNode(self.child);
    }

    unsafe fn explain(&self, es: *mut pg_sys::ExplainState) {
        let state = self;
    let params = &state.config.params;
    let strategy = match params.shuffle {
        ShuffleMode::Corgipile => "corgipile (shuffle each buffer)",
        ShuffleMode::BlockOnly => "block_only (no tuple shuffle)",
        ShuffleMode::NoShuffle => "no_shuffle",
        ShuffleMode::SlidingWindow => "sliding_window (TensorFlow shuffle buffer over a sequential scan)",
        ShuffleMode::Mrs => "mrs (Bismarck multiplexed reservoir sampling over a sequential scan)",
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
        explain::int(es, "Rows Skipped Per Epoch", state.rows_skipped_this_epoch as i64);
    }
}
}
