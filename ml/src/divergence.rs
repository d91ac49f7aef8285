//! When a training has diverged: the one rule for a training on one server and for the
//! coordinator of a sharded table (the caller raises the ERROR, and stores nothing).
//!
//! A loss that is NaN or infinite has diverged, whatever the kind. A regression's squared loss
//! can also grow without bound while staying finite: its gradient grows with the error, so a
//! step too large overshoots by more every step (measured: `linear` on 500 random features at
//! the default learning rate, loss 1e22 after 5 epochs, R² −4e23). Such a model is worse than
//! predicting 0 for every row by orders of magnitude: a regression whose loss is more than
//! [`DIVERGED_FACTOR`] times the zero model's (every weight and bias 0, loss ½·mean(y²)) has
//! diverged too. A classifier's loss (hinge, logistic, cross-entropy) has a gradient bounded by
//! its row whatever the error: its weights grow at most linearly with its steps, and a large
//! but finite loss is a model of too large a scale (raw features), not one running away; it is
//! refused only when not finite.

use crate::model::ModelKind;

/// A regression whose loss is more than this many times the zero model's has diverged.
pub const DIVERGED_FACTOR: f64 = 1000.0;

/// The mean loss of the zero model of `kind` (every weight and bias 0) on rows whose labels
/// have the mean square `label_square_mean` (mean(y²) = variance + mean²): ½·mean(y²) for a
/// regression (at least 1e-12, so that all-zero labels still have a bound), None for a
/// classifier (see the module's documentation).
pub fn zero_model_loss(kind: ModelKind, label_square_mean: f64) -> Option<f64> {
    kind.head().zero_model_loss(label_square_mean)
}

/// Whether an epoch's (mean) training loss says the training diverged: NaN or infinite, or
/// more than [`DIVERGED_FACTOR`] times `zero_model_loss` (see [`zero_model_loss`]; None: only
/// a loss that is not finite).
pub fn diverged(loss: f64, zero_model_loss: Option<f64>) -> bool {
    !loss.is_finite() || zero_model_loss.is_some_and(|zero| loss > DIVERGED_FACTOR * zero)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(name: &str) -> ModelKind {
        name.parse().expect("a model kind")
    }

    #[test]
    fn a_regression_diverges_beyond_a_thousand_zero_models() {
        // Labels of mean 3 and variance 4: mean(y²) = 13, the zero model's loss 6.5.
        let zero = zero_model_loss(kind("linear"), 13.0);
        assert_eq!(zero, Some(6.5));
        assert!(!diverged(6.5, zero));
        assert!(!diverged(6500.0, zero));
        assert!(diverged(6500.001, zero));
        assert!(diverged(1e22, zero));
        assert_eq!(zero_model_loss(kind("mlp_regression"), 2.0), Some(1.0));
    }

    #[test]
    fn nan_and_infinity_diverge_whatever_the_kind() {
        for name in [
            "svm",
            "logistic",
            "softmax",
            "mlp",
            "linear",
            "mlp_regression",
        ] {
            let zero = zero_model_loss(kind(name), 1.0);
            for loss in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
                assert!(diverged(loss, zero), "{name} {loss}");
            }
            assert!(!diverged(0.25, zero), "{name}");
        }
        assert!(diverged(f64::NAN, None) && !diverged(1e300, None));
    }

    #[test]
    fn a_classifier_with_a_large_finite_loss_has_not_diverged() {
        // A hinge loss of 1e6: raw features of scale 1e4, not a run-away model.
        for name in ["svm", "logistic", "softmax", "mlp"] {
            let zero = zero_model_loss(kind(name), 1.0);
            assert_eq!(zero, None, "{name}");
            assert!(!diverged(1e6, zero), "{name}");
        }
    }

    #[test]
    fn all_zero_labels_keep_a_bound() {
        let zero = zero_model_loss(kind("linear"), 0.0);
        assert_eq!(zero, Some(1e-12));
        assert!(!diverged(1e-10, zero));
        assert!(diverged(1e-8, zero));
    }
}
