//! Multinomial logistic regression over K classes (labels are class indices 0..K-1),
//! cross-entropy loss: one output per class.

use super::{softmax_loss, KindRules, Labels, LinearModel};
use crate::row::Row;

pub struct Softmax;

impl KindRules for Softmax {
    const NAME: &'static str = "softmax";
    const LABELS: Labels = Labels::Classes;
    const PROBABILITIES: bool = true;

    fn loss(_: f64, _: f64) -> f64 {
        unreachable!("softmax loss is softmax_loss()")
    }

    fn dloss_dz(_: f64, _: f64) -> f64 {
        unreachable!("softmax gradient is softmax_loss()")
    }

    /// One probability per class index.
    fn predict_proba(model: &LinearModel, row: Row, out: &mut Vec<f64>) -> bool {
        model.scores(row, out);
        if !out.is_empty() {
            softmax_loss(out, 0);
        }
        true
    }

    /// The argmax class index (ties → lowest index; NaN without classes).
    fn predict(model: &LinearModel, row: Row) -> f64 {
        let mut best: Option<(usize, f64)> = None;
        for k in 0..model.n_outputs {
            let s = model.output(k, row);
            if best.is_none_or(|(_, b)| s > b) {
                best = Some((k, s));
            }
        }
        best.map_or(f64::NAN, |(k, _)| k as f64)
    }
}
