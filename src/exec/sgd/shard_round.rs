//! A shard server's part of a training or evaluation over a sharded table (see `crate::shard`):
//! one call either gathers the statistics of the shard's table, or trains one round — a share
//! of one epoch's blocks — from the coordinator's model and returns what it learned, or scores
//! the coordinator's model on every row and returns mergeable counts. Rows never leave the
//! shard; nothing is stored here.

use super::train::gather_statistics;
use super::{SgdNode, SgdTask};
use crate::pg::error::{raise, raise_train_error};
use crate::pipeline::{BlockShare, FeatureLayout, Mode};
use crate::shard::protocol::{Phase, RoundReply, RoundRequest};
use corgipile_ml::trainer::Trainer;
use pgrx::{check_for_interrupts, PgSqlErrorCode};

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
            rows_skipped: shuffle.counts().rows_skipped,
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
            BlockShare {
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
            rows: shuffle.counts().rows,
            rows_skipped: shuffle.counts().rows_skipped,
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
