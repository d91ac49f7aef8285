//! The coordinator's training over a sharded table: round 0 and the plan every shard trains by
//! (`plan.rs`), then the epochs' rounds under the policy one server runs (`corgipile_ml::fit`),
//! a validation round after each epoch when rows are held out, and the combined model.

use super::coordinator::{
    open_shards, round, shard_params, RoundProgress, Shard, ShardLine, ShardSummary,
};
use super::gate::{HeldOut, KeptShards};
use super::leaves::Leaf;
use super::plan::{
    fixed_preprocessing, params_for_shards, plans, statistics_round, RoundZero, ShardPlan,
};
use super::warm;
use crate::catalog::warm_start::WarmStart;
use crate::exec::sgd::{raise_diverged, LearnedStatistics};
use crate::pg::error::{notice, raise_train_error};
use crate::pg::progress;
use crate::pipeline::protocol::{
    this_version, EvaluateRequest, NetworkRound, Phase, RoundReply, RoundRequest, PROTOCOL,
};
use crate::pipeline::ClassValue;
use crate::pipeline::{FeatureLayout, PipelineConfig, TrainOutcome};
use crate::shard::network::NetworkPlan;
use corgipile_ml::divergence::diverged;
use corgipile_ml::fit::{EpochEnd, Fit, LearnerPlan, Notices};
use corgipile_ml::model::{LinearModel, ModelKind, Predictor};
use corgipile_ml::scoring::{BinaryLabels, ValidationScore, ValidationStats};
use corgipile_ml::standardize::Standardizer;
use corgipile_ml::trained::Model;
use corgipile_ml::trainer::{
    shard_line, DeltaRounds, EpochPart, EpochRecord, EpochTotals, TrainError,
};
use pgrx::pg_sys;
use std::time::Instant;

/// Trains `config`'s model over the shards of a sharded table, from zeros or from `warm`'s
/// model (see `warm.rs`). `run_local` runs a request on a local partition in this backend.
/// Also returns what a deploy gate scores on (`gate`).
pub fn train(
    leaves: Vec<Leaf>,
    config: &PipelineConfig,
    warm: Option<&WarmStart>,
    run_local: &dyn Fn(pg_sys::Oid, &RoundRequest) -> RoundReply,
) -> (TrainOutcome, ShardSummary, Option<HeldOut>) {
    let started = Instant::now();
    let params = &config.params;
    let kind = config.model;
    let _progress = progress::start(&config.relation, kind.name(), params.epochs);
    let version = this_version().to_string();
    // Round 0: statistics.
    let mut request = RoundRequest {
        version: version.clone(),
        protocol: PROTOCOL,
        phase: Phase::Statistics,
        training: training_number(),
        epoch: 1,
        round: 0,
        rounds: 1,
        n_features: fixed_preprocessing(config).map_or(0, |p| p.n_features),
        weights: Vec::new(),
        bias: Vec::new(),
        extras: LearnedStatistics::default(),
        evaluate: None,
        network: None,
        classes: Vec::new(),
        // A warm start's column list: every shard encodes with the stored preprocessing.
        preprocessing: fixed_preprocessing(config).cloned(),
        // A timestamptz column is read on the wall clock of this session's time zone.
        zone: plans(config).and_then(|(plans, _)| plans.iter().find_map(|p| p.zone.clone())),
        keep_held_out_ids: false,
    };
    let mut conv = Conversation {
        shards: open_shards(leaves, &version),
        kind,
        params_json: shard_params(&params_for_shards(config)),
        run_local,
        bytes: 0,
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
    let ShardPlan {
        extras,
        schedule: lr_schedule,
        mut network,
        zero_loss,
        mut model_rounds,
        n_weights,
        outputs,
    } = warm::plan(warm, config, &mut zero);
    let RoundZero {
        preprocessing,
        stats: _,
        classes: numbered,
        n_features,
        rows_skipped,
        seconds: statistics_seconds,
    } = zero;
    let rounds = params.sync_rounds(model_rounds.params().len());
    // A validation relation, read here now that its rows' encoding is known (`gate`).
    let relation_rows = super::gate::relation_rows(config, preprocessing.as_ref(), &numbered);
    request.network = network.as_ref().map(|plan| plan.round.clone());
    // A linear model of a label numbered by class: every shard decodes by this numbering.
    if request.network.is_none() {
        request.classes = numbered.clone();
    }
    // The combined model's epochs, run by the policy one server runs (one learner; with
    // validation, its patience and best epoch; the shard line is this driver's own).
    let validating = params.validation.is_some();
    let mut fit: Fit<Model> = Fit::new(
        LearnerPlan::one(),
        params.tolerance,
        &[params.patience.filter(|_| validating)],
        Notices::quiet(params.epochs),
    );
    let standardizer = extras.standardizer.clone();
    let label_values = extras.label_values;
    let mut rows_trained = 0;
    request.phase = Phase::Train;
    // A gate scores both versions on the rows the shards hold out: they keep their ids.
    request.keep_held_out_ids = validating && relation_rows.is_none() && params.deploy.is_some();
    request.n_features = n_features;
    request.extras = extras;
    request.zone = None;
    // A list of feature columns: every shard encodes its rows with the merged preprocessing.
    request.preprocessing.clone_from(&preprocessing);
    for epoch in 1..=params.epochs {
        let epoch_started = Instant::now();
        progress::epoch_started(epoch);
        let totals = conv.epoch_rounds(
            &mut request,
            &mut model_rounds,
            (epoch, rounds, n_weights),
            params.normalize,
        );
        rows_trained = totals.rows;
        let learning_rate = lr_schedule.learning_rate(params.learning_rate, epoch);
        let mut record = epoch_record(
            config,
            epoch,
            &totals,
            learning_rate,
            epoch_started,
            zero_loss,
        );
        progress::epoch_finished(record.stats.loss);
        // The epoch's model scored on the rows every shard held out (or a validation relation's).
        let (snapshot, validation_seconds) = match validating {
            true => {
                let validation_started = Instant::now();
                let model = combined_model(
                    kind,
                    (n_features, outputs, n_weights),
                    model_rounds.result(),
                    network.as_mut(),
                    standardizer.as_ref(),
                );
                record.validation = Some(match &relation_rows {
                    Some(rows) => super::gate::score_relation(kind, label_values, &model, rows),
                    None => {
                        let round_request =
                            validation_request(&request, &model, label_values, &numbered);
                        let replies = conv.round(
                            &round_request,
                            &RoundProgress {
                                label: "validation".into(),
                                fraction: 1.0,
                                tuples: totals.tuples,
                            },
                        );
                        pooled_validation(kind, label_values, &replies)
                    }
                });
                (Some(model), validation_started.elapsed().as_secs_f64())
            }
            false => (None, 0.0),
        };
        record.validation_seconds = validation_seconds;
        if params.verbose {
            notice_epoch(params.epochs, &record, &conv.shards, rounds, conv.bytes);
        }
        let end = EpochEnd {
            epoch,
            stats: vec![Some(record.stats)],
            snapshots: vec![snapshot],
            validations: vec![record.validation],
            seconds: record.seconds,
            validation_seconds,
        };
        if fit.end_epoch(end).done {
            break;
        }
    }
    if let (true, Some(stopped)) = (params.verbose, fit.stopped()) {
        notice(stopped.line());
    }
    progress::finish();
    // The local partitions' optimizer states (the remote shards' go with their connections);
    // held-out rows a gate scores stay (`gate::KeptShards`).
    if !request.keep_held_out_ids {
        crate::exec::sgd::forget_kept();
    }
    let seconds = started.elapsed().as_secs_f64();
    let (epochs, best) = match fit.finish(vec![(Ok(()), seconds)], Vec::new()).pop() {
        Some(finished) => (finished.epochs, finished.best),
        None => (Vec::new(), None),
    };
    // Early stopping keeps the best epoch's model (already in the table's units).
    let (best_epoch, model) = match best {
        Some((epoch, model)) => (Some(epoch), model),
        None => {
            let model = combined_model(
                kind,
                (n_features, outputs, n_weights),
                model_rounds.finish(),
                network.as_mut(),
                standardizer.as_ref(),
            );
            (None, model)
        }
    };
    let classes = stored_classes(request.extras.label_values, &request.network, numbered);
    let dense = matches!(config.layout, FeatureLayout::Dense { .. });
    let summary = ShardSummary {
        shards: conv.shards.iter().map(ShardLine::of).collect(),
        rounds_per_epoch: rounds,
        bytes_per_epoch: conv.bytes,
    };
    let held_out = super::gate::held_out(
        relation_rows,
        (request.keep_held_out_ids).then(|| KeptShards::new(conv.shards, request.training)),
    );
    let outcome = TrainOutcome {
        best_epoch,
        inference: None,
        model,
        classes,
        standardizer: standardizer
            .filter(|_| dense)
            .map(|s| std::rc::Rc::new(serde_json::to_value(s).expect("standardizer serializes"))),
        preprocessing: preprocessing.map(std::rc::Rc::new),
        epochs,
        rows_trained,
        rows_skipped,
        seconds: started.elapsed().as_secs_f64(),
        statistics_seconds: Some(statistics_seconds),
    };
    (outcome, summary, held_out)
}

/// The shards of a training and what every round sends them besides its request.
struct Conversation<'a> {
    shards: Vec<Shard>,
    kind: ModelKind,
    params_json: String,
    run_local: &'a dyn Fn(pg_sys::Oid, &RoundRequest) -> RoundReply,
    /// Bytes to and from the shard servers since the last reset (an epoch's, for the NOTICE).
    bytes: u64,
}

impl Conversation<'_> {
    /// One request on every shard at once (see `coordinator::round`).
    fn round(&mut self, request: &RoundRequest, at: &RoundProgress) -> Vec<RoundReply> {
        round(
            &mut self.shards,
            request,
            self.kind,
            &self.params_json,
            self.run_local,
            &mut self.bytes,
            at,
        )
    }

    /// One epoch's training rounds (`epoch`, `rounds` of them; the model's first `n_weights`
    /// parameters are weights): each sends the combined model and adds what the shards trained
    /// to it. Returns the epoch's totals; each shard's tuples are counted on it.
    fn epoch_rounds(
        &mut self,
        request: &mut RoundRequest,
        model_rounds: &mut DeltaRounds,
        (epoch, rounds, n_weights): (u32, u32, usize),
        normalize: bool,
    ) -> EpochTotals {
        let mut totals = EpochTotals::default();
        self.bytes = 0;
        for shard in self.shards.iter_mut() {
            shard.tuples = 0;
        }
        for r in 0..rounds {
            request.epoch = epoch;
            request.round = r;
            request.rounds = rounds;
            let (weights, bias) = model_rounds.params().split_at(n_weights);
            request.weights = weights.to_vec();
            request.bias = bias.to_vec();
            let at = RoundProgress {
                label: format!("round {}/{rounds}", r + 1),
                fraction: r as f64 / rounds as f64,
                tuples: totals.tuples,
            };
            let replies = self.round(request, &at);
            let changed = replies.iter().filter(|r| r.tuples > 0);
            if let Err(e) =
                model_rounds.combine(epoch, changed.map(|r| r.weights.iter().chain(&r.bias)))
            {
                raise_train_error(e, &|v| v.to_string(), normalize);
            }
            for (reply, shard) in replies.iter().zip(self.shards.iter_mut()) {
                shard.tuples = shard.tuples.saturating_add(reply.tuples);
                totals.add(&EpochPart {
                    tuples: reply.tuples,
                    rows: reply.rows,
                    rows_skipped: 0,
                    loss: reply.loss,
                    accuracy: reply.accuracy.unwrap_or(0.0),
                    r2: reply.r2.unwrap_or(0.0),
                });
            }
        }
        totals
    }
}

/// A validation round's request: `model` (the epoch's, in the table's units) scored on the rows
/// every shard held out; a binary kind's `label_values` say how its rows' labels score.
fn validation_request(
    train: &RoundRequest,
    model: &Model,
    label_values: Option<(f64, f64)>,
    numbered: &[ClassValue],
) -> RoundRequest {
    // The classes the model has outputs for (a softmax's or a network classifier's).
    let classes = if model.kind().has_class_outputs() {
        match &train.network {
            Some(n) => n.classes.clone(),
            None => numbered.to_vec(),
        }
    } else {
        Vec::new()
    };
    RoundRequest {
        phase: Phase::Validate,
        round: 0,
        rounds: 1,
        n_features: model.n_features(),
        weights: Vec::new(),
        bias: Vec::new(),
        extras: LearnedStatistics {
            label_values,
            ..LearnedStatistics::default()
        },
        evaluate: Some(EvaluateRequest {
            model: model.to_parts(),
            classes,
            preprocessing: None,
            tables: None,
            held_out: false,
        }),
        network: None,
        classes: Vec::new(),
        // Its rows were encoded when they were held out.
        preprocessing: None,
        zone: None,
        keep_held_out_ids: false,
        ..train.clone()
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
    replies: &[RoundReply],
) -> ValidationStats {
    let binary =
        label_values.map(|(negative, positive)| BinaryLabels::Values { negative, positive });
    let mut score = ValidationScore::new(kind, binary);
    for reply in replies {
        score.merge(
            reply
                .validation
                .as_ref()
                .expect("checked: a validation score"),
        );
    }
    score.finish()
}

/// The model the shards' combined parameters make (`params`: the weights, `n_weights` of them,
/// then the bias; a network's all its parameters; `shape`: features, outputs, weights), in the
/// table's units (`standardizer` folded in).
fn combined_model(
    kind: ModelKind,
    shape: (usize, usize, usize),
    params: Vec<f64>,
    network: Option<&mut NetworkPlan>,
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
    network: Option<&mut NetworkPlan>,
) -> Model {
    match network {
        Some(plan) => {
            plan.learner.set_parameters(&params);
            plan.learner.result_model().unwrap_or_else(|| {
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
