//! One buffer's work for the learners of a [`Trials`](super::Trials): training each learner on
//! its rows (whole, chunk by chunk, a fold's complement, a group's), scoring held-out folds,
//! and how often the thread doing it asks for an interrupt ([`Pace`]).

use std::time::Instant;

use super::{Scoring, Trial};
use crate::arena::TupleArena;
use crate::learner::Learner;
use crate::model::Labels;
use crate::scoring::{BinaryLabels, ValidationScore};
use crate::standardize::Standardizer;
use crate::trainer::TrainError;

/// The work one thread did for its share of learners since it last asked an interrupt check
/// (every learner's check reads the same stop flag). A learner asks on its own every
/// WORK_BETWEEN_CHECKS of its own work; thousands of learners, each trained on a chunk or
/// scoring a fold in turn, would each do that much before asking — seconds in all.
#[derive(Default)]
pub(super) struct Pace {
    work: usize,
}

impl Pace {
    /// `work` multiply-adds done for `learner`; its check is asked once they add up.
    fn add(&mut self, work: usize, learner: &mut Learner) -> Result<(), TrainError> {
        self.work += work;
        if self.work < crate::trainer::WORK_BETWEEN_CHECKS {
            return Ok(());
        }
        self.work = 0;
        learner.check_interrupt()
    }
}

/// What every learner reads of one buffer.
pub(super) struct BufferWork<'a> {
    pub(super) arena: &'a TupleArena,
    pub(super) order: Option<&'a [u32]>,
    pub(super) row_folds: &'a [usize],
    pub(super) fold_rows: &'a [Vec<u32>],
    pub(super) group_rows: &'a [Vec<u32>],
    pub(super) scoring: Option<&'a Scoring>,
}

impl BufferWork<'_> {
    /// Trains `t` on the buffer (without the rows of the fold it holds out; `kept`: scratch),
    /// then, while scoring, scores that fold's rows. With `chunk`, see [`BufferWork::train_many`].
    pub(super) fn train(
        &self,
        t: &mut Trial,
        kept: &mut Vec<u32>,
        pace: &mut Pace,
    ) -> Result<(), TrainError> {
        let started = Instant::now();
        let result = self.train_rows(t, self.order, kept).and_then(|()| {
            let rows = match t.group {
                Some(g) => self.group_rows.get(g as usize).map_or(0, Vec::len),
                None => self.order.map_or(self.arena.len(), <[u32]>::len),
            };
            pace.add(rows * self.row_cost(), &mut t.learner)?;
            self.score_fold(t, pace)
        });
        t.seconds += started.elapsed().as_secs_f64();
        result
    }

    /// Trains linear learners that read every row (or every row but a fold's) chunk by chunk
    /// of the buffer's order, every learner on a chunk before the next: a chunk is read from
    /// memory once and stays in cache for all of them (each learner on its own reads the whole
    /// buffer in shuffled order, a cache miss a row). With `scaling` (every learner's own
    /// standardizer, the same for all), a chunk's rows are standardized once, into a small
    /// arena in training order, rather than by every learner. A linear learner's steps do not
    /// depend on where its buffer is cut (a mini-batch spans calls), nor on who standardized
    /// its rows, so its model is bit for bit the one `train` gives. Returns each learner's
    /// result, as `train` would.
    pub(super) fn train_many(
        &self,
        share: &mut [(usize, &mut Trial)],
        chunk: usize,
        scaling: Option<&Standardizer>,
        pace: &mut Pace,
    ) -> Vec<(usize, Result<(), TrainError>)> {
        let arena = self.arena;
        let n = self.order.map_or(arena.len(), <[u32]>::len);
        let mut results: Vec<Result<(), TrainError>> = share.iter().map(|_| Ok(())).collect();
        let (mut kept, mut identity) = (Vec::new(), Vec::new());
        let mut scaled = match scaling.map(|_| TupleArena::try_new(arena.n_features(), chunk)) {
            Some(Err(_)) => {
                let bytes = (chunk * (arena.n_features() + 1) * 8) as u64;
                return share
                    .iter()
                    .map(|(i, _)| (*i, Err(TrainError::OutOfMemory { bytes })))
                    .collect();
            }
            Some(Ok(a)) => Some(a),
            None => None,
        };
        let mut chunk_folds = Vec::new();
        'chunks: for start in (0..n).step_by(chunk.max(1)) {
            let end = (start + chunk).min(n);
            let rows = match self.order {
                Some(order) => &order[start..end],
                None => {
                    identity.clear();
                    identity.extend(start as u32..end as u32);
                    &identity[..]
                }
            };
            if let (Some(s), Some(a)) = (scaling, scaled.as_mut()) {
                a.clear();
                chunk_folds.clear();
                for (k, &r) in rows.iter().enumerate() {
                    // Shuffled order: start loading a row a few ahead (see TupleArena::prefetch).
                    if let Some(&ahead) = rows.get(k + 8) {
                        arena.prefetch(ahead as usize);
                    }
                    a.push_standardized(arena.label(r as usize), arena.features(r as usize), s);
                    if let Some(&f) = self.row_folds.get(r as usize) {
                        chunk_folds.push(f);
                    }
                }
            }
            for ((_, t), result) in share.iter_mut().zip(&mut results) {
                if result.is_err() {
                    continue;
                }
                let started = Instant::now();
                *result = match &scaled {
                    Some(a) => match t.holdout {
                        Some(fold) => {
                            kept.clear();
                            kept.extend(
                                (0..a.len() as u32).filter(|&k| chunk_folds[k as usize] != fold),
                            );
                            t.learner.train_buffer(a, Some(&kept))
                        }
                        None => t.learner.train_buffer(a, None),
                    },
                    None => self.train_rows(t, Some(rows), &mut kept),
                }
                .and_then(|()| pace.add(rows.len() * self.row_cost(), &mut t.learner));
                t.seconds += started.elapsed().as_secs_f64();
                // One learner's check saw the stop: the others would each train on until
                // their own (thousands of learners, a check's work each, add up to seconds).
                if matches!(result, Err(TrainError::Interrupted)) {
                    break 'chunks;
                }
            }
        }
        if results
            .iter()
            .any(|r| matches!(r, Err(TrainError::Interrupted)))
        {
            return share
                .iter()
                .map(|(i, _)| (*i, Err(TrainError::Interrupted)))
                .collect();
        }
        share
            .iter_mut()
            .zip(results)
            .map(|((i, t), result)| {
                let started = Instant::now();
                let result = result.and_then(|()| self.score_fold(t, pace));
                t.seconds += started.elapsed().as_secs_f64();
                (*i, result)
            })
            .collect()
    }

    /// Trains `t` on `order` (the buffer's rows, or some of them, in training order): its
    /// group's rows of the buffer, or `order` without the rows of the fold it holds out.
    fn train_rows(
        &self,
        t: &mut Trial,
        order: Option<&[u32]>,
        kept: &mut Vec<u32>,
    ) -> Result<(), TrainError> {
        match t.holdout {
            // Its group's rows (none in this buffer: still called, so a sparse model grows
            // with the buffer's width as every other model does).
            None if t.group.is_some() => {
                let rows = t.group.and_then(|g| self.group_rows.get(g as usize));
                t.learner
                    .train_buffer(self.arena, Some(rows.map_or(&[][..], |r| &r[..])))
            }
            None => t.learner.train_buffer(self.arena, order),
            Some(fold) => {
                kept.clear();
                let folds = self.row_folds;
                match order {
                    Some(order) => {
                        kept.extend(order.iter().filter(|&&r| folds[r as usize] != fold))
                    }
                    None => kept.extend(
                        (0..self.arena.len() as u32).filter(|&r| folds[r as usize] != fold),
                    ),
                }
                t.learner.train_buffer(self.arena, Some(kept))
            }
        }
    }

    /// While scoring: `t` scores the buffer's rows of the fold it holds out.
    /// Multiply-adds of one row for a linear learner of one output (about).
    fn row_cost(&self) -> usize {
        let arena = self.arena;
        1 + match arena.is_sparse() {
            true => arena.nnz() / arena.len().max(1),
            false => arena.n_features(),
        }
    }

    fn score_fold(&self, t: &mut Trial, pace: &mut Pace) -> Result<(), TrainError> {
        let (Some(scoring), Some(fold)) = (self.scoring, t.holdout) else {
            return Ok(());
        };
        let Some(model) = t.learner.result_model() else {
            return Err(TrainError::OutOfMemory {
                bytes: t.learner.n_params() as u64 * 8,
            });
        };
        // Rows scaled in their buffer are in the learner's units; the others in the table's.
        let arena = self.arena;
        let scaled = !arena.is_empty() && arena.scaled_rows() == arena.len();
        let model = match (&scoring.standardizer, scaled) {
            (Some(s), false) => model.fold_standardizer(s),
            _ => model,
        };
        if t.score.is_none() {
            // A two-class kind scores by the labels its learner mapped (once it has met both).
            let kind = t.learner.kind();
            let binary = match (kind.labels(), t.learner.label_map()) {
                (Labels::TwoClasses, None) => return Ok(()),
                (_, map) => {
                    map.map(|(negative, positive)| BinaryLabels::Values { negative, positive })
                }
            };
            t.score = Some(ValidationScore::new(kind, binary));
        }
        let score = t.score.as_mut().expect("made above");
        // A search of thousands of folded learners spends about as long scoring as training.
        let row_cost = model.scoring_work(self.row_cost());
        for rows in self.fold_rows[fold].chunks(256) {
            for &r in rows {
                score.push(&model, arena.row(r as usize), arena.label(r as usize));
            }
            pace.add(rows.len() * row_cost, &mut t.learner)?;
        }
        Ok(())
    }
}
