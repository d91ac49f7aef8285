//! corgipile.models / corgipile.epochs: writing trained models, loading them for prediction.
//!
//! Loaded models are cached per backend for the duration of one statement (keyed by the
//! transaction, statement start and command id, plus the current role), so
//! `SELECT corgipile_predict(id, f) FROM big_table` reads the catalog once, while a later
//! statement never sees a model that has since been deleted.

use crate::error::raise;
use crate::exec::sgd::TrainOutcome;
use corgipile_ml::model::{LinearModel, ModelKind};
use pgrx::prelude::*;
use pgrx::{JsonB, PgSqlErrorCode};
use serde_json::json;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// What identifies a training apart from its outcome.
pub struct ModelSource<'a> {
    pub model: ModelKind,
    pub relation: &'a str,
    pub label_column: &'a str,
    pub feature_column: &'a str,
    pub label_is_bool: bool,
    pub params: serde_json::Value,
}

/// Insert the model and its epochs; returns the new model id. Runs in the caller's transaction,
/// so an ERROR anywhere leaves no row behind.
pub fn store_model(source: &ModelSource, outcome: &TrainOutcome) -> i64 {
    let last = outcome.epochs.last().expect("at least one epoch");
    let label_type = if source.label_is_bool { "boolean" } else { "numeric" };
    let label_mapping = json!({
        "negative": outcome.label_map.0,
        "positive": outcome.label_map.1,
        "label_type": label_type,
    });
    let metrics = json!({
        "loss": last.stats.loss,
        "accuracy": last.stats.accuracy,
        "epochs_run": outcome.epochs.len(),
        "metric_note": "loss and accuracy are measured during the last epoch, on each tuple before its update",
    });
    let n_features = outcome.model.weights.len() as i32;
    let id = Spi::get_one_with_args::<i64>(
        "INSERT INTO corgipile.models
            (model_type, relation, label_column, feature_column, n_features, label_mapping,
             weights, bias, params, metrics, rows_trained, rows_skipped, training_seconds)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
         RETURNING id",
        &[
            source.model.name().into(),
            source.relation.into(),
            source.label_column.into(),
            source.feature_column.into(),
            n_features.into(),
            JsonB(label_mapping).into(),
            outcome.model.weights.clone().into(),
            outcome.model.bias.into(),
            JsonB(source.params.clone()).into(),
            JsonB(metrics).into(),
            (outcome.rows_trained as i64).into(),
            (outcome.rows_skipped as i64).into(),
            outcome.seconds.into(),
        ],
    )
    .unwrap_or_else(|e| raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, format!("could not store the model: {e}"), None))
    .expect("INSERT ... RETURNING id returns a row");

    let column = |f: &dyn Fn(&crate::exec::sgd::EpochRecord) -> f64| -> Vec<f64> { outcome.epochs.iter().map(f).collect() };
    let epochs: Vec<i32> = outcome.epochs.iter().map(|e| e.stats.epoch as i32).collect();
    let tuples: Vec<i64> = outcome.epochs.iter().map(|e| e.stats.tuples as i64).collect();
    Spi::run_with_args(
        "INSERT INTO corgipile.epochs (model_id, epoch, loss, accuracy, tuples, seconds, learning_rate)
         SELECT $1, e.* FROM unnest($2::int4[], $3::float8[], $4::float8[], $5::int8[], $6::float8[], $7::float8[]) AS e",
        &[
            id.into(),
            epochs.into(),
            column(&|e| e.stats.loss).into(),
            column(&|e| e.stats.accuracy).into(),
            tuples.into(),
            column(&|e| e.seconds).into(),
            column(&|e| e.stats.learning_rate).into(),
        ],
    )
    .unwrap_or_else(|e| raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, format!("could not store the epochs: {e}"), None));
    id
}

/// A model as prediction needs it.
pub struct StoredModel {
    pub model: LinearModel,
    pub negative: f64,
    pub positive: f64,
}

impl StoredModel {
    pub fn n_features(&self) -> usize {
        self.model.weights.len()
    }
    /// The predicted label, in the label values of the training table.
    pub fn predict_label(&self, x: &[f64]) -> f64 {
        if self.model.decision(x) >= 0.0 {
            self.positive
        } else {
            self.negative
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct CacheStamp {
    lxid: u32,
    statement_start: i64,
    command_id: u32,
}

fn current_stamp() -> CacheStamp {
    // SAFETY: read-only calls on the backend thread inside a transaction; MyProc is set for
    // every regular backend.
    unsafe {
        CacheStamp {
            lxid: (*pg_sys::MyProc).lxid,
            statement_start: pg_sys::GetCurrentStatementStartTimestamp(),
            command_id: pg_sys::GetCurrentCommandId(false),
        }
    }
}

/// Models loaded in the current statement, by (model id, role).
type ModelCache = (Option<CacheStamp>, HashMap<(i64, pg_sys::Oid), Rc<StoredModel>>);

thread_local! {
    static CACHE: RefCell<ModelCache> = RefCell::new((None, HashMap::new()));
}

/// The model with this id, from the per-statement cache or the catalog. Row-level security on
/// the catalog applies: a model the current role may not see does not exist for it.
pub fn load_model(model_id: i64) -> Rc<StoredModel> {
    let stamp = current_stamp();
    // SAFETY: plain read of the current role on the backend thread.
    let key = (model_id, unsafe { pg_sys::GetUserId() });
    let cached = CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.0 != Some(stamp) {
            c.0 = Some(stamp);
            c.1.clear();
        }
        c.1.get(&key).cloned()
    });
    if let Some(model) = cached {
        return model;
    }
    let model = Rc::new(read_model(model_id));
    CACHE.with(|c| c.borrow_mut().1.insert(key, model.clone()));
    model
}

fn read_model(model_id: i64) -> StoredModel {
    let row = Spi::connect(|client| {
        let table = client.select(
            "SELECT model_type, weights, bias, label_mapping FROM corgipile.models WHERE id = $1",
            Some(1),
            &[model_id.into()],
        )?;
        if table.is_empty() {
            return Ok(None);
        }
        let row = table.first();
        Ok::<_, pgrx::spi::Error>(Some((
            row.get::<String>(1)?,
            row.get::<Vec<f64>>(2)?,
            row.get::<f64>(3)?,
            row.get::<JsonB>(4)?,
        )))
    })
    .unwrap_or_else(|e| raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, format!("could not read model {model_id}: {e}"), None));
    let Some((Some(kind), Some(weights), Some(bias), Some(JsonB(mapping)))) = row else {
        raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            format!("corgipile model {model_id} does not exist"),
            Some("SELECT id, model_type, relation FROM corgipile.models lists the models you can use.".into()),
        );
    };
    let kind = ModelKind::parse(&kind).unwrap_or_else(|| {
        raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("model {model_id} has type \"{kind}\", which this version of corgipile cannot use"),
            None,
        )
    });
    let label = |key: &str| mapping.get(key).and_then(|v| v.as_f64()).unwrap_or(f64::NAN);
    StoredModel {
        model: LinearModel { kind, weights, bias },
        negative: label("negative"),
        positive: label("positive"),
    }
}
