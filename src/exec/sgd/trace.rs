//! Trace mode (corgipile_trace): the order in which SGD would see the rows in epoch 1.

use super::{SgdNode, SgdTask};
use crate::pg::error::raise;
use crate::pipeline::Mode;
use corgipile_ml::row::Row;
use pgrx::{check_for_interrupts, pg_sys, PgSqlErrorCode};

/// The (label, first feature) of every tuple, in visiting order.
pub struct Trace;

impl SgdTask for Trace {
    type Output = Vec<(f64, f64)>;
    const MODE: Mode = Mode::Trace;

    unsafe fn run(self, node: &mut SgdNode) -> Vec<(f64, f64)> {
        node.trace()
    }
}

impl SgdNode {
    /// corgipile_trace: the (label, first feature) of every tuple, in the order SGD would
    /// see them in epoch 1.
    unsafe fn trace(&mut self) -> Vec<(f64, f64)> {
        let shuffle = self.shuffle();
        if shuffle.rows().is_learning() {
            // A column list: as a training does, learn the preprocessing in a statistics pass
            // first (until then its rows are not encoded), then trace the pass after it.
            let mut rows = 0usize;
            shuffle.for_each_buffer(|b| rows += b.arena.len());
            if rows == 0 {
                self.no_rows(shuffle.counts().rows_skipped)
            }
            let classes = shuffle.rows().classes().len();
            shuffle
                .rows_mut()
                .finish_statistics(classes, self.config.params.fit_intercept);
            pg_sys::ExecReScan(self.child);
        }
        let mut visited = Vec::new();
        shuffle.for_each_buffer(|b| {
            let (arena, order) = b.visit();
            for k in 0..arena.len() {
                check_for_interrupts!();
                let i = order.map_or(k, |o| o[k] as usize);
                let first = match arena.row(i) {
                    Row::Dense(x) => x.first().copied().unwrap_or(f64::NAN),
                    Row::Sparse { indices, values } => {
                        if indices.first() == Some(&0) { values[0] } else { 0.0 }
                    }
                };
                visited.push((arena.label(i), first));
            }
            if (visited.len() * std::mem::size_of::<(f64, f64)>()) as u64 > self.config.max_buffer_bytes {
                raise(
                    PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                    format!("the trace of {} does not fit in corgipile.max_buffer_memory", self.config.relation),
                    Some("corgipile_trace is meant for small tables; trace a sample (CREATE TABLE ... AS SELECT ... LIMIT).".into()),
                );
            }
        });
        visited
    }
}
