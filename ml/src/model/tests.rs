//! Unit tests of the losses, the dot products and the model outputs.

use super::*;
use crate::row::{dot, sparse_axpy, sparse_dot};

/// The loss of a kind with one output.
fn scalar(kind: ModelKind) -> ScalarLoss {
    kind.head().scalar().expect("a head with one output")
}

const KINDS: [ModelKind; 3] = [ModelKind::Svm, ModelKind::Logistic, ModelKind::Linear];

#[test]
fn names_round_trip() {
    for k in ModelKind::ALL {
        assert_eq!(ModelKind::parse(k.name()), Some(k));
    }
    assert_eq!(
        ModelKind::all_names(),
        &[
            "svm",
            "logistic",
            "linear",
            "softmax",
            "mlp",
            "mlp_regression",
            "fm",
            "fm_regression"
        ]
    );
    assert_eq!(
        serde_json::to_string(&ModelKind::MlpRegression).unwrap(),
        "\"mlp_regression\""
    );
    assert_eq!(ModelKind::parse("SVM"), None);
    assert_eq!(ModelKind::parse(""), None);
    assert_eq!(
        serde_json::to_string(&ModelKind::Logistic).unwrap(),
        "\"logistic\""
    );
    assert_eq!(
        serde_json::to_string(&ModelKind::Softmax).unwrap(),
        "\"softmax\""
    );
}

#[test]
fn gradients_match_finite_differences() {
    let h = 1e-6;
    for &kind in &KINDS {
        let ys: &[f64] = if kind == ModelKind::Linear {
            &[-3.5, 0.0, 2.25]
        } else {
            &[-1.0, 1.0]
        };
        for &y in ys {
            let mut z = -8.0f64;
            while z <= 8.0 {
                // Stay away from the hinge kink at y z = 1.
                if kind == ModelKind::Svm && (y * z - 1.0).abs() < 1e-3 {
                    z += 0.037;
                    continue;
                }
                let fd = (scalar(kind).loss(z + h, y) - scalar(kind).loss(z - h, y)) / (2.0 * h);
                let g = scalar(kind).dloss_dz(z, y);
                assert!(
                    (fd - g).abs() < 1e-6 * (1.0 + g.abs()),
                    "{kind:?} z={z} y={y}: analytic {g} vs numeric {fd}"
                );
                z += 0.037;
            }
        }
    }
}

#[test]
fn softmax_gradient_matches_finite_differences() {
    let h = 1e-6;
    let points: [&[f64]; 4] = [
        &[0.0, 0.0, 0.0],
        &[1.0, -2.0, 0.5],
        &[3.0, 2.9, -4.0, 0.1],
        &[-10.0, 5.0],
    ];
    let loss = |s: &[f64], y: usize| softmax_loss(&mut s.to_vec(), y);
    for s in points {
        for y in 0..s.len() {
            let mut p = s.to_vec();
            softmax_loss(&mut p, y);
            for k in 0..s.len() {
                let g = p[k] - if k == y { 1.0 } else { 0.0 };
                let (mut up, mut down) = (s.to_vec(), s.to_vec());
                up[k] += h;
                down[k] -= h;
                let fd = (loss(&up, y) - loss(&down, y)) / (2.0 * h);
                assert!((fd - g).abs() < 1e-7, "{s:?} y={y} k={k}: {g} vs {fd}");
            }
        }
    }
}

#[test]
fn softmax_is_stable_for_huge_scores() {
    let mut s = vec![1e300, -1e300, 0.0];
    let l = softmax_loss(&mut s, 0);
    assert_eq!(l, 0.0);
    assert_eq!(s, vec![1.0, 0.0, 0.0]);
    let mut s = vec![1e300, -1e300, 0.0];
    let l = softmax_loss(&mut s, 2);
    assert_eq!(l, 1e300); // -log p_2 = 1e300 - 0, exact, not inf
    let mut s = vec![f64::MAX, f64::MAX];
    let l = softmax_loss(&mut s, 1);
    assert!((l - std::f64::consts::LN_2).abs() < 1e-15);
    assert_eq!(s, vec![0.5, 0.5]);
    let mut s = vec![-1e308, -1e308 + 1e292, -1e308];
    assert!(softmax_loss(&mut s, 0).is_finite());
    assert!(s.iter().all(|p| p.is_finite()));
}

#[test]
fn known_values() {
    assert_eq!(scalar(ModelKind::Svm).loss(0.0, 1.0), 1.0);
    assert_eq!(scalar(ModelKind::Svm).loss(2.0, 1.0), 0.0);
    assert_eq!(scalar(ModelKind::Svm).loss(2.0, -1.0), 3.0);
    assert_eq!(scalar(ModelKind::Svm).dloss_dz(0.5, -1.0), 1.0);
    assert_eq!(scalar(ModelKind::Svm).dloss_dz(1.5, 1.0), 0.0);
    assert!((scalar(ModelKind::Logistic).loss(0.0, 1.0) - std::f64::consts::LN_2).abs() < 1e-15);
    assert_eq!(scalar(ModelKind::Logistic).dloss_dz(0.0, 1.0), -0.5);
    assert_eq!(scalar(ModelKind::Logistic).dloss_dz(0.0, -1.0), 0.5);
    assert_eq!(scalar(ModelKind::Linear).loss(3.0, 1.0), 2.0);
    assert_eq!(scalar(ModelKind::Linear).dloss_dz(3.0, 1.0), 2.0);
    let mut s = vec![0.0; 4];
    assert!((softmax_loss(&mut s, 3) - 4f64.ln()).abs() < 1e-15);
}

#[test]
fn logistic_is_stable_for_huge_z() {
    let k = ModelKind::Logistic;
    for &z in &[1e3, 1e300, f64::MAX] {
        // Correct side: loss → 0, gradient → 0, never NaN.
        assert!(scalar(k).loss(z, 1.0).is_finite() && scalar(k).loss(z, 1.0) >= 0.0);
        assert!(scalar(k).loss(z, 1.0) < 1e-300);
        assert_eq!(scalar(k).dloss_dz(z, 1.0), -0.0);
        // Wrong side: loss ≈ |z|, gradient → ±1.
        assert_eq!(scalar(k).loss(z, -1.0), z);
        assert_eq!(scalar(k).loss(-z, 1.0), z);
        assert_eq!(scalar(k).dloss_dz(z, -1.0), 1.0);
        assert_eq!(scalar(k).dloss_dz(-z, 1.0), -1.0);
    }
    // Moderate values stay accurate.
    let z = 30.0f64;
    let expect = (-z).exp(); // log1p(e^-30) ≈ e^-30
    assert!((scalar(k).loss(z, 1.0) - expect).abs() < 1e-25);
}

#[test]
fn loss_and_dloss_dz_equal_the_separate_functions_bitwise() {
    for kind in [ModelKind::Svm, ModelKind::Logistic, ModelKind::Linear] {
        for i in 0..2001 {
            let z = (i as f64 - 1000.0) * 0.0917;
            for y in [-1.0, 1.0, 0.3] {
                let (l, g) = scalar(kind).loss_and_dloss_dz(z, y);
                assert_eq!(
                    l.to_bits(),
                    scalar(kind).loss(z, y).to_bits(),
                    "{kind:?} loss z={z} y={y}"
                );
                assert_eq!(
                    g.to_bits(),
                    scalar(kind).dloss_dz(z, y).to_bits(),
                    "{kind:?} dloss z={z} y={y}"
                );
            }
        }
    }
}

#[test]
fn losses_are_symmetric_bitwise() {
    for kind in [ModelKind::Svm, ModelKind::Logistic] {
        for i in 0..200 {
            let z = (i as f64 - 100.0) * 0.173;
            assert_eq!(
                scalar(kind).loss(z, 1.0).to_bits(),
                scalar(kind).loss(-z, -1.0).to_bits()
            );
            // Exact up to the sign of a zero gradient (which training skips).
            let (g, g_neg) = (
                scalar(kind).dloss_dz(z, 1.0),
                -scalar(kind).dloss_dz(-z, -1.0),
            );
            assert!(g.to_bits() == g_neg.to_bits() || (g == 0.0 && g_neg == 0.0));
        }
    }
}

#[test]
fn dot_matches_naive() {
    for n in 0..20 {
        let a: Vec<f64> = (0..n).map(|i| i as f64 * 0.5 - 2.0).collect();
        let b: Vec<f64> = (0..n).map(|i| 3.0 - i as f64).collect();
        let naive: f64 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - naive).abs() < 1e-12, "n={n}");
    }
}

#[test]
fn sparse_dot_and_axpy_match_naive() {
    let w0: Vec<f64> = (0..50).map(|i| (i as f64 * 0.37).sin()).collect();
    for n in 0..12 {
        let indices: Vec<u32> = (0..n).map(|i| (i * 4 + 1) as u32).collect();
        let values: Vec<f64> = (0..n).map(|i| 1.5 - i as f64 * 0.25).collect();
        let naive: f64 = indices
            .iter()
            .zip(&values)
            .map(|(&j, v)| w0[j as usize] * v)
            .sum();
        assert!(
            (sparse_dot(&w0, &indices, &values) - naive).abs() < 1e-12,
            "n={n}"
        );
        let mut w = w0.clone();
        sparse_axpy(&mut w, -0.5, &indices, &values);
        for (j, (a, b)) in w.iter().zip(&w0).enumerate() {
            let x = indices
                .iter()
                .position(|&i| i as usize == j)
                .map_or(0.0, |p| values[p]);
            assert_eq!(*a, b + -0.5 * x, "n={n} j={j}");
        }
    }
}

#[test]
#[should_panic(expected = "sparse index beyond the weights")]
fn sparse_dot_checks_indices() {
    sparse_dot(&[1.0, 2.0], &[0, 2], &[1.0, 1.0]);
}

#[test]
#[should_panic(expected = "sparse index beyond the weights")]
fn sparse_axpy_checks_indices() {
    sparse_axpy(&mut [], 1.0, &[0], &[1.0]);
}

#[test]
fn model_decision_and_sign() {
    let mut m = LinearModel::new(ModelKind::Svm, 2, 1);
    assert_eq!(m.predict_sign(&[1.0, 1.0]), 1.0); // z = 0 → +1
    m.weights = vec![1.0, -2.0];
    m.bias = vec![0.5];
    assert_eq!(m.decision(Row::Dense(&[3.0, 1.0])), 1.5);
    assert_eq!(m.predict_sign(&[0.0, 1.0]), -1.0);
    assert_eq!(m.predict(Row::Dense(&[0.0, 1.0])), -1.0);
    assert_eq!(sign(-0.0), 1.0);
    let sparse = Row::Sparse {
        indices: &[0, 1, 7],
        values: &[3.0, 1.0, 100.0],
    };
    assert_eq!(m.decision(sparse), 1.5); // index 7 is beyond the model: weight 0
    assert_eq!(sparse.dim(), 8);
    assert_eq!(sparse.nnz(), 3);
    let mut out = vec![9.0];
    assert!(!m.predict_proba(sparse, &mut out));
    assert!(out.is_empty());
}

#[test]
fn multi_output_scores_proba_predict() {
    let m = LinearModel {
        kind: ModelKind::Softmax,
        n_features: 2,
        n_outputs: 3,
        weights: vec![1.0, 0.0, 0.0, 1.0, -1.0, -1.0],
        bias: vec![0.0, 0.5, 0.0],
    };
    let x = Row::Dense(&[2.0, 1.0]);
    let mut s = Vec::new();
    m.scores(x, &mut s);
    assert_eq!(s, vec![2.0, 1.5, -3.0]);
    assert_eq!(m.predict(x), 0.0);
    assert_eq!(m.predict(Row::Dense(&[1.0, 1.0])), 1.0);
    assert!(m.predict_proba(x, &mut s));
    let e = [2f64.exp(), 1.5f64.exp(), (-3f64).exp()];
    let t: f64 = e.iter().sum();
    for k in 0..3 {
        assert!((s[k] - e[k] / t).abs() < 1e-15);
    }
    let lg = LinearModel::single(ModelKind::Logistic, vec![1.0], 0.0);
    assert!(lg.predict_proba(Row::Dense(&[0.0]), &mut s));
    assert_eq!(s, vec![0.5, 0.5]);
    assert!(lg.predict_proba(Row::Dense(&[800.0]), &mut s));
    assert_eq!(s[1], 1.0);
    assert!(s[0] >= 0.0); // underflows gracefully, no NaN
    let lin = LinearModel::single(ModelKind::Linear, vec![2.0], 1.0);
    assert_eq!(lin.predict(Row::Dense(&[-3.0])), -5.0);
    assert!(LinearModel::new(ModelKind::Softmax, 2, 0)
        .predict(x)
        .is_nan());
    assert_eq!(argmax(&[1.0, 3.0, 3.0]), Some(1));
    assert_eq!(argmax(&[]), None);
}

#[test]
fn unfolding_a_standardizer_computes_the_same_function_on_standardized_rows() {
    // A stored (table-unit) softmax model, and a standardizer over 2 of its 3 features.
    let stored = LinearModel {
        kind: ModelKind::Softmax,
        n_features: 3,
        n_outputs: 2,
        weights: vec![0.5, -2.0, 3.0, 1.5, 0.25, -1.0],
        bias: vec![0.1, -0.3],
    };
    for center in [true, false] {
        let s = Standardizer {
            mean: vec![10.0, -4.0],
            scale: vec![0.2, 2.0],
            center,
        };
        let internal = stored.unfold_standardizer(&s);
        let x = [12.0, -3.5, 7.0];
        let mut standardized = Vec::new();
        s.apply_dense(&x, &mut standardized);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        stored.scores(Row::Dense(&x), &mut a);
        internal.scores(Row::Dense(&standardized), &mut b);
        for (p, q) in a.iter().zip(&b) {
            assert!((p - q).abs() < 1e-12, "{a:?} vs {b:?}");
        }
        // Folding it back gives the stored model.
        let back = internal.fold_standardizer(&s);
        for (p, q) in back
            .weights
            .iter()
            .chain(&back.bias)
            .zip(stored.weights.iter().chain(&stored.bias))
        {
            assert!((p - q).abs() < 1e-12);
        }
    }
}

#[test]
fn every_kind_has_a_head_that_fits_its_labels() {
    for kind in ModelKind::ALL {
        let head = kind.head();
        // One output per class exactly when the loss is the cross-entropy over classes.
        assert_eq!(
            head.labels == Labels::Classes,
            matches!(head.loss, Loss::CrossEntropy),
            "{kind:?}"
        );
        // Only a regression's loss can run away while finite (crate::divergence).
        assert_eq!(
            head.zero_model_loss(2.0).is_some(),
            head.labels == Labels::Number,
            "{kind:?}"
        );
        // Probabilities from the outputs sum to 1, or there are none.
        let mut out = vec![0.3; kind.outputs_for(3)];
        if head.probabilities(&mut out) {
            assert!((out.iter().sum::<f64>() - 1.0).abs() < 1e-12, "{kind:?}");
        } else {
            assert!(out.is_empty() && !kind.has_proba(), "{kind:?}");
        }
    }
    assert_eq!(ModelKind::Mlp.head(), ModelKind::Softmax.head());
    assert_eq!(ModelKind::FmRegression.head(), Head::SQUARED);
    assert_ne!(ModelKind::Svm.head(), ModelKind::Logistic.head());
    assert_eq!(format!("{:?}", Head::HINGE), "sign");
}

#[test]
fn a_scalar_head_scores_a_batch_as_its_loss() {
    let (outputs, labels) = ([0.4, -2.0, 1.5], [1.0, -1.0, -1.0]);
    for head in [Head::HINGE, Head::LOGISTIC, Head::SQUARED] {
        let f = head.scalar().unwrap();
        let mut delta = [0.0; 3];
        let loss = head.delta(&outputs, &labels, &[], 0.5, &mut delta);
        let want: f64 = outputs
            .iter()
            .zip(&labels)
            .map(|(&z, &y)| f.loss(z, y))
            .sum();
        assert_eq!(loss, want, "{head:?}");
        for i in 0..3 {
            assert_eq!(
                delta[i],
                f.dloss_dz(outputs[i], labels[i]) * 0.5,
                "{head:?}"
            );
        }
    }
    assert!(Head::SOFTMAX.scalar().is_none());
}
