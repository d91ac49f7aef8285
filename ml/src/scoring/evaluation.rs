//! The report of `corgipile_evaluate`: [`Evaluation`] scores a stored model on a table one row
//! at a time; [`EvaluationPart`] is what a shard sends of it, merged on the coordinator.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::metrics::{BinaryMetrics, BinaryPart, MulticlassMetrics, RegressionMetrics, AUC_BINS};
use crate::model::Labels;
use crate::model::{sigmoid, ModelKind, Predictor};
use crate::row::Row;

use super::tables::{EvaluationTables, TableSpec, TablesPart};
use super::BinaryLabels;

/// Why `roc_auc` is null when there were more rows than scores could be kept for.
const ROC_AUC_NOTE: &str =
    "not computed: more rows than corgipile.max_buffer_memory can hold scores for";

/// What a shard sends of its [`Evaluation`]: its kind's metrics, mergeable.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct EvaluationPart {
    binary: Option<BinaryPart>,
    multiclass: Option<MulticlassMetrics>,
    regression: Option<RegressionMetrics>,
    scored: u64,
    unknown: u64,
    /// The tables, when they were asked for (see [`Evaluation::with_tables`]).
    #[serde(default)]
    tables: Option<TablesPart>,
}

impl EvaluationPart {
    /// Rows scored (not counting rows of unknown labels).
    pub fn rows_scored(&self) -> u64 {
        self.scored
    }

    /// Why this part (from another server) cannot be merged into an evaluation of a `kind`
    /// model of `n_classes` classes: the metrics of another kind, or of another shape.
    /// `tables`: what was asked for, which the part must have.
    pub fn check(
        &self,
        kind: ModelKind,
        n_classes: usize,
        tables: Option<TableSpec>,
    ) -> Result<(), String> {
        match (&self.tables, tables) {
            (None, None) => {}
            (Some(part), Some(spec)) => part.check(kind, n_classes, spec)?,
            _ => return Err("evaluation tables were not what was asked for".into()),
        }
        let binary = kind.is_binary();
        if self.binary.is_some() != binary
            || self.multiclass.is_some() != kind.has_class_outputs()
            || self.regression.is_some() == kind.is_classifier()
        {
            return Err(format!(
                "metrics of another kind of model than {}",
                kind.name()
            ));
        }
        // More rows than one PostgreSQL table can hold (2^32 pages of at most 291 tuples).
        const MAX_ROWS: u64 = 1 << 41;
        if self.scored > MAX_ROWS || self.unknown > MAX_ROWS {
            return Err(format!(
                "{} rows scored and {} of unknown labels",
                self.scored, self.unknown
            ));
        }
        // Every kind's counts must add up to the rows scored.
        let counted = if let Some(b) = &self.binary {
            b.check()?;
            b.rows()
        } else if let Some(m) = &self.multiclass {
            m.check(n_classes)?;
            Some(m.rows())
        } else {
            self.regression.as_ref().map(|r| r.rows())
        };
        if counted != Some(self.scored) {
            return Err(format!(
                "metrics of {counted:?} rows where {} were scored",
                self.scored
            ));
        }
        Ok(())
    }
}

/// The metrics of a stored model on a table (corgipile_evaluate), one row at a time.
pub struct Evaluation {
    kind: ModelKind,
    /// Softmax: the model's classes; a label index >= this is unknown.
    n_classes: usize,
    binary: BinaryLabels,
    auc_row_limit: usize,
    binary_metrics: BinaryMetrics,
    multiclass: MulticlassMetrics,
    regression: RegressionMetrics,
    probs: Vec<f64>,
    scored: u64,
    unknown: u64,
    /// ROC AUC from a histogram ([`Evaluation::mergeable`]).
    histogram_auc: bool,
    tables: Option<EvaluationTables>,
}

impl Evaluation {
    /// `n_classes`: the model's classes (softmax); `binary`: how binary labels arrive
    /// (text labels: [`BinaryLabels::ClassIndices`], numeric:
    /// `Values { negative: classes[0], positive: classes[1] }`); `auc_row_limit`: at most
    /// this many scores are kept for ROC AUC (see [`BinaryMetrics::with_auc_limit`]).
    pub fn new(
        kind: ModelKind,
        n_classes: usize,
        binary: BinaryLabels,
        auc_row_limit: usize,
    ) -> Self {
        Evaluation {
            kind,
            n_classes,
            binary,
            auc_row_limit,
            binary_metrics: BinaryMetrics::with_auc_limit(auc_row_limit),
            multiclass: MulticlassMetrics::new(n_classes.max(1)),
            regression: RegressionMetrics::new(),
            probs: Vec::new(),
            scored: 0,
            unknown: 0,
            histogram_auc: false,
            tables: None,
        }
    }

    /// Like `new`, with ROC AUC from a histogram of scores, so that evaluations of the parts
    /// of a table (shards) merge: see [`Evaluation::part`] and [`Evaluation::merge`].
    pub fn mergeable(kind: ModelKind, n_classes: usize, binary: BinaryLabels) -> Self {
        Evaluation {
            binary_metrics: BinaryMetrics::with_histogram(),
            auc_row_limit: usize::MAX,
            histogram_auc: true,
            ..Self::new(kind, n_classes, binary, 0)
        }
    }

    /// Fills the tables of a classifier too (the caller checks
    /// [`EvaluationTables::bytes_needed`] first); [`Evaluation::tables`] has them at the end.
    pub fn with_tables(mut self, spec: TableSpec) -> Self {
        self.tables = Some(EvaluationTables::new(self.kind, self.n_classes, spec));
        self
    }

    /// The tables filled (None unless asked for with [`Evaluation::with_tables`]).
    pub fn tables(&self) -> Option<&EvaluationTables> {
        self.tables.as_ref()
    }

    /// The tables filled, taken out of the evaluation.
    pub fn into_tables(self) -> Option<EvaluationTables> {
        self.tables
    }

    /// This part's metrics, to merge into another [`Evaluation::mergeable`].
    pub fn part(&self) -> EvaluationPart {
        EvaluationPart {
            binary: self.kind.is_binary().then(|| self.binary_metrics.part()),
            multiclass: self
                .kind
                .has_class_outputs()
                .then(|| self.multiclass.clone()),
            regression: (!self.kind.is_classifier()).then(|| self.regression.clone()),
            scored: self.scored,
            unknown: self.unknown,
            tables: self.tables.as_ref().map(|t| t.part()),
        }
    }

    /// What permutation importance needs of the rows scored: the counts the accuracy or R²
    /// comes from (see [`crate::importance::ScorePart`]).
    pub fn score_part(&self) -> crate::importance::ScorePart {
        let (sse, actual) = self.regression.sse_and_actual();
        let correct = match self.kind.labels() {
            Labels::Number => 0,
            Labels::Classes => self.multiclass.correct(),
            _ => self.binary_metrics.correct(),
        };
        crate::importance::ScorePart {
            rows: self.scored,
            correct,
            sse,
            actual,
        }
    }

    /// Adds a part's rows (from an evaluation of the same model).
    pub fn merge(&mut self, part: &EvaluationPart) {
        if let Some(b) = &part.binary {
            self.binary_metrics.merge(b);
        }
        if let Some(m) = &part.multiclass {
            self.multiclass.merge(m);
        }
        if let Some(r) = &part.regression {
            self.regression.merge(r);
        }
        if let (Some(tables), Some(part)) = (&mut self.tables, &part.tables) {
            tables.merge(part);
        }
        self.scored = self.scored.saturating_add(part.scored);
        self.unknown = self.unknown.saturating_add(part.unknown);
    }

    /// Scores one row; a classifier's row whose label is not one of the model's classes is
    /// counted as unknown instead.
    pub fn push(&mut self, model: &impl Predictor, row: Row, label: f64) {
        match self.kind.labels() {
            Labels::Number => self.regression.push(model.decision(row), label),
            Labels::Classes => {
                let actual = label as usize;
                if actual >= self.n_classes {
                    self.unknown += 1;
                    return;
                }
                let has_proba = model.predict_proba(row, &mut self.probs);
                let p = has_proba.then(|| self.probs[actual]);
                let predicted = model.predict(row) as usize;
                self.multiclass.push(predicted, actual, p);
                if let Some(tables) = &mut self.tables {
                    let mut scores = Vec::new();
                    if !has_proba {
                        model.scores(row, &mut scores);
                    }
                    tables.push_classes(predicted, actual, &self.probs, &scores);
                }
            }
            Labels::TwoClasses => {
                let Some(positive) = self.binary.positive(label) else {
                    self.unknown += 1;
                    return;
                };
                let z = model.decision(row);
                let p = self.kind.has_proba().then(|| sigmoid(z));
                self.binary_metrics.push(z, p, positive);
                if let Some(tables) = &mut self.tables {
                    tables.push_binary(z, p, positive);
                }
            }
        }
        self.scored += 1;
    }

    /// The report as corgipile_evaluate returns it, except "model_id" (the caller adds it):
    /// the kind's metrics report, "rows_scored", "rows_skipped" (`rows_skipped_by_reader`
    /// plus rows of unknown labels), "rows_with_unknown_label" when there were any, and
    /// "roc_auc_note" when ROC AUC was not computed for lack of memory.
    pub fn finish(self, rows_skipped_by_reader: u64) -> Value {
        let mut report = match self.kind.labels() {
            Labels::Number => serde_json::to_value(self.regression.finish()),
            Labels::Classes => serde_json::to_value(self.multiclass.finish()),
            _ => serde_json::to_value(self.binary_metrics.finish()),
        }
        .expect("metrics serialize");
        if self.scored == 0 {
            // No rows: no metric has a value (as an aggregate over no rows is NULL), rather
            // than an accuracy of 0; counts stay (0).
            if let Some(map) = report.as_object_mut() {
                map.values_mut()
                    .filter(|v| v.is_f64())
                    .for_each(|v| *v = Value::Null);
            }
            report["note"] = json!("no rows to score");
        }
        report["rows_scored"] = json!(self.scored);
        report["rows_skipped"] = json!(rows_skipped_by_reader + self.unknown);
        if self.unknown > 0 {
            report["rows_with_unknown_label"] = json!(self.unknown);
        }
        if report.get("roc_auc").is_some_and(|v| v.is_null())
            && self.scored as usize > self.auc_row_limit
        {
            report["roc_auc_note"] = json!(ROC_AUC_NOTE);
        }
        if self.histogram_auc && report.get("roc_auc").is_some_and(|v| !v.is_null()) {
            // Why it may differ (slightly) from one server's.
            report["roc_auc_note"] = json!(format!(
                "from a histogram of {AUC_BINS} score bins merged across the shards: exact up to ties within a bin"
            ));
        }
        report
    }
}
