//! The tables of an evaluation — confusion matrix, ROC curve and calibration bins
//! ([`EvaluationTables`]) — filled in the same scan as `corgipile_evaluate`'s metrics, in memory
//! that does not grow with the rows, and mergeable across shards ([`TablesPart`]).
//!
//! ROC curves come from a histogram of scores (the map of [`crate::metrics::AUC_BINS`]'s
//! histogram, with [`ROC_BINS`] bins): one point per non-empty bin, its threshold the bin's
//! lower edge, so a curve is exact up to scores closer than the bin width (about 0.6% of a
//! score). The score of a two-class model is its decision value (svm) or the probability of the
//! positive class (logistic); a model of classes gets one curve per class, one-vs-rest, on the
//! probability of that class.

use serde::{Deserialize, Serialize};

use crate::metrics::{bin_lower_edge, score_bin};
use crate::model::{sigmoid, ModelKind};

/// Bins of each ROC histogram: 256 kB a curve.
pub const ROC_BINS: usize = 1 << 14;
/// Calibration bins a table may ask for.
pub const MAX_CALIBRATION_BINS: u32 = 1000;

/// Which tables to fill (sent to shards with the model).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TableSpec {
    /// Equal-width bins of predicted probability, 1..=[`MAX_CALIBRATION_BINS`].
    pub calibration_bins: u32,
}

/// One calibration bin of one class: rows whose predicted probability fell in it, the sum of
/// those probabilities and how many of them were of the class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CalibrationBin {
    pub rows: u64,
    #[serde(with = "crate::nonfinite")]
    pub predicted_sum: f64,
    pub positives: u64,
}

/// One point of a ROC curve: the rows predicted positive at `threshold` (score ≥ threshold).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RocPoint {
    /// The class the curve is of (two classes: 1, the positive class).
    pub class: usize,
    pub threshold: f64,
    pub tp: u64,
    pub fp: u64,
    pub tpr: Option<f64>,
    pub fpr: Option<f64>,
    pub precision: Option<f64>,
    pub f1: Option<f64>,
}

/// One row of a calibration table.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CalibrationRow {
    pub class: usize,
    pub bin: usize,
    pub lower: f64,
    pub upper: f64,
    pub rows: u64,
    pub mean_predicted: Option<f64>,
    pub observed: Option<f64>,
}

/// What a shard sends of its tables: the confusion counts, each curve's non-empty bins as
/// (bin, positives, negatives), the calibration bins.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TablesPart {
    confusion: Vec<u64>,
    roc: Vec<Vec<(u32, u64, u64)>>,
    calibration: Vec<CalibrationBin>,
}

impl TablesPart {
    /// Why this part (from another server) cannot be merged into the tables of a `kind` model
    /// of `k` classes asked for by `spec`: another shape, or a bin out of range.
    pub fn check(&self, kind: ModelKind, k: usize, spec: TableSpec) -> Result<(), String> {
        let (k, curves, calibration) = EvaluationTables::shape(kind, k, spec);
        if (self.confusion.len(), self.roc.len(), self.calibration.len())
            != (k * k, curves, calibration)
        {
            return Err("evaluation tables of another shape".into());
        }
        match self.roc.iter().flatten().find(|b| b.0 as usize >= ROC_BINS) {
            Some(b) => Err(format!("a ROC histogram bin {} beyond {ROC_BINS}", b.0)),
            None => Ok(()),
        }
    }
}

/// The tables of one model's evaluation.
pub struct EvaluationTables {
    /// Classes: 2 for a two-class model.
    k: usize,
    /// k × k, by actual class then predicted class.
    confusion: Vec<u64>,
    /// Per curve: positives and negatives per bin, [`ROC_BINS`] each.
    roc_positive: Vec<Vec<u64>>,
    roc_negative: Vec<Vec<u64>>,
    /// Per curve × `bins`; empty for a model without probabilities.
    calibration: Vec<CalibrationBin>,
    bins: usize,
    /// Two classes with a probability: curve thresholds are reported as probabilities.
    binary_probability: bool,
}

impl EvaluationTables {
    /// (classes, curves, calibration cells) of the tables of a `kind` model of `k`
    /// classes (two-class kinds: 2).
    fn shape(kind: ModelKind, k: usize, spec: TableSpec) -> (usize, usize, usize) {
        let k = if kind.is_binary() { 2 } else { k.max(1) };
        let curves = if kind.is_binary() { 1 } else { k };
        let bins = spec.calibration_bins.clamp(1, MAX_CALIBRATION_BINS) as usize;
        let calibration = if kind.has_proba() { curves * bins } else { 0 };
        (k, curves, calibration)
    }

    /// Memory the tables of a `kind` model of `k` classes take, in bytes.
    pub fn bytes_needed(kind: ModelKind, k: usize, spec: TableSpec) -> u64 {
        let (k, curves, calibration) = Self::shape(kind, k, spec);
        ((k * k) as u64 * 8)
            .saturating_add(curves as u64 * ROC_BINS as u64 * 16)
            .saturating_add(calibration as u64 * std::mem::size_of::<CalibrationBin>() as u64)
    }

    /// Tables for a classifier of `kind` over `k` classes. The caller checks
    /// [`bytes_needed`](Self::bytes_needed) against its limit first.
    pub fn new(kind: ModelKind, k: usize, spec: TableSpec) -> Self {
        let (k, curves, calibration) = Self::shape(kind, k, spec);
        EvaluationTables {
            k,
            confusion: vec![0; k * k],
            roc_positive: vec![vec![0; ROC_BINS]; curves],
            roc_negative: vec![vec![0; ROC_BINS]; curves],
            calibration: vec![CalibrationBin::default(); calibration],
            bins: spec.calibration_bins.clamp(1, MAX_CALIBRATION_BINS) as usize,
            binary_probability: kind.is_binary() && kind.has_proba(),
        }
    }

    /// A two-class row: decision value `z`, P(positive) if the model has one.
    pub fn push_binary(&mut self, z: f64, p: Option<f64>, positive: bool) {
        let (actual, predicted) = (positive as usize, (z >= 0.0) as usize);
        self.confusion[actual * 2 + predicted] += 1;
        self.push_curve(0, z, p, positive);
    }

    /// A row of a model of classes: its predicted and actual class, and each class's
    /// probability (`probabilities` empty for a model without them: its raw `scores` are
    /// the curves' scores then).
    pub fn push_classes(
        &mut self,
        predicted: usize,
        actual: usize,
        probabilities: &[f64],
        scores: &[f64],
    ) {
        if predicted < self.k && actual < self.k {
            self.confusion[actual * self.k + predicted] += 1;
        }
        for c in 0..self.k {
            let p = probabilities.get(c).copied();
            let score = p.or_else(|| scores.get(c).copied()).unwrap_or(f64::NAN);
            self.push_curve(c, score, p, c == actual);
        }
    }

    fn push_curve(&mut self, curve: usize, score: f64, p: Option<f64>, positive: bool) {
        let b = score_bin(score, ROC_BINS);
        if positive {
            self.roc_positive[curve][b] += 1;
        } else {
            self.roc_negative[curve][b] += 1;
        }
        if let (Some(p), false) = (p, self.calibration.is_empty()) {
            // p = 1 belongs to the last bin; NaN casts to bin 0.
            let bin = ((p * self.bins as f64) as usize).min(self.bins - 1);
            let cell = &mut self.calibration[curve * self.bins + bin];
            cell.rows += 1;
            cell.predicted_sum += p;
            cell.positives += positive as u64;
        }
    }

    /// This part's state for merging elsewhere.
    pub fn part(&self) -> TablesPart {
        TablesPart {
            confusion: self.confusion.clone(),
            roc: self
                .roc_positive
                .iter()
                .zip(&self.roc_negative)
                .map(|(pos, neg)| {
                    (0..ROC_BINS)
                        .filter(|&b| pos[b] + neg[b] > 0)
                        .map(|b| (b as u32, pos[b], neg[b]))
                        .collect()
                })
                .collect(),
            calibration: self.calibration.clone(),
        }
    }

    /// Adds another part's rows (checked by [`TablesPart::check`]; counts saturate).
    pub fn merge(&mut self, part: &TablesPart) {
        for (mine, theirs) in self.confusion.iter_mut().zip(&part.confusion) {
            *mine = mine.saturating_add(*theirs);
        }
        for (curve, bins) in part.roc.iter().enumerate().take(self.roc_positive.len()) {
            for &(b, p, n) in bins {
                if let Some(slot) = self.roc_positive[curve].get_mut(b as usize) {
                    *slot = slot.saturating_add(p);
                    let slot = &mut self.roc_negative[curve][b as usize];
                    *slot = slot.saturating_add(n);
                }
            }
        }
        for (mine, theirs) in self.calibration.iter_mut().zip(&part.calibration) {
            mine.rows = mine.rows.saturating_add(theirs.rows);
            mine.predicted_sum += theirs.predicted_sum;
            mine.positives = mine.positives.saturating_add(theirs.positives);
        }
    }

    /// Rows counted in the confusion matrix.
    pub fn rows(&self) -> u64 {
        self.confusion
            .iter()
            .fold(0u64, |a, &c| a.saturating_add(c))
    }

    /// (actual class, predicted class, rows) for every pair of classes, zeros included.
    pub fn confusion_matrix(&self) -> Vec<(usize, usize, u64)> {
        (0..self.k * self.k)
            .map(|i| (i / self.k, i % self.k, self.confusion[i]))
            .collect()
    }

    /// Every curve's points, highest threshold first: a first point at +infinity (nothing
    /// predicted positive), then one per non-empty bin, down to every row predicted positive.
    pub fn roc_curve(&self) -> Vec<RocPoint> {
        let curves = self.roc_positive.len();
        let mut points = Vec::new();
        for curve in 0..curves {
            let (pos, neg) = (&self.roc_positive[curve], &self.roc_negative[curve]);
            let total_pos: u64 = pos.iter().sum();
            let total_neg: u64 = neg.iter().sum();
            let class = if curves == 1 { 1 } else { curve };
            let point = |threshold: f64, tp: u64, fp: u64| {
                let tpr = rate(tp, total_pos);
                let precision = rate(tp, tp + fp);
                let f1 = match (precision, tpr) {
                    (Some(p), Some(r)) if p + r > 0.0 => Some(2.0 * p * r / (p + r)),
                    (Some(_), Some(_)) => Some(0.0),
                    _ => None,
                };
                RocPoint {
                    class,
                    threshold,
                    tp,
                    fp,
                    tpr,
                    fpr: rate(fp, total_neg),
                    precision,
                    f1,
                }
            };
            points.push(point(f64::INFINITY, 0, 0));
            let (mut tp, mut fp) = (0u64, 0u64);
            for b in (0..ROC_BINS).rev() {
                if pos[b] + neg[b] == 0 {
                    continue;
                }
                tp += pos[b];
                fp += neg[b];
                let edge = bin_lower_edge(b, ROC_BINS);
                let threshold = if self.binary_probability {
                    sigmoid(edge)
                } else {
                    edge
                };
                points.push(point(threshold, tp, fp));
            }
        }
        points
    }

    /// Whether the model gave probabilities (a calibration table has rows).
    pub fn has_calibration(&self) -> bool {
        !self.calibration.is_empty()
    }

    /// Every class's calibration bins (two classes: the positive class's), empty ones too.
    pub fn calibration(&self) -> Vec<CalibrationRow> {
        let curves = self.roc_positive.len();
        let mut rows = Vec::new();
        for curve in 0..curves {
            for bin in 0..self.bins {
                let cell = self
                    .calibration
                    .get(curve * self.bins + bin)
                    .copied()
                    .unwrap_or_default();
                let n = cell.rows as f64;
                rows.push(CalibrationRow {
                    class: if curves == 1 { 1 } else { curve },
                    bin: bin + 1,
                    lower: bin as f64 / self.bins as f64,
                    upper: (bin + 1) as f64 / self.bins as f64,
                    rows: cell.rows,
                    mean_predicted: (cell.rows > 0).then(|| cell.predicted_sum / n),
                    observed: (cell.rows > 0).then(|| cell.positives as f64 / n),
                });
            }
        }
        rows
    }
}

fn rate(numerator: u64, denominator: u64) -> Option<f64> {
    (denominator > 0).then(|| numerator as f64 / denominator as f64)
}

#[cfg(test)]
#[path = "tables_tests.rs"]
mod tests;
