//! The network family (mlp, mlp_regression): its trainer a [`NetworkTrainer`] with its kind and
//! the training's configuration (the learning-rate schedule it follows per epoch), its model a
//! [`NetworkModel`].

use super::gradient::{out_of_memory, GradientLearner, Trainable};
use super::{network_model, Learner, NetworkSpec};
use super::{Family, Shape, TrainingSize};
use crate::model::{Head, ModelKind};
use crate::network::{Activation, Network, NetworkError, NetworkModel, OptimizerKind, Target};
use crate::params::{ParamError, TrainParams};
use crate::standardize::Standardizer;
use crate::trained::{Layer, Model, ModelParts, OutOfMemory, PartsError, Trained};
use crate::trainer::{TrainConfig, TrainError};

/// The network family (see [`Family`]).
pub struct NetworkFamily;

/// The shape and optimizer of a network `params` ask for over `shape`.
fn spec(params: &TrainParams, shape: &Shape) -> NetworkSpec {
    NetworkSpec {
        hidden: params.network_hidden(),
        activation: params.activation.unwrap_or(Activation::Relu),
        optimizer: params.network_optimizer(),
        seed: params.seed.unwrap_or(0),
        outputs: shape.outputs,
        target: shape.target,
    }
}

/// An optimizer as EXPLAIN shows it.
pub(crate) fn optimizer_name(params: &TrainParams) -> String {
    match params.network_optimizer() {
        OptimizerKind::Adam => "adam".to_string(),
        OptimizerKind::Sgd { momentum } => format!("sgd (momentum {momentum})"),
    }
}

impl Family for NetworkFamily {
    fn noun(&self) -> &'static str {
        "a network"
    }

    fn sized_by_statistics(&self) -> bool {
        true
    }

    fn default_buffer_floor(&self) -> u64 {
        crate::params::GRADIENT_BUFFER_FLOOR
    }

    /// Piecewise-linear bins: on `make bench-quality`'s seven tables they were more accurate on
    /// five (up to +9.5 points for an mlp, +39 for an fm on 22 classes of 3 columns).
    fn default_number_encoding(&self) -> crate::preprocess::Encode {
        crate::preprocess::Encode::Ple
    }

    fn own_keys(&self) -> &'static [&'static str] {
        &["hidden", "activation", "optimizer", "momentum"]
    }

    fn defaults(
        &self,
        params: &mut TrainParams,
        given: &dyn Fn(&str) -> bool,
    ) -> Result<(), ParamError> {
        params.hidden.get_or_insert_with(|| vec![64]);
        params.activation.get_or_insert(Activation::Relu);
        params.gradient_defaults(given, "mlp and mlp_regression")
    }

    /// Its hidden layers' widths and their activation.
    fn shape_params(&self, stored: &Model) -> Vec<(&'static str, serde_json::Value)> {
        let (Some(layers), Some(activation)) = stored.shape() else {
            return Vec::new();
        };
        if layers.len() < 3 {
            return Vec::new();
        }
        vec![
            ("hidden", serde_json::json!(layers[1..layers.len() - 1])),
            ("activation", serde_json::json!(activation.name())),
        ]
    }

    fn explain_params(&self, params: &TrainParams) -> Vec<(&'static str, String)> {
        let hidden: Vec<String> = params
            .network_hidden()
            .iter()
            .map(|w| w.to_string())
            .collect();
        let activation = params.activation.map_or("relu", |a| a.name());
        vec![
            (
                "Hidden Layers",
                format!("{} ({activation})", hidden.join(", ")),
            ),
            ("Optimizer", optimizer_name(params)),
        ]
    }

    fn training_size(&self, params: &TrainParams, shape: &Shape) -> Option<TrainingSize> {
        let spec = spec(params, shape);
        let sizes = spec.sizes(shape.n_features);
        let shown: Vec<String> = sizes.iter().map(|n| n.to_string()).collect();
        Some(TrainingSize {
            what: format!("a network of layers {}", shown.join(" x ")),
            shown: ("Layers", shown.join(" x ")),
            n_params: Network::n_params(&sizes) as u64,
            bytes: spec.training_bytes(shape.n_features, params.batch_size as usize),
            hint: "Use narrower or fewer \"hidden\" layers",
        })
    }

    fn learner(
        &self,
        config: TrainConfig,
        params: &TrainParams,
        shape: &Shape,
    ) -> Result<Learner, TrainError> {
        let spec = spec(params, shape);
        let head = config.kind.head();
        let net = Network::new(
            &spec.sizes(shape.n_features),
            spec.activation,
            head,
            spec.seed,
        )
        .map_err(out_of_memory)?;
        GradientLearner::try_new(config, net, spec.optimizer, spec.target)
            .map(|n| Learner(Box::new(n)))
    }

    fn model_from(&self, parts: ModelParts) -> Result<Model, PartsError> {
        let bad = PartsError::BadShape("a network of another shape than it says");
        let (Some(layers), Some(activation)) = (parts.layers, parts.activation) else {
            return Err(bad);
        };
        // Input, 1 to 16 hidden layers, output (the `hidden` param's bounds).
        let mut n_weights = Some(0usize);
        for w in layers.windows(2) {
            n_weights =
                n_weights.and_then(|n| w[0].checked_mul(w[1]).and_then(|k| n.checked_add(k)));
        }
        let n_biases = layers[1.min(layers.len())..]
            .iter()
            .try_fold(0usize, |n, &w| n.checked_add(w));
        if !(3..=18).contains(&layers.len())
            || layers.contains(&0)
            || layers.first() != Some(&parts.n_features)
            || layers.last() != Some(&parts.n_outputs)
            || n_weights != Some(parts.weights.len())
            || n_biases != Some(parts.bias.len())
        {
            return Err(bad);
        }
        match NetworkModel::from_parts(parts.kind, layers, activation, &parts.weights, &parts.bias)
        {
            Ok(m) => Ok(Model::new(m)),
            Err(NetworkError::OutOfMemory { bytes }) => Err(PartsError::OutOfMemory { bytes }),
            Err(NetworkError::BadShape) => Err(bad),
        }
    }
}

impl Trained for NetworkModel {
    fn fold_standardizer(&mut self, s: &Standardizer) {
        NetworkModel::fold_standardizer(self, s)
    }

    fn n_params(&self) -> usize {
        self.net().params.len()
    }

    fn to_parts(&self) -> ModelParts {
        let (weights, bias) = self.weights_and_biases();
        let (layers, activation) = Trained::shape(self);
        ModelParts {
            kind: self.kind,
            n_features: self.n_features(),
            n_outputs: self.n_outputs(),
            weights,
            bias,
            layers,
            activation,
        }
    }

    fn shape(&self) -> (Option<Vec<usize>>, Option<Activation>) {
        self.net().shape()
    }

    /// Its parameters with the target's folding undone (a regression), then the
    /// standardizer's.
    fn learner_parameters(
        &self,
        s: Option<&Standardizer>,
        target: Target,
    ) -> Result<Vec<f64>, OutOfMemory> {
        let mut m = NetworkModel::new(self.kind, self.net().try_copy().ok_or(OutOfMemory)?);
        if self.net().head == Head::SQUARED {
            m.unfold_target(target.mean, target.scale);
        }
        if let Some(s) = s {
            m.unfold_standardizer(s);
        }
        Ok(m.into_network().params)
    }

    fn clone_box(&self) -> Box<dyn Trained> {
        Box::new(self.clone())
    }

    /// Integrated gradients along the straight line from `x0` to `x`.
    fn attribute(&self, x: &[f64], x0: &[f64], output: usize) -> Result<Vec<f64>, OutOfMemory> {
        self.net()
            .integrated_gradients(x0, x, output)
            .map(|a| a.per_feature)
            .map_err(|_| OutOfMemory)
    }

    fn scoring_work(&self, _row_width: usize) -> usize {
        self.net().params.len()
    }

    /// Its hidden layers, then its output layer.
    fn layers(&self) -> Result<Vec<Layer>, OutOfMemory> {
        let (weights, biases) = self.weights_and_biases();
        let sizes = &self.net().sizes;
        let (mut w_at, mut b_at) = (0, 0);
        Ok(sizes
            .windows(2)
            .enumerate()
            .map(|(l, w)| {
                let activation = if l + 2 == sizes.len() {
                    self.kind.head().name
                } else {
                    self.net().activation.name()
                };
                let layer = Layer {
                    inputs: w[0],
                    outputs: w[1],
                    activation: activation.to_owned(),
                    weights: weights[w_at..w_at + w[0] * w[1]].to_vec(),
                    biases: biases[b_at..b_at + w[1]].to_vec(),
                };
                w_at += w[0] * w[1];
                b_at += w[1];
                layer
            })
            .collect())
    }
}

impl Trainable for Network {
    fn try_copy(&self) -> Option<Network> {
        let mut params = Vec::new();
        params.try_reserve_exact(self.params.len()).ok()?;
        params.extend_from_slice(&self.params);
        Some(Network {
            sizes: self.sizes.clone(),
            activation: self.activation,
            head: self.head,
            params,
        })
    }

    fn shape(&self) -> (Option<Vec<usize>>, Option<Activation>) {
        (Some(self.sizes.clone()), Some(self.activation))
    }

    fn into_model(self, kind: ModelKind, target: Target) -> Model {
        Model::new(network_model(kind, self, target))
    }
}
