//! A shard server's part of a training or evaluation over a sharded table (see `crate::shard`):
//! one call either gathers the statistics of the shard's table, or trains one round — a share
//! of one epoch's blocks — from the coordinator's model and returns what it learned, or scores
//! the coordinator's model on every row and returns mergeable counts, or scores it on the
//! validation rows the training's first epoch held out here, or sums a Newton pass of
//! `"inference"` over every row (`inference.rs`). Rows never leave the shard;
//! nothing is stored here.

use super::inference::raise_other_width;
use super::inputs_only;
use super::shard_learners::{learner_replies, start_controls};
use super::statistics::gather_statistics;
use super::{SgdNode, SgdTask};
use crate::pg::error::{raise, raise_train_error};
use crate::pipeline::protocol::MAX_CLASS_TEXT;
use crate::pipeline::protocol::{
    GroupKey, GroupRows, LearnerRound, Phase, RoundReply, RoundRequest,
};
use crate::pipeline::ClassValue;
use crate::pipeline::HeldOutRows;
use crate::pipeline::{BlockShare, FeatureLayout, Mode, ValidationSplit};
use corgipile_ml::arena::TupleArena;
use corgipile_ml::learner::Shape;
use corgipile_ml::model::Predictor;
use corgipile_ml::network::{Optimizer, Target};
use corgipile_ml::scoring::{BinaryLabels, ValidationPart, ValidationScore};
use corgipile_ml::trained::Model;
use corgipile_ml::trials::Trials;
use pgrx::{check_for_interrupts, PgSqlErrorCode};
use std::cell::RefCell;
use std::sync::Arc;

/// One table of one sharded training, as a backend keeps state for it between rounds: a
/// shard server's table (`leaf` None), or a local partition `leaf` of the coordinator's
/// sharded table `relid`. (A remote shard's backend serves one coordinator connection; a
/// coordinator runs its local partitions itself.)
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrainingTable {
    pub training: u64,
    pub relid: u32,
    pub leaf: Option<u32>,
}

/// What this backend keeps of one table of a sharded training between its rounds: each
/// network learner's optimizer state after its last round (the learner's next round resumes
/// it, as one process's optimizer continues from batch to batch), and the validation rows the first
/// epoch's rounds held out (each round reads its share of the blocks), which validation
/// rounds score, and, for a deploy gate, their tuple ids (kept until the gate has scored).
/// Backend thread only.
struct Kept {
    table: TrainingTable,
    optimizers: Vec<(LearnerKey, Optimizer)>,
    held_out: Vec<TupleArena>,
    held_out_ids: Option<HeldOutRows>,
}

thread_local! {
    static KEPT: RefCell<Vec<Kept>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on what is kept for `table` (made empty if nothing is); forgets what other
/// trainings kept.
fn with_kept<T>(table: TrainingTable, f: impl FnOnce(&mut Kept, u64) -> T) -> T {
    KEPT.with_borrow_mut(|kept| {
        kept.retain(|k| k.table.training == table.training);
        let held: u64 = kept.iter().map(Kept::bytes).sum();
        let at = match kept.iter().position(|k| k.table == table) {
            Some(at) => at,
            None => {
                kept.push(Kept {
                    table,
                    optimizers: Vec::new(),
                    held_out: Vec::new(),
                    held_out_ids: None,
                });
                kept.len() - 1
            }
        };
        f(&mut kept[at], held)
    })
}

impl Kept {
    fn bytes(&self) -> u64 {
        let rows: usize = self.held_out.iter().map(TupleArena::bytes_used).sum();
        let ids = self.held_out_ids.as_ref().map_or(0, HeldOutRows::bytes);
        let optimizers: u64 = self.optimizers.iter().map(|(_, o)| o.bytes()).sum();
        optimizers + (rows + ids) as u64
    }
}

/// The tuple ids of the rows held out of `table` by its first epoch's rounds, when they kept
/// them (`RoundRequest::keep_held_out_ids`): what a deploy gate's evaluation scores.
pub fn held_out_ids(table: TrainingTable) -> Option<Arc<HeldOutRows>> {
    with_kept(table, |kept, _| kept.held_out_ids.clone().map(Arc::new))
}

/// Forgets everything kept (a coordinator, at the end of a sharded training).
pub fn forget_kept() {
    KEPT.with_borrow_mut(Vec::clear);
}

/// The score of `model` on the validation rows held out of `table` by its first epoch's
/// rounds (none held out: an empty score). `binary`: a binary kind's two labels as the
/// trainer sees them.
pub fn score_held_out(
    table: TrainingTable,
    model: &Model,
    binary: Option<BinaryLabels>,
) -> ValidationPart {
    with_kept(table, |kept, _| {
        let mut score = ValidationScore::new(model.kind(), binary);
        for arena in &kept.held_out {
            score_rows(&mut score, model, arena);
        }
        score.part()
    })
}

/// Adds `model`'s scores of every row of `arena` to `score` (a cancel is checked between
/// chunks of rows).
pub fn score_rows(score: &mut ValidationScore, model: &Model, arena: &TupleArena) {
    for start in (0..arena.len()).step_by(VALIDATION_CHUNK_ROWS) {
        check_for_interrupts!();
        for i in start..(start + VALIDATION_CHUNK_ROWS).min(arena.len()) {
            score.push(model, arena.row(i), arena.label(i));
        }
    }
}

/// Rows scored between two checks for a cancel.
const VALIDATION_CHUNK_ROWS: usize = 4096;

/// Who a learner of a round is, for what this backend keeps of it between rounds: its search
/// configuration, the fold it holds out and the group it trains (unique among a round's
/// learners: `protocol::learners::check_request`).
#[derive(PartialEq)]
struct LearnerKey {
    configuration: serde_json::Map<String, serde_json::Value>,
    fold: Option<u32>,
    group: Option<u32>,
}

impl LearnerKey {
    fn of(sent: &LearnerRound) -> LearnerKey {
        LearnerKey {
            configuration: sent.configuration.clone(),
            fold: sent.fold,
            group: sent.group,
        }
    }
}

/// Each learner of the round continues with the optimizer state its last round on `table`
/// left (none: its first round, or it did not fit). The states of learners no longer sent
/// (stopped, set aside) are dropped.
fn resume_optimizers(table: TrainingTable, sent: &[LearnerRound], trials: &mut Trials) {
    let mut kept = with_kept(table, |k, _| std::mem::take(&mut k.optimizers));
    for (learner, sent) in trials.learners_mut().zip(sent) {
        let key = LearnerKey::of(sent);
        if let Some(at) = kept.iter().position(|(k, _)| *k == key) {
            // A state of another shape (another network) is not resumed: the learner's own.
            learner.resume_optimizer(kept.swap_remove(at).1);
        }
    }
}

/// Keeps `optimizer`, a learner's state after this round, for its next round on `table`:
/// everything this backend keeps of the training (every learner's state, every local
/// partition's on a coordinator, the held-out rows) stays within corgipile.max_model_memory;
/// beyond it the learner's next round starts a fresh state.
fn keep_optimizer(table: TrainingTable, key: LearnerKey, optimizer: Optimizer) {
    let limit = crate::pg::guc::max_model_bytes();
    with_kept(table, |kept, held| {
        if held.saturating_add(optimizer.bytes()) <= limit {
            kept.optimizers.push((key, optimizer));
        }
    });
}

/// One shard call.
pub struct ShardRound {
    pub request: RoundRequest,
    pub table: TrainingTable,
}

impl SgdTask for ShardRound {
    type Output = RoundReply;
    const MODE: Mode = Mode::Train;

    unsafe fn run(self, node: &mut SgdNode) -> RoundReply {
        match self.request.phase {
            Phase::Statistics => node.shard_statistics(),
            Phase::Train => node.shard_train(self.request, self.table),
            Phase::Inference => node.shard_newton_pass(&self.request),
            Phase::Evaluate | Phase::Validate | Phase::Importance => raise(
                PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
                "corgipile shard round: an evaluation on a training plan",
                None,
            ),
        }
    }
}

impl SgdNode {
    /// Keeps the validation rows this round held out (see `Kept`): every round's together
    /// within corgipile.max_buffer_memory, as one server holds them.
    ///
    /// # Safety
    /// As [`SgdNode::shuffle`]: called while this node's plan runs.
    unsafe fn keep_held_out(&mut self, table: TrainingTable) {
        // Their ids, when this round recorded them (a gated training).
        let ids = self.shuffle().rows_mut().take_held_out();
        let rows = self.shuffle().rows_mut().take_validation();
        if rows.is_none() && ids.is_none() {
            return;
        }
        let limit = self.config.max_buffer_bytes;
        let fits = with_kept(table, |kept, _| {
            let held: usize = kept.held_out.iter().map(TupleArena::bytes_used).sum();
            let id_bytes = ids.as_ref().map_or(0, HeldOutRows::bytes)
                + kept.held_out_ids.as_ref().map_or(0, HeldOutRows::bytes);
            let new = rows.as_ref().map_or(0, TupleArena::bytes_used) + id_bytes;
            let fits = (held.saturating_add(new) as u64) <= limit;
            if fits {
                kept.held_out.extend(rows);
                if let Some(ids) = ids {
                    kept.held_out_ids = Some(match kept.held_out_ids.take() {
                        Some(before) => before.union(ids),
                        None => ids,
                    });
                }
            }
            fits
        });
        if !fits {
            raise(
                PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                format!(
                    "the validation rows of {} do not fit in corgipile.max_buffer_memory",
                    self.config.relation
                ),
                Some("Hold out a smaller fraction, or evaluate afterwards with corgipile_evaluate().".into()),
            );
        }
    }

    unsafe fn shard_statistics(&mut self) -> RoundReply {
        let classifier = self.config.model.is_classifier();
        let dense = matches!(self.config.layout, FeatureLayout::Dense { .. });
        let double_buffer = self.config.params.double_buffer;
        let shuffle = self.shuffle();
        let mut width = None;
        let stats = gather_statistics(shuffle, classifier, double_buffer, |b| {
            if dense {
                width.get_or_insert(b.arena.n_features());
            }
        });
        // A label numbered by class (softmax, a network's classes, a text label): the rows are
        // counted by class index in this shard's numbering, sent with the classes it numbers,
        // so that the coordinator numbers every shard's classes alike.
        let classes = if self.config.label.uses_classes() {
            let classes = shuffle.rows().classes().classes.clone();
            if let Some(long) = classes.iter().find_map(|c| match c {
                ClassValue::Text(t) if t.len() > MAX_CLASS_TEXT => Some(t.len()),
                _ => None,
            }) {
                raise(
                    PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                    format!(
                        "a label of {} on this shard is {long} bytes long, over the {MAX_CLASS_TEXT} bytes a sharded training numbers",
                        self.config.relation
                    ),
                    Some("Labels are class names: train on a view that maps them to short names or numbers.".into()),
                );
            }
            classes
        } else {
            Vec::new()
        };
        // A list of feature columns: what this shard's rows say of their preprocessing, for
        // the coordinator to merge with every other shard's.
        let columns = match shuffle.rows().statistics_part() {
            Some(Ok(part)) => Some(part),
            Some(Err(_)) => raise(
                PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
                "out of memory for the statistics of the feature columns",
                Some("Hash the columns of many distinct values (\"encode\": \"hash\"), or ask a superuser to lower corgipile.max_buffer_memory to what the server has.".into()),
            ),
            None => None,
        };
        // "group_by": this shard's groups and their rows (each group it met, as one server's
        // statistics pass counts them), for the coordinator to add up and number.
        let groups = shuffle
            .rows_mut()
            .number_groups(1)
            .map_or_else(Vec::new, |found| {
                found
                    .kept
                    .into_iter()
                    .map(|(key, rows)| GroupRows(GroupKey(key), rows))
                    .collect()
            });
        RoundReply {
            rows: stats.as_ref().map_or(0, |s| s.rows()),
            rows_skipped: shuffle.counts().rows_skipped,
            stats,
            width,
            classes,
            columns,
            groups,
            ..RoundReply::default()
        }
    }

    /// One round: the coordinator's learners trained on this round's blocks. Each network
    /// learner resumes the optimizer state (Adam's moments, momentum) of its last round on
    /// this table (see `Kept`): the coordinator sends parameters only.
    unsafe fn shard_train(&mut self, request: RoundRequest, table: TrainingTable) -> RoundReply {
        let params = self.config.params.clone();
        let kind = self.config.model;
        let mut config = params.train_config(kind);
        // The coordinator averages the rounds' models; a shard returns its last iterate.
        config.average_from_epoch = None;
        request.extras.clone().apply(&mut config);
        let shuffle = self.shuffle();
        // Validation rows are held out by the first epoch's rounds, and skipped after it.
        let holds_out = self.config.validation_split != ValidationSplit::None;
        if request.epoch > 1 {
            shuffle.rows_mut().validation_collected();
        } else if holds_out && request.keep_held_out_ids {
            shuffle.rows_mut().record_held_out();
        }
        shuffle.set_round(
            BlockShare {
                rank: request.round,
                processes: request.rounds.max(1),
            },
            request.epoch,
        );
        let other_shape = || -> ! {
            raise(
                PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
                "corgipile shard round: the coordinator's model has another shape",
                None,
            )
        };
        let shape = match (&request.network, kind.family().sized_by_statistics()) {
            (Some(n), true) => {
                let outputs = if kind.is_classifier() {
                    n.classes.len()
                } else {
                    1
                };
                // Classes for a classifier (two at least), none for a regression.
                let fits = if kind.is_classifier() {
                    outputs >= 2
                } else {
                    n.classes.is_empty()
                };
                if !fits {
                    other_shape();
                }
                Shape {
                    n_features: request.n_features,
                    outputs,
                    target: Target {
                        mean: n.target_mean,
                        scale: n.target_scale,
                    },
                }
            }
            // A softmax has one output per class of the coordinator's numbering from the start.
            (None, false) if kind.has_class_outputs() => {
                if request.classes.len() < 2 {
                    other_shape();
                }
                Shape {
                    outputs: request.classes.len(),
                    ..inputs_only(request.n_features)
                }
            }
            (None, false) => inputs_only(request.n_features),
            _ => other_shape(),
        };
        // Every learner of the round (see `shard_learners`), side by side on its buffers.
        let mut trials = self.round_learners(&request, &shape);
        resume_optimizers(table, &request.learners, &mut trials);
        // A network's drift correction, once its optimizer is this round's.
        start_controls(&mut trials, &request.learners, params.normalize);
        trials.set_interrupt(|| {
            Box::new(|| {
                check_for_interrupts!();
                false
            })
        });
        trials.start_epoch(request.epoch);
        let dense = matches!(self.config.layout, FeatureLayout::Dense { .. });
        let mut spare = None;
        while let Some(mut buffer) = shuffle.next_buffer(spare.take()) {
            if dense && buffer.arena.n_features() != request.n_features {
                let width = buffer.arena.n_features();
                raise_other_width(&self.config.relation, width, request.n_features);
            }
            let (arena, order) = buffer.visit();
            if let Err(e) = trials.train_buffer(arena, order) {
                let label = self.label_text();
                raise_train_error(e, &label, params.normalize);
            }
            spare = Some(buffer);
        }
        let stats = trials
            .finish_epoch()
            .unwrap_or_else(|e| raise_train_error(e, &|v| v.to_string(), params.normalize));
        let holdouts = trials.take_holdout_scores();
        let mut learned = Vec::with_capacity(trials.len());
        let mut controls = Vec::with_capacity(trials.len());
        for ((result, _), sent) in trials.into_results().into_iter().zip(&request.learners) {
            let Ok(mut learner) = result else {
                learned.push(result.map(|_| Vec::new()));
                controls.push(None);
                continue;
            };
            learned.push(Ok(learner.parameters()));
            let mut optimizer = learner.into_optimizer();
            controls.push(optimizer.as_mut().and_then(Optimizer::take_control));
            if let Some(optimizer) = optimizer {
                keep_optimizer(table, LearnerKey::of(sent), optimizer);
            }
        }
        if holds_out && request.epoch == 1 {
            self.keep_held_out(table);
        }
        // The decoder numbered a label the coordinator's statistics round did not see (rows
        // added between rounds): the model would have another shape on this shard.
        let numbered = match &request.network {
            Some(n) => n.classes.len(),
            None => request.classes.len(),
        };
        if numbered > 0 && shuffle.rows().classes().len() > numbered {
            raise(
                PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
                format!(
                    "{} has a label value that the statistics round of this sharded training did not see",
                    self.config.relation
                ),
                Some("The shard's rows changed during the training: train again.".into()),
            );
        }
        RoundReply {
            rows: shuffle.counts().rows,
            rows_skipped: shuffle.counts().rows_skipped,
            learners: learner_replies(
                &request.learners,
                learned,
                (stats, holdouts, controls),
                &self.config.relation,
            ),
            ..RoundReply::default()
        }
    }
}
