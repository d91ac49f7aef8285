//! Learn mode: the statistics pass of a list of columns on its own, before a training that
//! needs the preprocessing up front (a validation relation is encoded with it before the
//! training's first epoch).

use super::{SgdNode, SgdTask};
use crate::pipeline::Mode;
use corgipile_ml::preprocess::Preprocessor;
use pgrx::check_for_interrupts;

/// The preprocessing the statistics of the relation's rows give.
pub struct Learn;

impl SgdTask for Learn {
    type Output = Preprocessor;
    const MODE: Mode = Mode::Train;

    unsafe fn run(self, node: &mut SgdNode) -> Preprocessor {
        let shuffle = node.shuffle();
        let mut rows = 0u64;
        shuffle.for_each_buffer(|b| {
            check_for_interrupts!();
            rows += b.arena.len() as u64;
        });
        if rows == 0 {
            node.no_rows(shuffle.counts().rows_skipped)
        }
        let classes = shuffle.rows().classes().len();
        shuffle.rows_mut().finish_statistics(classes, true);
        shuffle
            .rows()
            .preprocessor()
            .cloned()
            .expect("the statistics pass fixed the preprocessing")
    }
}
