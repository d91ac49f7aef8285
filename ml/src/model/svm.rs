//! Linear SVM: hinge loss, two classes.

use super::{sign, KindRules, Labels, LinearModel};
use crate::row::Row;

pub struct Svm;

impl KindRules for Svm {
    const NAME: &'static str = "svm";
    const LABELS: Labels = Labels::TwoClasses;
    const PROBABILITIES: bool = false;

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

    fn predict_proba(_: &LinearModel, _: Row, out: &mut Vec<f64>) -> bool {
        out.clear();
        false
    }

    fn predict(model: &LinearModel, row: Row) -> f64 {
        sign(model.decision(row))
    }
}
