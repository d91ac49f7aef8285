//! corgipile_evaluate: a stored model scored on a relation.

use crate::catalog::{load_model_ref, ModelRef, StoredModel};
use crate::exec::sgd::Evaluate;
use crate::pg::error::raise;
use crate::pipeline::Mode;
use crate::request::args::{ParamsArg, RelationArg};
use crate::request::{json_type, parse_params, prepare};
use crate::shard::evaluate_sharded;
use crate::shard::gate::HeldOut;
use corgipile_ml::params::{ShuffleMode, TrainParams};
use pgrx::prelude::*;
use pgrx::{JsonB, PgSqlErrorCode};
use std::rc::Rc;

by_id_and_name! {
    /// Scores a stored model on a relation (read with the same block scan as training). Returns
    /// accuracy, precision, recall, F1, ROC AUC and log loss for classifiers (per class and
    /// macro for softmax), MSE, RMSE, MAE and R² for linear regression, and the rows scored and
    /// skipped.
    #[pg_extern(volatile, parallel_unsafe, name = "corgipile_evaluate")]
    fn corgipile_evaluate / corgipile_evaluate_by_name(
        relation: {RelationArg},
        params: {default!(ParamsArg, "'{}'")}
    ) -> {JsonB}
    |key| evaluate(key, relation, params)
}

fn evaluate(key: ModelRef, relation: RelationArg, params: ParamsArg) -> JsonB {
    let stored = load_model_ref(key);
    JsonB(evaluate_rows(stored, relation.oid(), params, None))
}

/// corgipile_evaluate's report of `stored` on `relid` under `params` (its `params` argument);
/// with `only`, on the rows a training held out of it alone (a deploy gate): by tuple id here,
/// or kept on the shards of a sharded table.
pub(super) fn evaluate_rows(
    stored: Rc<StoredModel>,
    relid: pg_sys::Oid,
    params: ParamsArg,
    only: Option<&mut HeldOut>,
) -> serde_json::Value {
    let (params, members) = evaluation_params(&stored, params, "corgipile_evaluate", &[]);
    let mut prepared = prepare(
        relid,
        stored.kind(),
        params,
        Mode::Evaluate,
        stored.classes.clone(),
        stored.preprocessing.as_ref(),
    );
    if let Some(g) = prepared.config.groups.as_mut() {
        g.known = Some(members.iter().map(|(k, _)| k.clone()).collect());
    }
    let elsewhere = || -> ! {
        raise(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            "the held-out rows are not where the deploy gate scores",
            None,
        )
    };
    match (crate::shard::sharded_leaves(prepared.relid), only) {
        (Some(leaves), None) if stored.groups.is_some() => {
            crate::shard::groups::evaluate_family_sharded(&prepared, leaves, &stored, &members)
        }
        // The gate refuses a deployed family on shards before any work (`Gate::check_deployed`).
        (Some(_), Some(_)) if stored.groups.is_some() => elsewhere(),
        (Some(leaves), only) => {
            let (evaluation, rows_skipped) = match only {
                None => evaluate_sharded(&prepared, leaves, &stored, None),
                Some(HeldOut::Shards(kept)) => kept.evaluate(&prepared, &stored),
                Some(HeldOut::Rows(_)) => elsewhere(),
            };
            let mut report = evaluation.finish(rows_skipped);
            report["model_id"] = serde_json::json!(stored.id);
            report
        }
        (None, only) => prepared.run(Evaluate {
            only_rows: match only {
                None => None,
                Some(HeldOut::Rows(rows)) => Some(rows.clone()),
                Some(HeldOut::Shards(_)) => elsewhere(),
            },
            model: stored.clone(),
            members: members
                .into_iter()
                .map(|(key, id)| {
                    let m = crate::catalog::load_group_model(&stored, &key, id);
                    (key, m)
                })
                .collect(),
        }),
    }
}

/// The params of an evaluation of `stored` (`function`'s `params` argument, which may also
/// hold the `extra` keys, taken out by the caller before): the model's features and label
/// unless overridden, read in storage order by one backend. Also a family of per-group
/// models' members (key, model id), in the order of their numbers (empty for other models).
pub(crate) fn evaluation_params(
    stored: &StoredModel,
    params: ParamsArg,
    function: &str,
    extra: &[&str],
) -> (TrainParams, Vec<(String, i64)>) {
    let mut overrides = match params.0 {
        serde_json::Value::Object(map) => map,
        other => raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("params must be a JSON object, got {}", json_type(&other)),
            Some(format!(
                "pass e.g. '{{\"where\": \"id % 5 = 0\"}}'::jsonb to {function}"
            )),
        ),
    };
    const ACCEPTED: [&str; 6] = [
        "features",
        "label",
        "buffer_size",
        "block_size",
        "only",
        "where",
    ];
    for key in overrides.keys() {
        if !ACCEPTED.contains(&key.as_str()) && !extra.contains(&key.as_str()) {
            let valid: Vec<&str> = ACCEPTED.iter().chain(extra).copied().collect();
            raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("unknown parameter \"{key}\" for {function}"),
                Some(format!(
                    "valid parameters are: {} (features and label default to the model's)",
                    valid.join(", ")
                )),
            );
        }
    }
    for key in extra {
        overrides.remove(*key);
    }
    if stored.preprocessing.is_some()
        && overrides
            .get("features")
            .is_some_and(|f| *f != stored.features)
    {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!(
                "model {} reads its feature columns by name: \"features\" cannot be changed",
                stored.id
            ),
            Some(format!(
                "The relation must have the model's columns: {}.",
                stored.features
            )),
        );
    }
    overrides
        .entry("features")
        .or_insert_with(|| stored.features.clone());
    overrides
        .entry("label")
        .or_insert_with(|| serde_json::Value::String(stored.label_column.clone()));
    let mut params = parse_params(
        &ParamsArg(serde_json::Value::Object(overrides)),
        stored.kind(),
    );
    // How an evaluation reads, whatever the call says: the model's index base, in storage order
    // by one backend, silently, reproducibly.
    params.index_base = match stored.index_base {
        0 => 0,
        1 => 1,
        _ => raise(
            PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
            format!("model {} has an index base other than 0 or 1", stored.id),
            None,
        ),
    };
    params.shuffle = ShuffleMode::NoShuffle;
    params.double_buffer = false;
    params.verbose = false;
    params.seed = Some(0);
    // A family of per-group models: every row is scored by its group's model (the model of
    // every row for the others); the report has each group's part too.
    let mut members: Vec<(String, i64)> = Vec::new();
    if let Some(groups) = &stored.groups {
        params.group_by = Some(groups.columns.clone());
        members = groups
            .models
            .iter()
            .map(|(k, &id)| (k.clone(), id))
            .collect();
        members.sort_by_key(|&(_, id)| id);
    }
    (params, members)
}
