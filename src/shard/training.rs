//! The coordinator's training over a sharded table: round 0 (every shard's statistics,
//! merged), the plan every shard trains by (scaling, labels, a network's shape, how the
//! shards' changes combine), then the epochs' rounds under the policy one server runs
//! (`corgipile_ml::fit`), and the combined model.

use super::coordinator::{
    bad_reply, open_shards, round, shard_params, RoundProgress, Shard, ShardLine, ShardSummary,
};
use super::leaves::Leaf;
use crate::decode::columns::raise_merged_statistics_error;
use crate::exec::sgd::{raise_diverged, LearnedStatistics};
use crate::pg::error::{notice, raise, raise_labels_error, raise_train_error};
use crate::pg::progress;
use crate::pipeline::protocol::{
    merge_classes, merged_index, this_version, EvaluateRequest, NetworkRound, Phase, RoundReply,
    RoundRequest, PROTOCOL,
};
use crate::pipeline::PreprocessSpec;
use crate::pipeline::{ClassValue, LabelCoding};
use crate::pipeline::{FeatureLayout, PipelineConfig, TrainOutcome};
use crate::shard::network::{network_plan, NetworkPlan};
use corgipile_ml::divergence::{diverged, zero_model_loss};
use corgipile_ml::fit::{EpochEnd, Fit, LearnerPlan, Notices};
use corgipile_ml::limits::model_memory_bytes;
use corgipile_ml::model::{LinearModel, ModelKind, Predictor};
use corgipile_ml::params::{Features, TrainParams};
use corgipile_ml::preprocess::{ColumnPlan, MergeError, Preprocessor, StatsBuilder};
use corgipile_ml::scoring::{BinaryLabels, ValidationScore, ValidationStats};
use corgipile_ml::standardize::Standardizer;
use corgipile_ml::stats::FeatureStats;
use corgipile_ml::trained::Model;
use corgipile_ml::trainer::{
    normalizing_scaler, settle_labels, shard_line, DeltaRounds, EpochPart, EpochRecord,
    EpochTotals, LrSchedule, TrainError, MAX_CLASSES,
};
use corgipile_ml::wire::WireError;
use pgrx::{pg_sys, PgSqlErrorCode};
use std::time::Instant;

/// What round 0 found on every shard.
struct RoundZero {
    /// A list of feature columns: the preprocessing every shard's statistics give, merged.
    preprocessing: Option<Preprocessor>,
    /// Rows counted by class index of `classes` when the label is numbered by class.
    stats: FeatureStats,
    /// A label numbered by class (softmax, a network's classes, a text label): every shard's
    /// classes in one numbering (`merge_classes`). Empty otherwise.
    classes: Vec<ClassValue>,
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
    /// A linear model's outputs: one per class for softmax, else one.
    outputs: usize,
}

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
    let version = this_version().to_string();
    let mut shards = open_shards(leaves, &version);
    let params_json = shard_params(&params_for_shards(config));
    // Round 0: statistics.
    let mut request = RoundRequest {
        version: version.clone(),
        protocol: PROTOCOL,
        phase: Phase::Statistics,
        training: training_number(),
        epoch: 1,
        round: 0,
        rounds: 1,
        n_features: 0,
        weights: Vec::new(),
        bias: Vec::new(),
        extras: LearnedStatistics::default(),
        evaluate: None,
        network: None,
        classes: Vec::new(),
        preprocessing: None,
        // A timestamptz column is read on the wall clock of this session's time zone.
        zone: plans(config).and_then(|(plans, _)| plans.iter().find_map(|p| p.zone.clone())),
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
        preprocessing,
        stats,
        classes: numbered,
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
        outputs,
    } = shard_plan(
        config,
        &stats,
        n_features,
        &numbered,
        preprocessing.as_ref(),
    );
    let rounds = params.sync_rounds(model_rounds.params().len());
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
    let mut network = network;
    let standardizer = extras.standardizer.clone();
    let label_values = extras.label_values;
    let mut rows_trained = 0;
    request.phase = Phase::Train;
    request.n_features = n_features;
    request.extras = extras;
    request.zone = None;
    // A list of feature columns: every shard encodes its rows with the merged preprocessing.
    request.preprocessing.clone_from(&preprocessing);
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
                kind,
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
        // The epoch's model scored on the rows every shard held out.
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
                let round_request = validation_request(&request, &model, label_values, &numbered);
                let replies = round(
                    &mut shards,
                    &round_request,
                    kind,
                    &params_json,
                    run_local,
                    &mut bytes,
                    &RoundProgress {
                        label: "validation".into(),
                        fraction: 1.0,
                        tuples: totals.tuples,
                    },
                );
                record.validation = Some(pooled_validation(kind, label_values, &replies));
                (Some(model), validation_started.elapsed().as_secs_f64())
            }
            false => (None, 0.0),
        };
        record.validation_seconds = validation_seconds;
        if params.verbose {
            notice_epoch(params.epochs, &record, &shards, rounds, bytes);
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
    // The local partitions' optimizer states (the remote shards' go with their connections).
    crate::exec::sgd::forget_kept();
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
        shards: shards.iter().map(ShardLine::of).collect(),
        rounds_per_epoch: rounds,
        bytes_per_epoch: bytes,
    };
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
    (outcome, summary)
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
        }),
        network: None,
        classes: Vec::new(),
        // Its rows were encoded when they were held out.
        preprocessing: None,
        zone: None,
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
        config.model,
        params_json,
        run_local,
        bytes,
        &at,
    );
    // A label numbered by class: every shard's classes in one numbering, and each shard's
    // counts by its own class indices renumbered into it before they merge.
    let uses_classes = config.label.uses_classes();
    let texts = config.label == LabelCoding::ClassOfText;
    for (reply, shard) in replies.iter().zip(shards.iter()) {
        let fits = if uses_classes {
            // Its rows' classes, numbers or texts as the label column holds them; rows counted
            // by class come with them (`RoundReply::check`: by their indices).
            reply
                .classes
                .iter()
                .all(|c| matches!(c, ClassValue::Text(_)) == texts)
                && (!reply.classes.is_empty()
                    || reply
                        .stats
                        .as_ref()
                        .is_none_or(|s| s.class_counts().is_empty()))
        } else {
            reply.classes.is_empty()
        };
        if !fits {
            raise(
                PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
                format!("shard server \"{}\" sent an answer corgipile cannot use: classes other than its label's", shard.name),
                Some("The shard must run corgipile's own corgipile_shard_round, of this version.".into()),
            );
        }
    }
    let classes = if uses_classes {
        merge_classes(replies.iter().map(|r| r.classes.as_slice()))
    } else {
        Vec::new()
    };
    if classes.len() > MAX_CLASSES {
        raise(
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!(
                "the label column of {} has {} distinct values on its shards, more than {MAX_CLASSES}",
                config.relation,
                classes.len()
            ),
            Some(format!("softmax supports at most {MAX_CLASSES} classes.")),
        );
    }
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
            let renumbered;
            let s = if reply.classes.is_empty() {
                s
            } else {
                // Every class of the shard is in the merged list (made from it).
                let to: Vec<f64> = reply
                    .classes
                    .iter()
                    .map(|c| merged_index(&classes, c).expect("a merged class") as f64)
                    .collect();
                let mut r = s.clone();
                r.relabel_classes(&to);
                renumbered = r;
                &renumbered
            };
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
    // A list of feature columns: every shard's statistics of them, merged (in the shards'
    // order) into the preprocessing one pass over all their rows would give.
    let preprocessing = match plans(config) {
        Some((plans, max_categories)) => Some(merged_preprocessing(
            config,
            plans,
            max_categories,
            &replies,
            shards,
        )),
        None => {
            if let Some(shard) = replies
                .iter()
                .zip(shards.iter())
                .find_map(|(r, s)| r.columns.is_some().then_some(s))
            {
                bad_reply(
                    &shard.name,
                    WireError::Invalid(
                        "statistics of feature columns the training does not read".into(),
                    ),
                );
            }
            None
        }
    };
    let n_features = match (&preprocessing, config.layout) {
        (Some(p), _) => p.n_features,
        (None, FeatureLayout::Sparse { n_features, .. }) => n_features.unwrap_or(0) as usize,
        (None, _) => width.map_or(stats.n_features(), |w| w.0),
    };
    // The shards said how wide the rows are (and a softmax's classes): the model must fit
    // before it is allocated. (A network's size is checked as it is planned.)
    let outputs = if config.model.family().sized_by_statistics() {
        1
    } else {
        config.model.outputs_for(classes.len()).max(1)
    };
    match &preprocessing {
        // The kept categories' names and lookup entries count too, as on one server.
        Some(p) => crate::pg::guc::check_model_and_dictionaries(
            n_features as u64,
            outputs as u64,
            p.category_bytes(),
            crate::pg::guc::max_model_bytes(),
            "the encoded feature columns (numbers, array elements, kept categories and hash buckets)",
        ),
        None => crate::pg::guc::check_model_size(
            n_features as u64,
            outputs as u64,
            crate::pg::guc::max_model_bytes(),
            "the rows of the shards",
        ),
    }
    RoundZero {
        preprocessing,
        stats,
        classes,
        n_features,
        rows_skipped,
        seconds: stats_started.elapsed().as_secs_f64(),
    }
}

/// What every shard trains by: the scaling (`normalize`, or a column list's preprocessing), a
/// binary kind's two labels and class weights, a softmax's classes and class weights, a
/// network's classes and initial weights, and how the shards' changes combine. `classes`: the
/// merged classes of a label numbered by class (`stats` counts rows by their indices), else
/// empty.
fn shard_plan(
    config: &PipelineConfig,
    stats: &FeatureStats,
    n_features: usize,
    classes: &[ClassValue],
    preprocessing: Option<&Preprocessor>,
) -> ShardPlan {
    let params = &config.params;
    let kind = config.model;
    let mut extras = LearnedStatistics::default();
    let mut train_config = params.train_config(kind);
    match preprocessing {
        // A list of feature columns is scaled as its preprocessing says (each column's
        // "scale"), from the merged moments: what one server's training applies.
        Some(p) => extras.standardizer = Some(p.scaling(params.fit_intercept)),
        None if params.normalize => {
            let sparse = matches!(config.layout, FeatureLayout::Sparse { .. });
            extras.standardizer = Some(normalizing_scaler(stats, sparse, params.fit_intercept));
        }
        None => {}
    }
    // A network: its classes (the merged ones, or the shards' label values ascending) and its
    // initial weights.
    let network = kind
        .family()
        .sized_by_statistics()
        .then(|| network_plan(config, stats, n_features, classes, &mut extras));
    // Labels named as class_weight names them: a class numbered by the coordinator by its
    // value or text, a label value as itself.
    let label_text = |v: f64| match classes.get(v as usize) {
        Some(c) => c.to_text(),
        None => config.label.value_text(v),
    };
    let softmax = network.is_none() && kind.has_class_outputs();
    if softmax && classes.len() < 2 {
        raise(
            PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
            format!(
                "the label column of {} has only one distinct value (on its shards)",
                config.relation
            ),
            Some("Classifiers need rows of at least two classes.".into()),
        );
    }
    if kind.is_binary() || (softmax && params.class_weight.is_some()) {
        let settled = settle_labels(
            kind,
            &stats.class_counts(),
            params.class_weight.as_ref(),
            &label_text,
        )
        .unwrap_or_else(|e| raise_labels_error(e, &config.relation, " on its shards"));
        extras.label_values = settled.label_values;
        extras.class_weights = settled.class_weights;
    }
    let outputs = if softmax { classes.len() } else { 1 };
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
    ShardPlan {
        extras,
        schedule: train_config.schedule,
        network,
        zero_loss,
        model_rounds,
        n_weights,
        outputs,
    }
}

/// A list of feature columns' plans (resolved by the coordinator on the sharded table) and
/// its `max_categories`; None for other features.
fn plans(config: &PipelineConfig) -> Option<(&[ColumnPlan], usize)> {
    match &config.preprocess {
        Some(PreprocessSpec::Learn {
            plans,
            max_categories,
        }) => Some((plans, *max_categories as usize)),
        _ => None,
    }
}

/// The params every shard runs with: a list of feature columns (or `"*"`) as the coordinator
/// resolved it on the sharded table, by name, so that every shard reads the same columns in
/// the same order whatever else its table has.
fn params_for_shards(config: &PipelineConfig) -> TrainParams {
    let mut params = config.params.clone();
    if let Some((plans, _)) = plans(config) {
        params.features = Features::Columns(plans.iter().map(|p| p.name.clone()).collect());
        params.exclude.clear();
    }
    params
}

/// The preprocessing of a list of feature columns: every shard's statistics of them (sent in
/// round 0, checked against the coordinator's own `plans`) merged in the shards' order, within
/// the bounds of one server's statistics pass (corgipile.max_buffer_memory for the category
/// dictionaries, corgipile.max_model_memory for the width), then finished as one server's is.
fn merged_preprocessing(
    config: &PipelineConfig,
    plans: &[ColumnPlan],
    max_categories: usize,
    replies: &[RoundReply],
    shards: &[Shard],
) -> Preprocessor {
    let relation = config.relation.as_str();
    let mut merged = StatsBuilder::new(
        plans.to_vec(),
        usize::try_from(config.max_buffer_bytes).unwrap_or(usize::MAX),
        usize::try_from(config.max_model_bytes / model_memory_bytes(1, 1)).unwrap_or(usize::MAX),
    )
    .unwrap_or_else(|e| raise_merged_statistics_error(e, relation));
    for (reply, shard) in replies.iter().zip(shards) {
        let Some(part) = &reply.columns else {
            bad_reply(
                &shard.name,
                WireError::Invalid("no statistics of the feature columns".into()),
            )
        };
        match merged.merge(part) {
            Ok(()) => {}
            Err(MergeError::Invalid(why)) => bad_reply(&shard.name, WireError::Invalid(why)),
            Err(MergeError::Limit(e)) => raise_merged_statistics_error(e, relation),
        }
    }
    let p = merged
        .finish(max_categories)
        .unwrap_or_else(|e| raise_merged_statistics_error(e, relation));
    if let Some(column) = p.not_finite_column() {
        raise(
            PgSqlErrorCode::ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
            format!("{relation}, over its shards: the mean or standard deviation of column \"{column}\" is not a finite number"),
            Some("Its values are too large to average: scale the column in a view, or leave it out.".into()),
        );
    }
    p
}
