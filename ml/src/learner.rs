//! What the SGD node trains, whatever the kind: a linear [`Trainer`] or a [`NetworkTrainer`],
//! behind one set of calls (epochs of shuffled buffers in, statistics and a [`Model`] out).

use crate::arena::TupleArena;
use crate::model::ModelKind;
use crate::network::{
    Activation, Head, Network, NetworkError, NetworkModel, NetworkTrainer, Optimizer,
    OptimizerKind, Target, Workspace,
};
use crate::trained::Model;
use crate::trainer::{EpochStats, InterruptCheck, SharedModel, TrainConfig, TrainError, Trainer};

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

pub enum Learner {
    Linear(Trainer),
    Network {
        kind: ModelKind,
        trainer: NetworkTrainer,
        config: TrainConfig,
    },
}

fn out_of_memory(e: NetworkError) -> TrainError {
    match e {
        NetworkError::OutOfMemory { bytes } => TrainError::OutOfMemory { bytes },
        NetworkError::BadShape => unreachable!("a network's widths are checked before training"),
    }
}

impl Learner {
    /// A linear model's trainer (see [`Trainer::try_new`]).
    pub fn linear(config: TrainConfig, n_features: usize) -> Result<Learner, TrainError> {
        Trainer::try_new(config, n_features).map(Learner::Linear)
    }

    /// A network's trainer over `n_features` inputs: weights drawn from the spec's seed, rows
    /// standardized and classes weighted as `config` says.
    pub fn network(
        config: TrainConfig,
        spec: &NetworkSpec,
        n_features: usize,
    ) -> Result<Learner, TrainError> {
        let head = if config.kind.is_classifier() {
            Head::Softmax
        } else {
            Head::Linear
        };
        let net = Network::new(&spec.sizes(n_features), spec.activation, head, spec.seed)
            .map_err(out_of_memory)?;
        let mut trainer = NetworkTrainer::try_new(
            net,
            spec.optimizer,
            config.learning_rate,
            config.l2,
            config.batch_size,
            spec.target,
        )
        .map_err(out_of_memory)?;
        trainer.set_standardizer(config.standardizer.clone());
        trainer.set_class_weights(config.class_weights.clone());
        Ok(Learner::Network {
            kind: config.kind,
            trainer,
            config,
        })
    }

    pub fn set_interrupt(&mut self, check: Option<InterruptCheck>) {
        match self {
            Learner::Linear(t) => t.set_interrupt(check),
            Learner::Network { trainer, .. } => trainer.set_interrupt(check),
        }
    }

    /// Asks the learner's interrupt check now.
    pub fn check_interrupt(&mut self) -> Result<(), TrainError> {
        match self {
            Learner::Linear(t) => t.check_interrupt(),
            Learner::Network { trainer, .. } => trainer.check_interrupt(),
        }
    }

    pub fn start_epoch(&mut self, epoch: u32) {
        match self {
            Learner::Linear(t) => t.start_epoch(epoch),
            Learner::Network {
                trainer, config, ..
            } => {
                trainer
                    .set_learning_rate(config.schedule.learning_rate(config.learning_rate, epoch));
                trainer.start_epoch(epoch);
                // Several processes: continue from the shared parameters.
                trainer.exchange_at_next_batch();
            }
        }
    }

    /// The kind of model it trains.
    pub fn kind(&self) -> ModelKind {
        match self {
            Learner::Linear(t) => t.config().kind,
            Learner::Network { kind, .. } => *kind,
        }
    }

    pub fn train_buffer(
        &mut self,
        arena: &TupleArena,
        order: Option<&[u32]>,
    ) -> Result<(), TrainError> {
        match self {
            Learner::Linear(t) => t.train_buffer(arena, order),
            Learner::Network { trainer, .. } => trainer.train_buffer(arena, order),
        }
    }

    pub fn finish_epoch(&mut self) -> Result<EpochStats, TrainError> {
        match self {
            Learner::Linear(t) => t.finish_epoch(),
            Learner::Network { trainer, .. } => {
                trainer.exchange()?;
                Ok(trainer.finish_epoch())
            }
        }
    }

    /// Two-class kinds: the distinct raw label values seen (see [`Trainer::labels_seen`]).
    pub fn labels_seen(&self) -> Vec<f64> {
        match self {
            Learner::Linear(t) => t.labels_seen(),
            Learner::Network { .. } => Vec::new(),
        }
    }

    /// Two-class kinds: the (negative, positive) raw label values.
    pub fn label_map(&self) -> Option<(f64, f64)> {
        match self {
            Learner::Linear(t) => t.label_map(),
            Learner::Network { .. } => None,
        }
    }

    /// The model training would return now (for validation), or None without memory for it.
    pub fn result_model(&mut self) -> Option<Model> {
        match self {
            Learner::Linear(t) => t.result_model().map(Model::Linear),
            Learner::Network { kind, trainer, .. } => {
                let net = trainer.network();
                let mut params = Vec::new();
                params.try_reserve_exact(net.params.len()).ok()?;
                params.extend_from_slice(&net.params);
                let copy = Network {
                    sizes: net.sizes.clone(),
                    activation: net.activation,
                    head: net.head,
                    params,
                };
                Some(Model::Network(network_model(*kind, copy, trainer.target())))
            }
        }
    }

    /// The trained model (on the rows' units as trained: fold the standardizer after).
    pub fn into_model(self) -> Model {
        match self {
            Learner::Linear(t) => Model::Linear(t.into_model()),
            Learner::Network { kind, trainer, .. } => {
                let target = trainer.target();
                Model::Network(network_model(kind, trainer.into_network(), target))
            }
        }
    }

    /// Weights and biases of the model being trained.
    pub fn n_params(&mut self) -> usize {
        match self {
            Learner::Linear(t) => t.model().weights.len() + t.model().bias.len(),
            Learner::Network { trainer, .. } => trainer.network().params.len(),
        }
    }

    /// Makes the trainer exchange with `shared` (parallel workers, see `SharedModel`) every
    /// `period` tuples. The values every process starts from: zeros for a linear model, the
    /// seeded initial weights for a network ([`Learner::start_values`]).
    pub fn set_exchange(&mut self, shared: SharedModel, period: u64) {
        match self {
            Learner::Linear(t) => t.set_exchange(shared, period),
            Learner::Network { trainer, .. } => trainer.set_exchange(shared, period),
        }
    }

    /// Every parameter, flat: a linear model's weights then biases, a network's layers in
    /// order (what a shard returns to the coordinator).
    pub fn parameters(&mut self) -> Vec<f64> {
        match self {
            Learner::Linear(t) => {
                let m = t.model();
                m.weights.iter().chain(&m.bias).copied().collect()
            }
            Learner::Network { trainer, .. } => trainer.network().params.clone(),
        }
    }

    /// Continues from `values` (as [`Learner::parameters`] gives them: a shard's round starts
    /// from the coordinator's model). False if they do not fit the model's shape.
    pub fn set_parameters(&mut self, values: &[f64]) -> bool {
        if values.len() != self.n_params() {
            return false;
        }
        match self {
            Learner::Linear(t) => {
                let (weights, bias) = values.split_at(t.model().weights.len());
                t.set_model(weights, bias);
            }
            Learner::Network { trainer, .. } => trainer.set_parameters(values),
        }
        true
    }

    /// A linear learner continues from a stored model's `weights` (row-major, one row per
    /// output) and `bias` (a warm start): softmax grows to the model's classes first. False if
    /// they do not fit (another width, fewer classes than seen), or for a network.
    pub fn start_from(&mut self, weights: &[f64], bias: &[f64]) -> Result<bool, TrainError> {
        match self {
            Learner::Linear(t) => t.start_from(weights, bias),
            Learner::Network { .. } => Ok(false),
        }
    }

    /// A network continues with an optimizer state kept from an earlier round (a shard's
    /// rounds of one training); false if it does not fit, or for a linear model.
    pub fn resume_optimizer(&mut self, optimizer: Optimizer) -> bool {
        match self {
            Learner::Network { trainer, .. } => trainer.resume_optimizer(optimizer),
            Learner::Linear(_) => false,
        }
    }

    /// A network's optimizer state, to resume in the next round.
    pub fn into_optimizer(self) -> Option<Optimizer> {
        match self {
            Learner::Network { trainer, .. } => Some(trainer.into_optimizer()),
            Learner::Linear(_) => None,
        }
    }

    /// The values the shared model starts from: every process's initial parameters (zeros
    /// for a linear model, unless a warm start set them).
    pub fn start_values(&mut self) -> Vec<f64> {
        self.parameters()
    }

    /// Exchanges now (if exchanging), then adds the iterate averages (linear) to the shared
    /// ones: a process's last act in a parallel training.
    pub fn exchange_last(&mut self) -> Result<(), TrainError> {
        match self {
            Learner::Linear(t) => t.exchange().and_then(|()| t.contribute_average()),
            Learner::Network { trainer, .. } => trainer.exchange(),
        }
    }

    /// The leader, after every process's last exchange: takes the pooled iterate averages
    /// (linear models with `average`).
    pub fn adopt_shared_average(&mut self) {
        if let Learner::Linear(t) = self {
            t.adopt_shared_average();
        }
    }
}

/// A trained network as a model: a regression's outputs back in the label's units.
pub fn network_model(kind: ModelKind, net: Network, target: Target) -> NetworkModel {
    let regression = net.head == Head::Linear;
    let mut model = NetworkModel::new(kind, net);
    if regression {
        model.fold_target(target.mean, target.scale);
    }
    model
}
