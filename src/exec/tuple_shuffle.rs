//! CorgiPile TupleShuffle: pulls tuples from BlockShuffle into a buffer (a contiguous arena of
//! decoded features and labels), shuffles the buffer, and hands whole buffers to the SGD node.
//! Buffers are owned Rust values so that the SGD node can pass them to its worker thread.

use super::block_shuffle::BlockShuffleState;
use super::{config_of, create_node, explain, init_child, install_state, methods, state_of};
use crate::decode::{format_ctid, with_float_array, ArrayProblem, FloatSlice};
use crate::error::raise;
use crate::plan::PipelineConfig;
use corgipile_ml::arena::TupleArena;
use corgipile_ml::params::{resolve_buffer_tuples, BufferSize, ShuffleMode};
use corgipile_ml::shuffle::TupleShuffler;
use pgrx::{check_for_interrupts, pg_guard, pg_sys, PgSqlErrorCode};

/// One filled buffer: its tuples and the order to visit them in (empty = storage order).
pub struct ShuffledBuffer {
    pub arena: TupleArena,
    pub order: Vec<u32>,
}

pub struct TupleShuffleState {
    config: PipelineConfig,
    /// Our own PlanState, for EXPLAIN ANALYZE instrumentation of whole-buffer pulls.
    node: *mut pg_sys::PlanState,
    child: *mut pg_sys::PlanState,
    epoch: u32,
    shuffler: TupleShuffler,
    exhausted: bool,
    n_features: Option<usize>,
    /// Tuples per buffer; known once the first row gives the feature dimension.
    capacity: usize,
    // Counters for the SGD node and EXPLAIN ANALYZE.
    pub rows_skipped_this_epoch: u64,
    pub buffers_filled: u64,
    pub tuples_read: u64,
    table_bytes: u64,
}

impl TupleShuffleState {
    pub fn n_buffers(&self) -> u64 {
        if self.config.params.double_buffer {
            2
        } else {
            1
        }
    }

    /// Fill the next buffer of this epoch (reusing `recycled`'s memory), shuffled if the
    /// strategy says so. None when the epoch has no more tuples.
    pub unsafe fn next_buffer(&mut self, recycled: Option<ShuffledBuffer>) -> Option<ShuffledBuffer> {
        if self.exhausted {
            return None;
        }
        // The SGD node pulls whole buffers, bypassing ExecProcNode: count them for EXPLAIN ANALYZE.
        let instrument = (*self.node).instrument;
        if !instrument.is_null() {
            pg_sys::InstrStartNode(instrument);
        }
        let before = self.tuples_read;
        let mut buffer = recycled.map(|mut b| {
            b.arena.clear();
            b
        });
        let label_kind = self.config.label_kind;
        loop {
            if let Some(b) = &buffer {
                if b.arena.len() >= self.capacity {
                    break;
                }
            }
            // SAFETY: child is our initialized BlockShuffle node; its result slot stays valid
            // until the next ExecProcNode call.
            let slot = pg_sys::ExecProcNode(self.child);
            if slot.is_null() || ((*slot).tts_flags & pg_sys::TTS_FLAG_EMPTY as u16) != 0 {
                self.exhausted = true;
                break;
            }
            if (*slot).tts_nvalid < 3 {
                pg_sys::slot_getsomeattrs_int(slot, 3);
            }
            let values = (*slot).tts_values;
            let nulls = (*slot).tts_isnull;
            if *nulls.add(0) || *nulls.add(1) {
                self.rows_skipped_this_epoch += 1;
                continue;
            }
            let label = label_kind.to_f64(*values.add(0));
            let ctid = *values.add(2);
            if !label.is_finite() {
                raise(
                    PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
                    format!("row at ctid {}: label is {}", format_ctid(ctid), label),
                    Some("Labels must be finite numbers; filter such rows out with a view or WHERE clause.".into()),
                );
            }
            let pushed = with_float_array(*values.add(1), |features| {
                let n = features.len();
                let expected = *self.n_features.get_or_insert(n);
                if n != expected {
                    raise(
                        PgSqlErrorCode::ERRCODE_ARRAY_ELEMENT_ERROR,
                        format!(
                            "row at ctid {}: features has {} elements, expected {} (the length of the first row read)",
                            format_ctid(ctid), n, expected
                        ),
                        Some("Every row's feature array must have the same length.".into()),
                    );
                }
                if !features.all_finite() {
                    raise(
                        PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
                        format!("row at ctid {}: features contain NaN or Infinity", format_ctid(ctid)),
                        Some("Feature values must be finite numbers.".into()),
                    );
                }
                let b = buffer.get_or_insert_with(|| self.new_buffer(n));
                match features {
                    FloatSlice::F64(s) => b.arena.push(label, s),
                    FloatSlice::F32(s) => b.arena.push_f32(label, s),
                }
            });
            match pushed {
                Ok(()) => self.tuples_read += 1,
                Err(ArrayProblem::Empty) => self.rows_skipped_this_epoch += 1,
                Err(problem) => raise(
                    PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
                    format!("row at ctid {}: {}", format_ctid(ctid), problem),
                    Some("Features must be a one-dimensional float8[] or float4[] without NULL elements.".into()),
                ),
            }
            if self.tuples_read.is_multiple_of(4096) {
                check_for_interrupts!();
            }
        }
        if !instrument.is_null() {
            pg_sys::InstrStopNode(instrument, (self.tuples_read - before) as f64);
        }
        let mut b = buffer?;
        if b.arena.is_empty() {
            return None;
        }
        self.buffers_filled += 1;
        if self.config.params.shuffle == ShuffleMode::Corgipile {
            self.shuffler.permutation(b.arena.len(), &mut b.order);
        } else {
            b.order.clear();
        }
        Some(b)
    }

    /// First buffer of the training: now that the dimension is known, size the buffer.
    unsafe fn new_buffer(&mut self, n_features: usize) -> ShuffledBuffer {
        let params = &self.config.params;
        let explicit = params.buffer_size_explicit;
        let tuples = match resolve_buffer_tuples(
            params.buffer_size,
            explicit,
            n_features,
            self.table_bytes,
            self.n_buffers(),
            self.config.max_buffer_bytes,
        ) {
            Ok(t) => t,
            Err(e) => raise(PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED, e.message, e.hint),
        };
        self.capacity = tuples.max(1) as usize;
        ShuffledBuffer {
            arena: TupleArena::new(n_features, self.capacity),
            order: Vec::with_capacity(self.capacity),
        }
    }
}

#[pg_guard]
pub unsafe extern "C-unwind" fn create(cscan: *mut pg_sys::CustomScan) -> *mut pg_sys::Node {
    create_node::<TupleShuffleState>(cscan, &methods().tuple_exec)
}

#[pg_guard]
pub unsafe extern "C-unwind" fn begin(node: *mut pg_sys::CustomScanState, estate: *mut pg_sys::EState, eflags: i32) {
    let config = config_of(node);
    let child = init_child(node, estate, eflags);
    // SAFETY: our plan always has the BlockShuffle node as this node's child.
    let table_bytes = state_of::<BlockShuffleState>(child.cast()).table_bytes();
    let state = TupleShuffleState {
        node: node.cast(),
        shuffler: TupleShuffler::new(config.seed(), 1),
        config,
        child,
        epoch: 1,
        exhausted: false,
        n_features: None,
        capacity: 0,
        rows_skipped_this_epoch: 0,
        buffers_filled: 0,
        tuples_read: 0,
        table_bytes,
    };
    install_state(node, state);
}

#[pg_guard]
pub unsafe extern "C-unwind" fn exec(_node: *mut pg_sys::CustomScanState) -> *mut pg_sys::TupleTableSlot {
    raise(
        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
        "CorgiPile TupleShuffle hands whole buffers to CorgiPile SGD and cannot return single rows",
        None,
    )
}

#[pg_guard]
pub unsafe extern "C-unwind" fn rescan(node: *mut pg_sys::CustomScanState) {
    let state = state_of::<TupleShuffleState>(node);
    state.epoch += 1;
    state.shuffler = TupleShuffler::new(state.config.seed(), state.epoch);
    state.exhausted = false;
    state.rows_skipped_this_epoch = 0;
    pg_sys::ExecReScan(state.child);
}

#[pg_guard]
pub unsafe extern "C-unwind" fn end(node: *mut pg_sys::CustomScanState) {
    let state = state_of::<TupleShuffleState>(node);
    pg_sys::ExecEndNode(state.child);
}

fn buffer_size_text(spec: BufferSize) -> String {
    match spec {
        BufferSize::Fraction(f) => format!("{}% of table", f * 100.0),
        BufferSize::Bytes(b) => format!("{:.1} MB", b as f64 / 1048576.0),
        BufferSize::Tuples(t) => format!("{t} tuples"),
    }
}

#[pg_guard]
pub unsafe extern "C-unwind" fn explain(node: *mut pg_sys::CustomScanState, _ancestors: *mut pg_sys::List, es: *mut pg_sys::ExplainState) {
    let state = state_of::<TupleShuffleState>(node);
    let params = &state.config.params;
    let strategy = match params.shuffle {
        ShuffleMode::Corgipile => "corgipile (shuffle each buffer)",
        ShuffleMode::BlockOnly => "block_only (no tuple shuffle)",
        ShuffleMode::NoShuffle => "no_shuffle",
    };
    explain::text(es, "Strategy", strategy);
    explain::text(es, "Buffer Size", &buffer_size_text(params.buffer_size));
    explain::boolean(es, "Double Buffered", params.double_buffer);
    if explain::analyzing(es) {
        if let Some(n) = state.n_features {
            let bytes = state.capacity as u64 * TupleArena::bytes_per_tuple(n) as u64;
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
