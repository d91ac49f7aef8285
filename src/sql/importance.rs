//! corgipile_feature_importance: permutation importance of a stored model's input columns on a
//! sample of a relation's rows (read through the block shuffle: random blocks, shuffled), with
//! each column's standardized coefficient beside it for linear models. The math is
//! `corgipile_ml::importance`; the score is corgipile_evaluate's accuracy (classifiers) or R²
//! (regression) of the sampled rows.

use crate::catalog::{load_model_ref, ModelRef, StoredModel};
use crate::exec::sgd::{check_cost, score_sample, SampleRows};
use crate::pg::error::raise;
use crate::pipeline::protocol_parts::ImportanceAsk;
use crate::pipeline::Mode;
use crate::request::args::{ParamsArg, RelationArg};
use crate::request::prepare;
use crate::sql::evaluate::evaluation_params;
use corgipile_ml::importance::{column_ranges, pooled_importance, Metric, MAX_REPEATS, MAX_ROWS};
use corgipile_ml::params::{BufferSize, ShuffleMode};
use corgipile_ml::Welford;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;
use std::ops::Range;

/// Sampled rows, permutations per column and seed unless the params say otherwise.
const DEFAULT_ROWS: u64 = 10_000;
const DEFAULT_REPEATS: u64 = 5;
const DEFAULT_SEED: u64 = 1;
const FUNCTION: &str = "corgipile_feature_importance";

type ImportanceRow = (String, f64, f64, Option<f64>, String, f64, i64);

by_id_and_name! {
    /// Each input column's permutation importance: the drop of the model's score (accuracy, or
    /// R² for regression) on a sample of the relation's rows when the column's values are
    /// shuffled across them (mean and standard deviation over the repeats), most important
    /// first.
    #[pg_extern(volatile, parallel_unsafe, name = "corgipile_feature_importance")]
    fn corgipile_feature_importance / corgipile_feature_importance_by_name(
        relation: {RelationArg},
        params: {default!(ParamsArg, "'{}'")}
    ) -> {
        TableIterator<
            'static,
            (
                name!(column_name, String),
                name!(importance, f64),
                name!(importance_std, f64),
                name!(standardized_coefficient, Option<f64>),
                name!(metric, String),
                name!(baseline, f64),
                name!(rows, i64),
            ),
        >
    }
    |key| TableIterator::new(importance(key, relation, params))
}

fn importance(key: ModelRef, relation: RelationArg, params: ParamsArg) -> Vec<ImportanceRow> {
    let stored = load_model_ref(key);
    refuse_group_family(&stored, FUNCTION);
    let rows = integer_param(&params, "rows", DEFAULT_ROWS, 1, MAX_ROWS);
    let repeats = integer_param(&params, "repeats", DEFAULT_REPEATS, 1, MAX_REPEATS);
    let seed = integer_param(&params, "seed", DEFAULT_SEED, 0, i64::MAX as u64);
    let (names, ranges) = columns(&stored);
    check_cost(
        &format!("model {}", stored.id),
        names.len(),
        repeats,
        rows,
        stored.n_features(),
    );
    let user_buffer = params.0.get("buffer_size").is_some();
    let (mut train_params, _) =
        evaluation_params(&stored, params, FUNCTION, &["rows", "repeats", "seed"]);
    // Random blocks, shuffled: the first `rows` rows are a sample of the relation.
    train_params.shuffle = ShuffleMode::Corgipile;
    train_params.seed = Some(seed);
    if !user_buffer {
        train_params.buffer_size = BufferSize::Tuples(rows);
    }
    let prepared = prepare(
        relation.oid(),
        stored.kind(),
        train_params,
        Mode::Evaluate,
        stored.classes.clone(),
        stored.preprocessing.as_ref(),
    );
    let ask = ImportanceAsk {
        count: false,
        rows,
        repeats: repeats as u32,
        seed,
    };
    let (parts, moments, n) = match crate::shard::sharded_leaves(prepared.relid) {
        Some(leaves) => crate::shard::importance_sharded(&prepared, leaves, &stored, ask, &ranges),
        None => {
            let sample = prepared.run(SampleRows {
                rows: rows as usize,
                width: stored.n_features(),
                classes: stored.classes.clone(),
            });
            let n = sample.labels.len() as u64;
            let part = score_sample(&stored.model, stored.classes.len(), &sample, &ranges, ask);
            (vec![(part.baseline, part.permuted)], part.moments, n)
        }
    };
    if n == 0 {
        raise(
            PgSqlErrorCode::ERRCODE_NO_DATA_FOUND,
            format!(
                "{FUNCTION}: the relation has no rows to score model {} on",
                stored.id
            ),
            None,
        );
    }
    let metric = Metric::of(stored.kind());
    let (baseline, importances) = pooled_importance(&parts, metric, repeats as usize);
    let coefficients = standardized_coefficients(&stored, &moments, &ranges);
    let mut out: Vec<ImportanceRow> = names
        .into_iter()
        .zip(importances)
        .zip(coefficients)
        .map(|((name, imp), coef)| {
            (
                name,
                imp.mean,
                imp.std,
                coef,
                metric.name().to_owned(),
                baseline,
                n as i64,
            )
        })
        .collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1));
    out
}

/// The model's input columns' names and their encoded features (see `column_ranges`).
fn columns(stored: &StoredModel) -> (Vec<String>, Vec<Range<usize>>) {
    let ranges = column_ranges(stored.preprocessing.as_ref(), stored.n_features());
    let names = match &stored.preprocessing {
        Some(p) => p.columns.iter().map(|c| c.name.clone()).collect(),
        None => {
            let Some(array) = stored.features.as_str() else {
                raise(
                    PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                    "corgipile_feature_importance takes models of dense features",
                    Some("A model of sparse features has a feature per index: see corgipile_model_coefficients.".into()),
                )
            };
            (0..stored.n_features())
                .map(|j| format!("{array}[{}]", j + 1))
                .collect()
        }
    };
    (names, ranges)
}

/// Linear models of one output: each single-feature column's weight times the feature's
/// standard deviation in the sample (`moments`: of each column's first feature; the weight in
/// standardized units); None for columns of several features, networks and models of one
/// output per class.
fn standardized_coefficients(
    stored: &StoredModel,
    moments: &[Welford],
    ranges: &[Range<usize>],
) -> Vec<Option<f64>> {
    let linear = stored.model.as_linear().filter(|m| m.n_outputs == 1);
    ranges
        .iter()
        .zip(moments)
        .map(|(r, m)| {
            let linear = linear?;
            (r.len() == 1).then(|| linear.output_weights(0)[r.start] * m.mean_std().1)
        })
        .collect()
}

/// A function of one model (`function`, for the message) given a family of per-group models:
/// ERROR 0A000 naming the way to one group's model.
pub(crate) fn refuse_group_family(stored: &crate::catalog::StoredModel, function: &str) {
    if stored.groups.is_some() {
        raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!(
                "model {} has a model per group: {function} takes one model",
                stored.id
            ),
            Some("Give one group's model by its id (corgipile.group_models).".into()),
        );
    }
}

/// An integer param of this function: `default` when absent, an ERROR outside `min..=max`.
pub(crate) fn integer_param(
    params: &ParamsArg,
    key: &str,
    default: u64,
    min: u64,
    max: u64,
) -> u64 {
    let Some(value) = params.0.get(key) else {
        return default;
    };
    match value.as_u64() {
        Some(n) if (min..=max).contains(&n) => n,
        _ => raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("\"{key}\" must be an integer from {min} to {max}, got {value}"),
            Some(format!("The default is {default}.")),
        ),
    }
}
