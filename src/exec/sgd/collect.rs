//! Collect mode: every row of a relation in one arena (a validation relation, read before
//! training with the same block scan and decoding).

use super::{SgdNode, SgdTask};
use crate::decode::classes::ClassValue;
use crate::exec::tuple_shuffle::ShuffledBuffer;
use crate::pg::error::raise;
use crate::pipeline::Mode;
use corgipile_ml::arena::TupleArena;
use corgipile_ml::row::Row;
use pgrx::PgSqlErrorCode;

/// Every row of a relation, and the class of each class index its labels got.
pub struct CollectedRows {
    pub rows: ShuffledBuffer,
    pub classes: Vec<ClassValue>,
}

/// Collect every row; None when the relation has no usable row.
pub struct Collect;

impl SgdTask for Collect {
    type Output = Option<CollectedRows>;
    const MODE: Mode = Mode::Collect;

    unsafe fn run(self, node: &mut SgdNode) -> Option<CollectedRows> {
        node.collect()
    }
}

impl SgdNode {
    /// Collect mode: every row in one arena (a validation relation), bounded by the buffer limit.
    unsafe fn collect(&mut self) -> Option<CollectedRows> {
        let shuffle = self.shuffle();
        let mut all: Option<ShuffledBuffer> = None;
        shuffle.for_each_buffer(|b| {
            let dst = all.get_or_insert_with(|| ShuffledBuffer {
                arena: if b.arena.is_sparse() {
                    TupleArena::new_sparse(0, 0)
                } else {
                    TupleArena::new(b.arena.n_features(), 0)
                },
                order: Vec::new(),
            });
            for i in 0..b.arena.len() {
                match b.arena.row(i) {
                    Row::Dense(x) => dst.arena.push(b.arena.label(i), x),
                    Row::Sparse { indices, values } => {
                        dst.arena.push_sparse(b.arena.label(i), indices, values)
                    }
                }
            }
            if dst.arena.bytes_used() as u64 > self.config.max_buffer_bytes {
                raise(
                    PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                    format!(
                        "the validation relation {} does not fit in corgipile.max_buffer_memory",
                        self.config.relation
                    ),
                    Some(
                        "Use a smaller validation relation, or {\"fraction\": ...} validation."
                            .into(),
                    ),
                );
            }
        });
        all.map(|rows| CollectedRows {
            rows,
            classes: shuffle.rows().classes().classes.clone(),
        })
    }
}
