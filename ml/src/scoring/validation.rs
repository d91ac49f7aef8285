//! The per-epoch validation statistics: [`ValidationScore`] scores a model on the held-out
//! rows one at a time and gives [`ValidationStats`] (loss, accuracy or R²).

use serde::Serialize;

use crate::metrics::RegressionMetrics;
use crate::model::Labels;
use crate::model::{argmax, sign, softmax_loss, ModelKind, Predictor};
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
    pub fn push(&mut self, model: &impl Predictor, row: Row, label: f64) {
        match self.kind.labels() {
            Labels::Number => {
                let z = model.decision(row);
                self.regression.push(z, label);
                self.loss += model.kind().loss(z, label);
            }
            Labels::Classes => {
                let y = label as usize;
                model.scores(row, &mut self.scores);
                if y >= self.scores.len() {
                    return; // a class the model never saw in training
                }
                self.correct += (argmax(&self.scores) == Some(y)) as u64;
                self.loss += softmax_loss(&mut self.scores, y);
            }
            Labels::TwoClasses => {
                let Some(y) = self.binary.and_then(|b| b.sign(label)) else {
                    return;
                };
                let z = model.decision(row);
                self.correct += (sign(z) == y) as u64;
                self.loss += model.kind().loss(z, y);
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
        match self.kind.labels() {
            Labels::Number => ValidationStats {
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
