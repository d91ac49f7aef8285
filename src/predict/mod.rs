//! Prediction: every function takes a model (its id, or its name for the deployed version) and
//! a dense float8[] or a sparse (int4[] indices, float8[] values) pair in the model's index base.

use crate::catalog::{load_model, load_model_ref, ModelRef, StoredModel};
use crate::decode::datum::{
    with_float_array, with_int4_array, with_text_bytes, ArrayProblem, FloatSlice,
};
use crate::pg::error::raise;
use crate::pipeline::ClassValue;
use crate::request::args::{Float8ArrayArg, Int4ArrayArg, TextArg};
use corgipile_ml::arena::validate_sparse;

use corgipile_ml::model::Predictor as _;
use corgipile_ml::row::Row;
use pgrx::prelude::*;
use pgrx::{PgMemoryContexts, PgSqlErrorCode};
use std::rc::Rc;

mod columns;
mod explain;
mod row;
mod simplify;
use crate::request::args::RecordArg;
use row::{with_row, with_row_in};

/// A sparse feature vector from SQL, checked against the model and rebased to 0.
struct SparseFeatures(Vec<u32>, Vec<f64>);

impl SparseFeatures {
    fn row(&self) -> Row<'_> {
        Row::Sparse {
            indices: &self.0,
            values: &self.1,
        }
    }
}

fn wrong_dimension(model: &StoredModel, got: usize) -> ! {
    let got = if got == 0 {
        "an empty array".to_string()
    } else {
        got.to_string()
    };
    raise(
        PgSqlErrorCode::ERRCODE_ARRAY_ELEMENT_ERROR,
        format!(
            "model {} expects {} features, got {}",
            model.id,
            model.n_features(),
            got
        ),
        None,
    )
}

fn sparse_features(
    model: &StoredModel,
    indices: Int4ArrayArg,
    values: Float8ArrayArg,
) -> SparseFeatures {
    // SAFETY: as in with_dense: non-NULL int4[] and float8[] arguments of this call.
    // More entries than the model has features cannot be valid (indices are distinct): refused
    // before copying, so the copy is bounded by the model, not by the argument.
    let n = model.n_features();
    let (indices, values) = unsafe {
        let i = with_int4_array(indices.0, |i| (i.len() <= n).then(|| i.to_vec()));
        let v = with_float_array(values.0, |v| {
            (v.len() <= n).then(|| match v {
                FloatSlice::F64(x) => x.to_vec(),
                FloatSlice::F32(x) => x.iter().map(|&v| v as f64).collect(),
            })
        });
        fn empty_ok<T>(
            r: Result<Option<Vec<T>>, ArrayProblem>,
            what: &str,
            model: &StoredModel,
        ) -> Vec<T> {
            match r {
                Ok(Some(x)) => x,
                Ok(None) => raise(
                    PgSqlErrorCode::ERRCODE_ARRAY_ELEMENT_ERROR,
                    format!(
                        "sparse {what}: more entries than the {} features of model {}",
                        model.n_features(),
                        model.id
                    ),
                    None,
                ),
                Err(ArrayProblem::Empty) => Vec::new(),
                Err(p) => raise(
                    PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
                    format!("sparse {what}: {p}"),
                    None,
                ),
            }
        }
        (empty_ok(i, "indices", model), empty_ok(v, "values", model))
    };
    if let Err(e) = validate_sparse(
        &indices,
        values.len(),
        model.index_base,
        Some(model.n_features()),
    ) {
        raise(
            PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
            e.to_string(),
            Some(format!(
                "Model {} uses index base {}.",
                model.id, model.index_base
            )),
        );
    }
    if !values.iter().all(|v| v.is_finite()) {
        raise(
            PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
            "features contain NaN or Infinity",
            None,
        );
    }
    let indices = indices
        .iter()
        .map(|&i| (i as i64 - model.index_base) as u32)
        .collect();
    SparseFeatures(indices, values)
}

fn not_for(model: &StoredModel, what: &str, hint: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE,
        format!(
            "model {} is a {} model: {what}",
            model.id,
            model.kind().name()
        ),
        Some(hint.into()),
    )
}

/// Predicted label (classifiers, in the table's label values) or value (linear).
fn predict_number(model: &StoredModel, x: Row) -> f64 {
    if !model.kind().is_classifier() {
        return model.model.decision(x);
    }
    match &model.classes[model.class_index(x)] {
        ClassValue::Number(v) => *v,
        ClassValue::Text(_) => not_for(
            model,
            "its labels are text",
            "Use corgipile_predict_class(), which returns the label as text.",
        ),
    }
}

fn predict_class(model: &StoredModel, x: Row) -> String {
    if !model.kind().is_classifier() {
        not_for(
            model,
            "it predicts numbers, not classes",
            "Use corgipile_predict().",
        );
    }
    model.class_text(model.class_index(x))
}

fn predict_proba(model: &StoredModel, x: Row) -> Vec<f64> {
    let mut out = Vec::new();
    if !model.model.predict_proba(x, &mut out) {
        not_for(model, "it has no probabilities", "Probabilities come from logistic and softmax models; use corgipile_decision_function() for a score.");
    }
    out
}

fn decision_function(model: &StoredModel, x: Row) -> f64 {
    if !model.kind().has_decision_value() {
        not_for(
            model,
            "it has one score per class",
            "Use corgipile_predict_proba().",
        );
    }
    model.model.decision(x)
}

/// The model argument of a prediction call as given: an id, or the bytes of a text argument
/// (compared as bytes with the cached one, so a cached call neither validates nor parses it).
#[derive(Clone, Copy)]
pub(crate) enum ModelArg<'a> {
    Id(i64),
    Text(&'a [u8]),
}

#[derive(PartialEq)]
enum OwnedModelArg {
    Id(i64),
    Text(Vec<u8>),
}

impl OwnedModelArg {
    fn is(&self, arg: ModelArg) -> bool {
        match (self, arg) {
            (OwnedModelArg::Id(a), ModelArg::Id(b)) => *a == b,
            (OwnedModelArg::Text(a), ModelArg::Text(b)) => a.as_slice() == b,
            _ => false,
        }
    }
}

impl From<ModelArg<'_>> for OwnedModelArg {
    fn from(arg: ModelArg) -> Self {
        match arg {
            ModelArg::Id(id) => OwnedModelArg::Id(id),
            ModelArg::Text(bytes) => OwnedModelArg::Text(bytes.to_vec()),
        }
    }
}

fn load_model_arg(arg: ModelArg) -> Rc<StoredModel> {
    match arg {
        ModelArg::Id(id) => load_model(id),
        ModelArg::Text(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => load_model_ref(ModelRef::from_text(text)),
            Err(_) => raise(
                PgSqlErrorCode::ERRCODE_CHARACTER_NOT_IN_REPERTOIRE,
                "the model name is not valid UTF-8",
                Some("Model names are UTF-8 text; use the model's id instead (SELECT id, name FROM corgipile.model_summary).".into()),
            ),
        },
    }
}

unsafe extern "C-unwind" {
    #[link_name = "GetCurrentCommandId"]
    fn get_current_command_id_unguarded(used: bool) -> pg_sys::CommandId;
    #[link_name = "GetUserId"]
    fn get_user_id_unguarded() -> pg_sys::Oid;
}

/// The current command id, without pgrx's setjmp guard (a per-row cost in predictions).
fn current_command_id() -> pg_sys::CommandId {
    // SAFETY: GetCurrentCommandId(false) only reads a backend-local variable and cannot raise
    // an ERROR (only `used = true` can, in a parallel worker), so no longjmp can cross Rust
    // frames; predictions run on the backend thread.
    unsafe { get_current_command_id_unguarded(false) }
}

/// The current role, without pgrx's setjmp guard (a per-row cost in predictions).
fn current_role() -> pg_sys::Oid {
    // SAFETY: GetUserId only reads a backend-local variable (it asserts that it is set, and
    // raises nothing), so no longjmp can cross Rust frames; predictions run on the backend
    // thread.
    unsafe { get_user_id_unguarded() }
}

/// A model cached in a call site's `fn_extra`, with the row layout of by-row predictions.
struct CallCache {
    command_id: pg_sys::CommandId,
    /// The role the model was loaded for: a call site can outlive a role switch (a PL/pgSQL
    /// expression called from a SECURITY DEFINER function and then directly), and each role
    /// must get exactly the models it may see.
    role: pg_sys::Oid,
    arg: OwnedModelArg,
    model: Rc<StoredModel>,
    rows: row::RowCache,
}

/// The model for this call. Cached in the call site's `fn_extra` (which lives as long as the
/// statement's expression state), so `SELECT corgipile_predict(7, f) FROM big_table` looks it
/// up once; a new command id (e.g. after a DELETE or a deploy in the same transaction) reloads
/// it.
fn model_for_call(fcinfo: pg_sys::FunctionCallInfo, arg: ModelArg) -> Rc<StoredModel> {
    cached_call(fcinfo, arg).model.clone()
}

/// This call site's cache, with the model `arg` stands for now.
fn cached_call<'a>(fcinfo: pg_sys::FunctionCallInfo, arg: ModelArg) -> &'a mut CallCache {
    // SAFETY: fcinfo and its flinfo are valid for this call; fn_extra belongs to this function's
    // FmgrInfo and lives in fn_mcxt (longer than the call); we only ever store there a
    // CallCache made by leak_and_drop_on_delete in that context, so the cast is sound, and
    // the caller's borrow ends with the call.
    unsafe {
        let command_id = current_command_id();
        let role = current_role();
        let flinfo = (*fcinfo).flinfo;
        let cached = (*flinfo).fn_extra.cast::<CallCache>();
        if let Some(c) = cached.as_mut() {
            if c.arg.is(arg) && c.command_id == command_id && c.role == role {
                return c;
            }
        }
        let model = load_model_arg(arg);
        let entry = CallCache {
            command_id,
            role,
            arg: arg.into(),
            model,
            rows: row::RowCache::new(),
        };
        match cached.as_mut() {
            Some(c) => {
                *c = entry;
                c
            }
            None => {
                let c = PgMemoryContexts::For((*flinfo).fn_mcxt).leak_and_drop_on_delete(entry);
                (*flinfo).fn_extra = c.cast();
                &mut *c
            }
        }
    }
}

/// Apply `f` to a dense float8[] checked against the model, without copying it.
fn with_dense<R>(model: &StoredModel, features: Float8ArrayArg, f: impl FnOnce(Row) -> R) -> R {
    let n = model.n_features();
    // SAFETY: a non-NULL float8[] argument of this call (the functions are strict), valid for
    // the call; with_float_array detoasts it if needed.
    let result = unsafe {
        with_float_array(features.0, |x| match x {
            FloatSlice::F64(x) => {
                if x.len() != n {
                    wrong_dimension(model, x.len());
                }
                if !x.iter().all(|v| v.is_finite()) {
                    raise(
                        PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
                        "features contain NaN or Infinity",
                        None,
                    );
                }
                f(Row::Dense(x))
            }
            FloatSlice::F32(_) => unreachable!("the argument is float8[]"),
        })
    };
    result.unwrap_or_else(|problem| match problem {
        ArrayProblem::Empty => wrong_dimension(model, 0),
        other => raise(
            PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
            other.to_string(),
            None,
        ),
    })
}

type Predictor<R> = fn(&StoredModel, Row) -> R;

/// A model trained on named columns encodes rows itself: an array would skip its
/// preprocessing (categories, imputation), so it is refused, except for numbers only, one
/// feature per column, where the array holds the columns' values in training order (the
/// model's weights are in the table's units).
fn not_for_arrays(model: &StoredModel) {
    if model
        .preprocessing
        .as_ref()
        .is_some_and(|p| !p.is_numbers_only())
    {
        raise(
            PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE,
            format!("model {} was trained on named columns: predict from a row", model.id),
            Some(format!("Pass a row with the model's columns, e.g. SELECT corgipile_predict({}, t) FROM my_table t.", model.id)),
        );
    }
}

fn dense<R>(
    fcinfo: pg_sys::FunctionCallInfo,
    arg: ModelArg,
    features: Float8ArrayArg,
    f: Predictor<R>,
) -> R {
    let model = model_for_call(fcinfo, arg);
    not_for_arrays(&model);
    with_dense(&model, features, |row| f(&model, row))
}

fn sparse<R>(
    fcinfo: pg_sys::FunctionCallInfo,
    arg: ModelArg,
    indices: Int4ArrayArg,
    values: Float8ArrayArg,
    f: Predictor<R>,
) -> R {
    let model = model_for_call(fcinfo, arg);
    not_for_arrays(&model);
    f(&model, sparse_features(&model, indices, values).row())
}

/// Run `f` with the model argument of a by-name overload.
fn by_name<R>(model_name: TextArg, f: impl FnOnce(ModelArg) -> R) -> R {
    // SAFETY: a non-NULL text argument of this call (the functions are strict).
    unsafe { with_text_bytes(model_name.0, |bytes| f(ModelArg::Text(bytes))) }
}

/// Every SQL overload of one prediction function, one Rust function each (pgrx's way; the Rust
/// names are the C symbols the install and upgrade scripts name, so they never change): the
/// model by id or by name, its features dense, sparse (indices, values) or a whole row of a
/// table with the model's columns (NULL when the row has a NULL in a column the model skips
/// rows for, `"impute": "skip"`).
macro_rules! prediction_overloads {
    ($sql:tt, $predict:ident -> $out:ty,
     $dense:ident, $sparse:ident, $dense_by_name:ident, $sparse_by_name:ident,
     $row:ident, $row_by_name:ident) => {
        #[pg_extern(stable, parallel_safe, name = $sql)]
        fn $dense(
            model_id: i64,
            features: Float8ArrayArg,
            fcinfo: pg_sys::FunctionCallInfo,
        ) -> $out {
            dense(fcinfo, ModelArg::Id(model_id), features, $predict)
        }

        #[pg_extern(stable, parallel_safe, name = $sql)]
        fn $sparse(
            model_id: i64,
            indices: Int4ArrayArg,
            values: Float8ArrayArg,
            fcinfo: pg_sys::FunctionCallInfo,
        ) -> $out {
            sparse(fcinfo, ModelArg::Id(model_id), indices, values, $predict)
        }

        #[pg_extern(stable, parallel_safe, name = $sql)]
        fn $dense_by_name(
            model_name: TextArg,
            features: Float8ArrayArg,
            fcinfo: pg_sys::FunctionCallInfo,
        ) -> $out {
            by_name(model_name, |arg| dense(fcinfo, arg, features, $predict))
        }

        #[pg_extern(stable, parallel_safe, name = $sql)]
        fn $sparse_by_name(
            model_name: TextArg,
            indices: Int4ArrayArg,
            values: Float8ArrayArg,
            fcinfo: pg_sys::FunctionCallInfo,
        ) -> $out {
            by_name(model_name, |arg| {
                sparse(fcinfo, arg, indices, values, $predict)
            })
        }

        // The planner rewrites a call on a table's own row into one on its columns (simplify).
        #[pg_extern(stable, parallel_safe, name = $sql, support = corgipile_predict_support)]
        fn $row(model_id: i64, row: RecordArg, fcinfo: pg_sys::FunctionCallInfo) -> Option<$out> {
            with_row(fcinfo, ModelArg::Id(model_id), row, $predict)
        }

        #[pg_extern(stable, parallel_safe, name = $sql, support = corgipile_predict_support)]
        fn $row_by_name(
            model_name: TextArg,
            row: RecordArg,
            fcinfo: pg_sys::FunctionCallInfo,
        ) -> Option<$out> {
            by_name(model_name, |arg| with_row(fcinfo, arg, row, $predict))
        }
    };
}

// The predicted label, in the label values of the training table (0/1 for a boolean label);
// for linear regression the predicted value.
prediction_overloads!("corgipile_predict", predict_number -> f64,
    corgipile_predict, corgipile_predict_sparse, corgipile_predict_by_name,
    corgipile_predict_sparse_by_name, corgipile_predict_row, corgipile_predict_row_by_name);

// The predicted class as text (numeric and text labels).
prediction_overloads!("corgipile_predict_class", predict_class -> String,
    corgipile_predict_class, corgipile_predict_class_sparse, corgipile_predict_class_by_name,
    corgipile_predict_class_sparse_by_name, corgipile_predict_class_row,
    corgipile_predict_class_row_by_name);

// Class probabilities in the order of label_mapping->'classes' (logistic: [P(negative),
// P(positive)]; softmax: one per class).
prediction_overloads!("corgipile_predict_proba", predict_proba -> Vec<f64>,
    corgipile_predict_proba, corgipile_predict_proba_sparse, corgipile_predict_proba_by_name,
    corgipile_predict_proba_sparse_by_name, corgipile_predict_proba_row,
    corgipile_predict_proba_row_by_name);

// The raw score w·x + b of an svm, logistic or linear model (positive = the positive class).
prediction_overloads!("corgipile_decision_function", decision_function -> f64,
    corgipile_decision_function, corgipile_decision_function_sparse,
    corgipile_decision_function_by_name, corgipile_decision_function_sparse_by_name,
    corgipile_decision_function_row, corgipile_decision_function_row_by_name);

/// Which model predicts a row of a model trained with `"group_by"`, and its prediction: the
/// row's group's key, the id of the model used (the group's, or the model of every row for a
/// group without one), whether it is the group's own, and the prediction (a class or a value,
/// as text). For any other model: its id, no group.
#[pg_extern(stable, parallel_safe)]
fn corgipile_predict_group(
    model_name: TextArg,
    row: RecordArg,
) -> TableIterator<
    'static,
    (
        name!(prediction, Option<String>),
        name!(model_id, i64),
        name!(group_key, Option<String>),
        name!(own_model, bool),
    ),
> {
    // A set-returning function: fn_extra holds the set's state, not a cached model; the model
    // (cached per transaction by id) and the row's layout are looked up each call.
    let (head, routed) = by_name(model_name, |arg| {
        let model = load_model_arg(arg);
        let head = model.id;
        let mut layout = row::RowCache::new();
        // SAFETY: the current memory context lives at least as long as this call.
        let mcxt = unsafe { pg_sys::CurrentMemoryContext };
        let routed = with_row_in(model, &mut layout, mcxt, row, |model, x, key| {
            let prediction = if model.kind().is_classifier() {
                model.class_text(model.class_index(x))
            } else {
                model.model.decision(x).to_string()
            };
            (prediction, model.id, key.map(str::to_owned))
        });
        (head, routed)
    });
    let row = match routed {
        Some((prediction, id, key)) => (Some(prediction), id, key, id != head),
        // A NULL the model skips rows for: no prediction; the group is not read either.
        None => (None, head, None, false),
    };
    TableIterator::once(row)
}
