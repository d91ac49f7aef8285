//! A view over a sharded table, trained on the table's shards. The shards read their own
//! tables by block and know nothing of the view, so a simple view — the sharded table's own
//! columns (renamed or not) and an optional WHERE — is rewritten into the table's terms before
//! anything else: its columns name the table's in the params (label, features, group and
//! excluded columns, per-column options), and its WHERE, deparsed by PostgreSQL from the view's
//! stored query, becomes the training's `"where"` (AND the caller's, whose column names are the
//! view's: parsed over the view, its columns renumbered as the table's, deparsed again). Any
//! other view that reads a sharded table (a join, an aggregate, a LIMIT, an expression, a view
//! of a view...) is 0A000 before any shard is contacted, saying what it has.
//!
//! Privileges: one server reads the base table with the view owner's rights (or the caller's,
//! `security_invoker`); the shards read it as the caller's user mappings say, and the
//! coordinator checks the caller's SELECT on the table (`shard::check_sharded_access`), which
//! no view can lend. So a caller needs SELECT on the view and on the table: a role that may
//! read the table only through the view is refused (42501, saying why), never given its rows.

use super::predicate::{analysed, deparsed, Predicate};
use crate::pg::error::{raise, raise_combination_because};
use crate::pg::names::relation_name;
use corgipile_ml::capabilities::Use;
use corgipile_ml::params::{Features, TrainParams, Validation};
use pgrx::{is_a, pg_sys, PgList, PgSqlErrorCode};
use std::ffi::{c_void, CStr};

/// Views within views, searched for a sharded table: at most this deep (as `view`).
const MAX_DEPTH: usize = 32;

/// A simple view over a sharded table, in the table's terms.
pub struct ShardedView {
    /// The view's name, for ERRORs.
    name: String,
    view: pg_sys::Oid,
    /// The sharded (partitioned) table the view reads.
    pub base: pg_sys::Oid,
    /// Each column of the view in order: its name, and the table column it is (name, number).
    columns: Vec<(String, String, i16)>,
    /// The view's WHERE over the table's columns, deparsed.
    qual: Option<String>,
}

/// The simple view over a sharded table that `relid` is, rewritten into the table's terms;
/// None if `relid` is not a view or reads no sharded table. Any other view that reads one is
/// an ERROR (0A000 naming what it has), as is a caller who may not read the table (42501).
pub fn on_shards(relid: pg_sys::Oid) -> Option<ShardedView> {
    // SAFETY: FFI calls, and reads of what they return, on the backend thread inside the transaction
    // of the SQL call (every caller is a SQL function); no raw pointer comes from the caller.
    unsafe {
        if pg_sys::get_rel_relkind(relid) as u8 != pg_sys::RELKIND_VIEW || !reads_shards(relid) {
            return None;
        }
        let name = relation_name(relid);
        check_select(relid, &format!("permission denied for view {name}"), None);
        let view = simple(relid, name.clone()).unwrap_or_else(|reason| {
            raise_combination_because(Use::Shards, Use::View, format!("View {name} {reason}."))
        });
        check_select(
            view.base,
            &format!("permission denied for table {}", relation_name(view.base)),
            Some(format!("The shards of a view's table are read with the caller's rights on the table, which the view cannot lend: ask for SELECT on {}, or let a role that has it train.", relation_name(view.base))),
        );
        Some(view)
    }
}

/// An ERROR 42501 unless the caller may SELECT from `relid`.
unsafe fn check_select(relid: pg_sys::Oid, message: &str, hint: Option<String>) {
    let mode = pg_sys::ACL_SELECT as pg_sys::AclMode;
    if pg_sys::pg_class_aclcheck(relid, pg_sys::GetUserId(), mode) != pg_sys::AclResult::ACLCHECK_OK
    {
        raise(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            message,
            hint,
        );
    }
}

/// The stored query of view `view` (locked as a query of it would be).
unsafe fn view_query(view: pg_sys::Oid) -> *mut pg_sys::Query {
    let rel = pg_sys::relation_open(view, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
    let query = pg_sys::get_view_query(rel);
    pg_sys::relation_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
    query
}

/// Whether view `view` reads a sharded table anywhere: in its FROM, joins, subqueries, CTEs,
/// or the views it reads.
unsafe fn reads_shards(view: pg_sys::Oid) -> bool {
    let mut seen = vec![view];
    let mut views = vec![view];
    while let Some(v) = views.pop() {
        if seen.len() > MAX_DEPTH * MAX_DEPTH {
            break; // a web of views this large reads its tables as one server does
        }
        let mut tables: Vec<pg_sys::Oid> = Vec::new();
        pg_sys::query_tree_walker(
            view_query(v),
            Some(collect_relations),
            (&mut tables as *mut Vec<pg_sys::Oid>).cast(),
            pg_sys::QTW_EXAMINE_RTES_BEFORE as i32,
        );
        for t in tables {
            if seen.contains(&t) {
                continue;
            }
            seen.push(t);
            if pg_sys::get_rel_relkind(t) as u8 == pg_sys::RELKIND_VIEW {
                views.push(t);
            } else if super::query::has_foreign_partitions(t) {
                return true;
            }
        }
    }
    false
}

/// A query tree walker: pushes the relation of every relation entry of a range table (of the
/// query and of the queries in it) onto `context`, a `Vec<Oid>`. Calls nothing that can raise.
unsafe extern "C-unwind" fn collect_relations(
    node: *mut pg_sys::Node,
    context: *mut c_void,
) -> bool {
    if node.is_null() {
        return false;
    }
    // SAFETY: `context` is the Vec `reads_shards` passed; `node` a valid node of the tree.
    unsafe {
        if is_a(node, pg_sys::NodeTag::T_RangeTblEntry) {
            let rte = node.cast::<pg_sys::RangeTblEntry>();
            if (*rte).rtekind == pg_sys::RTEKind::RTE_RELATION {
                (*context.cast::<Vec<pg_sys::Oid>>()).push((*rte).relid);
            }
            return false; // the walker goes on into its subquery, functions, values
        }
        if is_a(node, pg_sys::NodeTag::T_Query) {
            return pg_sys::query_tree_walker(
                node.cast(),
                Some(collect_relations),
                context,
                pg_sys::QTW_EXAMINE_RTES_BEFORE as i32,
            );
        }
        pg_sys::expression_tree_walker(node, Some(collect_relations), context)
    }
}

/// View `view` as the sharded table's columns and WHERE, or what keeps it from being that
/// (completing "View v ...").
unsafe fn simple(view: pg_sys::Oid, name: String) -> Result<ShardedView, String> {
    let query = view_query(view);
    if (*query).hasSubLinks {
        return Err("has a subquery".into());
    }
    // Joins, aggregates, DISTINCT, GROUP BY, LIMIT, set operations, WITH, window and
    // set-returning functions: what PostgreSQL says keeps a view from being updatable.
    let why_not = pg_sys::view_query_is_auto_updatable(query, false);
    if !why_not.is_null() {
        let why = CStr::from_ptr(why_not).to_string_lossy();
        return Err(format!(
            "is not one table's columns and rows: {}",
            why.trim_end_matches('.')
        ));
    }
    // SAFETY: an automatically updatable view reads exactly one relation, the first item of
    // its FROM list (view_query_is_auto_updatable checked that).
    let from = (*(*query).jointree).fromlist;
    let rtindex = (*(*(*from).elements).ptr_value.cast::<pg_sys::RangeTblRef>()).rtindex;
    let rte = (*(*(*query).rtable).elements.add(rtindex as usize - 1))
        .ptr_value
        .cast::<pg_sys::RangeTblEntry>();
    let base = (*rte).relid;
    if pg_sys::get_rel_relkind(base) as u8 != pg_sys::RELKIND_PARTITIONED_TABLE {
        return Err(format!(
            "reads {}, not the sharded table itself",
            relation_name(base)
        ));
    }
    if !(*rte).inh {
        return Err("reads ONLY the partitioned table, which has no rows of its own".into());
    }
    if !(*rte).tablesample.is_null() {
        return Err("samples its table (TABLESAMPLE), which reads other rows every time".into());
    }
    let mut columns = Vec::new();
    for entry in PgList::<pg_sys::TargetEntry>::from_pg((*query).targetList).iter_ptr() {
        if (*entry).resjunk {
            continue;
        }
        let column = CStr::from_ptr((*entry).resname)
            .to_string_lossy()
            .into_owned();
        let var = (*entry).expr.cast::<pg_sys::Var>();
        let plain = is_a(var.cast(), pg_sys::NodeTag::T_Var)
            && i64::from((*var).varno) == i64::from(rtindex)
            && (*var).varlevelsup == 0
            && (*var).varattno > 0;
        if !plain {
            return Err(format!(
                "computes its column \"{column}\": only columns of the table are read on the shards"
            ));
        }
        let attname = CStr::from_ptr(pg_sys::get_attname(base, (*var).varattno, false));
        columns.push((
            column,
            attname.to_string_lossy().into_owned(),
            (*var).varattno,
        ));
    }
    let quals = (*(*query).jointree).quals;
    if pg_sys::contain_volatile_functions(quals) {
        return Err("calls a volatile function such as random() in its WHERE, and every epoch must read the same rows".into());
    }
    let qual = (!quals.is_null()).then(|| {
        // Its Vars are of the view's range table entry `rtindex`: made the only entry's, 1.
        let expr = pg_sys::copyObjectImpl(quals.cast()).cast::<pg_sys::Node>();
        let mut renumber = Renumber {
            from: rtindex,
            attnos: None,
        };
        // Called on the top node itself: the tree walker visits only a node's children.
        renumber_vars(expr, (&mut renumber as *mut Renumber).cast());
        // SAFETY: every Var of `expr` is now of entry 1, with the table's attribute numbers.
        deparsed(expr, base, &relation_name(base))
    });
    Ok(ShardedView {
        name,
        view,
        base,
        columns,
        qual,
    })
}

/// What `renumber_vars` makes of the Vars of level 0 of entry `from`: Vars of entry 1, their
/// attribute numbers `attnos[n - 1]` for `Some(attnos)`.
struct Renumber<'a> {
    from: i32,
    attnos: Option<&'a [i16]>,
}

/// An expression tree walker that renumbers Vars in place as its `Renumber` says. Calls nothing
/// that can raise.
unsafe extern "C-unwind" fn renumber_vars(node: *mut pg_sys::Node, context: *mut c_void) -> bool {
    if node.is_null() {
        return false;
    }
    // SAFETY: `context` is the `Renumber` the caller passed; `node` a valid node of a tree the
    // caller copied (or built) for itself, so changing it changes nothing else.
    unsafe {
        if is_a(node, pg_sys::NodeTag::T_Var) {
            let var = node.cast::<pg_sys::Var>();
            let how = &*context.cast::<Renumber>();
            if (*var).varlevelsup == 0 && i64::from((*var).varno) == i64::from(how.from) {
                // A view's column numbers are 1..=its columns (a view has no system columns, and
                // a whole-row Var is refused before): checked only so that this walker cannot panic.
                let index = (*var).varattno.checked_sub(1).map(usize::try_from);
                if let (Some(attnos), Some(Ok(i))) = (how.attnos, index) {
                    (*var).varattno = attnos.get(i).copied().unwrap_or((*var).varattno);
                }
                (*var).varno = 1;
                (*var).varnosyn = 1;
                (*var).varattnosyn = (*var).varattno;
            }
            return false;
        }
        pg_sys::expression_tree_walker(node, Some(renumber_vars), context)
    }
}

impl ShardedView {
    /// `params`, whose columns and expressions are the view's, in the table's terms.
    pub fn rewrite(&self, params: &mut TrainParams) {
        let group_by = params.group_by.clone().unwrap_or_default();
        params.features = match &params.features {
            Features::Column(c) => Features::Column(self.column(c, "features")),
            Features::Columns(cs) => {
                Features::Columns(cs.iter().map(|c| self.column(c, "features")).collect())
            }
            // Every column of the view but the label, the excluded and the group columns (as
            // `request::prepare` reads "*"): named, for the table has others.
            Features::All => {
                for c in &params.exclude {
                    self.column(c, "exclude");
                }
                let names: Vec<String> = self
                    .columns
                    .iter()
                    .filter(|(v, _, _)| {
                        *v != params.label.as_str()
                            && !params.exclude.contains(v)
                            && !group_by.contains(v)
                    })
                    .map(|(_, b, _)| b.clone())
                    .collect();
                params.exclude.clear();
                Features::Columns(names)
            }
            Features::Sparse { indices, values } => Features::Sparse {
                indices: self.column(indices, "features"),
                values: self.column(values, "features"),
            },
        };
        params.label = self.column(&params.label, "label");
        params.group_by = params
            .group_by
            .as_ref()
            .map(|g| g.iter().map(|c| self.column(c, "group_by")).collect());
        params.preprocess = std::mem::take(&mut params.preprocess)
            .into_iter()
            .map(|(c, options)| match c.as_str() {
                corgipile_ml::preprocess::EVERY_COLUMN => (c, options),
                _ => (self.column(&c, "preprocess"), options),
            })
            .collect();
        let own = params
            .filter
            .as_deref()
            .map(|f| self.predicate(f, Predicate::Where));
        params.filter = match (&self.qual, own) {
            (Some(q), Some(f)) => Some(format!("({q}) AND ({f})")),
            (q, f) => f.or_else(|| q.clone()),
        };
        if let Some(Validation::Predicate(p)) = &params.validation {
            params.validation = Some(Validation::Predicate(
                self.predicate(p, Predicate::Validation),
            ));
        }
    }

    /// The table's column that view column `column` is; 42703 if the view has none so named.
    fn column(&self, column: &str, param: &str) -> String {
        match self.columns.iter().find(|(v, _, _)| v == column) {
            Some((_, base, _)) => base.clone(),
            None => raise(
                PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN,
                format!("column \"{column}\" of view {} does not exist", self.name),
                Some(format!(
                    "\"{param}\" names columns of the view: {}.",
                    self.columns
                        .iter()
                        .map(|(v, _, _)| v.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            ),
        }
    }

    /// A predicate the caller wrote over the view's columns, checked as one over the view is,
    /// and deparsed over the table's.
    fn predicate(&self, text: &str, what: Predicate) -> String {
        // SAFETY: FFI calls on the backend thread inside the SQL call's transaction; the
        // expression is the parser's, this call's own.
        unsafe {
            let expr = analysed(self.view, text, what);
            let attnos: Vec<i16> = self.columns.iter().map(|(_, _, a)| *a).collect();
            let mut renumber = Renumber {
                from: 1,
                attnos: Some(&attnos),
            };
            let mut whole_row = false;
            find_whole_row(expr, (&mut whole_row as *mut bool).cast());
            if whole_row {
                raise(
                    PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                    format!(
                        "invalid {}: it reads the whole row of view {}",
                        what.name(),
                        self.name
                    ),
                    Some("Name the view's columns: the shards read the sharded table's.".into()),
                );
            }
            renumber_vars(expr, (&mut renumber as *mut Renumber).cast());
            // SAFETY: every Var of `expr` is now of entry 1, with the table's numbers.
            deparsed(expr, self.base, &relation_name(self.base))
        }
    }
}

/// An expression tree walker: sets `context` (a bool) if a Var of level 0 is a whole row.
unsafe extern "C-unwind" fn find_whole_row(node: *mut pg_sys::Node, context: *mut c_void) -> bool {
    if node.is_null() {
        return false;
    }
    // SAFETY: `context` is the bool the caller passed; `node` a valid node of its tree.
    unsafe {
        if is_a(node, pg_sys::NodeTag::T_Var) {
            let var = node.cast::<pg_sys::Var>();
            if (*var).varlevelsup == 0 && (*var).varattno <= 0 {
                *context.cast::<bool>() = true;
            }
            return false;
        }
        pg_sys::expression_tree_walker(node, Some(find_whole_row), context)
    }
}
