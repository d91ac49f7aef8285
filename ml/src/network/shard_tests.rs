//! Two shards that each hold one class, a network combined by the mean of their changes
//! every round (as `shard::training` does): with controls it scores as one process on all
//! rows does.

use super::{Activation, Network, NetworkModel, NetworkTrainer, Optimizer, OptimizerKind, Target};
use crate::arena::TupleArena;
use crate::model::{Head, ModelKind};
use crate::row::Row;
use crate::trainer::Controls;
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
            let corrections = controls.corrections().unwrap();
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
                let share = &rows[round * rows.len() / rounds..(round + 1) * rows.len() / rounds];
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
