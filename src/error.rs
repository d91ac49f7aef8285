//! One place to raise ERRORs with an SQLSTATE and an optional hint.

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

/// `text` as an SQL string literal, as PostgreSQL's quote_literal writes it: quotes doubled,
/// and E'...' with backslashes doubled when there is a backslash (so the literal means the same
/// whatever standard_conforming_strings is). For hints and messages that show SQL to run.
pub fn quote_literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 3);
    if text.contains('\\') {
        out.push('E');
    }
    out.push('\'');
    for c in text.chars() {
        if c == '\'' || c == '\\' {
            out.push(c);
        }
        out.push(c);
    }
    out.push('\'');
    out
}
