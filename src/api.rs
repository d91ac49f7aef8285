//! The SQL functions: corgipile_train, corgipile_predict, corgipile_explain.

use crate::catalog::{load_model, store_model, ModelSource};
use crate::decode::{with_float_array, ArrayProblem, FloatSlice, LabelKind};
use crate::error::raise;
use crate::guc::max_buffer_bytes;
use crate::plan::{plan_pipeline, Pipeline, PipelineConfig};
use corgipile_ml::model::ModelKind;
use corgipile_ml::params::TrainParams;
use pgrx::prelude::*;
use pgrx::{JsonB, PgRelation, PgSqlErrorCode};
use std::ffi::{CStr, CString};

/// A training request, checked and turned into the query the pipeline plans.
struct Prepared {
    relid: pg_sys::Oid,
    config: PipelineConfig,
    sql: CString,
    label_is_bool: bool,
}

fn prepare(relation: pg_sys::Oid, model: &str, params: &JsonB) -> Prepared {
    let kind = ModelKind::parse(model).unwrap_or_else(|| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("unknown model \"{model}\""),
            Some(format!("Valid models are: {}.", ModelKind::all_names().join(", "))),
        )
    });
    let mut params = TrainParams::from_json(&params.0)
        .unwrap_or_else(|e| raise(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, e.message, e.hint));
    if params.seed.is_none() {
        params.seed = Some(random_seed());
    }
    // SAFETY: catalog lookups on the backend thread, inside a transaction.
    unsafe {
        let relname = relation_name(relation);
        check_relation(relation, &relname);
        let label_type = column_type(relation, &relname, &params.label, "label");
        let features_type = column_type(relation, &relname, &params.features, "features");
        let label_kind = LabelKind::from_type(label_type).unwrap_or_else(|| {
            raise(
                PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
                format!("label column \"{}\" of {} has type {}", params.label, relname, type_name(label_type)),
                Some("The label must be boolean, an integer type, real, double precision or numeric.".into()),
            )
        });
        if features_type != pg_sys::FLOAT8ARRAYOID && features_type != pg_sys::FLOAT4ARRAYOID {
            raise(
                PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
                format!("features column \"{}\" of {} has type {}", params.features, relname, type_name(features_type)),
                Some("The features column must be float8[] or float4[].".into()),
            );
        }
        let label_expr = if label_type == pg_sys::NUMERICOID {
            format!("{}::float8", quote_ident(&params.label))
        } else {
            quote_ident(&params.label)
        };
        let sql = format!(
            "SELECT {}, {}, ctid FROM ONLY {}",
            label_expr,
            quote_ident(&params.features),
            qualified_name(relation)
        );
        Prepared {
            relid: relation,
            label_is_bool: label_type == pg_sys::BOOLOID,
            config: PipelineConfig {
                model: kind,
                params,
                label_kind,
                max_buffer_bytes: max_buffer_bytes(),
                relation: relname,
            },
            sql: CString::new(sql).expect("identifiers are quoted and NUL-free"),
        }
    }
}

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    // Stored as a JSON integer that also fits a bigint.
    h.finish() & (i64::MAX as u64)
}

unsafe fn relation_name(relid: pg_sys::Oid) -> String {
    let name = pg_sys::get_rel_name(relid);
    if name.is_null() {
        raise(PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE, format!("relation with OID {} does not exist", relid.to_u32()), None);
    }
    CStr::from_ptr(name).to_string_lossy().into_owned()
}

unsafe fn qualified_name(relid: pg_sys::Oid) -> String {
    let nsp = pg_sys::get_namespace_name(pg_sys::get_rel_namespace(relid));
    let rel = pg_sys::get_rel_name(relid);
    format!(
        "{}.{}",
        quote_ident(&CStr::from_ptr(nsp).to_string_lossy()),
        quote_ident(&CStr::from_ptr(rel).to_string_lossy())
    )
}

/// PostgreSQL's own identifier quoting (quotes only when needed, doubles embedded quotes).
fn quote_ident(name: &str) -> String {
    let c = CString::new(name).expect("identifiers were checked for NUL bytes");
    // SAFETY: quote_identifier returns its input or a palloc'd quoted copy, both valid C strings.
    unsafe { CStr::from_ptr(pg_sys::quote_identifier(c.as_ptr())).to_string_lossy().into_owned() }
}

unsafe fn type_name(oid: pg_sys::Oid) -> String {
    CStr::from_ptr(pg_sys::format_type_be(oid)).to_string_lossy().into_owned()
}

/// Only plain heap tables (and materialized views) have pages we can shuffle.
unsafe fn check_relation(relid: pg_sys::Oid, relname: &str) {
    let kind = pg_sys::get_rel_relkind(relid) as u8;
    let what = match kind {
        pg_sys::RELKIND_RELATION | pg_sys::RELKIND_MATVIEW => None,
        pg_sys::RELKIND_VIEW => Some("a view"),
        pg_sys::RELKIND_FOREIGN_TABLE => Some("a foreign table"),
        pg_sys::RELKIND_SEQUENCE => Some("a sequence"),
        pg_sys::RELKIND_PARTITIONED_TABLE => Some("a partitioned table"),
        pg_sys::RELKIND_INDEX | pg_sys::RELKIND_PARTITIONED_INDEX => Some("an index"),
        _ => Some("not a table"),
    };
    if let Some(what) = what {
        raise(
            PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE,
            format!("cannot train on {relname}: it is {what}"),
            Some(match kind {
                pg_sys::RELKIND_PARTITIONED_TABLE => "Train on one partition, or copy the rows into a plain table.".into(),
                _ => "corgipile reads the pages of a plain table: CREATE TABLE ... AS SELECT from it first.".into(),
            }),
        );
    }
    let rel = pg_sys::RelationIdGetRelation(relid);
    let am = (*(*rel).rd_rel).relam;
    pg_sys::RelationClose(rel);
    if am != pg_sys::HEAP_TABLE_AM_OID {
        raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("cannot train on {relname}: it does not use the heap access method"),
            None,
        );
    }
}

/// The type of a user column named by a param; a missing column is an ERROR, never a default.
unsafe fn column_type(relid: pg_sys::Oid, relname: &str, column: &str, param: &str) -> pg_sys::Oid {
    let cname = CString::new(column).unwrap_or_else(|_| {
        raise(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, format!("\"{param}\" contains a NUL byte"), None)
    });
    let attnum = pg_sys::get_attnum(relid, cname.as_ptr());
    if attnum <= 0 {
        raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN,
            format!("column \"{column}\" of {relname} does not exist"),
            Some(format!("Name the {param} column with the \"{param}\" param, e.g. '{{\"{param}\": \"my_column\"}}'.")),
        );
    }
    pg_sys::get_atttype(relid, attnum)
}

/// Trains a model on `relation` and stores it in corgipile.models; returns the model id.
#[pg_extern(volatile, parallel_unsafe)]
fn corgipile_train(relation: PgRelation, model: &str, params: default!(JsonB, "'{}'")) -> i64 {
    let prepared = prepare(relation.oid(), model, &params);
    // SAFETY: plan and run on the backend thread; on ERROR the transaction abort releases the
    // executor's resources and the nodes' Rust state (dropped with the query memory context).
    let outcome = unsafe {
        let stmt = plan_pipeline(prepared.relid, &prepared.sql, &prepared.config);
        let mut pipeline = Pipeline::start(stmt, &prepared.sql, false, false);
        pipeline.run();
        let outcome = pipeline.sgd_state().outcome.take();
        pipeline.finish();
        outcome.expect("the SGD node trains on its first call")
    };
    let params = &prepared.config.params;
    store_model(
        &ModelSource {
            model: prepared.config.model,
            relation: &unsafe { qualified_name(prepared.relid) },
            label_column: &params.label,
            feature_column: &params.features,
            label_is_bool: prepared.label_is_bool,
            params: params.to_json(),
        },
        &outcome,
    )
}

/// The EXPLAIN of the training plan; with `analyze`, after running the training (the model is
/// not stored).
#[pg_extern(volatile, parallel_unsafe)]
fn corgipile_explain(
    relation: PgRelation,
    model: &str,
    params: default!(JsonB, "'{}'"),
    analyze: default!(bool, false),
) -> SetOfIterator<'static, String> {
    let prepared = prepare(relation.oid(), model, &params);
    // SAFETY: as in corgipile_train; the ExplainState lives in the current memory context.
    let text = unsafe {
        let stmt = plan_pipeline(prepared.relid, &prepared.sql, &prepared.config);
        let mut pipeline = Pipeline::start(stmt, &prepared.sql, analyze, !analyze);
        let started = std::time::Instant::now();
        if analyze {
            pipeline.sgd_state().verbose = false;
            pipeline.run();
        }
        let es = pg_sys::NewExplainState();
        (*es).analyze = analyze;
        (*es).costs = true;
        (*es).buffers = analyze;
        (*es).timing = analyze;
        (*es).format = pg_sys::ExplainFormat::EXPLAIN_FORMAT_TEXT;
        pg_sys::ExplainBeginOutput(es);
        pg_sys::ExplainPrintPlan(es, pipeline.query_desc);
        pg_sys::ExplainEndOutput(es);
        let mut text = CStr::from_ptr((*(*es).str_).data).to_string_lossy().into_owned();
        if analyze {
            text.push_str(&format!("Training Time: {:.3} ms\n", started.elapsed().as_secs_f64() * 1000.0));
        }
        pipeline.finish();
        text
    };
    SetOfIterator::new(text.lines().map(str::to_owned).collect::<Vec<_>>())
}

/// The predicted label for one feature vector, in the label values of the training table.
#[pg_extern(stable, parallel_safe)]
fn corgipile_predict(model_id: i64, features: Array<'_, f64>) -> f64 {
    let model = load_model(model_id);
    let ptr = features.into_array_type();
    // SAFETY: pgrx hands us a detoasted, valid float8[] that lives for this call.
    let result = unsafe {
        with_float_array(pg_sys::Datum::from(ptr), |x| match x {
            FloatSlice::F64(x) => {
                if x.len() != model.n_features() {
                    raise(
                        PgSqlErrorCode::ERRCODE_ARRAY_ELEMENT_ERROR,
                        format!("model {model_id} expects {} features, got {}", model.n_features(), x.len()),
                        None,
                    );
                }
                if !x.iter().all(|v| v.is_finite()) {
                    raise(PgSqlErrorCode::ERRCODE_DATA_EXCEPTION, "features contain NaN or Infinity", None);
                }
                model.predict_label(x)
            }
            FloatSlice::F32(_) => unreachable!("argument is float8[]"),
        })
    };
    result.unwrap_or_else(|problem| {
        let problem = match problem {
            ArrayProblem::Empty => format!("model {model_id} expects {} features, got an empty array", model.n_features()),
            other => other.to_string(),
        };
        raise(PgSqlErrorCode::ERRCODE_DATA_EXCEPTION, problem, None)
    })
}
