//! `corgipile_explain_predict(model, row | features, for_class, top)`: one row per input column
//! (or per feature of a model trained on arrays) with its share of the explained output, sorted
//! by magnitude, and a last `(baseline)` row with the output at the baseline row; the shares
//! and the baseline add up to the output at the row. The model is resolved, and the row read
//! and encoded, exactly as `corgipile_predict` does (same privilege check, same NULL imputation
//! and categories); the math is `corgipile_ml::explain`.
//!
//! A set-returning function: `fn_extra` holds the set's state, so the model (cached per
//! statement by id) and the row's layout are looked up each call, as corgipile_predict_group's.

use super::row::{with_row_in, RowCache};
use super::{by_name, load_model_arg, not_for_arrays, with_dense, ModelArg};
use crate::catalog::{select_one, StoredModel};
use crate::pg::error::raise;
use crate::request::args::{Float8ArrayArg, RecordArg, TextArg};
use corgipile_ml::explain::{
    attribute, baseline, by_column, by_feature, densify, rank, Contribution, ExplainError,
};
use corgipile_ml::model::{Labels, Predictor as _};
use corgipile_ml::row::Row;
use corgipile_ml::standardize::Standardizer;
use pgrx::prelude::*;
use pgrx::{JsonB, PgSqlErrorCode};

/// One output row: the column (or feature), the value the model read, its share, the class
/// explained.
type ExplainRow = (String, Option<String>, f64, Option<String>);

/// The name of the last row, whose contribution is the output at the baseline.
const BASELINE: &str = "(baseline)";

/// Classes named in an ERROR's hint, at most.
const HINT_CLASSES: usize = 20;

/// What a call explains: an output of the model, negated for the negative class of a
/// two-class model (its score is minus the decision value), and the class's name.
struct Target {
    output: usize,
    negate: bool,
    class: Option<String>,
}

fn no_such_class(model: &StoredModel, class: &str) -> ! {
    let n = model.classes.len().min(model.model.n_outputs().max(2));
    let names: Vec<String> = (0..n.min(HINT_CLASSES))
        .map(|k| model.class_text(k))
        .collect();
    let more = if n > HINT_CLASSES { ", ..." } else { "" };
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("model {} has no class \"{class}\"", model.id),
        Some(format!(
            "Its classes are {}{more} (as corgipile_predict_class shows them).",
            names.join(", ")
        )),
    )
}

/// The output `for_class` names (checked before any row is read), or for None: the decision
/// value (two classes: the positive class's score), the predicted class (one output per class,
/// which needs the row `x`), the prediction (regression).
fn target(model: &StoredModel, for_class: Option<&str>, x: Option<Row>) -> Target {
    let text = |k: usize| (k < model.classes.len()).then(|| model.class_text(k));
    match model.kind().labels() {
        Labels::Number => {
            if for_class.is_some() {
                raise(
                    PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                    format!(
                        "model {} is a {} model: it predicts a number, not a class",
                        model.id,
                        model.kind().name()
                    ),
                    Some("Leave for_class out: the prediction itself is explained.".into()),
                )
            }
            Target {
                output: 0,
                negate: false,
                class: None,
            }
        }
        Labels::TwoClasses => match for_class {
            None => Target {
                output: 0,
                negate: false,
                class: text(1),
            },
            Some(c) if text(1).as_deref() == Some(c) => Target {
                output: 0,
                negate: false,
                class: text(1),
            },
            Some(c) if text(0).as_deref() == Some(c) => Target {
                output: 0,
                negate: true,
                class: text(0),
            },
            Some(c) => no_such_class(model, c),
        },
        Labels::Classes => {
            let n = model.classes.len().min(model.model.n_outputs());
            let output = match for_class {
                Some(c) => (0..n)
                    .find(|&k| model.class_text(k) == c)
                    .unwrap_or_else(|| no_such_class(model, c)),
                None => x.map_or(0, |x| model.class_index(x)),
            };
            Target {
                output,
                negate: false,
                class: text(output),
            }
        }
    }
}

fn check_top(top: Option<i32>) -> Option<usize> {
    match top {
        Some(t) if t < 1 => raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("top must be at least 1, got {t}"),
            Some("Leave top out (NULL) for every column.".into()),
        ),
        t => t.map(|t| t as usize),
    }
}

fn out_of_memory(model: &StoredModel, _: ExplainError) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
        format!(
            "out of memory explaining a prediction of model {}",
            model.id
        ),
        None,
    )
}

/// The baseline row of a model: its column list's (means and most frequent categories), or
/// for a model trained on arrays the training means of its features when it stored them (a
/// dense array trained with `normalize`), else zeros.
fn baseline_of(model: &StoredModel) -> Vec<f64> {
    if let Some(p) = &model.preprocessing {
        return baseline(p).unwrap_or_else(|e| out_of_memory(model, e));
    }
    let n = model.n_features();
    let mut x0 = densify(Row::Dense(&[]), n).unwrap_or_else(|e| out_of_memory(model, e));
    let stored = select_one::<JsonB>(
        "SELECT standardizer FROM corgipile.models WHERE id OPERATOR(pg_catalog.=) $1",
        &[model.id.into()],
    )
    .ok()
    .flatten();
    let s = stored.and_then(|j| serde_json::from_value::<Standardizer>(j.0).ok());
    if let Some(s) = s.filter(|s| s.center) {
        x0.iter_mut().zip(&s.mean).for_each(|(x, m)| *x = *m);
    }
    x0
}

/// A feature's name for a model trained on arrays, as corgipile_model_coefficients names it:
/// `col[j]` (1-based) for an array column, the index in the model's index base otherwise.
fn feature_name(model: &StoredModel, j: usize) -> String {
    match &model.features {
        serde_json::Value::String(col) => format!("{col}[{}]", j + 1),
        serde_json::Value::Array(cols) => cols
            .get(j)
            .and_then(|c| c.as_str())
            .map_or_else(|| (j + 1).to_string(), str::to_owned),
        _ => (j as i64 + model.index_base).to_string(),
    }
}

/// The explanation of `model`'s output for the encoded row `x` (`head`: the model called,
/// whose preprocessing encoded it; `model` may be its group's model).
fn explain(
    head: &StoredModel,
    model: &StoredModel,
    x: Row,
    x0: &[f64],
    for_class: Option<&str>,
    top: Option<usize>,
) -> Vec<ExplainRow> {
    let t = target(model, for_class, Some(x));
    let xd = densify(x, model.n_features()).unwrap_or_else(|e| out_of_memory(model, e));
    let a = attribute(&model.model, &xd, x0, t.output).unwrap_or_else(|e| out_of_memory(model, e));
    let mut entries = match &head.preprocessing {
        Some(p) => by_column(p, &xd, &a.per_feature),
        None => by_feature(&xd, &a.per_feature, |j| feature_name(head, j)),
    }
    .unwrap_or_else(|e| out_of_memory(model, e));
    let sign = if t.negate { -1.0 } else { 1.0 };
    entries.iter_mut().for_each(|e| e.contribution *= sign);
    rank(&mut entries, top);
    let mut rows = Vec::new();
    if rows.try_reserve_exact(entries.len() + 1).is_err() {
        out_of_memory(model, ExplainError::OutOfMemory);
    }
    rows.extend(entries.into_iter().map(
        |Contribution {
             name,
             value,
             contribution,
         }| (name, Some(value), contribution, t.class.clone()),
    ));
    rows.push((BASELINE.to_owned(), None, sign * a.baseline, t.class));
    rows
}

/// The row form: the row read and encoded as corgipile_predict's (its group's model for
/// per-group models); no rows when a NULL makes the model skip the row.
fn explain_row(
    arg: ModelArg,
    row: RecordArg,
    for_class: Option<&str>,
    top: Option<i32>,
) -> Vec<ExplainRow> {
    let top = check_top(top);
    let model = load_model_arg(arg);
    target(&model, for_class, None);
    let x0 = baseline_of(&model);
    let mut layout = RowCache::new();
    // SAFETY: the current memory context lives at least as long as this call (the layout's
    // descriptor copy is made in it and not used after the call).
    let mcxt = unsafe { pg_sys::CurrentMemoryContext };
    let head = model.clone();
    with_row_in(model, &mut layout, mcxt, row, |m, x, _| {
        explain(&head, m, x, &x0, for_class, top)
    })
    .unwrap_or_default()
}

/// The array form: a dense float8[] checked as corgipile_predict checks it.
fn explain_array(
    arg: ModelArg,
    features: Float8ArrayArg,
    for_class: Option<&str>,
    top: Option<i32>,
) -> Vec<ExplainRow> {
    let top = check_top(top);
    let model = load_model_arg(arg);
    not_for_arrays(&model);
    target(&model, for_class, None);
    let x0 = baseline_of(&model);
    with_dense(&model, features, |x| {
        explain(&model, &model, x, &x0, for_class, top)
    })
}

// Not strict (for_class and top may be NULL): a NULL model or row gives no rows.

#[pg_extern(stable, parallel_safe, name = "corgipile_explain_predict")]
fn corgipile_explain_predict_row(
    model_id: Option<i64>,
    row: Option<RecordArg>,
    for_class: default!(Option<&str>, "NULL"),
    top: default!(Option<i32>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(column_name, String),
        name!(value, Option<String>),
        name!(contribution, f64),
        name!(class, Option<String>),
    ),
> {
    let rows = match (model_id, row) {
        (Some(id), Some(row)) => explain_row(ModelArg::Id(id), row, for_class, top),
        _ => Vec::new(),
    };
    TableIterator::new(rows)
}

#[pg_extern(stable, parallel_safe, name = "corgipile_explain_predict")]
fn corgipile_explain_predict_row_by_name(
    model_name: Option<TextArg>,
    row: Option<RecordArg>,
    for_class: default!(Option<&str>, "NULL"),
    top: default!(Option<i32>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(column_name, String),
        name!(value, Option<String>),
        name!(contribution, f64),
        name!(class, Option<String>),
    ),
> {
    let rows = match (model_name, row) {
        (Some(name), Some(row)) => by_name(name, |arg| explain_row(arg, row, for_class, top)),
        _ => Vec::new(),
    };
    TableIterator::new(rows)
}

#[pg_extern(stable, parallel_safe, name = "corgipile_explain_predict")]
fn corgipile_explain_predict_array(
    model_id: Option<i64>,
    features: Option<Float8ArrayArg>,
    for_class: default!(Option<&str>, "NULL"),
    top: default!(Option<i32>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(column_name, String),
        name!(value, Option<String>),
        name!(contribution, f64),
        name!(class, Option<String>),
    ),
> {
    let rows = match (model_id, features) {
        (Some(id), Some(f)) => explain_array(ModelArg::Id(id), f, for_class, top),
        _ => Vec::new(),
    };
    TableIterator::new(rows)
}

#[pg_extern(stable, parallel_safe, name = "corgipile_explain_predict")]
fn corgipile_explain_predict_array_by_name(
    model_name: Option<TextArg>,
    features: Option<Float8ArrayArg>,
    for_class: default!(Option<&str>, "NULL"),
    top: default!(Option<i32>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(column_name, String),
        name!(value, Option<String>),
        name!(contribution, f64),
        name!(class, Option<String>),
    ),
> {
    let rows = match (model_name, features) {
        (Some(name), Some(f)) => by_name(name, |arg| explain_array(arg, f, for_class, top)),
        _ => Vec::new(),
    };
    TableIterator::new(rows)
}
