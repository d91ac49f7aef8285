//! A trained model of any kind: what the catalog stores and loads, prediction and evaluation
//! use, and a training returns.

use crate::model::{LinearModel, ModelKind, Predictor};
use crate::network::NetworkModel;
use crate::row::Row;
use crate::standardize::Standardizer;

#[derive(Clone, Debug, PartialEq)]
pub enum Model {
    Linear(LinearModel),
    Network(NetworkModel),
}

impl Model {
    /// The same model on the table's units, for one trained on standardized rows.
    pub fn fold_standardizer(self, s: &Standardizer) -> Model {
        match self {
            Model::Linear(m) => Model::Linear(m.fold_standardizer(s)),
            Model::Network(mut m) => {
                m.fold_standardizer(s);
                Model::Network(m)
            }
        }
    }

    /// The linear model, for what only linear models have (coefficients, shards, workers).
    pub fn as_linear(&self) -> Option<&LinearModel> {
        match self {
            Model::Linear(m) => Some(m),
            Model::Network(_) => None,
        }
    }

    /// Weights and biases (every parameter) this model has.
    pub fn n_params(&self) -> usize {
        match self {
            Model::Linear(m) => m.weights.len() + m.bias.len(),
            Model::Network(m) => m.net().params.len(),
        }
    }
}

impl Predictor for Model {
    fn kind(&self) -> ModelKind {
        match self {
            Model::Linear(m) => m.kind,
            Model::Network(m) => m.kind,
        }
    }
    fn n_features(&self) -> usize {
        match self {
            Model::Linear(m) => m.n_features,
            Model::Network(m) => m.n_features(),
        }
    }
    fn n_outputs(&self) -> usize {
        match self {
            Model::Linear(m) => m.n_outputs,
            Model::Network(m) => m.n_outputs(),
        }
    }
    fn decision(&self, row: Row) -> f64 {
        match self {
            Model::Linear(m) => m.decision(row),
            Model::Network(m) => m.decision(row),
        }
    }
    fn scores(&self, row: Row, out: &mut Vec<f64>) {
        match self {
            Model::Linear(m) => m.scores(row, out),
            Model::Network(m) => m.scores(row, out),
        }
    }
    fn predict(&self, row: Row) -> f64 {
        match self {
            Model::Linear(m) => m.predict(row),
            Model::Network(m) => m.predict(row),
        }
    }
    fn predict_proba(&self, row: Row, out: &mut Vec<f64>) -> bool {
        match self {
            Model::Linear(m) => m.predict_proba(row, out),
            Model::Network(m) => m.predict_proba(row, out),
        }
    }
}
