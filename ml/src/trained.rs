//! A trained model of any family: what the catalog stores and loads, prediction and evaluation
//! use, and a training returns. Every family's model implements [`Trained`]; a [`Model`] holds
//! one, whatever its family, and [`ModelParts`] is its stored and wire form (each family builds
//! its model back from them, checking every shape: see [`Family::model_from`]).
//!
//! [`Family::model_from`]: crate::family::Family::model_from

use crate::model::{LinearModel, ModelKind, Predictor};
use crate::network::{Activation, Target};
use crate::row::Row;
use crate::standardize::Standardizer;

/// Out of memory while describing or explaining a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfMemory;

/// A zeroed vector of `n`, or [`OutOfMemory`] instead of an abort.
pub fn try_zeros(n: usize) -> Result<Vec<f64>, OutOfMemory> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| OutOfMemory)?;
    v.resize(n, 0.0);
    Ok(v)
}

/// One layer of a model as `corgipile_layers` shows it: its weights input-major (`inputs` rows
/// of `outputs`), its biases (none for a layer without).
#[derive(Clone, Debug, PartialEq)]
pub struct Layer {
    pub inputs: usize,
    pub outputs: usize,
    /// What the layer applies to its outputs (`relu`, `tanh`, or the head: `softmax`, `sigmoid`,
    /// `sign`, `identity`), or what the layer is (`factors`).
    pub activation: String,
    pub weights: Vec<f64>,
    pub biases: Vec<f64>,
}

/// What every family's trained model does beyond predicting (see [`Predictor`]).
pub trait Trained: Predictor + Send + Sync + std::fmt::Debug {
    /// The same model on the table's units, for one trained on rows standardized by `s`.
    fn fold_standardizer(&mut self, s: &Standardizer);
    /// How many parameters (weights, biases, factors) it has.
    fn n_params(&self) -> usize;
    /// Its stored and wire form.
    fn to_parts(&self) -> ModelParts;
    fn clone_box(&self) -> Box<dyn Trained>;
    /// Each feature's share of output `output` going from `x0` to `x` (both dense, the model's
    /// width; `output` below its outputs). What the shares leave out is the caller's residual.
    fn attribute(&self, x: &[f64], x0: &[f64], output: usize) -> Result<Vec<f64>, OutOfMemory>;
    /// The work of scoring one row, in multiply-adds, for a row of `row_width` values.
    fn scoring_work(&self, row_width: usize) -> usize;
    /// The model layer by layer.
    fn layers(&self) -> Result<Vec<Layer>, OutOfMemory>;
    /// Its shape as its stored form gives it: [`ModelParts`]' layers and activation (none for
    /// a linear model).
    fn shape(&self) -> (Option<Vec<usize>>, Option<Activation>) {
        (None, None)
    }
    /// A warm start: the parameters its family's learner holds to compute what this model
    /// computes (flat, in `Learn::parameters`' order), for a learner of its shape that trains
    /// on rows standardized by `s` and on a regression target standardized by `target`: the
    /// inverse of [`fold_standardizer`](Self::fold_standardizer) and of the target's folding.
    fn learner_parameters(
        &self,
        s: Option<&Standardizer>,
        target: Target,
    ) -> Result<Vec<f64>, OutOfMemory>;
    /// The linear model, for what only linear models have (coefficients, p-values).
    fn as_linear(&self) -> Option<&LinearModel> {
        None
    }
}

/// A trained model of any family.
pub struct Model(Box<dyn Trained>);

impl Model {
    pub fn new(trained: impl Trained + 'static) -> Model {
        Model(Box::new(trained))
    }

    /// The same model on the table's units, for one trained on standardized rows.
    pub fn fold_standardizer(mut self, s: &Standardizer) -> Model {
        self.0.fold_standardizer(s);
        self
    }

    /// The linear model, for what only linear models have (coefficients, shards, workers).
    pub fn as_linear(&self) -> Option<&LinearModel> {
        self.0.as_linear()
    }

    /// Weights and biases (every parameter) this model has.
    pub fn n_params(&self) -> usize {
        self.0.n_params()
    }

    pub fn to_parts(&self) -> ModelParts {
        self.0.to_parts()
    }

    /// See [`Trained::attribute`].
    pub fn attribute(&self, x: &[f64], x0: &[f64], output: usize) -> Result<Vec<f64>, OutOfMemory> {
        self.0.attribute(x, x0, output)
    }

    /// See [`Trained::scoring_work`].
    pub fn scoring_work(&self, row_width: usize) -> usize {
        self.0.scoring_work(row_width)
    }

    /// See [`Trained::layers`].
    pub fn layers(&self) -> Result<Vec<Layer>, OutOfMemory> {
        self.0.layers()
    }

    /// See [`Trained::shape`].
    pub fn shape(&self) -> (Option<Vec<usize>>, Option<Activation>) {
        self.0.shape()
    }

    /// See [`Trained::learner_parameters`].
    pub fn learner_parameters(
        &self,
        s: Option<&Standardizer>,
        target: Target,
    ) -> Result<Vec<f64>, OutOfMemory> {
        self.0.learner_parameters(s, target)
    }
}

impl Clone for Model {
    fn clone(&self) -> Model {
        Model(self.0.clone_box())
    }
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq for Model {
    /// The same stored form: the same kind, shape and parameters.
    fn eq(&self, other: &Model) -> bool {
        self.to_parts() == other.to_parts()
    }
}

impl Predictor for Model {
    fn kind(&self) -> ModelKind {
        self.0.kind()
    }
    fn n_features(&self) -> usize {
        self.0.n_features()
    }
    fn n_outputs(&self) -> usize {
        self.0.n_outputs()
    }
    fn decision(&self, row: Row) -> f64 {
        self.0.decision(row)
    }
    fn scores(&self, row: Row, out: &mut Vec<f64>) {
        self.0.scores(row, out)
    }
    fn predict(&self, row: Row) -> f64 {
        self.0.predict(row)
    }
    fn predict_proba(&self, row: Row, out: &mut Vec<f64>) -> bool {
        self.0.predict_proba(row, out)
    }
}

/// A model as the catalog stores it and as it travels between servers (a stored model a shard
/// scores): the catalog's columns. Whoever calls a shard, or wrote the catalog row, may have
/// made it, so [`ModelParts::into_model`] checks every shape before it builds anything.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelParts {
    pub kind: ModelKind,
    pub n_features: usize,
    pub n_outputs: usize,
    /// Linear: `n_outputs × n_features`, row-major; other families: as their `from_parts` says.
    pub weights: Vec<f64>,
    pub bias: Vec<f64>,
    /// Families with layers: every layer's width, input first (`n_features`) and output last
    /// (`n_outputs`). None for linear models.
    pub layers: Option<Vec<usize>>,
    /// Networks: the hidden layers' activation.
    pub activation: Option<Activation>,
}

/// Why parts make no model.
#[derive(Clone, Debug, PartialEq)]
pub enum PartsError {
    /// The parts do not have the shape they say, or a number is not finite.
    BadShape(&'static str),
    OutOfMemory {
        bytes: u64,
    },
}

impl std::fmt::Display for PartsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PartsError::BadShape(why) => f.write_str(why),
            PartsError::OutOfMemory { bytes } => write!(f, "out of memory ({bytes} bytes)"),
        }
    }
}

impl ModelParts {
    pub fn kind(&self) -> ModelKind {
        self.kind
    }

    pub fn n_features(&self) -> usize {
        self.n_features
    }

    pub fn n_outputs(&self) -> usize {
        self.n_outputs
    }

    /// Every weight and bias is a finite number.
    pub fn finite(&self) -> bool {
        self.weights.iter().chain(&self.bias).all(|x| x.is_finite())
    }

    /// The model, if its parts have the shape they say and every number is finite (the kind's
    /// family checks its own shapes).
    pub fn into_model(self) -> Result<Model, PartsError> {
        if !self.finite() {
            return Err(PartsError::BadShape(
                "a model with a number that is not finite",
            ));
        }
        self.kind.family().model_from(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Head;
    use crate::network::{Network, NetworkModel};

    fn network() -> Model {
        let net = Network::new(&[3, 4, 2], Activation::Tanh, Head::SOFTMAX, 1).unwrap();
        Model::new(NetworkModel::new(ModelKind::Mlp, net))
    }

    #[test]
    fn a_model_round_trips_through_its_parts() {
        let linear = Model::new(LinearModel {
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
        let parts = network().to_parts();
        let with = |layers: Vec<usize>, weights: Vec<f64>, kind: ModelKind| ModelParts {
            kind,
            n_features: layers.first().copied().unwrap_or(0),
            n_outputs: layers.last().copied().unwrap_or(0),
            layers: Some(layers),
            weights,
            ..parts.clone()
        };
        let (layers, weights) = (parts.layers.clone().unwrap(), parts.weights.clone());
        let mut nan = weights.clone();
        nan[0] = f64::NAN;
        let mut no_layers = parts.clone();
        no_layers.layers = None;
        let mut linear_with_layers = LinearModel::new(ModelKind::Logistic, 3, 1);
        linear_with_layers.weights[0] = 1.0;
        let mut linear_with_layers = Model::new(linear_with_layers).to_parts();
        linear_with_layers.layers = Some(vec![3, 1, 1]);
        for bad in [
            with(vec![3, 4, 3], weights.clone(), parts.kind),
            with(vec![3, 0, 2], weights.clone(), parts.kind),
            with(vec![12, 2], weights.clone(), parts.kind),
            // Widths whose product overflows are refused, not multiplied.
            with(vec![usize::MAX, usize::MAX, 2], weights.clone(), parts.kind),
            with(layers.clone(), weights[1..].to_vec(), parts.kind),
            with(layers.clone(), nan, parts.kind),
            with(layers.clone(), weights.clone(), ModelKind::Logistic),
            no_layers,
            linear_with_layers,
        ] {
            assert!(bad.clone().into_model().is_err(), "{bad:?}");
        }
    }
}
