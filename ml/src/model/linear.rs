//! Linear regression: squared loss 0.5·(z - y)² on the raw numeric label.

use super::{KindRules, Labels, LinearModel};
use crate::row::Row;

pub struct Linear;

impl KindRules for Linear {
    const NAME: &'static str = "linear";
    const LABELS: Labels = Labels::Number;
    const PROBABILITIES: bool = false;

    #[inline]
    fn loss(z: f64, y: f64) -> f64 {
        let r = z - y;
        0.5 * r * r
    }

    #[inline]
    fn dloss_dz(z: f64, y: f64) -> f64 {
        z - y
    }

    fn predict_proba(_: &LinearModel, _: Row, out: &mut Vec<f64>) -> bool {
        out.clear();
        false
    }

    fn predict(model: &LinearModel, row: Row) -> f64 {
        model.decision(row)
    }
}
