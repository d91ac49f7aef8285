//! `"warm_start"` over a sharded table: the coordinator loads and checks the stored model once
//! (`crate::request::warm_start`, as one server does), numbers the classes as the model numbers
//! them, keeps a binary model's two label values, and starts the rounds from the model's
//! parameters unfolded into the training's units (the merged scaling, a network's target)
//! instead of zeros: round 1 sends these parameters as any round sends the combined model. A
//! column list keeps the model's preprocessing: round 0 sends it (shard protocol 5) and every
//! shard encodes its rows with it (`PipelineConfig::fixed_preprocessing`); a binary model keeps its two
//! labels (`plan::binary_counts`).

use super::network::NetworkPlan;
use super::plan::{shard_plan, RoundZero, ShardPlan};
use crate::catalog::warm_start::WarmStart;
use crate::pg::error::raise_train_error;
use crate::pipeline::protocol::merged_index;
use crate::pipeline::{ClassValue, LearnedStatistics, PipelineConfig};
use corgipile_ml::model::Predictor;
use corgipile_ml::network::Target;
use corgipile_ml::stats::FeatureStats;
use corgipile_ml::trainer::{DeltaRounds, TrainError};

/// The plan every shard trains by (`plan::shard_plan`) from round 0's findings (`zero`): from
/// zeros, or from `warm`'s model, whose classes number `zero`'s (its classes and counts
/// renumbered here), whose binary labels are kept, and whose parameters start the rounds.
pub(super) fn plan(
    warm: Option<&WarmStart>,
    config: &PipelineConfig,
    zero: &mut RoundZero,
) -> ShardPlan {
    let n_features = zero.n_features;
    let Some(warm) = warm else {
        return shard_plan(
            config,
            &zero.stats,
            n_features,
            &zero.classes,
            zero.preprocessing.as_ref(),
            None,
        );
    };
    let merged = std::mem::take(&mut zero.classes);
    let (classes, labels) = number_classes(warm, config, merged, &mut zero.stats, n_features);
    zero.classes = classes;
    let mut plan = shard_plan(
        config,
        &zero.stats,
        n_features,
        &zero.classes,
        zero.preprocessing.as_ref(),
        labels,
    );
    let shape = (n_features, plan.outputs, plan.n_weights);
    start_rounds(
        warm,
        config,
        &plan.extras,
        plan.network.as_mut(),
        &mut plan.model_rounds,
        shape,
        classes_found(&zero.classes, &zero.stats),
    );
    plan
}

/// The classes of a warm start's training, numbered as one server numbers them: the stored
/// model's classes first, in its order, then the other classes the shards found (`merged`,
/// whose indices `stats` counts rows by: renumbered here). A network has an output per stored
/// class only: a class it never saw is one server's ERROR. Returns the classes and, for a
/// binary kind, the stored model's two labels as the trainer sees them.
fn number_classes(
    warm: &WarmStart,
    config: &PipelineConfig,
    merged: Vec<ClassValue>,
    stats: &mut FeatureStats,
    n_features: usize,
) -> (Vec<ClassValue>, Option<(f64, f64)>) {
    // Rows of another width first, as one server finds them.
    if warm.model().n_features() != n_features {
        warm.raise_misfit(&config.relation, n_features, classes_found(&merged, stats));
    }
    let label_values = warm.label_values(config.label);
    if merged.is_empty() {
        return (merged, label_values);
    }
    let mut classes = warm.classes();
    let known = classes.len();
    for class in &merged {
        if !classes.iter().any(|c| same_class(c, class)) {
            classes.push(class.clone());
        }
    }
    if config.model.family().sized_by_statistics() && classes.len() > known {
        warm.raise_misfit(&config.relation, n_features, classes.len());
    }
    // Each merged index becomes its class's place in this numbering.
    let to: Vec<f64> = merged
        .iter()
        .map(|m| {
            classes
                .iter()
                .position(|c| same_class(c, m))
                .expect("every merged class is numbered") as f64
        })
        .collect();
    stats.relabel_classes(&to);
    (classes, label_values)
}

/// How many classes the rows have (for an ERROR): the numbered ones, or a binary kind's
/// distinct label values (none for a regression).
fn classes_found(numbered: &[ClassValue], stats: &FeatureStats) -> usize {
    numbered.len().max(stats.class_counts().len())
}

/// One class, as `merge_classes` has them (-0.0 and 0.0 are one).
fn same_class(a: &ClassValue, b: &ClassValue) -> bool {
    merged_index(std::slice::from_ref(a), b).is_some()
}

/// Starts `rounds` from the stored model, unfolded into the shards' units: rows scaled by
/// `extras`' standardizer, a network's target standardized as its plan says. A softmax meeting
/// classes the model never saw gets their outputs from zeros (as on one server); a model of
/// another width or shape is one server's ERROR. `shape`: features, outputs, weights;
/// `classes`: how many the training numbers (for the ERROR).
fn start_rounds(
    warm: &WarmStart,
    config: &PipelineConfig,
    extras: &LearnedStatistics,
    network: Option<&mut NetworkPlan>,
    rounds: &mut DeltaRounds,
    (n_features, outputs, n_weights): (usize, usize, usize),
    classes: usize,
) {
    let stored = warm.model();
    let misfit = || -> ! { warm.raise_misfit(&config.relation, n_features, classes) };
    let standardizer = extras.standardizer.as_ref();
    let unfold = |target: Target| {
        stored
            .learner_parameters(standardizer, target)
            .unwrap_or_else(|_| {
                let bytes = (stored.n_params() as u64).saturating_mul(8);
                raise_train_error(TrainError::OutOfMemory { bytes }, &|v| v.to_string(), false)
            })
    };
    let values = match network {
        Some(plan) => {
            // Its kind and layers (each configuration's learner checks them, as every learner
            // of one server's search starts from the stored model; their own parameters are
            // set from the rounds' whenever a combined model is made).
            for learner in &mut plan.learners {
                match learner.start_from(stored) {
                    Ok(true) => {}
                    Ok(false) => misfit(),
                    Err(e) => raise_train_error(e, &|v| v.to_string(), config.params.normalize),
                }
            }
            unfold(Target {
                mean: plan.round.target_mean,
                scale: plan.round.target_scale,
            })
        }
        None => {
            let stored_outputs = stored.n_outputs();
            if stored.as_linear().is_none()
                || stored.n_features() != n_features
                || stored_outputs > outputs
                || (stored_outputs < outputs && !config.model.has_class_outputs())
            {
                misfit();
            }
            let mut values = unfold(Target::new(0.0, 1.0));
            // Weights by output (row-major), then biases: new classes' rows and biases zero.
            let mut bias = values.split_off(n_features * stored_outputs);
            values.resize(n_weights, 0.0);
            bias.resize(outputs, 0.0);
            values.extend(bias);
            values
        }
    };
    if !rounds.start_at(values) {
        misfit();
    }
}
