//! The models a training trains side by side on the same buffers: one per configuration of a
//! search and, with "folds", one per fold beside each (see corgipile_ml::trials).

use super::SgdNode;
use crate::pg::error::raise_train_error;
use crate::pipeline::ValidationStats;
use corgipile_ml::learner::Learner;
use corgipile_ml::params::search::{best_of, SelectBy};
use corgipile_ml::params::Configuration;
use corgipile_ml::standardize::Standardizer;
use corgipile_ml::trainer::{TrainConfig, TrainError};
use corgipile_ml::trials::Trials;
use pgrx::pg_sys;

impl SgdNode {
    /// The learners of a training over `n_features` inputs: per configuration, with "folds",
    /// one per fold (holding it out), then the one of every row (the model stored); without,
    /// that one alone. `learned`: the trainer configuration with what the statistics pass
    /// learned (moved into the one learner of a training that copies nothing). Also returns
    /// each learner's configuration and the fold it holds out.
    pub(super) unsafe fn side_by_side(
        &mut self,
        configurations: &[Configuration],
        learned: TrainConfig,
        n_features: usize,
        searching: bool,
    ) -> (Trials, Vec<usize>, Vec<Option<usize>>) {
        let params = &self.config.params;
        let normalize = params.normalize;
        let double_buffer = params.double_buffer;
        let folds = params.folds.unwrap_or(0) as usize;
        let copies = searching || folds > 0;
        let mut learners = Vec::with_capacity(configurations.len() * (folds + 1));
        let mut learner_config = Vec::with_capacity(learners.capacity());
        let mut learner_fold = Vec::with_capacity(learners.capacity());
        let mut train_config = Some(learned);
        for (c, (_, trial_params)) in configurations.iter().enumerate() {
            for fold in (0..folds).map(Some).chain([None]) {
                let config = if copies {
                    // A learner learns as its params say, from what the statistics pass
                    // learned (its own copy of the scaling: as many features as the table has).
                    let learned = train_config.as_ref().expect("kept while copying");
                    let mut config = trial_params.train_config(self.config.model);
                    config.standardizer = learned.standardizer.as_ref().map(copy_scaling);
                    config.class_weights = learned.class_weights.clone();
                    config.label_values = learned.label_values;
                    config
                } else {
                    train_config
                        .take()
                        .expect("one learner without a search or folds")
                };
                let learner = match self.network_spec(n_features, trial_params) {
                    Some(spec) => {
                        self.network_sizes
                            .get_or_insert_with(|| spec.sizes(n_features));
                        Learner::network(config, &spec, n_features)
                    }
                    None => Learner::linear(config, n_features),
                };
                learners.push((
                    learner.unwrap_or_else(|e| raise_train_error(e, &self.label_text(), normalize)),
                    fold,
                ));
                learner_config.push(c);
                learner_fold.push(fold);
            }
        }
        let mut trainer = Trials::with_folds(learners, folds);
        if double_buffer && trainer.len() > 1 {
            // Several models (a search, folds): the SGD thread trains them on up to
            // 1 + max_parallel_workers_per_gather threads, at most one per core. Not
            // single-buffered, where the learners' interrupt checks call PostgreSQL.
            // SAFETY: a plain read of a GUC variable, on the backend thread.
            let helpers = unsafe { pg_sys::max_parallel_workers_per_gather }.max(0) as usize;
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            trainer.set_threads(cores.min(1 + helpers));
        }
        (trainer, learner_config, learner_fold)
    }
}

/// A copy of the scaling for another model (its size follows the table's features: an ERROR,
/// never an abort, when it cannot be allocated).
pub(super) fn copy_scaling(s: &Standardizer) -> Standardizer {
    s.try_clone().unwrap_or_else(|| {
        let bytes = 16 * s.mean.len() as u64;
        raise_train_error(TrainError::OutOfMemory { bytes }, &|v| v.to_string(), false)
    })
}

/// A search's NOTICE for one epoch: how many configurations train, and the best validation
/// score so far with its configuration.
pub(super) fn search_line(
    epoch: u32,
    epochs: u32,
    scored: &[(usize, Option<ValidationStats>)],
    configurations: &[Configuration],
    select_by: SelectBy,
) -> String {
    let score = |v: &ValidationStats| match select_by {
        SelectBy::Accuracy => v.accuracy,
        SelectBy::R2 => v.r2,
        SelectBy::Loss => Some(v.loss),
    };
    let scores: Vec<Option<f64>> = scored
        .iter()
        .map(|(_, v)| v.as_ref().and_then(score))
        .collect();
    let best = best_of(select_by, &scores).map(|b| {
        let (i, _) = scored[b];
        format!(
            "; best validation {} {:.4}: {}",
            select_by.name(),
            scores[b].unwrap_or(f64::NAN),
            serde_json::Value::Object(configurations[i].0.clone())
        )
    });
    format!(
        "epoch {epoch}/{epochs}: {} of {} configurations trained{}",
        scored.len(),
        configurations.len(),
        best.unwrap_or_default()
    )
}
