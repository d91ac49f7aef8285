//! Scoring a trained model on labelled rows: the per-epoch validation statistics
//! ([`ValidationScore`] → [`ValidationStats`]) and the report of `corgipile_evaluate`
//! ([`Evaluation`]). Pure: the extension reads the rows and pushes them here one by one.
//!
//! How a label reaches scoring depends on the model kind: linear labels are used as they
//! are; softmax labels are class indices (a row whose index is not one of the model's
//! classes is skipped and, in an evaluation, counted as unknown); binary labels are
//! described by [`BinaryLabels`].
//!
//! Files: `validation` ([`ValidationScore`]), `evaluation` ([`Evaluation`] and the part a
//! shard sends of it), `tables` (an evaluation's confusion matrix, ROC curve and calibration
//! tables); [`BinaryLabels`] here, as both use it.

mod evaluation;
mod tables;
mod validation;

pub use evaluation::{Evaluation, EvaluationPart};
pub use tables::{
    CalibrationRow, EvaluationTables, RocPoint, TableSpec, TablesPart, MAX_CALIBRATION_BINS,
    ROC_BINS,
};
pub use validation::{ValidationPart, ValidationScore, ValidationStats};

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

#[cfg(test)]
mod tests;
