//! Evaluate mode (corgipile_evaluate): score a stored model on every row of a relation.

use super::{SgdNode, SgdTask};
use crate::catalog::StoredModel;
use crate::error::raise;
use crate::pipeline::Mode;
use corgipile_ml::metrics::{BinaryMetrics, MulticlassMetrics, RegressionMetrics};
use corgipile_ml::model::{sigmoid, ModelKind};
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
        let k = model.classes.len();
        // ROC AUC keeps one score per row: bounded by the same limit as the training buffers.
        let auc_rows = self.config.max_buffer_bytes as usize / BinaryMetrics::AUC_BYTES_PER_ROW;
        let mut binary = BinaryMetrics::with_auc_limit(auc_rows);
        let mut multi = MulticlassMetrics::new(k.max(1));
        let mut regression = RegressionMetrics::new();
        let mut probs = Vec::new();
        let (mut scored, mut unknown) = (0u64, 0u64);
        let numeric_classes: Vec<Option<f64>> = model.classes.iter().map(|c| c.as_f64()).collect();
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
                let (row, label) = (b.arena.row(i), b.arena.label(i));
                match model.kind() {
                    ModelKind::Linear => regression.push(model.model.decision(row), label),
                    ModelKind::Softmax => {
                        let actual = label as usize;
                        if actual >= k {
                            unknown += 1;
                            continue;
                        }
                        let p = model.model.predict_proba(row, &mut probs).then(|| probs[actual]);
                        multi.push(model.model.predict(row) as usize, actual, p);
                    }
                    ModelKind::Svm | ModelKind::Logistic => {
                        // Labels arrive as values (numeric) or class indices (text, pre-seeded
                        // with the model's classes, so index 1 is the positive class).
                        let positive = if self.config.label.uses_classes() {
                            match label as usize {
                                0 => false,
                                1 => true,
                                _ => {
                                    unknown += 1;
                                    continue;
                                }
                            }
                        } else if Some(label) == numeric_classes[1] {
                            true
                        } else if Some(label) == numeric_classes[0] {
                            false
                        } else {
                            unknown += 1;
                            continue;
                        };
                        let z = model.model.decision(row);
                        let p = (model.kind() == ModelKind::Logistic).then(|| sigmoid(z));
                        binary.push(z, p, positive);
                    }
                }
                scored += 1;
            }
        });
        let mut report = match model.kind() {
            ModelKind::Linear => serde_json::to_value(regression.finish()),
            ModelKind::Softmax => serde_json::to_value(multi.finish()),
            _ => serde_json::to_value(binary.finish()),
        }
        .expect("metrics serialize");
        report["model_id"] = json!(model.id);
        report["rows_scored"] = json!(scored);
        report["rows_skipped"] = json!(shuffle.rows_skipped_this_epoch + unknown);
        if unknown > 0 {
            report["rows_with_unknown_label"] = json!(unknown);
        }
        if report.get("roc_auc").is_some_and(|v| v.is_null()) && scored as usize > auc_rows {
            report["roc_auc_note"] = json!("not computed: more rows than corgipile.max_buffer_memory can hold scores for");
        }
        report
    }

}
