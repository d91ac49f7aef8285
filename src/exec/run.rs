//! Running a pipeline plan: ExecutorStart, the SGD node's task inside ExecutorRun, and
//! ExecutorEnd. (Building the plan is `plan`'s; the nodes are this folder's.)

use crate::exec::node::state_of;
use crate::exec::plan::plan_pipeline;
use crate::exec::sgd::{SgdNode, SgdTask};
use crate::pg::error::raise;
use crate::pipeline::PipelineConfig;
use pgrx::{pg_sys, PgSqlErrorCode};
use std::cell::RefCell;
use std::ffi::CStr;
use std::rc::Rc;

/// A started executor for a pipeline plan. `finish` ends it; on ERROR, transaction abort
/// releases what it holds.
pub struct Pipeline {
    /// Started by `start` (the only constructor), not yet ended: `finish` consumes the pipeline.
    query_desc: *mut pg_sys::QueryDesc,
}

impl Pipeline {
    /// ExecutorStart on the plan: permission checks (SELECT on the columns) happen here.
    ///
    /// # Safety
    /// `stmt` is a PlannedStmt made by `plan_pipeline` in this transaction, whose memory lives
    /// until the pipeline is finished.
    pub unsafe fn start(
        stmt: *mut pg_sys::PlannedStmt,
        sql: &CStr,
        instrument: bool,
        explain_only: bool,
    ) -> Pipeline {
        // SAFETY: the source text must outlive the QueryDesc: copy it into the current context.
        let source = pg_sys::pstrdup(sql.as_ptr());
        let qd = pg_sys::CreateQueryDesc(
            stmt,
            source,
            pg_sys::GetActiveSnapshot(),
            std::ptr::null_mut(),
            pg_sys::None_Receiver,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            if instrument {
                pg_sys::InstrumentOption::INSTRUMENT_ALL as i32
            } else {
                0
            },
        );
        let eflags = if explain_only {
            pg_sys::EXEC_FLAG_EXPLAIN_ONLY as i32
        } else {
            0
        };
        pg_sys::ExecutorStart(qd, eflags);
        Pipeline { query_desc: qd }
    }

    /// The started QueryDesc (for EXPLAIN).
    pub fn query_desc(&self) -> *mut pg_sys::QueryDesc {
        self.query_desc
    }

    /// Runs the plan: the SGD node does its whole task on its first call.
    ///
    /// # Safety
    /// At most once per pipeline (it runs ExecutorFinish), on a pipeline not started
    /// `explain_only` (whose nodes are not set up to run).
    pub unsafe fn run(&self) {
        crate::pg::compat::executor_run_all(self.query_desc);
        pg_sys::ExecutorFinish(self.query_desc);
    }

    /// ExecutorEnd, run or not.
    pub fn finish(self) {
        // SAFETY: FFI calls on the backend thread, inside the transaction of the SQL call; the
        // QueryDesc was started by `start` and is ended once (`self` is consumed).
        unsafe {
            pg_sys::ExecutorEnd(self.query_desc);
            pg_sys::FreeQueryDesc(self.query_desc);
        }
    }

    /// The top (SGD) node.
    pub fn sgd_node(&mut self) -> &mut SgdNode {
        // SAFETY: the QueryDesc was started by `start` and not ended (`finish` consumes the
        // pipeline): its planstate is the plan's top node, an SGD node `plan_pipeline` stacked,
        // and its state is borrowed no longer than `self`.
        unsafe { state_of::<SgdNode>((*self.query_desc).planstate.cast()) }
    }

    /// Runs the plan with `task` for its SGD node and returns the task's output.
    ///
    /// # Safety
    /// As for [`run`](Self::run).
    pub unsafe fn run_task<T: SgdTask>(&mut self, task: T) -> T::Output {
        let node = self.sgd_node();
        if node.config().mode != T::MODE {
            raise(
                PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                "corgipile: a task ran on a plan built for another mode",
                None,
            );
        }
        let output: Rc<RefCell<Option<T::Output>>> = Rc::new(RefCell::new(None));
        let slot = output.clone();
        node.task = Some(Box::new(move |node| {
            let result = task.run(node);
            *slot.borrow_mut() = Some(result);
        }));
        self.run();
        let result = output.borrow_mut().take();
        result.unwrap_or_else(|| {
            raise(
                PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                "corgipile: the SGD node did not run its task",
                None,
            )
        })
    }
}

/// Plans, starts, runs and ends the pipeline over `relid` with `task`; returns its output. On
/// ERROR, transaction abort releases the executor's resources and the nodes' Rust state.
pub fn run<T: SgdTask>(
    relid: pg_sys::Oid,
    sql: &CStr,
    config: &PipelineConfig,
    task: T,
) -> T::Output {
    let stmt = plan_pipeline(relid, sql, config);
    // SAFETY: `stmt` was just planned in this transaction's memory; the pipeline is started
    // to run (not explain-only) and runs once.
    let mut pipeline = unsafe { Pipeline::start(stmt, sql, false, false) };
    // SAFETY: as above.
    let output = unsafe { pipeline.run_task(task) };
    pipeline.finish();
    output
}
