//! corgipile_drift's read: the first buffer of a block-sampled scan (`rows` tuples from random
//! blocks), each input column counted by the decoder as it decodes (see
//! `RowDecoder::count_columns`), each row's label and prediction counted here.

use super::{SgdNode, SgdTask};
use crate::catalog::StoredModel;
use crate::pipeline::Mode;
use corgipile_ml::drift::Counter;
use corgipile_ml::model::Predictor;
use corgipile_ml::row::Row;
use pgrx::check_for_interrupts;
use std::rc::Rc;

/// The counters a drift read fills: the columns' (a column list's, one per column), the
/// label's, the predictions', and an array model's features'.
pub struct DriftCounters {
    pub columns: Option<Vec<Counter>>,
    pub label: Counter,
    pub predictions: Counter,
    pub features: Option<Counter>,
    /// Rows read (the sample).
    pub rows: u64,
}

/// Reads up to `rows` rows into `counters` (the scan's buffer holds `rows` tuples: the caller
/// sets its size).
pub struct DriftRead {
    pub rows: usize,
    pub model: Rc<StoredModel>,
    pub counters: DriftCounters,
}

impl SgdTask for DriftRead {
    type Output = DriftCounters;
    const MODE: Mode = Mode::Evaluate;

    unsafe fn run(self, node: &mut SgdNode) -> DriftCounters {
        let DriftRead {
            rows,
            model,
            mut counters,
        } = self;
        let shuffle = node.shuffle();
        if let Some(columns) = counters.columns.take() {
            shuffle.rows_mut().count_columns(columns);
        }
        let classifier = model.kind().is_classifier();
        let mut read = 0usize;
        let mut spare = None;
        while read < rows {
            let Some(b) = shuffle.next_buffer(spare.take()) else {
                break;
            };
            let decoder = shuffle.rows();
            let arena = &b.arena;
            let n = arena.len().min(rows - read);
            for i in 0..n {
                check_for_interrupts!();
                let row = arena.row(i);
                let label = arena.label(i);
                if classifier {
                    counters
                        .label
                        .text(Some(decoder.label_name(label).as_bytes()));
                    let class = model.class_index(row);
                    let name = if class < model.classes.len() {
                        model.class_text(class)
                    } else {
                        "(other)".into()
                    };
                    counters.predictions.text(Some(name.as_bytes()));
                } else {
                    counters.label.number(Some(label));
                    counters.predictions.number(Some(model.model.predict(row)));
                }
                if let (Some(f), Row::Dense(x)) = (counters.features.as_mut(), row) {
                    f.array(Some(x));
                }
            }
            read += n;
            spare = Some(b);
        }
        counters.columns = shuffle.rows_mut().take_column_counts();
        counters.rows = read as u64;
        counters
    }
}
