//! What the SGD node trains, whatever the model family. A [`Family`] says what a kind's trainer
//! and trained model are, asked by the backend instead of matching on the kind (each kind's
//! family: `crate::family`); a [`Learner`] is any family's trainer behind one trait, [`Learn`]
//! (epochs of shuffled buffers in, statistics and a [`Model`] out, a warm start from a stored
//! model; exchanging with other processes and resumed optimizers are optional). The families here:
//! `linear.rs` (the linear [`Trainer`] of svm, logistic, linear, softmax) and `network.rs`
//! (mlp, mlp_regression); `gradient.rs` is the learner of every family trained by gradients on
//! mini-batches (networks, `crate::fm`).

mod gradient;
mod linear;
mod network;

pub use gradient::Trainable;
pub(crate) use gradient::{out_of_memory, GradientLearner};
pub use linear::LinearFamily;
pub(crate) use network::optimizer_name;
pub use network::NetworkFamily;

use crate::arena::TupleArena;
use crate::model::{Head, ModelKind};
use crate::network::{
    Activation, Network, NetworkModel, Optimizer, OptimizerKind, Target, Workspace,
};
use crate::params::{ParamError, TrainParams};
use crate::standardize::Standardizer;
use crate::trained::{Model, ModelParts, PartsError};
#[cfg(test)]
use crate::trainer::Trainer;
use crate::trainer::{EpochStats, InterruptCheck, SharedModel, TrainConfig, TrainError};

/// The shape of a network to train, beyond the [`TrainConfig`] every kind has.
#[derive(Clone, Debug, PartialEq)]
pub struct NetworkSpec {
    pub hidden: Vec<usize>,
    pub activation: Activation,
    pub optimizer: OptimizerKind,
    /// Draws the initial weights.
    pub seed: u64,
    /// Classes (mlp) or 1 (mlp_regression).
    pub outputs: usize,
    /// The regression target's standardization (ignored for classes).
    pub target: Target,
}

impl NetworkSpec {
    /// Layer widths over `n_features` inputs.
    pub fn sizes(&self, n_features: usize) -> Vec<usize> {
        let mut sizes = Vec::with_capacity(self.hidden.len() + 2);
        sizes.push(n_features);
        sizes.extend_from_slice(&self.hidden);
        sizes.push(self.outputs);
        sizes
    }

    /// Bytes training holds over `n_features` inputs with batches of `batch` rows: the
    /// parameters, the optimizer's state and the batch's buffers (activations, deltas,
    /// gradient). What `corgipile.max_model_memory` is checked against before reading.
    pub fn training_bytes(&self, n_features: usize, batch: usize) -> u64 {
        let sizes = self.sizes(n_features);
        let params = Network::n_params(&sizes) as u64;
        params
            .saturating_mul(8 + Optimizer::bytes_per_param(self.optimizer))
            .saturating_add(Workspace::bytes(&sizes, batch))
    }
}

/// What every model family's trainer does. The calls a training makes, in order: `start_epoch`,
/// `train_buffer` for each buffer, `finish_epoch`; `result_model` between epochs (validation),
/// `into_model` at the end. The optional ones have defaults for a family that cannot do them.
pub trait Learn: Send {
    /// The kind of model it trains.
    fn kind(&self) -> ModelKind;
    /// The check it asks between rows (None: never).
    fn set_interrupt(&mut self, check: Option<InterruptCheck>);
    /// Asks the interrupt check now.
    fn check_interrupt(&mut self) -> Result<(), TrainError>;
    fn start_epoch(&mut self, epoch: u32);
    /// Steps on `arena`'s rows, in `order` (None: as stored).
    fn train_buffer(&mut self, arena: &TupleArena, order: Option<&[u32]>)
        -> Result<(), TrainError>;
    fn finish_epoch(&mut self) -> Result<EpochStats, TrainError>;
    /// The model training would return now (for validation), or None without memory for it.
    fn result_model(&mut self) -> Option<Model>;
    /// The trained model (on the rows' units as trained: fold the standardizer after).
    fn into_model(self: Box<Self>) -> Model;
    /// Every parameter, flat (what a shard returns to the coordinator, what processes share).
    fn parameters(&mut self) -> Vec<f64>;
    /// How many parameters (weights and biases) the model has.
    fn n_params(&mut self) -> usize;
    /// Continues from `values`, of `n_params` (checked by the caller).
    fn set_parameters(&mut self, values: &[f64]);

    /// Two-class kinds: the distinct raw label values seen.
    fn labels_seen(&self) -> Vec<f64> {
        Vec::new()
    }
    /// Two-class kinds: the (negative, positive) raw label values.
    fn label_map(&self) -> Option<(f64, f64)> {
        None
    }
    /// The scaling it applies to every dense row itself, when it can take rows scaled once for
    /// every learner instead (see `Trials::train_buffer`); None: it scales its own.
    fn row_scaling(&self) -> Option<&Standardizer> {
        None
    }
    /// Whether its steps on a buffer's rows, a chunk at a time, are its steps on the buffer
    /// (learners side by side then train chunk by chunk, each chunk in cache).
    fn trains_in_chunks(&self) -> bool {
        false
    }
    /// Exchanges with `shared` every `period` tuples (parallel workers, see `SharedModel`).
    /// A family that cannot is refused with workers before training.
    fn set_exchange(&mut self, _shared: SharedModel, _period: u64) {}
    /// Exchanges now (if exchanging) and adds what it averages to the shared model: a
    /// process's last act in a parallel training.
    fn exchange_last(&mut self) -> Result<(), TrainError> {
        Ok(())
    }
    /// The leader, after every process's last exchange: takes the pooled averages.
    fn adopt_shared_average(&mut self) {}
    /// Continues from `stored`, a model on the table's units (a warm start): its parameters
    /// unfolded into this learner's standardized units ([`Trained::learner_parameters`]), so
    /// that the first step starts from the stored function. False if it does not fit (another
    /// kind or shape, other inputs or classes).
    ///
    /// [`Trained::learner_parameters`]: crate::trained::Trained::learner_parameters
    fn start_from(&mut self, stored: &Model) -> Result<bool, TrainError>;
    /// Continues with an optimizer state kept from an earlier round (a shard's rounds of one
    /// training); false if it does not fit or the family keeps none.
    fn resume_optimizer(&mut self, _optimizer: Optimizer) -> bool {
        false
    }
    /// Its optimizer state, to resume in the next round (None: it keeps none).
    fn into_optimizer(self: Box<Self>) -> Option<Optimizer> {
        None
    }
    /// Corrects this round's steps for drift by `correction` (a shard's, see
    /// [`Optimizer::start_control`]); false if it does not fit or the family has no optimizer.
    fn start_control(&mut self, _correction: Vec<f64>) -> Result<bool, TrainError> {
        Ok(false)
    }
}

/// A model family's trainer (see [`Learn`]); its family builds it
/// ([`Family::learner`](crate::family::Family::learner)).
pub struct Learner(pub(crate) Box<dyn Learn>);

impl Learner {
    /// A linear model's trainer over `n_features` inputs (the linear family's, for tests).
    #[cfg(test)]
    pub(crate) fn linear(config: TrainConfig, n_features: usize) -> Result<Learner, TrainError> {
        Trainer::try_new(config, n_features).map(|t| Learner(Box::new(t)))
    }

    pub fn set_interrupt(&mut self, check: Option<InterruptCheck>) {
        self.0.set_interrupt(check)
    }

    /// Asks the learner's interrupt check now.
    pub fn check_interrupt(&mut self) -> Result<(), TrainError> {
        self.0.check_interrupt()
    }

    pub fn start_epoch(&mut self, epoch: u32) {
        self.0.start_epoch(epoch)
    }

    /// The kind of model it trains.
    pub fn kind(&self) -> ModelKind {
        self.0.kind()
    }

    pub fn train_buffer(
        &mut self,
        arena: &TupleArena,
        order: Option<&[u32]>,
    ) -> Result<(), TrainError> {
        self.0.train_buffer(arena, order)
    }

    pub fn finish_epoch(&mut self) -> Result<EpochStats, TrainError> {
        self.0.finish_epoch()
    }

    /// Two-class kinds: the distinct raw label values seen (see [`Trainer::labels_seen`]).
    pub fn labels_seen(&self) -> Vec<f64> {
        self.0.labels_seen()
    }

    /// Two-class kinds: the (negative, positive) raw label values.
    pub fn label_map(&self) -> Option<(f64, f64)> {
        self.0.label_map()
    }

    /// See [`Learn::row_scaling`].
    pub fn row_scaling(&self) -> Option<&Standardizer> {
        self.0.row_scaling()
    }

    /// See [`Learn::trains_in_chunks`].
    pub fn trains_in_chunks(&self) -> bool {
        self.0.trains_in_chunks()
    }

    /// The model training would return now (for validation), or None without memory for it.
    pub fn result_model(&mut self) -> Option<Model> {
        self.0.result_model()
    }

    /// The trained model (on the rows' units as trained: fold the standardizer after).
    pub fn into_model(self) -> Model {
        self.0.into_model()
    }

    /// Weights and biases of the model being trained.
    pub fn n_params(&mut self) -> usize {
        self.0.n_params()
    }

    /// Makes the trainer exchange with `shared` (parallel workers, see `SharedModel`) every
    /// `period` tuples. The values every process starts from: zeros for a linear model, the
    /// seeded initial weights for a network ([`Learner::start_values`]).
    pub fn set_exchange(&mut self, shared: SharedModel, period: u64) {
        self.0.set_exchange(shared, period)
    }

    /// Every parameter, flat: a linear model's weights then biases, a network's layers in
    /// order (what a shard returns to the coordinator).
    pub fn parameters(&mut self) -> Vec<f64> {
        self.0.parameters()
    }

    /// Continues from `values` (as [`Learner::parameters`] gives them: a shard's round starts
    /// from the coordinator's model). False if they do not fit the model's shape.
    pub fn set_parameters(&mut self, values: &[f64]) -> bool {
        if values.len() != self.n_params() {
            return false;
        }
        self.0.set_parameters(values);
        true
    }

    /// A learner continues from `stored`, a model on the table's units (a warm start; see
    /// [`Learn::start_from`]): linear softmax grows to the model's classes first. False if it
    /// does not fit (another kind or shape, another width, classes the model never had).
    pub fn start_from(&mut self, stored: &Model) -> Result<bool, TrainError> {
        self.0.start_from(stored)
    }

    /// Continues with an optimizer state kept from an earlier round (a shard's rounds of one
    /// training); false if it does not fit, or the family keeps none.
    pub fn resume_optimizer(&mut self, optimizer: Optimizer) -> bool {
        self.0.resume_optimizer(optimizer)
    }

    /// Its optimizer state, to resume in the next round.
    pub fn into_optimizer(self) -> Option<Optimizer> {
        self.0.into_optimizer()
    }

    /// Corrects this round's steps for drift (after `resume_optimizer`; see
    /// [`Optimizer::start_control`]); false if it does not fit or the family has no optimizer.
    pub fn start_control(&mut self, correction: Vec<f64>) -> Result<bool, TrainError> {
        self.0.start_control(correction)
    }

    /// The values the shared model starts from: every process's initial parameters (zeros
    /// for a linear model, unless a warm start set them).
    pub fn start_values(&mut self) -> Vec<f64> {
        self.parameters()
    }

    /// Exchanges now (if exchanging), then adds the iterate averages (linear) to the shared
    /// ones: a process's last act in a parallel training.
    pub fn exchange_last(&mut self) -> Result<(), TrainError> {
        self.0.exchange_last()
    }

    /// The leader, after every process's last exchange: takes the pooled iterate averages
    /// (linear models with `average`).
    pub fn adopt_shared_average(&mut self) {
        self.0.adopt_shared_average()
    }
}

/// A trained network as a model: a regression's outputs back in the label's units.
pub fn network_model(kind: ModelKind, net: Network, target: Target) -> NetworkModel {
    let regression = net.head == Head::SQUARED;
    let mut model = NetworkModel::new(kind, net);
    if regression {
        model.fold_target(target.mean, target.scale);
    }
    model
}

/// What a trainer is built over beyond its configuration: the inputs, and for families sized by
/// the statistics pass, their outputs (classes, or 1) and the regression target.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    pub n_features: usize,
    pub outputs: usize,
    pub target: Target,
}

/// What training a model holds, checked against `corgipile.max_model_memory` before it is
/// built.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainingSize {
    /// The model in words, for the ERROR: "a network of layers 10 x 64 x 2".
    pub what: String,
    /// Parameters it stores.
    pub n_params: u64,
    /// Bytes training holds: the parameters, the optimizer's state and a batch's scratch.
    pub bytes: u64,
    /// How to make it smaller.
    pub hint: &'static str,
    /// Its shape as EXPLAIN ANALYZE shows it: ("Layers", "10 x 64 x 2").
    pub shown: (&'static str, String),
}

/// A model family (see the module's doc).
pub trait Family: Sync {
    /// The family in words, after a kind's name: "svm is a linear model".
    fn noun(&self) -> &'static str;
    /// Whether its trainer needs the classes and the label's moments of the statistics pass
    /// before it is built (its outputs are the classes): the training always makes that pass.
    fn sized_by_statistics(&self) -> bool {
        false
    }
    /// The least a default buffer holds, in bytes of the table (up to all of it): how much of a
    /// table the family needs shuffled at once (see `BufferSize::at_least`).
    fn default_buffer_floor(&self) -> u64 {
        0
    }
    /// How a column list's number columns are encoded when their options do not say (see
    /// `preprocess::Encode`): the value itself for linear models, whose coefficient per column
    /// users read; piecewise-linear bins for the families that were more accurate with them
    /// (`make bench-quality`).
    fn default_number_encoding(&self) -> crate::preprocess::Encode {
        crate::preprocess::Encode::Plain
    }
    /// The params only its kinds (and perhaps another family's) take.
    fn own_keys(&self) -> &'static [&'static str] {
        &[]
    }
    /// Fills in its defaults where they differ from a linear model's (for the keys not
    /// `given`), and refuses what it cannot take.
    fn defaults(
        &self,
        _params: &mut TrainParams,
        _given: &dyn Fn(&str) -> bool,
    ) -> Result<(), ParamError> {
        Ok(())
    }
    /// The params that fix the shape of `stored` (a model of this family), as the params'
    /// JSON gives them: a warm start that leaves them out takes these, one that asks for
    /// others is refused (see `ModelKind::shape_mismatch`).
    fn shape_params(&self, _stored: &Model) -> Vec<(&'static str, serde_json::Value)> {
        Vec::new()
    }
    /// Its params as EXPLAIN shows them, beyond every kind's.
    fn explain_params(&self, _params: &TrainParams) -> Vec<(&'static str, String)> {
        Vec::new()
    }
    /// What training it holds, for families sized by the statistics pass (None: the trainer
    /// checks its own memory as it grows).
    fn training_size(&self, _params: &TrainParams, _shape: &Shape) -> Option<TrainingSize> {
        None
    }
    /// Its trainer for one learner of a training.
    fn learner(
        &self,
        config: TrainConfig,
        params: &TrainParams,
        shape: &Shape,
    ) -> Result<Learner, TrainError>;
    /// Its model from its stored form (every number already checked finite), if the parts
    /// have the shape they say.
    fn model_from(&self, parts: ModelParts) -> Result<Model, PartsError>;
}
