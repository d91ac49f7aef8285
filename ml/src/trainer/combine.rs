//! Combining what several trainers did in one epoch: parallel workers (each on its share of
//! the blocks) and shard servers (each on its rows) report their epoch's statistics, and
//! shard servers their models after every round.

use super::{EpochStats, TrainError};

/// The whole epoch's statistics from every part's: tuples, rows and rows skipped add up;
/// loss, accuracy and R² are means weighted by tuples (a part without tuples counts for
/// nothing). Parts are added in a fixed order, so the sums are reproducible.
#[derive(Clone, Debug, Default)]
pub struct EpochTotals {
    pub tuples: u64,
    pub rows: u64,
    pub rows_skipped: u64,
    loss: f64,
    accuracy: f64,
    r2: f64,
}

/// One part's epoch (or round): its means over its own tuples.
#[derive(Clone, Copy, Debug, Default)]
pub struct EpochPart {
    pub tuples: u64,
    pub rows: u64,
    pub rows_skipped: u64,
    pub loss: f64,
    pub accuracy: f64,
    pub r2: f64,
}

impl EpochTotals {
    pub fn add(&mut self, part: &EpochPart) {
        self.tuples = self.tuples.saturating_add(part.tuples);
        self.rows = self.rows.saturating_add(part.rows);
        self.rows_skipped = self.rows_skipped.saturating_add(part.rows_skipped);
        if part.tuples > 0 {
            let t = part.tuples as f64;
            self.loss += part.loss * t;
            self.accuracy += part.accuracy * t;
            self.r2 += part.r2 * t;
        }
    }

    fn mean(&self, sum: f64) -> f64 {
        if self.tuples == 0 {
            0.0
        } else {
            sum / self.tuples as f64
        }
    }

    /// The epoch's statistics, with an accuracy and an R² where asked for (a classifier has
    /// an accuracy, a regression an R² unless its epoch was empty).
    pub fn stats(&self, epoch: u32, accuracy: bool, r2: bool, learning_rate: f64) -> EpochStats {
        EpochStats {
            epoch,
            loss: self.mean(self.loss),
            accuracy: accuracy.then(|| self.mean(self.accuracy)),
            r2: r2.then(|| self.mean(self.r2)),
            tuples: self.tuples,
            learning_rate,
        }
    }
}

/// A model trained in rounds by several parts at once (the shards of a table): every round
/// starts all parts from the same parameters, and the round's result is those parameters plus
/// each part's change. Every part's steps count once, as sequential SGD over the parts' tuples
/// would move the model, to first order; averaging the parts' models weighted by tuples would
/// count a big part twice (its change already grows with its tuples): with one class per part
/// and parts of 90% and 10% of the rows, that gave a majority-class model.
///
/// With `average_from`, the result is the mean of the models after every round from that
/// epoch on (iterate averaging, as one process does with `"average"`).
#[derive(Clone, Debug)]
pub struct DeltaRounds {
    /// Weights then biases, flat.
    params: Vec<f64>,
    average_from: Option<u32>,
    sums: Vec<f64>,
    samples: u64,
    /// The round's result is the start plus the mean of the parts' changes (see
    /// `starting_from`), not their sum.
    mean_of_parts: bool,
}

impl DeltaRounds {
    /// Starts from all-zero parameters.
    pub fn new(n_params: usize, average_from: Option<u32>) -> DeltaRounds {
        DeltaRounds {
            params: vec![0.0; n_params],
            average_from,
            sums: vec![0.0; if average_from.is_some() { n_params } else { 0 }],
            samples: 0,
            mean_of_parts: false,
        }
    }

    /// Each round moves by the mean of the parts' changes instead of their sum (regression:
    /// see `shard::coordinator`).
    pub fn with_mean_of_parts(mut self, mean_of_parts: bool) -> DeltaRounds {
        self.mean_of_parts = mean_of_parts;
        self
    }

    /// Starts from `params` (a network's seeded initial weights), without averaging;
    /// `mean_of_parts`: each round moves by the mean of the parts' changes.
    pub fn starting_from(params: Vec<f64>, mean_of_parts: bool) -> DeltaRounds {
        DeltaRounds {
            params,
            average_from: None,
            sums: Vec::new(),
            samples: 0,
            mean_of_parts,
        }
    }

    /// Starts the first round from `params` instead (a warm start: a stored model's
    /// parameters in the parts' units), keeping how rounds combine and average. False, and
    /// nothing changed, when `params` has another length or averaging already took a round.
    pub fn start_at(&mut self, params: Vec<f64>) -> bool {
        if params.len() != self.params.len() || self.samples > 0 {
            return false;
        }
        self.params = params;
        true
    }

    /// The parameters every part starts the next round from.
    pub fn params(&self) -> &[f64] {
        &self.params
    }

    /// Ends a round of `epoch`: adds each part's change (its parameters minus the round's
    /// start; parts that trained no tuple are skipped). Diverged when a parameter is no longer
    /// finite.
    pub fn combine<'a>(
        &mut self,
        epoch: u32,
        parts: impl IntoIterator<Item = impl Iterator<Item = &'a f64>>,
    ) -> Result<(), TrainError> {
        let start = self.params.clone();
        let mut n = 0usize;
        for part in parts {
            n += 1;
            for ((v, x), s0) in self.params.iter_mut().zip(part).zip(&start) {
                *v += x - s0;
            }
        }
        if self.mean_of_parts && n > 1 {
            let n = n as f64;
            for (v, s0) in self.params.iter_mut().zip(&start) {
                *v = s0 + (*v - s0) / n;
            }
        }
        if !self.params.iter().all(|v| v.is_finite()) {
            return Err(TrainError::Diverged { epoch });
        }
        if self.average_from.is_some_and(|from| epoch >= from) {
            self.sums
                .iter_mut()
                .zip(&self.params)
                .for_each(|(s, w)| *s += w);
            self.samples += 1;
        }
        Ok(())
    }

    /// The result: the averaged parameters if any round was averaged, else the last ones.
    pub fn finish(self) -> Vec<f64> {
        self.result()
    }

    /// The result so far (as `finish` would give it now): an epoch's model, for validation.
    pub fn result(&self) -> Vec<f64> {
        if self.samples > 0 {
            let n = self.samples as f64;
            self.sums.iter().map(|s| s / n).collect()
        } else {
            self.params.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(tuples: u64, loss: f64, accuracy: f64) -> EpochPart {
        EpochPart {
            tuples,
            rows: tuples + 1,
            rows_skipped: 1,
            loss,
            accuracy,
            r2: 0.0,
        }
    }

    #[test]
    fn epoch_totals_weight_by_tuples() {
        let mut t = EpochTotals::default();
        t.add(&part(300, 1.0, 0.5));
        t.add(&part(100, 2.0, 1.0));
        // A part without tuples counts for nothing, whatever its means say.
        t.add(&part(0, f64::NAN, f64::NAN));
        let s = t.stats(3, true, false, 0.1);
        assert_eq!(s.epoch, 3);
        assert_eq!(s.tuples, 400);
        assert_eq!(s.loss, (300.0 + 200.0) / 400.0);
        assert_eq!(s.accuracy, Some((150.0 + 100.0) / 400.0));
        assert_eq!(s.r2, None);
        assert_eq!(s.learning_rate, 0.1);
        assert_eq!((t.rows, t.rows_skipped), (403, 3));
        let empty = EpochTotals::default().stats(1, false, true, 0.1);
        assert_eq!(
            (empty.loss, empty.r2, empty.accuracy),
            (0.0, Some(0.0), None)
        );
    }

    #[test]
    fn each_part_s_change_counts_once() {
        let mut m = DeltaRounds::new(3, None);
        let a = [1.0, 0.0, 2.0];
        let b = [0.0, -1.0, 1.0];
        m.combine(1, [a.iter(), b.iter()]).unwrap();
        assert_eq!(m.params(), &[1.0, -1.0, 3.0]);
        // Next round: changes relative to [1, -1, 3].
        let c = [2.0, -1.0, 3.0];
        m.combine(1, [c.iter()]).unwrap();
        assert_eq!(m.params(), &[2.0, -1.0, 3.0]);
        assert_eq!(m.finish(), vec![2.0, -1.0, 3.0]);
    }

    #[test]
    fn a_network_moves_by_the_mean_of_the_parts_changes() {
        let mut m = DeltaRounds::starting_from(vec![1.0, -1.0], true);
        // Changes (+2, 0) and (0, +4): the mean (+1, +2).
        m.combine(1, [[3.0, -1.0].iter(), [1.0, 3.0].iter()])
            .unwrap();
        assert_eq!(m.params(), &[2.0, 1.0]);
        // One part: its change whole.
        m.combine(1, [[4.0, 1.0].iter()]).unwrap();
        assert_eq!(m.finish(), vec![4.0, 1.0]);
    }

    #[test]
    fn a_part_that_diverged_is_an_error() {
        let mut m = DeltaRounds::new(2, None);
        let bad = [f64::INFINITY, 0.0];
        assert_eq!(
            m.combine(4, [bad.iter()]),
            Err(TrainError::Diverged { epoch: 4 })
        );
    }

    #[test]
    fn averaging_starts_at_its_epoch() {
        let mut m = DeltaRounds::new(1, Some(2));
        m.combine(1, [[10.0].iter()]).unwrap(); // not averaged
        m.combine(2, [[12.0].iter()]).unwrap(); // 12
        m.combine(2, [[16.0].iter()]).unwrap(); // 16
        assert_eq!(m.params(), &[16.0]);
        assert_eq!(m.finish(), vec![14.0]);
    }

    #[test]
    fn a_warm_start_changes_the_start_and_keeps_averaging() {
        let mut rounds = DeltaRounds::new(2, Some(1));
        assert!(!rounds.start_at(vec![1.0]));
        assert!(rounds.start_at(vec![1.0, -2.0]));
        assert_eq!(rounds.params(), &[1.0, -2.0]);
        // Two parts move by +1 and +3 on the first parameter: the sum of changes.
        let parts = [vec![2.0, -2.0], vec![4.0, -2.0]];
        rounds.combine(1, parts.iter().map(|p| p.iter())).unwrap();
        assert_eq!(rounds.params(), &[5.0, -2.0]);
        // Averaged from epoch 1: one sample, the combined model.
        assert_eq!(rounds.result(), vec![5.0, -2.0]);
        // Once averaging took a round, the start is history.
        assert!(!rounds.start_at(vec![0.0, 0.0]));
    }
}
