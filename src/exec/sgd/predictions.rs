//! After a one-server training: the stored model's predictions on a sample of rows, profiled
//! (`corgipile_ml::preprocess::profile::PredictionSketch`) for `corgipile_drift`'s
//! `(prediction)` row. The rows: the held-out validation rows when the training has them
//! (rows it did not train on), else one buffer read after the epochs (random blocks, shuffled;
//! in a training that reads in storage order only when that buffer holds every row). At most
//! [`MAX_PROFILED_ROWS`] of them are scored, evenly spread; the model and the training's
//! random streams are only read, never changed (the buffer is a pass of its own, after the
//! last epoch, as an `"inference"` pass is).

use super::collect::CollectedRows;
use super::SgdNode;
use crate::pipeline::{FeatureLayout, Trial, ValidationSplit};
use corgipile_ml::arena::TupleArena;
use corgipile_ml::model::Predictor;
use corgipile_ml::params::ShuffleMode;
use corgipile_ml::preprocess::profile::{ColumnProfile, PredictionSketch};
use corgipile_ml::trained::Model;
use pgrx::{check_for_interrupts, pg_sys};

/// Rows scored at most per model: corgipile_drift's default sample (two samples of one
/// distribution then differ by a PSI of about 0.0002), a fraction of an epoch's work.
const MAX_PROFILED_ROWS: usize = 50_000;

/// The name of the predictions' profile (corgipile_drift's row).
pub const PREDICTION: &str = "(prediction)";

impl SgdNode {
    /// Each stored model's predictions profile (`TrainOutcome::predictions`), for models with
    /// a column list's learned profile; per-group models are not profiled (corgipile_drift
    /// refuses them).
    ///
    /// # Safety
    /// Inside the executor run of the training, on the backend, after its epochs (and any
    /// `"inference"` passes): the child may be rescanned.
    pub(super) unsafe fn profile_predictions(
        &mut self,
        trials: &mut [Trial],
        validation_rows: Option<&CollectedRows>,
    ) {
        let profiled = |t: &Trial| {
            t.group.is_none()
                && t.outcome.as_ref().is_ok_and(|o| {
                    o.preprocessing
                        .as_ref()
                        .is_some_and(|p| p.profile.is_some())
                })
        };
        if self.config.layout != FeatureLayout::Tabular
            || self.config.params.group_by.is_some()
            || !trials.iter().any(profiled)
        {
            return;
        }
        let boolean = self.config.label.is_boolean();
        let score = |arena: &TupleArena, trials: &mut [Trial]| {
            for trial in trials.iter_mut().filter(|t| profiled(t)) {
                let Ok(outcome) = trial.outcome.as_mut() else {
                    continue;
                };
                let names: Vec<String> = outcome.classes.iter().map(|c| c.name(boolean)).collect();
                let summary = profile(&outcome.model, names, arena);
                outcome.predictions = summary.map(|summary| ColumnProfile {
                    name: PREDICTION.into(),
                    summary,
                });
            }
        };
        // Rows the training held out: already in memory.
        if let Some(v) = validation_rows {
            return score(&v.rows.arena, trials);
        }
        if self.config.validation_split != ValidationSplit::None {
            // SAFETY: the child's TupleShuffle state lives as long as this node (see
            // `shuffle`); no other reference to it is in use here.
            if let Some(held_out) = self.shuffle().rows().validation() {
                score(held_out, trials);
            }
            return;
        }
        // Else one buffer of a new pass (a rescan draws a new block order; the training's
        // streams are done).
        let trained = trials
            .iter()
            .filter_map(|t| t.outcome.as_ref().ok())
            .map(|o| o.rows_trained)
            .max()
            .unwrap_or(0);
        // SAFETY: the child is this node's initialized TupleShuffle (see `# Safety`); a rescan
        // after the epochs is what an "inference" pass does; the buffer is read on this (the
        // backend's) thread.
        pg_sys::ExecReScan(self.child);
        let Some(buffer) = self.shuffle().next_buffer(None) else {
            return;
        };
        let random = matches!(
            self.config.params.shuffle,
            ShuffleMode::Corgipile | ShuffleMode::BlockOnly
        );
        // Storage order: the first buffer is a sample only when it is every row.
        if random || buffer.arena.len() as u64 >= trained {
            score(&buffer.arena, trials);
        }
    }
}

/// The predictions of `model` on at most [`MAX_PROFILED_ROWS`] of `arena`'s rows (every k-th),
/// summarised; None without rows. `names`: a classifier's classes, in the model's order.
fn profile(
    model: &Model,
    names: Vec<String>,
    arena: &TupleArena,
) -> Option<corgipile_ml::preprocess::profile::Summary> {
    if arena.is_empty() {
        return None;
    }
    let classifier = model.kind().is_classifier();
    let mut sketch = match classifier {
        true => PredictionSketch::classes(names.len()),
        false => PredictionSketch::number(),
    };
    let step = arena.len().div_ceil(MAX_PROFILED_ROWS);
    for (k, i) in (0..arena.len()).step_by(step).enumerate() {
        if k % 1024 == 0 {
            check_for_interrupts!();
        }
        let row = arena.row(i);
        match classifier {
            true => sketch.push_class(model.class_index(row)),
            false => sketch.push_number(model.predict(row)),
        }
    }
    Some(sketch.finish(names))
}
