//! Factorization machines (`crate::fm`): `fm` (classes, a softmax output over K classes,
//! cross-entropy) and `fm_regression` (a number, one linear output, squared loss). A machine is
//! trained and predicts for them, not a [`LinearModel`]; the rules below, which score one, are
//! those of the linear kinds with the same head (softmax, linear), as for networks.

use super::linear::Linear;
use super::softmax::Softmax;
use super::{KindRules, Labels, LinearModel};
use crate::row::Row;

/// `fm`: classes, one output per class, softmax and cross-entropy.
pub struct Fm;

impl KindRules for Fm {
    const NAME: &'static str = "fm";
    const LABELS: Labels = Labels::Classes;
    const PROBABILITIES: bool = true;

    fn loss(z: f64, y: f64) -> f64 {
        Softmax::loss(z, y)
    }
    fn dloss_dz(z: f64, y: f64) -> f64 {
        Softmax::dloss_dz(z, y)
    }
    fn predict_proba(model: &LinearModel, row: Row, out: &mut Vec<f64>) -> bool {
        Softmax::predict_proba(model, row, out)
    }
    fn predict(model: &LinearModel, row: Row) -> f64 {
        Softmax::predict(model, row)
    }
}

/// `fm_regression`: a number, squared loss.
pub struct FmRegression;

impl KindRules for FmRegression {
    const NAME: &'static str = "fm_regression";
    const LABELS: Labels = Labels::Number;
    const PROBABILITIES: bool = false;

    fn loss(z: f64, y: f64) -> f64 {
        Linear::loss(z, y)
    }
    fn dloss_dz(z: f64, y: f64) -> f64 {
        Linear::dloss_dz(z, y)
    }
    fn predict_proba(model: &LinearModel, row: Row, out: &mut Vec<f64>) -> bool {
        Linear::predict_proba(model, row, out)
    }
    fn predict(model: &LinearModel, row: Row) -> f64 {
        Linear::predict(model, row)
    }
}
