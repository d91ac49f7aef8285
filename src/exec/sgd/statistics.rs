//! The statistics pass before training (for `normalize`, `class_weight`, a column list's
//! preprocessing, a network's classes and target, per-group models' groups): one pass over the
//! table's rows, double-buffered like an epoch; and what it learned, sent to parallel workers.

use super::double_buffer::StatsWorker;
use super::SgdNode;
use crate::exec::tuple_shuffle::{ShuffledBuffer, TupleShuffle};
use crate::pg::error::raise_labels_error;
use crate::pipeline::{FeatureLayout, LearnedStatistics};
use corgipile_ml::params::StatisticsPass;
use corgipile_ml::stats::FeatureStats;
use corgipile_ml::trainer::{normalizing_scaler, settle_labels, TrainConfig};
use pgrx::{check_for_interrupts, pg_sys};

/// One pass over the table's rows into statistics; `seen` is shown each buffer first.
/// Double-buffered, a thread counts one buffer while the backend fills the next.
pub(super) fn gather_statistics(
    shuffle: &mut TupleShuffle,
    classifier: bool,
    double_buffer: bool,
    mut seen: impl FnMut(&ShuffledBuffer),
) -> Option<FeatureStats> {
    if double_buffer {
        let counter = StatsWorker::spawn(classifier);
        let (mut spare, mut in_flight) = (None, 0);
        while let Some(b) = shuffle.next_buffer(spare.take()) {
            seen(&b);
            counter.push(b);
            in_flight += 1;
            if in_flight == 2 {
                spare = Some(counter.wait_returned());
                in_flight -= 1;
            }
        }
        return counter.finish();
    }
    let mut stats: Option<FeatureStats> = None;
    shuffle.for_each_buffer(|b| {
        seen(b);
        stats
            .get_or_insert_with(|| FeatureStats::new(b.arena.n_features(), classifier))
            .push_arena(&b.arena, || {
                check_for_interrupts!();
                true
            });
    });
    stats
}

impl SgdNode {
    /// One pass of statistics before training, for `normalize` and `class_weight`; over a
    /// sample of the blocks when `sample` (the caller knows means and scales are all it needs).
    pub(super) fn statistics_pass(&mut self, config: &mut TrainConfig, sample: bool) {
        let params = &self.config.params;
        // SAFETY: the child's TupleShuffle state lives as long as this node (see `shuffle`); no
        // other reference to it is in use here.
        let shuffle = unsafe { self.shuffle() };
        if sample {
            shuffle.sample_this_pass(
                StatisticsPass::SAMPLE_FRACTION,
                StatisticsPass::SAMPLE_MIN_PAGES,
                StatisticsPass::SAMPLE_MIN_ROWS,
            );
        }
        let classifier = self.config.model.is_classifier();
        let stats = gather_statistics(shuffle, classifier, params.double_buffer, |_| {});
        let Some(stats) = stats else {
            self.no_rows(shuffle.counts().rows_skipped)
        };
        self.label_moments = Some(stats.label_mean_variance());
        if classifier {
            self.class_counts = Some(stats.class_counts());
        }
        self.stats_width = Some(stats.n_features());
        if shuffle.rows().is_learning() {
            let classes = shuffle.rows().classes().len();
            config.standardizer = Some(
                shuffle
                    .rows_mut()
                    .finish_statistics(classes, params.fit_intercept),
            );
        } else if params.normalize {
            let sparse = matches!(self.config.layout, FeatureLayout::Sparse { .. });
            config.standardizer = Some(normalizing_scaler(&stats, sparse, params.fit_intercept));
        }
        // Per-group models: every model maps the two labels alike, whichever a group's rows
        // hold.
        let grouping = params.group_by.is_some();
        if (params.class_weight.is_some() || grouping) && self.config.model.is_classifier() {
            let settled = settle_labels(
                self.config.model,
                &stats.class_counts(),
                params.class_weight.as_ref(),
                &self.label_text(),
            )
            .unwrap_or_else(|e| raise_labels_error(e, &self.config.relation, ""));
            config.label_values = settled.label_values;
            config.class_weights = settled.class_weights;
        }
        // SAFETY: an FFI call on the backend thread, inside the executor run, on this node's child
        // (initialized in begin, alive until end).
        unsafe { pg_sys::ExecReScan(self.child) };
    }

    /// What the leader's statistics pass learned, for its parallel workers.
    pub(super) fn learned_statistics(&self, config: &TrainConfig) -> LearnedStatistics {
        let mut learned = LearnedStatistics::of(config);
        let sized = self.config.model.family().sized_by_statistics();
        if sized {
            learned.label_moments = self.label_moments;
        }
        if sized || self.numbers_classes_for_workers() {
            // SAFETY: the child's TupleShuffle state lives as long as this node (see `shuffle`); no
            // other reference to it is in use here.
            learned.classes = Some(unsafe { self.shuffle() }.rows().classes().classes.clone());
        }
        learned
    }

    /// Whether the classes are numbered as the rows meet them (softmax over numbers, any
    /// classifier over a text label) and workers will train: then the leader's statistics pass
    /// reads every row and numbers them all, and every process takes that numbering.
    pub(super) fn numbers_classes_for_workers(&self) -> bool {
        self.config.params.workers > 0 && self.config.label.uses_classes()
    }
}
