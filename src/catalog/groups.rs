//! Storing per-group models (`"group_by"`): every group's model is a version of the name, and
//! the model of every row is stored last, so that it is the version the name stands for. Its
//! metrics say how to find a row's model (`metrics->'groups'->'models'`: each group's key and
//! model id); each group's model says its group (`metrics->'group'`). corgipile.group_models
//! lists them, one row per group.

use super::{as_catalog_owner, store_model_with, ModelSource};
use crate::pg::error::{notice, raise, raise_train_error};
use crate::pipeline::Trial;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;
use serde_json::{json, Map, Value};

/// What the statistics pass found beyond the groups that got a model.
pub struct SmallGroups {
    pub groups: u64,
    pub rows: u64,
}

/// Stores every group's model, then the model of every row (the first trial), and returns its
/// id. A group's model that diverged is not stored (a NOTICE says so): its rows are predicted
/// by the model of every row.
pub fn store_groups(
    source: &ModelSource,
    mut trials: Vec<Trial>,
    columns: &[String],
    min_group_rows: u64,
    small: SmallGroups,
) -> i64 {
    let all = trials.remove(0);
    let all_outcome = all
        .outcome
        .unwrap_or_else(|e| raise_train_error(e, &|v| v.to_string(), false));
    let mut models = Map::new();
    let mut set_aside = Vec::new();
    let mut ids = Vec::with_capacity(trials.len());
    for trial in &trials {
        let (key, rows) = trial.group.clone().expect("a group's model");
        let outcome = match &trial.outcome {
            Ok(o) => o,
            Err(e) => {
                notice(format!(
                    "the model of group {key} was set aside and not stored ({e}): the model of every row predicts its rows"
                ));
                set_aside.push(json!({"group": key, "rows": rows, "error": e.to_string()}));
                continue;
            }
        };
        let mut extra = Map::new();
        extra.insert(
            "group".into(),
            json!({"key": key, "columns": columns, "rows": rows}),
        );
        let id = store_model_with(source, outcome, extra);
        models.insert(key, json!(id));
        ids.push(id);
    }
    let stored = models.len();
    let mut extra = Map::new();
    extra.insert(
        "groups".into(),
        json!({
            "columns": columns,
            "min_group_rows": min_group_rows,
            "groups": stored as u64 + set_aside.len() as u64 + small.groups,
            "models": Value::Object(models),
            "small_groups": small.groups,
            "small_group_rows": small.rows,
            "set_aside": set_aside,
        }),
    );
    let id = store_model_with(source, &all_outcome, extra);
    if !ids.is_empty() {
        // Each group's model names its family: the model of every row.
        as_catalog_owner(|| {
            Spi::run_with_args(
                "UPDATE corgipile.models
                 SET metrics = pg_catalog.jsonb_set(metrics, '{group,family}', pg_catalog.to_jsonb($1::pg_catalog.int8))
                 WHERE id OPERATOR(pg_catalog.=) ANY ($2::pg_catalog.int8[])",
                &[id.into(), ids.into()],
            )
            .unwrap_or_else(|e| {
                raise(
                    PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                    format!("could not store the group models: {e}"),
                    None,
                )
            })
        });
    }
    id
}
