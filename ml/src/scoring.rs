//! Scoring a trained model on labelled rows: the per-epoch validation statistics
//! ([`ValidationScore`] → [`ValidationStats`]) and the report of `corgipile_evaluate`
//! ([`Evaluation`]). Pure: the extension reads the rows and pushes them here one by one.
//!
//! How a label reaches scoring depends on the model kind: linear labels are used as they
//! are; softmax labels are class indices (a row whose index is not one of the model's
//! classes is skipped and, in an evaluation, counted as unknown); binary labels are
//! described by [`BinaryLabels`].

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::metrics::{BinaryMetrics, BinaryPart, MulticlassMetrics, RegressionMetrics, AUC_BINS};
use crate::model::{argmax, sigmoid, sign, softmax_loss, LinearModel, ModelKind, Row};

/// How binary labels reach scoring: as class indices (text labels: 0 = negative,
/// 1 = positive, anything else unknown) or as the two raw values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BinaryLabels {
    ClassIndices,
    /// The raw label values of the two classes. A class without a numeric value may be
    /// given as NaN: no label equals it.
    Values {
        negative: f64,
        positive: f64,
    },
}

impl BinaryLabels {
    /// Whether `label` is the positive class; None for a label of neither class.
    #[inline(always)]
    pub fn positive(&self, label: f64) -> Option<bool> {
        match *self {
            BinaryLabels::ClassIndices => match label as usize {
                0 => Some(false),
                1 => Some(true),
                _ => None,
            },
            BinaryLabels::Values { negative, positive } => {
                if label == positive {
                    Some(true)
                } else if label == negative {
                    Some(false)
                } else {
                    None
                }
            }
        }
    }

    /// ±1 for training/validation losses: +1 for the positive class, -1 for the negative
    /// one, None for a label of neither class.
    #[inline(always)]
    pub fn sign(&self, label: f64) -> Option<f64> {
        self.positive(label)
            .map(|positive| if positive { 1.0 } else { -1.0 })
    }
}

/// Per-epoch metrics on the held-out validation rows.
#[derive(Clone, Debug, Serialize)]
pub struct ValidationStats {
    /// Mean per-row loss (unweighted, no regularization term); NaN without rows.
    pub loss: f64,
    /// Classifiers: fraction classified correctly (0 without rows). None for linear.
    pub accuracy: Option<f64>,
    /// Linear: R² (see [`crate::metrics::RegressionReport::r2`]). None for classifiers.
    pub r2: Option<f64>,
    /// Rows scored (rows of unknown classes are not counted).
    pub rows: u64,
}

/// Loss and accuracy (or R²) of a model on validation rows, one row at a time.
pub struct ValidationScore {
    kind: ModelKind,
    /// Binary kinds: the trainer's label mapping; None scores no binary row.
    binary: Option<BinaryLabels>,
    loss: f64,
    correct: u64,
    rows: u64,
    regression: RegressionMetrics,
    scores: Vec<f64>,
}

impl ValidationScore {
    /// `binary`: for svm and logistic, the trainer's mapping (`Trainer::label_map` as
    /// [`BinaryLabels::Values`]); rows whose label is neither value are skipped, and so is
    /// every binary row when it is None. Ignored by the other kinds.
    pub fn new(kind: ModelKind, binary: Option<BinaryLabels>) -> Self {
        ValidationScore {
            kind,
            binary,
            loss: 0.0,
            correct: 0,
            rows: 0,
            regression: RegressionMetrics::new(),
            scores: Vec::new(),
        }
    }

    /// Scores one row. Softmax: a class index the model has no output for is skipped.
    pub fn push(&mut self, model: &LinearModel, row: Row, label: f64) {
        match self.kind {
            ModelKind::Linear => {
                let z = model.decision(row);
                self.regression.push(z, label);
                self.loss += model.kind.loss(z, label);
            }
            ModelKind::Softmax => {
                let y = label as usize;
                model.scores(row, &mut self.scores);
                if y >= self.scores.len() {
                    return; // a class the model never saw in training
                }
                self.correct += (argmax(&self.scores) == Some(y)) as u64;
                self.loss += softmax_loss(&mut self.scores, y);
            }
            ModelKind::Svm | ModelKind::Logistic => {
                let Some(y) = self.binary.and_then(|b| b.sign(label)) else {
                    return;
                };
                let z = model.decision(row);
                self.correct += (sign(z) == y) as u64;
                self.loss += model.kind.loss(z, y);
            }
        }
        self.rows += 1;
    }

    pub fn finish(self) -> ValidationStats {
        let n = self.rows;
        let mean_loss = if n > 0 {
            self.loss / n as f64
        } else {
            f64::NAN
        };
        match self.kind {
            ModelKind::Linear => ValidationStats {
                loss: mean_loss,
                accuracy: None,
                r2: Some(self.regression.finish().r2),
                rows: n,
            },
            _ => ValidationStats {
                loss: mean_loss,
                accuracy: Some(if n > 0 {
                    self.correct as f64 / n as f64
                } else {
                    0.0
                }),
                r2: None,
                rows: n,
            },
        }
    }
}

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

    /// This part's metrics, to merge into another [`Evaluation::mergeable`].
    pub fn part(&self) -> EvaluationPart {
        EvaluationPart {
            binary: matches!(self.kind, ModelKind::Svm | ModelKind::Logistic)
                .then(|| self.binary_metrics.part()),
            multiclass: (self.kind == ModelKind::Softmax).then(|| self.multiclass.clone()),
            regression: (self.kind == ModelKind::Linear).then(|| self.regression.clone()),
            scored: self.scored,
            unknown: self.unknown,
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
        self.scored += part.scored;
        self.unknown += part.unknown;
    }

    /// Scores one row; a classifier's row whose label is not one of the model's classes is
    /// counted as unknown instead.
    pub fn push(&mut self, model: &LinearModel, row: Row, label: f64) {
        match self.kind {
            ModelKind::Linear => self.regression.push(model.decision(row), label),
            ModelKind::Softmax => {
                let actual = label as usize;
                if actual >= self.n_classes {
                    self.unknown += 1;
                    return;
                }
                let p = model
                    .predict_proba(row, &mut self.probs)
                    .then(|| self.probs[actual]);
                self.multiclass.push(model.predict(row) as usize, actual, p);
            }
            ModelKind::Svm | ModelKind::Logistic => {
                let Some(positive) = self.binary.positive(label) else {
                    self.unknown += 1;
                    return;
                };
                let z = model.decision(row);
                let p = (self.kind == ModelKind::Logistic).then(|| sigmoid(z));
                self.binary_metrics.push(z, p, positive);
            }
        }
        self.scored += 1;
    }

    /// The report as corgipile_evaluate returns it, except "model_id" (the caller adds it):
    /// the kind's metrics report, "rows_scored", "rows_skipped" (`rows_skipped_by_reader`
    /// plus rows of unknown labels), "rows_with_unknown_label" when there were any, and
    /// "roc_auc_note" when ROC AUC was not computed for lack of memory.
    pub fn finish(self, rows_skipped_by_reader: u64) -> Value {
        let mut report = match self.kind {
            ModelKind::Linear => serde_json::to_value(self.regression.finish()),
            ModelKind::Softmax => serde_json::to_value(self.multiclass.finish()),
            _ => serde_json::to_value(self.binary_metrics.finish()),
        }
        .expect("metrics serialize");
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
