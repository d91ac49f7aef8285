//! The hinge head (svm): two classes, the hinge loss max(0, 1 − y·z), no probabilities.

use super::{HeadRules, Loss, ScalarLoss};
use crate::model::Labels;

pub(super) static HINGE: HeadRules = HeadRules {
    name: "sign",
    labels: Labels::TwoClasses,
    loss: Loss::Scalar(ScalarLoss {
        loss,
        dloss_dz,
        loss_and_dloss_dz: |z, y| (loss(z, y), dloss_dz(z, y)),
    }),
    probabilities: None,
    // The gradient is bounded by the row whatever the error (see `crate::divergence`).
    zero_model_loss: None,
    likelihood: None,
};

#[inline]
fn loss(z: f64, y: f64) -> f64 {
    let margin = y * z;
    if margin < 1.0 {
        1.0 - margin
    } else {
        0.0
    }
}

/// Subgradient `-y` inside the margin, else 0.
#[inline]
fn dloss_dz(z: f64, y: f64) -> f64 {
    if y * z < 1.0 {
        -y
    } else {
        0.0
    }
}
