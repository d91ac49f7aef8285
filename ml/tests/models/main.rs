//! New model kinds (linear, softmax), sparse rows with lazy regularization,
//! optimization options, standardization and their interplay.
//!
//! Here the datasets and training helpers; the tests in `sparse` (lazy regularization, sparse
//! cost), `kinds` (softmax, linear, class weights, schedules, divergence) and `standardized`
//! (training on standardized features folded back to the table's units).

#[path = "../common/mod.rs"]
mod common;

mod kinds;
mod sparse;
mod standardized;

use corgipile_ml::arena::TupleArena;
use corgipile_ml::model::{Labels, LinearModel, ModelKind};
use corgipile_ml::row::Row;
use corgipile_ml::stats::{balanced_class_weights, FeatureStats};
use corgipile_ml::trainer::{EpochStats, LrSchedule, TrainConfig, TrainError, Trainer};
use corgipile_ml::TupleShuffler;

/// The kinds whose model is a [`LinearModel`] (the linear family's).
fn linear_kind(kind: ModelKind) -> bool {
    use corgipile_ml::learner::Family;
    kind.family().noun() == corgipile_ml::learner::LinearFamily.noun()
}
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

type Data = Vec<(f64, Vec<f64>)>;

fn uniform(rng: &mut ChaCha8Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// `n` rows of `d` features, each non-zero with probability `density`, and a
/// label for `kind` from fixed hyperplanes: ±1 (binary), a real (linear) or a
/// class index in 0..3 (softmax). Some label noise keeps gradients alive.
fn dataset(kind: ModelKind, n: usize, d: usize, density: f64, seed: u64) -> Data {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let x: Vec<f64> = (0..d)
                .map(|_| {
                    if uniform(&mut rng) < density {
                        uniform(&mut rng) * 4.0 - 2.0
                    } else {
                        0.0
                    }
                })
                .collect();
            let z = |k: usize| -> f64 {
                x.iter()
                    .enumerate()
                    .map(|(j, v)| v * (((j * 7 + k * 3) % 5) as f64 - 2.0) * 0.5)
                    .sum::<f64>()
            };
            let noise = uniform(&mut rng) < 0.1;
            let y = match kind.labels() {
                Labels::TwoClasses => {
                    let y = if z(0) + 0.2 >= 0.0 { 1.0 } else { -1.0 };
                    if noise {
                        -y
                    } else {
                        y
                    }
                }
                Labels::Number => z(0) + 0.5 + (uniform(&mut rng) - 0.5) * 0.1,
                Labels::Classes => {
                    let s = [z(0), z(1), z(2)];
                    let best = (0..3).max_by(|&a, &b| s[a].total_cmp(&s[b])).unwrap();
                    if noise {
                        ((best + 1) % 3) as f64
                    } else {
                        best as f64
                    }
                }
            };
            (y, x)
        })
        .collect()
}

fn dense_arena(data: &[(f64, Vec<f64>)], d: usize) -> TupleArena {
    let mut a = TupleArena::new(d, data.len());
    for (y, x) in data {
        a.push(*y, x);
    }
    a
}

fn sparse_arena(data: &[(f64, Vec<f64>)]) -> TupleArena {
    let mut a = TupleArena::new_sparse(data.len(), 0);
    let (mut idx, mut val) = (Vec::new(), Vec::new());
    for (y, x) in data {
        idx.clear();
        val.clear();
        for (j, &v) in x.iter().enumerate() {
            if v != 0.0 {
                idx.push(j as u32);
                val.push(v);
            }
        }
        a.push_sparse(*y, &idx, &val);
    }
    a
}

fn config(kind: ModelKind, lr: f64, l2: f64, l1: f64, batch: usize) -> TrainConfig {
    TrainConfig {
        learning_rate: lr,
        schedule: LrSchedule::Exponential { decay: 0.8 },
        l2,
        l1,
        batch_size: batch,
        ..TrainConfig::new(kind)
    }
}

fn train(
    config: TrainConfig,
    d: usize,
    buffers: &[TupleArena],
    epochs: u32,
) -> (LinearModel, Vec<EpochStats>) {
    let (t, stats) = common::run(config, d, buffers, epochs);
    (t.into_model(), stats)
}

fn assert_models_close(a: &LinearModel, b: &LinearModel, tol: f64, ctx: &str) {
    assert_eq!(
        (a.n_features, a.n_outputs, a.weights.len()),
        (b.n_features, b.n_outputs, b.weights.len()),
        "{ctx}"
    );
    let scale = 1.0 + a.weights.iter().fold(0.0f64, |m, w| m.max(w.abs()));
    for (i, (x, y)) in a.weights.iter().zip(&b.weights).enumerate() {
        assert!((x - y).abs() <= tol * scale, "{ctx}: w[{i}] {x} vs {y}");
    }
    for (x, y) in a.bias.iter().zip(&b.bias) {
        assert!((x - y).abs() <= tol * scale, "{ctx}: bias {x} vs {y}");
    }
}
