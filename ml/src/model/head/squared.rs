//! The squared head (linear and every regression): the label as a number, squared loss
//! ½·(z − y)², the output as the prediction.

use super::{HeadRules, Likelihood, Loss, ScalarLoss};
use crate::model::Labels;

pub(super) static SQUARED: HeadRules = HeadRules {
    name: "identity",
    labels: Labels::Number,
    loss: Loss::Scalar(ScalarLoss {
        loss,
        dloss_dz,
        loss_and_dloss_dz: |z, y| (loss(z, y), dloss_dz(z, y)),
    }),
    probabilities: None,
    // ½·mean(y²), at least 1e-12 so that all-zero labels still have a bound.
    zero_model_loss: Some(|m| (0.5 * m).max(1e-12)),
    likelihood: Some(Likelihood::Linear),
};

#[inline]
fn loss(z: f64, y: f64) -> f64 {
    let r = z - y;
    0.5 * r * r
}

#[inline]
fn dloss_dz(z: f64, y: f64) -> f64 {
    z - y
}
