//! A model sized by the statistics pass (a network) over a sharded table: what the coordinator
//! decides before the first round (its classes, target, and each configuration's initial
//! weights: a search's networks may differ in shape).

use crate::exec::sgd::{checked_learner, checked_size};
use crate::pg::error::{raise, raise_labels_error, raise_param_error, raise_train_error};
use crate::pipeline::protocol::NetworkRound;
use crate::pipeline::ClassValue;
use crate::pipeline::{LearnedStatistics, PipelineConfig};
use corgipile_ml::learner::Learner;
use corgipile_ml::learner::Shape;
use corgipile_ml::network::Target;
use corgipile_ml::stats::FeatureStats;
use corgipile_ml::trainer::{settle_labels, DeltaRounds};
use pgrx::PgSqlErrorCode;

/// What the coordinator decides of a network before the first round.
pub(super) struct NetworkPlan {
    /// Per configuration of the search (one without a search), a learner of its shape: the
    /// model the shards' combined parameters of it make.
    pub learners: Vec<Learner>,
    /// Per configuration, the seeded initial parameters its learners' first round starts from.
    pub initials: Vec<Vec<f64>>,
    pub round: NetworkRound,
}

impl NetworkPlan {
    /// The rounds of a learner of configuration `c`, from its initial parameters. A network
    /// moves by the mean of the shards' changes (federated averaging): each shard's optimizer
    /// carries its own momentum between rounds, and their sum overshoots (measured: SGD with
    /// momentum diverged, one round per epoch lost 1.0 of R²); the mean is stable whatever the
    /// optimizer and "sync".
    pub fn rounds(&self, c: usize) -> DeltaRounds {
        DeltaRounds::starting_from(self.initials[c].clone(), true)
    }

    /// The most parameters a configuration's network has (what sizes the rounds of an epoch).
    pub fn most_parameters(&self) -> usize {
        self.initials.iter().map(Vec::len).max().unwrap_or(0)
    }
}

/// A network over the shards: its classes are `merged`, every shard's classes merged by the
/// coordinator (a label numbered by class: `stats` counts rows by their indices), or else the
/// label values the shards counted, ascending (every shard numbers them so:
/// `NetworkRound::classes`), class weights by that numbering, a
/// regression's target standardized by the label's moments over all shards; each
/// configuration's network checked against its share of corgipile.max_model_memory (every
/// learner of the training has one, as on one server) before it is built.
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
    let configurations = params
        .configurations(kind)
        .unwrap_or_else(|e| raise_param_error(e));
    // Every learner's size first, then any is built.
    for (_, p) in &configurations {
        checked_size(kind, p, &shape, config.max_model_bytes);
    }
    let mut learners = Vec::with_capacity(configurations.len());
    let mut initials = Vec::with_capacity(configurations.len());
    for (_, p) in &configurations {
        let mut learner = checked_learner(
            kind,
            p.train_config(kind),
            p,
            &shape,
            config.max_model_bytes,
        )
        .unwrap_or_else(|e| raise_train_error(e, &|v| v.to_string(), false));
        initials.push(learner.parameters());
        learners.push(learner);
    }
    NetworkPlan {
        learners,
        initials,
        round: NetworkRound {
            classes,
            target_mean: target.mean,
            target_scale: target.scale,
        },
    }
}
