//! The trainer of every family trained by gradients on mini-batches (networks, factorization
//! machines) as a [`Learn`]er: a [`GradientTrainer`] of the family's [`Trainable`] model, with
//! its kind and the training's configuration (the learning-rate schedule it follows per epoch).

use super::Learn;
use crate::arena::TupleArena;
use crate::model::ModelKind;
use crate::model::Predictor;
use crate::network::{
    Activation, Differentiable, GradientTrainer, NetworkError, Optimizer, OptimizerKind, Target,
};
use crate::trained::Model;
use crate::trainer::{EpochStats, InterruptCheck, SharedModel, TrainConfig, TrainError};

/// A model a [`GradientLearner`] trains: differentiable, copied for validation, and a trained
/// model at the end.
pub trait Trainable: Differentiable + Sized + 'static {
    /// A copy, or None without memory for it.
    fn try_copy(&self) -> Option<Self>;
    /// Its shape as its trained model's stored form gives it (see
    /// [`Trained::shape`](crate::trained::Trained::shape)): a warm start continues a model of
    /// the same.
    fn shape(&self) -> (Option<Vec<usize>>, Option<Activation>);
    /// The trained model of `kind`, its regression outputs back in the label's units.
    fn into_model(self, kind: ModelKind, target: Target) -> Model;
}

pub(crate) fn out_of_memory(e: NetworkError) -> TrainError {
    match e {
        NetworkError::OutOfMemory { bytes } => TrainError::OutOfMemory { bytes },
        NetworkError::BadShape => unreachable!("a model's shape is checked before training"),
    }
}

pub(crate) struct GradientLearner<M: Trainable> {
    kind: ModelKind,
    trainer: GradientTrainer<M>,
    config: TrainConfig,
}

impl<M: Trainable> GradientLearner<M> {
    /// A learner of `model` (its initial parameters drawn), rows standardized and classes
    /// weighted as `config` says.
    pub(crate) fn try_new(
        config: TrainConfig,
        model: M,
        optimizer: OptimizerKind,
        target: Target,
    ) -> Result<GradientLearner<M>, TrainError> {
        let mut trainer = GradientTrainer::try_new(
            model,
            optimizer,
            config.learning_rate,
            config.l2,
            config.batch_size,
            target,
        )
        .map_err(out_of_memory)?;
        trainer.set_standardizer(config.standardizer.clone());
        trainer.set_class_weights(config.class_weights.clone());
        Ok(GradientLearner {
            kind: config.kind,
            trainer,
            config,
        })
    }
}

impl<M: Trainable> Learn for GradientLearner<M> {
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
        let copy = self.trainer.network().try_copy()?;
        Some(copy.into_model(self.kind, self.trainer.target()))
    }

    fn into_model(self: Box<Self>) -> Model {
        let target = self.trainer.target();
        self.trainer.into_network().into_model(self.kind, target)
    }

    fn parameters(&mut self) -> Vec<f64> {
        self.trainer.network().params().to_vec()
    }

    fn n_params(&mut self) -> usize {
        self.trainer.network().params().len()
    }

    fn set_parameters(&mut self, values: &[f64]) {
        self.trainer.set_parameters(values)
    }

    /// A model of the same kind and shape: its parameters unfolded into this learner's
    /// standardized rows and target.
    fn start_from(&mut self, stored: &Model) -> Result<bool, TrainError> {
        let model = self.trainer.network();
        if stored.kind() != self.kind || stored.shape() != model.shape() {
            return Ok(false);
        }
        let n = model.params().len();
        let values = stored
            .learner_parameters(self.config.standardizer.as_ref(), self.trainer.target())
            .map_err(|_| TrainError::OutOfMemory {
                bytes: (n as u64).saturating_mul(8),
            })?;
        if values.len() != n {
            return Ok(false);
        }
        self.trainer.set_parameters(&values);
        Ok(true)
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

    fn start_control(&mut self, correction: Vec<f64>) -> Result<bool, TrainError> {
        self.trainer
            .start_control(correction)
            .map_err(out_of_memory)
    }
}
