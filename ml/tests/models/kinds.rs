//! The model kinds and optimization options: softmax, linear regression, class weights,
//! schedules, fit_intercept, divergence.

use super::*;

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
    for kind in ModelKind::ALL.into_iter().filter(|&k| linear_kind(k)) {
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
