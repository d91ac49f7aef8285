//! Output heads: what a model's outputs mean and how they are scored, one table per head
//! ([`HeadRules`]), whatever family computes the outputs. A kind is a family and a head
//! (`mlp` is a network under the softmax head, `fm_regression` a factorization machine under
//! the squared head); the registration list in `model/mod.rs` pairs them.

use std::fmt;

use crate::model::{argmax, sign, Labels};
use serde::{Deserialize, Serialize};

mod hinge;
mod logistic;
mod softmax;
mod squared;

/// The rules of one output head. Each head's file holds one `static` of it.
pub struct HeadRules {
    /// The function of the outputs, as `corgipile_layers` names it.
    pub name: &'static str,
    /// What the head learns from the label column.
    pub labels: Labels,
    pub loss: Loss,
    /// Turns the outputs (raw scores) into class probabilities in place; None for a head
    /// without probabilities.
    pub probabilities: Option<fn(&mut Vec<f64>)>,
    /// The loss of the zero model (every parameter 0) on labels of mean square `m`, for heads
    /// whose loss can grow without bound while staying finite (see `crate::divergence`).
    pub zero_model_loss: Option<fn(m: f64) -> f64>,
    /// The likelihood a linear model under this head maximizes, for standard errors and
    /// p-values (`"inference"`); None where none is built.
    pub likelihood: Option<Likelihood>,
}

/// The likelihood a linear model's loss is the negative logarithm of, which gives its
/// coefficients standard errors and tests (`crate::inference`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Likelihood {
    /// Labels 0/1, the log loss; z tests.
    Logistic,
    /// Labels as they are, squared error; t tests.
    Linear,
}

/// How a head's outputs are scored against a label.
#[derive(Clone, Copy, Debug)]
pub enum Loss {
    /// One output `z` against the label `y` (±1 for two classes, the number for a regression).
    Scalar(ScalarLoss),
    /// One output per class, softmax and cross-entropy against the class index (see
    /// [`softmax_loss`](super::softmax_loss)).
    CrossEntropy,
}

/// A loss of one output.
#[derive(Clone, Copy, Debug)]
pub struct ScalarLoss {
    pub loss: fn(z: f64, y: f64) -> f64,
    /// d loss / d z.
    pub dloss_dz: fn(z: f64, y: f64) -> f64,
    /// `(loss(z, y), dloss_dz(z, y))`, bit for bit (the SGD step needs both; a head may share
    /// work between them).
    pub loss_and_dloss_dz: fn(z: f64, y: f64) -> (f64, f64),
}

/// A head: a handle on its rules ([`HeadRules`], through `Deref`). Two heads are equal when
/// they are the same head.
#[derive(Clone, Copy)]
pub struct Head(&'static HeadRules);

impl Head {
    /// Two classes, the hinge loss (svm).
    pub const HINGE: Head = Head(&hinge::HINGE);
    /// Two classes, the log loss, probabilities by the sigmoid (logistic).
    pub const LOGISTIC: Head = Head(&logistic::LOGISTIC);
    /// A number, squared loss ½·(z − y)² (linear and every regression).
    pub const SQUARED: Head = Head(&squared::SQUARED);
    /// Classes, one output each, softmax and cross-entropy (softmax and every classifier of
    /// classes).
    pub const SOFTMAX: Head = Head(&softmax::SOFTMAX);

    /// The prediction from the outputs: ±1 for two classes (z >= 0 → +1), the value for a
    /// number, the class index of the largest output for classes (ties → the lowest; NaN
    /// without outputs).
    pub fn predict(self, outputs: &[f64]) -> f64 {
        match self.labels {
            Labels::TwoClasses => sign(outputs.first().copied().unwrap_or(f64::NAN)),
            Labels::Number => outputs.first().copied().unwrap_or(f64::NAN),
            Labels::Classes => argmax(outputs).map_or(f64::NAN, |k| k as f64),
        }
    }

    /// Class probabilities from the outputs (raw scores) in `out`, in place; false (and `out`
    /// empty) for a head without them.
    pub fn probabilities(self, out: &mut Vec<f64>) -> bool {
        match self.0.probabilities {
            Some(f) => {
                f(out);
                true
            }
            None => {
                out.clear();
                false
            }
        }
    }

    /// The mean loss of the zero model on labels of mean square `label_square_mean`, or None
    /// (see [`HeadRules::zero_model_loss`]).
    pub fn zero_model_loss(self, label_square_mean: f64) -> Option<f64> {
        self.0.zero_model_loss.map(|f| f(label_square_mean))
    }

    /// The loss of one output, for the heads that have one.
    pub fn scalar(self) -> Option<ScalarLoss> {
        match self.0.loss {
            Loss::Scalar(f) => Some(f),
            Loss::CrossEntropy => None,
        }
    }

    /// The loss of a batch's `outputs` (`labels.len()` rows of them: probabilities for a
    /// cross-entropy head, which the model computes in its forward pass; values otherwise) and
    /// `delta`, d mean-loss / d output of each row, of a batch of `1 / inv_b` rows; `weights`:
    /// each row's weight on the loss, or empty for 1. Returns the rows' summed (weighted) loss.
    pub fn delta(
        self,
        outputs: &[f64],
        labels: &[f64],
        weights: &[f64],
        inv_b: f64,
        delta: &mut [f64],
    ) -> f64 {
        if labels.is_empty() {
            return 0.0;
        }
        let n_out = outputs.len() / labels.len();
        let mut loss = 0.0;
        for (i, ((d, o), &y)) in delta
            .chunks_exact_mut(n_out)
            .zip(outputs.chunks_exact(n_out))
            .zip(labels)
            .enumerate()
        {
            let w = weights.get(i).copied().unwrap_or(1.0);
            match self.0.loss {
                Loss::CrossEntropy => {
                    let k = y as usize;
                    loss -= w * o[k].max(f64::MIN_POSITIVE).ln();
                    for (j, (dj, &oj)) in d.iter_mut().zip(o).enumerate() {
                        *dj = w * (oj - f64::from(u8::from(j == k))) * inv_b;
                    }
                }
                Loss::Scalar(f) => {
                    let (l, dl) = f.loss_and_dloss_dz(o[0], y);
                    loss += w * l;
                    d[0] = w * dl * inv_b;
                }
            }
        }
        loss
    }
}

impl std::ops::Deref for Head {
    type Target = HeadRules;

    fn deref(&self) -> &HeadRules {
        self.0
    }
}

impl PartialEq for Head {
    fn eq(&self, other: &Head) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for Head {}

impl fmt::Debug for Head {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.name)
    }
}

impl ScalarLoss {
    #[inline]
    pub fn loss(&self, z: f64, y: f64) -> f64 {
        (self.loss)(z, y)
    }

    #[inline]
    pub fn dloss_dz(&self, z: f64, y: f64) -> f64 {
        (self.dloss_dz)(z, y)
    }

    #[inline]
    pub fn loss_and_dloss_dz(&self, z: f64, y: f64) -> (f64, f64) {
        (self.loss_and_dloss_dz)(z, y)
    }
}
