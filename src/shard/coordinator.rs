//! The coordinator's side of a training or evaluation over a sharded table: connect to every
//! shard server, run the rounds, combine what the shards send back.

use super::leaves::Leaf;
use super::remote::Remote;
use crate::decode::classes::ClassValue;
use crate::exec::sgd::{raise_diverged, LearnedStatistics};
use crate::pg::error::{notice, raise, raise_labels_error, raise_train_error};
use crate::pg::progress;
use crate::pipeline::{FeatureLayout, PipelineConfig, TrainOutcome};
use crate::shard::network::network_plan;
use crate::shard::protocol::{EvaluateRequest, Phase, RoundReply, RoundRequest};
use corgipile_ml::divergence::{diverged, zero_model_loss};
use corgipile_ml::fit::{EpochEnd, Fit, LearnerPlan, Notices};
use corgipile_ml::learner::network_model;
use corgipile_ml::model::LinearModel;
use corgipile_ml::network::Network;
use corgipile_ml::scoring::Evaluation;
use corgipile_ml::stats::FeatureStats;
use corgipile_ml::trained::Model;
use corgipile_ml::trainer::{
    normalizing_scaler, settle_labels, shard_line, DeltaRounds, EpochPart, EpochRecord, EpochTotals,
};
use corgipile_ml::wire::{self, WireError};

use pgrx::{check_for_interrupts, pg_sys, PgSqlErrorCode};
use std::ffi::CString;
use std::time::Instant;

/// A shard during the training.
struct Shard {
    /// For messages: the foreign server's name, or the local partition's.
    name: String,
    place: Place,
    /// Tuples trained in the current epoch (the NOTICE, EXPLAIN ANALYZE).
    tuples: u64,
    /// Time from sending a request until its reply, summed over the training.
    seconds: f64,
}

/// What EXPLAIN ANALYZE shows of a sharded training.
pub struct ShardSummary {
    pub shards: Vec<ShardLine>,
    pub rounds_per_epoch: u32,
    /// Bytes to and from the shard servers in the last epoch.
    pub bytes_per_epoch: u64,
}

pub struct ShardLine {
    pub tuples_last_epoch: u64,
    pub seconds: f64,
}

enum Place {
    Local(pg_sys::Oid),
    /// `call`: the round's SQL, the function qualified with the schema corgipile is installed
    /// in on that server.
    Remote {
        conn: Remote,
        table: String,
        call: CString,
    },
}

/// Where a round stands in the training, for corgipile.progress.
struct RoundProgress {
    /// "statistics" or "round r/R".
    label: String,
    /// Fraction of the epoch done before this round, and tuples trained so far this epoch.
    fraction: f64,
    tuples: u64,
}

impl RoundProgress {
    /// Shows the round and each shard's state: done (with its tuples or rows) or running since.
    fn report(&self, shards: &[Shard], replies: &[Option<RoundReply>], sent: Instant, force: bool) {
        progress::shard_rounds(
            self.fraction,
            self.tuples,
            || {
                let states: Vec<String> = shards
                    .iter()
                    .zip(replies)
                    .map(|(shard, reply)| match reply {
                        Some(r) => format!("{} done {} rows", shard.name, r.tuples.max(r.rows)),
                        None => format!(
                            "{} running {:.1} s",
                            shard.name,
                            sent.elapsed().as_secs_f64()
                        ),
                    })
                    .collect();
                format!("{}: {}", self.label, states.join(", "))
            },
            force,
        );
    }
}

/// Runs one request on every shard at once (remote ones first, then the local ones here, while
/// the remote ones work) and returns their replies in shard order.
unsafe fn round(
    shards: &mut [Shard],
    request: &RoundRequest,
    model: &str,
    params_json: &str,
    run_local: &dyn Fn(pg_sys::Oid, &RoundRequest) -> RoundReply,
    bytes: &mut u64,
    at: &RoundProgress,
) -> Vec<RoundReply> {
    let request_json = serde_json::to_string(request).expect("request serializes");
    let sent = Instant::now();
    let mut replies: Vec<Option<RoundReply>> = shards.iter().map(|_| None).collect();
    at.report(shards, &replies, sent, true);
    for shard in shards.iter_mut() {
        if let Place::Remote { conn, table, call } = &mut shard.place {
            *bytes += request_json.len() as u64;
            conn.send(call, &[table, model, params_json, &request_json]);
        }
    }
    // A reply is parsed within four times corgipile.max_model_memory (it carries at most one model's
    // worth of numbers) and checked against the request before it is used: it may come from
    // code the shard's role wrote.
    let limit = crate::pg::guc::max_wire_bytes();
    for (i, shard) in shards.iter_mut().enumerate() {
        if let Place::Local(oid) = shard.place {
            let started = Instant::now();
            replies[i] = Some(run_local(oid, request));
            shard.seconds += started.elapsed().as_secs_f64();
        }
    }
    loop {
        let mut waiting = false;
        for (i, shard) in shards.iter_mut().enumerate() {
            if replies[i].is_some() {
                continue;
            }
            let Place::Remote { conn, .. } = &mut shard.place else {
                continue;
            };
            if conn.ready() {
                shard.seconds += sent.elapsed().as_secs_f64();
                let parsed = conn
                    .result_with(|text| {
                        (text.len(), wire::parse_bounded::<RoundReply>(text, limit))
                    })
                    .unwrap_or((0, Err(WireError::Invalid("no answer".into()))));
                *bytes += parsed.0 as u64;
                let reply = parsed
                    .1
                    .and_then(|r| r.check(request).map(|()| r).map_err(WireError::Invalid))
                    .unwrap_or_else(|e| bad_reply(&shard.name, e));
                replies[i] = Some(reply);
            } else {
                waiting = true;
            }
        }
        if !waiting {
            break;
        }
        at.report(shards, &replies, sent, false);
        check_for_interrupts!();
        pg_sys::pg_usleep(1000);
    }
    replies
        .into_iter()
        .map(|r| r.expect("every shard answered"))
        .collect()
}

/// Raises for a shard's reply that could not be read or does not answer the request.
fn bad_reply(shard: &str, e: WireError) -> ! {
    match e {
        WireError::TooLarge { .. } => raise(
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!("shard server \"{shard}\" sent an answer too large to read: {e} (corgipile.max_model_memory)"),
            Some("A shard's answer carries one model or its statistics: raise corgipile.max_model_memory if the model is really that large.".into()),
        ),
        WireError::Invalid(why) => raise(
            PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
            format!("shard server \"{shard}\" sent an answer corgipile cannot use: {why}"),
            Some("The shard must run corgipile's own corgipile_shard_round, of this version.".into()),
        ),
    }
}

/// Connects to every remote shard through its foreign server's user mapping and checks that it
/// runs this corgipile version.
///
/// # Safety
/// Backend thread, inside a transaction.
unsafe fn open_shards(leaves: Vec<Leaf>, version: &str) -> Vec<Shard> {
    let mut shards: Vec<Shard> = Vec::new();
    for leaf in leaves {
        let (name, place) = match leaf {
            Leaf::Local(oid) => (
                format!(
                    "local partition {}",
                    crate::request::query::relation_name(oid)
                ),
                Place::Local(oid),
            ),
            Leaf::Remote { server, table } => {
                let mut conn = Remote::connect(server);
                let theirs = conn.query(
                    c"SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'corgipile'",
                    &[],
                );
                match theirs {
                    None => raise(
                        PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
                        format!("corgipile is not installed on shard server \"{}\"", conn.server),
                        Some(format!("Run CREATE EXTENSION corgipile VERSION '{version}' in the shard's database.")),
                    ),
                    Some(v) if v != version => raise(
                        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                        format!("shard server \"{}\" has corgipile {v}, this server {version}", conn.server),
                        Some("Install the same corgipile version on every server (ALTER EXTENSION corgipile UPDATE).".into()),
                    ),
                    Some(_) => {}
                }
                let schema = conn
                    .query(
                        c"SELECT pg_catalog.quote_ident(n.nspname) FROM pg_catalog.pg_extension e
                          JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
                          WHERE e.extname OPERATOR(pg_catalog.=) 'corgipile'",
                        &[],
                    )
                    .unwrap_or_default();
                let call = CString::new(format!(
                    "SELECT {schema}.corgipile_shard_round($1::pg_catalog.regclass, $2::pg_catalog.text, $3::pg_catalog.jsonb, $4::pg_catalog.text)"
                ))
                .expect("a quoted identifier has no NUL");
                (conn.server.clone(), Place::Remote { conn, table, call })
            }
        };
        shards.push(Shard {
            name,
            place,
            tuples: 0,
            seconds: 0.0,
        });
    }
    shards
}

/// The params a shard runs with: the coordinator's, one process, silently, its own table only.
fn shard_params(params: &corgipile_ml::params::TrainParams) -> String {
    let mut shard_params = params.clone();
    shard_params.verbose = false;
    shard_params.workers = 0;
    shard_params.only = true;
    serde_json::to_string(&shard_params.to_json()).expect("params serialize")
}

/// Scores a stored model on every shard of a sharded table (`request`: the model) and merges
/// the shards' metrics into `evaluation` (an [`Evaluation::mergeable`]); returns the rows the
/// shards' readers skipped. `run_local` runs the request on a local partition in this backend.
///
/// # Safety
/// Backend thread, inside a transaction (a SQL function's call).
pub unsafe fn evaluate(
    leaves: Vec<Leaf>,
    config: &PipelineConfig,
    model: EvaluateRequest,
    run_local: &dyn Fn(pg_sys::Oid, &RoundRequest) -> RoundReply,
    evaluation: &mut Evaluation,
) -> u64 {
    let kind = config.model;
    let _progress = progress::start(&config.relation, kind.name(), 1);
    progress::phase("evaluation");
    let version = env!("CARGO_PKG_VERSION").to_string();
    let mut shards = open_shards(leaves, &version);
    let request = RoundRequest {
        version,
        phase: Phase::Evaluate,
        epoch: 1,
        round: 0,
        rounds: 1,
        n_features: model.model.n_features(),
        weights: Vec::new(),
        bias: Vec::new(),
        extras: LearnedStatistics::default(),
        evaluate: Some(model),
        network: None,
    };
    let at = RoundProgress {
        label: "evaluation".into(),
        fraction: 0.0,
        tuples: 0,
    };
    let mut bytes = 0;
    let replies = round(
        &mut shards,
        &request,
        kind.name(),
        &shard_params(&config.params),
        run_local,
        &mut bytes,
        &at,
    );
    let mut rows_skipped = 0u64;
    for (reply, shard) in replies.iter().zip(&shards) {
        let Some(part) = &reply.evaluation else {
            raise(
                PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
                format!("shard server \"{}\" sent no evaluation", shard.name),
                None,
            )
        };
        evaluation.merge(part);
        rows_skipped = rows_skipped.saturating_add(reply.rows_skipped);
    }
    progress::finish();
    rows_skipped
}

/// Trains `config`'s model over the shards of a sharded table. `run_local` runs a request on a
/// local partition in this backend.
///
/// # Safety
/// Backend thread, inside a transaction (a SQL function's call).
pub unsafe fn train(
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
    progress::phase("statistics pass");
    let stats_started = Instant::now();
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
    let at = RoundProgress {
        label: "statistics".into(),
        fraction: 0.0,
        tuples: 0,
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
    let mut stats: Option<FeatureStats> = None;
    let mut width: Option<(usize, &str)> = None;
    let mut rows_skipped = 0u64;
    for (reply, shard) in replies.iter().zip(&shards) {
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
    let statistics_seconds = stats_started.elapsed().as_secs_f64();
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
    let mut extras = LearnedStatistics::default();
    let mut train_config = params.train_config(kind);
    if params.normalize {
        let sparse = matches!(config.layout, FeatureLayout::Sparse { .. });
        extras.standardizer = Some(normalizing_scaler(&stats, sparse, params.fit_intercept));
    }
    // A network: its classes (the shards' label values, ascending) and its initial weights.
    let network = kind
        .is_network()
        .then(|| network_plan(config, &stats, n_features, &mut extras));
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
    let outputs = 1usize;
    let (n_weights, mut model_rounds) = match &network {
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
            let n_weights = n_features * outputs;
            // Linear regression moves by the mean of the shards' changes too: the sum of
            // changes each made from the same stale start overshoots an unbounded squared-loss
            // gradient (measured: diverged in epoch 1 with 3 shards). Classifiers keep the sum,
            // which keeps shards that hold one class each from collapsing to the majority.
            let regression = kind.labels() == corgipile_ml::model::Labels::Number;
            (
                n_weights,
                DeltaRounds::new(n_weights + outputs, average_from).with_mean_of_parts(regression),
            )
        }
    };
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
    let lr_schedule = train_config.schedule;
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
    let mut weights = model_rounds.finish();
    let mut model = match network {
        Some(plan) => {
            let net = Network {
                params: weights,
                ..plan.shape
            };
            Model::Network(network_model(kind, net, plan.target))
        }
        None => {
            let bias = weights.split_off(n_weights);
            Model::Linear(LinearModel {
                kind,
                n_features,
                n_outputs: outputs,
                weights,
                bias,
            })
        }
    };
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
