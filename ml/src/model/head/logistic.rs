//! The logistic head: two classes, the log loss log(1 + exp(−y·z)), probabilities by the
//! sigmoid.

use super::{HeadRules, Likelihood, Loss, ScalarLoss};
use crate::model::{sigmoid, softplus, Labels};

pub(super) static LOGISTIC: HeadRules = HeadRules {
    name: "sigmoid",
    labels: Labels::TwoClasses,
    loss: Loss::Scalar(ScalarLoss {
        loss,
        dloss_dz,
        loss_and_dloss_dz,
    }),
    probabilities: Some(probabilities),
    // The gradient is bounded by the row whatever the error (see `crate::divergence`).
    zero_model_loss: None,
    likelihood: Some(Likelihood::Logistic),
};

#[inline]
fn loss(z: f64, y: f64) -> f64 {
    softplus(-(y * z))
}

#[inline]
fn dloss_dz(z: f64, y: f64) -> f64 {
    -y * sigmoid(-(y * z))
}

/// With one `exp` (the second was a measurable part of a sparse step).
#[inline]
fn loss_and_dloss_dz(z: f64, y: f64) -> (f64, f64) {
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

/// `[P(negative), P(positive)]` from the decision value, both from the sigmoid so a tiny
/// probability keeps its precision.
fn probabilities(out: &mut Vec<f64>) {
    let z = out.first().copied().unwrap_or(f64::NAN);
    out.clear();
    out.extend([sigmoid(-z), sigmoid(z)]);
}
