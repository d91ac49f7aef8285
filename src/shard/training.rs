//! The coordinator's training over a sharded table: round 0 (every shard's statistics,
//! merged), the plan every shard trains by (scaling, labels, a network's shape, how the
//! shards' changes combine), then the epochs' rounds under the policy one server runs
//! (`corgipile_ml::fit`), and the combined model.

use super::coordinator::{
    open_shards, round, shard_params, RoundProgress, Shard, ShardLine, ShardSummary,
};
use super::leaves::Leaf;
use crate::exec::sgd::{raise_diverged, LearnedStatistics};
use crate::pg::error::{notice, raise, raise_labels_error, raise_train_error};
use crate::pg::progress;
use crate::pipeline::protocol::{Phase, RoundReply, RoundRequest};
use crate::pipeline::ClassValue;
use crate::pipeline::{FeatureLayout, PipelineConfig, TrainOutcome};
use crate::shard::network::{network_plan, NetworkPlan};
use corgipile_ml::divergence::{diverged, zero_model_loss};
use corgipile_ml::fit::{EpochEnd, Fit, LearnerPlan, Notices};
use corgipile_ml::model::{LinearModel, ModelKind};
use corgipile_ml::stats::FeatureStats;
use corgipile_ml::trained::Model;
use corgipile_ml::trainer::{
    normalizing_scaler, settle_labels, shard_line, DeltaRounds, EpochPart, EpochRecord,
    EpochTotals, LrSchedule,
};
use pgrx::{pg_sys, PgSqlErrorCode};
use std::time::Instant;

/// What round 0 found on every shard.
struct RoundZero {
    stats: FeatureStats,
    n_features: usize,
    rows_skipped: u64,
    seconds: f64,
}

/// What every shard trains by, from round 0's statistics.
struct ShardPlan {
    extras: LearnedStatistics,
    schedule: LrSchedule,
    network: Option<NetworkPlan>,
    /// A regression's zero model's loss (see `corgipile_ml::divergence`).
    zero_loss: Option<f64>,
    /// The combined parameters, round by round; the first `n_weights` are the weights.
    model_rounds: DeltaRounds,
    n_weights: usize,
}

/// A linear model's outputs over shards (one: binary kinds and regression).
const OUTPUTS: usize = 1;

/// Trains `config`'s model over the shards of a sharded table. `run_local` runs a request on a
/// local partition in this backend.
pub fn train(
    leaves: Vec<Leaf>,
    config: &PipelineConfig,
    run_local: &dyn Fn(pg_sys::Oid, &RoundRequest) -> RoundReply,
) -> (TrainOutcome, ShardSummary) {
    let started = Instant::now();
    let params = &config.params;
    let kind = config.model;
    let _progress = progress::start(&config.relation, kind.name(), params.epochs);
    let version = env!("CARGO_PKG_VERSION").to_string();
    let mut shards = open_shards(leaves, &version);
    let params_json = shard_params(params);
    let model_name = kind.name();
    // Round 0: statistics.
    let mut request = RoundRequest {
        version: version.clone(),
        phase: Phase::Statistics,
        epoch: 1,
        round: 0,
        rounds: 1,
        n_features: 0,
        weights: Vec::new(),
        bias: Vec::new(),
        extras: LearnedStatistics::default(),
        evaluate: None,
        network: None,
    };
    let mut bytes = 0u64;
    // SAFETY: FFI calls on the backend thread, in the SQL call's transaction; no raw pointers.
    let zero = unsafe {
        statistics_round(
            &mut shards,
            config,
            &request,
            &params_json,
            run_local,
            &mut bytes,
        )
    };
    let RoundZero {
        stats,
        n_features,
        rows_skipped,
        seconds: statistics_seconds,
    } = zero;
    let ShardPlan {
        extras,
        schedule: lr_schedule,
        network,
        zero_loss,
        mut model_rounds,
        n_weights,
    } = shard_plan(config, &stats, n_features);
    let rounds = params.sync_rounds(model_rounds.params().len());
    request.network = network.as_ref().map(|plan| plan.round.clone());
    // The combined model's epochs, run by the policy one server runs (one learner, no
    // patience: shards take no validation yet; the shard line is this driver's own).
    let mut fit: Fit<()> = Fit::new(
        LearnerPlan::one(),
        params.tolerance,
        &[None],
        Notices::quiet(params.epochs),
    );
    let mut rows_trained = 0;
    request.phase = Phase::Train;
    request.n_features = n_features;
    request.extras = extras;
    for epoch in 1..=params.epochs {
        let epoch_started = Instant::now();
        progress::epoch_started(epoch);
        let mut totals = EpochTotals::default();
        bytes = 0;
        for shard in shards.iter_mut() {
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
            let replies = round(
                &mut shards,
                &request,
                model_name,
                &params_json,
                run_local,
                &mut bytes,
                &at,
            );
            let changed = replies.iter().filter(|r| r.tuples > 0);
            if let Err(e) =
                model_rounds.combine(epoch, changed.map(|r| r.weights.iter().chain(&r.bias)))
            {
                raise_train_error(e, &|v| v.to_string(), params.normalize);
            }
            for (reply, shard) in replies.iter().zip(shards.iter_mut()) {
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
        rows_trained = totals.rows;
        let classifier = kind.is_classifier();
        let learning_rate = lr_schedule.learning_rate(params.learning_rate, epoch);
        let record = EpochRecord {
            stats: totals.stats(epoch, classifier, !classifier, learning_rate),
            seconds: epoch_started.elapsed().as_secs_f64(),
            validation: None,
            validation_seconds: 0.0,
        };
        if diverged(record.stats.loss, zero_loss) {
            raise_diverged(epoch, record.stats.loss, zero_loss, params.normalize);
        }
        progress::epoch_finished(record.stats.loss);
        if params.verbose {
            let per_shard: Vec<String> = shards
                .iter()
                .map(|s| format!("{} {}", s.name, s.tuples))
                .collect();
            notice(shard_line(
                params.epochs,
                &record,
                &per_shard,
                rounds,
                bytes,
            ));
        }
        let end = EpochEnd {
            epoch,
            stats: vec![Some(record.stats)],
            snapshots: vec![None],
            validations: vec![None],
            seconds: record.seconds,
            validation_seconds: 0.0,
        };
        if fit.end_epoch(end).done {
            break;
        }
    }
    progress::finish();
    // The local partitions' optimizer states (the remote shards' go with their connections).
    crate::exec::sgd::forget_kept_optimizers();
    let seconds = started.elapsed().as_secs_f64();
    let epochs = match fit.finish(vec![(Ok(()), seconds)], Vec::new()).pop() {
        Some(finished) => finished.epochs,
        None => Vec::new(),
    };
    let mut model = combined_model(kind, n_features, model_rounds.finish(), n_weights, network);
    let standardizer = request.extras.standardizer.clone();
    if let Some(s) = &standardizer {
        model = model.fold_standardizer(s);
    }
    let classes = match (request.extras.label_values, &request.network) {
        (Some((neg, pos)), _) => vec![ClassValue::Number(neg), ClassValue::Number(pos)],
        (None, Some(n)) => n.classes.clone(),
        (None, None) => Vec::new(),
    };
    let dense = matches!(config.layout, FeatureLayout::Dense { .. });
    let summary = ShardSummary {
        shards: shards
            .iter()
            .map(|s| ShardLine {
                tuples_last_epoch: s.tuples,
                seconds: s.seconds,
            })
            .collect(),
        rounds_per_epoch: rounds,
        bytes_per_epoch: bytes,
    };
    let outcome = TrainOutcome {
        best_epoch: None,
        inference: None,
        model,
        classes,
        standardizer: standardizer
            .filter(|_| dense)
            .map(|s| std::rc::Rc::new(serde_json::to_value(s).expect("standardizer serializes"))),
        preprocessing: None,
        epochs,
        rows_trained,
        rows_skipped,
        seconds: started.elapsed().as_secs_f64(),
        statistics_seconds: Some(statistics_seconds),
    };
    (outcome, summary)
}

/// The model the shards' combined parameters make (`params`: the weights, `n_weights` of them,
/// then the bias; a network's all its parameters).
fn combined_model(
    kind: ModelKind,
    n_features: usize,
    mut params: Vec<f64>,
    n_weights: usize,
    network: Option<NetworkPlan>,
) -> Model {
    match network {
        Some(mut plan) => {
            plan.learner.set_parameters(&params);
            plan.learner.into_model()
        }
        None => {
            let bias = params.split_off(n_weights);
            Model::new(LinearModel {
                kind,
                n_features,
                n_outputs: OUTPUTS,
                weights: params,
                bias,
            })
        }
    }
}

/// Round 0: every shard's statistics, merged; the rows' width (every shard's must agree) and
/// the model's size checked before anything is allocated.
unsafe fn statistics_round(
    shards: &mut [Shard],
    config: &PipelineConfig,
    request: &RoundRequest,
    params_json: &str,
    run_local: &dyn Fn(pg_sys::Oid, &RoundRequest) -> RoundReply,
    bytes: &mut u64,
) -> RoundZero {
    progress::phase("statistics pass");
    let stats_started = Instant::now();
    let at = RoundProgress {
        label: "statistics".into(),
        fraction: 0.0,
        tuples: 0,
    };
    let replies = round(
        shards,
        request,
        config.model.name(),
        params_json,
        run_local,
        bytes,
        &at,
    );
    let mut stats: Option<FeatureStats> = None;
    let mut width: Option<(usize, &str)> = None;
    let mut rows_skipped = 0u64;
    for (reply, shard) in replies.iter().zip(shards.iter()) {
        rows_skipped = rows_skipped.saturating_add(reply.rows_skipped);
        if let Some(w) = reply.width {
            match width {
                Some((other, at)) if other != w => raise(
                    PgSqlErrorCode::ERRCODE_ARRAY_ELEMENT_ERROR,
                    format!(
                        "the feature arrays of {} have {other} elements on {at} and {w} on {}",
                        config.relation, shard.name
                    ),
                    Some("Every row's feature array must have the same length.".into()),
                ),
                None => width = Some((w, &shard.name)),
                _ => {}
            }
        }
        if let Some(s) = &reply.stats {
            match &mut stats {
                Some(all) => all.merge(s),
                None => stats = Some(s.clone()),
            }
        }
    }
    let Some(stats) = stats.filter(|s| s.rows() > 0) else {
        raise(
            PgSqlErrorCode::ERRCODE_NO_DATA_FOUND,
            format!("{} has no rows to train on (on any shard)", config.relation),
            Some("The shards' tables are empty, or their row-level security policies hide every row (or the \"where\" filter selects none).".into()),
        )
    };
    let n_features = match config.layout {
        FeatureLayout::Sparse { n_features, .. } => n_features.unwrap_or(0) as usize,
        _ => width.map_or(stats.n_features(), |w| w.0),
    };
    // The shards said how wide the rows are: the model must fit before it is allocated.
    crate::pg::guc::check_model_size(
        n_features as u64,
        1,
        crate::pg::guc::max_model_bytes(),
        "the rows of the shards",
    );
    RoundZero {
        stats,
        n_features,
        rows_skipped,
        seconds: stats_started.elapsed().as_secs_f64(),
    }
}

/// What every shard trains by: the scaling (`normalize`), a binary kind's two labels and class
/// weights, a network's classes and initial weights, and how the shards' changes combine.
fn shard_plan(config: &PipelineConfig, stats: &FeatureStats, n_features: usize) -> ShardPlan {
    let params = &config.params;
    let kind = config.model;
    let mut extras = LearnedStatistics::default();
    let mut train_config = params.train_config(kind);
    if params.normalize {
        let sparse = matches!(config.layout, FeatureLayout::Sparse { .. });
        extras.standardizer = Some(normalizing_scaler(stats, sparse, params.fit_intercept));
    }
    // A network: its classes (the shards' label values, ascending) and its initial weights.
    let network = kind
        .family()
        .sized_by_statistics()
        .then(|| network_plan(config, stats, n_features, &mut extras));
    if kind.is_binary() {
        let settled = settle_labels(
            kind,
            &stats.class_counts(),
            params.class_weight.as_ref(),
            &|v| config.label.value_text(v),
        )
        .unwrap_or_else(|e| raise_labels_error(e, &config.relation, " on its shards"));
        extras.label_values = settled.label_values;
        extras.class_weights = settled.class_weights;
    }
    extras.clone().apply(&mut train_config);

    // Adding the shards' changes is right while each round moves the model a little; when
    // every shard converges within its round (an exactly linear target, three parts), the
    // sum overshoots and grows without bound while staying finite (measured: loss 3.5e38
    // after 3 epochs). An epoch whose training loss says it diverged (NaN, infinite, or a
    // regression's a thousand times a zero model's: the rule of a training on one server,
    // `corgipile_ml::divergence`) is an ERROR, never a stored model.
    let zero_loss = {
        let (mean, variance) = stats.label_mean_variance();
        zero_model_loss(kind, variance + mean * mean)
    };
    // Rounds. A network's parameters travel in `weights` (see `RoundRequest::network`).
    let (n_weights, model_rounds) = match &network {
        Some(plan) => (
            plan.initial.len(),
            // A network moves by the mean of the shards' changes (federated averaging): each
            // shard's optimizer carries its own momentum between rounds, and their sum
            // overshoots (measured: SGD with momentum diverged, one round per epoch lost
            // 1.0 of R²); the mean is stable whatever the optimizer and "sync".
            DeltaRounds::starting_from(plan.initial.clone(), true),
        ),
        None => {
            let average_from = params
                .average
                .then_some(if params.epochs >= 2 { 2 } else { 1 });
            let n_weights = n_features * OUTPUTS;
            // Linear regression moves by the mean of the shards' changes too: the sum of
            // changes each made from the same stale start overshoots an unbounded squared-loss
            // gradient (measured: diverged in epoch 1 with 3 shards). Classifiers keep the sum,
            // which keeps shards that hold one class each from collapsing to the majority.
            let regression = kind.labels() == corgipile_ml::model::Labels::Number;
            (
                n_weights,
                DeltaRounds::new(n_weights + OUTPUTS, average_from).with_mean_of_parts(regression),
            )
        }
    };
    ShardPlan {
        extras,
        schedule: train_config.schedule,
        network,
        zero_loss,
        model_rounds,
        n_weights,
    }
}
