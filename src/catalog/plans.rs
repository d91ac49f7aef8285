//! The catalog as the planner sees it: what a rewrite of a prediction from a row needs of a
//! model (`predict::simplify`), read without ever raising an ERROR for a model the caller may not
//! use; and telling cached plans that the models changed.
//!
//! A plan that rewrote `corgipile_predict('churn', t)` into a call on churn's columns depends on
//! which model the name stood for. The planner records corgipile.models among the relations the
//! plan depends on, and every change of what a name or an id stands for (a new model, a deploy,
//! a drop, a family's or search's models written) sends a relcache invalidation of that table:
//! PostgreSQL's plan cache (`PlanCacheRelCallback`) then marks every plan depending on it
//! invalid, in this session at the next command and in the others at their next transaction
//! command, and the next execution plans again.

use super::{catalog_column, catalog_table, find_name_in_statement, ModelRef};
use corgipile_ml::preprocess::Preprocessor;
use pgrx::prelude::*;
use pgrx::JsonB;

/// What the planner needs of a model to pass a call the model's columns only.
pub struct PlannedModel {
    /// The columns it reads, and how (None: trained on arrays).
    pub preprocessing: Option<Preprocessor>,
    /// Whether it has per-group models (their columns are read too).
    pub has_groups: bool,
}

/// The model `key` stands for now, for the current role (row-level security and the name's
/// grants apply, as when predicting); None if there is none it may use, or its preprocessing
/// cannot be read. The name's resolution is the statement's (the execution in the same
/// statement uses the same model).
pub fn planned_model(key: ModelRef) -> Option<PlannedModel> {
    let id = match key {
        ModelRef::Id(id) => id,
        ModelRef::Name(name) => find_name_in_statement(name)?,
    };
    let sql = format!(
        "SELECT {preprocessing}, (metrics OPERATOR(pg_catalog.->) 'groups') IS NOT NULL
         FROM corgipile.models WHERE id OPERATOR(pg_catalog.=) $1",
        preprocessing = catalog_column(c"preprocessing", "NULL::pg_catalog.jsonb"),
    );
    let row = Spi::connect(|client| {
        let table = client.select(&sql, Some(1), &[id.into()])?;
        if table.is_empty() {
            return Ok(None);
        }
        let row = table.first();
        Ok::<_, pgrx::spi::Error>(Some((
            row.get::<JsonB>(1)?.map(|j| j.0).filter(|j| !j.is_null()),
            row.get::<bool>(2)?.unwrap_or(true),
        )))
    })
    .ok()
    .flatten()?;
    let preprocessing = match row.0 {
        Some(json) => Some(Preprocessor::from_json(&json)?),
        None => None,
    };
    Some(PlannedModel {
        preprocessing,
        has_groups: row.1,
    })
}

/// corgipile.models' OID.
pub fn models_relid() -> pg_sys::Oid {
    catalog_table().0
}

/// Invalidates every cached plan that depends on what a model name or id stands for (see the
/// module's comment): call after writing corgipile.models. Sent at commit to the other
/// sessions, and seen by this one at its next command.
pub fn models_changed() {
    // SAFETY: backend thread, inside a transaction; the relation exists (catalog_table raises
    // otherwise), so the syscache lookup CacheInvalidateRelcacheByRelid does finds it.
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(models_relid()) }
}
