//! The coordinator's training over a sharded table: round 0 and the plan every shard trains by
//! (`plan.rs`), then the epochs' rounds of its learners (a search's configurations, or the one
//! model, or per-group models: `learners.rs`, `groups.rs`) under the policy one server runs
//! (`corgipile_ml::fit`), a validation round after each epoch when rows are held out, and the
//! combined models.

pub(super) mod groups;
mod inference;
mod learners;

use super::coordinator::{
    open_shards, round_each, shard_params, RoundProgress, Shard, ShardLine, ShardSummary,
};
use super::gate::{HeldOut, KeptShards};
use super::leaves::Leaf;
use super::plan::{
    linear_rounds, params_for_shards, plans, statistics_round, RoundZero, ShardPlan,
};
use super::warm;
use crate::catalog::warm_start::WarmStart;
use crate::exec::sgd::{raise_diverged, CollectedRows, LearnedStatistics};
use crate::pg::error::raise_param_error;
use crate::pg::error::{notice, raise_train_error};
use crate::pg::progress;
use crate::pipeline::protocol::EvaluateRequest;
use crate::pipeline::protocol::{this_version, NetworkRound, Phase, RoundReply, RoundRequest};
use crate::pipeline::ClassValue;
use crate::pipeline::Trial;
use crate::pipeline::{FeatureLayout, PipelineConfig};
use crate::shard::network::NetworkPlan;
use corgipile_ml::divergence::diverged;
use corgipile_ml::fit::Fit;
use corgipile_ml::learner::Learner;
use corgipile_ml::model::{LinearModel, ModelKind, Predictor};
use corgipile_ml::params::TrainParams;
use corgipile_ml::scoring::ValidationPart;
use corgipile_ml::scoring::{BinaryLabels, ValidationScore, ValidationStats};
use corgipile_ml::standardize::Standardizer;
use corgipile_ml::trained::Model;
use corgipile_ml::trainer::{shard_line, DeltaRounds, EpochRecord, EpochTotals, TrainError};
use learners::{check_search, epoch_end, epoch_records, fit_of, learners_of, results};
use learners::{trials, validate, ShardLearner, Stored};
use pgrx::pg_sys;
use std::time::Instant;

/// Trains `config`'s model over the shards of a sharded table, from zeros or from `warm`'s
/// model (see `warm.rs`): every configuration's trial (one without a search), and what a
/// deploy gate scores on (`gate`). `run_local` runs a request on a local partition in this
/// backend.
pub fn train(
    parent: pg_sys::Oid,
    leaves: Vec<Leaf>,
    config: &PipelineConfig,
    warm: Option<&WarmStart>,
    run_local: &dyn Fn(pg_sys::Oid, &RoundRequest) -> RoundReply,
) -> (Vec<Trial>, ShardSummary, Option<HeldOut>) {
    let started = Instant::now();
    let params = &config.params;
    let kind = config.model;
    // A search's configurations (each checked as a param), as one server resolves them.
    let configurations = params
        .configurations(kind)
        .unwrap_or_else(|e| raise_param_error(e));
    check_search(config, &configurations);
    groups::check(config);
    let _progress = progress::start(&config.relation, kind.name(), params.epochs);
    let (mut conv, begun) = begin(parent, leaves, config, warm, run_local);
    let Begun {
        mut request,
        mut plan,
        model_rounds,
        relation_rows,
        zero,
        read,
    } = begun;
    inference::check_size(config, plan.shape.0);
    // The learners (a search's configurations side by side, or the one model): every
    // configuration of a search starts where the one model would, from zeros (a network: its
    // own shape's seeded parameters) or from a warm start's model.
    let start = warm.map(|_| model_rounds.params().to_vec());
    let (_, outputs, n_weights) = plan.shape;
    let own = |c: usize, p: &TrainParams| {
        params.search.is_some().then(|| {
            let (mut rounds, n_weights) = match &plan.network {
                Some(network) => (network.rounds(c), network.initials[c].len()),
                None => (linear_rounds(kind, p, n_weights, outputs), n_weights),
            };
            if let Some(start) = &start {
                // A warm start's model fits every configuration (`warm::start_rounds`).
                assert!(
                    rounds.start_at(start.clone()),
                    "a configuration of its shape"
                );
            }
            (rounds, n_weights)
        })
    };
    let folds = params.folds.unwrap_or(0);
    let mut learners = learners_of(&configurations, (folds, n_weights), model_rounds, &own);
    // Per-group models: a learner per group beside the model of every row; every round
    // numbers the rows' groups by their keys.
    if let Some(found) = &zero.groups {
        groups::announce(config, found, (plan.shape.0, outputs));
        groups::add_learners(&mut learners, found);
        request.groups = groups::keys(found);
    }
    let mut fit = fit_of(&configurations, &learners, params, kind);
    let rows_trained = epochs(
        &mut conv,
        &mut request,
        &mut plan,
        relation_rows.as_ref(),
        (&mut learners, &mut fit),
        config,
    );
    if let (true, false, Some(stopped)) = (params.verbose, params.search.is_some(), fit.stopped()) {
        notice(stopped.line());
    }
    // The local partitions' optimizer states (the remote shards' go with their connections);
    // held-out rows a gate scores stay (`gate::KeptShards`).
    if !request.keep_held_out_ids {
        crate::exec::sgd::forget_kept();
    }
    let (results, holdouts) = results(learners, started.elapsed().as_secs_f64());
    let finished = fit.finish(results, holdouts);
    let dense = matches!(config.layout, FeatureLayout::Dense { .. });
    let stored = Stored {
        classes: stored_classes(request.extras.label_values, &request.network, zero.classes),
        standardizer: (plan.standardizer.clone())
            .filter(|_| dense)
            .map(|s| std::rc::Rc::new(serde_json::to_value(s).expect("standardizer serializes"))),
        preprocessing: zero.preprocessing.map(std::rc::Rc::new),
        rows_trained,
        rows_skipped: zero.rows_skipped,
        statistics_seconds: zero.seconds,
        started,
        groups: zero.groups,
    };
    let mut trials = trials(finished, &configurations, &stored, &mut |c, p| {
        plan.model(c, p)
    });
    inference::infer(&mut conv, &request, config, &mut trials, rows_trained);
    progress::finish();
    let summary = ShardSummary {
        shards: conv.shards.iter().map(ShardLine::of).collect(),
        rounds_per_epoch: plan.rounds,
        bytes_per_epoch: conv.bytes,
        read,
    };
    let held_out = super::gate::held_out(
        relation_rows,
        (request.keep_held_out_ids).then(|| KeptShards::new(conv.shards, request.training)),
    );
    (trials, summary, held_out)
}

/// What round 0 settles for the epochs (see `begin`).
struct Begun {
    /// The training rounds' request: the merged preprocessing, classes and statistics.
    request: RoundRequest,
    plan: Plan,
    /// The starting parameters (zeros, or a warm start's), round by round.
    model_rounds: DeltaRounds,
    /// A validation relation's rows, encoded as the shards encode theirs.
    relation_rows: Option<CollectedRows>,
    zero: RoundZero,
    /// The shards' table marks, for the model's metrics (`since.rs`).
    read: Option<serde_json::Value>,
}

/// The model's shape and what turns the shards' combined parameters into a model.
struct Plan {
    kind: ModelKind,
    /// Rounds per epoch.
    rounds: u32,
    /// Features, outputs, weights (see `combined_model`).
    shape: (usize, usize, usize),
    /// A regression's zero model's loss (see `corgipile_ml::divergence`).
    zero_loss: Option<f64>,
    network: Option<NetworkPlan>,
    standardizer: Option<Standardizer>,
}

impl Plan {
    /// The model `params` of configuration `c` make, in the table's units.
    fn model(&mut self, c: usize, params: Vec<f64>) -> Model {
        let standardizer = self.standardizer.as_ref();
        let network = self.network.as_mut().map(|n| &mut n.learners[c]);
        combined_model(self.kind, self.shape, params, network, standardizer)
    }
}

/// Round 0 on every shard (their statistics, merged; a warm start's model unfolded into
/// them) and the training rounds' request it gives.
fn begin<'a>(
    parent: pg_sys::Oid,
    leaves: Vec<Leaf>,
    config: &PipelineConfig,
    warm: Option<&WarmStart>,
    run_local: &'a dyn Fn(pg_sys::Oid, &RoundRequest) -> RoundReply,
) -> (Conversation<'a>, Begun) {
    let params = &config.params;
    let version = this_version().to_string();
    // A training "since" a model: the marks it recorded of the shards' tables.
    let since = super::since::load(config, parent);
    let described: Vec<(pg_sys::Oid, String)> = leaves
        .iter()
        .map(Leaf::oid)
        .zip(super::describe(&leaves))
        .collect();
    let fixed = config.fixed_preprocessing();
    let mut request = RoundRequest {
        n_features: fixed.map_or(0, |p| p.n_features),
        // A warm start's column list: every shard encodes with the stored preprocessing.
        preprocessing: fixed.cloned(),
        // A timestamptz column is read on the wall clock of this session's time zone.
        zone: plans(config).and_then(|(plans, _)| plans.iter().find_map(|p| p.zone.clone())),
        marks: since.as_ref().map(|s| s.marks.clone()),
        ..RoundRequest::new(Phase::Statistics, training_number())
    };
    let mut conv = Conversation {
        shards: open_shards(leaves, &version),
        kind: config.model,
        params_json: shard_params(&params_for_shards(config)),
        run_local,
        bytes: 0,
        correct_drift: false,
    };
    // SAFETY: FFI calls on the backend thread, in the SQL call's transaction; no raw pointers.
    let mut zero = unsafe {
        statistics_round(
            &mut conv.shards,
            config,
            &request,
            &conv.params_json,
            conv.run_local,
            &mut conv.bytes,
        )
    };
    conv.correct_drift = zero.unlike;
    let read = super::since::after_statistics(
        since.as_ref(),
        parent,
        &described,
        &conv.shards,
        &zero.marks,
    );
    let ShardPlan {
        extras,
        network,
        zero_loss,
        model_rounds,
        n_weights,
        outputs,
    } = warm::plan(warm, config, &mut zero);
    // A validation relation, read here now that its rows' encoding is known (`gate`).
    let relation_rows =
        super::gate::relation_rows(config, zero.preprocessing.as_ref(), &zero.classes);
    request.network = network.as_ref().map(|plan| plan.round.clone());
    // A linear model of a label numbered by class: every shard decodes by this numbering.
    if request.network.is_none() {
        request.classes = zero.classes.clone();
    }
    request.phase = Phase::Train;
    // A gate scores both versions on the rows the shards hold out: they keep their ids.
    request.keep_held_out_ids =
        params.validation.is_some() && relation_rows.is_none() && params.deploy.is_some();
    request.n_features = zero.n_features;
    // A search of networks: as many rounds as its biggest network would have alone.
    let most = network
        .as_ref()
        .map_or(model_rounds.params().len(), NetworkPlan::most_parameters);
    let plan = Plan {
        kind: config.model,
        rounds: params.sync_rounds(most),
        shape: (zero.n_features, outputs, n_weights),
        zero_loss,
        network,
        standardizer: extras.standardizer.clone(),
    };
    request.extras = extras;
    request.zone = None;
    // A list of feature columns: every shard encodes its rows with the merged preprocessing.
    request.preprocessing.clone_from(&zero.preprocessing);
    let begun = Begun {
        request,
        plan,
        model_rounds,
        relation_rows,
        zero,
        read,
    };
    (conv, begun)
}

/// The epochs' rounds of the learners, run by the policy one server runs (`fit`: validation,
/// patience, best epochs; the shard line is this driver's own), with a validation round after
/// each epoch when rows are held out; the rows trained in the last epoch.
fn epochs(
    conv: &mut Conversation,
    request: &mut RoundRequest,
    plan: &mut Plan,
    relation_rows: Option<&CollectedRows>,
    (learners, fit): (&mut Vec<ShardLearner>, &mut Fit<Model>),
    config: &PipelineConfig,
) -> u64 {
    let params = &config.params;
    let validating = params.validation.is_some();
    let searching = params.search.is_some();
    let folds = params.folds.unwrap_or(0);
    let label_values = request.extras.label_values;
    let mut rows_trained = 0;
    for epoch in 1..=params.epochs {
        let epoch_started = Instant::now();
        progress::epoch_started(epoch);
        // The last epoch: each fold's learner scores its fold's rows (as on one server).
        request.folds = folds;
        request.score_folds = folds > 0 && epoch == params.epochs;
        let totals = conv.epoch_rounds(request, learners, (epoch, plan.rounds), params.normalize);
        let Some(tuples) = totals.iter().flatten().map(|t| t.tuples).max() else {
            break;
        };
        rows_trained = totals.iter().flatten().map(|t| t.rows).max().unwrap_or(0);
        let mut records = epoch_records(
            config,
            learners,
            &totals,
            (epoch, epoch_started, plan.zero_loss),
        );
        if let Some(first) = records.iter().flatten().next() {
            progress::epoch_finished(first.stats.loss);
        }
        // Each epoch's model scored on the rows every shard held out (or a validation
        // relation's, here).
        let validation_started = Instant::now();
        let scored = validating.then(|| {
            let at = (&*request, label_values);
            let model_of = &mut |c: usize, params: Vec<f64>| plan.model(c, params);
            validate(conv, learners, at, relation_rows, model_of, tuples)
        });
        let validation_seconds = match validating {
            true => validation_started.elapsed().as_secs_f64(),
            false => 0.0,
        };
        for (i, learner) in learners.iter().enumerate() {
            if let Some(epoch) = learner.set_aside.filter(|&e| e == epoch) {
                fit.set_aside_elsewhere(i, epoch);
            }
        }
        let end = epoch_end(epoch, &mut records, scored, validation_seconds);
        if params.verbose && !searching {
            // The model of every row's (after its folds' learners).
            if let Some(record) = &records[folds as usize] {
                notice_epoch(params.epochs, record, &conv.shards, plan.rounds, conv.bytes);
            }
        }
        let actions = fit.end_epoch(end);
        for i in actions.stop {
            learners[i].going = false;
        }
        if params.verbose {
            actions.notices.into_iter().for_each(notice);
        }
        if actions.done {
            break;
        }
    }
    rows_trained
}

/// The shards of a training and what every round sends them besides its request.
struct Conversation<'a> {
    shards: Vec<Shard>,
    kind: ModelKind,
    params_json: String,
    run_local: &'a dyn Fn(pg_sys::Oid, &RoundRequest) -> RoundReply,
    /// Bytes to and from the shard servers since the last reset (an epoch's, for the NOTICE).
    bytes: u64,
    /// A network's or fm's rounds correct each shard's drift (its rows are unlike the
    /// others': `RoundZero::unlike`).
    correct_drift: bool,
}

impl Conversation<'_> {
    /// One request on every shard at once (see `coordinator::round`).
    fn round(&mut self, request: &RoundRequest, at: &RoundProgress) -> Vec<RoundReply> {
        let each = vec![request; self.shards.len()];
        self.round_each(&each, at)
    }

    /// `round` with a request of each shard's, in shard order (see `coordinator::round_each`).
    fn round_each(&mut self, requests: &[&RoundRequest], at: &RoundProgress) -> Vec<RoundReply> {
        round_each(
            &mut self.shards,
            requests,
            self.kind,
            &self.params_json,
            self.run_local,
            &mut self.bytes,
            at,
        )
    }
}

/// A validation round's request, but for its learners (see `learners::validate`): the epoch's
/// models scored on the rows every shard held out; a binary kind's `label_values` say how its
/// rows' labels score.
fn validation_request(train: &RoundRequest, label_values: Option<(f64, f64)>) -> RoundRequest {
    RoundRequest {
        epoch: train.epoch,
        n_features: train.n_features,
        folds: train.folds,
        score_folds: train.score_folds,
        extras: LearnedStatistics {
            label_values,
            ..LearnedStatistics::default()
        },
        // Its rows were encoded when they were held out: no preprocessing, classes or marks.
        ..RoundRequest::new(Phase::Validate, train.training)
    }
}

/// What a validation round sends of `model` (the epoch's, in the table's units) to score, with
/// the classes it has outputs for (a softmax's or a network classifier's) as `train` numbers
/// them.
fn scored(train: &RoundRequest, model: &Model) -> EvaluateRequest {
    let classes = if model.kind().has_class_outputs() {
        match &train.network {
            Some(n) => n.classes.clone(),
            None => train.classes.clone(),
        }
    } else {
        Vec::new()
    };
    EvaluateRequest {
        model: model.to_parts(),
        classes,
        preprocessing: None,
        tables: None,
        groups: None,
        held_out: false,
    }
}

/// A number no other sharded training of this backend had: the shards (and this backend, for
/// local partitions) keep what they hold between rounds under it (see `RoundRequest::training`).
fn training_number() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static TRAININGS: AtomicU64 = AtomicU64::new(0);
    // SAFETY: GetCurrentTimestamp only reads the clock (backend thread).
    let now = unsafe { pg_sys::GetCurrentTimestamp() } as u64;
    (now << 16) ^ TRAININGS.fetch_add(1, Ordering::Relaxed)
}

/// The combined model's record of `epoch` from what the shards trained in it; ERROR if it
/// diverged.
fn epoch_record(
    config: &PipelineConfig,
    epoch: u32,
    totals: &EpochTotals,
    learning_rate: f64,
    started: Instant,
    zero_loss: Option<f64>,
) -> EpochRecord {
    let classifier = config.model.is_classifier();
    let record = EpochRecord {
        stats: totals.stats(epoch, classifier, !classifier, learning_rate),
        seconds: started.elapsed().as_secs_f64(),
        validation: None,
        validation_seconds: 0.0,
    };
    if diverged(record.stats.loss, zero_loss) {
        raise_diverged(epoch, record.stats.loss, zero_loss, config.params.normalize);
    }
    record
}

/// The epoch's NOTICE (`verbose`): the combined model's figures and each shard's tuples.
fn notice_epoch(epochs: u32, record: &EpochRecord, shards: &[Shard], rounds: u32, bytes: u64) {
    let per_shard: Vec<String> = shards
        .iter()
        .map(|s| format!("{} {}", s.name, s.tuples))
        .collect();
    notice(shard_line(epochs, record, &per_shard, rounds, bytes));
}

/// The classes stored with the model: a binary kind's two label values (by their indices in
/// `numbered` for a text label), a network's, or a softmax's every class in the coordinator's
/// numbering.
fn stored_classes(
    label_values: Option<(f64, f64)>,
    network: &Option<NetworkRound>,
    numbered: Vec<ClassValue>,
) -> Vec<ClassValue> {
    match (label_values, network) {
        (Some((neg, pos)), _) if !numbered.is_empty() => {
            let class = |v: f64| numbered[v as usize].clone();
            vec![class(neg), class(pos)]
        }
        (Some((neg, pos)), _) => vec![ClassValue::Number(neg), ClassValue::Number(pos)],
        (None, Some(n)) => n.classes.clone(),
        (None, None) => numbered,
    }
}

/// The shards' validation scores of one epoch's model, pooled (each was checked as it came).
fn pooled_validation(
    kind: ModelKind,
    label_values: Option<(f64, f64)>,
    parts: &[&ValidationPart],
) -> ValidationStats {
    let binary =
        label_values.map(|(negative, positive)| BinaryLabels::Values { negative, positive });
    let mut score = ValidationScore::new(kind, binary);
    for part in parts {
        score.merge(part);
    }
    score.finish()
}

/// The model the shards' combined parameters make (`params`: the weights, `n_weights` of them,
/// then the bias; a network's all its parameters, made by its configuration's `network`
/// learner; `shape`: features, outputs, weights), in the table's units (`standardizer` folded
/// in).
fn combined_model(
    kind: ModelKind,
    shape: (usize, usize, usize),
    params: Vec<f64>,
    network: Option<&mut Learner>,
    standardizer: Option<&Standardizer>,
) -> Model {
    let model = training_units_model(kind, shape, params, network);
    match standardizer {
        Some(s) => model.fold_standardizer(s),
        None => model,
    }
}

fn training_units_model(
    kind: ModelKind,
    (n_features, outputs, n_weights): (usize, usize, usize),
    mut params: Vec<f64>,
    network: Option<&mut Learner>,
) -> Model {
    match network {
        Some(learner) => {
            assert!(learner.set_parameters(&params), "a learner's own rounds");
            learner.result_model().unwrap_or_else(|| {
                let bytes = params.len() as u64 * 8;
                raise_train_error(TrainError::OutOfMemory { bytes }, &|v| v.to_string(), false)
            })
        }
        None => {
            let bias = params.split_off(n_weights);
            Model::new(LinearModel {
                kind,
                n_features,
                n_outputs: outputs,
                weights: params,
                bias,
            })
        }
    }
}
