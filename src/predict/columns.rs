//! The calls the planner rewrites a prediction from a whole row into (see `simplify`):
//! `corgipile_predict(model, t)` over a table becomes
//! `corgipile_predict_columns(model, '{a,b,...}', t.a, t.b, ...)`, which reads only the columns
//! the model uses, so PostgreSQL neither forms the row value nor deforms it again. The model
//! argument is the original one, resolved at execution as the row form resolves it (the same
//! privilege checks and errors, per role and statement); the columns are matched to that model
//! by name and encoded by the same code as a row's (`row::with_columns`).
//!
//! `VARIADIC "any"` is beyond pgrx's function wrappers: the functions are plain fmgr V1
//! functions, declared in SQL below. Not strict: a column may be NULL (the model imputes it);
//! a NULL model or column-name list gives NULL, as the strict row form does for a NULL model.

use super::row::with_columns;
use super::{
    by_name, decision_function, predict_class, predict_number, predict_proba, ModelArg, Predictor,
};
use crate::pg::error::raise;
use crate::request::args::TextArg;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

/// The column names of a call (a non-NULL text[]), read once per call site.
unsafe fn column_names(datum: pg_sys::Datum) -> Vec<String> {
    let names = Vec::<Option<String>>::from_polymorphic_datum(datum, false, pg_sys::TEXTARRAYOID)
        .unwrap_or_default();
    names
        .into_iter()
        .map(|n| {
            n.unwrap_or_else(|| {
                raise(
                    PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
                    "the column names contain NULL",
                    None,
                )
            })
        })
        .collect()
}

/// One call: argument 0 the model (a bigint id, or a text name: `by_name`), 1 the column names,
/// 2.. the columns' values.
///
/// # Safety
/// `fcinfo` is a call of one of the functions declared below.
unsafe fn columns_call<R: IntoDatum>(
    fcinfo: pg_sys::FunctionCallInfo,
    by_name_arg: bool,
    f: Predictor<R>,
) -> pg_sys::Datum {
    let nargs = (*fcinfo).nargs as usize;
    let args = std::slice::from_raw_parts((*fcinfo).args.as_ptr(), nargs);
    let result = if nargs < 2 || args[0].isnull || args[1].isnull {
        None
    } else {
        let names = || column_names(args[1].value);
        if by_name_arg {
            by_name(TextArg(args[0].value), |arg| {
                with_columns(fcinfo, arg, 2, names, f)
            })
        } else {
            let id = i64::from_datum(args[0].value, false).expect("not NULL");
            with_columns(fcinfo, ModelArg::Id(id), 2, names, f)
        }
    };
    match result.and_then(IntoDatum::into_datum) {
        Some(datum) => datum,
        None => {
            (*fcinfo).isnull = true;
            pg_sys::Datum::from(0usize)
        }
    }
}

/// A V1 function (its `pg_finfo_` record and its body) predicting with `$predict`, the model
/// given by id (`$by_name` false) or by name.
macro_rules! columns_function {
    ($finfo:ident, $symbol:ident, $by_name:expr, $predict:ident) => {
        #[no_mangle]
        #[doc(hidden)]
        pub extern "C" fn $finfo() -> &'static pg_sys::Pg_finfo_record {
            const V1_API: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
            &V1_API
        }

        /// # Safety
        /// Called by PostgreSQL's fmgr, as the function declared in SQL below.
        #[no_mangle]
        #[pg_guard]
        pub unsafe extern "C-unwind" fn $symbol(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
            columns_call(fcinfo, $by_name, $predict)
        }
    };
}

#[rustfmt::skip]
mod symbols {
    use super::*;
    columns_function!(pg_finfo_corgipile_predict_columns, corgipile_predict_columns, false, predict_number);
    columns_function!(pg_finfo_corgipile_predict_columns_by_name, corgipile_predict_columns_by_name, true, predict_number);
    columns_function!(pg_finfo_corgipile_predict_class_columns, corgipile_predict_class_columns, false, predict_class);
    columns_function!(pg_finfo_corgipile_predict_class_columns_by_name, corgipile_predict_class_columns_by_name, true, predict_class);
    columns_function!(pg_finfo_corgipile_predict_proba_columns, corgipile_predict_proba_columns, false, predict_proba);
    columns_function!(pg_finfo_corgipile_predict_proba_columns_by_name, corgipile_predict_proba_columns_by_name, true, predict_proba);
    columns_function!(pg_finfo_corgipile_decision_function_columns, corgipile_decision_function_columns, false, decision_function);
    columns_function!(pg_finfo_corgipile_decision_function_columns_by_name, corgipile_decision_function_columns_by_name, true, decision_function);
}

extension_sql!(
    r#"
-- What the planner rewrites corgipile_predict(model, t) (and the class, proba and
-- decision_function row forms) into when t is a table's row: the model's columns alone, by name
-- (EXPLAIN VERBOSE shows the call). Callable directly too: the columns are matched by name.
CREATE FUNCTION "corgipile_predict_columns"("model_id" bigint, "column_names" text[], VARIADIC "column_values" "any")
RETURNS double precision STABLE PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'corgipile_predict_columns';
CREATE FUNCTION "corgipile_predict_columns"("model_name" text, "column_names" text[], VARIADIC "column_values" "any")
RETURNS double precision STABLE PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'corgipile_predict_columns_by_name';
CREATE FUNCTION "corgipile_predict_class_columns"("model_id" bigint, "column_names" text[], VARIADIC "column_values" "any")
RETURNS text STABLE PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'corgipile_predict_class_columns';
CREATE FUNCTION "corgipile_predict_class_columns"("model_name" text, "column_names" text[], VARIADIC "column_values" "any")
RETURNS text STABLE PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'corgipile_predict_class_columns_by_name';
CREATE FUNCTION "corgipile_predict_proba_columns"("model_id" bigint, "column_names" text[], VARIADIC "column_values" "any")
RETURNS double precision[] STABLE PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'corgipile_predict_proba_columns';
CREATE FUNCTION "corgipile_predict_proba_columns"("model_name" text, "column_names" text[], VARIADIC "column_values" "any")
RETURNS double precision[] STABLE PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'corgipile_predict_proba_columns_by_name';
CREATE FUNCTION "corgipile_decision_function_columns"("model_id" bigint, "column_names" text[], VARIADIC "column_values" "any")
RETURNS double precision STABLE PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'corgipile_decision_function_columns';
CREATE FUNCTION "corgipile_decision_function_columns"("model_name" text, "column_names" text[], VARIADIC "column_values" "any")
RETURNS double precision STABLE PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'corgipile_decision_function_columns_by_name';
"#,
    name = "predict_columns",
);
