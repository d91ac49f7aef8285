//! A learner of any family, built over the shape the statistics pass learned (the classes and
//! the label's moments, for families sized by it) and checked against
//! `corgipile.max_model_memory` before anything of it is allocated.

use super::SgdNode;
use crate::pg::error::raise_train_error;
use corgipile_ml::learner::Learner;
use corgipile_ml::learner::{Shape, TrainingSize};
use corgipile_ml::model::ModelKind;
use corgipile_ml::network::Target;
use corgipile_ml::params::TrainParams;
use corgipile_ml::trainer::{TrainConfig, TrainError};

/// The shape of a learner of a family not sized by the statistics pass: its inputs only.
pub fn inputs_only(n_features: usize) -> Shape {
    Shape {
        n_features,
        outputs: 1,
        target: Target::new(0.0, 1.0),
    }
}

/// What training a model of `kind` as `params` ask over `shape` holds (None for families that
/// check their own memory as they grow), checked against `max_bytes` (ERROR 54000).
pub fn checked_size(
    kind: ModelKind,
    params: &TrainParams,
    shape: &Shape,
    max_bytes: u64,
) -> Option<TrainingSize> {
    let size = kind.family().training_size(params, shape)?;
    crate::pg::guc::check_training_size(&size, max_bytes);
    Some(size)
}

/// The learner of `kind` as `params` ask over `shape`, its size checked against `max_bytes`
/// first.
pub fn checked_learner(
    kind: ModelKind,
    config: TrainConfig,
    params: &TrainParams,
    shape: &Shape,
    max_bytes: u64,
) -> Result<Learner, TrainError> {
    checked_size(kind, params, shape, max_bytes);
    kind.family().learner(config, params, shape)
}

impl SgdNode {
    /// The shape of a learner of `kind` over `n_features` inputs: for families sized by the
    /// statistics pass, its classes (ERROR with fewer than two) and the label's moments.
    pub(super) fn learner_shape(&self, n_features: usize, kind: ModelKind) -> Shape {
        if !kind.family().sized_by_statistics() {
            let mut shape = inputs_only(n_features);
            if kind.has_class_outputs() && self.numbers_classes_for_workers() {
                // Every process's softmax has the leader's classes from the start (the shared
                // model's size), rather than growing them as its rows meet them.
                // SAFETY: as below.
                shape.outputs = unsafe { self.shuffle() }.rows().classes().len();
            }
            return shape;
        }
        let outputs = if kind.is_classifier() {
            // SAFETY: the child's TupleShuffle state lives as long as this node (see `shuffle`); no
            // other reference to it is in use here.
            let classes = unsafe { self.shuffle() }.rows().classes().len();
            if classes < 2 {
                self.one_class();
            }
            classes
        } else {
            1
        };
        let (mean, variance) = self.label_moments.unwrap_or((0.0, 1.0));
        Shape {
            n_features,
            outputs,
            target: Target::new(mean, variance.sqrt()),
        }
    }

    /// The learner of `kind` for `params` (the training's, or one configuration's of a search)
    /// and `config` over `n_features` inputs, its size checked first and kept for EXPLAIN.
    pub(super) fn learner(
        &mut self,
        kind: ModelKind,
        config: TrainConfig,
        params: &TrainParams,
        n_features: usize,
    ) -> Learner {
        let shape = self.learner_shape(n_features, kind);
        if let Some(size) = checked_size(kind, params, &shape, self.config.max_model_bytes) {
            self.model_size.get_or_insert(size);
        }
        let normalize = params.normalize;
        kind.family()
            .learner(config, params, &shape)
            .unwrap_or_else(|e| raise_train_error(e, &self.label_text(), normalize))
    }
}
