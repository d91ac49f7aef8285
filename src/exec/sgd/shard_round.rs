//! A shard server's part of a training or evaluation over a sharded table (see `crate::shard`):
//! one call either gathers the statistics of the shard's table, or trains one round — a share
//! of one epoch's blocks — from the coordinator's model and returns what it learned, or scores
//! the coordinator's model on every row and returns mergeable counts. Rows never leave the
//! shard; nothing is stored here.

use super::parallel::TrainExtras;
use super::train::gather_statistics;
use super::worker::raise_train_error;
use super::{SgdNode, SgdTask};
use crate::classes::ClassValue;
use crate::error::raise;
use crate::pipeline::{FeatureLayout, Mode, Share};
use corgipile_ml::model::LinearModel;
use corgipile_ml::preprocess::Preprocessor;
use corgipile_ml::scoring::EvaluationPart;
use corgipile_ml::stats::FeatureStats;
use corgipile_ml::trainer::Trainer;
use pgrx::{check_for_interrupts, PgSqlErrorCode};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Phase {
    Statistics,
    Train,
    Evaluate,
}

/// The stored model an evaluation scores (`Phase::Evaluate`).
#[derive(Clone, Serialize, Deserialize)]
pub struct EvaluateRequest {
    pub model: LinearModel,
    /// The label values by class index, as stored with the model.
    pub classes: Vec<ClassValue>,
    /// A column list's preprocessing, as stored with the model.
    pub preprocessing: Option<Preprocessor>,
}

/// What the coordinator asks of a shard.
#[derive(Clone, Serialize, Deserialize)]
pub struct RoundRequest {
    /// The coordinator's corgipile version: a shard of another version refuses.
    pub version: String,
    pub phase: Phase,
    pub epoch: u32,
    /// This round is blocks `round`, `round + rounds`, … of the epoch's order.
    pub round: u32,
    pub rounds: u32,
    pub n_features: usize,
    pub weights: Vec<f64>,
    pub bias: Vec<f64>,
    pub extras: TrainExtras,
    /// Evaluate: the model to score.
    #[serde(default)]
    pub evaluate: Option<EvaluateRequest>,
}

/// What a shard answers.
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct RoundReply {
    pub rows: u64,
    pub rows_skipped: u64,
    /// Statistics: the shard's, and its dense rows' width (None: no rows or sparse).
    pub stats: Option<FeatureStats>,
    pub width: Option<usize>,
    /// Train: the model after the round, and the round's progressive metrics.
    pub weights: Vec<f64>,
    pub bias: Vec<f64>,
    pub tuples: u64,
    pub loss: f64,
    pub accuracy: Option<f64>,
    pub r2: Option<f64>,
    /// Evaluate: the shard's metrics, to merge.
    #[serde(default)]
    pub evaluation: Option<EvaluationPart>,
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
        RoundReply {
            rows: stats.as_ref().map_or(0, |s| s.rows()),
            rows_skipped: shuffle.rows_skipped_this_epoch,
            stats,
            width,
            ..RoundReply::default()
        }
    }

    unsafe fn shard_train(&mut self, request: RoundRequest) -> RoundReply {
        let params = self.config.params.clone();
        let mut config = params.train_config(self.config.model);
        // The coordinator averages the rounds' models; a shard returns its last iterate.
        config.average_from_epoch = None;
        request.extras.clone().apply(&mut config);
        let shuffle = self.shuffle();
        shuffle.set_round(
            Share {
                rank: request.round,
                processes: request.rounds.max(1),
            },
            request.epoch,
        );
        let mut trainer = Trainer::try_new(config, request.n_features)
            .unwrap_or_else(|e| raise_train_error(e, &|v| v.to_string(), params.normalize));
        if request.weights.len() != trainer.model().weights.len()
            || request.bias.len() != trainer.model().bias.len()
        {
            raise(
                PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
                "corgipile shard round: the coordinator's model has another shape",
                None,
            );
        }
        trainer.set_model(&request.weights, &request.bias);
        trainer.set_interrupt(Some(Box::new(|| {
            check_for_interrupts!();
            false
        })));
        trainer.start_epoch(request.epoch);
        let dense = matches!(self.config.layout, FeatureLayout::Dense { .. });
        let mut spare = None;
        while let Some(buffer) = shuffle.next_buffer(spare.take()) {
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
            let order = (!buffer.order.is_empty()).then_some(buffer.order.as_slice());
            if let Err(e) = trainer.train_buffer(&buffer.arena, order) {
                raise_train_error(e, &|v| v.to_string(), params.normalize);
            }
            spare = Some(buffer);
        }
        let stats = trainer
            .finish_epoch()
            .unwrap_or_else(|e| raise_train_error(e, &|v| v.to_string(), params.normalize));
        let model = trainer.model();
        if model.weights.len() != request.weights.len() {
            raise(
                PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
                format!(
                    "a sparse index of {} is beyond n_features",
                    self.config.relation
                ),
                None,
            );
        }
        RoundReply {
            rows: shuffle.rows_this_epoch,
            rows_skipped: shuffle.rows_skipped_this_epoch,
            weights: model.weights.clone(),
            bias: model.bias.clone(),
            tuples: stats.tuples,
            loss: stats.loss,
            accuracy: stats.accuracy,
            r2: stats.r2,
            ..RoundReply::default()
        }
    }
}
