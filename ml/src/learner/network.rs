//! The network family (mlp, mlp_regression) as a [`Learn`]er: a [`NetworkTrainer`] with its
//! kind and the training's configuration (the learning-rate schedule it follows per epoch).

use super::{network_model, Learn, NetworkSpec};
use crate::arena::TupleArena;
use crate::model::ModelKind;
use crate::network::{Head, Network, NetworkError, NetworkTrainer, Optimizer};
use crate::trained::Model;
use crate::trainer::{EpochStats, InterruptCheck, SharedModel, TrainConfig, TrainError};

pub(super) struct NetworkLearner {
    kind: ModelKind,
    trainer: NetworkTrainer,
    config: TrainConfig,
}

fn out_of_memory(e: NetworkError) -> TrainError {
    match e {
        NetworkError::OutOfMemory { bytes } => TrainError::OutOfMemory { bytes },
        NetworkError::BadShape => unreachable!("a network's widths are checked before training"),
    }
}

impl NetworkLearner {
    pub(super) fn try_new(
        config: TrainConfig,
        spec: &NetworkSpec,
        n_features: usize,
    ) -> Result<NetworkLearner, TrainError> {
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
        Ok(NetworkLearner {
            kind: config.kind,
            trainer,
            config,
        })
    }
}

impl Learn for NetworkLearner {
    fn kind(&self) -> ModelKind {
        self.kind
    }

    fn set_interrupt(&mut self, check: Option<InterruptCheck>) {
        self.trainer.set_interrupt(check)
    }

    fn check_interrupt(&mut self) -> Result<(), TrainError> {
        self.trainer.check_interrupt()
    }

    fn start_epoch(&mut self, epoch: u32) {
        let config = &self.config;
        self.trainer
            .set_learning_rate(config.schedule.learning_rate(config.learning_rate, epoch));
        self.trainer.start_epoch(epoch);
        // Several processes: continue from the shared parameters.
        self.trainer.exchange_at_next_batch();
    }

    fn train_buffer(
        &mut self,
        arena: &TupleArena,
        order: Option<&[u32]>,
    ) -> Result<(), TrainError> {
        self.trainer.train_buffer(arena, order)
    }

    fn finish_epoch(&mut self) -> Result<EpochStats, TrainError> {
        self.trainer.exchange()?;
        Ok(self.trainer.finish_epoch())
    }

    fn result_model(&mut self) -> Option<Model> {
        let net = self.trainer.network();
        let mut params = Vec::new();
        params.try_reserve_exact(net.params.len()).ok()?;
        params.extend_from_slice(&net.params);
        let copy = Network {
            sizes: net.sizes.clone(),
            activation: net.activation,
            head: net.head,
            params,
        };
        Some(Model::Network(network_model(
            self.kind,
            copy,
            self.trainer.target(),
        )))
    }

    fn into_model(self: Box<Self>) -> Model {
        let target = self.trainer.target();
        Model::Network(network_model(
            self.kind,
            self.trainer.into_network(),
            target,
        ))
    }

    fn parameters(&mut self) -> Vec<f64> {
        self.trainer.network().params.clone()
    }

    fn n_params(&mut self) -> usize {
        self.trainer.network().params.len()
    }

    fn set_parameters(&mut self, values: &[f64]) {
        self.trainer.set_parameters(values)
    }

    fn set_exchange(&mut self, shared: SharedModel, period: u64) {
        self.trainer.set_exchange(shared, period)
    }

    fn exchange_last(&mut self) -> Result<(), TrainError> {
        self.trainer.exchange()
    }

    fn resume_optimizer(&mut self, optimizer: Optimizer) -> bool {
        self.trainer.resume_optimizer(optimizer)
    }

    fn into_optimizer(self: Box<Self>) -> Option<Optimizer> {
        Some(self.trainer.into_optimizer())
    }
}
