//! corgipile_drift: a stored model's training profile (what the statistics pass kept of its
//! rows, see `corgipile_ml::preprocess::profile`) against a block-sampled read of a relation's
//! rows today: per input column, the label and the predictions, a distance and whether it
//! passes a threshold. The counting and the distances are `corgipile_ml::drift`.

use crate::catalog::{load_model_ref, ModelRef, StoredModel};
use crate::exec::sgd::{DriftCounters, DriftRead, PREDICTION};
use crate::pg::error::raise;
use crate::pipeline::Mode;
use crate::request::args::{ParamsArg, RelationArg};
use crate::request::prepare;
use crate::sql::evaluate::evaluation_params;
use crate::sql::importance::{integer_param, refuse_group_family};
use corgipile_ml::drift::{compare, mean_shift, ColumnKind, Counter};
use corgipile_ml::params::{BufferSize, ShuffleMode};
use corgipile_ml::preprocess::profile::{ColumnProfile, Summary};
use corgipile_ml::preprocess::{Encoding, Source};
use corgipile_ml::standardize::Standardizer;
use pgrx::prelude::*;
use pgrx::{JsonB, PgSqlErrorCode};
use serde_json::json;

/// Rows read unless `"rows"` says otherwise: the PSI of ten decile bins between two samples of
/// one distribution is about (bins − 1)/n on average (0.0002 at 50,000 rows), far below any
/// threshold; docs/reference.md has the spread measured.
const DEFAULT_ROWS: u64 = 50_000;
const MAX_ROWS: u64 = 10_000_000;
const DEFAULT_SEED: u64 = 1;
/// The thresholds unless the params say otherwise (docs/reference.md gives their sources):
/// a population stability index of 0.25 is the usual "significant shift"; 0.3 is BigQuery ML's
/// default threshold of both its Jensen–Shannon and L-infinity measures; an array element's
/// mean moving half a training standard deviation.
const THRESHOLDS: [(&str, f64); 4] = [
    ("psi", 0.25),
    ("jensen_shannon", 0.3),
    ("l_infinity", 0.3),
    ("mean_shift", 0.5),
];
const OWN_PARAMS: [&str; 6] = [
    "rows",
    "seed",
    "psi",
    "jensen_shannon",
    "l_infinity",
    "mean_shift",
];

type DriftRow = (
    String,
    String,
    String,
    Option<f64>,
    Option<f64>,
    Option<f64>,
    Option<bool>,
    Option<JsonB>,
    Option<JsonB>,
);

by_id_and_name! {
    /// Drift of a relation's rows from a model's training rows: one row per input column, one
    /// for the label and one for the predictions, each with its training and today's
    /// statistics, a distance (population stability index on the training deciles for
    /// numbers, Jensen–Shannon divergence for categories, an element's mean shift for arrays),
    /// the L-infinity distance, and whether both pass their thresholds. Reads a block sample
    /// of `"rows"` rows.
    #[pg_extern(volatile, parallel_unsafe, name = "corgipile_drift")]
    fn corgipile_drift / corgipile_drift_by_name(
        relation: {RelationArg},
        params: {default!(ParamsArg, "'{}'")}
    ) -> {
        TableIterator<
            'static,
            (
                name!(column_name, String),
                name!(role, String),
                name!(measure, String),
                name!(distance, Option<f64>),
                name!(threshold, Option<f64>),
                name!(l_infinity, Option<f64>),
                name!(passes, Option<bool>),
                name!(training, Option<JsonB>),
                name!(today, Option<JsonB>),
            ),
        >
    }
    |key| TableIterator::new(drift(key, relation, params))
}

fn drift(key: ModelRef, relation: RelationArg, params: ParamsArg) -> Vec<DriftRow> {
    const FUNCTION: &str = "corgipile_drift";
    let stored = load_model_ref(key);
    refuse_group_family(&stored, FUNCTION);
    if !params.0.is_object() {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            "params must be a JSON object",
            Some("pass e.g. '{\"rows\": 100000}'::jsonb to corgipile_drift".into()),
        );
    }
    let rows = integer_param(&params, "rows", DEFAULT_ROWS, 1, MAX_ROWS);
    let seed = integer_param(&params, "seed", DEFAULT_SEED, 0, i64::MAX as u64);
    let thresholds: Vec<f64> = THRESHOLDS
        .iter()
        .map(|&(key, default)| match params.0.get(key) {
            None => default,
            Some(v) => match v.as_f64() {
                Some(t) if t.is_finite() && t >= 0.0 => t,
                _ => raise(
                    PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                    format!("\"{key}\" must be a number of at least 0, got {v}"),
                    Some(format!("The default is {default}.")),
                ),
            },
        })
        .collect();
    let threshold = |measure: &str| {
        THRESHOLDS
            .iter()
            .position(|t| t.0 == measure)
            .map(|i| thresholds[i])
    };
    let user_buffer = params.0.get("buffer_size").is_some();
    let (mut train_params, _) = evaluation_params(&stored, params, FUNCTION, &OWN_PARAMS);
    // Random blocks, shuffled: the first buffer of `rows` tuples is a block sample.
    train_params.shuffle = ShuffleMode::Corgipile;
    train_params.seed = Some(seed);
    if !user_buffer {
        train_params.buffer_size = BufferSize::Tuples(rows);
    }
    let standardizer = match stored.preprocessing {
        Some(_) => None,
        None => load_standardizer(stored.id),
    };
    let profile = stored
        .preprocessing
        .as_ref()
        .and_then(|p| p.profile.as_deref());
    let counters = counters_for(&stored, profile);
    let read = {
        let prepared = prepare(
            relation.oid(),
            stored.kind(),
            train_params,
            Mode::Evaluate,
            stored.classes.clone(),
            stored.preprocessing.as_ref(),
        );
        if crate::shard::sharded_leaves(prepared.relid).is_some() {
            raise(
                PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                format!("{FUNCTION} does not read sharded tables"),
                Some("Run it on each shard server, against the model there.".into()),
            );
        }
        prepared.run(DriftRead {
            rows: rows as usize,
            model: stored.clone(),
            counters,
        })
    };
    let mut out = Vec::new();
    let row = |name: &str, role: &str, training: Option<&Summary>, today: Summary| {
        judge(name, role, training, today, &threshold, read.rows)
    };
    match (&stored.preprocessing, read.columns) {
        (Some(p), Some(columns)) => {
            for (i, (column, today)) in p.columns.iter().zip(columns).enumerate() {
                let training = match (&column.encoding, profile) {
                    (Encoding::Array { mean, std, .. }, _) => Some(Summary::Array {
                        rows: p.rows,
                        missing: 0,
                        mean: mean.clone(),
                        std: std.clone(),
                    }),
                    (_, Some(profile)) => profile.columns.get(i).map(|c| c.summary.clone()),
                    _ => None,
                };
                out.push(row(
                    &column.name,
                    "feature",
                    training.as_ref(),
                    today.finish(),
                ));
            }
        }
        _ => {
            let name = stored.features.as_str().unwrap_or("features").to_owned();
            let training = standardizer.map(|s| Summary::Array {
                rows: 0,
                missing: 0,
                std: s
                    .scale
                    .iter()
                    .map(|&k| if k > 0.0 { 1.0 / k } else { 0.0 })
                    .collect(),
                mean: s.mean,
            });
            if let Some(features) = read.features {
                out.push(row(&name, "feature", training.as_ref(), features.finish()));
            }
        }
    }
    let label = profile.and_then(|p| p.label.as_ref()).map(|l| &l.summary);
    out.push(row(
        &stored.label_column,
        "label",
        label,
        read.label.finish(),
    ));
    // The stored model's predictions after training (see docs/reference.md), when profiled.
    let predictions = profile
        .and_then(|p| p.predictions.as_ref())
        .map(|p| &p.summary);
    out.push(row(
        PREDICTION,
        "prediction",
        predictions,
        read.predictions.finish(),
    ));
    out
}

/// The counters of a read: in the training profile's bins when there is one, else in the
/// model's own categories (its one-hot columns, its classes).
fn counters_for(
    stored: &StoredModel,
    profile: Option<&corgipile_ml::preprocess::profile::Profile>,
) -> DriftCounters {
    let columns = stored.preprocessing.as_ref().map(|p| {
        p.columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let training = profile.and_then(|pr| pr.columns.get(i)).map(|c| &c.summary);
                match (&c.encoding, c.source) {
                    (Encoding::Array { .. }, _) => Counter::for_training(None, ColumnKind::Array),
                    (Encoding::OneHot { categories, .. }, _) if training.is_none() => {
                        Counter::categories(categories.clone())
                    }
                    (_, Source::Number) => Counter::for_training(training, ColumnKind::Number),
                    (_, Source::Text) => Counter::for_training(training, ColumnKind::Text),
                    _ => Counter::for_training(None, ColumnKind::Other),
                }
            })
            .collect()
    });
    let label_profile: Option<&ColumnProfile> = profile.and_then(|p| p.label.as_ref());
    let predictions_profile = profile
        .and_then(|p| p.predictions.as_ref())
        .map(|p| &p.summary);
    let classes: Vec<String> = (0..stored.classes.len())
        .map(|i| stored.class_text(i))
        .collect();
    let (label, predictions) = if stored.kind().is_classifier() {
        let label = match label_profile.map(|l| &l.summary) {
            Some(s @ Summary::Categories { .. }) => {
                Counter::for_training(Some(s), ColumnKind::Text)
            }
            _ => Counter::categories(classes.clone()),
        };
        (label, Counter::categories(classes))
    } else {
        (
            Counter::for_training(label_profile.map(|l| &l.summary), ColumnKind::Number),
            Counter::for_training(predictions_profile, ColumnKind::Number),
        )
    };
    DriftCounters {
        columns,
        label,
        predictions,
        features: stored
            .preprocessing
            .is_none()
            .then(|| Counter::for_training(None, ColumnKind::Array)),
        rows: 0,
    }
}

/// One output row: the distance of `today` from `training`, and whether it passes.
fn judge(
    name: &str,
    role: &str,
    training: Option<&Summary>,
    today: Summary,
    threshold: &dyn Fn(&str) -> Option<f64>,
    rows: u64,
) -> DriftRow {
    let mut today_json = serde_json::to_value(&today).unwrap_or_default();
    today_json["sampled_rows"] = json!(rows);
    let training_json = training.map(|t| serde_json::to_value(t).unwrap_or_default());
    let no_profile = |measure: &str| {
        (
            name.to_owned(),
            role.to_owned(),
            measure.to_owned(),
            None,
            None,
            None,
            None,
            training_json.clone().map(JsonB),
            Some(JsonB(today_json.clone())),
        )
    };
    let Some(training) = training else {
        return no_profile("no training profile");
    };
    let (measure, distance, l_inf) = match training {
        Summary::Array { .. } => match mean_shift(training, &today) {
            Some((d, element)) => {
                today_json["worst_element"] = json!(element + 1);
                ("mean_shift", d, None)
            }
            None => return no_profile("not compared"),
        },
        Summary::Number { .. } | Summary::Categories { .. } => match compare(training, &today) {
            Some(d) if matches!(training, Summary::Number { .. }) => {
                ("psi", d.psi, Some(d.l_infinity))
            }
            Some(d) => ("jensen_shannon", d.jensen_shannon, Some(d.l_infinity)),
            None => return no_profile("not compared"),
        },
        Summary::Count { .. } => return no_profile("not compared"),
    };
    let t = threshold(measure);
    let passes = t.map(|t| distance <= t).unwrap_or(true)
        && l_inf.is_none_or(|l| threshold("l_infinity").is_none_or(|t| l <= t));
    (
        name.to_owned(),
        role.to_owned(),
        measure.to_owned(),
        Some(distance),
        t,
        l_inf,
        Some(passes),
        training_json.map(JsonB),
        Some(JsonB(today_json)),
    )
}

/// An array model's stored scaling (its training means and scales), read with the caller's
/// privileges (the model row `load_model_ref` read); None when it was trained without.
fn load_standardizer(model_id: i64) -> Option<Standardizer> {
    let value = Spi::get_one_with_args::<JsonB>(
        "SELECT standardizer FROM corgipile.models WHERE id OPERATOR(pg_catalog.=) $1",
        &[model_id.into()],
    )
    .ok()
    .flatten()?;
    serde_json::from_value(value.0).ok()
}
