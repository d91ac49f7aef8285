//! Unit tests of the trainer's internals (lazy regularization, scaled weights, schedules).

use super::regularization::{clip, pending_reg, MIN_SCALE};
use super::*;
use crate::model::ModelKind;

#[test]
fn pending_reg_matches_repeated_steps() {
    for &(w, s, c) in &[
        (1.5, 0.99, 0.0),
        (-2.0, 0.97, 0.0),
        (3.0, 1.0, 0.01),
        (-3.0, 0.995, 0.004),
        (0.5, 0.9, 0.2),
        (1e-3, 1.0, 0.0),
    ] {
        for k in [0u64, 1, 5, 16, 17, 40, 200, 1000] {
            let mut eager: f64 = w;
            for _ in 0..k {
                eager = clip(eager * s, c);
            }
            let lazy = pending_reg(w, k, s, c);
            assert!(
                (lazy - eager).abs() <= 1e-12 * (1.0 + eager.abs()),
                "w={w} s={s} c={c} k={k}: {lazy} vs {eager}"
            );
            if k <= 16 {
                assert_eq!(lazy.to_bits(), eager.to_bits());
            }
        }
    }
}

/// Sparse rows over `d` features, ~`nnz` non-zeros each, labels from a fixed hyperplane.
fn sparse_rows(n: usize, d: u32, nnz: u32, seed: u64) -> TupleArena {
    let mut s = seed;
    let mut next = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) as u32
    };
    let mut arena = TupleArena::new_sparse(n, n * nnz as usize);
    for _ in 0..n {
        let mut indices: Vec<u32> = (0..nnz).map(|_| next() % d).collect();
        indices.sort_unstable();
        indices.dedup();
        let values: Vec<f64> = indices.iter().map(|_| next() as f64 / 2e9 - 1.0).collect();
        let z: f64 = indices
            .iter()
            .zip(&values)
            .map(|(&j, v)| (j % 7) as f64 * v - 1.5 * v)
            .sum();
        arena.push_sparse(if z > 0.0 { 1.0 } else { 0.0 }, &indices, &values);
    }
    arena
}

#[test]
fn scaled_weights_equal_per_coordinate_catch_up() {
    // Many steps, several epochs (a new lr each) and lr·l2 large enough that the scale is
    // folded into the weights within an epoch: the scale trick must track the lazy
    // per-coordinate path, which is forced on the second trainer (coordinates miss ~17
    // steps between uses: both the stepwise and the closed-form catch-up run).
    let (n, d) = (6000, 200);
    let arena = sparse_rows(n, d, 12, 7);
    for kind in [ModelKind::Svm, ModelKind::Logistic, ModelKind::Linear] {
        let mut config = TrainConfig::new(kind);
        config.learning_rate = 0.2;
        config.l2 = 0.2;
        assert!(
            (1.0 - 0.2 * 0.2f64).powi(n as i32) < MIN_SCALE,
            "no fold would happen"
        );
        let mut scaled = Trainer::new(config.clone(), 0);
        let mut per_coordinate = Trainer::new(config, 0);
        assert!(scaled.scaled_weights);
        per_coordinate.scaled_weights = false;
        for epoch in 1..=3 {
            for t in [&mut scaled, &mut per_coordinate] {
                t.start_epoch(epoch);
                t.train_buffer(&arena, None).unwrap();
            }
            let (a, b) = (
                scaled.finish_epoch().unwrap(),
                per_coordinate.finish_epoch().unwrap(),
            );
            assert!(
                (a.loss - b.loss).abs() <= 1e-9 * (1.0 + b.loss.abs()),
                "{kind:?} {a:?} {b:?}"
            );
            assert_eq!(a.accuracy, b.accuracy, "{kind:?}");
        }
        let (a, b) = (scaled.into_model(), per_coordinate.into_model());
        let scale = b.weights.iter().fold(0.0f64, |m, w| m.max(w.abs()));
        assert!(scale > 1e-3, "{kind:?}: the model learned something");
        for (x, y) in a
            .weights
            .iter()
            .chain(&a.bias)
            .zip(b.weights.iter().chain(&b.bias))
        {
            assert!((x - y).abs() <= 1e-9 * scale, "{kind:?}: {x} vs {y}");
        }
    }
}

#[test]
fn schedules() {
    let e = LrSchedule::Exponential { decay: 0.5 };
    assert_eq!(e.learning_rate(0.8, 1), 0.8);
    assert_eq!(e.learning_rate(0.8, 3), 0.2);
    assert_eq!(LrSchedule::Constant.learning_rate(0.8, 7), 0.8);
    assert_eq!(LrSchedule::InverseSqrt.learning_rate(0.8, 1), 0.8);
    assert_eq!(LrSchedule::InverseSqrt.learning_rate(0.8, 4), 0.4);
    assert!((LrSchedule::InverseSqrt.learning_rate(1.0, 2) - 0.5f64.sqrt()).abs() < 1e-15);
    for name in LrSchedule::NAMES {
        assert!([LrSchedule::Constant, e, LrSchedule::InverseSqrt]
            .iter()
            .any(|s| s.name() == name));
    }
}

/// Averaging: the result is the mean of the iterates sampled at the ends of epochs (and every
/// `every` steps inside them), from the averaging epoch on; a model that grows while averaging
/// counts its new coordinates as 0 before they existed.
#[test]
fn averaged_model_is_the_mean_of_sampled_iterates() {
    let rows = sparse_rows(40, 30, 4, 7); // 40 steps per epoch: fewer than MIN_EVERY
    let mut config = TrainConfig::new(ModelKind::Svm);
    config.learning_rate = 0.1;
    config.average_from_epoch = Some(2);
    let mut averaged = Trainer::new(config.clone(), 0);
    let mut plain = Trainer::new(
        TrainConfig {
            average_from_epoch: None,
            ..config
        },
        0,
    );
    let mut ends: Vec<LinearModel> = Vec::new();
    for epoch in 1..=4 {
        for t in [&mut averaged, &mut plain] {
            t.start_epoch(epoch);
            t.train_buffer(&rows, None).unwrap();
            t.finish_epoch().unwrap();
        }
        if epoch >= 2 {
            ends.push(plain.model().clone());
        }
    }
    let result = averaged.into_model();
    let d = result.n_features;
    for j in 0..d {
        let mean = ends
            .iter()
            .map(|m| m.weights.get(j).copied().unwrap_or(0.0))
            .sum::<f64>()
            / 3.0;
        assert!((result.weights[j] - mean).abs() < 1e-12, "weight {j}");
    }
    let bias = ends.iter().map(|m| m.bias[0]).sum::<f64>() / 3.0;
    assert!((result.bias[0] - bias).abs() < 1e-12);
    assert_ne!(
        result.weights,
        plain.model().weights,
        "averaging changes the result"
    );

    // Growth after sampling started: wider rows later; the copy and in-place paths agree.
    let mut config = TrainConfig::new(ModelKind::Logistic);
    config.average_from_epoch = Some(1);
    let mut t = Trainer::new(config, 0);
    t.start_epoch(1);
    t.train_buffer(&sparse_rows(100, 10, 3, 1), None).unwrap();
    t.finish_epoch().unwrap();
    t.start_epoch(2);
    t.train_buffer(&sparse_rows(100, 50, 3, 2), None).unwrap();
    t.finish_epoch().unwrap();
    let copy = t.result_model().unwrap();
    assert_eq!(copy.n_features, 50);
    assert_eq!(t.into_model().weights, copy.weights);
}

/// Dense rows around ±(1, 1) with labels `neg`/`pos`; `only` keeps one class.
fn blobs(n: usize, neg: f64, pos: f64, only: Option<bool>, seed: u64) -> TupleArena {
    let mut s = seed;
    let mut noise = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 11) as f64 / (1u64 << 53) as f64 - 0.5
    };
    let mut arena = TupleArena::new(2, n);
    for i in 0..n {
        let positive = only.unwrap_or(i % 2 == 0);
        let c = if positive { 1.0 } else { -1.0 };
        arena.push(
            if positive { pos } else { neg },
            &[c + noise(), c + noise()],
        );
    }
    arena
}

fn accuracy(model: &LinearModel, arena: &TupleArena, pos: f64) -> f64 {
    let correct = (0..arena.len())
        .filter(|&i| (model.output(0, arena.row(i)) > 0.0) == (arena.label(i) == pos))
        .count();
    correct as f64 / arena.len() as f64
}

static GATE: Gate = Gate::new();

/// Memory for a shared model, 8-byte aligned.
fn shared_memory(n_values: usize) -> Vec<u64> {
    vec![0u64; SharedModel::bytes(n_values).div_ceil(8)]
}

#[test]
fn exchanging_trainers_learn_what_neither_share_holds_alone() {
    // Each process holds one class only (a label-clustered table split in two): alone, each
    // learns a constant; exchanging every 1024 tuples they learn the boundary.
    let (a_rows, b_rows) = (
        blobs(20_000, 1.0, 2.0, Some(false), 1),
        blobs(20_000, 1.0, 2.0, Some(true), 2),
    );
    let mut memory = shared_memory(3);
    GATE.open();
    let mut config = TrainConfig::new(ModelKind::Svm);
    config.average_from_epoch = Some(2);
    // SAFETY: `memory` is aligned, big enough and outlives both trainers.
    let (sa, sb) = unsafe {
        let at = memory.as_mut_ptr().cast::<u8>();
        let sa = SharedModel::create(at, 3, &GATE);
        (sa, SharedModel::attach(at, 3, &GATE).expect("same shape"))
    };
    let mut a = Trainer::new(config.clone(), 2);
    let mut b = Trainer::new(config.clone(), 2);
    a.set_exchange(sa, 1024);
    b.set_exchange(sb, 1024);
    for epoch in 1..=3 {
        a.start_epoch(epoch);
        b.start_epoch(epoch);
        // Interleave the two shares in chunks, as two processes would.
        for chunk in 0..20 {
            let part = |arena: &TupleArena| {
                let mut p = TupleArena::new(2, 1000);
                for i in chunk * 1000..(chunk + 1) * 1000 {
                    if let Row::Dense(x) = arena.row(i) {
                        p.push(arena.label(i), x);
                    }
                }
                p
            };
            a.train_buffer(&part(&a_rows), None).unwrap();
            b.train_buffer(&part(&b_rows), None).unwrap();
        }
        a.finish_epoch().unwrap();
        b.finish_epoch().unwrap();
    }
    // The trainer that saw only label 1 adopted the pair from the shared model.
    a.exchange().unwrap();
    assert_eq!(a.label_map(), Some((1.0, 2.0)));
    // The result averages both processes' iterates.
    b.contribute_average().unwrap();
    a.contribute_average().unwrap();
    a.adopt_shared_average();
    let both = blobs(2_000, 1.0, 2.0, None, 3);
    let model = a.into_model();
    assert!(
        accuracy(&model, &both, 2.0) > 0.95,
        "{}",
        accuracy(&model, &both, 2.0)
    );

    // Alone, the same share learns nothing of the other class.
    let mut alone = Trainer::new(config, 2);
    alone.train_buffer(&a_rows, None).unwrap();
    alone.finish_epoch().unwrap();
    assert!(accuracy(&alone.into_model(), &both, 2.0) <= 0.5);
}

#[test]
fn exchanging_trainers_with_different_label_pairs_fail() {
    let mut memory = shared_memory(3);
    GATE.open();
    // SAFETY: as above.
    let (sa, sb) = unsafe {
        let at = memory.as_mut_ptr().cast::<u8>();
        let sa = SharedModel::create(at, 3, &GATE);
        (sa, SharedModel::attach(at, 3, &GATE).expect("same shape"))
    };
    let config = TrainConfig::new(ModelKind::Logistic);
    let mut a = Trainer::new(config.clone(), 2);
    let mut b = Trainer::new(config, 2);
    a.set_exchange(sa, 1024);
    b.set_exchange(sb, 1024);
    a.train_buffer(&blobs(100, 0.0, 1.0, None, 4), None)
        .unwrap();
    a.finish_epoch().unwrap();
    b.train_buffer(&blobs(100, 0.0, 5.0, None, 5), None)
        .unwrap();
    match b.finish_epoch() {
        Err(TrainError::TooManyLabels { values }) => assert_eq!(values, [0.0, 1.0, 5.0]),
        other => panic!("expected TooManyLabels, got {other:?}"),
    }
}

#[test]
fn rows_scaled_as_pushed_train_the_same_model_bit_for_bit() {
    // A sparse arena scaled in place (TupleArena::scale_values, as the backend does) gives
    // the model that SGD scaling the same rows with the standardizer gives, bit for bit, over
    // more features than the weights prefetch threshold; with a scale shorter than the rows'
    // dimension (features beyond it keep their values).
    let (n, d) = (3000, (PREFETCH_WEIGHTS_MIN * 2) as u32);
    let raw = sparse_rows(n, d, 12, 11);
    for scale_len in [d as usize, d as usize / 2] {
        let scale: Vec<f64> = (0..scale_len)
            .map(|j| 1.0 / (1.0 + (j % 13) as f64))
            .collect();
        let standardizer = Standardizer {
            mean: vec![0.0; scale_len],
            scale: scale.clone(),
            center: false,
        };
        let mut prescaled = raw.clone();
        prescaled.scale_values(&scale);
        assert_eq!(prescaled.scaled_rows(), n);
        let mut config = TrainConfig::new(ModelKind::Logistic);
        config.standardizer = Some(standardizer);
        let (mut by_sgd, mut by_push) = (Trainer::new(config.clone(), 0), Trainer::new(config, 0));
        let order: Vec<u32> = (0..n as u32).rev().collect();
        for epoch in 1..=2 {
            for (t, arena) in [(&mut by_sgd, &raw), (&mut by_push, &prescaled)] {
                t.start_epoch(epoch);
                t.train_buffer(arena, Some(&order)).unwrap();
                t.finish_epoch().unwrap();
            }
        }
        let (a, b) = (by_sgd.into_model(), by_push.into_model());
        assert!(a.weights.iter().any(|&w| w != 0.0));
        assert_eq!(a.weights, b.weights, "scale length {scale_len}");
        assert_eq!(a.bias, b.bias);
    }
}

#[test]
#[should_panic(expected = "an arena of scaled and unscaled rows")]
fn an_arena_of_scaled_and_unscaled_rows_is_not_trained_on() {
    let mut arena = TupleArena::new_sparse(0, 0);
    arena.push_sparse(1.0, &[0, 3], &[1.0, 2.0]);
    arena.scale_values(&[0.5; 4]);
    arena.push_sparse(0.0, &[1], &[4.0]);
    let mut config = TrainConfig::new(ModelKind::Logistic);
    config.standardizer = Some(Standardizer {
        mean: vec![0.0; 4],
        scale: vec![0.5; 4],
        center: false,
    });
    let mut t = Trainer::new(config, 0);
    t.start_epoch(1);
    let _ = t.train_buffer(&arena, None);
}

#[test]
fn train_error_texts_are_pinned() {
    use crate::model::ModelKind;
    let texts = [
        (
            TrainError::TooManyLabels {
                values: [0.0, 1.0, 2.0],
            },
            "label column has more than two distinct values (found 0, 1 and 2)",
        ),
        (
            TrainError::TooManyLabels {
                values: [0.0, 1.0, f64::NAN],
            },
            "label value NaN is not a valid class label",
        ),
        (
            TrainError::InvalidLabel {
                value: f64::INFINITY,
                kind: ModelKind::Linear,
            },
            "label value inf is not a finite number",
        ),
        (
            TrainError::InvalidLabel {
                value: -1.0,
                kind: ModelKind::Softmax,
            },
            "label value -1 is not a class index from 0 to 65535",
        ),
        (
            TrainError::Diverged { epoch: 3 },
            "training diverged in epoch 3: loss or weights became NaN or infinite, or the loss more than 1000 times a zero model's",
        ),
        (
            TrainError::OutOfMemory { bytes: 80 },
            "out of memory growing the model by 80 bytes",
        ),
        (TrainError::Interrupted, "training interrupted"),
    ];
    for (e, text) in texts {
        assert_eq!(e.to_string(), text);
    }
}
