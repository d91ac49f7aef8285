//! Streaming evaluation metrics (scikit-learn conventions), for models applied
//! to a table. Reports serialize to JSON.
//!
//! Undefined ratios (no predicted positives, no support, ...) are 0, like
//! scikit-learn's `zero_division=0`; an empty input gives all-zero reports.

use serde::{Deserialize, Serialize};

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

/// Positive and negative counts of the scores in each of [`AUC_BINS`] equal bins of
/// sigmoid(score) — a monotone map of every score into [0, 1], so ranks are kept up to the
/// bin. ROC AUC from it counts a positive and a negative in the same bin as a tie (1/2): exact
/// up to ties within a bin, in bounded memory, and two histograms add.
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
        let p = 1.0 / (1.0 + (-score).exp());
        // NaN casts to 0.
        ((p * AUC_BINS as f64) as usize).min(AUC_BINS - 1)
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
    log_loss_sum: f64,
    all_have_prob: bool,
    bins: Vec<(u32, u64, u64)>,
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
    pub fn merge(&mut self, part: &BinaryPart) {
        self.tp += part.tp;
        self.fp += part.fp;
        self.tn += part.tn;
        self.fn_ += part.fn_;
        self.log_loss_sum += part.log_loss_sum;
        self.all_have_prob &= part.all_have_prob;
        let histogram = self
            .histogram
            .as_mut()
            .expect("only histogram metrics are merged");
        for &(b, p, n) in &part.bins {
            if let Some(slot) = histogram.positive.get_mut(b as usize) {
                *slot += p;
                histogram.negative[b as usize] += n;
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
            self.tp[c] += tp;
            self.predicted[c] += predicted;
            self.actual[c] += actual;
        }
        self.n += other.n;
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

/// Welford's streaming mean and M2 (sum of squared deviations from the mean) of a series:
/// M2 of the actual values is the SST of R². One implementation for the trainer's per-epoch
/// R² and [`RegressionMetrics`], so both compute it with the same arithmetic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Welford {
    n: u64,
    mean: f64,
    m2: f64,
}

impl Welford {
    pub fn new() -> Self {
        Self::default()
    }

    #[inline]
    pub fn push(&mut self, x: f64) {
        self.n += 1;
        let delta = x - self.mean;
        self.mean += delta / self.n as f64;
        self.m2 += delta * (x - self.mean);
    }

    /// Adds another series' values (Chan's pairwise merge).
    pub fn merge(&mut self, other: &Welford) {
        crate::stats::merge_moments(
            &mut self.n,
            &mut self.mean,
            &mut self.m2,
            other.n,
            other.mean,
            other.m2,
        );
    }

    /// Values pushed.
    pub fn n(&self) -> u64 {
        self.n
    }

    pub fn mean(&self) -> f64 {
        self.mean
    }

    /// Σ (x - mean)².
    pub fn m2(&self) -> f64 {
        self.m2
    }
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
    sse: f64,
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
mod tests {
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
}
