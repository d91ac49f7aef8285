//! Model families: what a kind's trainer and trained model are. Every kind belongs to one
//! family (its registration in `model/mod.rs`); the backend asks the family, never which family
//! it is: how its trainer is built and sized, which params only it takes, and how its model is
//! built back from its stored form. The families: linear (`learner/linear.rs`), network
//! (`learner/network.rs`), factorization machine (`fm/`).

use crate::learner::Learner;
use crate::model::ModelKind;
use crate::network::Target;
use crate::params::{ParamError, TrainParams};
use crate::trained::{Model, ModelParts, PartsError};
use crate::trainer::{TrainConfig, TrainError};

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

impl ModelKind {
    /// The keys some family takes that `kind`'s does not: (the key, the kinds that take it).
    pub fn foreign_key(self, given: &dyn Fn(&str) -> bool) -> Option<(&'static str, String)> {
        let own = self.family().own_keys();
        let key = ModelKind::ALL
            .iter()
            .flat_map(|k| k.family().own_keys())
            .find(|key| given(key) && !own.contains(key))?;
        let takers: Vec<&str> = ModelKind::ALL
            .iter()
            .filter(|k| k.family().own_keys().contains(key))
            .map(|k| k.name())
            .collect();
        let takers = match takers.split_last() {
            Some((last, [])) => last.to_string(),
            Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
            None => String::new(),
        };
        Some((key, takers))
    }
}

/// Every key some family owns (the params a linear model's JSON leaves out when unset).
pub fn family_keys() -> impl Iterator<Item = &'static str> {
    ModelKind::ALL
        .into_iter()
        .flat_map(|k| k.family().own_keys().iter().copied())
}
