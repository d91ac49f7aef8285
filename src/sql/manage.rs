//! Living with models: deploy a version of a name, drop models, export coefficients.
//!
//! Names are per owner, like the models themselves: each role's "churn" is its own, with
//! versions 1, 2, ...; another role's is "owner.churn" (src/catalog/grants.rs). The deployed version of
//! a name is the one pinned by corgipile_deploy, else the newest; every decision about it is a
//! row of corgipile.deployments (src/catalog/deployments.rs).

use crate::catalog::deployments::{self, Decision, How, Scores};
use crate::catalog::grants;
use crate::catalog::locks::{wait_for, Purpose};
use crate::catalog::{as_catalog_owner, check_writable, no_such_model, resolve_name, select_one};
use crate::catalog::{load_model_ref, ModelRef};
use crate::pg::error::{raise, required};
use corgipile_ml::model::Labels;
use pgrx::prelude::*;
use pgrx::spi::quote_literal;
use pgrx::PgSqlErrorCode;

fn spi_failed(what: &str, e: pgrx::spi::Error) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        format!("could not {what}: {e}"),
        None,
    )
}

const DEPLOY_USAGE: &str = "corgipile_deploy(model_name text, model_id bigint DEFAULT NULL)";

/// Pins `model_id` as the deployed version of `model_name` (what corgipile_predict('name', ...)
/// uses); without a model id, unpins, so the newest version is deployed again. Returns the id
/// of the deployed version. Another owner's name (`owner.name`) needs "manage" on it.
/// Deploys and drops of one name wait for each other (the last one wins), so concurrent ones
/// never clash on the one-pinned-per-name index nor deadlock. Each call is a row of
/// corgipile.deployments (`manual`, or `latest` for an unpin), in the same transaction.
#[pg_extern(volatile, parallel_unsafe)]
fn corgipile_deploy(model_name: Option<&str>, model_id: default!(Option<i64>, "NULL")) -> i64 {
    let model_name = required(model_name, "model_name", DEPLOY_USAGE);
    check_writable(c"corgipile_deploy()");
    let n = checked_name(model_name, "deploy");
    if let Some(id) = model_id {
        let name = select_one::<String>(
            "SELECT COALESCE(name, '') FROM corgipile.models WHERE id OPERATOR(pg_catalog.=) $1
             AND trained_by OPERATOR(pg_catalog.=) $2::pg_catalog.name",
            &[id.into(), n.owner.as_str().into()],
        )
        .unwrap_or_else(|e| spi_failed("read the model", e))
        .unwrap_or_else(|| no_such_model(id));
        if name != n.name {
            let is = if name.is_empty() {
                "is unnamed".to_string()
            } else {
                format!("is a version of \"{name}\"")
            };
            let owner = if n.is_own() {
                String::new()
            } else {
                format!(" AND trained_by = {}", quote_literal(&n.owner))
            };
            raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("model {id} is not a version of \"{model_name}\": it {is}"),
                Some(format!(
                    "SELECT version, id FROM corgipile.model_summary WHERE name = {}{owner} lists its versions.",
                    quote_literal(&n.name)
                )),
            );
        }
    }
    let before = deployments::deployed(&n);
    deployments::pin(&n, model_id);
    let after = deployments::deployed(&n);
    let (how, reason) = match model_id {
        Some(_) => (
            How::Manual,
            format!("corgipile_deploy pinned {}", deployments::describe(after)),
        ),
        None => (
            How::Latest,
            format!(
                "corgipile_deploy unpinned the name: its newest version is deployed, {}",
                deployments::describe(after)
            ),
        ),
    };
    deployments::record(&Decision {
        name: &n,
        how,
        from: before.map(|d| d.id),
        to: after.map(|d| d.id),
        candidate: None,
        scores: Scores::default(),
        reason,
    });
    resolve_name(model_name)
}

const DEPLOY_STRATEGY_USAGE: &str =
    "corgipile_deploy(model_name text, strategy text): strategy 'best', 'latest', 'previous' or a model id";

/// Deploys a version of `model_name` chosen by `strategy`: `'best'` pins the version with the
/// best validation score stored with it (accuracy for classifiers, R² for regression; of the
/// versions of the newest version's kind of label; ties: the newest), as after a search;
/// `'latest'` (or NULL) unpins, so the newest version is deployed; `'previous'` pins the
/// version deployed before the current one, undoing the latest decision not yet undone, per
/// corgipile.deployments (see `deployments::previous`); a number is a model id, as in
/// corgipile_deploy(name, id). Returns the id of the deployed version.
#[pg_extern(volatile, parallel_unsafe, name = "corgipile_deploy")]
fn corgipile_deploy_by(model_name: Option<&str>, strategy: Option<&str>) -> i64 {
    let name = required(model_name, "model_name", DEPLOY_STRATEGY_USAGE);
    match strategy.map(str::trim) {
        None | Some("latest") => corgipile_deploy(Some(name), None),
        Some("best") => deploy_best(name),
        Some("previous") => deploy_previous(name),
        Some(other) => match other.parse::<i64>() {
            Ok(id) => corgipile_deploy(Some(name), Some(id)),
            Err(_) => raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("unknown deploy strategy \"{other}\""),
                Some(format!("Use {DEPLOY_STRATEGY_USAGE}.")),
            ),
        },
    }
}

/// corgipile_deploy(name, 'best').
fn deploy_best(name: &str) -> i64 {
    check_writable(c"corgipile_deploy()");
    let n = checked_name(name, "deploy");
    let best = select_one::<i64>(
        "WITH v AS (
            SELECT id, version,
                   COALESCE(metrics OPERATOR(pg_catalog.#>>) '{validation,accuracy}',
                                       metrics OPERATOR(pg_catalog.#>>) '{validation,r2}')::pg_catalog.float8 AS score,
                   (metrics OPERATOR(pg_catalog.#>) '{validation,accuracy}') IS NOT NULL AS classifier
            FROM corgipile.models
            WHERE name OPERATOR(pg_catalog.=) $1 AND trained_by OPERATOR(pg_catalog.=) $2::pg_catalog.name
              AND (metrics OPERATOR(pg_catalog.#>>) '{validation,rows}')::pg_catalog.int8 OPERATOR(pg_catalog.>) 0)
         SELECT id FROM v
         WHERE classifier OPERATOR(pg_catalog.=) (SELECT classifier FROM v ORDER BY version DESC LIMIT 1)
           AND score OPERATOR(pg_catalog.=) score
         ORDER BY score DESC, version DESC LIMIT 1",
        &[n.name.as_str().into(), n.owner.as_str().into()],
    )
    .unwrap_or_else(|e| spi_failed("read the versions", e))
    .unwrap_or_else(|| {
        raise(
            PgSqlErrorCode::ERRCODE_NO_DATA_FOUND,
            format!("no version of \"{name}\" has a validation score"),
            Some("'best' compares the validation accuracy (or R²) stored with each version: train with \"validation\" or \"search\".".into()),
        )
    });
    let before = deployments::deployed(&n);
    deployments::pin(&n, Some(best));
    let after = deployments::deployed(&n);
    let chosen = deployments::stored_score(best);
    let old = before.and_then(|d| deployments::stored_score(d.id));
    let reason = match chosen {
        Some((metric, score)) => format!(
            "corgipile_deploy(..., 'best') pinned {}: the best validation {metric} stored with a version, {score}",
            deployments::describe(after)
        ),
        None => format!("corgipile_deploy(..., 'best') pinned {}", deployments::describe(after)),
    };
    deployments::record(&Decision {
        name: &n,
        how: How::Best,
        from: before.map(|d| d.id),
        to: after.map(|d| d.id),
        candidate: None,
        scores: Scores {
            metric: chosen.map(|(m, _)| m),
            new: chosen.map(|(_, s)| s),
            // The version deployed before, by the same metric (None if it has no such score).
            old: old
                .filter(|(m, _)| Some(*m) == chosen.map(|(m, _)| m))
                .map(|(_, s)| s),
            margin: None,
            rows: None,
        },
        reason,
    });
    resolve_name(name)
}

/// corgipile_deploy(name, 'previous'): undoes the latest decision not yet undone, per
/// corgipile.deployments (see `deployments::previous`): pins the version it replaced; ERROR
/// P0002 when the history does not say, when the current one was the first deployed, or when
/// that version was dropped since.
fn deploy_previous(name: &str) -> i64 {
    check_writable(c"corgipile_deploy()");
    let n = checked_name(name, "deploy");
    let Some(current) = deployments::deployed(&n) else {
        resolve_name(name); // raises: the name has no version left
        unreachable!("a name without versions resolves to nothing");
    };
    let hint = format!(
        "SELECT * FROM corgipile.deployments WHERE name = {} ORDER BY id lists its decisions; corgipile_deploy(name, model_id) deploys any version.",
        quote_literal(&n.name)
    );
    let no_previous = |message: String| -> ! {
        raise(
            PgSqlErrorCode::ERRCODE_NO_DATA_FOUND,
            message,
            Some(hint.clone()),
        )
    };
    let previous = match deployments::previous(&n, current.id) {
        None => no_previous(format!(
            "the deployment history of \"{name}\" does not say which version was deployed before version {}",
            current.version
        )),
        Some(None) => no_previous(format!(
            "version {} of \"{name}\" was the first version deployed: there is no previous one",
            current.version
        )),
        Some(Some(id)) => id,
    };
    let Some(version) = deployments::version_of(&n, previous) else {
        no_previous(format!(
            "the version of \"{name}\" deployed before version {}, model {previous}, was dropped",
            current.version
        ))
    };
    deployments::pin(&n, Some(previous));
    deployments::record(&Decision {
        name: &n,
        how: How::Previous,
        from: Some(current.id),
        to: Some(previous),
        candidate: None,
        scores: Scores::default(),
        reason: format!(
            "rolled back to version {version} (model {previous}), deployed before {}",
            deployments::describe(Some(current))
        ),
    });
    resolve_name(name)
}

/// The name `text` stands for, once the caller may manage it (`what`: "deploy", "drop"), with
/// the name's deploy lock held: it waits for deploys and drops of the same name in other
/// sessions, then checks again what they may have changed (the name gone, a grant revoked).
/// Only a role allowed to manage the name ever takes its lock.
fn checked_name(text: &str, what: &str) -> grants::ModelName {
    resolve_name(text); // raises if the caller may not use a model of this name
    let n = grants::model_name(text);
    grants::check_manage_name(&n, text, what);
    wait_for(Purpose::Deploy, &n.owner, &n.name);
    resolve_name(text);
    grants::check_manage_name(&n, text, what);
    n
}

/// Deletes models (and their epochs) as the catalog's owner: `filter` is a WHERE clause over
/// `args`; the caller's right to drop them was checked before. Returns how many.
fn delete_models(filter: &str, args: &[pgrx::datum::DatumWithOid<'_>]) -> i64 {
    let sql =
        format!("WITH d AS (DELETE FROM corgipile.models WHERE {filter} RETURNING 1) SELECT pg_catalog.count(*) FROM d");
    let dropped = as_catalog_owner(|| {
        Spi::get_one_with_args::<i64>(&sql, args)
            .unwrap_or_else(|e| spi_failed("drop the model", e))
            .unwrap_or(0)
    });
    // A dropped version's name stands for another (or none): plans that resolved it are
    // planned again.
    crate::catalog::plans::models_changed();
    dropped
}

/// A drop that changed which version the name `n` means (`before` was deployed): a row of the
/// history (the caller holds the name's deploy lock).
fn record_drop(n: &grants::ModelName, before: Option<deployments::Deployed>) {
    let after = deployments::deployed(n);
    let Some(dropped) = before.filter(|b| after.map(|a| a.id) != Some(b.id)) else {
        return;
    };
    let now = match after {
        Some(_) => format!("the name means {} now", deployments::describe(after)),
        None => "the name has no version left".into(),
    };
    deployments::record(&Decision {
        name: n,
        how: How::Drop,
        from: Some(dropped.id),
        to: after.map(|d| d.id),
        candidate: None,
        scores: Scores::default(),
        reason: format!(
            "corgipile_drop_model dropped the deployed {}: {now}",
            deployments::describe(Some(dropped))
        ),
    });
}

/// Deletes one model (and its epochs); returns 1. It must be the caller's, or the caller must
/// hold "manage" on it or its name (or manage every role's models); a model the caller cannot
/// see does not exist for it. NULL in, NULL out (the function is STRICT). Dropping the deployed
/// version of a name is a row of corgipile.deployments (`drop`).
#[pg_extern(volatile, parallel_unsafe)]
fn corgipile_drop_model(model_id: i64) -> i64 {
    check_writable(c"corgipile_drop_model()");
    grants::check_manage_id(model_id, "drop");
    // A version of a name waits for deploys and drops of that name, as they wait for it.
    let named = match grants::model_owner(model_id) {
        Some((owner, Some(name))) => {
            wait_for(Purpose::Deploy, &owner, &name);
            grants::check_manage_id(model_id, "drop");
            let n = grants::ModelName { owner, name };
            let before = deployments::deployed(&n);
            Some((n, before))
        }
        _ => None,
    };
    let dropped = delete_models("id OPERATOR(pg_catalog.=) $1", &[model_id.into()]);
    if dropped == 0 {
        no_such_model(model_id);
    }
    if let Some((n, before)) = named {
        record_drop(&n, before);
    }
    dropped
}

/// Deletes every version of a model name (the caller's own, or `owner.name` with "manage" on
/// it); returns how many. (An integer is a model id, as in prediction.) NULL in, NULL out.
#[pg_extern(volatile, parallel_unsafe, name = "corgipile_drop_model")]
fn corgipile_drop_model_by_name(model_name: &str) -> i64 {
    if let ModelRef::Id(id) = ModelRef::from_text(model_name) {
        return corgipile_drop_model(id);
    }
    check_writable(c"corgipile_drop_model()");
    let n = checked_name(model_name, "drop");
    let before = deployments::deployed(&n);
    let dropped = delete_models(
        "name OPERATOR(pg_catalog.=) $1 AND trained_by OPERATOR(pg_catalog.=) $2::pg_catalog.name",
        &[n.name.as_str().into(), n.owner.as_str().into()],
    );
    record_drop(&n, before);
    dropped
}

type CoefficientRow = (
    Option<String>,
    String,
    Option<i64>,
    f64,
    Option<f64>,
    Option<f64>,
    Option<f64>,
    Option<f64>,
    Option<f64>,
    Option<f64>,
);

/// A model's `metrics->'inference'` (`"inference": true`): per coefficient, in the order the
/// rows come (the weights, then the intercept when fitted); null for a categorical column's
/// reference level (not estimated: its coefficient is 0, no test).
struct Tests {
    std_error: Vec<Option<f64>>,
    statistic: Vec<Option<f64>>,
    p_value: Vec<Option<f64>>,
    ci_low: Vec<Option<f64>>,
    ci_high: Vec<Option<f64>>,
    logistic: bool,
}

impl Tests {
    /// The stored tests of `model_id` (read as the catalog's owner: the caller was allowed to
    /// load the model).
    fn of(model_id: i64, n_coefficients: usize, logistic: bool) -> Option<Tests> {
        let json = as_catalog_owner(|| {
            select_one::<pgrx::JsonB>(
                "SELECT metrics OPERATOR(pg_catalog.->) 'inference' FROM corgipile.models WHERE id OPERATOR(pg_catalog.=) $1",
                &[model_id.into()],
            )
        })
        .ok()
        .flatten()?
        .0;
        let array = |key: &str| -> Option<Vec<Option<f64>>> {
            let v: Vec<Option<f64>> = serde_json::from_value(json.get(key)?.clone()).ok()?;
            (v.len() == n_coefficients).then_some(v)
        };
        Some(Tests {
            std_error: array("std_error")?,
            statistic: array("statistic")?,
            p_value: array("p_value")?,
            ci_low: array("ci_low")?,
            ci_high: array("ci_high")?,
            logistic,
        })
    }

    /// Coefficient `i`'s columns after the coefficient (odds ratio: logistic only; none for a
    /// reference level, which has no test).
    fn row(&self, i: usize, coefficient: f64) -> [Option<f64>; 6] {
        let tested = self.std_error[i].is_some();
        [
            self.std_error[i],
            self.statistic[i],
            self.p_value[i],
            self.ci_low[i],
            self.ci_high[i],
            (self.logistic && tested).then(|| coefficient.exp()),
        ]
    }
}

/// A model's coefficients in the units of the training table (a `normalize` standardizer is
/// folded in), one row per (class, feature) plus one '(intercept)' row per class; comparable
/// with scikit-learn's coef_ and intercept_. class: the positive class of a binary classifier,
/// each class of softmax, NULL for linear (all as the label column shows them). feature: for
/// a column list the column name (`col`, `col[i]` for an array element, `col=value`,
/// `col=(other)`, `col=(null)` for categories, `col#b` for a hash bucket); "col[i]" (1-based)
/// for an array column; the index (in the model's index base) for sparse.
fn coefficients(key: ModelRef) -> impl Iterator<Item = CoefficientRow> {
    let stored = load_model_ref(key);
    let Some(linear) = stored.model.as_linear().cloned() else {
        raise(
            PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE,
            format!("model {} is {} ({}): it has no coefficient per feature", stored.id, stored.kind().family().noun(), stored.kind().name()),
            Some("SELECT * FROM corgipile_model_layers(model) lists its layers, their shapes and weights.".into()),
        )
    };
    let linear = std::rc::Rc::new(linear);
    let (kind, n_features, n_outputs) = (stored.kind(), linear.n_features, linear.n_outputs);
    // With "inference": a test per weight, and the intercept's when it was fitted.
    let fitted_intercept = |n: usize| n == n_features || n == n_features + 1;
    let tests = (n_outputs == 1)
        .then(|| {
            let logistic =
                kind.head().likelihood == Some(corgipile_ml::model::Likelihood::Logistic);
            Tests::of(stored.id, n_features + 1, logistic)
                .or_else(|| Tests::of(stored.id, n_features, logistic))
        })
        .flatten()
        .filter(|t| fitted_intercept(t.std_error.len()))
        .map(std::rc::Rc::new);
    let classes: Vec<Option<String>> = match kind.labels() {
        Labels::Number => vec![None],
        Labels::Classes => (0..stored.classes.len())
            .map(|k| Some(stored.class_text(k)))
            .collect(),
        Labels::TwoClasses => vec![(stored.classes.len() == 2).then(|| stored.class_text(1))],
    };
    // Rows are made one at a time as the executor asks for them: a model of millions of
    // weights is never materialized as millions of Rust strings at once.
    classes
        .into_iter()
        .enumerate()
        .take(n_outputs)
        .flat_map(move |(k, class)| {
            let stored = stored.clone();
            let linear = linear.clone();
            let tests = tests.clone();
            (0..=n_features).map(move |j| {
                let coefficient = match j {
                    j if j == n_features => linear.bias[k],
                    j => linear.weights[k * n_features + j],
                };
                let [se, stat, p, low, high, odds] = tests
                    .as_ref()
                    .filter(|t| j < t.std_error.len())
                    .map_or([None; 6], |t| t.row(j, coefficient));
                if j == n_features {
                    return (
                        class.clone(),
                        "(intercept)".to_owned(),
                        None,
                        coefficient,
                        se,
                        stat,
                        p,
                        low,
                        high,
                        odds,
                    );
                }
                let (name, index) = match (&stored.preprocessing, &stored.features) {
                    (Some(p), _) => (p.feature_name(j), j as i64 + 1),
                    (None, serde_json::Value::Array(cols)) => (
                        cols.get(j)
                            .and_then(|c| c.as_str())
                            .unwrap_or("")
                            .to_owned(),
                        j as i64 + 1,
                    ),
                    (None, serde_json::Value::String(col)) => {
                        (format!("{col}[{}]", j + 1), j as i64 + 1)
                    }
                    _ => (
                        (j as i64 + stored.index_base).to_string(),
                        j as i64 + stored.index_base,
                    ),
                };
                (
                    class.clone(),
                    name,
                    Some(index),
                    coefficient,
                    se,
                    stat,
                    p,
                    low,
                    high,
                    odds,
                )
            })
        })
}

by_id_and_name! {
    /// A linear model's coefficients: see `coefficients`.
    #[pg_extern(stable, parallel_safe, name = "corgipile_model_coefficients")]
    fn corgipile_model_coefficients / corgipile_model_coefficients_by_name() -> {
        TableIterator<
            'static,
            (
                name!(class, Option<String>),
                name!(feature, String),
                name!(feature_index, Option<i64>),
                name!(coefficient, f64),
                name!(std_error, Option<f64>),
                name!(statistic, Option<f64>),
                name!(p_value, Option<f64>),
                name!(ci_low, Option<f64>),
                name!(ci_high, Option<f64>),
                name!(odds_ratio, Option<f64>),
            ),
        >
    }
    |key| TableIterator::new(coefficients(key))
}

type LayerRow = (i32, i32, i32, String, Vec<f64>, Vec<f64>);

/// A model's layers, first to last, in the units of the training table: for each, its number
/// (1 = the layer the features enter), its inputs and outputs, the function applied to its
/// outputs, its weights (inputs × outputs, input-major: the weights from input 1 first) and its
/// biases. A network has its hidden layers and an output layer; a linear model is one layer.
fn layers(key: ModelRef) -> Vec<LayerRow> {
    let stored = load_model_ref(key);
    let layers = stored.model.layers().unwrap_or_else(|_| {
        raise(
            PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
            format!("out of memory listing the weights of model {}", stored.id),
            None,
        )
    });
    layers
        .into_iter()
        .enumerate()
        .map(|(l, layer)| {
            (
                l as i32 + 1,
                layer.inputs as i32,
                layer.outputs as i32,
                layer.activation,
                layer.weights,
                layer.biases,
            )
        })
        .collect()
}

by_id_and_name! {
    /// A model's layers: see `layers`.
    #[pg_extern(stable, parallel_safe, name = "corgipile_model_layers")]
    fn corgipile_model_layers / corgipile_model_layers_by_name() -> {
        TableIterator<
            'static,
            (
                name!(layer, i32),
                name!(inputs, i32),
                name!(outputs, i32),
                name!(activation, String),
                name!(weights, Vec<f64>),
                name!(biases, Vec<f64>),
            ),
        >
    }
    |key| TableIterator::new(layers(key))
}
