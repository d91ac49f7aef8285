//! A validation relation (`"validation": {"relation": ...}`): found, and its rows read into
//! memory encoded as the training's, by one server's training before it starts and by a
//! sharded training's coordinator after its statistics round (`crate::shard::gate`).

use crate::exec::sgd::{Collect, CollectedRows};
use crate::pg::error::raise;
use crate::pipeline::{ClassValue, Mode};
use crate::request::prepare;
use corgipile_ml::model::ModelKind;
use corgipile_ml::params::{Features as FeatureSpec, ShuffleMode, TrainParams};
use corgipile_ml::preprocess::Preprocessor;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

/// The OID of the validation relation `name` (ERROR 42P01 if there is none).
pub fn validation_relid(name: &str) -> pg_sys::Oid {
    Spi::get_one_with_args::<pg_sys::Oid>(
        "SELECT pg_catalog.to_regclass($1)::pg_catalog.oid",
        &[name.into()],
    )
    .ok()
    .flatten()
    .unwrap_or_else(|| {
        raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
            format!("validation relation \"{name}\" does not exist"),
            None,
        )
    })
}

/// Reads a validation relation (same columns as the training relation) into memory; `classes`:
/// the label values already numbered (a sharded training's numbering), which keep their
/// indices.
///
/// # Safety
/// Runs a plan: on the backend thread, inside the SQL call's transaction.
pub unsafe fn collect_relation(
    name: &str,
    kind: ModelKind,
    params: &TrainParams,
    preprocessing: Option<&Preprocessor>,
    classes: Vec<ClassValue>,
) -> CollectedRows {
    let relid = validation_relid(name);
    let mut p = params.clone();
    p.validation = None;
    if let Some(prep) = preprocessing {
        // The training's columns ("*" resolved on the training table), by name.
        p.features = FeatureSpec::Columns(prep.column_names().map(str::to_owned).collect());
        p.exclude.clear();
    }
    p.shuffle = ShuffleMode::NoShuffle;
    p.double_buffer = false;
    let prepared = prepare(relid, kind, p, Mode::Collect, classes, preprocessing);
    // A gated training scores the deployed version on exactly these rows: which they are.
    prepared
        .run(Collect {
            record_held_out: params.deploy.is_some(),
        })
        .unwrap_or_else(|| {
            raise(
                PgSqlErrorCode::ERRCODE_NO_DATA_FOUND,
                format!("validation relation \"{name}\" has no usable rows"),
                None,
            )
        })
}
