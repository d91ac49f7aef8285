//! A shard server's part of a training or evaluation over a sharded table (see `crate::shard`):
//! one call either gathers the statistics of the shard's table, or trains one round — a share
//! of one epoch's blocks — from the coordinator's model and returns what it learned, or scores
//! the coordinator's model on every row and returns mergeable counts. Rows never leave the
//! shard; nothing is stored here.

use super::statistics::gather_statistics;
use super::{checked_learner, inputs_only};
use super::{SgdNode, SgdTask};
use crate::pg::error::{raise, raise_train_error};
use crate::pipeline::protocol::{Phase, RoundReply, RoundRequest, MAX_CLASS_TEXT};
use crate::pipeline::ClassValue;
use crate::pipeline::{BlockShare, FeatureLayout, Mode};
use corgipile_ml::learner::Shape;
use corgipile_ml::network::{Optimizer, Target};
use pgrx::{check_for_interrupts, PgSqlErrorCode};
use std::cell::RefCell;

/// A network's optimizer state after this backend's last round of a sharded training on one
/// table (a remote shard's backend serves one coordinator connection; a coordinator runs its
/// local partitions itself): the next round of the same training on the same table resumes
/// it, as one process's optimizer continues from batch to batch. Backend thread only.
struct KeptOptimizer {
    training: u64,
    relation: String,
    optimizer: Optimizer,
}

thread_local! {
    static KEPT: RefCell<Vec<KeptOptimizer>> = const { RefCell::new(Vec::new()) };
}

/// The kept state of `training` on `relation`, if any; drops those of other trainings.
fn take_kept(training: u64, relation: &str) -> Option<Optimizer> {
    KEPT.with_borrow_mut(|kept| {
        kept.retain(|k| k.training == training);
        let at = kept.iter().position(|k| k.relation == relation)?;
        Some(kept.swap_remove(at).optimizer)
    })
}

/// Forgets every kept optimizer state (a coordinator, at the end of a sharded training).
pub fn forget_kept_optimizers() {
    KEPT.with_borrow_mut(Vec::clear);
}

/// One shard call.
pub struct ShardRound {
    pub request: RoundRequest,
}

impl SgdTask for ShardRound {
    type Output = RoundReply;
    const MODE: Mode = Mode::Train;

    unsafe fn run(self, node: &mut SgdNode) -> RoundReply {
        match self.request.phase {
            Phase::Statistics => node.shard_statistics(),
            Phase::Train => node.shard_train(self.request),
            Phase::Evaluate => raise(
                PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
                "corgipile shard round: an evaluation on a training plan",
                None,
            ),
        }
    }
}

impl SgdNode {
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
        RoundReply {
            rows: stats.as_ref().map_or(0, |s| s.rows()),
            rows_skipped: shuffle.counts().rows_skipped,
            stats,
            width,
            classes,
            ..RoundReply::default()
        }
    }

    /// One round: the coordinator's model trained on this round's blocks. A network resumes
    /// the optimizer state (Adam's moments, momentum) of its last round on this table (see
    /// `KeptOptimizer`): the coordinator sends parameters only.
    unsafe fn shard_train(&mut self, request: RoundRequest) -> RoundReply {
        let params = self.config.params.clone();
        let kind = self.config.model;
        let mut config = params.train_config(kind);
        // The coordinator averages the rounds' models; a shard returns its last iterate.
        config.average_from_epoch = None;
        request.extras.clone().apply(&mut config);
        let shuffle = self.shuffle();
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
        let learner = checked_learner(kind, config, &params, &shape, self.config.max_model_bytes);
        let mut learner =
            learner.unwrap_or_else(|e| raise_train_error(e, &|v| v.to_string(), params.normalize));
        let start: Vec<f64> = request
            .weights
            .iter()
            .chain(&request.bias)
            .copied()
            .collect();
        if !learner.set_parameters(&start) {
            other_shape();
        }
        // A network continues with the optimizer state of this table's last round, if any.
        let relation = format!("{} {:?}", self.config.relation, self.config.leaf);
        let training = request.network.as_ref().map(|n| n.training);
        if let Some(kept) = training.and_then(|t| take_kept(t, &relation)) {
            learner.resume_optimizer(kept);
        }
        learner.set_interrupt(Some(Box::new(|| {
            check_for_interrupts!();
            false
        })));
        learner.start_epoch(request.epoch);
        let dense = matches!(self.config.layout, FeatureLayout::Dense { .. });
        let mut spare = None;
        while let Some(mut buffer) = shuffle.next_buffer(spare.take()) {
            if dense && buffer.arena.n_features() != request.n_features {
                raise(
                    PgSqlErrorCode::ERRCODE_ARRAY_ELEMENT_ERROR,
                    format!(
                        "rows of {} have {} features, other shards' {}",
                        self.config.relation,
                        buffer.arena.n_features(),
                        request.n_features
                    ),
                    Some("Every row's feature array must have the same length.".into()),
                );
            }
            let (arena, order) = buffer.visit();
            if let Err(e) = learner.train_buffer(arena, order) {
                let label = self.label_text();
                raise_train_error(e, &label, params.normalize);
            }
            spare = Some(buffer);
        }
        let stats = learner
            .finish_epoch()
            .unwrap_or_else(|e| raise_train_error(e, &|v| v.to_string(), params.normalize));
        let mut weights = learner.parameters();
        if let (Some(training), Some(optimizer)) = (training, learner.into_optimizer()) {
            // What this backend keeps between rounds (one state per local partition on a
            // coordinator) stays within corgipile.max_model_memory; beyond it a partition's
            // next round starts a fresh state.
            let limit = self.config.max_model_bytes;
            KEPT.with_borrow_mut(|kept| {
                let held: u64 = kept.iter().map(|k| k.optimizer.bytes()).sum();
                if held.saturating_add(optimizer.bytes()) <= limit {
                    kept.push(KeptOptimizer {
                        training,
                        relation,
                        optimizer,
                    })
                }
            });
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
        if weights.len() != start.len() {
            raise(
                PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
                format!(
                    "a sparse index of {} is beyond n_features",
                    self.config.relation
                ),
                None,
            );
        }
        let bias = weights.split_off(request.weights.len());
        RoundReply {
            rows: shuffle.counts().rows,
            rows_skipped: shuffle.counts().rows_skipped,
            weights,
            bias,
            tuples: stats.tuples,
            loss: stats.loss,
            accuracy: stats.accuracy,
            r2: stats.r2,
            ..RoundReply::default()
        }
    }
}
