//! Binary classification metrics (accuracy, precision, recall, F1, ROC AUC, log loss) and
//! [`BinaryPart`], what a shard sends of them.

use serde::{Deserialize, Serialize};

use super::auc::{roc_auc, ScoreHistogram, AUC_BINS};
use super::{f1, ratio, EPS};

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

    /// Rows classified correctly.
    pub fn correct(&self) -> u64 {
        self.tp + self.tn
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

#[cfg(test)]
mod tests;
