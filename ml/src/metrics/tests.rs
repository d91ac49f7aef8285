//! Tests of the multiclass and regression metrics, and the helpers the other metrics tests
//! (and scoring's) share.

use super::*;
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

pub(super) fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

/// Seeded uniforms in (0, 1) and standard normals (Box–Muller); scoring's tests use it too.
pub(crate) struct Rand(ChaCha8Rng);

impl Rand {
    pub(crate) fn new(seed: u64) -> Self {
        Rand(ChaCha8Rng::seed_from_u64(seed))
    }

    pub(crate) fn uniform(&mut self) -> f64 {
        ((self.0.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    pub(crate) fn normal(&mut self) -> f64 {
        let (a, b) = (self.uniform(), self.uniform());
        (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
    }
}

/// |a - b| within `tol` relative to the larger magnitude (absolute below 1).
pub(super) fn near(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * a.abs().max(b.abs()).max(1.0)
}

#[test]
fn multiclass_report() {
    // actual:    0 0 1 1 2 2
    // predicted: 0 1 1 1 0 2
    let mut m = MulticlassMetrics::new(3);
    let probs = [0.7, 0.2, 0.6, 0.5, 0.1, 0.9];
    for (i, (p, a)) in [(0, 0), (1, 0), (1, 1), (1, 1), (0, 2), (2, 2)]
        .into_iter()
        .enumerate()
    {
        m.push(p, a, Some(probs[i]));
    }
    let r = m.finish();
    assert_eq!(r.n, 6);
    assert!(close(r.accuracy, 4.0 / 6.0));
    // class 0: predicted twice (1 right) → P 1/2, R 1/2
    // class 1: predicted 3 times (2 right) → P 2/3, R 1
    // class 2: predicted once (right) → P 1, R 1/2
    let want = [
        (0.5, 0.5, 0.5),
        (2.0 / 3.0, 1.0, 0.8),
        (1.0, 0.5, 2.0 / 3.0),
    ];
    for (c, (p, rc, f)) in want.iter().enumerate() {
        let cr = &r.per_class[c];
        assert!(
            close(cr.precision, *p) && close(cr.recall, *rc) && close(cr.f1, *f),
            "{c}"
        );
        assert_eq!(cr.support, 2);
    }
    assert!(close(r.macro_precision, (0.5 + 2.0 / 3.0 + 1.0) / 3.0));
    assert!(close(r.macro_recall, 2.0 / 3.0));
    assert!(close(r.macro_f1, (0.5 + 0.8 + 2.0 / 3.0) / 3.0));
    let ll = -probs.iter().map(|p| p.ln()).sum::<f64>() / 6.0;
    assert!(close(r.log_loss.unwrap(), ll));

    // Classes that never occur nor are predicted do not dilute macro averages;
    // pushing a larger index grows K.
    let mut m = MulticlassMetrics::new(5);
    m.push(0, 0, None);
    m.push(6, 6, None);
    let r = m.finish();
    assert_eq!(r.per_class.len(), 7);
    assert_eq!(
        (r.macro_precision, r.macro_recall, r.macro_f1),
        (1.0, 1.0, 1.0)
    );
    assert_eq!(r.log_loss, None);
    assert!(serde_json::to_string(&r).unwrap().contains("\"per_class\""));
}

#[test]
fn regression_report() {
    let mut m = RegressionMetrics::new();
    for (p, a) in [(1.0, 1.0), (2.0, 2.0), (3.0, 3.0)] {
        m.push(p, a);
    }
    let r = m.finish();
    assert_eq!((r.mse, r.rmse, r.mae, r.r2, r.n), (0.0, 0.0, 0.0, 1.0, 3));

    // Predicting the mean gives R² = 0.
    let mut m = RegressionMetrics::new();
    for a in [1.0, 2.0, 3.0, 6.0] {
        m.push(3.0, a);
    }
    let r = m.finish();
    assert!(close(r.r2, 0.0));
    assert!(close(r.mse, (4.0 + 1.0 + 0.0 + 9.0) / 4.0));
    assert!(close(r.rmse, 3.5f64.sqrt()));
    assert!(close(r.mae, (2.0 + 1.0 + 0.0 + 3.0) / 4.0));

    // Hand example: actual 3, -0.5, 2, 7; predicted 2.5, 0, 2, 8 (sklearn docs: r2 0.9486...).
    let mut m = RegressionMetrics::new();
    for (p, a) in [(2.5, 3.0), (0.0, -0.5), (2.0, 2.0), (8.0, 7.0)] {
        m.push(p, a);
    }
    let r = m.finish();
    assert!(close(r.mse, 0.375));
    assert!(close(r.mae, 0.5));
    assert!((r.r2 - 0.9486081370449679).abs() < 1e-12);

    // Constant actual values: 1 if perfect, else 0.
    let mut m = RegressionMetrics::new();
    m.push(2.0, 2.0);
    m.push(2.0, 2.0);
    assert_eq!(m.finish().r2, 1.0);
    let mut m = RegressionMetrics::new();
    m.push(1.0, 2.0);
    m.push(2.0, 2.0);
    assert_eq!(m.finish().r2, 0.0);
    assert_eq!(RegressionMetrics::new().finish().n, 0);
}

#[test]
fn multiclass_parts_merge_to_one_pass() {
    let mut rng = Rand::new(50);
    let rows: Vec<(usize, usize, Option<f64>)> = (0..3_000)
        .map(|_| {
            let actual = (rng.uniform() * 4.0) as usize;
            let predicted = if rng.uniform() < 0.6 {
                actual
            } else {
                (rng.uniform() * 4.0) as usize
            };
            (predicted, actual, Some(0.05 + 0.9 * rng.uniform()))
        })
        .collect();
    let mut whole = MulticlassMetrics::new(4);
    for &(p, a, q) in &rows {
        whole.push(p, a, q);
    }
    // A part that grew K (index 5 pushed) merged with parts of K = 4, in both orders.
    let mut grown = MulticlassMetrics::new(4);
    grown.push(5, 1, Some(0.5));
    grown.push(2, 5, Some(0.25));
    let mut whole_grown = whole.clone();
    whole_grown.merge(&grown);
    let whole = whole.finish();
    let mut reference = MulticlassMetrics::new(4);
    for &(p, a, q) in rows.iter().chain(&[(5, 1, Some(0.5)), (2, 5, Some(0.25))]) {
        reference.push(p, a, q);
    }
    let reference = reference.finish();
    let round_trip = |m: &MulticlassMetrics| -> MulticlassMetrics {
        serde_json::from_str(&serde_json::to_string(m).unwrap()).unwrap()
    };
    let part = |range: std::ops::Range<usize>| {
        let mut m = MulticlassMetrics::new(4);
        for &(p, a, q) in &rows[range] {
            m.push(p, a, q);
        }
        round_trip(&m)
    };
    let parts = [part(0..700), part(700..700), part(700..3_000)];
    let check = |r: &MulticlassReport, want: &MulticlassReport| {
        assert_eq!(r.n, want.n);
        assert_eq!(r.per_class, want.per_class);
        assert_eq!(
            (r.accuracy, r.macro_precision, r.macro_recall, r.macro_f1),
            (
                want.accuracy,
                want.macro_precision,
                want.macro_recall,
                want.macro_f1
            )
        );
        assert!(near(r.log_loss.unwrap(), want.log_loss.unwrap(), 1e-12));
    };
    let mut merged = MulticlassMetrics::new(4);
    for p in &parts {
        merged.merge(p);
    }
    check(&merged.finish(), &whole);
    // Larger K merged into smaller, and smaller into larger.
    let mut merged = MulticlassMetrics::new(1);
    for p in &parts {
        merged.merge(p);
    }
    merged.merge(&round_trip(&grown));
    let r = merged.finish();
    assert_eq!(r.per_class.len(), 6);
    check(&r, &reference);
    let mut merged = round_trip(&grown);
    for p in parts.iter().rev() {
        merged.merge(p);
    }
    check(&merged.finish(), &reference);
    check(&whole_grown.finish(), &reference);
    // Empty parts: both directions.
    let mut empty = MulticlassMetrics::new(4);
    empty.merge(&parts[2]);
    let mut right = parts[2].clone();
    right.merge(&MulticlassMetrics::new(4));
    assert_eq!(
        serde_json::to_string(&empty).unwrap(),
        serde_json::to_string(&right).unwrap()
    );
    // A part without probabilities: no log loss.
    let mut no_prob = MulticlassMetrics::new(4);
    no_prob.push(0, 0, None);
    let mut merged = parts[0].clone();
    merged.merge(&no_prob);
    assert_eq!(merged.finish().log_loss, None);
}

#[test]
fn regression_parts_merge_to_one_pass() {
    let mut rng = Rand::new(70);
    let rows: Vec<(f64, f64)> = (0..4_000)
        .map(|_| {
            let actual = 50.0 + 10.0 * rng.normal();
            (actual + 2.0 * rng.normal() + 0.5, actual)
        })
        .collect();
    let mut whole = RegressionMetrics::new();
    for &(p, a) in &rows {
        whole.push(p, a);
    }
    let whole = whole.finish();
    assert!((0.9..1.0).contains(&whole.r2));
    let part = |r: &[(f64, f64)]| {
        let mut m = RegressionMetrics::new();
        for &(p, a) in r {
            m.push(p, a);
        }
        let json = serde_json::to_string(&m).unwrap();
        serde_json::from_str::<RegressionMetrics>(&json).unwrap()
    };
    let parts = [part(&rows[..3_100]), part(&[]), part(&rows[3_100..])];
    for order in [[0, 1, 2], [1, 2, 0]] {
        let mut merged = RegressionMetrics::new();
        for &i in &order {
            merged.merge(&parts[i]);
        }
        let r = merged.finish();
        assert_eq!(r.n, whole.n);
        for (got, want) in [
            (r.mse, whole.mse),
            (r.rmse, whole.rmse),
            (r.mae, whole.mae),
            (r.r2, whole.r2),
        ] {
            assert!(near(got, want, 1e-12), "{got} vs {want}");
        }
    }
    let mut merged = RegressionMetrics::new();
    merged.merge(&RegressionMetrics::new());
    assert_eq!(merged.finish(), RegressionMetrics::new().finish());
    // A constant series split in two: SST stays 0, so R² is 1 for a perfect fit.
    let (mut a, mut b) = (RegressionMetrics::new(), RegressionMetrics::new());
    a.push(2.0, 2.0);
    b.push(2.0, 2.0);
    b.push(2.0, 2.0);
    a.merge(&b);
    assert_eq!(a.finish().r2, 1.0);
}
