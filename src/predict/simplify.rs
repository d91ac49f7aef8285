//! The planner support function of the row forms (`SupportRequestSimplify`): when the row is a
//! table's own row (`corgipile_predict('churn', c) FROM customers c`) and the model a constant,
//! the call becomes `corgipile_predict_columns('churn', '{plan,tenure,...}', c.plan, c.tenure,
//! ...)` on the columns the model uses (see `columns`), so PostgreSQL neither forms the row value
//! nor deforms it again. EXPLAIN VERBOSE shows the rewritten call.
//!
//! No rewrite (the row form runs, with today's errors) unless everything fits: a whole-row Var of
//! a table of this query level, no outer join that could make the row NULL, no GROUP BY of the
//! row, not a RETURNING `old`/`new` row (NULL where there is none); a model the planning role may use (looked up without raising: nothing about a model it
//! may not use is revealed), trained on named columns, without per-group models, every column
//! of a usable type in the table.
//!
//! The rewritten call resolves its model argument again at execution, as the row form does (the
//! same privilege checks, per role and statement), and matches the columns by name. The plan
//! depends on corgipile.models (see `catalog::plans`), so a redeployed, retrained or dropped
//! name is planned again; and on the role (a name means the role's own model).

use crate::catalog::plans::{models_relid, planned_model};
use crate::catalog::ModelRef;
use crate::decode::datum::with_text_bytes;
use crate::decode::record::read_for;
use corgipile_ml::preprocess::Preprocessor;
use pgrx::prelude::*;
use pgrx::{Internal, PgList};
use std::ffi::{CStr, CString};

/// The support function of every row form of the prediction functions.
#[pg_extern(immutable, parallel_safe)]
fn corgipile_predict_support(request: Internal) -> Internal {
    // SAFETY: PostgreSQL calls a support function with a pointer to a request node; a
    // SupportRequestSimplify's fields are valid during the call, on the backend thread.
    let rewritten = unsafe {
        match request.unwrap() {
            Some(node) => simplify(node.cast_mut_ptr()),
            None => std::ptr::null_mut(),
        }
    };
    // A null pointer (not an SQL NULL) means "no simplification".
    Internal::from(Some(pg_sys::Datum::from(rewritten)))
}

/// The rewritten call, or null.
unsafe fn simplify(node: *mut pg_sys::Node) -> *mut pg_sys::Node {
    if node.is_null() || !pgrx::is_a(node, pg_sys::NodeTag::T_SupportRequestSimplify) {
        return std::ptr::null_mut();
    }
    let req = node.cast::<pg_sys::SupportRequestSimplify>();
    let (root, call) = ((*req).root, (*req).fcall);
    if root.is_null() || call.is_null() || (*root).parse.is_null() || (*root).glob.is_null() {
        return std::ptr::null_mut();
    }
    let args = PgList::<pg_sys::Node>::from_pg((*call).args);
    if args.len() != 2 {
        return std::ptr::null_mut();
    }
    let (model, row) = (args.get_ptr(0).unwrap(), args.get_ptr(1).unwrap());
    let Some(relid) = table_row(root, row) else {
        return std::ptr::null_mut();
    };
    let row = row.cast::<pg_sys::Var>();
    let Some(model_text) = model_constant(model) else {
        return std::ptr::null_mut();
    };
    let key = match &model_text {
        Constant::Id(id) => ModelRef::Id(*id),
        Constant::Name(name) => ModelRef::from_text(name),
    };
    let Some(planned) = planned_model(key) else {
        return std::ptr::null_mut();
    };
    let Some(p) = planned.preprocessing.filter(|_| !planned.has_groups) else {
        return std::ptr::null_mut();
    };
    let Some(columns) = table_columns(&p, relid) else {
        return std::ptr::null_mut();
    };
    let Some(funcid) = columns_function((*call).funcid, (*model.cast::<pg_sys::Const>()).consttype)
    else {
        return std::ptr::null_mut();
    };
    // The plan now depends on what the model argument stands for, and on the role that planned
    // it (a name is the role's own): see `catalog::plans`.
    let glob = (*root).glob;
    (*glob).relationOids = pg_sys::lappend_oid((*glob).relationOids, models_relid());
    (*glob).dependsOnRole = true;
    let names: Vec<String> = p.columns.iter().map(|c| c.name.clone()).collect();
    let mut new_args = PgList::<pg_sys::Node>::new();
    new_args.push(pg_sys::copyObjectImpl(model.cast()).cast());
    new_args.push(
        pg_sys::makeConst(
            pg_sys::TEXTARRAYOID,
            -1,
            pg_sys::DEFAULT_COLLATION_OID,
            -1,
            names.into_datum().expect("an array"),
            false,
            false,
        )
        .cast(),
    );
    for (attnum, type_id, typmod, collation) in columns {
        let var = pg_sys::copyObjectImpl(row.cast()).cast::<pg_sys::Var>();
        (*var).varattno = attnum;
        (*var).varattnosyn = attnum;
        (*var).vartype = type_id;
        (*var).vartypmod = typmod;
        (*var).varcollid = collation;
        new_args.push(var.cast());
    }
    let expr = pg_sys::makeFuncExpr(
        funcid,
        (*call).funcresulttype,
        new_args.into_pg(),
        (*call).funccollid,
        (*call).inputcollid,
        pg_sys::CoercionForm::COERCE_EXPLICIT_CALL,
    );
    (*expr).location = (*call).location;
    expr.cast()
}

/// The table whose own row `row` is (a whole-row Var of a table of this query level that no
/// outer join or GROUP BY can turn into NULL), if it is one.
unsafe fn table_row(root: *mut pg_sys::PlannerInfo, row: *mut pg_sys::Node) -> Option<pg_sys::Oid> {
    if !pgrx::is_a(row, pg_sys::NodeTag::T_Var) {
        return None;
    }
    let var = row.cast::<pg_sys::Var>();
    if (*var).varattno != 0 || (*var).varlevelsup != 0 || !crate::pg::compat::var_reads_the_row(var)
    {
        return None;
    }
    let parse = (*root).parse;
    let rtable = PgList::<pg_sys::RangeTblEntry>::from_pg((*parse).rtable);
    let varno = (*var).varno as i64;
    if varno < 1 || varno as usize > rtable.len() {
        return None;
    }
    let rte = rtable.get_ptr(varno as usize - 1)?;
    let relkinds = [
        pg_sys::RELKIND_RELATION,
        pg_sys::RELKIND_PARTITIONED_TABLE,
        pg_sys::RELKIND_MATVIEW,
        pg_sys::RELKIND_FOREIGN_TABLE,
    ];
    if (*rte).rtekind != pg_sys::RTEKind::RTE_RELATION
        || !relkinds.contains(&((*rte).relkind as u8))
    {
        return None;
    }
    // The row of the nullable side of an outer join is NULL (and so is the strict row form's
    // result) where its columns would be imputed: such queries keep the row form. So does a
    // query grouping by the row (its columns are not grouped) or by grouping sets.
    if outer_join((*parse).jointree.cast())
        || !(*parse).groupingSets.is_null()
        || groups_by_row(parse, varno as u32)
    {
        return None;
    }
    Some((*rte).relid)
}

/// Whether a join tree has a join that can null-extend rows.
unsafe fn outer_join(node: *mut pg_sys::Node) -> bool {
    if node.is_null() {
        return false;
    }
    if pgrx::is_a(node, pg_sys::NodeTag::T_FromExpr) {
        let from = node.cast::<pg_sys::FromExpr>();
        return PgList::<pg_sys::Node>::from_pg((*from).fromlist)
            .iter_ptr()
            .any(|n| outer_join(n));
    }
    if pgrx::is_a(node, pg_sys::NodeTag::T_JoinExpr) {
        let join = node.cast::<pg_sys::JoinExpr>();
        use pg_sys::JoinType::*;
        return !matches!((*join).jointype, JOIN_INNER | JOIN_SEMI | JOIN_ANTI)
            || outer_join((*join).larg)
            || outer_join((*join).rarg);
    }
    false
}

/// Whether a GROUP BY expression contains the whole row of range table entry `varno`.
unsafe fn groups_by_row(parse: *mut pg_sys::Query, varno: u32) -> bool {
    let whole_row = -pg_sys::FirstLowInvalidHeapAttributeNumber;
    PgList::<pg_sys::SortGroupClause>::from_pg((*parse).groupClause)
        .iter_ptr()
        .any(|clause| {
            let tle = pg_sys::get_sortgroupclause_tle(clause, (*parse).targetList);
            let mut attnos: *mut pg_sys::Bitmapset = std::ptr::null_mut();
            pg_sys::pull_varattnos((*tle).expr.cast(), varno, &mut attnos);
            pg_sys::bms_is_member(whole_row, attnos)
        })
}

enum Constant {
    Id(i64),
    Name(String),
}

/// The model argument, if it is a constant id or name.
unsafe fn model_constant(node: *mut pg_sys::Node) -> Option<Constant> {
    if !pgrx::is_a(node, pg_sys::NodeTag::T_Const) {
        return None;
    }
    let c = node.cast::<pg_sys::Const>();
    if (*c).constisnull {
        return None;
    }
    match (*c).consttype {
        pg_sys::INT8OID => i64::from_datum((*c).constvalue, false).map(Constant::Id),
        pg_sys::TEXTOID => with_text_bytes((*c).constvalue, |b| {
            std::str::from_utf8(b)
                .ok()
                .map(|s| Constant::Name(s.to_owned()))
        }),
        _ => None,
    }
}

/// Per model column, the table's attribute (number, type, typmod, collation), if every one is
/// there and of a type the row form reads.
unsafe fn table_columns(
    p: &Preprocessor,
    relid: pg_sys::Oid,
) -> Option<Vec<(i16, pg_sys::Oid, i32, pg_sys::Oid)>> {
    // The rewritten call's arguments: the model, the names, then one per column.
    if p.columns.is_empty() || p.columns.len() + 2 > pg_sys::FUNC_MAX_ARGS as usize {
        return None;
    }
    p.columns
        .iter()
        .map(|c| {
            let name = CString::new(c.name.as_str()).ok()?;
            let attnum = pg_sys::get_attnum(relid, name.as_ptr());
            if attnum <= 0 {
                return None; // no such column (or a system column, which a row does not have)
            }
            let (mut type_id, mut typmod, mut collation) =
                (pg_sys::InvalidOid, -1, pg_sys::InvalidOid);
            pg_sys::get_atttypetypmodcoll(relid, attnum, &mut type_id, &mut typmod, &mut collation);
            read_for(c.source, pg_sys::getBaseType(type_id))?;
            Some((attnum, type_id, typmod, collation))
        })
        .collect()
}

/// The `_columns` function of the row form `funcid` (same schema, name + "_columns") for a
/// model argument of type `model_type`.
unsafe fn columns_function(funcid: pg_sys::Oid, model_type: pg_sys::Oid) -> Option<pg_sys::Oid> {
    let name = pg_sys::get_func_name(funcid);
    let schema = pg_sys::get_namespace_name(pg_sys::get_func_namespace(funcid));
    if name.is_null() || schema.is_null() {
        return None;
    }
    let name = CString::new(format!("{}_columns", CStr::from_ptr(name).to_str().ok()?)).ok()?;
    let mut qualified = PgList::<pg_sys::Node>::new();
    qualified.push(pg_sys::makeString(schema).cast());
    qualified.push(pg_sys::makeString(pg_sys::pstrdup(name.as_ptr())).cast());
    let types = [model_type, pg_sys::TEXTARRAYOID, pg_sys::ANYOID];
    let oid = pg_sys::LookupFuncName(qualified.into_pg(), 3, types.as_ptr(), true);
    (oid != pg_sys::InvalidOid).then_some(oid)
}
