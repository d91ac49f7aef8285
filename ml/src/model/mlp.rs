//! Multilayer perceptrons: `mlp` (classes, a softmax output layer over K classes, cross-entropy)
//! and `mlp_regression` (a number, one linear output, squared loss). Hidden layers come before
//! the output: a [`Network`](crate::network::Network) is trained and predicts for them. The
//! output layer's rules are those of the linear kinds with the same head (softmax, linear), so
//! the rules below, which score a [`LinearModel`], are theirs.

use super::linear::Linear;
use super::softmax::Softmax;
use super::{KindRules, Labels, LinearModel};
use crate::row::Row;

pub struct Mlp;

impl KindRules for Mlp {
    const NAME: &'static str = "mlp";
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

pub struct MlpRegression;

impl KindRules for MlpRegression {
    const NAME: &'static str = "mlp_regression";
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
