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
    pub query_desc: *mut pg_sys::QueryDesc,
}

impl Pipeline {
    /// ExecutorStart on the plan: permission checks (SELECT on the columns) happen here.
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

    /// Runs the plan: the SGD node does its whole task on its first call.
    pub unsafe fn run(&self) {
        crate::pg::compat::executor_run_all(self.query_desc);
        pg_sys::ExecutorFinish(self.query_desc);
    }

    pub unsafe fn finish(self) {
        pg_sys::ExecutorEnd(self.query_desc);
        pg_sys::FreeQueryDesc(self.query_desc);
    }

    /// The top (SGD) node.
    pub unsafe fn sgd_node(&mut self) -> &mut SgdNode {
        state_of::<SgdNode>((*self.query_desc).planstate.cast())
    }

    /// Runs the plan with `task` for its SGD node and returns the task's output.
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

/// Plans, starts, runs and ends the pipeline over `relid` with `task`; returns its output.
///
/// # Safety
/// Backend thread, inside a transaction with an active snapshot (a SQL function's call). On
/// ERROR, transaction abort releases the executor's resources and the nodes' Rust state.
pub unsafe fn run<T: SgdTask>(
    relid: pg_sys::Oid,
    sql: &CStr,
    config: &PipelineConfig,
    task: T,
) -> T::Output {
    let stmt = plan_pipeline(relid, sql, config);
    let mut pipeline = Pipeline::start(stmt, sql, false, false);
    let output = pipeline.run_task(task);
    pipeline.finish();
    output
}
