//! Streaming evaluation metrics (scikit-learn conventions), for models applied
//! to a table. Reports serialize to JSON.
//!
//! Undefined ratios (no predicted positives, no support, ...) are 0, like
//! scikit-learn's `zero_division=0`; an empty input gives all-zero reports.

use serde::{Deserialize, Serialize};

use crate::moments::Welford;

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

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BinaryReport {
    pub accuracy: f64,
    pub precision: f64,
    pub recall: f64,
    pub f1: f64,
    /// None unless both classes occur.
    pub roc_auc: Option<f64>,
    /// None unless every pushed row had a probability.
    pub log_loss: Option<f64>,
    pub n: u64,
}

/// Binary classification metrics; a row is predicted positive iff its
/// decision value is >= 0 (the models' rule).
#[derive(Clone, Debug, Default)]
pub struct BinaryMetrics {
    tp: u64,
    fp: u64,
    tn: u64,
    fn_: u64,
    /// (score, actual positive) for ROC AUC.
    scored: Vec<(f64, bool)>,
    /// At most this many scores are kept for ROC AUC (memory bound); past it AUC is None.
    auc_limit: Option<usize>,
    auc_dropped: bool,
    /// Instead of `scored`: ROC AUC from a histogram of scores (mergeable across shards).
    histogram: Option<ScoreHistogram>,
    log_loss_sum: f64,
    all_have_prob: bool,
}

/// Bins of [`ScoreHistogram`].
pub const AUC_BINS: usize = 1 << 16;

/// Scores are binned in units of this: resolution down to 10^-6.
const AUC_SCORE_UNIT: f64 = 1e-6;
/// ln(1 + 10^15 / AUC_SCORE_UNIT): scores beyond ±10^15 share the outermost bins.
const AUC_LOG_RANGE: f64 = 48.35428695287496;

/// Positive and negative counts of the scores in each of [`AUC_BINS`] equal bins of
/// sign(score)·ln(1 + |score| / 10^-6) over [-AUC_LOG_RANGE, AUC_LOG_RANGE] — a monotone map
/// that keeps scores apart to about 0.15% of their size from 10^-6 to 10^15 (a sigmoid would
/// put every score above ~11 in one bin, and ln(1 + |score|) every score below 10^-3). ROC AUC from it counts a positive and a
/// negative in the same bin as a tie (1/2): exact up to ties within a bin, in bounded memory,
/// and two histograms add.
#[derive(Clone, Debug)]
struct ScoreHistogram {
    positive: Vec<u64>,
    negative: Vec<u64>,
}

impl ScoreHistogram {
    fn new() -> Self {
        ScoreHistogram {
            positive: vec![0; AUC_BINS],
            negative: vec![0; AUC_BINS],
        }
    }

    #[inline]
    fn bin(score: f64) -> usize {
        let m = (score.signum() * (score.abs() / AUC_SCORE_UNIT).ln_1p())
            .clamp(-AUC_LOG_RANGE, AUC_LOG_RANGE);
        let unit = (m + AUC_LOG_RANGE) / (2.0 * AUC_LOG_RANGE);
        // NaN casts to 0.
        ((unit * AUC_BINS as f64) as usize).min(AUC_BINS - 1)
    }

    fn push(&mut self, score: f64, positive: bool) {
        let b = Self::bin(score);
        if positive {
            self.positive[b] += 1;
        } else {
            self.negative[b] += 1;
        }
    }

    /// Σ over positives of (negatives in lower bins + half those in its bin), over P·N.
    fn auc(&self) -> Option<f64> {
        let pos: u64 = self.positive.iter().sum();
        let neg: u64 = self.negative.iter().sum();
        if pos == 0 || neg == 0 {
            return None;
        }
        let (mut below, mut wins) = (0u64, 0.0f64);
        for (p, n) in self.positive.iter().zip(&self.negative) {
            wins += *p as f64 * (below as f64 + *n as f64 / 2.0);
            below += n;
        }
        Some(wins / (pos as f64 * neg as f64))
    }
}

/// What a shard sends of its [`BinaryMetrics`]: the counts and the non-empty histogram bins
/// as (bin, positives, negatives).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct BinaryPart {
    tp: u64,
    fp: u64,
    tn: u64,
    fn_: u64,
    #[serde(with = "crate::nonfinite")]
    log_loss_sum: f64,
    all_have_prob: bool,
    bins: Vec<(u32, u64, u64)>,
}

impl BinaryPart {
    /// Rows counted in its confusion matrix (None past 2^64).
    pub fn rows(&self) -> Option<u64> {
        self.tp
            .checked_add(self.fp)?
            .checked_add(self.tn)?
            .checked_add(self.fn_)
    }

    /// Why this part (from another server) cannot be merged: a bin out of range.
    pub fn check(&self) -> Result<(), String> {
        match self.bins.iter().find(|b| b.0 as usize >= AUC_BINS) {
            Some(b) => Err(format!("a score histogram bin {} beyond {AUC_BINS}", b.0)),
            None => Ok(()),
        }
    }
}

impl BinaryMetrics {
    pub fn new() -> Self {
        BinaryMetrics {
            all_have_prob: true,
            ..Default::default()
        }
    }

    /// Like `new`, but keeps at most `max_rows` scores for ROC AUC (16 bytes each): past that,
    /// `roc_auc` is None rather than memory growing with the table.
    pub fn with_auc_limit(max_rows: usize) -> Self {
        BinaryMetrics {
            auc_limit: Some(max_rows),
            ..Self::new()
        }
    }

    /// Bytes kept per row for ROC AUC.
    pub const AUC_BYTES_PER_ROW: usize = std::mem::size_of::<(f64, bool)>();

    /// ROC AUC from a [`ScoreHistogram`] (bounded memory, mergeable) instead of every score.
    pub fn with_histogram() -> Self {
        BinaryMetrics {
            histogram: Some(ScoreHistogram::new()),
            ..Self::new()
        }
    }

    /// This part's state for merging elsewhere (histogram metrics only).
    pub fn part(&self) -> BinaryPart {
        let histogram = self
            .histogram
            .as_ref()
            .expect("only histogram metrics are merged");
        BinaryPart {
            tp: self.tp,
            fp: self.fp,
            tn: self.tn,
            fn_: self.fn_,
            log_loss_sum: self.log_loss_sum,
            all_have_prob: self.all_have_prob,
            bins: (0..AUC_BINS)
                .filter(|&b| histogram.positive[b] + histogram.negative[b] > 0)
                .map(|b| (b as u32, histogram.positive[b], histogram.negative[b]))
                .collect(),
        }
    }

    /// Adds another part's rows (histogram metrics only; bins out of range are ignored).
    /// Counts saturate: a part from another server is not trusted to keep them small.
    pub fn merge(&mut self, part: &BinaryPart) {
        self.tp = self.tp.saturating_add(part.tp);
        self.fp = self.fp.saturating_add(part.fp);
        self.tn = self.tn.saturating_add(part.tn);
        self.fn_ = self.fn_.saturating_add(part.fn_);
        self.log_loss_sum += part.log_loss_sum;
        self.all_have_prob &= part.all_have_prob;
        let histogram = self
            .histogram
            .as_mut()
            .expect("only histogram metrics are merged");
        for &(b, p, n) in &part.bins {
            if let Some(slot) = histogram.positive.get_mut(b as usize) {
                *slot = slot.saturating_add(p);
                let slot = &mut histogram.negative[b as usize];
                *slot = slot.saturating_add(n);
            }
        }
    }

    /// `score`: decision value; `prob`: P(positive) if the model has one.
    pub fn push(&mut self, score: f64, prob: Option<f64>, actual_positive: bool) {
        match (score >= 0.0, actual_positive) {
            (true, true) => self.tp += 1,
            (true, false) => self.fp += 1,
            (false, false) => self.tn += 1,
            (false, true) => self.fn_ += 1,
        }
        if let Some(histogram) = &mut self.histogram {
            histogram.push(score, actual_positive);
        } else if !self.auc_dropped {
            if self
                .auc_limit
                .is_some_and(|limit| self.scored.len() >= limit)
            {
                self.auc_dropped = true;
                self.scored = Vec::new();
            } else {
                self.scored.push((score, actual_positive));
            }
        }
        match prob {
            Some(p) => {
                let p = p.clamp(EPS, 1.0 - EPS);
                self.log_loss_sum -= if actual_positive {
                    p.ln()
                } else {
                    (1.0 - p).ln()
                };
            }
            None => self.all_have_prob = false,
        }
    }

    pub fn finish(mut self) -> BinaryReport {
        let n = self.tp + self.fp + self.tn + self.fn_;
        let precision = ratio(self.tp, self.tp + self.fp);
        let recall = ratio(self.tp, self.tp + self.fn_);
        let roc_auc = if let Some(histogram) = &self.histogram {
            histogram.auc()
        } else if self.auc_dropped {
            None
        } else {
            roc_auc(&mut self.scored)
        };
        BinaryReport {
            accuracy: ratio(self.tp + self.tn, n),
            precision,
            recall,
            f1: f1(precision, recall),
            roc_auc,
            log_loss: (self.all_have_prob && n > 0).then(|| self.log_loss_sum / n as f64),
            n,
        }
    }
}

/// Mann–Whitney: AUC = (Σ ranks of positives - P(P+1)/2) / (P·N), tied
/// scores sharing their average rank (so a tie counts 1/2).
fn roc_auc(scored: &mut [(f64, bool)]) -> Option<f64> {
    let pos = scored.iter().filter(|s| s.1).count() as u64;
    let neg = scored.len() as u64 - pos;
    if pos == 0 || neg == 0 {
        return None;
    }
    scored.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
    let mut rank_sum = 0.0;
    let mut i = 0;
    while i < scored.len() {
        let mut j = i;
        while j + 1 < scored.len() && scored[j + 1].0 == scored[i].0 {
            j += 1;
        }
        // Ranks i+1..=j+1 share their average.
        let avg = (i + j + 2) as f64 / 2.0;
        let tied_pos = scored[i..=j].iter().filter(|s| s.1).count();
        rank_sum += avg * tied_pos as f64;
        i = j + 1;
    }
    let (p, q) = (pos as f64, neg as f64);
    Some((rank_sum - p * (p + 1.0) / 2.0) / (p * q))
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClassReport {
    pub precision: f64,
    pub recall: f64,
    pub f1: f64,
    pub support: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MulticlassReport {
    pub accuracy: f64,
    /// By class index.
    pub per_class: Vec<ClassReport>,
    /// Unweighted means over the classes that were predicted or occur (as
    /// scikit-learn averages over the labels present in y_true ∪ y_pred).
    pub macro_precision: f64,
    pub macro_recall: f64,
    pub macro_f1: f64,
    /// None unless every pushed row had a probability.
    pub log_loss: Option<f64>,
    pub n: u64,
}

/// Multiclass metrics over class indices 0..K-1 (K grows if a larger index
/// is pushed). Serializes as the part a shard sends.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MulticlassMetrics {
    /// Per class: true positives, times predicted, times actual.
    tp: Vec<u64>,
    predicted: Vec<u64>,
    actual: Vec<u64>,
    n: u64,
    #[serde(with = "crate::nonfinite")]
    log_loss_sum: f64,
    all_have_prob: bool,
}

impl MulticlassMetrics {
    pub fn new(k: usize) -> Self {
        MulticlassMetrics {
            tp: vec![0; k],
            predicted: vec![0; k],
            actual: vec![0; k],
            n: 0,
            log_loss_sum: 0.0,
            all_have_prob: true,
        }
    }

    /// `prob_of_actual`: the model's probability of the actual class, if any.
    pub fn push(&mut self, predicted: usize, actual: usize, prob_of_actual: Option<f64>) {
        let need = predicted.max(actual) + 1;
        if need > self.tp.len() {
            self.tp.resize(need, 0);
            self.predicted.resize(need, 0);
            self.actual.resize(need, 0);
        }
        self.n += 1;
        self.predicted[predicted] += 1;
        self.actual[actual] += 1;
        if predicted == actual {
            self.tp[actual] += 1;
        }
        match prob_of_actual {
            Some(p) => self.log_loss_sum -= p.clamp(EPS, 1.0 - EPS).ln(),
            None => self.all_have_prob = false,
        }
    }

    /// Adds another part's rows.
    /// Classes counted.
    pub fn n_classes(&self) -> usize {
        self.tp.len()
    }

    /// Rows counted.
    pub fn rows(&self) -> u64 {
        self.n
    }

    /// Why this part (from another server) cannot be merged into metrics of `k` classes.
    pub fn check(&self, k: usize) -> Result<(), String> {
        if self.tp.len() != k || self.predicted.len() != k || self.actual.len() != k {
            return Err(format!(
                "metrics of {}/{}/{} classes for a model of {k}",
                self.tp.len(),
                self.predicted.len(),
                self.actual.len()
            ));
        }
        Ok(())
    }

    pub fn merge(&mut self, other: &MulticlassMetrics) {
        let k = self.tp.len().max(other.tp.len());
        for v in [&mut self.tp, &mut self.predicted, &mut self.actual] {
            v.resize(k, 0);
        }
        for (c, ((tp, predicted), actual)) in other
            .tp
            .iter()
            .zip(&other.predicted)
            .zip(&other.actual)
            .enumerate()
        {
            self.tp[c] = self.tp[c].saturating_add(*tp);
            self.predicted[c] = self.predicted[c].saturating_add(*predicted);
            self.actual[c] = self.actual[c].saturating_add(*actual);
        }
        self.n = self.n.saturating_add(other.n);
        self.log_loss_sum += other.log_loss_sum;
        self.all_have_prob &= other.all_have_prob;
    }

    pub fn finish(self) -> MulticlassReport {
        let per_class: Vec<ClassReport> = (0..self.tp.len())
            .map(|c| {
                let precision = ratio(self.tp[c], self.predicted[c]);
                let recall = ratio(self.tp[c], self.actual[c]);
                ClassReport {
                    precision,
                    recall,
                    f1: f1(precision, recall),
                    support: self.actual[c],
                }
            })
            .collect();
        let present: Vec<&ClassReport> = per_class
            .iter()
            .enumerate()
            .filter(|(c, _)| self.actual[*c] > 0 || self.predicted[*c] > 0)
            .map(|(_, r)| r)
            .collect();
        let mean = |f: fn(&ClassReport) -> f64| {
            if present.is_empty() {
                0.0
            } else {
                present.iter().map(|r| f(r)).sum::<f64>() / present.len() as f64
            }
        };
        let correct: u64 = self.tp.iter().sum();
        MulticlassReport {
            accuracy: ratio(correct, self.n),
            macro_precision: mean(|r| r.precision),
            macro_recall: mean(|r| r.recall),
            macro_f1: mean(|r| r.f1),
            per_class,
            log_loss: (self.all_have_prob && self.n > 0).then(|| self.log_loss_sum / self.n as f64),
            n: self.n,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RegressionReport {
    pub mse: f64,
    pub rmse: f64,
    pub mae: f64,
    /// 1 - SSE/SST; if SST == 0: 1 for a perfect fit, else 0 (scikit-learn).
    pub r2: f64,
    pub n: u64,
}

/// 1 - SSE/SST; if SST == 0 (constant actual values): 1 for a perfect fit (SSE == 0), else 0,
/// like scikit-learn.
#[inline]
pub fn r2_score(sse: f64, sst: f64) -> f64 {
    if sst > 0.0 {
        1.0 - sse / sst
    } else if sse == 0.0 {
        1.0
    } else {
        0.0
    }
}

/// Serializes as the part a shard sends.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RegressionMetrics {
    #[serde(with = "crate::nonfinite")]
    sse: f64,
    #[serde(with = "crate::nonfinite")]
    sae: f64,
    /// Count, mean and M2 of the actual values (SST = M2).
    actual: Welford,
}

impl RegressionMetrics {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, predicted: f64, actual: f64) {
        let e = predicted - actual;
        self.sse += e * e;
        self.sae += e.abs();
        self.actual.push(actual);
    }

    /// Rows counted.
    pub fn rows(&self) -> u64 {
        self.actual.n()
    }

    /// Adds another part's rows.
    pub fn merge(&mut self, other: &RegressionMetrics) {
        self.sse += other.sse;
        self.sae += other.sae;
        self.actual.merge(&other.actual);
    }

    pub fn finish(self) -> RegressionReport {
        let count = self.actual.n();
        if count == 0 {
            return RegressionReport {
                mse: 0.0,
                rmse: 0.0,
                mae: 0.0,
                r2: 0.0,
                n: 0,
            };
        }
        let n = count as f64;
        let mse = self.sse / n;
        let r2 = r2_score(self.sse, self.actual.m2());
        RegressionReport {
            mse,
            rmse: mse.sqrt(),
            mae: self.sae / n,
            r2,
            n: count,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn binary_counts_and_ratios() {
        // scores:  0.9 0.8 -0.1 0.3 -0.7 -0.2
        // actual:   +   -    +   +    -    -
        // predicted + + - + - -: TP 2, FP 1, FN 1, TN 2
        let mut m = BinaryMetrics::new();
        for (s, a) in [
            (0.9, true),
            (0.8, false),
            (-0.1, true),
            (0.3, true),
            (-0.7, false),
            (-0.2, false),
        ] {
            m.push(s, None, a);
        }
        let r = m.finish();
        assert_eq!(r.n, 6);
        assert!(close(r.accuracy, 4.0 / 6.0));
        assert!(close(r.precision, 2.0 / 3.0));
        assert!(close(r.recall, 2.0 / 3.0));
        assert!(close(r.f1, 2.0 / 3.0));
        // Positive scores 0.9, 0.3, -0.1 vs negatives 0.8, -0.2, -0.7:
        // pairs won: 0.9 beats 3, 0.3 beats 2, -0.1 beats 2 → 7/9.
        assert!(close(r.roc_auc.unwrap(), 7.0 / 9.0));
        assert_eq!(r.log_loss, None);
    }

    #[test]
    fn roc_auc_ranking_and_ties() {
        let auc = |v: &[(f64, bool)]| {
            let mut m = BinaryMetrics::new();
            for &(s, a) in v {
                m.push(s, None, a);
            }
            m.finish().roc_auc
        };
        assert_eq!(auc(&[(1.0, true), (2.0, true), (-1.0, false)]), Some(1.0));
        assert_eq!(auc(&[(1.0, false), (2.0, false), (-1.0, true)]), Some(0.0));
        // All tied: 1/2.
        assert_eq!(
            auc(&[(0.0, true), (0.0, false), (0.0, true), (0.0, false)]),
            Some(0.5)
        );
        // sklearn roc_auc_score([0,0,1,1], [0.1,0.4,0.35,0.8]) == 0.75
        assert_eq!(
            auc(&[(0.1, false), (0.4, false), (0.35, true), (0.8, true)]),
            Some(0.75)
        );
        // One tie between a positive and a negative: 3 wins + 1/2 of 4 pairs.
        assert_eq!(
            auc(&[(0.5, true), (0.5, false), (0.9, true), (0.1, false)]),
            Some(3.5 / 4.0)
        );
        assert_eq!(auc(&[(1.0, true)]), None);
        assert_eq!(auc(&[]), None);
    }

    #[test]
    fn binary_log_loss_and_zero_division() {
        let mut m = BinaryMetrics::new();
        m.push(-1.0, Some(0.2), false); // -ln 0.8
        m.push(-1.0, Some(0.4), true); // -ln 0.4
        let r = m.finish();
        assert!(close(
            r.log_loss.unwrap(),
            -(0.8f64.ln() + 0.4f64.ln()) / 2.0
        ));
        assert_eq!(r.precision, 0.0); // nothing predicted positive
        assert_eq!(r.recall, 0.0);
        assert_eq!(r.f1, 0.0);
        let mut m = BinaryMetrics::new();
        m.push(1.0, Some(1.0), false); // clipped to 1 - 1e-15: -ln(1 - (1 - 1e-15)) ≈ 34.4
        let r = m.finish();
        assert_eq!(r.log_loss.unwrap(), -(1.0 - (1.0 - EPS)).ln());
        assert!(r.log_loss.unwrap() > 34.0 && r.log_loss.unwrap() < 35.0);
        let mut m = BinaryMetrics::new();
        m.push(1.0, Some(0.9), true);
        m.push(1.0, None, true);
        assert_eq!(m.finish().log_loss, None);
        let r = BinaryMetrics::new().finish();
        assert_eq!(
            (r.n, r.accuracy, r.roc_auc, r.log_loss),
            (0, 0.0, None, None)
        );
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["roc_auc"], serde_json::Value::Null);
        assert_eq!(j["n"], 0);
    }

    #[test]
    fn multiclass_report() {
        // actual:    0 0 1 1 2 2
        // predicted: 0 1 1 1 0 2
        let mut m = MulticlassMetrics::new(3);
        let probs = [0.7, 0.2, 0.6, 0.5, 0.1, 0.9];
        for (i, (p, a)) in [(0, 0), (1, 0), (1, 1), (1, 1), (0, 2), (2, 2)]
            .into_iter()
            .enumerate()
        {
            m.push(p, a, Some(probs[i]));
        }
        let r = m.finish();
        assert_eq!(r.n, 6);
        assert!(close(r.accuracy, 4.0 / 6.0));
        // class 0: predicted twice (1 right) → P 1/2, R 1/2
        // class 1: predicted 3 times (2 right) → P 2/3, R 1
        // class 2: predicted once (right) → P 1, R 1/2
        let want = [
            (0.5, 0.5, 0.5),
            (2.0 / 3.0, 1.0, 0.8),
            (1.0, 0.5, 2.0 / 3.0),
        ];
        for (c, (p, rc, f)) in want.iter().enumerate() {
            let cr = &r.per_class[c];
            assert!(
                close(cr.precision, *p) && close(cr.recall, *rc) && close(cr.f1, *f),
                "{c}"
            );
            assert_eq!(cr.support, 2);
        }
        assert!(close(r.macro_precision, (0.5 + 2.0 / 3.0 + 1.0) / 3.0));
        assert!(close(r.macro_recall, 2.0 / 3.0));
        assert!(close(r.macro_f1, (0.5 + 0.8 + 2.0 / 3.0) / 3.0));
        let ll = -probs.iter().map(|p| p.ln()).sum::<f64>() / 6.0;
        assert!(close(r.log_loss.unwrap(), ll));

        // Classes that never occur nor are predicted do not dilute macro averages;
        // pushing a larger index grows K.
        let mut m = MulticlassMetrics::new(5);
        m.push(0, 0, None);
        m.push(6, 6, None);
        let r = m.finish();
        assert_eq!(r.per_class.len(), 7);
        assert_eq!(
            (r.macro_precision, r.macro_recall, r.macro_f1),
            (1.0, 1.0, 1.0)
        );
        assert_eq!(r.log_loss, None);
        assert!(serde_json::to_string(&r).unwrap().contains("\"per_class\""));
    }

    #[test]
    fn regression_report() {
        let mut m = RegressionMetrics::new();
        for (p, a) in [(1.0, 1.0), (2.0, 2.0), (3.0, 3.0)] {
            m.push(p, a);
        }
        let r = m.finish();
        assert_eq!((r.mse, r.rmse, r.mae, r.r2, r.n), (0.0, 0.0, 0.0, 1.0, 3));

        // Predicting the mean gives R² = 0.
        let mut m = RegressionMetrics::new();
        for a in [1.0, 2.0, 3.0, 6.0] {
            m.push(3.0, a);
        }
        let r = m.finish();
        assert!(close(r.r2, 0.0));
        assert!(close(r.mse, (4.0 + 1.0 + 0.0 + 9.0) / 4.0));
        assert!(close(r.rmse, 3.5f64.sqrt()));
        assert!(close(r.mae, (2.0 + 1.0 + 0.0 + 3.0) / 4.0));

        // Hand example: actual 3, -0.5, 2, 7; predicted 2.5, 0, 2, 8 (sklearn docs: r2 0.9486...).
        let mut m = RegressionMetrics::new();
        for (p, a) in [(2.5, 3.0), (0.0, -0.5), (2.0, 2.0), (8.0, 7.0)] {
            m.push(p, a);
        }
        let r = m.finish();
        assert!(close(r.mse, 0.375));
        assert!(close(r.mae, 0.5));
        assert!((r.r2 - 0.9486081370449679).abs() < 1e-12);

        // Constant actual values: 1 if perfect, else 0.
        let mut m = RegressionMetrics::new();
        m.push(2.0, 2.0);
        m.push(2.0, 2.0);
        assert_eq!(m.finish().r2, 1.0);
        let mut m = RegressionMetrics::new();
        m.push(1.0, 2.0);
        m.push(2.0, 2.0);
        assert_eq!(m.finish().r2, 0.0);
        assert_eq!(RegressionMetrics::new().finish().n, 0);
    }

    #[test]
    fn auc_limit_bounds_memory_and_drops_auc() {
        let mut m = BinaryMetrics::with_auc_limit(3);
        for (score, positive) in [(0.9, true), (-0.5, false), (0.2, true)] {
            m.push(score, None, positive);
        }
        let mut over = m.clone();
        assert_eq!(m.finish().roc_auc, Some(1.0));
        over.push(-0.1, None, false);
        let report = over.finish();
        assert_eq!(report.roc_auc, None);
        assert_eq!(report.n, 4);
        assert_eq!(report.accuracy, 1.0);
    }

    use rand_chacha::ChaCha8Rng;
    use rand_core::{RngCore, SeedableRng};

    /// Seeded uniforms in (0, 1) and standard normals (Box–Muller); scoring's tests use it too.
    pub(crate) struct Rand(ChaCha8Rng);

    impl Rand {
        pub(crate) fn new(seed: u64) -> Self {
            Rand(ChaCha8Rng::seed_from_u64(seed))
        }

        pub(crate) fn uniform(&mut self) -> f64 {
            ((self.0.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        }

        pub(crate) fn normal(&mut self) -> f64 {
            let (a, b) = (self.uniform(), self.uniform());
            (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
        }
    }

    /// |a - b| within `tol` relative to the larger magnitude (absolute below 1).
    fn near(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * a.abs().max(b.abs()).max(1.0)
    }

    /// ROC AUC of `scored` (score, is positive) as `m` computes it.
    fn auc(mut m: BinaryMetrics, scored: &[(f64, bool)]) -> Option<f64> {
        for &(s, a) in scored {
            m.push(s, None, a);
        }
        m.finish().roc_auc
    }

    fn exact_auc(scored: &[(f64, bool)]) -> Option<f64> {
        auc(BinaryMetrics::new(), scored)
    }

    /// The exact AUC of `v` lies in `expect`, and the histogram's is within `tolerance` of it.
    fn check_histogram_auc(
        v: &[(f64, bool)],
        expect: std::ops::Range<f64>,
        tolerance: f64,
        seed: u64,
    ) {
        let (exact, hist) = (exact_auc(v).unwrap(), histogram_auc(v).unwrap());
        assert!(expect.contains(&exact), "seed {seed}: exact {exact}");
        assert!(
            (exact - hist).abs() <= tolerance,
            "seed {seed}: {exact} vs {hist}"
        );
    }

    fn histogram_auc(scored: &[(f64, bool)]) -> Option<f64> {
        auc(BinaryMetrics::with_histogram(), scored)
    }

    /// Positives from `pos(rng)`, negatives from `neg(rng)`, one in three positive.
    fn sample(
        seed: u64,
        n: usize,
        mut score: impl FnMut(&mut Rand, bool) -> f64,
    ) -> Vec<(f64, bool)> {
        let mut rng = Rand::new(seed);
        (0..n)
            .map(|i| {
                let positive = i % 3 == 0;
                (score(&mut rng, positive), positive)
            })
            .collect()
    }

    /// The monotone map the histogram bins (for the tests' own expectations).
    fn log_map(s: f64) -> f64 {
        s.signum() * (s.abs() / AUC_SCORE_UNIT).ln_1p()
    }

    const BIN_WIDTH: f64 = 2.0 * AUC_LOG_RANGE / AUC_BINS as f64;

    #[test]
    fn histogram_bins_are_monotone_and_cover_the_range() {
        assert!((AUC_LOG_RANGE - (1e15 / AUC_SCORE_UNIT).ln_1p()).abs() < 1e-12);
        let mid = AUC_BINS / 2;
        assert_eq!(ScoreHistogram::bin(0.0), mid);
        assert_eq!(ScoreHistogram::bin(-0.0), mid);
        assert_eq!(ScoreHistogram::bin(1e-300), mid);
        assert_eq!(ScoreHistogram::bin(-1e-9), mid - 1);
        assert_eq!(ScoreHistogram::bin(1e-9), mid);
        assert_eq!(ScoreHistogram::bin(2e-9), mid + 1);
        for top in [1e15 * 1.0001, 1e16, 1e300, f64::MAX, f64::INFINITY] {
            assert_eq!(ScoreHistogram::bin(top), AUC_BINS - 1, "{top}");
            assert_eq!(ScoreHistogram::bin(-top), 0, "{}", -top);
        }
        assert_eq!(ScoreHistogram::bin(f64::NAN), 0);
        assert!(ScoreHistogram::bin(1e15 * 0.99) < AUC_BINS - 1);
        assert!(ScoreHistogram::bin(-1e15 * 0.99) > 0);
        // Sorted scores of every magnitude, both signs: bins never decrease, and scores
        // further apart (in the log map) than a bin are in different bins.
        let mut scores: Vec<f64> = (-1500..=1500)
            .map(|e| 10f64.powf(e as f64 / 100.0))
            .flat_map(|m| [m, -m])
            .chain((-2000..=2000).map(|i| i as f64 * 1.7e-4))
            .collect();
        scores.sort_by(f64::total_cmp);
        let bins: Vec<usize> = scores.iter().map(|&s| ScoreHistogram::bin(s)).collect();
        for i in 1..scores.len() {
            assert!(bins[i - 1] <= bins[i], "{} {}", scores[i - 1], scores[i]);
        }
        for (i, &a) in scores.iter().enumerate() {
            for &b in &scores[i + 1..(i + 40).min(scores.len())] {
                if log_map(b) - log_map(a) > BIN_WIDTH * (1.0 + 1e-9) {
                    assert!(ScoreHistogram::bin(a) < ScoreHistogram::bin(b), "{a} {b}");
                }
            }
        }
        // About 0.1% apart from 1 to 10^15.
        for m in [1.0, 37.0, 1e3, 1e6, 1e9, 1e14] {
            assert!(
                ScoreHistogram::bin(m) < ScoreHistogram::bin(m * 1.0022),
                "{m}"
            );
            assert!(
                ScoreHistogram::bin(-m * 1.0022) < ScoreHistogram::bin(-m),
                "{m}"
            );
        }
    }

    #[test]
    fn histogram_auc_close_to_exact_on_overlapping_normals() {
        for seed in 0..3 {
            // N(±0.6, 1): AUC ≈ 0.80.
            let v = sample(seed, 60_000, |r, p| r.normal() + if p { 0.6 } else { -0.6 });
            // Required: 1e-3; on unit-scale scores the bins are ~500x narrower than
            // the spread, so it is far closer.
            check_histogram_auc(&v, 0.75..0.85, 1e-4, seed);
            // Shifted and scaled (all positive, large): still close.
            let v: Vec<(f64, bool)> = v.iter().map(|&(s, p)| (5e3 + 800.0 * s, p)).collect();
            check_histogram_auc(&v, 0.0..1.0, 1e-4, seed);
        }
    }

    #[test]
    fn histogram_auc_close_to_exact_on_huge_magnitudes() {
        for seed in 0..3 {
            // ±10^(3|z|) with |s| up to 10^6, both signs in both classes.
            let v = sample(seed + 10, 60_000, |r, p| {
                let z = r.normal() + if p { 0.6 } else { -0.6 };
                z.signum() * 10f64.powf((z.abs() * 3.0).min(6.0))
            });
            assert!(v.iter().any(|s| s.0 > 1e5) && v.iter().any(|s| s.0 < -1e5));
            assert!(v.iter().all(|s| s.0.abs() <= 1e6));
            assert!(v.iter().any(|s| s.1 && s.0 < 0.0) && v.iter().any(|s| !s.1 && s.0 > 0.0));
            check_histogram_auc(&v, 0.7..0.9, 1e-3, seed);
        }
    }

    #[test]
    fn histogram_auc_close_to_exact_on_tiny_magnitudes() {
        for seed in 0..3 {
            // N(±0.0021, 0.003) clipped to |s| < 1e-2: AUC ≈ 0.84.
            let v = sample(seed + 20, 60_000, |r, p| {
                (0.003 * r.normal() + if p { 0.0021 } else { -0.0021 }).clamp(-0.0099, 0.0099)
            });
            check_histogram_auc(&v, 0.75..0.9, 1e-3, seed);
        }
    }

    #[test]
    fn histogram_auc_exact_when_scores_are_apart() {
        // The hand examples of the exact tests.
        let v = [
            (0.9, true),
            (0.8, false),
            (-0.1, true),
            (0.3, true),
            (-0.7, false),
            (-0.2, false),
        ];
        assert!(close(histogram_auc(&v).unwrap(), 7.0 / 9.0));
        let v = [(0.1, false), (0.4, false), (0.35, true), (0.8, true)];
        assert_eq!(histogram_auc(&v), Some(0.75));
        let v = [(0.5, true), (0.5, false), (0.9, true), (0.1, false)];
        assert_eq!(histogram_auc(&v), Some(3.5 / 4.0));
        // Perfectly separated (even by less than 1% at 10^6, and across 0): 1; reversed: 0.
        let sep: Vec<(f64, bool)> = (0..500)
            .map(|i| (1e6 + i as f64 * 50.0, true))
            .chain((0..500).map(|i| (1e6 - 6e3 - i as f64 * 1e4, false)))
            .chain((0..200).map(|i| (-1e-2 - i as f64, false)))
            .collect();
        assert_eq!(histogram_auc(&sep), Some(1.0));
        let rev: Vec<(f64, bool)> = sep.iter().map(|&(s, p)| (s, !p)).collect();
        assert_eq!(histogram_auc(&rev), Some(0.0));
        // Scores from a grid whose neighbours are more than a bin apart, with repeats (real
        // ties) and random labels: the histogram is exact, ties included.
        let mut grid = Vec::new();
        let mut m = 0.0f64;
        while m < 45.0 {
            grid.push(m.exp_m1() * AUC_SCORE_UNIT); // log_map(grid[k]) = m
            m += 2.5 * BIN_WIDTH + 0.3 * (grid.len() % 7) as f64;
        }
        let grid: Vec<f64> = grid.iter().flat_map(|&g| [g, -g]).collect();
        for seed in 0..3 {
            let mut rng = Rand::new(seed + 30);
            let v: Vec<(f64, bool)> = (0..20_000)
                .map(|_| {
                    let s = grid[(rng.uniform() * grid.len() as f64) as usize];
                    let positive = rng.uniform() < 1.0 / (1.0 + (-log_map(s) / 5.0).exp());
                    (s, positive)
                })
                .collect();
            check_histogram_auc(&v, 0.6..0.99, 1e-12, seed);
        }
    }

    #[test]
    fn histogram_auc_ties_and_single_class() {
        for s in [0.0, 3.7, -1e9, 1e-5, 1e20] {
            let v = [(s, true), (s, false), (s, true), (s, false), (s, false)];
            assert_eq!(histogram_auc(&v), Some(0.5), "{s}");
        }
        let v: Vec<(f64, bool)> = (0..100).map(|i| (i as f64 - 50.0, true)).collect();
        assert_eq!(histogram_auc(&v), None);
        let v: Vec<(f64, bool)> = (0..100).map(|i| (i as f64 - 50.0, false)).collect();
        assert_eq!(histogram_auc(&v), None);
        assert_eq!(histogram_auc(&[]), None);
        let r = BinaryMetrics::with_histogram().finish();
        assert_eq!((r.n, r.roc_auc, r.log_loss), (0, None, None));
    }

    /// Rows (score, P(positive), actual positive) of a logistic-like model.
    fn binary_rows(seed: u64, n: usize) -> Vec<(f64, f64, bool)> {
        let mut rng = Rand::new(seed);
        (0..n)
            .map(|_| {
                let z = 2.0 * rng.normal();
                let p = 1.0 / (1.0 + (-z).exp());
                (z, p, rng.uniform() < p)
            })
            .collect()
    }

    fn push_all(m: &mut BinaryMetrics, rows: &[(f64, f64, bool)], with_prob: bool) {
        for &(z, p, a) in rows {
            m.push(z, with_prob.then_some(p), a);
        }
    }

    fn round_trip_binary(part: &BinaryPart) -> BinaryPart {
        let json = serde_json::to_string(part).unwrap();
        let back: BinaryPart = serde_json::from_str(&json).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), json);
        back
    }

    #[test]
    fn binary_parts_merge_to_one_pass() {
        let rows = binary_rows(40, 5_000);
        let mut whole = BinaryMetrics::with_histogram();
        push_all(&mut whole, &rows, true);
        let mut exact = BinaryMetrics::new();
        push_all(&mut exact, &rows, true);
        let whole_part = whole.part();
        let whole = whole.finish();
        let exact = exact.finish();
        // Parts of 1234, 0 and 3766 rows, merged in two orders.
        let splits = [&rows[..1234], &rows[1234..1234], &rows[1234..]];
        for order in [[0, 1, 2], [2, 1, 0]] {
            let mut merged = BinaryMetrics::with_histogram();
            for &i in &order {
                let mut m = BinaryMetrics::with_histogram();
                push_all(&mut m, splits[i], true);
                merged.merge(&round_trip_binary(&m.part()));
            }
            let p = merged.part();
            assert_eq!(
                (p.tp, p.fp, p.tn, p.fn_, p.all_have_prob),
                (
                    whole_part.tp,
                    whole_part.fp,
                    whole_part.tn,
                    whole_part.fn_,
                    whole_part.all_have_prob
                )
            );
            assert_eq!(p.bins, whole_part.bins);
            assert!(!p.bins.is_empty());
            let r = merged.finish();
            assert_eq!(r.n, 5_000);
            assert_eq!(
                (r.accuracy, r.precision, r.recall, r.f1, r.roc_auc),
                (
                    whole.accuracy,
                    whole.precision,
                    whole.recall,
                    whole.f1,
                    whole.roc_auc
                )
            );
            assert!(near(r.log_loss.unwrap(), whole.log_loss.unwrap(), 1e-12));
            // And the same as the exact one-pass metrics, AUC aside.
            assert_eq!(
                (r.accuracy, r.precision, r.recall, r.f1, r.n),
                (
                    exact.accuracy,
                    exact.precision,
                    exact.recall,
                    exact.f1,
                    exact.n
                )
            );
            assert!(near(r.log_loss.unwrap(), exact.log_loss.unwrap(), 1e-12));
            assert!((r.roc_auc.unwrap() - exact.roc_auc.unwrap()).abs() <= 1e-4);
        }
        // A part without probabilities (svm-like) makes the merged log loss None, in either
        // order; an empty part (no rows, so "every row had one") does not.
        let mut no_prob = BinaryMetrics::with_histogram();
        push_all(&mut no_prob, &rows[..10], false);
        let mut with_prob = BinaryMetrics::with_histogram();
        push_all(&mut with_prob, &rows[10..], true);
        for parts in [
            [no_prob.part(), with_prob.part()],
            [with_prob.part(), no_prob.part()],
        ] {
            let mut merged = BinaryMetrics::with_histogram();
            for p in &parts {
                merged.merge(&round_trip_binary(p));
            }
            let r = merged.finish();
            assert_eq!((r.n, r.log_loss), (5_000, None));
            assert!(r.roc_auc.is_some());
        }
        let mut merged = BinaryMetrics::with_histogram();
        merged.merge(&BinaryMetrics::with_histogram().part());
        merged.merge(&with_prob.part());
        merged.merge(&BinaryMetrics::with_histogram().part());
        assert!(merged.finish().log_loss.is_some());
        // Only empty parts: the empty report.
        let mut merged = BinaryMetrics::with_histogram();
        merged.merge(&round_trip_binary(&BinaryMetrics::with_histogram().part()));
        assert_eq!(merged.finish(), BinaryMetrics::new().finish());
    }

    #[test]
    fn binary_merge_ignores_bins_out_of_range() {
        let hostile = BinaryPart {
            tp: 1,
            fp: 0,
            tn: 1,
            fn_: 0,
            log_loss_sum: 0.0,
            all_have_prob: false,
            bins: vec![
                (AUC_BINS as u32, 7, 7),
                (3, 1, 0),
                (u32::MAX, 5, 9),
                (AUC_BINS as u32 - 1, 0, 1),
                (AUC_BINS as u32 + 1, 0, 3),
            ],
        };
        let mut m = BinaryMetrics::with_histogram();
        m.merge(&hostile);
        let p = m.part();
        assert_eq!(p.bins, vec![(3, 1, 0), (AUC_BINS as u32 - 1, 0, 1)]);
        // The positive is in the lowest bin, the negative in the highest.
        assert_eq!(m.clone().finish().roc_auc, Some(0.0));
        // From JSON, as a shard's reply would arrive.
        let json = r#"{"tp":0,"fp":0,"tn":0,"fn_":0,"log_loss_sum":0.0,"all_have_prob":true,
                       "bins":[[65536,1,1],[4294967295,2,2],[100,0,1],[200,1,0]]}"#;
        m.merge(&serde_json::from_str(json).unwrap());
        let r = m.finish();
        assert_eq!(r.n, 2);
        // Positives in bins 3, 200; negatives in 100, 65535: 1 win of 4.
        assert_eq!(r.roc_auc, Some(0.25));
    }

    #[test]
    fn multiclass_parts_merge_to_one_pass() {
        let mut rng = Rand::new(50);
        let rows: Vec<(usize, usize, Option<f64>)> = (0..3_000)
            .map(|_| {
                let actual = (rng.uniform() * 4.0) as usize;
                let predicted = if rng.uniform() < 0.6 {
                    actual
                } else {
                    (rng.uniform() * 4.0) as usize
                };
                (predicted, actual, Some(0.05 + 0.9 * rng.uniform()))
            })
            .collect();
        let mut whole = MulticlassMetrics::new(4);
        for &(p, a, q) in &rows {
            whole.push(p, a, q);
        }
        // A part that grew K (index 5 pushed) merged with parts of K = 4, in both orders.
        let mut grown = MulticlassMetrics::new(4);
        grown.push(5, 1, Some(0.5));
        grown.push(2, 5, Some(0.25));
        let mut whole_grown = whole.clone();
        whole_grown.merge(&grown);
        let whole = whole.finish();
        let mut reference = MulticlassMetrics::new(4);
        for &(p, a, q) in rows.iter().chain(&[(5, 1, Some(0.5)), (2, 5, Some(0.25))]) {
            reference.push(p, a, q);
        }
        let reference = reference.finish();
        let round_trip = |m: &MulticlassMetrics| -> MulticlassMetrics {
            serde_json::from_str(&serde_json::to_string(m).unwrap()).unwrap()
        };
        let part = |range: std::ops::Range<usize>| {
            let mut m = MulticlassMetrics::new(4);
            for &(p, a, q) in &rows[range] {
                m.push(p, a, q);
            }
            round_trip(&m)
        };
        let parts = [part(0..700), part(700..700), part(700..3_000)];
        let check = |r: &MulticlassReport, want: &MulticlassReport| {
            assert_eq!(r.n, want.n);
            assert_eq!(r.per_class, want.per_class);
            assert_eq!(
                (r.accuracy, r.macro_precision, r.macro_recall, r.macro_f1),
                (
                    want.accuracy,
                    want.macro_precision,
                    want.macro_recall,
                    want.macro_f1
                )
            );
            assert!(near(r.log_loss.unwrap(), want.log_loss.unwrap(), 1e-12));
        };
        let mut merged = MulticlassMetrics::new(4);
        for p in &parts {
            merged.merge(p);
        }
        check(&merged.finish(), &whole);
        // Larger K merged into smaller, and smaller into larger.
        let mut merged = MulticlassMetrics::new(1);
        for p in &parts {
            merged.merge(p);
        }
        merged.merge(&round_trip(&grown));
        let r = merged.finish();
        assert_eq!(r.per_class.len(), 6);
        check(&r, &reference);
        let mut merged = round_trip(&grown);
        for p in parts.iter().rev() {
            merged.merge(p);
        }
        check(&merged.finish(), &reference);
        check(&whole_grown.finish(), &reference);
        // Empty parts: both directions.
        let mut empty = MulticlassMetrics::new(4);
        empty.merge(&parts[2]);
        let mut right = parts[2].clone();
        right.merge(&MulticlassMetrics::new(4));
        assert_eq!(
            serde_json::to_string(&empty).unwrap(),
            serde_json::to_string(&right).unwrap()
        );
        // A part without probabilities: no log loss.
        let mut no_prob = MulticlassMetrics::new(4);
        no_prob.push(0, 0, None);
        let mut merged = parts[0].clone();
        merged.merge(&no_prob);
        assert_eq!(merged.finish().log_loss, None);
    }

    #[test]
    fn regression_parts_merge_to_one_pass() {
        let mut rng = Rand::new(70);
        let rows: Vec<(f64, f64)> = (0..4_000)
            .map(|_| {
                let actual = 50.0 + 10.0 * rng.normal();
                (actual + 2.0 * rng.normal() + 0.5, actual)
            })
            .collect();
        let mut whole = RegressionMetrics::new();
        for &(p, a) in &rows {
            whole.push(p, a);
        }
        let whole = whole.finish();
        assert!((0.9..1.0).contains(&whole.r2));
        let part = |r: &[(f64, f64)]| {
            let mut m = RegressionMetrics::new();
            for &(p, a) in r {
                m.push(p, a);
            }
            let json = serde_json::to_string(&m).unwrap();
            serde_json::from_str::<RegressionMetrics>(&json).unwrap()
        };
        let parts = [part(&rows[..3_100]), part(&[]), part(&rows[3_100..])];
        for order in [[0, 1, 2], [1, 2, 0]] {
            let mut merged = RegressionMetrics::new();
            for &i in &order {
                merged.merge(&parts[i]);
            }
            let r = merged.finish();
            assert_eq!(r.n, whole.n);
            for (got, want) in [
                (r.mse, whole.mse),
                (r.rmse, whole.rmse),
                (r.mae, whole.mae),
                (r.r2, whole.r2),
            ] {
                assert!(near(got, want, 1e-12), "{got} vs {want}");
            }
        }
        let mut merged = RegressionMetrics::new();
        merged.merge(&RegressionMetrics::new());
        assert_eq!(merged.finish(), RegressionMetrics::new().finish());
        // A constant series split in two: SST stays 0, so R² is 1 for a perfect fit.
        let (mut a, mut b) = (RegressionMetrics::new(), RegressionMetrics::new());
        a.push(2.0, 2.0);
        b.push(2.0, 2.0);
        b.push(2.0, 2.0);
        a.merge(&b);
        assert_eq!(a.finish().r2, 1.0);
    }
}
