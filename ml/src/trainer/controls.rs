//! Control variates of a model trained on shards with kept optimizers (SCAFFOLD, Karimireddy
//! et al. 2020). Each round a shard's steps drift towards the optimum of its own rows; when
//! its rows are unlike the others' (one class per shard) the mean of the shards' models is
//! worse than one server's (measured: an mlp 1.8 points of accuracy below it, still 1.0 with
//! 256 rounds per epoch). Each shard answers its control, the mean gradient of its round's
//! steps; the next round adds to every step of shard k the correction c − c_k, c the shards'
//! controls averaged by the tuples of their rounds, so every shard steps along the whole
//! table's gradient. Chosen, in a simulation of that case (three seeds; with controls +0.00
//! to +0.11 point), over averaging the shards' Adam moments too (-0.41 to +0.02, and two more
//! vectors each way where controls add one) and momentum on the coordinator (-1.6 to -29).

/// How far one shard's class shares may be from every row's (total variation) and its rows
/// still count as like the others': a correction then costs more than it mends. Rows hashed
/// over shards are within a few thousandths; one class per shard is 0.5.
pub const LIKE_SHARES: f64 = 0.1;

/// Whether the shards' rows are unlike (their class shares differ, `LIKE_SHARES`), so that a
/// model with kept optimizers corrects each shard's drift. Measured without this gate: on
/// shards of like rows the corrections' noise (a control is one round's mean gradient, the
/// same error added to every step of the next round) cost a search of small networks 2.4 to
/// 3.7 points against one server on 8,000 rows a shard. `counts`: each shard's rows by class,
/// every shard numbering classes alike; a regression's are empty (never corrected).
pub fn unlike_shards(counts: &[Vec<(f64, u64)>]) -> bool {
    let mut all: Vec<(f64, u64)> = Vec::new();
    for shard in counts {
        for &(class, n) in shard {
            match all.iter_mut().find(|(c, _)| *c == class) {
                Some((_, total)) => *total += n,
                None => all.push((class, n)),
            }
        }
    }
    let total: u64 = all.iter().map(|(_, n)| n).sum();
    if total == 0 {
        return false;
    }
    counts.iter().any(|shard| {
        let rows: u64 = shard.iter().map(|(_, n)| n).sum();
        if rows == 0 {
            return false;
        }
        let share = |class: f64| {
            let n = shard
                .iter()
                .find(|(c, _)| *c == class)
                .map_or(0, |(_, n)| *n);
            n as f64 / rows as f64
        };
        let distance: f64 = all
            .iter()
            .map(|&(class, n)| (share(class) - n as f64 / total as f64).abs())
            .sum::<f64>()
            / 2.0;
        distance > LIKE_SHARES
    })
}

/// The coordinator's controls of every shard, in shard order.
#[derive(Clone, Debug)]
pub struct Controls {
    /// Each shard's last control and the tuples of its round (None: it trained none yet).
    shards: Vec<Option<(Vec<f64>, u64)>>,
}

impl Controls {
    pub fn new(shards: usize) -> Controls {
        Controls {
            shards: vec![None; shards],
        }
    }

    /// Each shard's correction for the next round: the controls' mean weighted by tuples
    /// minus its own; empty for a shard without a control yet (its steps go uncorrected).
    /// None if one is not finite (controls near f64's limit: the training diverged).
    pub fn corrections(&self) -> Option<Vec<Vec<f64>>> {
        let total: f64 = self.shards.iter().flatten().map(|(_, t)| *t as f64).sum();
        let mut mean: Vec<f64> = Vec::new();
        for (control, tuples) in self.shards.iter().flatten() {
            let w = *tuples as f64 / total;
            mean.resize(control.len(), 0.0);
            mean.iter_mut().zip(control).for_each(|(m, c)| *m += w * c);
        }
        let corrections: Vec<Vec<f64>> = self
            .shards
            .iter()
            .map(|own| match own {
                Some((own, _)) => mean.iter().zip(own).map(|(m, c)| m - c).collect(),
                None => Vec::new(),
            })
            .collect();
        corrections
            .iter()
            .flatten()
            .all(|c| c.is_finite())
            .then_some(corrections)
    }

    /// Shard `k`'s control after a round of `tuples` tuples (a round without tuples keeps
    /// its last one).
    pub fn set(&mut self, k: usize, control: Vec<f64>, tuples: u64) {
        if tuples > 0 {
            self.shards[k] = Some((control, tuples));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_shard_is_corrected_towards_the_mean_weighted_by_tuples() {
        let mut c = Controls::new(3);
        assert_eq!(c.corrections(), Some(vec![Vec::<f64>::new(); 3]));
        c.set(0, vec![1.0, 0.0], 300);
        c.set(1, vec![-1.0, 4.0], 100);
        // A round without tuples changes nothing.
        c.set(1, vec![9.0, 9.0], 0);
        // Mean: (300·[1, 0] + 100·[-1, 4]) / 400 = [0.5, 1].
        let corrections = c.corrections().unwrap();
        assert_eq!(corrections[0], vec![-0.5, 1.0]);
        assert_eq!(corrections[1], vec![1.5, -3.0]);
        // The third shard has trained nothing yet: no correction.
        assert!(corrections[2].is_empty());
        // Weighted by tuples, the corrections cancel: the shards' mean step is unchanged.
        let sum: Vec<f64> = (0..2)
            .map(|i| 300.0 * corrections[0][i] + 100.0 * corrections[1][i])
            .collect();
        assert_eq!(sum, vec![0.0, 0.0]);
    }

    #[test]
    fn controls_beyond_f64_are_no_correction() {
        let mut c = Controls::new(2);
        c.set(0, vec![f64::MAX], 1);
        c.set(1, vec![-f64::MAX], 1);
        // The mean 0, the corrections ∓MAX: finite.
        assert!(c.corrections().is_some());
        c.set(1, vec![f64::MAX], 1);
        c.set(0, vec![-f64::MAX], 3);
        // The mean -MAX/2, the second shard's correction -1.5 MAX: not.
        assert_eq!(c.corrections(), None);
    }

    #[test]
    fn shards_of_unlike_class_shares_are_corrected() {
        // Hashed rows: shares within a few thousandths.
        let hashed = [
            vec![(0.0, 4_980), (1.0, 5_020)],
            vec![(0.0, 5_030), (1.0, 4_970)],
        ];
        assert!(!unlike_shards(&hashed));
        // One class per shard (a class missing from a shard's list counts 0).
        assert!(unlike_shards(&[vec![(0.0, 5_000)], vec![(1.0, 5_000)]]));
        // 70/30 against 30/70: 0.2 from every row's 50/50.
        assert!(unlike_shards(&[
            vec![(0.0, 70), (1.0, 30)],
            vec![(0.0, 30), (1.0, 70)]
        ]));
        // A regression (no classes) or no rows: never.
        assert!(!unlike_shards(&[vec![], vec![]]));
        assert!(!unlike_shards(&[]));
    }
}
