//! The linear family (svm, logistic, linear, softmax): its trainer is the SGD [`Trainer`], its
//! model a [`LinearModel`].

use super::{Family, Shape};
use super::{Learn, Learner};
use crate::arena::TupleArena;
use crate::model::Predictor;
use crate::model::{LinearModel, ModelKind};
use crate::network::Target;
use crate::params::TrainParams;
use crate::standardize::Standardizer;
use crate::trained::{try_zeros, Layer, Model, ModelParts, OutOfMemory, PartsError, Trained};
use crate::trainer::{EpochStats, InterruptCheck, SharedModel, TrainConfig, TrainError, Trainer};

/// The linear family (see [`Family`]).
pub struct LinearFamily;

impl Family for LinearFamily {
    fn noun(&self) -> &'static str {
        "a linear model"
    }

    fn learner(
        &self,
        config: TrainConfig,
        _params: &TrainParams,
        shape: &Shape,
    ) -> Result<Learner, TrainError> {
        let softmax = config.kind.has_class_outputs();
        let mut t = Trainer::try_new(config, shape.n_features)?;
        // A softmax grows its classes as rows meet them, unless the shape names them (parallel
        // workers: the leader numbered them all).
        if softmax && shape.outputs > 1 {
            t.grow_classes(shape.outputs)?;
        }
        Ok(Learner(Box::new(t)))
    }

    fn model_from(&self, parts: ModelParts) -> Result<Model, PartsError> {
        let ModelParts {
            kind,
            n_features,
            n_outputs,
            weights,
            bias,
            layers,
            activation,
        } = parts;
        if layers.is_some()
            || activation.is_some()
            || n_outputs == 0
            || n_features.checked_mul(n_outputs) != Some(weights.len())
            || bias.len() != n_outputs
        {
            return Err(PartsError::BadShape(
                "a linear model of another shape than it says",
            ));
        }
        Ok(Model::new(LinearModel {
            kind,
            n_features,
            n_outputs,
            weights,
            bias,
        }))
    }
}

impl Trained for LinearModel {
    fn fold_standardizer(&mut self, s: &Standardizer) {
        *self = LinearModel::fold_standardizer(self, s);
    }

    fn n_params(&self) -> usize {
        self.weights.len() + self.bias.len()
    }

    fn to_parts(&self) -> ModelParts {
        ModelParts {
            kind: self.kind,
            n_features: self.n_features,
            n_outputs: self.n_outputs,
            weights: self.weights.clone(),
            bias: self.bias.clone(),
            layers: None,
            activation: None,
        }
    }

    fn clone_box(&self) -> Box<dyn Trained> {
        Box::new(self.clone())
    }

    /// Exact: output `output` is a sum over features.
    fn attribute(&self, x: &[f64], x0: &[f64], output: usize) -> Result<Vec<f64>, OutOfMemory> {
        let mut out = try_zeros(self.n_features)?;
        let w = self.output_weights(output);
        for (o, (w, (a, b))) in out.iter_mut().zip(w.iter().zip(x.iter().zip(x0))) {
            *o = w * (a - b);
        }
        Ok(out)
    }

    fn scoring_work(&self, row_width: usize) -> usize {
        row_width * self.n_outputs
    }

    /// One layer, input-major like a network's (stored output-major).
    fn layers(&self) -> Result<Vec<Layer>, OutOfMemory> {
        let (d, k) = (self.n_features, self.n_outputs);
        let mut weights = Vec::new();
        weights.try_reserve_exact(d * k).map_err(|_| OutOfMemory)?;
        weights.extend(
            (0..d)
                .flat_map(|j| (0..k).map(move |o| (j, o)))
                .map(|(j, o)| self.weights[o * d + j]),
        );
        Ok(vec![Layer {
            inputs: d,
            outputs: k,
            activation: self.kind.head().name.to_owned(),
            weights,
            biases: self.bias.clone(),
        }])
    }

    /// Its weights then its biases, unfolded (a linear trainer's target is the label itself).
    fn learner_parameters(
        &self,
        s: Option<&Standardizer>,
        _target: Target,
    ) -> Result<Vec<f64>, OutOfMemory> {
        let unfolded = s.map(|s| self.unfold_standardizer(s));
        let m = unfolded.as_ref().unwrap_or(self);
        let mut out = Vec::new();
        out.try_reserve_exact(m.weights.len() + m.bias.len())
            .map_err(|_| OutOfMemory)?;
        out.extend_from_slice(&m.weights);
        out.extend_from_slice(&m.bias);
        Ok(out)
    }

    fn as_linear(&self) -> Option<&LinearModel> {
        Some(self)
    }
}

impl Learn for Trainer {
    fn kind(&self) -> ModelKind {
        self.config().kind
    }

    fn set_interrupt(&mut self, check: Option<InterruptCheck>) {
        Trainer::set_interrupt(self, check)
    }

    fn check_interrupt(&mut self) -> Result<(), TrainError> {
        Trainer::check_interrupt(self)
    }

    fn start_epoch(&mut self, epoch: u32) {
        Trainer::start_epoch(self, epoch)
    }

    fn train_buffer(
        &mut self,
        arena: &TupleArena,
        order: Option<&[u32]>,
    ) -> Result<(), TrainError> {
        Trainer::train_buffer(self, arena, order)
    }

    fn finish_epoch(&mut self) -> Result<EpochStats, TrainError> {
        Trainer::finish_epoch(self)
    }

    fn result_model(&mut self) -> Option<Model> {
        Trainer::result_model(self).map(Model::new)
    }

    fn into_model(self: Box<Self>) -> Model {
        Model::new(Trainer::into_model(*self))
    }

    fn parameters(&mut self) -> Vec<f64> {
        let m = self.model();
        m.weights.iter().chain(&m.bias).copied().collect()
    }

    fn n_params(&mut self) -> usize {
        self.model().weights.len() + self.model().bias.len()
    }

    fn set_parameters(&mut self, values: &[f64]) {
        let (weights, bias) = values.split_at(self.model().weights.len());
        self.set_model(weights, bias);
    }

    fn labels_seen(&self) -> Vec<f64> {
        Trainer::labels_seen(self)
    }

    fn label_map(&self) -> Option<(f64, f64)> {
        Trainer::label_map(self)
    }

    fn row_scaling(&self) -> Option<&Standardizer> {
        self.config().standardizer.as_ref()
    }

    fn trains_in_chunks(&self) -> bool {
        true
    }

    fn set_exchange(&mut self, shared: SharedModel, period: u64) {
        Trainer::set_exchange(self, shared, period)
    }

    fn exchange_last(&mut self) -> Result<(), TrainError> {
        self.exchange().and_then(|()| self.contribute_average())
    }

    fn adopt_shared_average(&mut self) {
        Trainer::adopt_shared_average(self)
    }

    /// A linear model's weights and biases, unfolded into this trainer's standardized units;
    /// softmax grows to the model's classes first (see [`Trainer::start_from`]).
    fn start_from(&mut self, stored: &Model) -> Result<bool, TrainError> {
        if stored.as_linear().is_none() {
            return Ok(false);
        }
        let values = stored
            .learner_parameters(self.config().standardizer.as_ref(), Target::new(0.0, 1.0))
            .map_err(|_| TrainError::OutOfMemory {
                bytes: (stored.n_params() as u64).saturating_mul(8),
            })?;
        let (weights, bias) = values.split_at(stored.n_features() * stored.n_outputs());
        Trainer::start_from(self, weights, bias)
    }
}
