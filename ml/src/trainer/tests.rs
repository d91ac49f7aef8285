//! Unit tests of the trainer's internals (lazy regularization, scaled weights, schedules).

use super::regularization::{clip, pending_reg, MIN_SCALE};
use super::*;

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
