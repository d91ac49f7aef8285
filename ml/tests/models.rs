//! New model kinds (linear, softmax), sparse rows with lazy regularization,
//! optimization options, standardization and their interplay.

mod common;

use corgipile_ml::arena::TupleArena;
use corgipile_ml::model::{LinearModel, ModelKind};
use corgipile_ml::row::Row;
use corgipile_ml::stats::{balanced_class_weights, FeatureStats};
use corgipile_ml::trainer::{EpochStats, LrSchedule, TrainConfig, TrainError, Trainer};
use corgipile_ml::TupleShuffler;
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
            let y = match kind {
                ModelKind::Svm | ModelKind::Logistic => {
                    let y = if z(0) + 0.2 >= 0.0 { 1.0 } else { -1.0 };
                    if noise {
                        -y
                    } else {
                        y
                    }
                }
                ModelKind::Linear => z(0) + 0.5 + (uniform(&mut rng) - 0.5) * 0.1,
                ModelKind::Softmax => {
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

#[test]
fn lazy_sparse_regularization_equals_eager_dense() {
    let d = 30;
    for kind in ModelKind::ALL {
        let data = dataset(kind, 120, d, 0.15, 11);
        // Splits that put mini-batches across buffer boundaries.
        let cuts = [0, 7, 50, 51, 120];
        let dense: Vec<TupleArena> = cuts
            .windows(2)
            .map(|w| dense_arena(&data[w[0]..w[1]], d))
            .collect();
        let sparse: Vec<TupleArena> = cuts
            .windows(2)
            .map(|w| sparse_arena(&data[w[0]..w[1]]))
            .collect();
        for &(l2, l1) in &[(0.0, 0.0), (0.05, 0.0), (0.0, 0.01), (0.03, 0.005)] {
            for &batch in &[1usize, 3, 16] {
                let c = config(kind, 0.05, l2, l1, batch);
                let (md, sd) = train(c.clone(), d, &dense, 4);
                // Sparse model starts empty and grows with the indices.
                let (ms, ss) = train(c, 0, &sparse, 4);
                let ctx = format!("{kind:?} l2={l2} l1={l1} batch={batch}");
                assert_models_close(&md, &ms, 1e-12, &ctx);
                for (a, b) in sd.iter().zip(&ss) {
                    assert!((a.loss - b.loss).abs() < 1e-12 * (1.0 + a.loss), "{ctx}");
                    assert_eq!((a.accuracy, a.tuples), (b.accuracy, b.tuples), "{ctx}");
                    assert_eq!(a.learning_rate, b.learning_rate);
                    assert_eq!(a.r2.is_some(), b.r2.is_some());
                }
            }
        }
    }
}

#[test]
fn scaled_l2_folds_its_scale_before_it_underflows() {
    // Sparse rows, L2 only, batch 1: the trainer keeps w = scale·v. With lr·l2 = 0.5 the scale
    // halves every step and is folded into the weights every ~330 steps; the model must still
    // equal eager dense training.
    let d = 12;
    for kind in [ModelKind::Svm, ModelKind::Logistic, ModelKind::Linear] {
        let data = dataset(kind, 1500, d, 0.3, 5);
        let c = config(kind, 0.5, 1.0, 0.0, 1);
        let (md, sd) = train(c.clone(), d, &[dense_arena(&data, d)], 3);
        let (ms, ss) = train(c, 0, &[sparse_arena(&data)], 3);
        assert_models_close(&md, &ms, 1e-12, &format!("{kind:?}"));
        for (a, b) in sd.iter().zip(&ss) {
            assert!((a.loss - b.loss).abs() < 1e-12 * (1.0 + a.loss), "{kind:?}");
        }
    }
}

#[test]
fn l1_gives_exact_zeros() {
    // Only features 0 and 1 carry the label; L1 zeroes the 18 noise features.
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let data: Data = (0..300)
        .map(|_| {
            let x: Vec<f64> = (0..20)
                .map(|_| {
                    if uniform(&mut rng) < 0.3 {
                        uniform(&mut rng) * 2.0 - 1.0
                    } else {
                        0.0
                    }
                })
                .collect();
            (if x[0] - x[1] >= 0.0 { 1.0 } else { -1.0 }, x)
        })
        .collect();
    let c = config(ModelKind::Logistic, 0.1, 0.0, 0.05, 1);
    let (ms, _) = train(c.clone(), 0, &[sparse_arena(&data)], 5);
    let (md, _) = train(c, 20, &[dense_arena(&data, 20)], 5);
    assert_models_close(&md, &ms, 1e-12, "l1");
    assert!(
        ms.weights[0] > 0.1 && ms.weights[1] < -0.1,
        "{:?}",
        ms.weights
    );
    let zeros = ms.weights.iter().filter(|&&w| w == 0.0).count();
    assert!(zeros >= 5, "{zeros} zeros: {:?}", ms.weights);
}

#[test]
fn lazy_catch_up_spans_many_steps() {
    // A feature seen at the start and the end only: its decay over ~400
    // missed steps is applied in closed form (and L1 clips it to zero).
    let d = 5;
    let mut data: Data = vec![(1.0, vec![2.0, 0.0, 0.0, 0.0, 1.0])];
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for _ in 0..400 {
        let v = uniform(&mut rng) - 0.5;
        data.push((
            if v > 0.0 { 1.0 } else { -1.0 },
            vec![0.0, v, 0.0, 1.0, 0.0],
        ));
    }
    data.push((-1.0, vec![1.0, 0.0, 0.5, 0.0, 0.0]));
    for &(l2, l1) in &[(0.001, 0.0), (0.001, 0.0001), (0.0, 0.00002)] {
        for &batch in &[1usize, 4] {
            let c = config(ModelKind::Logistic, 0.1, l2, l1, batch);
            let (md, _) = train(c.clone(), d, &[dense_arena(&data, d)], 3);
            let (ms, _) = train(c, d, &[sparse_arena(&data)], 3);
            assert_models_close(&md, &ms, 1e-12, &format!("l2={l2} l1={l1} b={batch}"));
        }
    }
}

#[test]
fn sparse_model_reads_are_up_to_date_mid_epoch() {
    let data = dataset(ModelKind::Logistic, 40, 10, 0.3, 3);
    let c = config(ModelKind::Logistic, 0.1, 0.02, 0.001, 1);
    let mut dt = Trainer::new(c.clone(), 10);
    let mut st = Trainer::new(c, 10);
    dt.train_buffer(&dense_arena(&data, 10), None).unwrap();
    st.train_buffer(&sparse_arena(&data), None).unwrap();
    let (a, b) = (dt.model().clone(), st.model().clone());
    assert_models_close(&a, &b, 1e-12, "mid-epoch");
    // Reading does not disturb training.
    st.train_buffer(&sparse_arena(&data), None).unwrap();
    dt.train_buffer(&dense_arena(&data, 10), None).unwrap();
    assert_models_close(&dt.into_model(), &st.into_model(), 1e-12, "after read");
}

#[test]
fn sparse_cost_does_not_depend_on_the_dimension() {
    // The same 40 non-zeros per row: dense 40-dim vs sparse 1,000,000-dim.
    let (d_small, d_big, n, epochs) = (40usize, 1_000_000usize, 2000, 2u32);
    let stride = (d_big / d_small) as u32;
    let data = dataset(ModelKind::Logistic, n, d_small, 1.0, 21);
    let dense = dense_arena(&data, d_small);
    let mut sparse = TupleArena::new_sparse(n, n * d_small);
    let idx: Vec<u32> = (0..d_small as u32).map(|j| j * stride).collect();
    for (y, x) in &data {
        sparse.push_sparse(*y, &idx, x);
    }
    for &batch in &[1usize, 8] {
        let c = config(ModelKind::Logistic, 0.05, 0.01, 0.001, batch);
        let run = |arena: &TupleArena, d: usize| {
            let mut t = Trainer::new(c.clone(), d);
            let mut perm = Vec::new();
            let start = std::time::Instant::now();
            for e in 1..=epochs {
                t.start_epoch(e);
                TupleShuffler::new(1, e).permutation(arena.len(), &mut perm);
                t.train_buffer(arena, Some(&perm)).unwrap();
                t.finish_epoch().unwrap();
            }
            (t, start.elapsed())
        };
        let (mut td, _) = run(&dense, d_small);
        let (mut ts, _) = run(&sparse, d_big);
        // Per step: the row's coordinates once (+ their catch-up); per epoch:
        // one O(d) sync. An O(d) cost per step or per batch would be 1000×.
        let dense_work = td.coordinate_updates();
        let sparse_work = ts.coordinate_updates();
        let per_epoch_sync = (d_big * epochs as usize) as u64;
        assert!(
            sparse_work <= 2 * dense_work + per_epoch_sync,
            "batch {batch}: sparse {sparse_work} vs dense {dense_work}"
        );
        // And the models agree (feature j ↔ index j·stride).
        let (md, ms) = (td.model().clone(), ts.model().clone());
        for j in 0..d_small {
            let (a, b) = (md.weights[j], ms.weights[j * stride as usize]);
            assert!(
                (a - b).abs() < 1e-12 * (1.0 + a.abs()),
                "batch {batch} j={j}"
            );
        }
        assert!(ms.weights.iter().filter(|&&w| w != 0.0).count() <= d_small);
    }
    // Wall clock (optimized builds only; min of 3 runs, 100k steps so the
    // O(d) per-epoch syncs are amortized): the 1M-dimension model trains as
    // fast as a 40-dimension sparse one (the cost does not depend on d), and
    // within a small factor of the vectorized dense loop (~2.5x measured:
    // indexed access cannot use SIMD).
    if !cfg!(debug_assertions) {
        let data = dataset(ModelKind::Logistic, 20_000, d_small, 1.0, 22);
        let dense = dense_arena(&data, d_small);
        let (mut wide, mut narrow) = (
            TupleArena::new_sparse(data.len(), data.len() * d_small),
            TupleArena::new_sparse(data.len(), data.len() * d_small),
        );
        let narrow_idx: Vec<u32> = (0..d_small as u32).collect();
        for (y, x) in &data {
            wide.push_sparse(*y, &idx, x);
            narrow.push_sparse(*y, &narrow_idx, x);
        }
        let c = config(ModelKind::Logistic, 0.05, 0.01, 0.0, 1);
        let time = |arena: &TupleArena, d: usize| {
            let mut best = std::time::Duration::MAX;
            for _ in 0..3 {
                let mut t = Trainer::new(c.clone(), d);
                let start = std::time::Instant::now();
                for e in 1..=5 {
                    t.start_epoch(e);
                    t.train_buffer(arena, None).unwrap();
                    t.finish_epoch().unwrap();
                }
                best = best.min(start.elapsed());
            }
            best
        };
        let (t_dense, t_narrow, t_wide) = (
            time(&dense, d_small),
            time(&narrow, d_small),
            time(&wide, d_big),
        );
        assert!(t_wide < t_narrow * 3, "{t_wide:?} vs {t_narrow:?}");
        assert!(t_wide < t_dense * 6, "{t_wide:?} vs dense {t_dense:?}");
    }
}

#[test]
fn softmax_learns_three_separable_classes() {
    // Three clusters around (2,0), (-1,2), (-1,-2).
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let centers = [(2.0, 0.0), (-1.0, 2.0), (-1.0, -2.0)];
    let mut a = TupleArena::new(2, 300);
    for i in 0..300 {
        let c = i % 3;
        let (cx, cy) = centers[c];
        let x = [cx + uniform(&mut rng) - 0.5, cy + uniform(&mut rng) - 0.5];
        a.push(c as f64, &x);
    }
    for &batch in &[1usize, 10] {
        let c = TrainConfig {
            learning_rate: 0.2,
            ..config(ModelKind::Softmax, 0.2, 0.0, 0.0, batch)
        };
        let mut t = Trainer::new(c, 2);
        let mut perm = Vec::new();
        let mut last = None;
        for e in 1..=30 {
            t.start_epoch(e);
            TupleShuffler::new(3, e).permutation(a.len(), &mut perm);
            t.train_buffer(&a, Some(&perm)).unwrap();
            last = Some(t.finish_epoch().unwrap());
        }
        let m = t.into_model();
        assert_eq!(m.n_outputs, 3);
        let correct = (0..a.len())
            .filter(|&i| m.predict(a.row(i)) == a.label(i))
            .count();
        assert_eq!(correct, a.len(), "batch {batch}: {last:?}");
        let mut p = Vec::new();
        assert!(m.predict_proba(a.row(0), &mut p));
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert!(p[0] > 0.5);
    }
}

#[test]
fn softmax_classes_grow_in_any_order() {
    let mut a = TupleArena::new(1, 4);
    a.push(2.0, &[1.0]);
    let mut t = Trainer::new(config(ModelKind::Softmax, 0.1, 0.0, 0.0, 1), 1);
    assert_eq!(t.model().n_outputs, 0);
    t.train_buffer(&a, None).unwrap();
    // Class 2 first: 3 rows, classes 0 and 1 zero except... the softmax over
    // 3 zero scores gives 1/3 each, so rows 0 and 1 got -lr/3 · x.
    let m = t.model().clone();
    assert_eq!(m.n_outputs, 3);
    let third = 1.0 / 3.0;
    assert!((m.weights[0] + 0.1 * third).abs() < 1e-15);
    assert!((m.weights[2] - 0.1 * (1.0 - third)).abs() < 1e-15);
    a.clear();
    a.push(4.0, &[1.0]);
    t.train_buffer(&a, None).unwrap();
    assert_eq!(t.model().n_outputs, 5);
    for bad in [-1.0, 1.5, f64::NAN, 65536.0] {
        a.clear();
        a.push(bad, &[1.0]);
        let e = t.train_buffer(&a, None).unwrap_err();
        assert!(matches!(e, TrainError::InvalidLabel { .. }), "{bad}");
    }
    assert_eq!(
        TrainError::InvalidLabel {
            value: 1.5,
            kind: ModelKind::Softmax
        }
        .to_string(),
        "label value 1.5 is not a class index from 0 to 65535"
    );
    let mut t = Trainer::new(config(ModelKind::Linear, 0.1, 0.0, 0.0, 1), 1);
    a.clear();
    a.push(f64::INFINITY, &[1.0]);
    let e = t.train_buffer(&a, None).unwrap_err();
    assert_eq!(e.to_string(), "label value inf is not a finite number");
}

#[test]
fn linear_regression_recovers_coefficients() {
    let (d, n) = (4, 400);
    let w_true = [1.5, -2.0, 0.5, 3.0];
    let b_true = -1.0;
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let mut a = TupleArena::new(d, n);
    let mut sparse = TupleArena::new_sparse(n, n * d);
    for _ in 0..n {
        let x: Vec<f64> = (0..d).map(|_| uniform(&mut rng) * 2.0 - 1.0).collect();
        let y = x.iter().zip(&w_true).map(|(a, b)| a * b).sum::<f64>() + b_true;
        a.push(y, &x);
        sparse.push_sparse(y, &[0, 1, 2, 3], &x);
    }
    for (arena, batch) in [(&a, 1usize), (&a, 4), (&sparse, 1), (&sparse, 4)] {
        let c = TrainConfig {
            schedule: LrSchedule::Constant,
            ..config(ModelKind::Linear, 0.1, 0.0, 0.0, batch)
        };
        let mut t = Trainer::new(c, d);
        let mut perm = Vec::new();
        let mut last = None;
        for e in 1..=200 {
            t.start_epoch(e);
            TupleShuffler::new(4, e).permutation(arena.len(), &mut perm);
            t.train_buffer(arena, Some(&perm)).unwrap();
            last = Some(t.finish_epoch().unwrap());
        }
        let s = last.unwrap();
        assert_eq!(s.accuracy, None);
        assert!(s.r2.unwrap() > 0.999999, "{s:?}");
        let m = t.into_model();
        for (w, want) in m.weights.iter().zip(&w_true) {
            assert!((w - want).abs() < 1e-3, "batch {batch}: {m:?}");
        }
        assert!((m.bias[0] - b_true).abs() < 1e-3);
        assert_eq!(m.predict(Row::Dense(&[0.0; 4])), m.bias[0]);
    }
}

#[test]
fn linear_epoch_r2_is_progressive() {
    // Zero model on the first epoch: predictions 0, so SSE = Σy², R² = 1 - Σy²/SST.
    let data: Data = vec![(1.0, vec![0.0]), (2.0, vec![0.0]), (4.0, vec![0.0])];
    let c = TrainConfig {
        fit_intercept: false,
        ..config(ModelKind::Linear, 0.1, 0.0, 0.0, 1)
    };
    let (_, s) = train(c, 1, &[dense_arena(&data, 1)], 1);
    let sst =
        (1.0f64 - 7.0 / 3.0).powi(2) + (2.0f64 - 7.0 / 3.0).powi(2) + (4.0f64 - 7.0 / 3.0).powi(2);
    assert!((s[0].r2.unwrap() - (1.0 - 21.0 / sst)).abs() < 1e-12);
    assert!((s[0].loss - 21.0 / 2.0 / 3.0).abs() < 1e-12);
}

#[test]
fn class_weights_scale_loss_and_gradient() {
    let mut a = TupleArena::new(2, 2);
    a.push(1.0, &[1.0, -2.0]);
    a.push(0.0, &[0.5, 1.0]);
    let base = TrainConfig {
        schedule: LrSchedule::Constant,
        label_values: Some((0.0, 1.0)),
        ..config(ModelKind::Logistic, 0.1, 0.0, 0.0, 1)
    };
    // Positive weight 3 on the first (positive) tuple == tripled step size.
    let mut one = TupleArena::new(2, 1);
    one.push(1.0, a.features(0));
    let weighted = TrainConfig {
        class_weights: Some(vec![0.5, 3.0]),
        ..base.clone()
    };
    let (mw, sw) = train(weighted.clone(), 2, &[one.clone()], 1);
    let (mp, sp) = train(
        TrainConfig {
            learning_rate: 0.3,
            ..base.clone()
        },
        2,
        &[one],
        1,
    );
    assert_models_close(&mw, &mp, 1e-15, "positive");
    assert!((sw[0].loss - 3.0 * sp[0].loss).abs() < 1e-15);
    // Negative tuple with weight 0.5.
    let mut neg = TupleArena::new(2, 1);
    neg.push(0.0, a.features(1));
    let (mw, _) = train(weighted, 2, &[neg.clone()], 1);
    let (mp, _) = train(
        TrainConfig {
            learning_rate: 0.05,
            ..base.clone()
        },
        2,
        &[neg],
        1,
    );
    assert_models_close(&mw, &mp, 1e-15, "negative");

    // Softmax: class 1 weight 2 == doubled step for class-1 tuples.
    let mut s = TupleArena::new(2, 1);
    s.push(1.0, &[1.0, 2.0]);
    let sm = |lr: f64, w: Option<Vec<f64>>| {
        train(
            TrainConfig {
                class_weights: w,
                schedule: LrSchedule::Constant,
                ..config(ModelKind::Softmax, lr, 0.0, 0.0, 1)
            },
            2,
            std::slice::from_ref(&s),
            1,
        )
        .0
    };
    assert_models_close(
        &sm(0.1, Some(vec![1.0, 2.0])),
        &sm(0.2, None),
        1e-15,
        "softmax",
    );
    assert_eq!(balanced_class_weights(&[1, 3]), vec![2.0, 2.0 / 3.0]);

    // A third value with preset labels is an error right away.
    let mut t = Trainer::new(base, 2);
    assert_eq!(t.label_map(), Some((0.0, 1.0)));
    let mut bad = TupleArena::new(2, 1);
    bad.push(2.0, &[0.0, 0.0]);
    assert_eq!(
        t.train_buffer(&bad, None),
        Err(TrainError::TooManyLabels {
            values: [0.0, 1.0, 2.0]
        })
    );
}

#[test]
#[should_panic(expected = "binary class_weights need label_values")]
fn binary_class_weights_need_label_values() {
    Trainer::new(
        TrainConfig {
            class_weights: Some(vec![1.0, 2.0]),
            ..TrainConfig::new(ModelKind::Svm)
        },
        2,
    );
}

#[test]
fn schedules_set_each_epochs_rate() {
    for (schedule, want) in [
        (LrSchedule::Constant, [0.4, 0.4, 0.4, 0.4]),
        (
            LrSchedule::Exponential { decay: 0.5 },
            [0.4, 0.2, 0.1, 0.05],
        ),
        (
            LrSchedule::InverseSqrt,
            [0.4, 0.4 / 2f64.sqrt(), 0.4 / 3f64.sqrt(), 0.2],
        ),
    ] {
        let c = TrainConfig {
            learning_rate: 0.4,
            schedule,
            ..TrainConfig::new(ModelKind::Svm)
        };
        let (_, stats) = train(c, 1, &[], 4);
        let got: Vec<f64> = stats.iter().map(|s| s.learning_rate).collect();
        assert_eq!(got, want, "{schedule:?}");
    }
}

#[test]
fn fit_intercept_false_keeps_bias_zero() {
    for kind in ModelKind::ALL {
        let data = dataset(kind, 50, 3, 1.0, 12);
        for batch in [1usize, 4] {
            let c = TrainConfig {
                fit_intercept: false,
                ..config(kind, 0.1, 0.01, 0.0, batch)
            };
            let (m, _) = train(c, 3, &[dense_arena(&data, 3)], 2);
            assert!(m.bias.iter().all(|&b| b == 0.0), "{kind:?}");
            assert!(m.weights.iter().any(|&w| w != 0.0), "{kind:?}");
        }
    }
}

#[test]
fn divergence_is_reported_for_new_kinds() {
    for kind in [ModelKind::Linear, ModelKind::Softmax] {
        let mut a = TupleArena::new(1, 3);
        a.push(1.0, &[1e200]);
        a.push(0.0, &[1e200]);
        a.push(1.0, &[-1e200]);
        let mut t = Trainer::new(config(kind, 1e6, 0.0, 0.0, 1), 1);
        let r = t
            .train_buffer(&a, None)
            .and_then(|_| t.finish_epoch().map(|_| ()));
        assert_eq!(r, Err(TrainError::Diverged { epoch: 1 }), "{kind:?}");
    }
}

fn random_rows(d: usize, n: usize, seed: u64) -> Vec<Vec<f64>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| (0..d).map(|_| uniform(&mut rng) * 10.0 - 3.0).collect())
        .collect()
}

#[test]
fn standardized_training_folds_to_original_units() {
    let d = 4;
    // Features on very different scales and offsets.
    let scales = [1000.0, 0.001, 1.0, 50.0];
    let offsets = [5000.0, -0.01, 3.0, 0.0];
    for kind in ModelKind::ALL {
        let base = dataset(kind, 200, d, 1.0, 13);
        let data: Data = base
            .iter()
            .map(|(y, x)| {
                let x = (0..d).map(|j| x[j] * scales[j] + offsets[j]).collect();
                (*y, x)
            })
            .collect();
        let mut stats = FeatureStats::new(d, kind.is_classifier());
        for (y, x) in &data {
            stats.push(Row::Dense(x), *y);
        }
        for center in [true, false] {
            let s = stats.standardizer(center);
            let c = TrainConfig {
                standardizer: Some(s.clone()),
                // Uncentered offsets make rows long: smaller steps.
                ..config(kind, if center { 0.05 } else { 0.002 }, 0.001, 0.0, 2)
            };
            let (m, st) = train(c, d, &[dense_arena(&data, d)], 5);
            assert!(st.iter().all(|s| s.loss.is_finite()));
            let folded = m.fold_standardizer(&s);
            let mut buf = Vec::new();
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for x in random_rows(d, 50, 14) {
                s.apply_dense(&x, &mut buf);
                m.scores(Row::Dense(&buf), &mut a);
                folded.scores(Row::Dense(&x), &mut b);
                for (p, q) in a.iter().zip(&b) {
                    assert!(
                        (p - q).abs() <= 1e-9 * (1.0 + p.abs()),
                        "{kind:?} center={center}: {p} vs {q}"
                    );
                }
                if kind.is_classifier() {
                    assert_eq!(m.predict(Row::Dense(&buf)), folded.predict(Row::Dense(&x)));
                }
            }
        }
    }
}

#[test]
fn standardized_sparse_training_keeps_sparsity_and_folds() {
    let d = 12;
    let data: Data = dataset(ModelKind::Logistic, 150, d, 0.3, 15)
        .into_iter()
        .map(|(y, x)| {
            (
                y,
                x.iter()
                    .enumerate()
                    .map(|(j, v)| v * (j + 1) as f64 * 10.0)
                    .collect(),
            )
        })
        .collect();
    let sparse = sparse_arena(&data);
    let mut stats = FeatureStats::new(0, true);
    for i in 0..sparse.len() {
        stats.push(sparse.row(i), sparse.label(i));
    }
    let s = stats.standardizer(false);
    let c = TrainConfig {
        standardizer: Some(s.clone()),
        ..config(ModelKind::Logistic, 0.05, 0.01, 0.001, 3)
    };
    // Sparse lazy training on scaled rows equals dense eager training on them.
    let (ms, _) = train(c.clone(), 0, std::slice::from_ref(&sparse), 3);
    let (md, _) = train(c, d, &[dense_arena(&data, d)], 3);
    assert_models_close(&md, &ms, 1e-12, "standardized sparse");
    let folded = ms.fold_standardizer(&s);
    for i in 0..sparse.len() {
        let Row::Sparse { indices, values } = sparse.row(i) else {
            unreachable!()
        };
        let mut buf = Vec::new();
        s.apply_sparse(indices, values, &mut buf);
        let p = ms.decision(Row::Sparse {
            indices,
            values: &buf,
        });
        let q = folded.decision(sparse.row(i));
        assert!((p - q).abs() <= 1e-9 * (1.0 + p.abs()), "{p} vs {q}");
    }
}

#[test]
fn sparse_training_with_growing_dimension_and_preset_dimension_agree() {
    // Later buffers have larger indices; the model grows mid-batch.
    let d = 20;
    let mut data = dataset(ModelKind::Softmax, 90, d, 0.3, 16);
    for (i, (_, x)) in data.iter_mut().enumerate() {
        // First third only uses features < 7, second < 14.
        let limit = if i < 30 {
            7
        } else if i < 60 {
            14
        } else {
            d
        };
        x.iter_mut().skip(limit).for_each(|v| *v = 0.0);
        x[limit - 1] = 1.0;
    }
    let buffers: Vec<TupleArena> = [0, 30, 60, 90]
        .windows(2)
        .map(|w| sparse_arena(&data[w[0]..w[1]]))
        .collect();
    for batch in [1usize, 4, 7] {
        let c = config(ModelKind::Softmax, 0.1, 0.01, 0.002, batch);
        let (grown, _) = train(c.clone(), 0, &buffers, 3);
        let (preset, _) = train(c.clone(), d, &buffers, 3);
        let (dense, _) = train(c, d, &[dense_arena(&data, d)], 3);
        assert_models_close(&grown, &preset, 0.0, &format!("batch {batch}"));
        assert_models_close(&grown, &dense, 1e-12, &format!("batch {batch} dense"));
    }
}
