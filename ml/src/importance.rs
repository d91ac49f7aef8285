//! Permutation importance (Breiman; scikit-learn's `permutation_importance`): how much a model's
//! score on a sample of rows drops when one input column's values are shuffled across the rows,
//! breaking its link to the label while keeping its distribution. A column is a group of
//! encoded features (a one-hot column's features move together), so the importance is the
//! column's, as a user named it.

use serde::{Deserialize, Serialize};

use crate::metrics::r2_score;
use crate::model::ModelKind;
use crate::moments::Welford;
use crate::preprocess::Preprocessor;
use crate::shuffle::TupleShuffler;

/// The most rows a sample may have, and permutations per column.
pub const MAX_ROWS: u64 = 1_000_000;
pub const MAX_REPEATS: u64 = 100;

/// One column's importance: the mean drop of the score over the repeats and its standard
/// deviation (population, as scikit-learn's `importances_std`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Importance {
    pub mean: f64,
    pub std: f64,
}

/// The score a permutation importance drops: corgipile_evaluate's accuracy (classifiers) or R²
/// (regression).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    Accuracy,
    R2,
}

impl Metric {
    /// The score of a `kind` model's importance.
    pub fn of(kind: ModelKind) -> Metric {
        if kind.is_classifier() {
            Metric::Accuracy
        } else {
            Metric::R2
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Metric::Accuracy => "accuracy",
            Metric::R2 => "r2",
        }
    }
}

/// The sums a score of some rows comes from, mergeable: the parts of the rows of several
/// servers (shards) merged score as all the rows at once. `correct` counts a classifier's rows
/// classified right; `sse` and `actual` are a regression's squared errors and the moments of
/// its labels (0 and empty for a classifier).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ScorePart {
    pub rows: u64,
    pub correct: u64,
    #[serde(with = "crate::nonfinite")]
    pub sse: f64,
    pub actual: Welford,
}

impl ScorePart {
    /// Adds another part's rows.
    pub fn merge(&mut self, other: &ScorePart) {
        self.rows = self.rows.saturating_add(other.rows);
        self.correct = self.correct.saturating_add(other.correct);
        self.sse += other.sse;
        self.actual.merge(&other.actual);
    }

    /// The score of the rows: NaN without rows.
    pub fn score(&self, metric: Metric) -> f64 {
        if self.rows == 0 {
            return f64::NAN;
        }
        match metric {
            Metric::Accuracy => self.correct as f64 / self.rows as f64,
            Metric::R2 => r2_score(self.sse, self.actual.m2()),
        }
    }

    /// Why this part (from another server) cannot score rows of `metric`: counts that do not
    /// add up, sums that are not finite or negative.
    pub fn check(&self, metric: Metric) -> Result<(), String> {
        let a = &self.actual;
        let regression_rows = if metric == Metric::R2 { self.rows } else { 0 };
        if self.correct > self.rows
            || (metric == Metric::R2 && self.correct != 0)
            || a.n() != regression_rows
            || !(self.sse.is_finite() && self.sse >= 0.0)
            || !a.mean().is_finite()
            || !(a.m2().is_finite() && a.m2() >= 0.0)
        {
            return Err(format!(
                "a score of {} rows, {} correct, {} labels, squared errors {}",
                self.rows,
                self.correct,
                a.n(),
                self.sse
            ));
        }
        Ok(())
    }
}

/// The encoded features of each input column of a model of `n_features` features: a column
/// list's columns (a one-hot column's features together), or each feature alone.
pub fn column_ranges(
    preprocessing: Option<&Preprocessor>,
    n_features: usize,
) -> Vec<std::ops::Range<usize>> {
    match preprocessing {
        Some(p) => p
            .columns
            .iter()
            .map(|c| c.offset..c.offset + c.encoding.width())
            .collect(),
        None => (0..n_features).map(|j| j..j + 1).collect(),
    }
}

/// The score of the dense rows `rows` (each `width` features, row-major) as they are, and with
/// each column of `columns` (its encoded features' range in a row) taken from another row:
/// `repeats` permutations seeded by `seed` per column. `score` sees the rows in a buffer it may
/// read only. Returns the score as they are and the permuted scores, column by column
/// (`repeats` for each). The rows are at most u32::MAX.
pub fn permuted_scores<T>(
    rows: &[f64],
    width: usize,
    columns: &[std::ops::Range<usize>],
    repeats: usize,
    seed: u64,
    mut score: impl FnMut(&[f64]) -> T,
) -> (T, Vec<T>) {
    let n = rows.len().checked_div(width).unwrap_or(0);
    let baseline = score(rows);
    let mut shuffler = TupleShuffler::new(seed, 0);
    let mut permuted = rows.to_vec();
    let mut order: Vec<u32> = Vec::with_capacity(n);
    let mut out = Vec::with_capacity(columns.len().saturating_mul(repeats));
    for range in columns {
        for _ in 0..repeats {
            shuffler.permutation(n, &mut order);
            for (i, &from) in order.iter().enumerate() {
                let (to, from) = (i * width, from as usize * width);
                permuted[to + range.start..to + range.end]
                    .copy_from_slice(&rows[from + range.start..from + range.end]);
            }
            out.push(score(&permuted));
        }
        // Restore the column for the next one.
        for i in 0..n {
            let at = i * width;
            permuted[at + range.start..at + range.end]
                .copy_from_slice(&rows[at + range.start..at + range.end]);
        }
    }
    (baseline, out)
}

/// Each column's importance from the score as the rows are and the permuted scores of
/// [`permuted_scores`] (`repeats` a column, column by column).
pub fn importances(baseline: f64, permuted: &[f64], repeats: usize) -> Vec<Importance> {
    permuted
        .chunks(repeats.max(1))
        .map(|scores| {
            let drops = scores.iter().map(|s| baseline - s);
            let mean = drops.clone().sum::<f64>() / scores.len() as f64;
            let var = drops.map(|d| (d - mean).powi(2)).sum::<f64>() / scores.len() as f64;
            Importance {
                mean,
                std: var.sqrt(),
            }
        })
        .collect()
}

/// One server's [`permuted_scores`] of [`ScorePart`]s: its rows as they are, and permuted.
pub type ServerScores = (ScorePart, Vec<ScorePart>);

/// Each column's importance on the rows of several servers: `parts` holds every server's
/// [`permuted_scores`] of [`ScorePart`]s (each server's rows permuted among themselves), of the
/// same columns and repeats. The parts of the score as the rows are, and of each permuted
/// score, are merged across the servers before they score. Returns the score as the rows are
/// and the importances. (With one server, it is [`permutation_importance`].)
pub fn pooled_importance(
    parts: &[ServerScores],
    metric: Metric,
    repeats: usize,
) -> (f64, Vec<Importance>) {
    let mut baseline = ScorePart::default();
    let mut permuted: Vec<ScorePart> = Vec::new();
    for (base, scores) in parts {
        baseline.merge(base);
        permuted.resize(scores.len().max(permuted.len()), ScorePart::default());
        for (total, part) in permuted.iter_mut().zip(scores) {
            total.merge(part);
        }
    }
    let baseline = baseline.score(metric);
    let permuted: Vec<f64> = permuted.iter().map(|p| p.score(metric)).collect();
    (baseline, importances(baseline, &permuted, repeats))
}

/// The importance of each column of `columns` for the rows `rows` (see [`permuted_scores`]):
/// the score of the rows as they are minus the score with the column's features taken from
/// another row, `repeats` times. Also returns the score of the rows as they are.
pub fn permutation_importance(
    rows: &[f64],
    width: usize,
    columns: &[std::ops::Range<usize>],
    repeats: usize,
    seed: u64,
    score: impl FnMut(&[f64]) -> f64,
) -> (f64, Vec<Importance>) {
    let (baseline, permuted) = permuted_scores(rows, width, columns, repeats, seed, score);
    (baseline, importances(baseline, &permuted, repeats))
}

/// `rows` split among servers (shards) of `counts` rows in proportion (largest
/// remainders; at most a shard's rows): they add up to `rows`, or to every row if fewer.
pub fn split_rows(rows: u64, counts: &[u64]) -> Vec<u64> {
    let total: u128 = counts.iter().map(|&c| c as u128).sum();
    if total <= rows as u128 {
        return counts.to_vec();
    }
    let exact: Vec<(u64, u128)> = counts
        .iter()
        .map(|&c| {
            let product = rows as u128 * c as u128;
            ((product / total) as u64, product % total)
        })
        .collect();
    let mut out: Vec<u64> = exact.iter().map(|e| e.0).collect();
    let left = rows - out.iter().sum::<u64>();
    let mut order: Vec<usize> = (0..counts.len()).collect();
    order.sort_by(|&a, &b| exact[b].1.cmp(&exact[a].1).then(a.cmp(&b)));
    for &i in order.iter().take(left as usize) {
        out[i] += 1;
    }
    out
}

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init)] // a list of one column's range
mod tests {
    use super::*;

    /// Accuracy of "label = x0 > 0" where the label is the sign of x0: x1 is noise.
    fn sign_of_first(rows: &[f64], labels: &[bool]) -> f64 {
        let hits = rows
            .chunks(2)
            .zip(labels)
            .filter(|(x, &y)| (x[0] > 0.0) == y)
            .count();
        hits as f64 / labels.len() as f64
    }

    #[test]
    fn a_column_the_model_ignores_has_no_importance() {
        // A spread of values of both signs, in no order.
        let xs: Vec<f64> = (0..2000)
            .map(|i| ((i * 7919) % 2001) as f64 - 1000.5)
            .collect();
        let labels: Vec<bool> = xs.chunks(2).map(|x| x[0] > 0.0).collect();
        let (baseline, imp) =
            permutation_importance(&xs, 2, &[0..1, 1..2], 5, 1, |r| sign_of_first(r, &labels));
        assert_eq!(baseline, 1.0);
        assert!(
            (imp[0].mean - 0.5).abs() < 0.06,
            "shuffling the label's column: a coin flip, {imp:?}"
        );
        assert!(imp[0].std > 0.0);
        assert_eq!(
            imp[1],
            Importance {
                mean: 0.0,
                std: 0.0
            }
        );
    }

    #[test]
    fn the_same_seed_gives_the_same_importances_and_rows_stay_as_they_were() {
        let xs: Vec<f64> = (0..300).map(|i| ((i * 37) % 101) as f64 - 50.0).collect();
        let labels: Vec<bool> = xs.chunks(2).map(|x| x[0] > 0.0).collect();
        let run =
            |seed| permutation_importance(&xs, 2, &[0..2], 3, seed, |r| sign_of_first(r, &labels));
        assert_eq!(run(7), run(7));
        assert_ne!(run(7).1, run(8).1);
    }

    #[test]
    fn a_group_of_features_moves_together() {
        // Two features that must agree (a one-hot pair): shuffled together they still agree.
        let rows: Vec<f64> = (0..100)
            .flat_map(|i| if i % 2 == 0 { [1.0, 0.0] } else { [0.0, 1.0] })
            .collect();
        let consistent =
            |r: &[f64]| r.chunks(2).filter(|x| x[0] + x[1] == 1.0).count() as f64 / 100.0;
        let (_, together) = permutation_importance(&rows, 2, &[0..2], 4, 1, consistent);
        assert_eq!(together[0].mean, 0.0);
        let (_, apart) = permutation_importance(&rows, 2, &[0..1], 4, 1, consistent);
        assert!(apart[0].mean > 0.2, "{apart:?}");
    }

    /// Accuracy parts of "label = x0 > 0" where the label is the sign of x0.
    fn sign_parts(rows: &[f64], labels: &[bool]) -> ScorePart {
        let correct = rows
            .chunks(2)
            .zip(labels)
            .filter(|(x, &y)| (x[0] > 0.0) == y)
            .count() as u64;
        ScorePart {
            rows: labels.len() as u64,
            correct,
            ..ScorePart::default()
        }
    }

    #[test]
    fn pooled_parts_of_one_server_are_its_importance() {
        let xs: Vec<f64> = (0..600).map(|i| ((i * 37) % 101) as f64 - 50.0).collect();
        let labels: Vec<bool> = xs.chunks(2).map(|x| x[0] > 0.0).collect();
        let columns = [0..1, 1..2];
        let one = permutation_importance(&xs, 2, &columns, 3, 5, |r| sign_of_first(r, &labels));
        let parts = permuted_scores(&xs, 2, &columns, 3, 5, |r| sign_parts(r, &labels));
        assert_eq!(pooled_importance(&[parts], Metric::Accuracy, 3), one);
    }

    #[test]
    fn parts_of_two_servers_pool_into_the_scores_of_all_their_rows() {
        // Two halves, each permuted among itself: the label's column is still the important one.
        let xs: Vec<f64> = (0..2000)
            .map(|i| ((i * 7919) % 2001) as f64 - 1000.5)
            .collect();
        let labels: Vec<bool> = xs.chunks(2).map(|x| x[0] > 0.0).collect();
        let (a, b) = xs.split_at(1200);
        let (la, lb) = labels.split_at(600);
        let columns = [0..1, 1..2];
        let pa = permuted_scores(a, 2, &columns, 4, 1, |r| sign_parts(r, la));
        let pb = permuted_scores(b, 2, &columns, 4, 2, |r| sign_parts(r, lb));
        assert_eq!(pa.0.rows + pb.0.rows, 1000);
        let (baseline, imp) = pooled_importance(&[pa.clone(), pb.clone()], Metric::Accuracy, 4);
        assert_eq!(baseline, 1.0);
        assert!((imp[0].mean - 0.5).abs() < 0.06, "{imp:?}");
        assert_eq!(imp[1].mean, 0.0);
        // Each permuted score is of all 1000 rows: the mean of the halves', weighted by rows.
        let first = (pa.1[0].correct + pb.1[0].correct) as f64 / 1000.0;
        let want = importances(1.0, &[first], 1)[0].mean;
        let (_, one_repeat) = pooled_importance(
            &[(pa.0, pa.1[..1].to_vec()), (pb.0, pb.1[..1].to_vec())],
            Metric::Accuracy,
            1,
        );
        assert_eq!(one_repeat[0].mean, want);
    }

    #[test]
    fn r2_parts_merge_into_the_r2_of_all_rows() {
        let actual: Vec<f64> = (0..100)
            .map(|i| (i as f64 * 0.37).sin() * 10.0 + 3.0)
            .collect();
        let predicted: Vec<f64> = actual.iter().map(|y| y * 0.9 + 0.2).collect();
        let part = |range: std::ops::Range<usize>| {
            let mut p = ScorePart::default();
            for i in range {
                p.rows += 1;
                p.sse += (predicted[i] - actual[i]).powi(2);
                p.actual.push(actual[i]);
            }
            p
        };
        let mut merged = part(0..30);
        merged.merge(&part(30..100));
        let all = part(0..100);
        assert!((merged.score(Metric::R2) - all.score(Metric::R2)).abs() < 1e-12);
        assert!(all.score(Metric::R2) > 0.9);
        assert!(merged.check(Metric::R2).is_ok());
    }

    #[test]
    fn a_forged_part_is_refused() {
        let good = ScorePart {
            rows: 10,
            correct: 7,
            ..ScorePart::default()
        };
        assert!(good.check(Metric::Accuracy).is_ok());
        assert!(good.check(Metric::R2).is_err(), "no labels' moments for R²");
        let more_correct = ScorePart {
            correct: 11,
            ..good
        };
        assert!(more_correct.check(Metric::Accuracy).is_err());
        let nan = ScorePart {
            sse: f64::NAN,
            ..good
        };
        assert!(nan.check(Metric::Accuracy).is_err());
        let mut actual = Welford::new();
        actual.push(1.0);
        let negative = ScorePart {
            rows: 1,
            correct: 0,
            sse: -1.0,
            actual,
        };
        assert!(negative.check(Metric::R2).is_err());
        assert!(ScorePart {
            sse: 0.5,
            ..negative
        }
        .check(Metric::R2)
        .is_ok());
    }

    #[test]
    fn split_rows_add_up_and_follow_the_counts() {
        assert_eq!(split_rows(10, &[30, 70]), vec![3, 7]);
        assert_eq!(
            split_rows(10, &[1, 1, 1]),
            vec![1, 1, 1],
            "fewer rows than asked: all"
        );
        assert_eq!(split_rows(10, &[0, 50]), vec![0, 10]);
        assert_eq!(
            split_rows(2, &[5, 5, 5]),
            vec![1, 1, 0],
            "ties: the first shards"
        );
        let counts = [333, 333, 334, 7];
        let s = split_rows(1000, &counts);
        assert_eq!(s.iter().sum::<u64>(), 1000);
        assert!(s.iter().zip(counts).all(|(a, c)| *a <= c));
        assert_eq!(
            split_rows(u64::MAX, &[u64::MAX, u64::MAX])
                .iter()
                .map(|&v| v as u128)
                .sum::<u128>(),
            u64::MAX as u128
        );
    }
}
