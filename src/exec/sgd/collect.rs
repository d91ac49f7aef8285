//! Collect mode: every row of a relation in one arena (a validation relation, read before
//! training with the same block scan and decoding); and a sample of a relation's rows
//! (`SampleRows`, for corgipile_feature_importance).

use super::{SgdNode, SgdTask};
use crate::exec::sgd::binary_labels;
use crate::exec::tuple_shuffle::ShuffledBuffer;
use crate::pg::error::raise;
use crate::pipeline::Mode;
use crate::pipeline::{ClassValue, HeldOutRows};
use corgipile_ml::arena::TupleArena;
use corgipile_ml::row::Row;
use corgipile_ml::scoring::BinaryLabels;
use pgrx::PgSqlErrorCode;

/// Every row of a relation, and the class of each class index its labels got.
pub struct CollectedRows {
    pub rows: ShuffledBuffer,
    pub classes: Vec<ClassValue>,
    /// Which rows they are, when asked for (a gated training's held-out rows).
    pub held_out: Option<HeldOutRows>,
}

/// Collect every row; None when the relation has no usable row. `record_held_out`: say which
/// rows they are too (a gated training scores the deployed version on them).
pub struct Collect {
    pub record_held_out: bool,
}

impl SgdTask for Collect {
    type Output = Option<CollectedRows>;
    const MODE: Mode = Mode::Collect;

    unsafe fn run(self, node: &mut SgdNode) -> Option<CollectedRows> {
        if self.record_held_out {
            node.shuffle().rows_mut().record_held_out();
        }
        node.collect()
    }
}

/// The first `rows` rows the scan gives (with the CorgiPile order, a uniform sample of blocks,
/// shuffled), as a flat row-major copy of `width` features a row (a column list's sparse rows
/// made dense), their labels, and how binary labels arrive. The scan stops once it has them.
pub struct SampleRows {
    pub rows: usize,
    pub width: usize,
    pub classes: Vec<ClassValue>,
}

pub struct SampledRows {
    pub features: Vec<f64>,
    pub labels: Vec<f64>,
    pub width: usize,
    pub binary: BinaryLabels,
}

impl SgdTask for SampleRows {
    type Output = SampledRows;
    const MODE: Mode = Mode::Evaluate;

    unsafe fn run(self, node: &mut SgdNode) -> SampledRows {
        let binary = binary_labels(node.config.label.uses_classes(), &self.classes);
        let shuffle = node.shuffle();
        let width = self.width;
        let (mut features, mut labels) = (Vec::new(), Vec::new());
        let mut spare = None;
        while labels.len() < self.rows {
            let Some(mut b) = shuffle.next_buffer(spare.take()) else {
                break;
            };
            // Visit the buffer in its shuffled order: the rows kept are a sample of it too.
            let (arena, order) = b.visit();
            let n = arena.len();
            for k in 0..n.min(self.rows - labels.len()) {
                let i = order.map_or(k, |o| o[k] as usize);
                let at = features.len();
                match arena.row(i) {
                    Row::Dense(x) if x.len() == width => features.extend_from_slice(x),
                    Row::Sparse { indices, values } => {
                        features.resize(at + width, 0.0);
                        for (&j, &v) in indices.iter().zip(values) {
                            if let Some(slot) = features.get_mut(at + j as usize) {
                                *slot = v;
                            }
                        }
                    }
                    Row::Dense(x) => raise(
                        PgSqlErrorCode::ERRCODE_ARRAY_ELEMENT_ERROR,
                        format!("the rows of {} have {} features, the model {width}", node.config.relation, x.len()),
                        Some("Score rows with the features the model was trained on (see the features param).".into()),
                    ),
                }
                labels.push(arena.label(i));
            }
            spare = Some(b);
        }
        SampledRows {
            features,
            labels,
            width,
            binary,
        }
    }
}

impl SgdNode {
    /// Collect mode: every row in one arena (a validation relation), bounded by the buffer limit.
    unsafe fn collect(&mut self) -> Option<CollectedRows> {
        let shuffle = self.shuffle();
        let mut all: Option<ShuffledBuffer> = None;
        shuffle.for_each_buffer(|b| {
            let dst = all.get_or_insert_with(|| {
                ShuffledBuffer::in_storage_order(if b.arena.is_sparse() {
                    TupleArena::new_sparse(0, 0)
                } else {
                    TupleArena::new(b.arena.n_features(), 0)
                })
            });
            for i in 0..b.arena.len() {
                match b.arena.row(i) {
                    Row::Dense(x) => dst.arena.push(b.arena.label(i), x),
                    Row::Sparse { indices, values } => {
                        dst.arena.push_sparse(b.arena.label(i), indices, values)
                    }
                }
            }
            if dst.arena.bytes_used() as u64 > self.config.max_buffer_bytes {
                raise(
                    PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                    format!(
                        "the validation relation {} does not fit in corgipile.max_buffer_memory",
                        self.config.relation
                    ),
                    Some(
                        "Use a smaller validation relation, or {\"fraction\": ...} validation."
                            .into(),
                    ),
                );
            }
        });
        // A gated training's record of which rows they are (16 bytes a row) counts too.
        let recorded = shuffle.rows().held_out_bytes();
        let collected = all.as_ref().map_or(0, |a| a.arena.bytes_used());
        if (collected + recorded) as u64 > self.config.max_buffer_bytes {
            raise(
                PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                format!(
                    "the validation relation {} and the record of its rows do not fit in corgipile.max_buffer_memory",
                    self.config.relation
                ),
                Some("Use a smaller validation relation, or {\"fraction\": ...} validation.".into()),
            );
        }
        let held_out = shuffle.rows_mut().take_held_out();
        all.map(|rows| CollectedRows {
            rows,
            classes: shuffle.rows().classes().classes.clone(),
            held_out,
        })
    }
}
