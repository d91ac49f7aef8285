//! corgipile_feature_importance's work on one server or one shard: the bounds every call is
//! checked against before any work, and a sample's scores as it is and with each column
//! permuted (the math is `corgipile_ml::importance`).

use super::SampledRows;
use crate::pg::error::raise;
use crate::pipeline::protocol_parts::{ImportanceAsk, ImportancePart};
use corgipile_ml::importance::permuted_scores;
use corgipile_ml::model::Predictor;
use corgipile_ml::row::Row;
use corgipile_ml::scoring::Evaluation;
use corgipile_ml::trained::Model;
use corgipile_ml::Welford;
use pgrx::{check_for_interrupts, PgSqlErrorCode};
use std::ops::Range;

const FUNCTION: &str = "corgipile_feature_importance";
/// Predictions a call may make (columns × repeats × rows): about a minute of a linear model's.
const MAX_PREDICTIONS: u64 = 2_000_000_000;

/// ERROR 54000 before any work if sampling `rows` rows of `n_features` features and scoring
/// them with each of `columns` columns permuted `repeats` times makes more than
/// MAX_PREDICTIONS predictions, or the sample and its permuted copy need more than
/// corgipile.max_buffer_memory. `model`: "model 5", for the message.
pub fn check_cost(model: &str, columns: usize, repeats: u64, rows: u64, n_features: usize) {
    let predictions = (columns as u64)
        .saturating_mul(repeats)
        .saturating_add(1)
        .saturating_mul(rows);
    if predictions > MAX_PREDICTIONS {
        raise(
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!("{FUNCTION} of {model} would make {predictions} predictions ({columns} columns × {repeats} repeats × {rows} rows), more than {MAX_PREDICTIONS}"),
            Some("Ask for fewer \"rows\" or \"repeats\".".into()),
        );
    }
    // The sample and its permuted copy, in memory.
    let bytes = rows.saturating_mul(n_features as u64).saturating_mul(16);
    if bytes > crate::pg::guc::max_buffer_bytes() {
        raise(
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!(
                "{FUNCTION}: {rows} rows of {model}'s {n_features} features need {}, more than corgipile.max_buffer_memory ({})",
                corgipile_ml::limits::pretty_bytes(bytes),
                corgipile_ml::limits::pretty_bytes(crate::pg::guc::max_buffer_bytes()),
            ),
            Some("Ask for fewer \"rows\".".into()),
        );
    }
}

/// The scores of `model` on `sample` as it is and with each column of `ranges` permuted among
/// its rows (`ask`'s repeats and seed), and the moments of each column's first feature (for
/// the standardized coefficients): what one server, or one shard, contributes.
pub fn score_sample(
    model: &Model,
    n_classes: usize,
    sample: &SampledRows,
    ranges: &[Range<usize>],
    ask: ImportanceAsk,
) -> ImportancePart {
    let kind = model.kind();
    let score = |x: &[f64]| {
        let mut evaluation = Evaluation::new(kind, n_classes, sample.binary, 0);
        for (row, &label) in x.chunks(sample.width).zip(&sample.labels) {
            // Every row: one row of a large network is a million multiply-adds, and the check
            // is one load of a flag.
            check_for_interrupts!();
            evaluation.push(model, Row::Dense(row), label);
        }
        evaluation.score_part()
    };
    let (baseline, permuted) = permuted_scores(
        &sample.features,
        sample.width,
        ranges,
        ask.repeats as usize,
        ask.seed,
        score,
    );
    let moments = ranges
        .iter()
        .map(|r| {
            // A pass over the sample per column: thousands of columns add up.
            check_for_interrupts!();
            let mut m = Welford::new();
            for x in sample.features.chunks(sample.width) {
                m.push(x[r.start]);
            }
            m
        })
        .collect();
    ImportancePart {
        baseline,
        permuted,
        moments,
    }
}
