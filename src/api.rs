//! The SQL functions: training, prediction, evaluation, EXPLAIN.

use crate::catalog::{load_model, store_model, ModelSource, StoredModel};
use crate::classes::ClassValue;
use crate::decode::{with_float_array, with_int4_array, ArrayProblem, FloatSlice, ParamsArg};
use crate::error::raise;
use crate::exec::sgd::EvaluationReport;
use crate::exec::tuple_shuffle::ShuffledBuffer;
use crate::guc::max_buffer_bytes;
use crate::input::{self, check_relation, qualified_name, relation_name, FeatureColumns, Input};
use crate::plan::{plan_pipeline, Holdout, Mode, Pipeline, PipelineConfig};
use corgipile_ml::arena::validate_sparse;
use corgipile_ml::model::{ModelKind, Row};
use corgipile_ml::params::{Features as FeatureSpec, TrainParams, Validation};
use pgrx::prelude::*;
use pgrx::{JsonB, PgMemoryContexts, PgRelation, PgSqlErrorCode};
use std::rc::Rc;
use std::ffi::CStr;

/// A checked request: the config every node gets and the query BlockShuffle runs.
struct Prepared {
    relid: pg_sys::Oid,
    config: PipelineConfig,
    input: Input,
}

fn parse_model(model: &str) -> ModelKind {
    ModelKind::parse(model).unwrap_or_else(|| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("unknown model \"{model}\""),
            Some(format!("Valid models are: {}.", ModelKind::all_names().join(", "))),
        )
    })
}

fn parse_params(params: &ParamsArg) -> TrainParams {
    let mut params = TrainParams::from_json(&params.0)
        .unwrap_or_else(|e| raise(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, e.message, e.hint));
    if params.seed.is_none() {
        params.seed = Some(random_seed());
    }
    params
}

fn feature_columns(spec: &FeatureSpec) -> FeatureColumns {
    match spec {
        FeatureSpec::Column(c) => FeatureColumns::Array(c.clone()),
        FeatureSpec::Columns(cs) => FeatureColumns::Columns(cs.clone()),
        FeatureSpec::Sparse { indices, values } => FeatureColumns::Sparse { indices: indices.clone(), values: values.clone() },
    }
}

/// Resolve a relation for `mode` and build the pipeline config.
unsafe fn prepare(relid: pg_sys::Oid, kind: ModelKind, params: TrainParams, mode: Mode, known_classes: Vec<ClassValue>) -> Prepared {
    let relname = relation_name(relid);
    check_relation(relid, &relname);
    let features = feature_columns(&params.features);
    if params.n_features.is_some() && !matches!(features, FeatureColumns::Sparse { .. }) {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            "\"n_features\" applies to sparse features only",
            Some("Dense features take their dimension from the data.".into()),
        );
    }
    let predicate = match (&params.validation, mode) {
        (Some(Validation::Predicate(p)), Mode::Train) => Some(p.as_str()),
        _ => None,
    };
    let input = input::resolve(
        relid,
        &relname,
        kind,
        &features,
        &params.label,
        params.index_base as i64,
        params.n_features,
        predicate,
    );
    let holdout = match (&params.validation, input.validation_column, mode) {
        (_, Some(c), Mode::Train) => Holdout::Column(c),
        (Some(Validation::Fraction(f)), _, Mode::Train) => Holdout::Fraction(*f),
        _ => Holdout::None,
    };
    Prepared {
        relid,
        config: PipelineConfig {
            mode,
            model: kind,
            layout: input.layout,
            label: input.label,
            holdout,
            known_classes,
            params,
            max_buffer_bytes: max_buffer_bytes(),
            relation: relname,
        },
        input,
    }
}

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    // Stored as a JSON integer that also fits a bigint.
    h.finish() & (i64::MAX as u64)
}

/// Plan, start, run and end the pipeline; `before_run` may prime the SGD node's state.
unsafe fn run_pipeline<R>(prepared: &Prepared, before_run: impl FnOnce(&mut crate::exec::sgd::SgdState), after_run: impl FnOnce(&mut crate::exec::sgd::SgdState) -> R) -> R {
    // SAFETY: plan and run on the backend thread; on ERROR the transaction abort releases the
    // executor's resources and the nodes' Rust state (dropped with the query memory context).
    let stmt = plan_pipeline(prepared.relid, &prepared.input.sql, &prepared.config);
    let mut pipeline = Pipeline::start(stmt, &prepared.input.sql, false, false);
    before_run(pipeline.sgd_state());
    pipeline.run();
    let result = after_run(pipeline.sgd_state());
    pipeline.finish();
    result
}

/// Trains a model on `relation` and stores it in corgipile.models; returns the model id.
#[pg_extern(volatile, parallel_unsafe)]
fn corgipile_train(relation: PgRelation, model: &str, params: default!(ParamsArg, "'{}'")) -> i64 {
    let kind = parse_model(model);
    let params = parse_params(&params);
    // SAFETY: catalog lookups and executor calls on the backend thread, inside a transaction.
    unsafe {
        let validation_rows = match &params.validation {
            Some(Validation::Relation(name)) => Some(collect_relation(name, kind, &params)),
            _ => None,
        };
        // Class indices of the validation rows and of the training rows must agree.
        let known_classes = validation_rows.as_ref().map(|(_, c)| c.clone()).unwrap_or_default();
        let prepared = prepare(relation.oid(), kind, params, Mode::Train, known_classes);
        let outcome = run_pipeline(
            &prepared,
            |sgd| sgd.validation_rows = validation_rows,
            |sgd| sgd.outcome.take().expect("the SGD node trains on its first call"),
        );
        let params = &prepared.config.params;
        store_model(
            &ModelSource {
                model: kind,
                relation: &qualified_name(prepared.relid),
                label_column: &params.label,
                features: params.to_json()["features"].clone(),
                label_type: if prepared.input.label_is_bool {
                    "boolean"
                } else if prepared.config.label.uses_classes() && matches!(prepared.config.label, crate::input::LabelCoding::ClassOfText) {
                    "text"
                } else {
                    "numeric"
                },
                params: params.to_json(),
            },
            &outcome,
        )
    }
}

/// Reads a validation relation (same columns as the training relation) into memory.
unsafe fn collect_relation(name: &str, kind: ModelKind, params: &TrainParams) -> (ShuffledBuffer, Vec<ClassValue>) {
    let relid = Spi::get_one_with_args::<pg_sys::Oid>("SELECT pg_catalog.to_regclass($1)::pg_catalog.oid", &[name.into()])
        .ok()
        .flatten()
        .unwrap_or_else(|| {
            raise(PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE, format!("validation relation \"{name}\" does not exist"), None)
        });
    let mut p = params.clone();
    p.validation = None;
    p.shuffle = corgipile_ml::params::ShuffleMode::NoShuffle;
    p.double_buffer = false;
    let prepared = prepare(relid, kind, p, Mode::Collect, Vec::new());
    run_pipeline(&prepared, |_| {}, |sgd| sgd.collected.take()).unwrap_or_else(|| {
        raise(PgSqlErrorCode::ERRCODE_NO_DATA_FOUND, format!("validation relation \"{name}\" has no usable rows"), None)
    })
}

/// Scores a stored model on a relation (read with the same block scan as training). Returns
/// accuracy, precision, recall, F1, ROC AUC and log loss for classifiers (per class and macro
/// for softmax), MSE, RMSE, MAE and R² for linear regression, and the rows scored and skipped.
#[pg_extern(volatile, parallel_unsafe)]
fn corgipile_evaluate(model_id: i64, relation: PgRelation, params: default!(ParamsArg, "'{}'")) -> JsonB {
    let stored = load_model(model_id);
    let mut overrides = match &params.0 {
        serde_json::Value::Object(map) => map.clone(),
        other => raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("params must be a JSON object, got {}", json_type(other)),
            None,
        ),
    };
    for key in overrides.keys() {
        if !["features", "label", "buffer_size", "block_size"].contains(&key.as_str()) {
            raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("unknown parameter \"{key}\" for corgipile_evaluate"),
                Some("valid parameters are: features, label, buffer_size, block_size (features and label default to the model's)".into()),
            );
        }
    }
    overrides.entry("features").or_insert_with(|| stored.features.clone());
    overrides.entry("label").or_insert_with(|| serde_json::Value::String(stored.label_column.clone()));
    overrides.insert("index_base".into(), serde_json::json!(stored.index_base));
    overrides.insert("shuffle".into(), serde_json::json!("no_shuffle"));
    overrides.insert("double_buffer".into(), serde_json::json!(false));
    overrides.insert("verbose".into(), serde_json::json!(false));
    overrides.insert("seed".into(), serde_json::json!(0));
    let params = parse_params(&ParamsArg(serde_json::Value::Object(overrides)));
    // SAFETY: as in corgipile_train.
    let report: EvaluationReport = unsafe {
        let prepared = prepare(relation.oid(), stored.kind(), params, Mode::Evaluate, stored.classes.clone());
        run_pipeline(&prepared, |sgd| sgd.evaluate_model = Some(stored.clone()), |sgd| sgd.evaluation.take().expect("evaluation ran"))
    };
    JsonB(serde_json::to_value(report).expect("report serializes"))
}

/// The order in which SGD would see the rows of `relation` in epoch 1 under `params` (the
/// shuffle strategy, block and buffer sizes, seed): position, label and first feature of each
/// visited row. For studying strategies (the paper's Figures 3 and 4); trains nothing.
#[pg_extern(volatile, parallel_unsafe)]
fn corgipile_trace(
    relation: PgRelation,
    params: default!(ParamsArg, "'{}'"),
) -> TableIterator<'static, (name!(position, i64), name!(label, f64), name!(first_feature, f64))> {
    let mut params = parse_params(&params);
    params.double_buffer = false;
    params.verbose = false;
    // SAFETY: as in corgipile_train.
    let visited = unsafe {
        let prepared = prepare(relation.oid(), ModelKind::Linear, params, Mode::Trace, Vec::new());
        run_pipeline(&prepared, |_| {}, |sgd| sgd.traced.take().unwrap_or_default())
    };
    TableIterator::new(visited.into_iter().enumerate().map(|(i, (label, first))| (i as i64 + 1, label, first)))
}

fn json_type(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "object",
    }
}

/// The EXPLAIN of the training plan; with `analyze`, after running the training (the model is
/// not stored).
#[pg_extern(volatile, parallel_unsafe)]
fn corgipile_explain(
    relation: PgRelation,
    model: &str,
    params: default!(ParamsArg, "'{}'"),
    analyze: default!(bool, false),
) -> SetOfIterator<'static, String> {
    let kind = parse_model(model);
    let params = parse_params(&params);
    // SAFETY: as in corgipile_train; the ExplainState lives in the current memory context.
    let text = unsafe {
        let prepared = prepare(relation.oid(), kind, params, Mode::Train, Vec::new());
        let stmt = plan_pipeline(prepared.relid, &prepared.input.sql, &prepared.config);
        let mut pipeline = Pipeline::start(stmt, &prepared.input.sql, analyze, !analyze);
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

// ---------------------------------------------------------------------------------------------
// Prediction. Every function takes a dense float8[] or a sparse (int4[] indices, float8[]
// values) pair, in the model's index base.

/// A sparse feature vector from SQL, checked against the model and rebased to 0.
struct SparseFeatures(Vec<u32>, Vec<f64>);

impl SparseFeatures {
    fn row(&self) -> Row<'_> {
        Row::Sparse { indices: &self.0, values: &self.1 }
    }
}

fn wrong_dimension(model: &StoredModel, got: usize) -> ! {
    let got = if got == 0 { "an empty array".to_string() } else { got.to_string() };
    raise(
        PgSqlErrorCode::ERRCODE_ARRAY_ELEMENT_ERROR,
        format!("model {} expects {} features, got {}", model.id, model.n_features(), got),
        None,
    )
}

fn sparse_features(model: &StoredModel, indices: Array<'_, i32>, values: Array<'_, f64>) -> SparseFeatures {
    // SAFETY: as in dense_features; both arrays live for this call.
    let (indices, values) = unsafe {
        let i = with_int4_array(pg_sys::Datum::from(indices.into_array_type()), |i| i.to_vec());
        let v = with_float_array(pg_sys::Datum::from(values.into_array_type()), |v| match v {
            FloatSlice::F64(x) => x.to_vec(),
            FloatSlice::F32(x) => x.iter().map(|&v| v as f64).collect(),
        });
        fn empty_ok<T>(r: Result<Vec<T>, ArrayProblem>, what: &str) -> Vec<T> {
            match r {
                Ok(x) => x,
                Err(ArrayProblem::Empty) => Vec::new(),
                Err(p) => raise(PgSqlErrorCode::ERRCODE_DATA_EXCEPTION, format!("sparse {what}: {p}"), None),
            }
        }
        (empty_ok(i, "indices"), empty_ok(v, "values"))
    };
    if let Err(e) = validate_sparse(&indices, values.len(), model.index_base, Some(model.n_features())) {
        raise(PgSqlErrorCode::ERRCODE_DATA_EXCEPTION, e.to_string(), Some(format!("Model {} uses index base {}.", model.id, model.index_base)));
    }
    if !values.iter().all(|v| v.is_finite()) {
        raise(PgSqlErrorCode::ERRCODE_DATA_EXCEPTION, "features contain NaN or Infinity", None);
    }
    let indices = indices.iter().map(|&i| (i as i64 - model.index_base) as u32).collect();
    SparseFeatures(indices, values)
}

fn not_for(model: &StoredModel, what: &str, hint: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE,
        format!("model {} is a {} model: {what}", model.id, model.kind().name()),
        Some(hint.into()),
    )
}

/// Predicted label (classifiers, in the table's label values) or value (linear).
fn predict_number(model: &StoredModel, x: Row) -> f64 {
    if model.kind() == ModelKind::Linear {
        return model.model.decision(x);
    }
    match &model.classes[model.class_index(x)] {
        ClassValue::Number(v) => *v,
        ClassValue::Text(_) => not_for(model, "its labels are text", "Use corgipile_predict_class(), which returns the label as text."),
    }
}

fn predict_class(model: &StoredModel, x: Row) -> String {
    if model.kind() == ModelKind::Linear {
        not_for(model, "it predicts numbers, not classes", "Use corgipile_predict().");
    }
    model.classes[model.class_index(x)].to_text()
}

fn predict_proba(model: &StoredModel, x: Row) -> Vec<f64> {
    let mut out = Vec::new();
    if !model.model.predict_proba(x, &mut out) {
        not_for(model, "it has no probabilities", "Probabilities come from logistic and softmax models; use corgipile_decision_function() for a score.");
    }
    out
}

fn decision_function(model: &StoredModel, x: Row) -> f64 {
    if model.kind() == ModelKind::Softmax {
        not_for(model, "it has one score per class", "Use corgipile_predict_proba().");
    }
    model.model.decision(x)
}

/// A model cached in a call site's `fn_extra`.
struct CallCache {
    command_id: pg_sys::CommandId,
    model: Rc<StoredModel>,
}

/// The model for this call. Cached in the call site's `fn_extra` (which lives as long as the
/// statement's expression state), so `SELECT corgipile_predict(7, f) FROM big_table` looks it
/// up once; a new command id (e.g. after a DELETE in the same transaction) reloads it.
fn model_for_call(fcinfo: pg_sys::FunctionCallInfo, model_id: i64) -> Rc<StoredModel> {
    // SAFETY: fcinfo and its flinfo are valid for this call; fn_extra belongs to this function's
    // FmgrInfo and lives in fn_mcxt; we only ever store there a CallCache made by
    // leak_and_drop_on_delete in that context, so the cast is sound.
    unsafe {
        let command_id = pg_sys::GetCurrentCommandId(false);
        let flinfo = (*fcinfo).flinfo;
        let cached = (*flinfo).fn_extra.cast::<CallCache>();
        if let Some(c) = cached.as_ref() {
            if c.model.id == model_id && c.command_id == command_id {
                return c.model.clone();
            }
        }
        let model = load_model(model_id);
        match cached.as_mut() {
            Some(c) => *c = CallCache { command_id, model: model.clone() },
            None => {
                let entry = CallCache { command_id, model: model.clone() };
                (*flinfo).fn_extra = PgMemoryContexts::For((*flinfo).fn_mcxt).leak_and_drop_on_delete(entry).cast();
            }
        }
        model
    }
}

/// Apply `f` to a dense float8[] checked against the model, without copying it.
fn with_dense<R>(model: &StoredModel, features: Array<'_, f64>, f: impl FnOnce(Row) -> R) -> R {
    let ptr = features.into_array_type();
    let n = model.n_features();
    // SAFETY: pgrx hands us a detoasted, valid float8[] that lives for this call.
    let result = unsafe {
        with_float_array(pg_sys::Datum::from(ptr), |x| match x {
            FloatSlice::F64(x) => {
                if x.len() != n {
                    wrong_dimension(model, x.len());
                }
                if !x.iter().all(|v| v.is_finite()) {
                    raise(PgSqlErrorCode::ERRCODE_DATA_EXCEPTION, "features contain NaN or Infinity", None);
                }
                f(Row::Dense(x))
            }
            FloatSlice::F32(_) => unreachable!("the argument is float8[]"),
        })
    };
    result.unwrap_or_else(|problem| match problem {
        ArrayProblem::Empty => wrong_dimension(model, 0),
        other => raise(PgSqlErrorCode::ERRCODE_DATA_EXCEPTION, other.to_string(), None),
    })
}

/// The predicted label for one feature vector, in the label values of the training table
/// (0/1 for a boolean label); for linear regression the predicted value.
#[pg_extern(stable, parallel_safe)]
fn corgipile_predict(model_id: i64, features: Array<'_, f64>, fcinfo: pg_sys::FunctionCallInfo) -> f64 {
    let model = model_for_call(fcinfo, model_id);
    with_dense(&model, features, |row| predict_number(&model, row))
}

#[pg_extern(stable, parallel_safe, name = "corgipile_predict")]
fn corgipile_predict_sparse(model_id: i64, indices: Array<'_, i32>, values: Array<'_, f64>, fcinfo: pg_sys::FunctionCallInfo) -> f64 {
    let model = model_for_call(fcinfo, model_id);
    predict_number(&model, sparse_features(&model, indices, values).row())
}

/// The predicted class as text (works for numeric and text labels).
#[pg_extern(stable, parallel_safe)]
fn corgipile_predict_class(model_id: i64, features: Array<'_, f64>, fcinfo: pg_sys::FunctionCallInfo) -> String {
    let model = model_for_call(fcinfo, model_id);
    with_dense(&model, features, |row| predict_class(&model, row))
}

#[pg_extern(stable, parallel_safe, name = "corgipile_predict_class")]
fn corgipile_predict_class_sparse(model_id: i64, indices: Array<'_, i32>, values: Array<'_, f64>, fcinfo: pg_sys::FunctionCallInfo) -> String {
    let model = model_for_call(fcinfo, model_id);
    predict_class(&model, sparse_features(&model, indices, values).row())
}

/// Class probabilities in the order of label_mapping->'classes' (logistic: [P(negative),
/// P(positive)]; softmax: one per class).
#[pg_extern(stable, parallel_safe)]
fn corgipile_predict_proba(model_id: i64, features: Array<'_, f64>, fcinfo: pg_sys::FunctionCallInfo) -> Vec<f64> {
    let model = model_for_call(fcinfo, model_id);
    with_dense(&model, features, |row| predict_proba(&model, row))
}

#[pg_extern(stable, parallel_safe, name = "corgipile_predict_proba")]
fn corgipile_predict_proba_sparse(model_id: i64, indices: Array<'_, i32>, values: Array<'_, f64>, fcinfo: pg_sys::FunctionCallInfo) -> Vec<f64> {
    let model = model_for_call(fcinfo, model_id);
    predict_proba(&model, sparse_features(&model, indices, values).row())
}

/// The raw score w·x + b of an svm, logistic or linear model (positive = the positive class).
#[pg_extern(stable, parallel_safe)]
fn corgipile_decision_function(model_id: i64, features: Array<'_, f64>, fcinfo: pg_sys::FunctionCallInfo) -> f64 {
    let model = model_for_call(fcinfo, model_id);
    with_dense(&model, features, |row| decision_function(&model, row))
}

#[pg_extern(stable, parallel_safe, name = "corgipile_decision_function")]
fn corgipile_decision_function_sparse(model_id: i64, indices: Array<'_, i32>, values: Array<'_, f64>, fcinfo: pg_sys::FunctionCallInfo) -> f64 {
    let model = model_for_call(fcinfo, model_id);
    decision_function(&model, sparse_features(&model, indices, values).row())
}
