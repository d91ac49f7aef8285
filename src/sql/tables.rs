//! corgipile_confusion_matrix, corgipile_roc_curve, corgipile_calibration: the tables of a
//! stored classifier scored on a relation, each in one scan read like corgipile_evaluate's (on
//! a sharded table, every shard fills its part and the parts are merged here). The tables are
//! `corgipile_ml::scoring::EvaluationTables`.

use crate::catalog::{load_model_ref, ModelRef, StoredModel};
use crate::exec::sgd::EvaluateTables;
use crate::pg::error::raise;
use crate::pipeline::Mode;
use crate::request::args::{ParamsArg, RelationArg};
use crate::request::prepare;
use crate::shard::evaluate_sharded;
use crate::sql::evaluate::evaluation_params;
use crate::sql::importance::refuse_group_family;
use corgipile_ml::scoring::{EvaluationTables, TableSpec, MAX_CALIBRATION_BINS};
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;
use std::rc::Rc;

/// Calibration bins unless the params say otherwise.
const DEFAULT_CALIBRATION_BINS: u32 = 10;

type ConfusionRow = (String, String, i64);

by_id_and_name! {
    /// Rows of every actual class by every predicted class (zeros too), as the model predicts a
    /// class (two classes: positive when the decision value is ≥ 0).
    #[pg_extern(volatile, parallel_unsafe, name = "corgipile_confusion_matrix")]
    fn corgipile_confusion_matrix / corgipile_confusion_matrix_by_name(
        relation: {RelationArg},
        params: {default!(ParamsArg, "'{}'")}
    ) -> {
        TableIterator<'static, (name!(actual, String), name!(predicted, String), name!(rows, i64))>
    }
    |key| TableIterator::new(confusion(key, relation, params))
}

fn confusion(key: ModelRef, relation: RelationArg, params: ParamsArg) -> Vec<ConfusionRow> {
    let (stored, tables) = fill(key, relation, params, "corgipile_confusion_matrix");
    tables
        .confusion_matrix()
        .into_iter()
        .map(|(a, p, n)| (class_name(&stored, a), class_name(&stored, p), n as i64))
        .collect()
}

type RocRow = (
    String,
    f64,
    i64,
    i64,
    Option<f64>,
    Option<f64>,
    Option<f64>,
    Option<f64>,
    Option<f64>,
);

by_id_and_name! {
    /// The ROC curve (and precision-recall) of a classifier: a row per threshold, highest
    /// first, with the rows predicted positive at it (score ≥ threshold). Two classes: one
    /// curve, of the positive class, its threshold the decision value (svm) or the probability
    /// (logistic); more classes: one curve per class, one-vs-rest, on the probability of that
    /// class.
    #[pg_extern(volatile, parallel_unsafe, name = "corgipile_roc_curve")]
    fn corgipile_roc_curve / corgipile_roc_curve_by_name(
        relation: {RelationArg},
        params: {default!(ParamsArg, "'{}'")}
    ) -> {
        TableIterator<
            'static,
            (
                name!(class, String),
                name!(threshold, f64),
                name!(tp, i64),
                name!(fp, i64),
                name!(tpr, Option<f64>),
                name!(fpr, Option<f64>),
                name!(precision, Option<f64>),
                name!(recall, Option<f64>),
                name!(f1, Option<f64>),
            ),
        >
    }
    |key| TableIterator::new(roc(key, relation, params))
}

fn roc(key: ModelRef, relation: RelationArg, params: ParamsArg) -> Vec<RocRow> {
    let (stored, tables) = fill(key, relation, params, "corgipile_roc_curve");
    tables
        .roc_curve()
        .into_iter()
        .map(|p| {
            (
                class_name(&stored, p.class),
                p.threshold,
                p.tp as i64,
                p.fp as i64,
                p.tpr,
                p.fpr,
                p.precision,
                p.tpr,
                p.f1,
            )
        })
        .collect()
}

type CalibrationRow = (String, i32, f64, f64, i64, Option<f64>, Option<f64>);

by_id_and_name! {
    /// How well a classifier's probabilities match what happens: its predicted probabilities
    /// in equal bins (`"bins"`, default 10), each bin's rows, mean probability and observed rate
    /// of the class. Two classes: the positive class's; more: each class's, one-vs-rest.
    #[pg_extern(volatile, parallel_unsafe, name = "corgipile_calibration")]
    fn corgipile_calibration / corgipile_calibration_by_name(
        relation: {RelationArg},
        params: {default!(ParamsArg, "'{}'")}
    ) -> {
        TableIterator<
            'static,
            (
                name!(class, String),
                name!(bin, i32),
                name!(lower, f64),
                name!(upper, f64),
                name!(rows, i64),
                name!(mean_predicted, Option<f64>),
                name!(observed, Option<f64>),
            ),
        >
    }
    |key| TableIterator::new(calibration(key, relation, params))
}

fn calibration(key: ModelRef, relation: RelationArg, params: ParamsArg) -> Vec<CalibrationRow> {
    let (stored, tables) = fill(key, relation, params, "corgipile_calibration");
    tables
        .calibration()
        .into_iter()
        .map(|r| {
            (
                class_name(&stored, r.class),
                r.bin as i32,
                r.lower,
                r.upper,
                r.rows as i64,
                r.mean_predicted,
                r.observed,
            )
        })
        .collect()
}

/// The model and its tables filled over `relation`; every check on the model and the params
/// comes before the scan.
fn fill(
    key: ModelRef,
    relation: RelationArg,
    params: ParamsArg,
    function: &str,
) -> (Rc<StoredModel>, EvaluationTables) {
    let stored = load_model_ref(key);
    let kind = stored.kind();
    if !kind.is_classifier() {
        raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!(
                "model {} is a {}: {function} needs a classifier",
                stored.id,
                kind.name()
            ),
            Some("corgipile_evaluate reports a regression's MSE, RMSE, MAE and R².".into()),
        );
    }
    let calibrating = function == "corgipile_calibration";
    if calibrating && !kind.has_proba() {
        raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("model {} is an {}, which gives no probabilities: {function} needs them", stored.id, kind.name()),
            Some("Train a logistic, softmax or mlp model for probabilities; corgipile_roc_curve takes an svm's decision values.".into()),
        );
    }
    refuse_group_family(&stored, function);
    let spec = TableSpec {
        calibration_bins: if calibrating {
            calibration_bins(&params)
        } else {
            DEFAULT_CALIBRATION_BINS
        },
    };
    let extra: &[&str] = if calibrating { &["bins"] } else { &[] };
    let (params, _) = evaluation_params(&stored, params, function, extra);
    let (evaluation, _) = {
        let prepared = prepare(
            relation.oid(),
            kind,
            params,
            Mode::Evaluate,
            stored.classes.clone(),
            stored.preprocessing.as_ref(),
        );
        match crate::shard::sharded_leaves(prepared.relid) {
            Some(leaves) => evaluate_sharded(&prepared, leaves, &stored, Some(spec)),
            None => prepared.run(EvaluateTables {
                model: stored.clone(),
                spec,
            }),
        }
    };
    let tables = evaluation.into_tables().expect("tables were asked for");
    (stored, tables)
}

/// The `"bins"` param of corgipile_calibration: 1..=1000, 10 when absent.
fn calibration_bins(params: &ParamsArg) -> u32 {
    let Some(value) = params.0.get("bins") else {
        return DEFAULT_CALIBRATION_BINS;
    };
    match value.as_u64() {
        Some(n) if (1..=u64::from(MAX_CALIBRATION_BINS)).contains(&n) => n as u32,
        _ => raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("\"bins\" must be an integer from 1 to {MAX_CALIBRATION_BINS}, got {value}"),
            Some(format!(
                "The default is {DEFAULT_CALIBRATION_BINS} equal bins of probability."
            )),
        ),
    }
}

/// The label value of class `index` as text (two classes: 0 = negative, 1 = positive).
fn class_name(stored: &StoredModel, index: usize) -> String {
    // As corgipile_predict_class names it (a boolean label's classes are false / true).
    if index < stored.classes.len() {
        stored.class_text(index)
    } else {
        index.to_string()
    }
}
