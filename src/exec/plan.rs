//! Getting the three CorgiPile nodes into an executor tree.
//!
//! `corgipile_train` plans `SELECT label, features FROM ONLY rel` through PostgreSQL's
//! planner while a backend-local flag makes our `set_rel_pathlist_hook` offer only the
//! BlockShuffle path for that relation; privileges, RLS quals and WHERE filters therefore come
//! from the planner and executor as for any query. TupleShuffle and SGD are then stacked by hand
//! on the finished plan (scanrelid = 0, so they read their child's output through
//! `custom_scan_tlist`).

use crate::exec::block_shuffle::BlockShuffle;
use crate::exec::methods;
use crate::exec::node::{is_node, Node};
use crate::pg::error::raise;
use crate::pipeline::PipelineConfig;
use pgrx::{pg_guard, pg_sys, PgSqlErrorCode};
use std::cell::RefCell;
use std::ffi::CStr;
use std::sync::OnceLock;

thread_local! {
    /// Set only while `plan_pipeline` runs the planner: (relation oid, its config).
    static ACTIVE: RefCell<Option<(pg_sys::Oid, PipelineConfig)>> = const { RefCell::new(None) };
}

static mut PREV_SET_REL_PATHLIST_HOOK: pg_sys::set_rel_pathlist_hook_type = None;

/// The BlockShuffle path's methods (PostgreSQL keeps a pointer to them).
struct PathMethods(pg_sys::CustomPathMethods);
// SAFETY: immutable after creation, and read only by the backend thread.
unsafe impl Send for PathMethods {}
unsafe impl Sync for PathMethods {}
static PATH_METHODS: OnceLock<PathMethods> = OnceLock::new();

fn path_methods() -> &'static pg_sys::CustomPathMethods {
    &PATH_METHODS
        .get_or_init(|| {
            PathMethods(pg_sys::CustomPathMethods {
                CustomName: BlockShuffle::NAME.as_ptr(),
                PlanCustomPath: Some(plan_block_shuffle),
                ReparameterizeCustomPathByChild: None,
            })
        })
        .0
}

pub fn install_hook() {
    // SAFETY: _PG_init runs once per backend on the backend thread, before any planning.
    unsafe {
        PREV_SET_REL_PATHLIST_HOOK = pg_sys::set_rel_pathlist_hook;
        pg_sys::set_rel_pathlist_hook = Some(set_rel_pathlist);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn set_rel_pathlist(
    root: *mut pg_sys::PlannerInfo,
    rel: *mut pg_sys::RelOptInfo,
    rti: pg_sys::Index,
    rte: *mut pg_sys::RangeTblEntry,
) {
    // SAFETY: the planner passes valid pointers; the previous hook has the same contract.
    if let Some(prev) = PREV_SET_REL_PATHLIST_HOOK {
        prev(root, rel, rti, rte);
    }
    let Some((relid, config)) = ACTIVE.with(|a| a.borrow().clone()) else {
        return;
    };
    if (*rte).rtekind != pg_sys::RTEKind::RTE_RELATION
        || (*rte).relid != relid
        || (*rel).reloptkind != pg_sys::RelOptKind::RELOPT_BASEREL
    {
        return;
    }
    let path =
        pg_sys::palloc0(std::mem::size_of::<pg_sys::CustomPath>()).cast::<pg_sys::CustomPath>();
    (*path).path.type_ = pg_sys::NodeTag::T_CustomPath;
    (*path).path.pathtype = pg_sys::NodeTag::T_CustomScan;
    (*path).path.parent = rel;
    (*path).path.pathtarget = (*rel).reltarget;
    (*path).path.rows = (*rel).rows;
    (*path).path.startup_cost = 0.0;
    (*path).path.total_cost = (*rel).pages as f64 + (*rel).tuples * 0.01;
    (*path).flags = crate::pg::compat::CUSTOMPATH_PROJECTS;
    (*path).custom_private = config.to_list();
    (*path).methods = path_methods();
    // Only our path: the training scan must be the BlockShuffle, never a seq/index/parallel scan.
    (*rel).pathlist = std::ptr::null_mut();
    (*rel).partial_pathlist = std::ptr::null_mut();
    pg_sys::add_path(rel, path.cast());
    // A partitioned table: our one scan reads every partition (BlockShuffle opens the leaves).
    // Without its partitioning scheme the planner keeps our path; with it, the final target
    // step (apply_scanjoin_target_to_paths) drops a partitioned rel's paths and rebuilds an
    // Append of the partitions. The query reads this one relation (no join or grouping could
    // be planned partition-wise).
    (*rel).part_scheme = std::ptr::null_mut();
}

/// PlanCustomPath: the BlockShuffle CustomScan over the base relation.
#[pg_guard]
unsafe extern "C-unwind" fn plan_block_shuffle(
    _root: *mut pg_sys::PlannerInfo,
    rel: *mut pg_sys::RelOptInfo,
    best_path: *mut pg_sys::CustomPath,
    tlist: *mut pg_sys::List,
    clauses: *mut pg_sys::List,
    _custom_plans: *mut pg_sys::List,
) -> *mut pg_sys::Plan {
    // SAFETY: called by create_customscan_plan with valid planner structures.
    let cscan = new_custom_scan();
    (*cscan).scan.plan.targetlist = tlist;
    // WHERE and RLS quals: evaluated by ExecScan in the node.
    (*cscan).scan.plan.qual = pg_sys::extract_actual_clauses(clauses, false);
    (*cscan).scan.scanrelid = (*rel).relid;
    (*cscan).flags = (*best_path).flags;
    (*cscan).custom_private = (*best_path).custom_private;
    (*cscan).methods = &methods().block_scan;
    cscan.cast()
}

unsafe fn new_custom_scan() -> *mut pg_sys::CustomScan {
    let cscan =
        pg_sys::palloc0(std::mem::size_of::<pg_sys::CustomScan>()).cast::<pg_sys::CustomScan>();
    (*cscan).scan.plan.type_ = pg_sys::NodeTag::T_CustomScan;
    cscan
}

/// With `"workers"`, every process evaluates the filters of the rows it reads: a function
/// that only the leader may run (PARALLEL UNSAFE or RESTRICTED: `nextval`, a temporary table, a
/// function not declared otherwise) in the `where` filter, the validation predicate, a view's
/// qual or columns, or a row-level security policy would fail in a worker (25000 "cannot execute
/// … during a parallel operation") or read what a worker cannot see. An ERROR before any work.
///
/// # Safety
/// Backend thread; `query` is the analysed and rewritten training query (policies included).
unsafe fn refuse_unsafe_in_workers(query: *mut pg_sys::Query, config: &PipelineConfig) {
    let hazard = pg_sys::max_parallel_hazard(query) as u8;
    if hazard == pg_sys::PROPARALLEL_SAFE {
        return;
    }
    raise(
        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
        format!(
            "\"workers\" cannot read {}: its rows pass through a function that parallel workers may not run (PARALLEL {})",
            config.relation,
            if hazard == pg_sys::PROPARALLEL_UNSAFE { "UNSAFE" } else { "RESTRICTED" }
        ),
        Some("A function in the \"where\" filter, the validation predicate, a view's definition or a row-level security policy is not PARALLEL SAFE (as user functions are unless declared so; nextval() and temporary tables never are). Declare it PARALLEL SAFE if it is (ALTER FUNCTION ... PARALLEL SAFE), or train without \"workers\".".into()),
    );
}

/// Resets ACTIVE even when planning raises an ERROR.
struct ActiveGuard;
impl Drop for ActiveGuard {
    fn drop(&mut self) {
        ACTIVE.with(|a| *a.borrow_mut() = None);
    }
}

/// Plans `sql` (which must select from `relid` only) with the BlockShuffle path forced, and
/// stacks TupleShuffle and SGD on top. Returns the finished PlannedStmt, palloc'd in the
/// current memory context.
pub fn plan_pipeline(
    relid: pg_sys::Oid,
    sql: &CStr,
    config: &PipelineConfig,
) -> *mut pg_sys::PlannedStmt {
    // SAFETY: standard parse → analyze → plan sequence on the backend thread, inside a
    // transaction with an active snapshot (every caller is a SQL function); `sql` is
    // NUL-terminated and outlives the calls; the lists and nodes read are those PostgreSQL
    // just returned.
    unsafe {
        let raw_list = pg_sys::pg_parse_query(sql.as_ptr());
        if (*raw_list).length != 1 {
            // Only a validation predicate can smuggle in a second statement.
            raise(
                PgSqlErrorCode::ERRCODE_SYNTAX_ERROR,
                "the validation predicate must be a single boolean expression",
                None,
            );
        }
        let raw = (*(*raw_list).elements).ptr_value.cast::<pg_sys::RawStmt>();
        let queries = crate::pg::compat::analyze_and_rewrite(raw, sql.as_ptr());
        assert!((*queries).length == 1);
        let query = (*(*queries).elements).ptr_value.cast::<pg_sys::Query>();
        if config.params.workers > 0 {
            refuse_unsafe_in_workers(query, config);
        }

        ACTIVE.with(|a| *a.borrow_mut() = Some((relid, config.clone())));
        let guard = ActiveGuard;
        let stmt = pg_sys::pg_plan_query(query, sql.as_ptr(), 0, std::ptr::null_mut());
        drop(guard);

        let top = without_subquery_scan((*stmt).planTree);
        (*stmt).planTree = top;
        if !is_node(top, &methods().block_scan) {
            // Known cause: a security_barrier view keeps a filter over it that is not leakproof
            // (a "where" with an ordinary function) in a subquery scan above its own.
            raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!(
                "corgipile cannot read {} with one block scan of its table",
                config.relation
            ),
            Some("A security_barrier view keeps a \"where\" filter that is not leakproof above its own qual: put the filter in the view, or train on a view without security_barrier. Otherwise this is a bug; please report it with the relation's definition.".into()),
        );
        }
        let private = config.to_list();
        let tuple = stack_node(top, &methods().tuple_scan, private, 1);
        let sgd = stack_node(tuple, &methods().sgd_scan, private, 2);
        (*stmt).planTree = sgd;
        stmt
    }
}

/// A security_barrier view is planned as a subquery scan over the scan of its table (its qual
/// in the table's scan, below anything from outside the view). When the subquery scan only
/// picks columns (no qual of its own: a "where" over the view was leakproof and went below it),
/// the table's scan computes those columns itself and is the plan; otherwise `plan` is returned.
unsafe fn without_subquery_scan(plan: *mut pg_sys::Plan) -> *mut pg_sys::Plan {
    if (*plan).type_ != pg_sys::NodeTag::T_SubqueryScan
        || !(*plan).qual.is_null()
        || !(*plan).initPlan.is_null()
    {
        return plan;
    }
    // SAFETY: a finished SubqueryScan: its targetlist's Vars (scanrelid) name columns of its
    // subplan's targetlist by position.
    let scan = plan.cast::<pg_sys::SubqueryScan>();
    let sub = (*scan).subplan;
    if !is_node(sub, &methods().block_scan) {
        return plan;
    }
    let outer = (*plan).targetlist;
    let inner = (*sub).targetlist;
    let mut tlist: *mut pg_sys::List = std::ptr::null_mut();
    for i in 0..(*outer).length as usize {
        let tle = (*(*outer).elements.add(i))
            .ptr_value
            .cast::<pg_sys::TargetEntry>();
        let var = (*tle).expr.cast::<pg_sys::Var>();
        if (*var).xpr.type_ != pg_sys::NodeTag::T_Var
            || (*var).varno as u32 != (*scan).scan.scanrelid
            || (*var).varattno < 1
            || (*var).varattno as i32 > (*inner).length
        {
            return plan;
        }
        let picked = (*(*inner).elements.add((*var).varattno as usize - 1))
            .ptr_value
            .cast::<pg_sys::TargetEntry>();
        let expr = pg_sys::copyObjectImpl((*picked).expr.cast()).cast::<pg_sys::Expr>();
        let entry = pg_sys::makeTargetEntry(expr, (i + 1) as i16, (*tle).resname, false);
        tlist = pg_sys::lappend(tlist, entry.cast());
    }
    (*sub).targetlist = tlist;
    sub
}

/// A CustomScan with scanrelid 0 over `child`, passing the child's columns through.
unsafe fn stack_node(
    child: *mut pg_sys::Plan,
    scan_methods: *const pg_sys::CustomScanMethods,
    private: *mut pg_sys::List,
    plan_node_id: i32,
) -> *mut pg_sys::Plan {
    let cscan = new_custom_scan();
    let plan = &mut (*cscan).scan.plan;
    plan.startup_cost = (*child).total_cost;
    plan.total_cost = (*child).total_cost;
    plan.plan_rows = 0.0;
    plan.plan_width = (*child).plan_width;
    plan.plan_node_id = plan_node_id;
    let mut scan_tlist: *mut pg_sys::List = std::ptr::null_mut();
    let mut tlist: *mut pg_sys::List = std::ptr::null_mut();
    let child_tlist = (*child).targetlist;
    for i in 0..(*child_tlist).length {
        let tle = (*(*child_tlist).elements.add(i as usize))
            .ptr_value
            .cast::<pg_sys::TargetEntry>();
        let expr = (*tle).expr.cast::<pg_sys::Node>();
        let (typ, typmod, coll) = (
            pg_sys::exprType(expr),
            pg_sys::exprTypmod(expr),
            pg_sys::exprCollation(expr),
        );
        let resno = (i + 1) as pg_sys::AttrNumber;
        let outer = pg_sys::makeVar(pg_sys::OUTER_VAR, resno, typ, typmod, coll, 0);
        scan_tlist = pg_sys::lappend(
            scan_tlist,
            pg_sys::makeTargetEntry(outer.cast(), resno, (*tle).resname, false).cast(),
        );
        let index = pg_sys::makeVar(pg_sys::INDEX_VAR, resno, typ, typmod, coll, 0);
        tlist = pg_sys::lappend(
            tlist,
            pg_sys::makeTargetEntry(index.cast(), resno, (*tle).resname, false).cast(),
        );
    }
    plan.targetlist = tlist;
    (*cscan).custom_scan_tlist = scan_tlist;
    (*cscan).scan.scanrelid = 0;
    (*cscan).custom_plans = pg_sys::lappend(std::ptr::null_mut(), child.cast());
    (*cscan).custom_private = private;
    (*cscan).methods = scan_methods;
    cscan.cast()
}
