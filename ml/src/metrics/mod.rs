//! Streaming evaluation metrics (scikit-learn conventions), for models applied
//! to a table. Reports serialize to JSON.
//!
//! Undefined ratios (no predicted positives, no support, ...) are 0, like
//! scikit-learn's `zero_division=0`; an empty input gives all-zero reports.
//!
//! Files: `binary` (confusion counts, log loss, ROC AUC exact or from a histogram, the part a
//! shard sends), `auc` (the exact Mann–Whitney AUC and the score histogram), `multiclass`
//! (per-class and macro averages), `regression` (MSE, MAE, R²). Their running mean/variance
//! is [`crate::moments::Welford`].

mod auc;
mod binary;
mod multiclass;
mod regression;

pub use auc::AUC_BINS;
pub(crate) use auc::{bin_lower_edge, score_bin};
pub use binary::{BinaryMetrics, BinaryPart, BinaryReport};
pub use multiclass::{ClassReport, MulticlassMetrics, MulticlassReport};
pub use regression::{r2_score, RegressionMetrics, RegressionReport};

/// Probabilities are clipped to [EPS, 1 - EPS] for log loss, as scikit-learn
/// did (its historical default eps), so one confident mistake costs ~34.5, not ∞.
const EPS: f64 = 1e-15;

#[inline]
fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

#[inline]
fn f1(p: f64, r: f64) -> f64 {
    if p + r == 0.0 {
        0.0
    } else {
        2.0 * p * r / (p + r)
    }
}

#[cfg(test)]
pub(crate) mod tests;
