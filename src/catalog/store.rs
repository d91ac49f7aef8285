//! Writing a trained model: its catalog row and its epochs, in the caller's transaction.

use super::{as_catalog_owner, caller, LabelMapping};
use crate::pg::error::raise;
use crate::pipeline::{EpochRecord, TrainOutcome};
use corgipile_ml::model::{ModelKind, Predictor};
use corgipile_ml::preprocess::Preprocessor;
use pgrx::prelude::*;
use pgrx::{JsonB, PgMemoryContexts, PgSqlErrorCode};
use serde_json::json;

/// What identifies a training apart from its outcome.
pub struct ModelSource<'a> {
    pub model: ModelKind,
    pub relation: &'a str,
    pub label_column: &'a str,
    /// The features param as given: "col", ["a", "b"] or {"indices": .., "values": ..}.
    pub features: serde_json::Value,
    pub label_type: &'a str,
    pub params: serde_json::Value,
    /// The name param: the model becomes the next version of this name (of its owner, who
    /// owns the new model too).
    pub name: Option<&'a crate::catalog::grants::ModelName>,
}

/// Insert the model and its epochs; returns the new model id. Runs in the caller's transaction,
/// so an ERROR anywhere leaves no row behind. The caller holds the name's lock
/// (`lock_model_name`) since before training.
/// `extra`: more metrics, e.g. a search's configuration ("search"), a cross-validation ("cv").
pub fn store_model_with(
    source: &ModelSource,
    outcome: &TrainOutcome,
    extra: serde_json::Map<String, serde_json::Value>,
) -> i64 {
    let role = match source.name {
        Some(n) => {
            // Checked before training too; a "manage" revoked meanwhile must not still count.
            if !n.is_own() {
                crate::catalog::grants::check_manage_name(
                    n,
                    &format!("{}.{}", n.owner, n.name),
                    "train a new version of",
                );
            }
            n.owner.clone()
        }
        None => caller().1,
    };
    // Each model's datums (weights, metrics, ...) and SPI plans in a context of its own, freed
    // once it is stored: a family of 100,000 group models would otherwise keep gigabytes in
    // the caller's context until the statement ends (measured: 2.3 GB, then out of memory).
    let mut memory = PgMemoryContexts::new("corgipile store model");
    // SAFETY: the closure allocates in `memory` and returns a plain i64: nothing allocated there
    // outlives it; the previous context is current again when it returns or unwinds.
    let id = unsafe {
        memory.switch_to(|_| as_catalog_owner(|| insert_model(source, outcome, &role, extra)))
    };
    // A name now stands for this model: plans that resolved it are planned again.
    crate::catalog::plans::models_changed();
    id
}

/// A model's preprocessing as stored: its profile with this model's predictions (or none: a
/// warm start's preprocessing may carry the model it started from's).
fn preprocessing_json(p: &Preprocessor, outcome: &TrainOutcome) -> serde_json::Value {
    let mut json = p.to_json();
    if let Some(profile) = json.get_mut("profile").and_then(|v| v.as_object_mut()) {
        match &outcome.predictions {
            Some(predictions) => {
                let value = serde_json::to_value(predictions).expect("a profile serializes");
                profile.insert("predictions".into(), value);
            }
            None => {
                profile.remove("predictions");
            }
        }
    }
    json
}

fn insert_model(
    source: &ModelSource,
    outcome: &TrainOutcome,
    role: &str,
    extra: serde_json::Map<String, serde_json::Value>,
) -> i64 {
    // The stored model's epoch: the best one when early stopping kept it, else the last.
    let stored_epoch = outcome
        .best_epoch
        .and_then(|best| outcome.epochs.iter().find(|e| e.stats.epoch == best));
    let Some(last) = stored_epoch.or(outcome.epochs.last()) else {
        raise(
            PgSqlErrorCode::ERRCODE_NO_DATA_FOUND,
            "the training ran no epoch",
            None,
        )
    };
    let label_mapping = LabelMapping {
        classes: source
            .model
            .is_classifier()
            .then(|| outcome.classes.clone()),
        label_type: source.label_type.to_owned(),
    };
    let mut metrics = json!({
        "loss": last.stats.loss,
        "epochs_run": outcome.epochs.len(),
        "metric_note": if outcome.best_epoch.is_some() {
            "the best epoch's (patience): training loss and accuracy/R2 are measured during that epoch, on each tuple before its update"
        } else {
            "training loss and accuracy/R2 are measured during the last epoch, on each tuple before its update"
        },
    });
    if let Some(a) = last.stats.accuracy {
        metrics["accuracy"] = json!(a);
    }
    if let Some(r2) = last.stats.r2 {
        metrics["r2"] = json!(r2);
    }
    if let Some(v) = &last.validation {
        metrics["validation"] = json!(v);
    }
    if let Some(e) = outcome.best_epoch {
        metrics["best_epoch"] = json!(e);
    }
    if let Some(t) = outcome.statistics_seconds {
        metrics["statistics_seconds"] = json!(t);
    }
    if let Some(tests) = &outcome.inference {
        metrics["inference"] = tests.clone();
    }
    for (key, value) in extra {
        metrics[key] = value;
    }
    let model = &outcome.model;
    // Its family's stored form (a network's weights and biases are every layer's, one after
    // the other: see `layers`).
    let parts = model.to_parts();
    let (weights, bias) = (parts.weights, parts.bias);
    let layers: Option<Vec<i32>> = parts
        .layers
        .map(|widths| widths.iter().map(|&n| n as i32).collect());
    let id = Spi::get_one_with_args::<i64>(
        "INSERT INTO corgipile.models
            (model_type, relation, label_column, features, n_features, n_outputs, label_mapping,
             weights, bias, standardizer, params, metrics, rows_trained, rows_skipped, training_seconds,
             name, version, trained_by, preprocessing, layers)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                 CASE WHEN $16 IS NOT NULL THEN
                     (SELECT COALESCE(pg_catalog.max(version), 0) OPERATOR(pg_catalog.+) 1
                      FROM corgipile.models
                      WHERE name OPERATOR(pg_catalog.=) $16 AND trained_by OPERATOR(pg_catalog.=) $17::pg_catalog.name)
                 END,
                 $17::pg_catalog.name, $18, $19)
         RETURNING id",
        &[
            // A search's configuration may be of another kind than the training's.
            outcome.model.kind().name().into(),
            source.relation.into(),
            source.label_column.into(),
            JsonB(source.features.clone()).into(),
            (model.n_features() as i32).into(),
            (model.n_outputs() as i32).into(),
            JsonB(serde_json::to_value(&label_mapping).expect("a label mapping serializes")).into(),
            weights.into(),
            bias.into(),
            outcome.standardizer.as_deref().cloned().map(JsonB).into(),
            JsonB(source.params.clone()).into(),
            JsonB(metrics).into(),
            (outcome.rows_trained as i64).into(),
            (outcome.rows_skipped as i64).into(),
            outcome.seconds.into(),
            source.name.map(|n| n.name.as_str()).into(),
            role.into(),
            outcome
                .preprocessing
                .as_ref()
                .map(|p| JsonB(preprocessing_json(p, outcome)))
                .into(),
            layers.into(),
        ],
    )
    .unwrap_or_else(|e| raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, format!("could not store the model: {e}"), None))
    .unwrap_or_else(|| raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, "INSERT ... RETURNING id returned no row", None));

    let column = |f: &dyn Fn(&EpochRecord) -> Option<f64>| -> Vec<Option<f64>> {
        outcome.epochs.iter().map(f).collect()
    };
    let epochs: Vec<i32> = outcome
        .epochs
        .iter()
        .map(|e| e.stats.epoch as i32)
        .collect();
    let tuples: Vec<i64> = outcome
        .epochs
        .iter()
        .map(|e| e.stats.tuples as i64)
        .collect();
    Spi::run_with_args(
        "INSERT INTO corgipile.epochs (model_id, epoch, loss, accuracy, r2, tuples, seconds, learning_rate,
                                       validation_loss, validation_accuracy, validation_r2, validation_seconds)
         SELECT $1, e.* FROM ROWS FROM (
            pg_catalog.unnest($2::pg_catalog.int4[]), pg_catalog.unnest($3::pg_catalog.float8[]),
            pg_catalog.unnest($4::pg_catalog.float8[]), pg_catalog.unnest($5::pg_catalog.float8[]),
            pg_catalog.unnest($6::pg_catalog.int8[]), pg_catalog.unnest($7::pg_catalog.float8[]),
            pg_catalog.unnest($8::pg_catalog.float8[]), pg_catalog.unnest($9::pg_catalog.float8[]),
            pg_catalog.unnest($10::pg_catalog.float8[]), pg_catalog.unnest($11::pg_catalog.float8[]),
            pg_catalog.unnest($12::pg_catalog.float8[])) AS e",
        &[
            id.into(),
            epochs.into(),
            column(&|e| Some(e.stats.loss)).into(),
            column(&|e| e.stats.accuracy).into(),
            column(&|e| e.stats.r2).into(),
            tuples.into(),
            column(&|e| Some(e.seconds)).into(),
            column(&|e| Some(e.stats.learning_rate)).into(),
            column(&|e| e.validation.as_ref().map(|v| v.loss)).into(),
            column(&|e| e.validation.as_ref().and_then(|v| v.accuracy)).into(),
            column(&|e| e.validation.as_ref().and_then(|v| v.r2)).into(),
            column(&|e| e.validation.as_ref().map(|_| e.validation_seconds)).into(),
        ],
    )
    .unwrap_or_else(|e| raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, format!("could not store the epochs: {e}"), None));
    id
}
