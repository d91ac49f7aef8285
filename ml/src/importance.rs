//! Permutation importance (Breiman; scikit-learn's `permutation_importance`): how much a model's
//! score on a sample of rows drops when one input column's values are shuffled across the rows,
//! breaking its link to the label while keeping its distribution. A column is a group of
//! encoded features (a one-hot column's features move together), so the importance is the
//! column's, as a user named it.

use crate::shuffle::TupleShuffler;

/// One column's importance: the mean drop of the score over the repeats and its standard
/// deviation (population, as scikit-learn's `importances_std`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Importance {
    pub mean: f64,
    pub std: f64,
}

/// The importance of each column of `columns` (its encoded features' range in a row) for the
/// dense rows `rows` (each `width` features, row-major): the score of the rows as they are
/// (`score` of the rows) minus the score with the column's features taken from another row,
/// `repeats` times with permutations seeded by `seed`. `score` sees the rows in a buffer it may
/// read only. Also returns the score of the rows as they are. The rows are at most u32::MAX.
pub fn permutation_importance(
    rows: &[f64],
    width: usize,
    columns: &[std::ops::Range<usize>],
    repeats: usize,
    seed: u64,
    mut score: impl FnMut(&[f64]) -> f64,
) -> (f64, Vec<Importance>) {
    let n = rows.len().checked_div(width).unwrap_or(0);
    let baseline = score(rows);
    let mut shuffler = TupleShuffler::new(seed, 0);
    let mut permuted = rows.to_vec();
    let mut order: Vec<u32> = Vec::with_capacity(n);
    let mut out = Vec::with_capacity(columns.len());
    for range in columns {
        let mut drops = Vec::with_capacity(repeats);
        for _ in 0..repeats {
            shuffler.permutation(n, &mut order);
            for (i, &from) in order.iter().enumerate() {
                let (to, from) = (i * width, from as usize * width);
                permuted[to + range.start..to + range.end]
                    .copy_from_slice(&rows[from + range.start..from + range.end]);
            }
            drops.push(baseline - score(&permuted));
        }
        // Restore the column for the next one.
        for i in 0..n {
            let at = i * width;
            permuted[at + range.start..at + range.end]
                .copy_from_slice(&rows[at + range.start..at + range.end]);
        }
        let mean = drops.iter().sum::<f64>() / repeats.max(1) as f64;
        let var = drops.iter().map(|d| (d - mean).powi(2)).sum::<f64>() / repeats.max(1) as f64;
        out.push(Importance {
            mean,
            std: var.sqrt(),
        });
    }
    (baseline, out)
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
}
