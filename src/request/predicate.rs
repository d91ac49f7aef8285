//! The SQL expressions of the params (`"where"`, a validation predicate): parsed and analysed
//! by PostgreSQL as a WHERE clause over the relation alone, checked, and deparsed back into SQL
//! by PostgreSQL itself — never pasted into a query as the user wrote them.

use crate::pg::error::raise;
use pgrx::{pg_sys, PgSqlErrorCode};
use std::ffi::{CStr, CString};

/// Which SQL expression of the params is being checked: each is named in its errors.
#[derive(Clone, Copy)]
pub enum Predicate {
    /// `"validation": {"predicate": ...}`: the held-out rows.
    Validation,
    /// `"where"`: the rows read at all.
    Where,
}

impl Predicate {
    pub(super) fn name(self) -> &'static str {
        match self {
            Predicate::Validation => "validation predicate",
            Predicate::Where => "\"where\" filter",
        }
    }

    fn hint(self) -> &'static str {
        match self {
            Predicate::Validation => "The predicate is one boolean expression over the table's columns, such as \"id % 5 = 0\" or \"NOT in_training\": no subqueries, aggregates, window or set-returning functions, and no volatile functions such as random() (the held-out rows must be the same in every epoch).",
            Predicate::Where => "The filter is one boolean expression over the table's columns, such as \"region = 'EU' AND amount > 0\": no subqueries, aggregates, window or set-returning functions, and no volatile functions such as random() (every epoch must read the same rows).",
        }
    }

    fn refuse(self, code: PgSqlErrorCode, message: &str) -> ! {
        raise(
            code,
            format!("invalid {}: {message}", self.name()),
            Some(self.hint().into()),
        )
    }

    /// Runs the parser on the expression; its ERROR (syntax, aggregate in WHERE, unknown
    /// column...) is re-raised at once, with its SQLSTATE, saying which expression it is about.
    fn naming_it<R>(self, f: impl FnOnce() -> R) -> R {
        use pgrx::pg_sys::panic::CaughtError;
        pgrx::PgTryBuilder::new(std::panic::AssertUnwindSafe(f))
            .catch_others(|e| match e {
                CaughtError::PostgresError(report) => raise(
                    report.sql_error_code(),
                    format!("invalid {}: {}", self.name(), report.message()),
                    report.hint().map(str::to_owned),
                ),
                other => other.rethrow(),
            })
            .execute()
    }
}

/// A predicate as the parser sees it: exactly one boolean expression over the relation's
/// columns (parsed and analysed like a WHERE clause on the relation alone, never pasted into
/// SQL as written), deparsed back into SQL text by PostgreSQL itself.
pub fn checked_predicate(
    relid: pg_sys::Oid,
    relname: &str,
    predicate: &str,
    what: Predicate,
) -> String {
    // SAFETY: the expression was just analysed over `relid`, in this memory context.
    unsafe { deparsed(analysed(relid, predicate, what), relid, relname) }
}

/// A predicate over the columns of `relid` (a table or a view), parsed and analysed as
/// `checked_predicate` says: its expression, in the current memory context.
pub(super) fn analysed(relid: pg_sys::Oid, predicate: &str, what: Predicate) -> *mut pg_sys::Node {
    // SAFETY: FFI calls, and reads of what they return, on the backend thread inside the transaction
    // of the SQL call (every caller is a SQL function); no raw pointer comes from the caller.
    unsafe {
        let bad_predicate = |code, message: &str| -> ! { what.refuse(code, message) };
        use pgrx::{is_a, PgList};
        if predicate.trim().is_empty() {
            bad_predicate(PgSqlErrorCode::ERRCODE_SYNTAX_ERROR, "it is empty");
        }
        let sql = CString::new(format!("SELECT {predicate}")).unwrap_or_else(|_| {
            bad_predicate(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                "it contains a NUL byte",
            )
        });
        // A syntax error raises here, with its position in "SELECT <predicate>".
        let statements = PgList::<pg_sys::RawStmt>::from_pg(
            what.naming_it(|| crate::pg::compat::raw_parse(sql.as_ptr())),
        );
        let not_one = || -> ! {
            bad_predicate(PgSqlErrorCode::ERRCODE_SYNTAX_ERROR, "it must be one expression, without clauses such as FROM, ORDER BY or LIMIT and without a \";\"")
        };
        if statements.len() != 1 {
            not_one();
        }
        let raw = (*statements.get_ptr(0).unwrap_or_else(|| not_one())).stmt;
        if !is_a(raw, pg_sys::NodeTag::T_SelectStmt) {
            not_one();
        }
        let select = &*(raw as *mut pg_sys::SelectStmt);
        let targets = PgList::<pg_sys::ResTarget>::from_pg(select.targetList);
        let only_an_expression = targets.len() == 1
            && select.distinctClause.is_null()
            && select.intoClause.is_null()
            && select.fromClause.is_null()
            && select.whereClause.is_null()
            && select.groupClause.is_null()
            && select.havingClause.is_null()
            && select.windowClause.is_null()
            && select.valuesLists.is_null()
            && select.sortClause.is_null()
            && select.limitOffset.is_null()
            && select.limitCount.is_null()
            && select.lockingClause.is_null()
            && select.withClause.is_null()
            && select.op == pg_sys::SetOperation::SETOP_NONE;
        if !only_an_expression {
            not_one();
        }
        let target = &*targets.get_ptr(0).unwrap_or_else(|| not_one());
        if !target.name.is_null() {
            bad_predicate(
                PgSqlErrorCode::ERRCODE_SYNTAX_ERROR,
                "it must be an expression without an alias",
            );
        }
        // Analyse it as a WHERE clause over this relation only: aggregates, window functions and
        // set-returning functions are refused by the analyser itself; unknown columns and other
        // tables are unknown names.
        let pstate = pg_sys::make_parsestate(std::ptr::null_mut());
        (*pstate).p_sourcetext = sql.as_ptr();
        let rel = pg_sys::table_open(relid, pg_sys::AccessShareLock as i32);
        let item = pg_sys::addRangeTableEntryForRelation(
            pstate,
            rel,
            pg_sys::AccessShareLock as i32,
            std::ptr::null_mut(),
            false,
            true,
        );
        pg_sys::addNSItemToQuery(pstate, item, true, true, true);
        let expr = what.naming_it(|| {
            let expr =
                pg_sys::transformExpr(pstate, target.val, pg_sys::ParseExprKind::EXPR_KIND_WHERE);
            let construct = CString::new(what.name()).unwrap_or_default();
            let expr = pg_sys::coerce_to_boolean(pstate, expr, construct.as_ptr());
            pg_sys::assign_expr_collations(pstate, expr);
            expr
        });
        pg_sys::table_close(rel, pg_sys::NoLock as i32);
        if (*pstate).p_hasSubLinks {
            bad_predicate(
                PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                "subqueries are not allowed",
            );
        }
        // A filter of no column keeps every row or none (and the planner makes it a gate above
        // the scan, which a block scan cannot take).
        if !pg_sys::contain_vars_of_level(expr, 0) {
            bad_predicate(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                "it reads no column of the table, so it would keep every row or none",
            );
        }
        if pg_sys::contain_volatile_functions(expr) {
            bad_predicate(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                "volatile functions (such as random()) are not allowed",
            );
        }
        pg_sys::free_parsestate(pstate);
        expr
    }
}

/// SQL text of `expr`, an expression over the columns of `relid` alone (range table index 1),
/// by PostgreSQL's own deparser.
///
/// # Safety
/// `expr` is a valid expression tree whose Vars are of level 0 and range table index 1, with
/// attribute numbers of `relid`.
pub(super) unsafe fn deparsed(
    expr: *mut pg_sys::Node,
    relid: pg_sys::Oid,
    relname: &str,
) -> String {
    let name = CString::new(relname).unwrap_or_default();
    // SAFETY: the caller's promise; deparse_context_for gives one range table entry, `relid`.
    unsafe {
        let text = pg_sys::deparse_expression(
            expr,
            pg_sys::deparse_context_for(name.as_ptr(), relid),
            false,
            false,
        );
        CStr::from_ptr(text).to_string_lossy().into_owned()
    }
}
