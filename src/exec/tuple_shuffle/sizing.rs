//! How big a buffer is: the capacity fixed from the first row's width, the arena reserved for
//! it (fallibly), and what EXPLAIN says of the planned buffer memory.

use super::TupleShuffle;
use crate::pg::error::raise;
use crate::pipeline::FeatureLayout;
use corgipile_ml::arena::TupleArena;
use corgipile_ml::params::{
    format_bytes_human, resolve_buffer_tuples, BufferSize, ShuffleMode, TrainParams,
};
use pgrx::{pg_sys, PgSqlErrorCode};

impl TupleShuffle {
    /// The first training arena: the buffer capacity comes from the first row (dense: its
    /// length; sparse: its number of non-zeros).
    ///
    /// # Safety
    /// `values`/`nulls` are a training row as [`RowDecoder::target`](crate::decode::RowDecoder::target)
    /// takes it (the query's columns), valid for this call.
    pub(super) unsafe fn new_arena_like(
        &mut self,
        values: *mut pg_sys::Datum,
        nulls: *mut bool,
    ) -> TupleArena {
        let bytes_per_tuple = self.rows.bytes_per_tuple(values, nulls);
        // resolve_buffer_tuples works in dense-equivalent features: (n + 1) * 8 bytes per tuple.
        let equivalent_features = bytes_per_tuple.div_ceil(8).saturating_sub(1).max(1);
        let params = &self.rows.config().params;
        let tuples = match resolve_buffer_tuples(
            params.buffer_size,
            params.buffer_size_explicit,
            equivalent_features,
            self.table_bytes,
            self.n_buffers(),
            self.rows.config().max_buffer_bytes,
        ) {
            Ok(t) => t,
            Err(e) => raise(
                PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                e.message,
                e.hint,
            ),
        };
        // Parallel training: each process has its part of the buffer memory.
        self.capacity = (tuples / u64::from(self.share.processes)).max(1) as usize;
        self.tuple_bytes = bytes_per_tuple;
        self.rows_between_interrupt_checks =
            ((1usize << 20) / bytes_per_tuple.max(1)).clamp(1, 4096) as u64;
        self.until_interrupt_check = self
            .until_interrupt_check
            .min(self.rows_between_interrupt_checks);
        // Streaming strategies keep their rows in the window/reservoir instead.
        let reserve = if self.rows.config().params.shuffle.shuffles_blocks()
            || self.rows.config().params.shuffle == ShuffleMode::NoShuffle
        {
            self.capacity
        } else {
            1
        };
        let arena = match self.rows.config().layout {
            FeatureLayout::Dense { .. } => {
                let n = bytes_per_tuple / 8 - 1;
                TupleArena::try_new(n, reserve)
            }
            FeatureLayout::Sparse { .. } | FeatureLayout::Tabular => {
                let nnz = (bytes_per_tuple.saturating_sub(16)) / 12;
                TupleArena::try_new_sparse(reserve, reserve.saturating_mul(nnz.max(1)))
            }
        };
        let mut arena = arena.unwrap_or_else(|_| {
            raise(
                PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
                format!("out of memory for a tuple buffer of {} rows ({} bytes each)", reserve, bytes_per_tuple),
                Some("Use a smaller buffer_size, or ask a superuser to lower corgipile.max_buffer_memory.".into()),
            )
        });
        // A buffer sized as a fraction of the table, on a table read without a filter, fills:
        // its pages may be faulted in ahead of the rows. A filter, or a size given in bytes or
        // rows, may leave most of the room empty: then pages are touched as rows arrive.
        // SAFETY: child is our initialized BlockShuffle node (see begin).
        let fills = matches!(params.buffer_size, BufferSize::Fraction(_));
        if reserve > 1 && fills && (*self.child).qual.is_null() {
            arena.prefault();
        }
        arena
    }
}

/// One buffer's memory as planned (before any row is decoded): the default is clamped to
/// corgipile.max_buffer_memory; a size in tuples is known only once a row's width is.
pub(super) fn planned_buffer_bytes(state: &TupleShuffle, params: &TrainParams) -> Option<f64> {
    let bytes = match params.buffer_size {
        BufferSize::Fraction(f) => f * state.table_bytes as f64,
        BufferSize::Bytes(b) => b as f64,
        BufferSize::Tuples(_) => return None,
    };
    let limit = (state.rows.config().max_buffer_bytes / state.n_buffers()) as f64;
    Some(if params.buffer_size_explicit {
        bytes
    } else {
        bytes.min(limit)
    })
}

/// What EXPLAIN says when an explicit buffer_size plans more than corgipile.max_buffer_memory
/// (the training would stop with an ERROR once its first row shows the buffers' size).
pub(super) fn over_limit_text(
    state: &TupleShuffle,
    params: &TrainParams,
    bytes: f64,
) -> Option<String> {
    let limit = state.rows.config().max_buffer_bytes;
    let planned = bytes * state.n_buffers() as f64;
    (params.buffer_size_explicit && planned > limit as f64).then(|| {
        format!(
            "{} of {:.1} MB {} corgipile.max_buffer_memory ({}): the training would stop with an ERROR; lower buffer_size{}, or raise the setting",
            if state.n_buffers() == 1 { "1 buffer".to_string() } else { format!("{} buffers", state.n_buffers()) },
            bytes / 1048576.0,
            if state.n_buffers() == 1 { "exceeds" } else { "exceed" },
            format_bytes_human(u128::from(limit)),
            if state.n_buffers() > 1 { ", set double_buffer to false" } else { "" },
        )
    })
}

pub(super) fn buffer_size_text(spec: BufferSize) -> String {
    match spec {
        BufferSize::Fraction(f) => format!("{}% of table", f * 100.0),
        BufferSize::Bytes(b) => format!("{:.1} MB", b as f64 / 1048576.0),
        BufferSize::Tuples(t) => format!("{t} tuples"),
    }
}
