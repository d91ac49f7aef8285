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
    pub fn corrections(&self) -> Vec<Vec<f64>> {
        let mut mean: Vec<f64> = Vec::new();
        let mut total = 0.0;
        for (control, tuples) in self.shards.iter().flatten() {
            let t = *tuples as f64;
            mean.resize(control.len(), 0.0);
            mean.iter_mut().zip(control).for_each(|(m, c)| *m += t * c);
            total += t;
        }
        mean.iter_mut().for_each(|m| *m /= total);
        self.shards
            .iter()
            .map(|own| match own {
                Some((own, _)) => mean.iter().zip(own).map(|(m, c)| m - c).collect(),
                None => Vec::new(),
            })
            .collect()
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
        assert_eq!(c.corrections(), vec![Vec::<f64>::new(); 3]);
        c.set(0, vec![1.0, 0.0], 300);
        c.set(1, vec![-1.0, 4.0], 100);
        // A round without tuples changes nothing.
        c.set(1, vec![9.0, 9.0], 0);
        // Mean: (300·[1, 0] + 100·[-1, 4]) / 400 = [0.5, 1].
        let corrections = c.corrections();
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
}

#[cfg(test)]
mod shards {
    //! Two shards that each hold one class, a network combined by the mean of their changes
    //! every round (as `shard::training` does): with controls it scores as one process on all
    //! rows does.
    use super::Controls;
    use crate::arena::TupleArena;
    use crate::model::{Head, ModelKind};
    use crate::network::{Activation, Network, NetworkModel, NetworkTrainer, OptimizerKind};
    use crate::network::{Optimizer, Target};
    use crate::row::Row;
    use rand_chacha::ChaCha8Rng;
    use rand_core::{RngCore, SeedableRng};

    const SIZES: [usize; 3] = [8, 16, 2];

    /// Two overlapping classes (as bench/shard_quality.py's binary rows): feature j is
    /// ±(0.15 + 0.05 j) plus noise near N(0, 1).
    fn rows(n: usize, seed: u64) -> Vec<(f64, Vec<f64>)> {
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        let mut unit = move || (r.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        (0..n)
            .map(|i| {
                let s = if i % 2 == 0 { -1.0 } else { 1.0 };
                let x = (0..8)
                    .map(|j| s * (0.15 + 0.05 * j as f64) + (unit() + unit() + unit() - 1.5) * 2.0)
                    .collect();
                (f64::from(s > 0.0), x)
            })
            .collect()
    }

    fn arena(rows: &[&(f64, Vec<f64>)]) -> TupleArena {
        let mut a = TupleArena::new(8, rows.len());
        rows.iter().for_each(|(y, x)| a.push(*y, x));
        a
    }

    fn trainer() -> NetworkTrainer {
        let net = Network::new(&SIZES, Activation::Relu, Head::SOFTMAX, 3).unwrap();
        let target = Target::new(0.0, 1.0);
        NetworkTrainer::try_new(net, OptimizerKind::Adam, 0.001, 0.0, 32, target).unwrap()
    }

    fn accuracy(params: &[f64], test: &[(f64, Vec<f64>)]) -> f64 {
        let mut net = Network::new(&SIZES, Activation::Relu, Head::SOFTMAX, 3).unwrap();
        net.params.copy_from_slice(params);
        let model = NetworkModel::new(ModelKind::Mlp, net);
        let right = test
            .iter()
            .filter(|(y, x)| model.predict(Row::Dense(x)) == *y);
        right.count() as f64 / test.len() as f64
    }

    /// `epochs` over every row in one process (rows alternate classes: well mixed).
    fn one_process(data: &[(f64, Vec<f64>)], epochs: u32) -> Vec<f64> {
        let mut t = trainer();
        for epoch in 1..=epochs {
            t.start_epoch(epoch);
            t.train_buffer(&arena(&data.iter().collect::<Vec<_>>()), None)
                .unwrap();
        }
        t.into_network().params
    }

    /// `epochs` of `rounds` rounds on two shards of one class each, with or without controls.
    fn sharded(data: &[(f64, Vec<f64>)], epochs: u32, rounds: usize, controlled: bool) -> Vec<f64> {
        let shards: Vec<Vec<_>> = (0..2)
            .map(|c| data.iter().filter(|(y, _)| *y == c as f64).collect())
            .collect();
        let mut params = trainer().network().params.clone();
        let mut kept: Vec<Option<Optimizer>> = vec![None, None];
        let mut controls = Controls::new(2);
        for epoch in 1..=epochs {
            for round in 0..rounds {
                let corrections = controls.corrections();
                let mut mean = params.clone();
                for (k, rows) in shards.iter().enumerate() {
                    let mut t = trainer();
                    t.set_parameters(&params);
                    if let Some(o) = kept[k].take() {
                        assert!(t.resume_optimizer(o));
                    }
                    if controlled {
                        assert!(t.start_control(corrections[k].clone()).unwrap());
                    }
                    t.start_epoch(epoch);
                    let share =
                        &rows[round * rows.len() / rounds..(round + 1) * rows.len() / rounds];
                    t.train_buffer(&arena(share), None).unwrap();
                    let moved = t.network().params.clone();
                    for ((m, x), p) in mean.iter_mut().zip(&moved).zip(&params) {
                        *m += (x - p) / 2.0;
                    }
                    let mut o = t.into_optimizer();
                    if let Some(control) = o.take_control() {
                        controls.set(k, control, share.len() as u64);
                    }
                    kept[k] = Some(o);
                }
                params = mean;
            }
        }
        params
    }

    #[test]
    fn controls_bring_shards_of_one_class_each_to_one_process() {
        let (data, test) = (rows(20_000, 1), rows(10_000, 2));
        let one = accuracy(&one_process(&data, 3), &test);
        let plain = accuracy(&sharded(&data, 3, 16, false), &test);
        let controlled = accuracy(&sharded(&data, 3, 16, true), &test);
        // Measured: 0.8305 in one process, 0.7870 sharded, 0.8268 with controls.
        assert!(
            plain < one - 0.02,
            "the shards drift apart: {plain} vs {one}"
        );
        assert!(controlled > one - 0.01, "{controlled} vs {one}");
    }
}
