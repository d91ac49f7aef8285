//! A model sized by the statistics pass (a network) over a sharded table: what the coordinator
//! decides before the first round (its classes, target, initial weights).

use crate::exec::sgd::checked_learner;
use crate::pg::error::{raise, raise_labels_error, raise_train_error};
use crate::pipeline::protocol::NetworkRound;
use crate::pipeline::ClassValue;
use crate::pipeline::{LearnedStatistics, PipelineConfig};
use corgipile_ml::learner::Learner;
use corgipile_ml::learner::Shape;
use corgipile_ml::network::Target;
use corgipile_ml::stats::FeatureStats;
use corgipile_ml::trainer::settle_labels;
use pgrx::PgSqlErrorCode;

/// What the coordinator decides of a network before the first round.
pub(super) struct NetworkPlan {
    /// A learner of the model's shape: the model the shards' combined parameters make.
    pub learner: Learner,
    /// The seeded initial parameters every shard's first round starts from.
    pub initial: Vec<f64>,
    pub round: NetworkRound,
}

/// A network over the shards: its classes are `merged`, every shard's classes merged by the
/// coordinator (a label numbered by class: `stats` counts rows by their indices), or else the
/// label values the shards counted, ascending (every shard numbers them so:
/// `NetworkRound::classes`), class weights by that numbering, a
/// regression's target standardized by the label's moments over all shards; its size checked
/// against corgipile.max_model_memory before it is built.
pub(super) fn network_plan(
    config: &PipelineConfig,
    stats: &FeatureStats,
    n_features: usize,
    merged: &[ClassValue],
    extras: &mut LearnedStatistics,
) -> NetworkPlan {
    let kind = config.model;
    let params = &config.params;
    let counts = stats.class_counts();
    let numbered = !merged.is_empty();
    let classes: Vec<ClassValue> = if !kind.is_classifier() {
        Vec::new()
    } else if numbered {
        merged.to_vec()
    } else {
        counts.iter().map(|&(v, _)| ClassValue::Number(v)).collect()
    };
    if kind.is_classifier() && classes.len() < 2 {
        raise(
            PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
            format!(
                "the label column of {} has {} distinct values on its shards",
                config.relation,
                classes.len()
            ),
            Some("Classifiers need rows of at least two classes.".into()),
        );
    }
    if let (Some(class_weight), true) = (&params.class_weight, kind.is_classifier()) {
        // By class index, as the shards' trainers see the labels (merged classes: counted so).
        let by_index: Vec<(f64, u64)> = if numbered {
            counts.clone()
        } else {
            counts
                .iter()
                .enumerate()
                .map(|(i, &(_, n))| (i as f64, n))
                .collect()
        };
        let text = |i: f64| {
            classes
                .get(i as usize)
                .map_or(i.to_string(), |c| c.to_text())
        };
        let settled = settle_labels(kind, &by_index, Some(class_weight), &text)
            .unwrap_or_else(|e| raise_labels_error(e, &config.relation, " on its shards"));
        extras.class_weights = settled.class_weights;
    }
    let (mean, variance) = stats.label_mean_variance();
    let target = Target::new(mean, variance.sqrt());
    let outputs = if kind.is_classifier() {
        classes.len()
    } else {
        1
    };
    let shape = Shape {
        n_features,
        outputs,
        target,
    };
    let mut learner = checked_learner(
        kind,
        params.train_config(kind),
        params,
        &shape,
        crate::pg::guc::max_model_bytes(),
    )
    .unwrap_or_else(|e| raise_train_error(e, &|v| v.to_string(), false));
    let initial = learner.parameters();
    NetworkPlan {
        learner,
        initial,
        round: NetworkRound {
            classes,
            target_mean: target.mean,
            target_scale: target.scale,
        },
    }
}
