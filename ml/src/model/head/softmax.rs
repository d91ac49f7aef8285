//! The softmax head (softmax and every classifier of classes): one output per class
//! (labels are class indices 0..K-1), softmax and cross-entropy.

use super::{HeadRules, Loss};
use crate::model::{softmax_loss, Labels};

pub(super) static SOFTMAX: HeadRules = HeadRules {
    name: "softmax",
    labels: Labels::Classes,
    loss: Loss::CrossEntropy,
    probabilities: Some(probabilities),
    // The gradient is bounded by the row whatever the error (see `crate::divergence`).
    zero_model_loss: None,
    likelihood: None,
};

/// One probability per class index, from the scores.
#[allow(clippy::ptr_arg)] // the type of `HeadRules::probabilities`: logistic's resizes `out`
fn probabilities(out: &mut Vec<f64>) {
    if !out.is_empty() {
        softmax_loss(out, 0);
    }
}
