//! ROC AUC: exact (Mann–Whitney over every kept score) and from a [`ScoreHistogram`] of the
//! scores (bounded memory, mergeable across shards).

/// Bins of [`ScoreHistogram`].
pub const AUC_BINS: usize = 1 << 16;

/// Scores are binned in units of this: resolution down to 10^-6.
const AUC_SCORE_UNIT: f64 = 1e-6;
/// ln(1 + 10^15 / AUC_SCORE_UNIT): scores beyond ±10^15 share the outermost bins.
const AUC_LOG_RANGE: f64 = 48.35428695287496;

/// The bin of `score` among `bins` equal bins of sign(score)·ln(1 + |score| / 10^-6) over
/// [-AUC_LOG_RANGE, AUC_LOG_RANGE] (see [`ScoreHistogram`]); NaN goes to bin 0.
#[inline]
pub(crate) fn score_bin(score: f64, bins: usize) -> usize {
    let m = (score.signum() * (score.abs() / AUC_SCORE_UNIT).ln_1p())
        .clamp(-AUC_LOG_RANGE, AUC_LOG_RANGE);
    let unit = (m + AUC_LOG_RANGE) / (2.0 * AUC_LOG_RANGE);
    // NaN casts to 0.
    ((unit * bins as f64) as usize).min(bins - 1)
}

/// The smallest score of bin `b` of `bins` (`score_bin`'s inverse at the bin's lower edge; the
/// lowest bin's edge is -infinity, as every score below the range falls in it).
pub(crate) fn bin_lower_edge(b: usize, bins: usize) -> f64 {
    if b == 0 {
        return f64::NEG_INFINITY;
    }
    let m = b as f64 / bins as f64 * (2.0 * AUC_LOG_RANGE) - AUC_LOG_RANGE;
    m.signum() * m.abs().exp_m1() * AUC_SCORE_UNIT
}

/// Positive and negative counts of the scores in each of [`AUC_BINS`] equal bins of
/// sign(score)·ln(1 + |score| / 10^-6) over [-AUC_LOG_RANGE, AUC_LOG_RANGE] — a monotone map
/// that keeps scores apart to about 0.15% of their size from 10^-6 to 10^15 (a sigmoid would
/// put every score above ~11 in one bin, and ln(1 + |score|) every score below 10^-3). ROC AUC from it counts a positive and a
/// negative in the same bin as a tie (1/2): exact up to ties within a bin, in bounded memory,
/// and two histograms add.
#[derive(Clone, Debug)]
pub(super) struct ScoreHistogram {
    pub(super) positive: Vec<u64>,
    pub(super) negative: Vec<u64>,
}

impl ScoreHistogram {
    pub(super) fn new() -> Self {
        ScoreHistogram {
            positive: vec![0; AUC_BINS],
            negative: vec![0; AUC_BINS],
        }
    }

    #[inline]
    fn bin(score: f64) -> usize {
        score_bin(score, AUC_BINS)
    }

    pub(super) fn push(&mut self, score: f64, positive: bool) {
        let b = Self::bin(score);
        if positive {
            self.positive[b] += 1;
        } else {
            self.negative[b] += 1;
        }
    }

    /// Σ over positives of (negatives in lower bins + half those in its bin), over P·N.
    pub(super) fn auc(&self) -> Option<f64> {
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

/// Mann–Whitney: AUC = (Σ ranks of positives - P(P+1)/2) / (P·N), tied
/// scores sharing their average rank (so a tie counts 1/2).
pub(super) fn roc_auc(scored: &mut [(f64, bool)]) -> Option<f64> {
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

#[cfg(test)]
mod tests;
