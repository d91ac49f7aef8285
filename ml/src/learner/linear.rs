//! The linear family (svm, logistic, linear, softmax) as a [`Learn`]er: the SGD [`Trainer`].

use super::Learn;
use crate::arena::TupleArena;
use crate::model::ModelKind;
use crate::standardize::Standardizer;
use crate::trained::Model;
use crate::trainer::{EpochStats, InterruptCheck, SharedModel, TrainError, Trainer};

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
        Trainer::result_model(self).map(Model::Linear)
    }

    fn into_model(self: Box<Self>) -> Model {
        Model::Linear(Trainer::into_model(*self))
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

    fn start_from(&mut self, weights: &[f64], bias: &[f64]) -> Result<bool, TrainError> {
        Trainer::start_from(self, weights, bias)
    }
}
