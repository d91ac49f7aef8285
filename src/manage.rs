//! Living with models: deploy a version of a name, drop models, export coefficients.
//!
//! Names are per role, like the models themselves (row-level security on corgipile.models):
//! each role's "churn" is its own, with versions 1, 2, ... The deployed version of a name is the
//! one pinned by corgipile_deploy, else the newest.

use crate::catalog::{no_such_model, resolve_name, zero_or_one};
use crate::error::raise;
use crate::predict::{load_model_ref, ModelRef};
use corgipile_ml::model::ModelKind;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

fn spi_failed(what: &str, e: pgrx::spi::Error) -> ! {
    raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, format!("could not {what}: {e}"), None)
}

/// Pins `model_id` as the deployed version of `model_name` (what corgipile_predict('name', ...)
/// uses); without a model id, unpins, so the newest version is deployed again. Returns the id
/// of the deployed version.
#[pg_extern(volatile, parallel_unsafe)]
fn corgipile_deploy(model_name: &str, model_id: default!(Option<i64>, "NULL")) -> i64 {
    resolve_name(model_name); // raises if the role has no model of this name
    if let Some(id) = model_id {
        let name = zero_or_one(Spi::get_one_with_args::<String>(
            "SELECT COALESCE(name, '') FROM corgipile.models WHERE id OPERATOR(pg_catalog.=) $1
             AND trained_by OPERATOR(pg_catalog.=) CURRENT_USER",
            &[id.into()],
        ))
        .unwrap_or_else(|e| spi_failed("read the model", e))
        .unwrap_or_else(|| no_such_model(id));
        if name != model_name {
            let is = if name.is_empty() { "is unnamed".to_string() } else { format!("is a version of \"{name}\"") };
            raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("model {id} is not a version of \"{model_name}\": it {is}"),
                Some(format!("SELECT version, id FROM corgipile.model_summary WHERE name = '{model_name}' lists its versions.")),
            );
        }
    }
    // Unpin first, then pin: one UPDATE doing both could trip the one-pinned-per-name index.
    Spi::run_with_args(
        "UPDATE corgipile.models SET pinned = false
         WHERE pinned AND name OPERATOR(pg_catalog.=) $1 AND trained_by OPERATOR(pg_catalog.=) CURRENT_USER",
        &[model_name.into()],
    )
    .unwrap_or_else(|e| spi_failed("unpin the deployed version", e));
    if let Some(id) = model_id {
        Spi::run_with_args("UPDATE corgipile.models SET pinned = true WHERE id OPERATOR(pg_catalog.=) $1", &[id.into()])
            .unwrap_or_else(|e| spi_failed("pin the version", e));
    }
    resolve_name(model_name)
}

/// Deletes one model (and its epochs); returns 1.
#[pg_extern(volatile, parallel_unsafe)]
fn corgipile_drop_model(model_id: i64) -> i64 {
    let dropped = Spi::get_one_with_args::<i64>(
        "WITH d AS (DELETE FROM corgipile.models WHERE id OPERATOR(pg_catalog.=) $1 RETURNING 1) SELECT pg_catalog.count(*) FROM d",
        &[model_id.into()],
    )
    .unwrap_or_else(|e| spi_failed("drop the model", e))
    .unwrap_or(0);
    if dropped == 0 {
        no_such_model(model_id);
    }
    dropped
}

/// Deletes every version of a model name of the current role; returns how many. (An integer
/// is a model id, as in prediction.)
#[pg_extern(volatile, parallel_unsafe, name = "corgipile_drop_model")]
fn corgipile_drop_model_by_name(model_name: &str) -> i64 {
    if let ModelRef::Id(id) = ModelRef::from_text(model_name) {
        return corgipile_drop_model(id);
    }
    resolve_name(model_name); // raises if the role has no model of this name
    Spi::get_one_with_args::<i64>(
        "WITH d AS (DELETE FROM corgipile.models
                    WHERE name OPERATOR(pg_catalog.=) $1 AND trained_by OPERATOR(pg_catalog.=) CURRENT_USER RETURNING 1)
         SELECT pg_catalog.count(*) FROM d",
        &[model_name.into()],
    )
    .unwrap_or_else(|e| spi_failed("drop the model", e))
    .unwrap_or(0)
}

type CoefficientRow = (Option<String>, String, Option<i64>, f64);

/// A model's coefficients in the units of the training table (a `normalize` standardizer is
/// folded in), one row per (class, feature) plus one '(intercept)' row per class; comparable
/// with scikit-learn's coef_ and intercept_. class: the positive class of a binary classifier,
/// each class of softmax, NULL for linear (all as the label column shows them). feature: the column name for a column list,
/// "col[i]" (1-based) for an array column, the index (in the model's index base) for sparse.
fn coefficients(key: ModelRef) -> Vec<CoefficientRow> {
    let stored = load_model_ref(key);
    let m = &stored.model;
    let classes: Vec<Option<String>> = match m.kind {
        ModelKind::Linear => vec![None],
        ModelKind::Softmax => (0..stored.classes.len()).map(|k| Some(stored.class_text(k))).collect(),
        _ => vec![(stored.classes.len() == 2).then(|| stored.class_text(1))],
    };
    let names: Vec<(String, Option<i64>)> = match &stored.features {
        serde_json::Value::Array(cols) => cols.iter().enumerate().map(|(i, c)| (c.as_str().unwrap_or("").to_owned(), Some(i as i64 + 1))).collect(),
        serde_json::Value::String(col) => (1..=m.n_features as i64).map(|i| (format!("{col}[{i}]"), Some(i))).collect(),
        _ => (0..m.n_features as i64).map(|i| i + stored.index_base).map(|i| (i.to_string(), Some(i))).collect(),
    };
    let mut rows = Vec::with_capacity(m.n_outputs * (m.n_features + 1));
    for (k, class) in classes.into_iter().enumerate().take(m.n_outputs) {
        let weights = &m.weights[k * m.n_features..(k + 1) * m.n_features];
        rows.extend(names.iter().zip(weights).map(|((name, index), &w)| (class.clone(), name.clone(), *index, w)));
        rows.push((class, "(intercept)".to_owned(), None, m.bias[k]));
    }
    rows
}

#[pg_extern(stable, parallel_safe)]
fn corgipile_model_coefficients(model_id: i64) -> TableIterator<'static, (name!(class, Option<String>), name!(feature, String), name!(feature_index, Option<i64>), name!(coefficient, f64))> {
    TableIterator::new(coefficients(ModelRef::Id(model_id)))
}

#[pg_extern(stable, parallel_safe, name = "corgipile_model_coefficients")]
fn corgipile_model_coefficients_by_name(model_name: &str) -> TableIterator<'static, (name!(class, Option<String>), name!(feature, String), name!(feature_index, Option<i64>), name!(coefficient, f64))> {
    TableIterator::new(coefficients(ModelRef::from_text(model_name)))
}
