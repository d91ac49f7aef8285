//! One place to raise ERRORs with an SQLSTATE and an optional hint.

use corgipile_ml::capabilities::{refusal, Use};
use corgipile_ml::params::ParamError;
use corgipile_ml::trainer::{LabelsError, TrainError};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};

/// Raise a PostgreSQL ERROR (never returns).
pub fn raise(code: PgSqlErrorCode, message: impl Into<String>, hint: Option<String>) -> ! {
    let mut report = ErrorReport::new(code, message.into(), "corgipile");
    if let Some(hint) = hint {
        report = report.set_hint(hint);
    }
    report.report(PgLogLevel::ERROR);
    unreachable!("ereport(ERROR) returned")
}

pub fn notice(message: impl Into<String>) {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_SUCCESSFUL_COMPLETION,
        message.into(),
        "corgipile",
    )
    .report(PgLogLevel::NOTICE);
}

/// The value of a SQL argument that must not be NULL: ERROR 22004 (null_value_not_allowed)
/// naming the argument, instead of pgrx's internal error. `usage` is the function's
/// signature, as "corgipile_deploy(model_name text, model_id bigint DEFAULT NULL)".
pub fn required<T>(value: Option<T>, argument: &str, usage: &str) -> T {
    value.unwrap_or_else(|| {
        let function = usage.split('(').next().unwrap_or(usage);
        raise(
            PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
            format!("argument \"{argument}\" of {function} must not be NULL"),
            Some(format!("Call it as {usage}.")),
        )
    })
}

/// Raise the ERROR for a training failure; `label` renders a trainer label (a value or a
/// class index) as the table shows it; `normalized`: the features were standardized.
pub fn raise_train_error(e: TrainError, label: &dyn Fn(f64) -> String, normalized: bool) -> ! {
    match e {
        TrainError::TooManyLabels { values } => raise(
            PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
            format!(
                "the label column has more than two distinct values (saw {}, {} and {})",
                label(values[0]), label(values[1]), label(values[2])
            ),
            Some("svm and logistic are binary classifiers: the label must have exactly two distinct values (softmax handles more).".into()),
        ),
        TrainError::InvalidLabel { value, .. } => raise(
            PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
            format!("invalid label {}", label(value)),
            Some(e.hint().into()),
        ),
        TrainError::Diverged { epoch } => raise(
            PgSqlErrorCode::ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
            format!("training diverged in epoch {epoch}: the loss or the weights became NaN or infinite"),
            Some(if normalized {
                "Use a smaller learning_rate (the features are already normalized), or a larger l2.".into()
            } else {
                "Use a smaller learning_rate, or \"normalize\": true to scale the features.".into()
            }),
        ),
        TrainError::OutOfMemory { bytes } => raise(
            PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
            format!("out of memory: the model could not grow by {bytes} bytes"),
            Some("Train a smaller model (fewer features or classes). The server could not allocate it although corgipile.max_model_memory allowed it: that setting may be too high for this server's memory.".into()),
        ),
        TrainError::Interrupted => raise(PgSqlErrorCode::ERRCODE_QUERY_CANCELED, "corgipile training was stopped", None),
        TrainError::UnknownClass { class, classes } => raise(
            PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
            format!("a row's label {} is not one of the {classes} classes the statistics pass counted", label(class)),
            Some("The table changed while it was trained (a sharded training reads it anew every round): train again.".into()),
        ),
    }
}

/// Raise the ERROR for labels a statistics pass could not settle, of `relation`'s rows
/// `counted` (e.g. "" or " on its shards").
pub fn raise_labels_error(e: LabelsError, relation: &str, counted: &str) -> ! {
    match e {
        LabelsError::NotTwoClasses { found } => raise(
            PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
            format!("the label column of {relation} has {found} distinct values{counted}; binary classifiers need exactly two"),
            None,
        ),
        LabelsError::ClassWeight(e) => {
            raise(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, e.message, e.hint)
        }
    }
}

/// The capability table's ERROR (0A000, with what to do instead) when it refuses `subject` with
/// any of `uses` (see `corgipile_ml::capabilities`).
pub fn refuse_combination(subject: Use, uses: &[Use]) {
    if let Some(r) = refusal(subject, uses) {
        raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            r.message,
            Some(r.hint.into()),
        );
    }
}

/// The capability table's ERROR for `subject` with `what`, a combination it refuses.
pub fn raise_combination(subject: Use, what: Use) -> ! {
    refuse_combination(subject, &[what]);
    raise(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        format!("corgipile: the capability table does not refuse {what:?} with {subject:?}"),
        Some("This is a bug, please report it.".into()),
    )
}

/// The capability table's ERROR for `subject` with `what`, with a detail saying what in the
/// call makes it that combination.
pub fn raise_combination_because(subject: Use, what: Use, detail: String) -> ! {
    match refusal(subject, &[what]) {
        Some(r) => {
            ErrorReport::new(
                PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                r.message.to_owned(),
                "corgipile",
            )
            .set_detail(detail)
            .set_hint(r.hint)
            .report(PgLogLevel::ERROR);
            unreachable!("ereport(ERROR) returned")
        }
        None => raise_combination(subject, what),
    }
}

/// A refused param's ERROR: 0A000 for a combination not built yet, 22023 for a bad value.
pub fn raise_param_error(e: ParamError) -> ! {
    let code = if e.not_supported() {
        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED
    } else {
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE
    };
    raise(code, e.message, e.hint)
}
