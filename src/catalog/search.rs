//! Storing a search: every configuration that trained is a version of the name, the best one
//! (by `select_by`, on the validation rows) stored last, so that the name's most recent
//! version — the one predictions use unless a version is pinned — is the best. Each model's
//! metrics say which configuration it is (`metrics->'search'`); corgipile.search_trials lists
//! them, one row per configuration.

use super::{as_catalog_owner, store_model_with, ModelSource};
use crate::pg::error::{notice, raise};
use crate::pipeline::{EpochRecord, TrainOutcome, Trial};
use corgipile_ml::params::search::{best_of, SelectBy};
use corgipile_ml::trials::cross_validation;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;
use serde_json::{json, Value};

/// The epoch whose model is stored: the best one with patience, else the last.
fn stored_epoch(outcome: &TrainOutcome) -> Option<&EpochRecord> {
    outcome
        .best_epoch
        .and_then(|best| outcome.epochs.iter().find(|e| e.stats.epoch == best))
        .or(outcome.epochs.last())
}

/// Stores every configuration that trained (the best last) and returns the best one's id.
pub fn store_search(source: &ModelSource, trials: Vec<Trial>, select_by: SelectBy) -> i64 {
    let of = trials.len();
    // With folds, a configuration's score is its folds' mean; else its validation score.
    let cv: Vec<Option<Value>> = trials
        .iter()
        .map(|t| (!t.cv.is_empty()).then(|| cross_validation(&t.cv)))
        .collect();
    let scores: Vec<Option<f64>> = trials
        .iter()
        .zip(&cv)
        .map(|(t, cv)| {
            let outcome = t.outcome.as_ref().ok()?;
            if let Some(cv) = cv {
                return cv[select_by.name()].as_f64();
            }
            let validation = stored_epoch(outcome)?.validation.as_ref()?;
            select_by.score(validation)
        })
        .collect();
    let Some(best) = best_of(select_by, &scores) else {
        raise(
            PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
            format!(
                "no configuration of the search has a validation {}",
                select_by.name()
            ),
            Some("The validation rows (or every fold) may be empty: give \"validation\" a larger fraction, a predicate or a relation that holds rows, or use fewer \"folds\".".into()),
        )
    };
    // Configurations set aside (they diverged): reported, not stored.
    let set_aside: Vec<Value> = trials
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            let e = t.outcome.as_ref().err()?;
            Some(json!({
                "trial": i + 1,
                "params": Value::Object(t.configuration.clone()),
                "error": e.to_string(),
                "epochs_trained": t.epochs_before_failing.len(),
            }))
        })
        .collect();
    for s in &set_aside {
        notice(format!(
            "search configuration {} was set aside and not stored: {}",
            s["params"],
            s["error"].as_str().unwrap_or_default()
        ));
    }
    let mut order: Vec<usize> = (0..of).filter(|&i| i != best).collect();
    order.push(best);
    let mut ids = Vec::with_capacity(of);
    for i in order {
        let trial = &trials[i];
        let Ok(outcome) = &trial.outcome else {
            continue;
        };
        let mut search = json!({
            "trial": i + 1,
            "of": of,
            "params": Value::Object(trial.configuration.clone()),
            "select_by": select_by.name(),
            "score": scores[i],
            "selected": i == best,
            "train_seconds": trial.seconds,
        });
        if i == best && !set_aside.is_empty() {
            search["set_aside"] = json!(set_aside);
        }
        let trial_source = ModelSource {
            params: trial.params.to_json(),
            features: source.features.clone(),
            ..*source
        };
        let mut extra = serde_json::Map::new();
        extra.insert("search".into(), search);
        if let Some(cv) = &cv[i] {
            extra.insert("cv".into(), cv.clone());
        }
        ids.push(store_model_with(&trial_source, outcome, extra));
    }
    // The search's id is its first model's: corgipile.search_trials groups by it.
    as_catalog_owner(|| {
        Spi::run_with_args(
            "UPDATE corgipile.models
             SET metrics = pg_catalog.jsonb_set(metrics, '{search,search_id}', pg_catalog.to_jsonb($1::pg_catalog.int8))
             WHERE id OPERATOR(pg_catalog.=) ANY ($2::pg_catalog.int8[])",
            &[ids[0].into(), ids.clone().into()],
        )
        .unwrap_or_else(|e| {
            raise(
                PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                format!("could not store the search: {e}"),
                None,
            )
        })
    });
    *ids.last().expect("the best configuration was stored")
}
