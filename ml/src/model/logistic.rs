//! Logistic regression: log loss, two classes.

use super::{sigmoid, sign, softplus, KindRules, Labels, LinearModel};
use crate::row::Row;

pub struct Logistic;

impl KindRules for Logistic {
    const NAME: &'static str = "logistic";
    const LABELS: Labels = Labels::TwoClasses;
    const PROBABILITIES: bool = true;

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

    /// `[P(negative), P(positive)]`.
    fn predict_proba(model: &LinearModel, row: Row, out: &mut Vec<f64>) -> bool {
        let z = model.decision(row);
        out.clear();
        // Both from sigmoid so a tiny probability keeps its precision.
        out.extend([sigmoid(-z), sigmoid(z)]);
        true
    }

    fn predict(model: &LinearModel, row: Row) -> f64 {
        sign(model.decision(row))
    }
}
