//! The learners of a sharded training: a search's configurations side by side (one model
//! without a search), with `"folds"` one learner per fold beside each, with `"group_by"` one
//! per group beside the model of every row (`groups.rs`), each with its own
//! combined parameters, moved round by round by what the shards trained of it
//! (`pipeline::protocol::learners`), scored together in the validation rounds (a fold's
//! learner: on its fold's rows in the last epoch), and ending as one server's trials.

use super::{epoch_record, pooled_validation, scored, validation_request, Conversation};
use crate::exec::sgd::CollectedRows;
use crate::pg::error::{raise_train_error, refuse_combination};
use crate::pg::guc::check_training_size;
use crate::pipeline::protocol::{LearnerRound, RoundReply, RoundRequest};
use crate::pipeline::{ClassValue, GroupsFound, TrainOutcome, Trial};
use crate::pipeline::{FeatureLayout, PipelineConfig};
use crate::shard::coordinator::RoundProgress;
use corgipile_ml::capabilities::{used, Use};
use corgipile_ml::fit::{EpochEnd, Finished, Fit, LearnerPlan, Notices};
use corgipile_ml::learner::Shape;
use corgipile_ml::model::ModelKind;
use corgipile_ml::network::Target;
use corgipile_ml::params::search::configuration_kind;
use corgipile_ml::params::Patience;
use corgipile_ml::params::{Configuration, TrainParams};
use corgipile_ml::preprocess::Preprocessor;
use corgipile_ml::scoring::{BinaryLabels, ValidationScore, ValidationStats};
use corgipile_ml::trained::Model;
use corgipile_ml::trainer::{
    Controls, DeltaRounds, EpochPart, EpochRecord, EpochTotals, TrainError,
};
use serde_json::{Map, Value};
use std::rc::Rc;
use std::time::Instant;

/// One learner: its configuration, its params and its combined parameters.
pub(super) struct ShardLearner {
    /// How many of its parameters are weights (a network's: all; the rest are biases).
    pub(super) n_weights: usize,
    /// Its configuration (its index in the search's, and its searched params).
    pub(super) index: usize,
    pub(super) configuration: Map<String, Value>,
    /// With `"folds"`: the fold it never trains on (None: the model of every row).
    pub(super) fold: Option<u32>,
    /// With `"group_by"`: the group whose rows alone it trains on (None: every row's model).
    pub(super) group: Option<u32>,
    /// Its fold's rows scored in the last epoch, pooled over the rounds and shards.
    pub(super) holdout: Option<ValidationScore>,
    pub(super) params: TrainParams,
    pub(super) rounds: DeltaRounds,
    /// Still training (not stopped by the policy, not set aside).
    pub(super) going: bool,
    /// Set aside (it diverged) in this epoch.
    pub(super) set_aside: Option<u32>,
    /// A model the shards train with kept optimizers (a network, a factorization machine):
    /// every shard's control, for its drift correction (see `Controls`).
    pub(super) controls: Option<Controls>,
}

/// Refuses, before any shard is contacted, learners a sharded training cannot run as one
/// server does: a searched model kind or class_weight (the capability table says why), and a
/// search of networks whose learners cannot all fit corgipile.max_model_memory (each its
/// share, as one server bounds a search; checked here on the fewest inputs and outputs the
/// rows can have, and again on the rows' own by `network::network_plan`).
pub(super) fn check_search(config: &PipelineConfig, configurations: &[Configuration]) {
    let kind = config.model;
    let base = &configurations[0].1;
    refuse_combination(
        Use::Shards,
        &used(&[
            (
                Use::SearchedModel,
                configurations
                    .iter()
                    .any(|(c, _)| configuration_kind(c, kind) != kind),
            ),
            (
                Use::SearchedClassWeight,
                configurations
                    .iter()
                    .any(|(_, p)| p.class_weight != base.class_weight),
            ),
        ]),
    );
    if !kind.family().sized_by_statistics() {
        return;
    }
    let n_features = match (&config.layout, config.fixed_preprocessing()) {
        (_, Some(p)) => p.n_features,
        (FeatureLayout::Sparse { n_features, .. }, None) => n_features.unwrap_or(1) as usize,
        _ => 1,
    };
    let fewest = Shape {
        n_features,
        outputs: if kind.is_classifier() { 2 } else { 1 },
        target: Target::new(0.0, 1.0),
    };
    for (_, p) in configurations {
        if let Some(mut size) = kind.family().training_size(p, &fewest) {
            size.what = format!(
                "{}, on the fewest inputs and classes rows can have,",
                size.what
            );
            check_training_size(&size, config.max_model_bytes);
        }
    }
}

/// A configuration's own rounds, and how many of its parameters are weights.
pub(super) type OwnRounds = (DeltaRounds, usize);

/// Every configuration's learners (with `folds`, one per fold, then its model of every row, as
/// one server orders them), each starting from `start` (the plan's combined parameters, the
/// first `n_weights` weights), or from `own` rounds of its configuration (a search's: its own
/// iterate averaging, its own network's shape; a network's parameters are all weights).
pub(super) fn learners_of(
    configurations: &[Configuration],
    (folds, n_weights): (u32, usize),
    start: DeltaRounds,
    own: &dyn Fn(usize, &TrainParams) -> Option<OwnRounds>,
) -> Vec<ShardLearner> {
    let mut learners = Vec::new();
    for (index, (configuration, params)) in configurations.iter().enumerate() {
        for fold in (0..folds).map(Some).chain([None]) {
            let (rounds, n_weights) = own(index, params).unwrap_or((start.clone(), n_weights));
            learners.push(ShardLearner {
                n_weights,
                index,
                configuration: configuration.clone(),
                fold,
                group: None,
                holdout: None,
                params: params.clone(),
                rounds,
                going: true,
                set_aside: None,
                controls: None,
            });
        }
    }
    learners
}

impl Conversation<'_> {
    /// One epoch's training rounds (`epoch`, `rounds` of them): each sends every learner going
    /// with its combined parameters (its own length: a search's networks differ in shape)
    /// and adds what the shards trained of it. Returns each learner's totals (None: not
    /// going); each shard's tuples are counted on it. A learner a shard set aside is set aside.
    pub(super) fn epoch_rounds(
        &mut self,
        request: &mut RoundRequest,
        learners: &mut [ShardLearner],
        (epoch, rounds): (u32, u32),
        normalize: bool,
    ) -> Vec<Option<EpochTotals>> {
        let mut totals: Vec<Option<EpochTotals>> = learners
            .iter()
            .map(|l| l.going.then(EpochTotals::default))
            .collect();
        self.bytes = 0;
        for shard in self.shards.iter_mut() {
            shard.tuples = 0;
        }
        for r in 0..rounds {
            let going: Vec<usize> = (0..learners.len()).filter(|&i| learners[i].going).collect();
            if going.is_empty() {
                break;
            }
            request.epoch = epoch;
            request.round = r;
            request.rounds = rounds;
            request.learners = going
                .iter()
                .map(|&i| {
                    let (weights, bias) =
                        learners[i].rounds.params().split_at(learners[i].n_weights);
                    LearnerRound {
                        configuration: learners[i].configuration.clone(),
                        fold: learners[i].fold,
                        group: learners[i].group,
                        weights: weights.to_vec(),
                        bias: bias.to_vec(),
                        correction: None,
                        score: None,
                    }
                })
                .collect();
            let at = RoundProgress {
                label: format!("round {}/{rounds}", r + 1),
                fraction: r as f64 / rounds as f64,
                tuples: totals.iter().flatten().map(|t| t.tuples).max().unwrap_or(0),
            };
            let corrections = match self.correct_drift {
                true => corrected(request, learners, &going, (self.shards.len(), normalize)),
                false => None,
            };
            let replies = match corrections {
                Some(requests) => {
                    let mut replies = self.round_each(&requests.iter().collect::<Vec<_>>(), &at);
                    keep_controls(&mut replies, learners, &going);
                    replies
                }
                None => self.round(request, &at),
            };
            for (j, &i) in going.iter().enumerate() {
                let learner = &mut learners[i];
                if replies.iter().any(|r| r.learners[j].set_aside) {
                    learner.going = false;
                    learner.set_aside = Some(epoch);
                    totals[i] = None;
                    continue;
                }
                let changed = replies
                    .iter()
                    .map(|r| &r.learners[j])
                    .filter(|l| l.tuples > 0);
                if let Err(e) = learner
                    .rounds
                    .combine(epoch, changed.map(|l| l.weights.iter().chain(&l.bias)))
                {
                    if going.len() > 1 {
                        learner.going = false;
                        learner.set_aside = Some(epoch);
                        totals[i] = None;
                        continue;
                    }
                    raise_train_error(e, &|v| v.to_string(), normalize);
                }
                let binary = request
                    .extras
                    .label_values
                    .map(|(negative, positive)| BinaryLabels::Values { negative, positive });
                for part in replies
                    .iter()
                    .filter_map(|r| r.learners[j].holdout.as_ref())
                {
                    let kind = self.kind;
                    let score = learner
                        .holdout
                        .get_or_insert_with(|| ValidationScore::new(kind, binary));
                    score.merge(part);
                }
                let total = totals[i].get_or_insert_with(EpochTotals::default);
                for reply in &replies {
                    let l = &reply.learners[j];
                    total.add(&EpochPart {
                        tuples: l.tuples,
                        rows: reply.rows,
                        rows_skipped: 0,
                        loss: l.loss,
                        accuracy: l.accuracy.unwrap_or(0.0),
                        r2: l.r2.unwrap_or(0.0),
                    });
                }
            }
            for (reply, shard) in replies.iter().zip(self.shards.iter_mut()) {
                shard.tuples = shard.tuples.saturating_add(reply.tuples());
            }
        }
        totals
    }
}

/// A network's (or factorization machine's) round on shards of unlike rows: `request` for
/// each shard, each learner with that shard's drift correction (see `corgipile_ml::trainer::Controls`; ERROR if one is
/// not finite: diverged); None for a linear model's, whose shards keep no optimizer and whose
/// rounds add the changes whole.
fn corrected(
    request: &RoundRequest,
    learners: &mut [ShardLearner],
    going: &[usize],
    (shards, normalize): (usize, bool),
) -> Option<Vec<RoundRequest>> {
    request.network.as_ref()?;
    let corrections: Vec<Vec<Vec<f64>>> = going
        .iter()
        .map(|&i| {
            let controls = learners[i]
                .controls
                .get_or_insert_with(|| Controls::new(shards));
            controls.corrections().unwrap_or_else(|| {
                let diverged = TrainError::Diverged {
                    epoch: request.epoch,
                };
                raise_train_error(diverged, &|v| v.to_string(), normalize)
            })
        })
        .collect();
    let each = (0..shards).map(|k| {
        let mut r = request.clone();
        for (l, c) in r.learners.iter_mut().zip(&corrections) {
            l.correction = Some(c[k].clone());
        }
        r
    });
    Some(each.collect())
}

/// Takes each shard's control of every learner going out of its reply (checked against the
/// request as it came) into the learner's controls.
fn keep_controls(replies: &mut [RoundReply], learners: &mut [ShardLearner], going: &[usize]) {
    for (k, reply) in replies.iter_mut().enumerate() {
        for (&i, l) in going.iter().zip(reply.learners.iter_mut()) {
            if let (Some(controls), Some(control)) = (&mut learners[i].controls, l.control.take()) {
                controls.set(k, control, l.tuples);
            }
        }
    }
}

/// Each learner's record of `epoch` from its totals (None: not going). A learner whose loss
/// says it diverged is set aside while others go on, as one server's search sets it aside;
/// alone, it is the training's ERROR.
pub(super) fn epoch_records(
    config: &PipelineConfig,
    learners: &mut [ShardLearner],
    totals: &[Option<EpochTotals>],
    (epoch, started, zero_loss): (u32, Instant, Option<f64>),
) -> Vec<Option<EpochRecord>> {
    let kind = config.model;
    let mut left = totals.iter().flatten().count();
    learners
        .iter_mut()
        .zip(totals)
        .map(|(learner, totals)| {
            let totals = totals.as_ref()?;
            let p = &learner.params;
            let learning_rate = p
                .train_config(kind)
                .schedule
                .learning_rate(p.learning_rate, epoch);
            let record = epoch_record(config, epoch, totals, learning_rate, started, None);
            if !corgipile_ml::divergence::diverged(record.stats.loss, zero_loss) {
                return Some(record);
            }
            if left == 1 {
                // The last learner going: its ERROR is the training's (one server's rule).
                epoch_record(config, epoch, totals, learning_rate, started, zero_loss);
            }
            left -= 1;
            learner.going = false;
            learner.set_aside = Some(epoch);
            None
        })
        .collect()
}

/// The validation round of `epoch`: every learner going's model (made by `model_of` from its
/// configuration's index and its parameters) scored on the rows every shard held out, pooled per learner. Returns each
/// learner's model and score (None: not going).
pub(super) fn validate(
    conv: &mut Conversation,
    learners: &[ShardLearner],
    (train, label_values): (&RoundRequest, Option<(f64, f64)>),
    relation: Option<&CollectedRows>,
    model_of: &mut dyn FnMut(usize, Vec<f64>) -> Model,
    tuples: u64,
) -> Vec<(Option<Model>, Option<ValidationStats>)> {
    let going: Vec<usize> = (0..learners.len()).filter(|&i| learners[i].going).collect();
    let mut out: Vec<_> = learners.iter().map(|_| (None, None)).collect();
    if going.is_empty() {
        return out;
    }
    let models: Vec<_> = going
        .iter()
        .map(|&i| model_of(learners[i].index, learners[i].rounds.result()))
        .collect();
    // A validation relation's rows are here, on the coordinator: no round.
    if let Some(rows) = relation {
        for (&i, model) in going.iter().zip(models) {
            let stats = crate::shard::gate::score_relation(conv.kind, label_values, &model, rows);
            out[i] = (Some(model), Some(stats));
        }
        return out;
    }
    let mut request = validation_request(train, label_values);
    request.learners = going
        .iter()
        .zip(&models)
        .map(|(&i, model)| LearnerRound {
            configuration: learners[i].configuration.clone(),
            fold: learners[i].fold,
            score: Some(scored(train, model)),
            ..LearnerRound::default()
        })
        .collect();
    let replies = conv.round(
        &request,
        &RoundProgress {
            label: "validation".into(),
            fraction: 1.0,
            tuples,
        },
    );
    let kind = conv.kind;
    for ((j, &i), model) in going.iter().enumerate().zip(models) {
        let parts: Vec<_> = replies
            .iter()
            .map(|r| {
                r.learners[j]
                    .validation
                    .as_ref()
                    .expect("checked: a validation score")
            })
            .collect();
        out[i] = (
            Some(model),
            Some(pooled_validation(kind, label_values, &parts)),
        );
    }
    out
}

/// What each learner ends as, for `Fit::finish`: its final combined parameters (its iterate
/// average, if any), or set aside in the epoch it diverged; and each one's score of its fold.
#[allow(clippy::type_complexity)]
pub(super) fn results(
    learners: Vec<ShardLearner>,
    seconds: f64,
) -> (
    Vec<(Result<Vec<f64>, TrainError>, f64)>,
    Vec<Option<ValidationStats>>,
) {
    learners
        .into_iter()
        .map(|l| {
            let holdout = l.holdout.map(ValidationScore::finish);
            match l.set_aside {
                Some(epoch) => ((Err(TrainError::Diverged { epoch }), seconds), holdout),
                None => ((Ok(l.rounds.finish()), seconds), holdout),
            }
        })
        .unzip()
}

/// The policy of the learners' epochs, one server's: a learner per configuration, each with its
/// patience when rows are held out; a search's NOTICE line per epoch when verbose (a training
/// of one model writes the shard line instead).
pub(super) fn fit_of(
    configurations: &[Configuration],
    learners: &[ShardLearner],
    params: &TrainParams,
    kind: ModelKind,
) -> Fit<Model> {
    let validating = params.validation.is_some();
    let searching = params.search.is_some();
    let patience: Vec<Option<Patience>> = configurations
        .iter()
        .map(|(_, p)| p.patience.filter(|_| validating))
        .collect();
    let plan = LearnerPlan {
        configuration: learners.iter().map(|l| l.index).collect(),
        fold: learners
            .iter()
            .map(|l| l.fold.map(|f| f as usize))
            .collect(),
        group: learners.iter().map(|l| l.group).collect(),
    };
    // (Per-group models: the shard line is each epoch's NOTICE, as a training of one model's.)
    let notices = Notices {
        verbose: params.verbose && searching,
        metric: kind.metric_name(),
        search: searching.then(|| (configurations.to_vec(), params.selection(kind))),
        ..Notices::quiet(params.epochs)
    };
    Fit::new(plan, params.tolerance, &patience, notices)
}

/// The end of `epoch` for the policy: each learner's record (None: not going) with its
/// validation score and model, when `scored` (see `validate`).
pub(super) fn epoch_end(
    epoch: u32,
    records: &mut [Option<EpochRecord>],
    scored: Option<Vec<(Option<Model>, Option<ValidationStats>)>>,
    validation_seconds: f64,
) -> EpochEnd<Model> {
    let mut snapshots = Vec::with_capacity(records.len());
    let mut validations = Vec::with_capacity(records.len());
    let mut scored = scored.map(Vec::into_iter);
    for record in records.iter_mut() {
        let (model, score) = scored
            .as_mut()
            .and_then(Iterator::next)
            .unwrap_or((None, None));
        if let Some(record) = record {
            record.validation_seconds = validation_seconds;
            record.validation.clone_from(&score);
        }
        snapshots.push(model);
        validations.push(score);
    }
    EpochEnd {
        epoch,
        stats: records
            .iter()
            .map(|r| r.as_ref().map(|r| r.stats.clone()))
            .collect(),
        snapshots,
        validations,
        seconds: records.iter().flatten().next().map_or(0.0, |r| r.seconds),
        validation_seconds,
    }
}

/// What every configuration's trial stores besides its model and epochs.
pub(super) struct Stored {
    pub(super) classes: Vec<ClassValue>,
    pub(super) standardizer: Option<Rc<Value>>,
    pub(super) preprocessing: Option<Rc<Preprocessor>>,
    pub(super) rows_trained: u64,
    pub(super) rows_skipped: u64,
    pub(super) statistics_seconds: f64,
    pub(super) started: Instant,
    /// Per-group models: the groups that have one, and the smaller ones.
    pub(super) groups: Option<GroupsFound>,
}

/// Each configuration's trial, as one server's search makes them: its model (with patience,
/// its best epoch's; else made by `model_of` from its configuration's index and final
/// parameters) and history, or why it was set aside.
pub(super) fn trials(
    finished: Vec<Finished<Vec<f64>, Model>>,
    configurations: &[Configuration],
    stored: &Stored,
    model_of: &mut dyn FnMut(usize, Vec<f64>) -> Model,
) -> Vec<Trial> {
    finished
        .into_iter()
        .map(|f| {
            let (configuration, params) = configurations[f.configuration].clone();
            // A group's model: its key and rows (as one server's statistics pass counts them);
            // the model of every row: the groups too small for a model of their own.
            let group = f.group.and_then(|g| {
                let found = stored.groups.as_ref()?;
                found.kept.get(g as usize).cloned()
            });
            let small_groups = match (&stored.groups, f.group) {
                (Some(found), None) => Some((found.small, found.small_rows)),
                _ => None,
            };
            // A group's model trained on its rows: its last epoch's tuples (one server's rule).
            let rows_trained = match (&group, f.epochs.last()) {
                (Some(_), Some(last)) => last.stats.tuples,
                _ => stored.rows_trained,
            };
            let (outcome, epochs_before_failing) = match f.result {
                Ok(last) => {
                    // Early stopping keeps the best epoch's model (already in the table's units).
                    let (best_epoch, model) = match f.best {
                        Some((epoch, model)) => (Some(epoch), model),
                        None => (None, model_of(f.configuration, last)),
                    };
                    let outcome = TrainOutcome {
                        best_epoch,
                        inference: None,
                        model,
                        classes: stored.classes.clone(),
                        standardizer: stored.standardizer.clone(),
                        preprocessing: stored.preprocessing.clone(),
                        epochs: f.epochs,
                        rows_trained,
                        rows_skipped: stored.rows_skipped,
                        seconds: stored.started.elapsed().as_secs_f64(),
                        statistics_seconds: Some(stored.statistics_seconds),
                        // The coordinator holds no rows to score: a sharded model's predictions
                        // are not profiled (corgipile_drift: "no training profile").
                        predictions: None,
                    };
                    (Ok(outcome), Vec::new())
                }
                Err(e) => (Err(e), f.epochs),
            };
            Trial {
                configuration,
                params,
                seconds: f.seconds,
                outcome,
                epochs_before_failing,
                cv: f.cv,
                group,
                small_groups,
            }
        })
        .collect()
}
