//! The per-epoch validation statistics: [`ValidationScore`] scores a model on the held-out
//! rows one at a time and gives [`ValidationStats`] (loss, accuracy or R²; F1 and ROC AUC for
//! two classes; log loss with probabilities).

use serde::{Deserialize, Serialize};

use crate::metrics::{BinaryMetrics, BinaryPart, RegressionMetrics};
use crate::model::{argmax, sign, softmax_loss, ModelKind, Predictor};
use crate::model::{Labels, Loss};
use crate::row::Row;

use super::BinaryLabels;

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
    /// Two-class kinds: F1 of the positive class, and ROC AUC (None unless both classes
    /// occur).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub f1: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub roc_auc: Option<f64>,
    /// Classifiers with probabilities: the mean log loss.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_loss: Option<f64>,
}

impl ValidationStats {
    /// No rows scored.
    pub fn empty() -> ValidationStats {
        ValidationStats {
            loss: f64::NAN,
            accuracy: None,
            r2: None,
            rows: 0,
            f1: None,
            roc_auc: None,
            log_loss: None,
        }
    }
}

/// What a [`ValidationScore`] has summed so far, to be merged into another's (parallel
/// workers: every process scores its own held-out rows).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ValidationPart {
    #[serde(with = "crate::nonfinite")]
    loss: f64,
    correct: u64,
    rows: u64,
    regression: RegressionMetrics,
    binary: Option<BinaryPart>,
}

impl ValidationPart {
    /// Why this part (from a shard server) cannot be merged into a `kind` model's score:
    /// impossible counts, a negative loss, metrics of another kind. (Its sizes were bounded
    /// when it was parsed.)
    pub fn check(&self, kind: ModelKind) -> Result<(), String> {
        // More rows than one PostgreSQL table can hold (2^32 pages of at most 291 tuples).
        const MAX_ROWS: u64 = 1 << 41;
        if self.rows > MAX_ROWS || self.correct > self.rows || self.loss < 0.0 {
            return Err(format!(
                "a validation score of {} rows, {} correct, loss {}",
                self.rows, self.correct, self.loss
            ));
        }
        let regression = kind.labels() == Labels::Number;
        let regression_rows = self.regression.rows();
        if (regression && regression_rows != self.rows) || (!regression && regression_rows != 0) {
            return Err(format!(
                "a validation score of another kind than {}'s",
                kind.name()
            ));
        }
        match (&self.binary, kind.is_binary()) {
            (Some(b), true) => {
                b.check()?;
                if b.rows() != Some(self.rows) {
                    return Err(
                        "a validation score whose confusion matrix counts other rows".into(),
                    );
                }
                Ok(())
            }
            (None, false) => Ok(()),
            _ => Err(format!(
                "a validation score of another kind than {}'s",
                kind.name()
            )),
        }
    }
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
    /// Two-class kinds: F1, ROC AUC (from a histogram of the scores: bounded memory, exact up
    /// to ties within a bin) and log loss.
    binary_metrics: Option<Box<BinaryMetrics>>,
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
            binary_metrics: kind
                .is_binary()
                .then(|| Box::new(BinaryMetrics::with_histogram())),
        }
    }

    /// Scores one row. Softmax: a class index the model has no output for is skipped.
    pub fn push(&mut self, model: &impl Predictor, row: Row, label: f64) {
        let head = self.kind.head();
        match (head.loss, head.labels) {
            (Loss::Scalar(f), Labels::Number) => {
                let z = model.decision(row);
                self.regression.push(z, label);
                self.loss += f.loss(z, label);
            }
            (Loss::CrossEntropy, _) => {
                let y = label as usize;
                model.scores(row, &mut self.scores);
                if y >= self.scores.len() {
                    return; // a class the model never saw in training
                }
                self.correct += (argmax(&self.scores) == Some(y)) as u64;
                self.loss += softmax_loss(&mut self.scores, y);
            }
            (Loss::Scalar(f), _) => {
                let Some(y) = self.binary.and_then(|b| b.sign(label)) else {
                    return;
                };
                let z = model.decision(row);
                self.correct += (sign(z) == y) as u64;
                self.loss += f.loss(z, y);
                if let Some(m) = &mut self.binary_metrics {
                    let p = self.kind.has_proba().then(|| 1.0 / (1.0 + (-z).exp()));
                    m.push(z, p, y > 0.0);
                }
            }
        }
        self.rows += 1;
    }

    /// A score of the same kind and labels, with nothing summed yet.
    pub fn empty_like(&self) -> ValidationScore {
        ValidationScore::new(self.kind, self.binary)
    }

    /// What it has summed so far (see [`ValidationPart`]).
    pub fn part(&self) -> ValidationPart {
        ValidationPart {
            loss: self.loss,
            correct: self.correct,
            rows: self.rows,
            regression: self.regression.clone(),
            binary: self.binary_metrics.as_ref().map(|m| m.part()),
        }
    }

    /// Adds another score's part (of the same kind): the rows of both, as if this one had
    /// scored them all (up to the order of the sums).
    pub fn merge(&mut self, part: &ValidationPart) {
        self.loss += part.loss;
        self.correct = self.correct.saturating_add(part.correct);
        self.rows = self.rows.saturating_add(part.rows);
        self.regression.merge(&part.regression);
        if let (Some(m), Some(p)) = (self.binary_metrics.as_mut(), &part.binary) {
            m.merge(p);
        }
    }

    pub fn finish(self) -> ValidationStats {
        let n = self.rows;
        let mean_loss = if n > 0 {
            self.loss / n as f64
        } else {
            f64::NAN
        };
        match self.kind.labels() {
            Labels::Number => ValidationStats {
                loss: mean_loss,
                r2: Some(self.regression.finish().r2),
                rows: n,
                ..ValidationStats::empty()
            },
            labels => {
                let binary = self.binary_metrics.map(|m| m.finish()).filter(|_| n > 0);
                ValidationStats {
                    loss: mean_loss,
                    accuracy: Some(if n > 0 {
                        self.correct as f64 / n as f64
                    } else {
                        0.0
                    }),
                    rows: n,
                    f1: binary.as_ref().map(|b| b.f1),
                    roc_auc: binary.as_ref().and_then(|b| b.roc_auc),
                    // Softmax and mlp: the loss is the cross-entropy of the true class.
                    log_loss: match labels {
                        Labels::Classes if n > 0 && self.kind.has_proba() => Some(mean_loss),
                        _ => binary.as_ref().and_then(|b| b.log_loss),
                    },
                    ..ValidationStats::empty()
                }
            }
        }
    }
}
