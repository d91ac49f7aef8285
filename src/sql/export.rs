//! corgipile_export_sql and corgipile_export_onnx: a stored model as the text of a plain
//! PL/pgSQL function, or as the bytes of an ONNX model, that scores a row as the model does, to
//! run where corgipile is not installed (see `corgipile_ml::export`). The caller needs what
//! corgipile_predict needs on the model.

use crate::catalog::{load_model_ref, ModelRef, StoredModel};
use crate::pg::error::raise;
use crate::pipeline::ClassValue;
use corgipile_ml::export::onnx::{export_onnx, OnnxExport};
use corgipile_ml::export::{export_sql, Classes, Export, ExportError, Inputs, Output};
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

/// The text of `CREATE FUNCTION <function_name>(...)` for the model `key`: `output` is what
/// it returns ('predict', 'decision' or 'proba', as corgipile_predict,
/// corgipile_decision_function and corgipile_predict_proba); the name defaults to
/// `corgipile_model_<id>`.
fn export(key: ModelRef, function_name: Option<&str>, output: &str) -> String {
    let Some(output) = Output::parse(output.trim()) else {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("unknown output \"{output}\""),
            Some(format!("output is one of: {}.", Output::NAMES.join(", "))),
        )
    };
    let stored = load_model_ref(key);
    with_parts(&stored, |inputs, classes| {
        let default_name = format!("corgipile_model_{}", stored.id);
        let function = function_name.unwrap_or(&default_name);
        let e = Export {
            function,
            model: &stored.model,
            inputs,
            classes,
            output,
            max_bytes: crate::pg::guc::max_export_bytes(),
        };
        export_sql(&e).unwrap_or_else(|problem| raise_export(stored.id, problem))
    })
}

/// The bytes of the ONNX model of the model `key` (see `corgipile_ml::export::onnx`).
fn export_onnx_bytes(key: ModelRef) -> Vec<u8> {
    let stored = load_model_ref(key);
    with_parts(&stored, |inputs, classes| {
        let name = format!("corgipile_model_{}", stored.id);
        let e = OnnxExport {
            model: &stored.model,
            inputs,
            classes,
            name: &name,
            producer_version: env!("CARGO_PKG_VERSION"),
            max_bytes: crate::pg::guc::max_export_bytes(),
        };
        export_onnx(&e).unwrap_or_else(|problem| raise_export(stored.id, problem))
    })
}

/// What both exports read of a stored model besides its parameters: what it takes (its
/// column list, or its one array column) and its classes' label values; per-group families and
/// models of sparse pairs are refused.
fn with_parts<R>(stored: &StoredModel, f: impl FnOnce(Inputs, Classes) -> R) -> R {
    if stored.groups.is_some() {
        raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("model {} has a model per group: it cannot be exported as one model", stored.id),
            Some("Export each group's model by its id (SELECT model_id FROM corgipile_predict_group(...) names them).".into()),
        );
    }
    let inputs = match (&stored.preprocessing, &stored.features) {
        (Some(p), _) => Inputs::Columns(p),
        (None, serde_json::Value::String(column)) => Inputs::Array { column },
        _ => raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!(
                "model {} reads sparse (indices, values) features: it cannot be exported",
                stored.id
            ),
            Some(
                "Models trained on a column list or on one float8[] column can be exported.".into(),
            ),
        ),
    };
    let numbers: Vec<f64>;
    let texts: Vec<String>;
    let classes = if !stored.kind().is_classifier() {
        Classes::None
    } else if stored
        .classes
        .iter()
        .all(|c| matches!(c, ClassValue::Number(_)))
    {
        numbers = stored
            .classes
            .iter()
            .filter_map(ClassValue::as_f64)
            .collect();
        Classes::Numbers(&numbers)
    } else {
        texts = (0..stored.classes.len())
            .map(|k| stored.class_text(k))
            .collect();
        Classes::Texts(&texts)
    };
    f(inputs, classes)
}

fn raise_export(id: i64, problem: ExportError) -> ! {
    let message = format!("model {id} cannot be exported: {problem}");
    let (code, hint) = match &problem {
        ExportError::Hashed { column } => (
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("Train with \"preprocess\": {{\"{column}\": {{\"encode\": \"one_hot\"}}}} to export the model."),
        ),
        ExportError::HashedOnnx { column } => (
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("Train with \"preprocess\": {{\"{column}\": {{\"encode\": \"one_hot\"}}}} to export the model as ONNX."),
        ),
        ExportError::TimeOnnx { column } => (
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("Train on a number made of the column (extract(epoch FROM \"{column}\"), a part of it) to export the model as ONNX; corgipile_export_sql exports date/time columns."),
        ),
        ExportError::TooLarge { .. } => (
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            "A superuser can raise corgipile.max_export_size.".into(),
        ),
        ExportError::NoSuchOutput { .. } => (
            PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE,
            "'decision' is for kinds with one output (svm, logistic, linear, the regressions); 'proba' for logistic and the kinds with one output per class.".into(),
        ),
        ExportError::EmptyName => (
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            "Pass a function name, or NULL for corgipile_model_<id>.".into(),
        ),
        ExportError::OutOfMemory => (PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY, String::new()),
        ExportError::NotFinite | ExportError::Classes { .. } => (
            PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
            "The stored model is damaged: train it again.".into(),
        ),
    };
    raise(code, message, (!hint.is_empty()).then_some(hint))
}

by_id_and_name! {
    /// A model as the text of a plain PL/pgSQL function: see `export`.
    #[pg_extern(stable, parallel_safe, name = "corgipile_export_sql")]
    fn corgipile_export_sql / corgipile_export_sql_by_name(
        function_name: {default!(Option<&str>, "NULL")},
        output: {default!(&str, "'predict'")}
    ) -> {String}
    |key| export(key, function_name, output)
}

by_id_and_name! {
    /// A model as the bytes of an ONNX model: see `export_onnx_bytes`.
    #[pg_extern(stable, parallel_safe, name = "corgipile_export_onnx")]
    fn corgipile_export_onnx / corgipile_export_onnx_by_name() -> {Vec<u8>}
    |key| export_onnx_bytes(key)
}
