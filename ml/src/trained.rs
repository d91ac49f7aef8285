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

/// A model as it travels between servers (a stored model a shard scores): a linear model as
/// it is, a network in its catalog form. Whoever calls a shard may have written it, so
/// [`ModelParts::into_model`] checks every shape before it builds anything.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum ModelParts {
    Linear(LinearModel),
    Network {
        kind: ModelKind,
        /// Layer widths, input first (`n_features`) and output last.
        layers: Vec<usize>,
        activation: crate::network::Activation,
        weights: Vec<f64>,
        biases: Vec<f64>,
    },
}

impl Model {
    pub fn to_parts(&self) -> ModelParts {
        match self {
            Model::Linear(m) => ModelParts::Linear(m.clone()),
            Model::Network(m) => {
                let (weights, biases) = m.weights_and_biases();
                ModelParts::Network {
                    kind: m.kind,
                    layers: m.net().sizes.clone(),
                    activation: m.net().activation,
                    weights,
                    biases,
                }
            }
        }
    }
}

impl ModelParts {
    pub fn kind(&self) -> ModelKind {
        match self {
            ModelParts::Linear(m) => m.kind,
            ModelParts::Network { kind, .. } => *kind,
        }
    }

    /// Inputs and outputs (0 for a network without layers: `into_model` refuses it).
    pub fn n_features(&self) -> usize {
        match self {
            ModelParts::Linear(m) => m.n_features,
            ModelParts::Network { layers, .. } => layers.first().copied().unwrap_or(0),
        }
    }

    pub fn n_outputs(&self) -> usize {
        match self {
            ModelParts::Linear(m) => m.n_outputs,
            ModelParts::Network { layers, .. } => layers.last().copied().unwrap_or(0),
        }
    }

    /// The model, if its parts have the shape they say and every number is finite.
    pub fn into_model(self) -> Result<Model, String> {
        let finite = |v: &[f64]| v.iter().all(|x| x.is_finite());
        match self {
            ModelParts::Linear(m) => {
                if m.kind.is_network()
                    || m.n_outputs == 0
                    || m.n_features.checked_mul(m.n_outputs) != Some(m.weights.len())
                    || m.bias.len() != m.n_outputs
                    || !finite(&m.weights)
                    || !finite(&m.bias)
                {
                    return Err("a linear model of another shape than it says".into());
                }
                Ok(Model::Linear(m))
            }
            ModelParts::Network {
                kind,
                layers,
                activation,
                weights,
                biases,
            } => {
                // Input, 1 to 16 hidden layers, output (the `hidden` param's bounds).
                let mut n_weights = Some(0usize);
                for w in layers.windows(2) {
                    n_weights = n_weights
                        .and_then(|n| w[0].checked_mul(w[1]).and_then(|k| n.checked_add(k)));
                }
                let n_biases = layers[1.min(layers.len())..]
                    .iter()
                    .try_fold(0usize, |n, &w| n.checked_add(w));
                if !kind.is_network()
                    || !(3..=18).contains(&layers.len())
                    || layers.contains(&0)
                    || n_weights != Some(weights.len())
                    || n_biases != Some(biases.len())
                    || !finite(&weights)
                    || !finite(&biases)
                {
                    return Err("a network of another shape than it says".into());
                }
                NetworkModel::from_parts(kind, layers, activation, &weights, &biases)
                    .map(Model::Network)
                    .map_err(|e| e.to_string())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::{Activation, Head, Network};

    fn network() -> Model {
        let net = Network::new(&[3, 4, 2], Activation::Tanh, Head::Softmax, 1).unwrap();
        Model::Network(NetworkModel::new(ModelKind::Mlp, net))
    }

    #[test]
    fn a_model_round_trips_through_its_parts() {
        let linear = Model::Linear(LinearModel {
            kind: ModelKind::Logistic,
            n_features: 2,
            n_outputs: 1,
            weights: vec![0.5, -1.0],
            bias: vec![0.25],
        });
        for m in [linear, network()] {
            let json = serde_json::to_string(&m.to_parts()).unwrap();
            let parts: ModelParts = serde_json::from_str(&json).unwrap();
            assert_eq!(parts.n_features(), m.n_features());
            assert_eq!(parts.n_outputs(), m.n_outputs());
            assert_eq!(parts.into_model().unwrap(), m);
        }
    }

    #[test]
    fn parts_of_another_shape_are_refused() {
        let ModelParts::Network {
            kind,
            layers,
            activation,
            weights,
            biases,
        } = network().to_parts()
        else {
            unreachable!()
        };
        let with = |layers: Vec<usize>, weights: Vec<f64>, kind: ModelKind| ModelParts::Network {
            kind,
            layers,
            activation,
            weights,
            biases: biases.clone(),
        };
        let mut nan = weights.clone();
        nan[0] = f64::NAN;
        for bad in [
            with(vec![3, 4, 3], weights.clone(), kind),
            with(vec![3, 0, 2], weights.clone(), kind),
            with(vec![12, 2], weights.clone(), kind),
            // Widths whose product overflows are refused, not multiplied.
            with(vec![usize::MAX, usize::MAX, 2], weights.clone(), kind),
            with(layers.clone(), weights[1..].to_vec(), kind),
            with(layers.clone(), nan, kind),
            with(layers.clone(), weights.clone(), ModelKind::Logistic),
        ] {
            assert!(bad.into_model().is_err());
        }
    }
}
