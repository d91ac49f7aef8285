//! Decoding one row's label and features (datums of the training query) into a tuple arena,
//! and the ERRORs for bad rows, which name the row's ctid.

use crate::decode::datum::{
    format_tid, with_float_array, with_int4_array, ArrayProblem, FloatSlice,
};
use crate::pg::error::raise;
use crate::pipeline::FeatureLayout;
use corgipile_ml::arena::{SparsePushError, TupleArena};
use pgrx::{pg_sys, PgSqlErrorCode};

/// Decode a row's features into `arena`. Returns false when the row is skipped (empty dense
/// features, or a NULL column of a column list); raises an ERROR naming the ctid for bad data.
///
/// # Safety
/// `values` points to the row's datums of the query's columns (label, then the features as
/// `layout` reads them: a non-NULL float array, or int4 indices and float values), valid for
/// this call.
pub unsafe fn decode_features(
    layout: &FeatureLayout,
    n_features: &mut Option<usize>,
    arena: &mut TupleArena,
    label: f64,
    values: *mut pg_sys::Datum,
    tid: &pg_sys::ItemPointerData,
) -> bool {
    match *layout {
        FeatureLayout::Dense { columns } => {
            let result = with_float_array(*values.add(1), |features| {
                let n = features.len();
                let expected = *n_features.get_or_insert(n);
                if n != expected {
                    raise(
                        PgSqlErrorCode::ERRCODE_ARRAY_ELEMENT_ERROR,
                        format!(
                            "row at ctid {}: features has {} elements, expected {} (the length of the first row read)",
                            format_tid(tid), n, expected
                        ),
                        Some("Every row's feature array must have the same length.".into()),
                    );
                }
                if !features.all_finite() {
                    raise_not_finite(tid);
                }
                if arena.n_features() != n && arena.is_empty() {
                    *arena = TupleArena::new(n, 0);
                }
                match features {
                    FloatSlice::F64(s) => arena.push(label, s),
                    FloatSlice::F32(s) => arena.push_f32(label, s),
                }
            });
            match result {
                Ok(()) => true,
                Err(ArrayProblem::Empty) => false,
                Err(ArrayProblem::HasNulls) if columns => false,
                Err(problem) => raise(
                    PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
                    format!("row at ctid {}: {}", format_tid(tid), problem),
                    Some(
                        "Features must be a one-dimensional numeric array without NULL elements."
                            .into(),
                    ),
                ),
            }
        }
        FeatureLayout::Sparse {
            index_base,
            n_features: declared,
        } => {
            let result = with_int4_array(*values.add(1), |indices| {
                let pushed = with_float_array(*values.add(2), |vals| {
                    push_sparse(arena, label, indices, vals, index_base, declared, tid)
                });
                match pushed {
                    Ok(()) => {}
                    Err(ArrayProblem::Empty) => push_sparse(
                        arena,
                        label,
                        indices,
                        FloatSlice::F64(&[]),
                        index_base,
                        declared,
                        tid,
                    ),
                    Err(problem) => raise_sparse_problem(tid, "values", problem),
                }
            });
            match result {
                Ok(()) => true,
                Err(ArrayProblem::Empty) => {
                    // No indices: an all-zero row, valid if the values are empty too.
                    let values_len = with_float_array(*values.add(2), |v| v.len()).unwrap_or(0);
                    if values_len != 0 {
                        raise_sparse_problem_text(
                            tid,
                            format!("sparse row has 0 indices but {values_len} values"),
                        );
                    }
                    arena.push_sparse(label, &[], &[]);
                    true
                }
                Err(problem) => raise_sparse_problem(tid, "indices", problem),
            }
        }
        FeatureLayout::Tabular => unreachable!("column lists are decoded by the encoder"),
    }
}

unsafe fn push_sparse(
    arena: &mut TupleArena,
    label: f64,
    indices: &[i32],
    values: FloatSlice<'_>,
    index_base: i64,
    declared: Option<u32>,
    tid: &pg_sys::ItemPointerData,
) {
    let declared = declared.map(|n| n as usize);
    let pushed = match values {
        FloatSlice::F64(v) => arena.try_push_sparse(label, indices, index_base, declared, v),
        FloatSlice::F32(v) => arena.try_push_sparse(label, indices, index_base, declared, v),
    };
    match pushed {
        Ok(()) => {}
        Err(SparsePushError::Index(e)) => raise_sparse_problem_text(tid, e.to_string()),
        Err(SparsePushError::NotFinite) => raise_not_finite(tid),
    }
}

unsafe fn raise_not_finite(tid: &pg_sys::ItemPointerData) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
        format!(
            "row at ctid {}: features contain NaN or Infinity",
            format_tid(tid)
        ),
        Some("Feature values must be finite numbers.".into()),
    )
}

unsafe fn raise_sparse_problem(
    tid: &pg_sys::ItemPointerData,
    which: &str,
    problem: ArrayProblem,
) -> ! {
    raise_sparse_problem_text(tid, format!("sparse feature {which}: {problem}"))
}

unsafe fn raise_sparse_problem_text(tid: &pg_sys::ItemPointerData, problem: String) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
        format!("row at ctid {}: {}", format_tid(tid), problem),
        Some("Sparse rows need equally long index and value arrays, indices strictly increasing and within range (see the index_base and n_features params).".into()),
    )
}
