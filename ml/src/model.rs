//! Linear models, their per-kind losses, and the row type they read.
//!
//! All per-kind logic lives in the `match` arms of [`ModelKind`]: adding a kind
//! means extending those matches only.

use serde::{Deserialize, Serialize};

use crate::row::Row;
use crate::standardize::Standardizer;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// Linear SVM, hinge loss, binary.
    Svm,
    /// Logistic regression, log loss, binary.
    Logistic,
    /// Linear regression, squared loss 0.5·(z - y)² on the raw numeric label.
    Linear,
    /// Multinomial logistic regression over K classes (labels are class
    /// indices 0..K-1), cross-entropy loss.
    Softmax,
}

impl ModelKind {
    pub const ALL: [ModelKind; 4] = [
        ModelKind::Svm,
        ModelKind::Logistic,
        ModelKind::Linear,
        ModelKind::Softmax,
    ];

    /// Parses a kind name exactly as returned by [`name`](Self::name).
    pub fn parse(name: &str) -> Option<ModelKind> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Svm => "svm",
            ModelKind::Logistic => "logistic",
            ModelKind::Linear => "linear",
            ModelKind::Softmax => "softmax",
        }
    }

    pub fn all_names() -> &'static [&'static str] {
        &["svm", "logistic", "linear", "softmax"]
    }

    /// svm and logistic: two classes mapped to ±1.
    pub fn is_binary(self) -> bool {
        matches!(self, ModelKind::Svm | ModelKind::Logistic)
    }

    /// Everything but linear regression.
    pub fn is_classifier(self) -> bool {
        self != ModelKind::Linear
    }

    /// Whether [`LinearModel::predict_proba`] gives probabilities.
    pub fn has_proba(self) -> bool {
        matches!(self, ModelKind::Logistic | ModelKind::Softmax)
    }

    /// Loss for decision value `z` and label `y` (±1 for binary kinds, the raw
    /// value for linear). Softmax has a vector loss: see [`softmax_loss`].
    ///
    /// The binary losses depend on `y * z` only, so `loss(z, y) == loss(-z, -y)`
    /// bit-for-bit; the trainer's label-flip fix-up relies on this.
    #[inline]
    pub fn loss(self, z: f64, y: f64) -> f64 {
        match self {
            ModelKind::Svm => {
                let margin = y * z;
                if margin < 1.0 {
                    1.0 - margin
                } else {
                    0.0
                }
            }
            ModelKind::Logistic => softplus(-(y * z)),
            ModelKind::Linear => {
                let r = z - y;
                0.5 * r * r
            }
            ModelKind::Softmax => unreachable!("softmax loss is softmax_loss()"),
        }
    }

    /// d loss / d z. Hinge: subgradient `-y` inside the margin, else 0.
    ///
    /// Binary kinds are written as `y * f(y * z)` so that
    /// `dloss_dz(-z, -y) == -dloss_dz(z, y)` bit-for-bit.
    #[inline]
    pub fn dloss_dz(self, z: f64, y: f64) -> f64 {
        match self {
            ModelKind::Svm => {
                if y * z < 1.0 {
                    -y
                } else {
                    0.0
                }
            }
            ModelKind::Logistic => -y * sigmoid(-(y * z)),
            ModelKind::Linear => z - y,
            ModelKind::Softmax => unreachable!("softmax gradient is softmax_loss()"),
        }
    }

    /// `(loss(z, y), dloss_dz(z, y))`, bit for bit, with one `exp` for logistic (the SGD step
    /// needs both; the second `exp` was a measurable part of a sparse step).
    #[inline]
    pub fn loss_and_dloss_dz(self, z: f64, y: f64) -> (f64, f64) {
        match self {
            ModelKind::Logistic => {
                // softplus(t) and sigmoid(t) both take exp(-|t|).
                let t = -(y * z);
                let e = (-t.abs()).exp();
                let sigmoid = if t >= 0.0 {
                    1.0 / (1.0 + e)
                } else {
                    e / (1.0 + e)
                };
                (t.max(0.0) + e.ln_1p(), -y * sigmoid)
            }
            _ => (self.loss(z, y), self.dloss_dz(z, y)),
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
pub fn sigmoid(t: f64) -> f64 {
    if t >= 0.0 {
        1.0 / (1.0 + (-t).exp())
    } else {
        let e = t.exp();
        e / (1.0 + e)
    }
}

/// Replaces `scores` by softmax probabilities and returns the cross-entropy
/// loss `-log p_y`. Stable for huge scores: exp is taken of `s - max` <= 0 and
/// the loss is `log Σ exp(s - max) - (s_y - max)`, never `log(0)`.
/// The gradient with respect to the scores is then `p - onehot(y)`.
#[inline]
pub fn softmax_loss(scores: &mut [f64], y: usize) -> f64 {
    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sy = scores[y] - max;
    let mut sum = 0.0;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    let inv = 1.0 / sum;
    for s in scores.iter_mut() {
        *s *= inv;
    }
    sum.ln() - sy
}

/// Index of the largest value; ties → the lowest index. None if empty.
#[inline]
pub fn argmax(v: &[f64]) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, &x) in v.iter().enumerate() {
        if best.is_none_or(|(_, b)| x > b) {
            best = Some((i, x));
        }
    }
    best.map(|(i, _)| i)
}

/// A linear model with `n_outputs` outputs (1, or K for softmax):
/// output k is `dot(weights[k·n_features..(k+1)·n_features], x) + bias[k]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinearModel {
    pub kind: ModelKind,
    pub n_features: usize,
    pub n_outputs: usize,
    /// `n_outputs × n_features`, row-major.
    pub weights: Vec<f64>,
    /// One per output.
    pub bias: Vec<f64>,
}

impl LinearModel {
    /// All-zero model.
    pub fn new(kind: ModelKind, n_features: usize, n_outputs: usize) -> Self {
        LinearModel {
            kind,
            n_features,
            n_outputs,
            weights: vec![0.0; n_features * n_outputs],
            bias: vec![0.0; n_outputs],
        }
    }

    /// A copy, or None when there is no memory for it (instead of aborting).
    pub fn try_clone(&self) -> Option<Self> {
        let mut weights = Vec::new();
        weights.try_reserve_exact(self.weights.len()).ok()?;
        weights.extend_from_slice(&self.weights);
        Some(LinearModel {
            kind: self.kind,
            n_features: self.n_features,
            n_outputs: self.n_outputs,
            weights,
            bias: self.bias.clone(),
        })
    }

    /// A single-output model (svm, logistic, linear) from its parts.
    pub fn single(kind: ModelKind, weights: Vec<f64>, bias: f64) -> Self {
        LinearModel {
            kind,
            n_features: weights.len(),
            n_outputs: 1,
            weights,
            bias: vec![bias],
        }
    }

    /// Weights of output `k`.
    #[inline]
    pub fn output_weights(&self, k: usize) -> &[f64] {
        &self.weights[k * self.n_features..(k + 1) * self.n_features]
    }

    /// Output `k` for `row`.
    #[inline]
    pub fn output(&self, k: usize, row: Row) -> f64 {
        row.dot(self.output_weights(k)) + self.bias[k]
    }

    /// Output 0: the decision value of a binary model, the prediction of a
    /// linear one. NaN for a softmax model without classes.
    #[inline]
    pub fn decision(&self, row: Row) -> f64 {
        if self.n_outputs == 0 {
            return f64::NAN;
        }
        self.output(0, row)
    }

    /// All outputs (raw scores) into `out`, resized to `n_outputs`.
    pub fn scores(&self, row: Row, out: &mut Vec<f64>) {
        out.clear();
        out.extend((0..self.n_outputs).map(|k| self.output(k, row)));
    }

    /// Class probabilities into `out`: logistic `[P(negative), P(positive)]`,
    /// softmax one per class index. svm and linear have none: returns false
    /// and leaves `out` empty.
    pub fn predict_proba(&self, row: Row, out: &mut Vec<f64>) -> bool {
        match self.kind {
            ModelKind::Logistic => {
                let z = self.decision(row);
                out.clear();
                // Both from sigmoid so a tiny probability keeps its precision.
                out.extend([sigmoid(-z), sigmoid(z)]);
                true
            }
            ModelKind::Softmax => {
                self.scores(row, out);
                if !out.is_empty() {
                    softmax_loss(out, 0);
                }
                true
            }
            ModelKind::Svm | ModelKind::Linear => {
                out.clear();
                false
            }
        }
    }

    /// Binary: ±1 (z >= 0 → +1); linear: z; softmax: the argmax class index
    /// (ties → lowest index; NaN without classes).
    pub fn predict(&self, row: Row) -> f64 {
        match self.kind {
            ModelKind::Svm | ModelKind::Logistic => sign(self.decision(row)),
            ModelKind::Linear => self.decision(row),
            ModelKind::Softmax => {
                let mut best: Option<(usize, f64)> = None;
                for k in 0..self.n_outputs {
                    let s = self.output(k, row);
                    if best.is_none_or(|(_, b)| s > b) {
                        best = Some((k, s));
                    }
                }
                best.map_or(f64::NAN, |(k, _)| k as f64)
            }
        }
    }

    /// +1.0 or -1.0 (z >= 0 → +1) for a dense row.
    #[inline]
    pub fn predict_sign(&self, x: &[f64]) -> f64 {
        sign(self.decision(Row::Dense(x)))
    }

    /// The equivalent model on ORIGINAL feature units, for a model trained on
    /// standardized rows `x'_j = (x_j - mean_j)·scale_j` (mean 0 unless
    /// `center`): `w'_j = w_j·scale_j`, `b' = b - Σ_j w'_j·mean_j`. Features
    /// beyond the standardizer's length keep their weights.
    pub fn fold_standardizer(&self, s: &Standardizer) -> LinearModel {
        let mut m = self.clone();
        let d = self.n_features;
        for k in 0..self.n_outputs {
            let row = &mut m.weights[k * d..(k + 1) * d];
            let mut shift = 0.0;
            for (j, w) in row.iter_mut().enumerate() {
                if let Some(&scale) = s.scale.get(j) {
                    *w *= scale;
                    if s.center {
                        shift += *w * s.mean[j];
                    }
                }
            }
            m.bias[k] -= shift;
        }
        m
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

#[cfg(test)]
mod tests;
