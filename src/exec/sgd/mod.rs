//! CorgiPile SGD, the top node: pulls shuffled buffers from TupleShuffle and does what its
//! task says — train (one epoch per pass, rescanning its child between epochs, which draws a
//! new block order and a new tuple shuffle), evaluate, collect or trace. Each task is its own
//! type in its own file, carrying its input and returning its output (`SgdTask`), so no task
//! can read another's result.

mod collect;
mod divergence;
mod double_buffer;
mod drift;
mod epoch_loop;
mod epochs;
mod evaluate;
mod importance;
mod inference;
mod learn;
mod predictions;
mod shape;
mod shard_learners;
mod shard_round;
mod side_by_side;
mod statistics;
mod trace;
mod train;

pub use crate::pipeline::LearnedStatistics;
pub use collect::{Collect, CollectedRows, SampleRows, SampledRows};
pub(crate) use divergence::raise_diverged;
pub use drift::{DriftCounters, DriftRead};
pub use evaluate::{
    binary_labels, check_group_counts, groups_report, Evaluate, EvaluateGroupsShard, EvaluateShard,
    EvaluateTables,
};
pub use importance::{check_cost, score_sample};
pub use inference::check_inference_params;
pub(crate) use inference::{
    check_information_size, family_of, polish, start_information, store as store_inference,
    SIZE_HINT as INFERENCE_SIZE_HINT,
};
pub use learn::Learn;
pub use predictions::PREDICTION;
pub use shape::{checked_learner, checked_size, inputs_only};
pub use shard_round::{
    forget_kept, held_out_ids, score_held_out, score_rows, ShardRound, TrainingTable,
};
pub(crate) use side_by_side::{check_family_memory, groups_notice, PER_MODEL_BYTES};
pub use trace::Trace;
pub use train::{Train, Trained};

use super::explain;
use super::node::{init_child, state_of, Node};
use super::tuple_shuffle::TupleShuffle;
use crate::pg::error::raise;
use crate::pg::progress;
use crate::pipeline::{EpochCounts, Mode, PipelineConfig, PreprocessSpec};
use corgipile_ml::model::ModelKind;
use corgipile_ml::params::{Patience, ScheduleKind, TrainParams, AUTO_PATIENCE_ROWS};
use corgipile_ml::trainer::{EpochStats, Stopped};
use pgrx::{pg_sys, PgSqlErrorCode};

/// What the SGD node does in one run of the executor: its input is the task value, its output
/// comes back from `run` (see `crate::exec::run`).
pub trait SgdTask: 'static {
    type Output: 'static;
    /// The mode the plan must have been built for (TupleShuffle reads it too).
    const MODE: Mode;
    /// Runs on the node's first ExecCustomScan call, on the backend thread.
    ///
    /// # Safety
    /// Called inside ExecutorRun of the pipeline plan, with the node's child initialized.
    unsafe fn run(self, node: &mut SgdNode) -> Self::Output;
}

/// A task installed by the driver, with a place to put its output.
pub type PendingTask = Box<dyn FnOnce(&mut SgdNode)>;

pub struct SgdNode {
    config: PipelineConfig,
    child: *mut pg_sys::PlanState,
    /// Set by the driver before ExecutorRun; taken (and run) by the first ExecCustomScan.
    pub task: Option<PendingTask>,
    /// Whether to write a progress NOTICE per epoch (off for EXPLAIN ANALYZE).
    pub verbose: bool,
    /// Clears the pg_stat_activity progress state when the query ends or fails.
    progress: Option<progress::Tracker>,
    /// Binary models: the trainer's (negative, positive) labels after the last epoch.
    binary_labels: Option<(f64, f64)>,
    // What EXPLAIN ANALYZE reports of a training.
    epoch_seconds: Vec<f64>,
    /// The statistics pass before the epochs, if any (EXPLAIN ANALYZE).
    statistics_seconds: Option<f64>,
    /// The label's mean and variance from the statistics pass (a regression network's target
    /// is standardized by them).
    label_moments: Option<(f64, f64)>,
    /// A parallel worker whose leader holds every validation row (see `LearnedStatistics`).
    validation_elsewhere: bool,
    /// Classifiers: each label value's rows from the statistics pass (a search of
    /// `class_weight` weighs each configuration's classes from them).
    class_counts: Option<Vec<(f64, u64)>>,
    /// The widest row the statistics pass met (a sparse network's input width without
    /// "n_features").
    stats_width: Option<usize>,
    /// What training the model holds, for families sized by the statistics pass (EXPLAIN
    /// ANALYZE).
    model_size: Option<corgipile_ml::learner::TrainingSize>,
    backend_wait_seconds: f64,
    worker_busy_seconds: f64,
    last_stats: Option<EpochStats>,
    epochs_run: u32,
    /// Why the training stopped on its validation loss, when it did (EXPLAIN ANALYZE).
    stopped: Option<Stopped>,
    /// Parallel training (EXPLAIN ANALYZE): workers asked for and started, and each process's
    /// rows in the last epoch (the leader's first).
    workers_planned: u32,
    workers_launched: u32,
    rows_per_process: Vec<u64>,
    /// `"warm_start"` (a training): the stored model the learners start from.
    pub(crate) warm_start: Option<crate::catalog::warm_start::WarmStart>,
    /// The rows the first epoch read (every process's): every later pass must read the same.
    first_epoch: Option<EpochCounts>,
}

impl SgdNode {
    pub fn config(&self) -> &PipelineConfig {
        &self.config
    }

    /// SAFETY: our plan always has TupleShuffle as this node's only child.
    unsafe fn shuffle<'a>(&self) -> &'a mut TupleShuffle {
        state_of::<TupleShuffle>(self.child.cast())
    }

    /// A warm start whose model does not fit the rows (another width, or classes it never
    /// saw).
    fn warm_start_misfit(&self, n_features: usize) -> ! {
        let warm = self.warm_start.as_ref().expect("a warm start");
        // SAFETY: the child state outlives this borrow.
        let classes = unsafe { self.shuffle().rows().classes().classes.len() };
        warm.raise_misfit(&self.config.relation, n_features, classes)
    }

    /// A pass (`pass`: "epoch 3", "Newton pass 2 of \"inference\"") read `read` rows where
    /// the first epoch read `first`. One snapshot gives every pass the same rows, unless a
    /// filter of the rows is not repeatable: the user's to fix, so a user's ERROR (not a bug).
    /// A pass (`counts`) read other rows than the first epoch (`first`).
    fn rows_changed(&self, pass: &str, counts: &EpochCounts, first: &EpochCounts) -> ! {
        let (read, first_read) = (
            counts.rows + counts.rows_skipped,
            first.rows + first.rows_skipped,
        );
        let what = if read == first_read {
            format!("read {read} rows, as many as the first epoch but not the same ones")
        } else {
            format!("read {read} rows, the first epoch {first_read}")
        };
        raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "{pass} of the training on {} {what}: the rows that pass its filters changed between passes",
                self.config.relation
            ),
            Some("Every epoch must read the same rows. A filter is not repeatable: a view's WHERE, a row-level security policy, or a function in \"where\" or the validation predicate that calls random() or reads data that changes (a function labelled IMMUTABLE or STABLE must really be so). Make the filter deterministic, or train on a copy (CREATE TABLE ... AS SELECT ...).".into()),
        )
    }

    fn no_rows(&self, skipped: u64) -> ! {
        if skipped > 0 {
            raise(
                PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
                format!(
                    "all {skipped} rows of {} were skipped (NULL label, NULL or empty features)",
                    self.config.relation
                ),
                Some("Rows need a non-NULL label and non-NULL, non-empty features.".into()),
            );
        }
        if let Some(filter) = &self.config.params.filter {
            raise(
                PgSqlErrorCode::ERRCODE_NO_DATA_FOUND,
                format!(
                    "no row of {} to train on passes the \"where\" filter {filter}",
                    self.config.relation
                ),
                Some("Check the filter with SELECT count(*) ... WHERE <filter>; row-level security policies (or the validation split) may hide the rows it selects.".into()),
            );
        }
        raise(
            PgSqlErrorCode::ERRCODE_NO_DATA_FOUND,
            format!("{} has no rows to train on", self.config.relation),
            Some("The table is empty, or row-level security policies (or the validation split) hide every row.".into()),
        );
    }

    /// Renders a trainer label as the table shows it (class indices → class values).
    fn label_text(&self) -> impl Fn(f64) -> String + '_ {
        // SAFETY: the child state outlives this borrow (both live until the query ends).
        let classes = unsafe { self.shuffle().rows().classes() };
        let label = self.config.label;
        move |v: f64| {
            if label.uses_classes() && v >= 0.0 && (v as usize) < classes.len() {
                classes.classes[v as usize].to_text()
            } else {
                label.value_text(v)
            }
        }
    }
}

impl Node for SgdNode {
    const NAME: &'static std::ffi::CStr = c"CorgiPile SGD";

    fn exec_methods() -> &'static pg_sys::CustomExecMethods {
        &super::methods().sgd_exec
    }

    unsafe fn begin(
        css: *mut pg_sys::CustomScanState,
        estate: *mut pg_sys::EState,
        eflags: i32,
        config: PipelineConfig,
    ) -> Self {
        let child = init_child(css, estate, eflags);
        SgdNode {
            verbose: config.params.verbose,
            config,
            child,
            task: None,
            progress: None,
            binary_labels: None,
            epoch_seconds: Vec::new(),
            statistics_seconds: None,
            label_moments: None,
            class_counts: None,
            validation_elsewhere: false,
            stats_width: None,
            model_size: None,
            backend_wait_seconds: 0.0,
            worker_busy_seconds: 0.0,
            last_stats: None,
            epochs_run: 0,
            stopped: None,
            workers_planned: 0,
            workers_launched: 0,
            rows_per_process: Vec::new(),
            warm_start: None,
            first_epoch: None,
        }
    }

    /// Runs the task on the first call; returns no rows.
    unsafe fn exec(&mut self, _css: *mut pg_sys::CustomScanState) -> *mut pg_sys::TupleTableSlot {
        if let Some(task) = self.task.take() {
            task(self);
        }
        std::ptr::null_mut()
    }

    /// Training again from scratch would be a new training: not supported inside one plan.
    unsafe fn rescan(&mut self) {
        self.task = None;
    }

    unsafe fn end(&mut self) {
        pg_sys::ExecEndNode(self.child);
    }

    unsafe fn explain(&self, es: *mut pg_sys::ExplainState) {
        let state = self;
        let p = &state.config.params;
        explain::text(es, "Model", state.config.model.name());
        explain::int(es, "Epochs", p.epochs as i64);
        let schedule = match p.learning_rate_schedule {
            ScheduleKind::Constant => "constant".to_string(),
            ScheduleKind::Exponential => format!("x{} per epoch", p.decay),
            ScheduleKind::InverseSqrt => "divided by sqrt(epoch)".to_string(),
        };
        explain::text(
            es,
            "Learning Rate",
            &format!("{} ({schedule})", p.learning_rate),
        );
        explain_family(es, state.config.model, p);
        if let Some(search) = &p.search {
            let searched: Vec<String> = search
                .grid
                .iter()
                .map(|(key, values)| format!("{key} {}", serde_json::Value::Array(values.clone())))
                .collect();
            explain::text(
                es,
                "Search",
                &format!(
                    "{} configurations side by side ({}), best by validation {}",
                    p.n_configurations(),
                    searched.join(", "),
                    p.selection(state.config.model).name()
                ),
            );
        }
        if let Some(folds) = p.folds {
            explain::text(
                es,
                "Folds",
                &format!("{folds} (a model per fold beside the model of every row)"),
            );
        }
        if let Some(columns) = &p.group_by {
            explain::text(
                es,
                "Groups",
                &format!(
                    "a model per group of {} with at least {} rows, beside the model of every row",
                    columns.join(", "),
                    p.min_group_rows.unwrap_or(1)
                ),
            );
        }
        if p.inference {
            explain::text(
                es,
                "Inference",
                "Newton passes after the epochs (standard errors, p-values)",
            );
        }
        match p.patience {
            Some(Patience::Epochs(n)) => explain::int(es, "Patience", n as i64),
            Some(Patience::Auto) => explain::text(
                es,
                "Patience",
                &format!(
                    "auto (about {AUTO_PATIENCE_ROWS} training rows, 2 to 10 epochs, at most {} epochs)",
                    p.epochs
                ),
            ),
            None => {}
        }
        if p.l1 > 0.0 {
            explain::float(es, "L1", None, p.l1, 6);
        }
        if p.normalize {
            explain::boolean(es, "Normalize", true);
        }
        if p.average {
            let from = if p.epochs >= 2 { 2 } else { 1 };
            explain::text(es, "Average Iterates", &format!("from epoch {from}"));
        }
        if let Some(PreprocessSpec::Learn { plans, .. }) = &state.config.preprocess {
            explain::int(es, "Feature Columns", plans.len() as i64);
        }
        if p.validation.is_some() {
            // As the params write it: {"fraction": 0.1}, {"predicate": ...}, {"relation": ...}.
            explain::text(es, "Validation", &p.to_json()["validation"].to_string());
        }
        explain::int(es, "Batch Size", p.batch_size as i64);
        if p.workers > 0 {
            explain::int(es, "Workers Planned", p.workers as i64);
        }
        explain::float(es, "L2", None, p.l2, 6);
        if p.tolerance > 0.0 {
            explain::float(es, "Tolerance", None, p.tolerance, 6);
        }
        if explain::analyzing(es) {
            explain::int(es, "Epochs Run", state.epochs_run as i64);
            if let Some(stopped) = state.stopped {
                explain::text(
                    es,
                    "Stopped Early",
                    &format!(
                        "no lower validation loss for {} epochs; kept epoch {}",
                        stopped.patience, stopped.best_epoch
                    ),
                );
            }
            if let Some(stats) = &state.last_stats {
                explain::float(es, "Final Loss", None, stats.loss, 6);
                if let Some(a) = stats.accuracy {
                    explain::float(es, "Final Training Accuracy", None, a, 4);
                }
                if let Some(r2) = stats.r2 {
                    explain::float(es, "Final Training R2", None, r2, 4);
                }
                explain::int(es, "Tuples Per Epoch", stats.tuples as i64);
            }
            if let Some(size) = &state.model_size {
                explain::text(es, size.shown.0, &size.shown.1);
                explain::int(es, "Parameters", size.n_params as i64);
            }
            if let Some(t) = state.statistics_seconds {
                explain::float(es, "Statistics Pass", Some("ms"), t * 1000.0, 3);
            }
            if let Some(prep) = state.shuffle().rows().preprocessor() {
                explain::int(es, "Encoded Features", prep.n_features as i64);
            }
            if state.workers_planned > 0 {
                explain::int(es, "Workers Launched", state.workers_launched as i64);
            }
            if state.rows_per_process.len() > 1 {
                let rows: Vec<String> = state
                    .rows_per_process
                    .iter()
                    .enumerate()
                    .map(|(i, r)| match i {
                        0 => format!("leader {r}"),
                        _ => format!("worker {i} {r}"),
                    })
                    .collect();
                explain::text(es, "Rows Per Process", &rows.join(", "));
            }
            let times: Vec<String> = state
                .epoch_seconds
                .iter()
                .map(|s| format!("{:.3}", s * 1000.0))
                .collect();
            explain::text(es, "Epoch Times (ms)", &times.join(", "));
            if p.double_buffer {
                explain::float(es, "Worker Busy", Some("s"), state.worker_busy_seconds, 3);
                explain::float(
                    es,
                    "Backend Waiting On Worker",
                    Some("s"),
                    state.backend_wait_seconds,
                    3,
                );
            }
        }
    }
}

/// The EXPLAIN lines of the params only `kind`'s family takes (a network's hidden layers and
/// optimizer).
///
/// # Safety
/// `es` is a valid ExplainState whose output has begun and not ended.
pub(crate) unsafe fn explain_family(
    es: *mut pg_sys::ExplainState,
    kind: ModelKind,
    p: &TrainParams,
) {
    for (label, text) in kind.family().explain_params(p) {
        explain::text(es, label, &text);
    }
}
