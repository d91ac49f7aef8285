//! Evaluate mode (corgipile_evaluate): score a stored model on every row of a relation.

use super::{SgdNode, SgdTask};
use crate::catalog::StoredModel;
use crate::error::raise;
use crate::pipeline::Mode;
use corgipile_ml::metrics::BinaryMetrics;
use corgipile_ml::scoring::{BinaryLabels, Evaluation};
use pgrx::{check_for_interrupts, PgSqlErrorCode};
use serde_json::json;
use std::rc::Rc;

/// Score `model`; the output is corgipile_evaluate's JSON report.
pub struct Evaluate {
    pub model: Rc<StoredModel>,
}

impl SgdTask for Evaluate {
    type Output = serde_json::Value;
    const MODE: Mode = Mode::Evaluate;

    unsafe fn run(self, node: &mut SgdNode) -> serde_json::Value {
        node.evaluate(&self.model)
    }
}

impl SgdNode {
    /// corgipile_evaluate: score the stored model on every row.
    unsafe fn evaluate(&mut self, model: &StoredModel) -> serde_json::Value {
        let shuffle = self.shuffle();
        // ROC AUC keeps one score per row: bounded by the same limit as the training buffers.
        let auc_rows = self.config.max_buffer_bytes as usize / BinaryMetrics::AUC_BYTES_PER_ROW;
        // Binary labels arrive as values (numeric) or class indices (text, pre-seeded with the
        // model's classes, so index 1 is the positive class).
        let binary = if self.config.label.uses_classes() {
            BinaryLabels::ClassIndices
        } else {
            let value = |k: usize| {
                model
                    .classes
                    .get(k)
                    .and_then(|c| c.as_f64())
                    .unwrap_or(f64::NAN)
            };
            BinaryLabels::Values {
                negative: value(0),
                positive: value(1),
            }
        };
        let mut evaluation = Evaluation::new(model.kind(), model.classes.len(), binary, auc_rows);
        shuffle.for_each_buffer(|b| {
            if !b.arena.is_sparse() && b.arena.n_features() != model.n_features() {
                raise(
                    PgSqlErrorCode::ERRCODE_ARRAY_ELEMENT_ERROR,
                    format!("the rows of {} have {} features, model {} expects {}", self.config.relation, b.arena.n_features(), model.id, model.n_features()),
                    Some("Evaluate on rows with the features the model was trained on (see the features param).".into()),
                );
            }
            for i in 0..b.arena.len() {
                check_for_interrupts!();
                evaluation.push(&model.model, b.arena.row(i), b.arena.label(i));
            }
        });
        let mut report = evaluation.finish(shuffle.rows_skipped_this_epoch);
        report["model_id"] = json!(model.id);
        report
    }
}
