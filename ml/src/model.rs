//! Linear models and their per-kind losses.
//!
//! All per-kind logic lives in the `match` arms of [`ModelKind`]: adding a kind
//! (linear regression, softmax, ...) means extending those matches only.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// Linear SVM, hinge loss.
    Svm,
    /// Logistic regression, log loss.
    Logistic,
}

impl ModelKind {
    /// Parses a kind name exactly as returned by [`name`](Self::name).
    pub fn parse(name: &str) -> Option<ModelKind> {
        match name {
            "svm" => Some(ModelKind::Svm),
            "logistic" => Some(ModelKind::Logistic),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Svm => "svm",
            ModelKind::Logistic => "logistic",
        }
    }

    pub fn all_names() -> &'static [&'static str] {
        &["svm", "logistic"]
    }

    /// Loss for decision value `z` and label `y` in {-1, +1}.
    ///
    /// Both losses depend on `y * z` only, so `loss(z, y) == loss(-z, -y)`
    /// bit-for-bit; the trainer's label-flip fix-up relies on this.
    #[inline]
    pub fn loss(self, z: f64, y: f64) -> f64 {
        let margin = y * z;
        match self {
            ModelKind::Svm => {
                if margin < 1.0 {
                    1.0 - margin
                } else {
                    0.0
                }
            }
            ModelKind::Logistic => softplus(-margin),
        }
    }

    /// d loss / d z. Hinge: subgradient `-y` inside the margin, else 0.
    ///
    /// Written as `y * f(y * z)` so that `dloss_dz(-z, -y) == -dloss_dz(z, y)`
    /// bit-for-bit.
    #[inline]
    pub fn dloss_dz(self, z: f64, y: f64) -> f64 {
        let margin = y * z;
        match self {
            ModelKind::Svm => {
                if margin < 1.0 {
                    -y
                } else {
                    0.0
                }
            }
            ModelKind::Logistic => -y * sigmoid(-margin),
        }
    }
}

/// log(1 + exp(t)) without overflow: max(t, 0) + log1p(exp(-|t|)).
#[inline]
fn softplus(t: f64) -> f64 {
    t.max(0.0) + (-t.abs()).exp().ln_1p()
}

/// 1 / (1 + exp(-t)) without overflow: exp is only taken of non-positive values.
#[inline]
fn sigmoid(t: f64) -> f64 {
    if t >= 0.0 {
        1.0 / (1.0 + (-t).exp())
    } else {
        let e = t.exp();
        e / (1.0 + e)
    }
}

/// A linear model: decision value `dot(weights, x) + bias`.
#[derive(Clone, Debug, PartialEq)]
pub struct LinearModel {
    pub kind: ModelKind,
    pub weights: Vec<f64>,
    pub bias: f64,
}

impl LinearModel {
    /// All-zero model.
    pub fn new(kind: ModelKind, n_features: usize) -> Self {
        LinearModel {
            kind,
            weights: vec![0.0; n_features],
            bias: 0.0,
        }
    }

    #[inline]
    pub fn decision(&self, x: &[f64]) -> f64 {
        dot(&self.weights, x) + self.bias
    }

    /// +1.0 or -1.0 (z >= 0 → +1).
    #[inline]
    pub fn predict_sign(&self, x: &[f64]) -> f64 {
        sign(self.decision(x))
    }
}

/// The class a decision value predicts: z >= 0 → +1 (including -0.0), else -1.
#[inline]
pub fn sign(z: f64) -> f64 {
    if z >= 0.0 {
        1.0
    } else {
        -1.0
    }
}

/// Dot product. Four independent accumulators break the serial dependency on
/// one sum, which lets LLVM vectorize (it may not reassociate a single f64 sum).
/// Panics in debug builds if the lengths differ; uses the shorter one otherwise.
#[inline]
pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    debug_assert_eq!(a.len(), b.len(), "dot: length mismatch");
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f64; 4];
    let ca = a.chunks_exact(4);
    let cb = b.chunks_exact(4);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        acc[0] += x[0] * y[0];
        acc[1] += x[1] * y[1];
        acc[2] += x[2] * y[2];
        acc[3] += x[3] * y[3];
    }
    let mut rest = 0.0;
    for (x, y) in ra.iter().zip(rb) {
        rest += x * y;
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + rest
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: [ModelKind; 2] = [ModelKind::Svm, ModelKind::Logistic];

    #[test]
    fn names_round_trip() {
        for &k in &KINDS {
            assert_eq!(ModelKind::parse(k.name()), Some(k));
        }
        assert_eq!(ModelKind::all_names(), &["svm", "logistic"]);
        assert_eq!(ModelKind::parse("SVM"), None);
        assert_eq!(ModelKind::parse(""), None);
        assert_eq!(
            serde_json::to_string(&ModelKind::Logistic).unwrap(),
            "\"logistic\""
        );
    }

    #[test]
    fn gradients_match_finite_differences() {
        let h = 1e-6;
        for &kind in &KINDS {
            for &y in &[-1.0f64, 1.0] {
                let mut z = -8.0f64;
                while z <= 8.0 {
                    // Stay away from the hinge kink at y z = 1.
                    if kind == ModelKind::Svm && (y * z - 1.0).abs() < 1e-3 {
                        z += 0.037;
                        continue;
                    }
                    let fd = (kind.loss(z + h, y) - kind.loss(z - h, y)) / (2.0 * h);
                    let g = kind.dloss_dz(z, y);
                    assert!(
                        (fd - g).abs() < 1e-6,
                        "{kind:?} z={z} y={y}: analytic {g} vs numeric {fd}"
                    );
                    z += 0.037;
                }
            }
        }
    }

    #[test]
    fn known_values() {
        assert_eq!(ModelKind::Svm.loss(0.0, 1.0), 1.0);
        assert_eq!(ModelKind::Svm.loss(2.0, 1.0), 0.0);
        assert_eq!(ModelKind::Svm.loss(2.0, -1.0), 3.0);
        assert_eq!(ModelKind::Svm.dloss_dz(0.5, -1.0), 1.0);
        assert_eq!(ModelKind::Svm.dloss_dz(1.5, 1.0), 0.0);
        assert!((ModelKind::Logistic.loss(0.0, 1.0) - std::f64::consts::LN_2).abs() < 1e-15);
        assert_eq!(ModelKind::Logistic.dloss_dz(0.0, 1.0), -0.5);
        assert_eq!(ModelKind::Logistic.dloss_dz(0.0, -1.0), 0.5);
    }

    #[test]
    fn logistic_is_stable_for_huge_z() {
        let k = ModelKind::Logistic;
        for &z in &[1e3, 1e300, f64::MAX] {
            // Correct side: loss → 0, gradient → 0, never NaN.
            assert!(k.loss(z, 1.0).is_finite() && k.loss(z, 1.0) >= 0.0);
            assert!(k.loss(z, 1.0) < 1e-300);
            assert_eq!(k.dloss_dz(z, 1.0), -0.0);
            // Wrong side: loss ≈ |z|, gradient → ±1.
            assert_eq!(k.loss(z, -1.0), z);
            assert_eq!(k.loss(-z, 1.0), z);
            assert_eq!(k.dloss_dz(z, -1.0), 1.0);
            assert_eq!(k.dloss_dz(-z, 1.0), -1.0);
        }
        // Moderate values stay accurate.
        let z = 30.0f64;
        let expect = (-z).exp(); // log1p(e^-30) ≈ e^-30
        assert!((k.loss(z, 1.0) - expect).abs() < 1e-25);
    }

    #[test]
    fn losses_are_symmetric_bitwise() {
        for &kind in &KINDS {
            for i in 0..200 {
                let z = (i as f64 - 100.0) * 0.173;
                assert_eq!(kind.loss(z, 1.0).to_bits(), kind.loss(-z, -1.0).to_bits());
                // Exact up to the sign of a zero gradient (which training skips).
                let (g, g_neg) = (kind.dloss_dz(z, 1.0), -kind.dloss_dz(-z, -1.0));
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
    fn model_decision_and_sign() {
        let mut m = LinearModel::new(ModelKind::Svm, 2);
        assert_eq!(m.predict_sign(&[1.0, 1.0]), 1.0); // z = 0 → +1
        m.weights = vec![1.0, -2.0];
        m.bias = 0.5;
        assert_eq!(m.decision(&[3.0, 1.0]), 1.5);
        assert_eq!(m.predict_sign(&[0.0, 1.0]), -1.0);
        assert_eq!(sign(-0.0), 1.0);
    }
}
