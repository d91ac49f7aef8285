//! Model kinds and the linear model they share.
//!
//! A kind is a family (which model computes the outputs: `crate::family`) and an output head
//! (what the outputs mean and how they are scored: [`head`], one table per head in its own
//! file of `head/`: hinge, logistic, squared, softmax). [`ModelKind`] is generated
//! from the one registration list below, which names each kind and its head. Adding a kind is
//! one line there (and one in the family registry); a new head is a file and a constant of
//! [`Head`]; nothing outside this crate matches on the kind.

use serde::{Deserialize, Serialize};

use crate::row::Row;
use crate::standardize::Standardizer;

pub mod head;

pub use head::{Head, HeadRules, Likelihood, Loss, ScalarLoss};

/// What a kind learns from the label column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Labels {
    /// A number, predicted as a number (regression).
    Number,
    /// Exactly two label values, mapped to -1 / +1 (the first value seen, or the smaller one
    /// once both are known, is -1); any number, boolean or text.
    TwoClasses,
    /// Classes numbered 0..K-1 in the order they are first seen; one output per class.
    Classes,
}

/// Generates [`ModelKind`] from the registered kinds: `Variant => ("name", head)`.
macro_rules! register_kinds {
    ($($variant:ident => ($name:literal, $head:expr)),+ $(,)?) => {
        /// A model kind: its name, its head ([`ModelKind::head`]) and its family
        /// (`ModelKind::family`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum ModelKind {
            $($variant),+
        }

        impl ModelKind {
            pub const ALL: [ModelKind; [$($name),+].len()] = [$(ModelKind::$variant),+];

            /// The kind's name in SQL (`corgipile_train(..., 'svm', ...)`) and in the catalog.
            pub fn name(self) -> &'static str {
                match self {
                    $(ModelKind::$variant => $name),+
                }
            }

            /// What the kind's outputs mean and how they are scored.
            #[inline]
            pub fn head(self) -> Head {
                match self {
                    $(ModelKind::$variant => $head),+
                }
            }
        }
    };
}

// The registration list: one line per kind.
register_kinds! {
    Svm => ("svm", Head::HINGE),
    Logistic => ("logistic", Head::LOGISTIC),
    Linear => ("linear", Head::SQUARED),
    Softmax => ("softmax", Head::SOFTMAX),
    // Networks (`crate::network`): hidden layers before the output layer.
    Mlp => ("mlp", Head::SOFTMAX),
    MlpRegression => ("mlp_regression", Head::SQUARED),
    // Factorization machines (`crate::fm`): a linear part and every pair of features.
    Fm => ("fm", Head::SOFTMAX),
    FmRegression => ("fm_regression", Head::SQUARED),
}

/// The kind a pipeline that trains nothing (corgipile_trace) reads its rows as: the label read
/// as a number, whatever it holds.
pub fn reading_kind() -> ModelKind {
    ModelKind::ALL
        .into_iter()
        .find(|k| k.labels() == Labels::Number)
        .expect("a kind learns a number")
}

/// A kind name that names no registered kind.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("unknown model \"{0}\"")]
pub struct UnknownKind(pub String);

impl UnknownKind {
    /// The hint that lists the valid names.
    pub fn hint(&self) -> String {
        format!("Valid models are: {}.", ModelKind::all_names().join(", "))
    }
}

impl std::str::FromStr for ModelKind {
    type Err = UnknownKind;

    fn from_str(name: &str) -> Result<ModelKind, UnknownKind> {
        ModelKind::parse(name).ok_or_else(|| UnknownKind(name.to_owned()))
    }
}

impl ModelKind {
    /// Parses a kind name exactly as returned by [`name`](Self::name).
    pub fn parse(name: &str) -> Option<ModelKind> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    pub fn all_names() -> Vec<&'static str> {
        Self::ALL.iter().map(|k| k.name()).collect()
    }

    /// What the kind learns from the label column.
    pub fn labels(self) -> Labels {
        self.head().labels
    }

    /// Whether the kind's models give class probabilities.
    pub fn has_proba(self) -> bool {
        self.head().probabilities.is_some()
    }

    /// Two classes mapped to ±1.
    pub fn is_binary(self) -> bool {
        self.labels() == Labels::TwoClasses
    }

    /// Everything but regression.
    pub fn is_classifier(self) -> bool {
        self.labels() != Labels::Number
    }

    /// One output per class (the outputs grow as classes are seen).
    pub fn has_class_outputs(self) -> bool {
        self.labels() == Labels::Classes
    }

    /// Whether the model has one decision value (its output 0) to report.
    pub fn has_decision_value(self) -> bool {
        !self.has_class_outputs()
    }

    /// Outputs of a model of this kind over `classes` classes.
    pub fn outputs_for(self, classes: usize) -> usize {
        if self.has_class_outputs() {
            classes
        } else {
            1
        }
    }

    /// The fewest outputs a trained model of this kind has (one per class: at least 2).
    pub fn min_outputs(self) -> usize {
        self.outputs_for(2)
    }

    /// The per-epoch quality measure reported beside the loss: `"r2"` or `"accuracy"`.
    pub fn metric_name(self) -> &'static str {
        if self.is_classifier() {
            "accuracy"
        } else {
            "r2"
        }
    }
}

/// log(1 + exp(t)) without overflow: max(t, 0) + log1p(exp(-|t|)).
#[inline]
pub(crate) fn softplus(t: f64) -> f64 {
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
        if !self.kind.has_proba() {
            out.clear();
            return false;
        }
        self.scores(row, out);
        self.kind.head().probabilities(out)
    }

    /// Binary: ±1 (z >= 0 → +1); linear: z; softmax: the argmax class index
    /// (ties → lowest index; NaN without classes).
    pub fn predict(&self, row: Row) -> f64 {
        if self.n_outputs == 1 {
            return self.kind.head().predict(&[self.decision(row)]);
        }
        let mut scores = Vec::with_capacity(self.n_outputs);
        self.scores(row, &mut scores);
        self.kind.head().predict(&scores)
    }

    /// The index of the class a row is predicted to be (two classes: 0 = negative, 1 =
    /// positive). For classifiers only.
    pub fn class_index(&self, row: Row) -> usize {
        if self.kind.has_class_outputs() {
            self.predict(row) as usize
        } else {
            (self.decision(row) >= 0.0) as usize
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

impl LinearModel {
    /// The inverse of [`fold_standardizer`](Self::fold_standardizer): the model on rows
    /// standardized by `s` that computes what `self` computes on the table's units (a warm
    /// start continues a stored model under this training's standardization).
    pub fn unfold_standardizer(&self, s: &Standardizer) -> LinearModel {
        let mut m = self.clone();
        let d = self.n_features;
        for k in 0..self.n_outputs {
            let row = &mut m.weights[k * d..(k + 1) * d];
            let mut shift = 0.0;
            for (j, w) in row.iter_mut().enumerate() {
                if let Some(&scale) = s.scale.get(j) {
                    if s.center {
                        shift += *w * s.mean[j];
                    }
                    // scale is 1/std, or 1 for a constant feature: never 0.
                    *w /= scale;
                }
            }
            m.bias[k] += shift;
        }
        m
    }
}

/// What every trained model answers for a row, whatever its kind: what prediction and
/// evaluation use (implemented by [`LinearModel`],
/// [`NetworkModel`](crate::network::NetworkModel) and [`Model`](crate::trained::Model)).
pub trait Predictor {
    fn kind(&self) -> ModelKind;
    fn n_features(&self) -> usize;
    fn n_outputs(&self) -> usize;
    /// Output 0: the decision value of a two-class model, the prediction of a regression.
    fn decision(&self, row: Row) -> f64;
    /// Every output (raw scores) into `out`.
    fn scores(&self, row: Row, out: &mut Vec<f64>);
    /// ±1 for two classes, the value for a number, the class index for classes.
    fn predict(&self, row: Row) -> f64;
    /// Class probabilities into `out`, or false (and `out` empty) for kinds without them.
    fn predict_proba(&self, row: Row, out: &mut Vec<f64>) -> bool;

    /// The index of the class a row is predicted to be (two classes: 0 = negative, 1 =
    /// positive). For classifiers only.
    fn class_index(&self, row: Row) -> usize {
        if self.kind().has_class_outputs() {
            self.predict(row) as usize
        } else {
            (self.decision(row) >= 0.0) as usize
        }
    }
}

impl Predictor for LinearModel {
    fn kind(&self) -> ModelKind {
        self.kind
    }
    fn n_features(&self) -> usize {
        self.n_features
    }
    fn n_outputs(&self) -> usize {
        self.n_outputs
    }
    fn decision(&self, row: Row) -> f64 {
        LinearModel::decision(self, row)
    }
    fn scores(&self, row: Row, out: &mut Vec<f64>) {
        LinearModel::scores(self, row, out)
    }
    fn predict(&self, row: Row) -> f64 {
        LinearModel::predict(self, row)
    }
    fn predict_proba(&self, row: Row, out: &mut Vec<f64>) -> bool {
        LinearModel::predict_proba(self, row, out)
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
