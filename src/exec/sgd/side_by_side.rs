//! The models a training trains side by side on the same buffers: one per configuration of a
//! search and, with "folds", one per fold beside each; with "group_by", one per group beside
//! the model of every row (see corgipile_ml::trials).

use super::collect::CollectedRows;
use super::{checked_size, SgdNode};
use crate::exec::tuple_shuffle::TupleShuffle;
use crate::parallel::Team;
use crate::pg::error::{notice, raise};
use crate::pg::error::{raise_labels_error, raise_train_error};
use crate::pipeline::GroupsFound;
use crate::pipeline::ValidationStats;
use corgipile_ml::fit::LearnerPlan;
use corgipile_ml::limits::{model_memory_bytes, pretty_bytes};
use corgipile_ml::model::Predictor;
use corgipile_ml::params::search::configuration_kind;
use corgipile_ml::params::Configuration;
use corgipile_ml::params::TrainParams;
use corgipile_ml::scoring::{BinaryLabels, ValidationPart, ValidationScore};
use corgipile_ml::standardize::Standardizer;
use corgipile_ml::trained::Model;
use corgipile_ml::trainer::{settle_labels, TrainConfig, TrainError};
use corgipile_ml::trials::Trials;
use pgrx::{check_for_interrupts, pg_sys, PgSqlErrorCode};

impl SgdNode {
    /// The learners of a training over `n_features` inputs: per configuration, with "folds",
    /// one per fold (holding it out), then the one of every row (the model stored); without,
    /// that one alone. `learned`: the trainer configuration with what the statistics pass
    /// learned (moved into the one learner of a training that copies nothing). Also returns
    /// who each learner is (its configuration and the fold it holds out).
    pub(super) fn side_by_side(
        &mut self,
        configurations: &[Configuration],
        learned: TrainConfig,
        n_features: usize,
        searching: bool,
    ) -> (Trials, LearnerPlan) {
        let params = &self.config.params.clone();
        let double_buffer = params.double_buffer;
        let folds = params.folds.unwrap_or(0) as usize;
        let copies = searching || folds > 0;
        let mut learners = Vec::with_capacity(configurations.len() * (folds + 1));
        let mut learner_config = Vec::with_capacity(learners.capacity());
        let mut learner_fold = Vec::with_capacity(learners.capacity());
        let mut train_config = Some(learned);
        for (c, (configuration, trial_params)) in configurations.iter().enumerate() {
            let kind = configuration_kind(configuration, self.config.model);
            for fold in (0..folds).map(Some).chain([None]) {
                let config = if copies {
                    // A learner learns as its params say, from what the statistics pass
                    // learned (its own copy of the scaling: as many features as the table has).
                    let learned = train_config.as_ref().expect("kept while copying");
                    let mut config = trial_params.train_config(kind);
                    config.standardizer = learned.standardizer.as_ref().map(copy_scaling);
                    config.class_weights = learned.class_weights.clone();
                    config.label_values = learned.label_values;
                    if trial_params.class_weight != params.class_weight {
                        // A searched class_weight: this configuration's own weights, and the
                        // labels settled as training it alone settles them.
                        let (values, weights) = self.class_weights_of(trial_params);
                        config.label_values = values;
                        config.class_weights = weights;
                    }
                    config
                } else {
                    train_config
                        .take()
                        .expect("one learner without a search or folds")
                };
                let learner = self.learner(kind, config, trial_params, n_features);
                learners.push((learner, fold));
                learner_config.push(c);
                learner_fold.push(fold);
            }
        }
        let mut trainer = Trials::with_folds(learners, folds);
        if double_buffer && trainer.len() > 1 {
            // Several models (a search, folds): the SGD thread trains them on several threads.
            // Not single-buffered, where the learners' interrupt checks call PostgreSQL.
            trainer.set_threads(side_by_side_threads());
        }
        let group = vec![None; learner_config.len()];
        let plan = LearnerPlan {
            configuration: learner_config,
            fold: learner_fold,
            group,
        };
        (trainer, plan)
    }
}

impl SgdNode {
    /// Per-group models: the model of every row (first: the labels it saw speak for the
    /// training), then one per group of `groups` (the keys and rows of the groups that get a
    /// model, then how many groups and rows are too small), all with `params`. Their memory,
    /// all together, is checked against corgipile.max_model_memory before any is built.
    pub(super) fn per_group(
        &mut self,
        params: &TrainParams,
        learned: TrainConfig,
        n_features: usize,
        groups: &GroupsFound,
    ) -> (Trials, LearnerPlan) {
        let kept = &groups.kept;
        let min_rows = params.min_group_rows.unwrap_or(1);
        if self.verbose {
            notice(groups_notice(groups, min_rows));
        }
        let models = kept.len() as u64 + 1;
        let kind = self.config.model;
        let shape = self.learner_shape(n_features, kind);
        let size = checked_size(kind, params, &shape, self.config.max_model_bytes);
        let each = PER_MODEL_BYTES
            + match &size {
                Some(size) => size.bytes,
                None => {
                    let outputs = if self.config.model.has_class_outputs() {
                        // SAFETY: the child's TupleShuffle state lives as long as this node (see `shuffle`); no
                        // other reference to it is in use here.
                        unsafe { self.shuffle() }.rows().classes().len().max(2) as u64
                    } else {
                        1
                    };
                    model_memory_bytes(n_features as u64, outputs)
                }
            };
        check_family_memory(models, each, params.workers, min_rows);
        let mut learners = Vec::with_capacity(models as usize);
        for group in std::iter::once(None).chain((0..kept.len() as u32).map(Some)) {
            let mut config = params.train_config(self.config.model);
            config.standardizer = learned.standardizer.as_ref().map(copy_scaling);
            config.class_weights = learned.class_weights.clone();
            config.label_values = learned.label_values;
            let learner = self.learner(kind, config, params, n_features);
            learners.push((learner, group));
        }
        let learner_group: Vec<Option<u32>> = learners.iter().map(|(_, g)| *g).collect();
        let n = learners.len();
        let mut trainer = Trials::with_groups(learners, kept.len());
        if self.config.params.double_buffer {
            trainer.set_threads(side_by_side_threads());
        }
        let plan = LearnerPlan {
            configuration: vec![0; n],
            fold: vec![None; n],
            group: learner_group,
        };
        (trainer, plan)
    }
}

/// Beyond its weights, each per-group model's trainer holds its own state and scratch.
pub(crate) const PER_MODEL_BYTES: u64 = 16 << 10;

/// Per-group models: `models` of `each` bytes (one per group of at least `min_rows` rows, and
/// the model of every row), in every process of `workers` and in shared memory, must fit in
/// corgipile.max_model_memory (one server's rule, and a sharded training's coordinator's).
pub(crate) fn check_family_memory(models: u64, each: u64, workers: u32, min_rows: u64) {
    let total = crate::pg::guc::max_model_bytes();
    // With workers, every process holds every model, and shared memory one more of each.
    let (copies, where_) = match workers {
        0 => (1, String::new()),
        w => (
            u64::from(w) + 2,
            format!(
                "; with \"workers\": {w}, one copy in each of {} processes and one in shared memory",
                w + 1
            ),
        ),
    };
    if each.saturating_mul(models).saturating_mul(copies) > total {
        raise(
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!(
                "the training holds {} models (one per group of at least {min_rows} rows, and the model of every row{where_}) of {} each, more than corgipile.max_model_memory ({}): {} such models fit",
                models.saturating_mul(copies),
                pretty_bytes(each),
                pretty_bytes(total),
                total / each.max(1)
            ),
            Some("Raise \"min_group_rows\", group by fewer or coarser columns, use fewer features, or ask a superuser to raise corgipile.max_model_memory.".into()),
        );
    }
}

/// The NOTICE of a verbose training's groups (one server's, and a sharded training's).
pub(crate) fn groups_notice(groups: &GroupsFound, min_rows: u64) -> String {
    format!(
        "group_by: {} groups; {} with at least {min_rows} rows get a model of their own, {} smaller ones ({} rows) are predicted by the model of every row",
        groups.kept.len() as u64 + groups.small,
        groups.kept.len(),
        groups.small,
        groups.small_rows
    )
}

impl SgdNode {
    /// What `params.class_weight` makes of the classes the statistics pass counted: the two
    /// label values (two-class kinds) and the class weights; (None, None) without a weight,
    /// as a training without one has.
    #[allow(clippy::type_complexity)]
    fn class_weights_of(&self, params: &TrainParams) -> (Option<(f64, f64)>, Option<Vec<f64>>) {
        let (Some(counts), Some(weight)) = (self.class_counts.as_deref(), &params.class_weight)
        else {
            return (None, None);
        };
        let settled = settle_labels(self.config.model, counts, Some(weight), &self.label_text())
            .unwrap_or_else(|e| raise_labels_error(e, &self.config.relation, ""));
        (settled.label_values, settled.class_weights)
    }
}

/// The threads that train (and score) models side by side: up to
/// 1 + max_parallel_workers_per_gather, at most one per core. Call on the backend thread.
fn side_by_side_threads() -> usize {
    // SAFETY: a plain read of a GUC variable, on the backend thread.
    let helpers = unsafe { pg_sys::max_parallel_workers_per_gather }.max(0) as usize;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores.min(1 + helpers)
}

/// Validation rows scored between two interrupt checks of the backend, at most.
const VALIDATION_CHUNK_ROWS: usize = 16_384;

/// Multiply-adds of scoring (every model, one chunk of rows) between two interrupt checks:
/// some milliseconds, so that a network of large layers or a search of many models answers
/// cancel within a second (a chunk of 16,384 rows of a [1000, 1000] network was seconds).
const VALIDATION_CHUNK_WORK: usize = 1 << 24;

impl SgdNode {
    /// Loss and accuracy (or R²) of each model on the validation rows (None where no model).
    /// Several models (a search's configurations) are scored side by side on the threads
    /// that train them, a chunk of rows at a time, the backend answering cancel between chunks
    /// (one after another on the backend, scoring 12 configurations cost a third of their
    /// training). Each model scores the rows in their order, as alone.
    ///
    /// With workers (`team`), every process scores the held-out rows it read, and every
    /// process gets the scores of all of them pooled (`round`: see `Team::gather`).
    ///
    /// # Safety
    /// With a team: as for [`Team::gather`], every process of the team calls it with the same
    /// increasing `round`.
    pub(super) unsafe fn validate_many(
        &self,
        models: &[Option<Model>],
        shuffle: &TupleShuffle,
        validation_rows: Option<&CollectedRows>,
        team: Option<(&Team, u32)>,
    ) -> Vec<Option<ValidationStats>> {
        let scores = self.score_validation(models, shuffle, validation_rows);
        let scores = match team {
            Some((team, round)) => pool_scores(team, round, scores),
            None => scores,
        };
        scores
            .into_iter()
            .map(|s| s.map(ValidationScore::finish))
            .collect()
    }

    /// Each model's score on this process's validation rows (none to score: empty scores).
    unsafe fn score_validation(
        &self,
        models: &[Option<Model>],
        shuffle: &TupleShuffle,
        validation_rows: Option<&CollectedRows>,
    ) -> Vec<Option<ValidationScore>> {
        let binary = self
            .binary_labels
            .map(|(negative, positive)| BinaryLabels::Values { negative, positive });
        let mut scores: Vec<Option<ValidationScore>> = models
            .iter()
            .map(|m| m.as_ref().map(|m| ValidationScore::new(m.kind(), binary)))
            .collect();
        let arena = match (validation_rows, &shuffle.rows().validation()) {
            _ if self.validation_elsewhere => return scores,
            (Some(v), _) => &v.rows.arena,
            (None, Some(a)) => a,
            (None, None) => return scores,
        };
        let several = models.iter().flatten().count() > 1;
        let threads = if several && self.config.params.double_buffer {
            side_by_side_threads()
        } else {
            1
        };
        let row_width = match arena.is_sparse() {
            true => arena.nnz() / arena.len().max(1) + 1,
            false => arena.n_features() + 1,
        };
        let row_work: usize = models
            .iter()
            .flatten()
            .map(|m| m.scoring_work(row_width))
            .sum();
        let chunk_rows = (VALIDATION_CHUNK_WORK / row_work.max(1)).clamp(1, VALIDATION_CHUNK_ROWS);
        for start in (0..arena.len()).step_by(chunk_rows) {
            check_for_interrupts!();
            let end = (start + chunk_rows).min(arena.len());
            let mut work: Vec<(&Model, &mut ValidationScore)> = models
                .iter()
                .zip(scores.iter_mut())
                .filter_map(|(m, s)| Some((m.as_ref()?, s.as_mut()?)))
                .collect();
            // Plain Rust on rows the backend copied out: no PostgreSQL call in these threads.
            let score_rows = |share: &mut [(&Model, &mut ValidationScore)]| {
                for (model, score) in share.iter_mut() {
                    for i in start..end {
                        score.push(*model, arena.row(i), arena.label(i));
                    }
                }
            };
            if threads <= 1 {
                score_rows(&mut work);
            } else {
                let per_thread = work.len().div_ceil(threads);
                std::thread::scope(|scope| {
                    for share in work.chunks_mut(per_thread.max(1)) {
                        scope.spawn(|| score_rows(share));
                    }
                });
            }
        }
        scores
    }
}

/// With workers: each model's scores of every process merged, in rank order (the same sums,
/// so the same decisions, in every process). A model this process has no score of (set
/// aside, or a fold's model that scored no row here) has none.
///
/// # Safety
/// As for [`Team::gather`]: every process of the team calls it with the same increasing
/// `round`.
pub(super) unsafe fn pool_scores(
    team: &Team,
    round: u32,
    scores: Vec<Option<ValidationScore>>,
) -> Vec<Option<ValidationScore>> {
    let parts: Vec<Option<ValidationPart>> = scores
        .iter()
        .map(|s| s.as_ref().map(ValidationScore::part))
        .collect();
    let mine = serde_json::to_vec(&parts).expect("validation parts serialize");
    let all: Vec<Vec<Option<ValidationPart>>> = team
        .gather(round, &mine)
        .iter()
        .map(|bytes| {
            serde_json::from_slice(bytes).unwrap_or_else(|e| {
                raise(
                    PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                    format!("corgipile parallel training read another process's scores: {e}"),
                    None,
                )
            })
        })
        .collect();
    scores
        .into_iter()
        .enumerate()
        .map(|(i, mine)| {
            let mut pooled = mine?.empty_like();
            for part in all.iter().filter_map(|parts| parts.get(i)).flatten() {
                pooled.merge(part);
            }
            Some(pooled)
        })
        .collect()
}

/// A copy of the scaling for another model (its size follows the table's features: an ERROR,
/// never an abort, when it cannot be allocated).
pub(super) fn copy_scaling(s: &Standardizer) -> Standardizer {
    s.try_clone().unwrap_or_else(|| {
        let bytes = 16 * s.mean.len() as u64;
        raise_train_error(TrainError::OutOfMemory { bytes }, &|v| v.to_string(), false)
    })
}
