//! Round 0 of a training over a sharded table and the plan every shard trains by: every
//! shard's statistics (and a column list's preprocessing statistics) checked and merged, then
//! the scaling, labels, a network's shape and how the shards' changes combine.

use super::coordinator::{bad_reply, round, RoundProgress, Shard};
use crate::decode::columns::raise_merged_statistics_error;
use crate::exec::sgd::LearnedStatistics;
use crate::pg::error::{raise, raise_labels_error, raise_train_error};
use crate::pg::progress;
use crate::pipeline::protocol::{merge_classes, merged_index, RoundReply, RoundRequest};
use crate::pipeline::PreprocessSpec;
use crate::pipeline::{ClassValue, LabelCoding};
use crate::pipeline::{FeatureLayout, PipelineConfig};
use crate::shard::network::{network_plan, NetworkPlan};
use corgipile_ml::divergence::zero_model_loss;
use corgipile_ml::limits::model_memory_bytes;
use corgipile_ml::model::ModelKind;
use corgipile_ml::params::{Features, TrainParams};
use corgipile_ml::preprocess::{ColumnPlan, MergeError, Preprocessor, StatsBuilder};
use corgipile_ml::stats::FeatureStats;
use corgipile_ml::trainer::{
    normalizing_scaler, settle_labels, DeltaRounds, TrainError, MAX_CLASSES,
};
use corgipile_ml::wire::WireError;
use pgrx::{pg_sys, PgSqlErrorCode};
use std::time::Instant;

/// What round 0 found on every shard.
pub(super) struct RoundZero {
    /// A list of feature columns: the preprocessing every shard's statistics give, merged.
    pub(super) preprocessing: Option<Preprocessor>,
    /// Rows counted by class index of `classes` when the label is numbered by class.
    pub(super) stats: FeatureStats,
    /// A label numbered by class (softmax, a network's classes, a text label): every shard's
    /// classes in one numbering (`merge_classes`). Empty otherwise.
    pub(super) classes: Vec<ClassValue>,
    pub(super) n_features: usize,
    pub(super) rows_skipped: u64,
    pub(super) seconds: f64,
    /// Each shard's table mark (`pipeline::mark`), by shard.
    pub(super) marks: Vec<Option<crate::pipeline::mark::TableMark>>,
    /// The shards' class shares differ: a network's or fm's rounds correct each shard's drift
    /// (`corgipile_ml::trainer::unlike_shards`).
    pub(super) unlike: bool,
    /// `"group_by"`: every shard's groups added up and numbered (`training::groups`).
    pub(super) groups: Option<crate::pipeline::GroupsFound>,
}

/// Refuses (08P01 naming the server) a statistics reply whose classes are not its label's:
/// numbers or texts as the label column holds them, with their rows counted by class, or none
/// for a label not numbered by class.
fn check_reply_classes(config: &PipelineConfig, replies: &[RoundReply], shards: &[Shard]) {
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
}

/// What every shard trains by, from round 0's statistics.
pub(super) struct ShardPlan {
    pub(super) extras: LearnedStatistics,
    pub(super) network: Option<NetworkPlan>,
    /// A regression's zero model's loss (see `corgipile_ml::divergence`).
    pub(super) zero_loss: Option<f64>,
    /// The combined parameters, round by round; the first `n_weights` are the weights.
    pub(super) model_rounds: DeltaRounds,
    pub(super) n_weights: usize,
    /// A linear model's outputs: one per class for softmax, else one.
    pub(super) outputs: usize,
}

/// Round 0: every shard's statistics, merged; the rows' width (every shard's must agree) and
/// the model's size checked before anything is allocated.
pub(super) unsafe fn statistics_round(
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
    check_reply_classes(config, &replies, shards);
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
    // Each shard's rows by class, in the merged numbering (`unlike_shards`).
    let mut shard_classes: Vec<Vec<(f64, u64)>> = Vec::new();
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
            shard_classes.push(s.class_counts());
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
            // A warm start's column list: the stored model's preprocessing, as sent.
            config.fixed_preprocessing().cloned()
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
        marks: replies.iter().map(|r| r.mark).collect(),
        groups: super::training::groups::merged(config, &replies, shards),
        unlike: corgipile_ml::trainer::unlike_shards(&shard_classes),
    }
}

/// What every shard trains by: the scaling (`normalize`, or a column list's preprocessing), a
/// binary kind's two labels and class weights, a softmax's classes and class weights, a
/// network's classes and initial weights, and how the shards' changes combine. `classes`: the
/// merged classes of a label numbered by class (`stats` counts rows by their indices), else
/// empty. `fixed_labels`: a warm start's binary labels (the stored model's), else settled
/// from the counts.
pub(super) fn shard_plan(
    config: &PipelineConfig,
    stats: &FeatureStats,
    n_features: usize,
    classes: &[ClassValue],
    preprocessing: Option<&Preprocessor>,
    fixed_labels: Option<(f64, f64)>,
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
        let counts = match fixed_labels.filter(|_| kind.is_binary()) {
            Some(values) => binary_counts(values, &stats.class_counts(), &label_text),
            None => stats.class_counts(),
        };
        let settled = settle_labels(kind, &counts, params.class_weight.as_ref(), &label_text)
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
    // Rounds. A network's parameters travel in `weights` (see `RoundRequest::network`); these
    // are the first configuration's (a search's others: `NetworkPlan::rounds`).
    let (n_weights, model_rounds) = match &network {
        Some(plan) => (plan.initials[0].len(), plan.rounds(0)),
        None => {
            let n_weights = n_features * outputs;
            (n_weights, linear_rounds(kind, params, n_weights, outputs))
        }
    };
    ShardPlan {
        extras,
        network,
        zero_loss,
        model_rounds,
        n_weights,
        outputs,
    }
}

/// How a linear model of `n_weights` weights and `outputs` biases trained as `params` say
/// combines the shards' changes, from zeros.
pub(super) fn linear_rounds(
    kind: ModelKind,
    params: &TrainParams,
    n_weights: usize,
    outputs: usize,
) -> DeltaRounds {
    let average_from = params
        .average
        .then_some(if params.epochs >= 2 { 2 } else { 1 });
    // Linear regression moves by the mean of the shards' changes too: the sum of changes each
    // made from the same stale start overshoots an unbounded squared-loss gradient (measured:
    // diverged in epoch 1 with 3 shards). Classifiers keep the sum, which keeps shards that
    // hold one class each from collapsing to the majority.
    let regression = kind.labels() == corgipile_ml::model::Labels::Number;
    DeltaRounds::new(n_weights + outputs, average_from).with_mean_of_parts(regression)
}

/// A list of feature columns' plans (resolved by the coordinator on the sharded table) and
/// its `max_categories`; None for other features.
pub(super) fn plans(config: &PipelineConfig) -> Option<(&[ColumnPlan], usize)> {
    match &config.preprocess {
        Some(PreprocessSpec::Learn {
            plans,
            max_categories,
        }) => Some((plans, *max_categories as usize)),
        _ => None,
    }
}

/// A binary kind's rows counted by label (`counts`, as the statistics round found them), for
/// the stored model's two labels (`values`, negative then positive) in that order, a label
/// the rows lack counted 0: a third label is one server's ERROR (the trainer's labels are
/// fixed before the first row).
pub(super) fn binary_counts(
    (negative, positive): (f64, f64),
    counts: &[(f64, u64)],
    label_text: &dyn Fn(f64) -> String,
) -> Vec<(f64, u64)> {
    if let Some(&(other, _)) = counts
        .iter()
        .find(|(v, _)| *v != negative && *v != positive)
    {
        raise_train_error(
            TrainError::TooManyLabels {
                values: [negative, positive, other],
            },
            label_text,
            false,
        );
    }
    let rows = |label: f64| {
        counts
            .iter()
            .find(|(v, _)| *v == label)
            .map_or(0, |&(_, n)| n)
    };
    vec![(negative, rows(negative)), (positive, rows(positive))]
}

/// The params every shard runs with: a list of feature columns (or `"*"`) as the coordinator
/// resolved it on the sharded table, by name, so that every shard reads the same columns in
/// the same order whatever else its table has.
pub(super) fn params_for_shards(config: &PipelineConfig) -> TrainParams {
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
