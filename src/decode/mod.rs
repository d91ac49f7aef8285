//! Decoding rows: from the datums of the query a pipeline reads (label, features..., validation
//! column) to what the trainer sees — a label (a value, or a class index), features in a tuple
//! arena — or to a held-out validation row. One [`RowDecoder`] does it for training, the
//! statistics pass, evaluation and collecting; predictions from a row
//! (`crate::predict::row`) encode their columns with the same column encoder (`columns`).
//!
//! - `datum`: PostgreSQL datums → numbers, arrays, text bytes, without per-value allocation;
//! - `labels`: the label datum → the trainer's label, with the class dictionary (`classes`);
//! - `features`: a float8[] or an (indices, values) pair → an arena row;
//! - `columns`: a column list, learned (statistics pass) or encoded by the preprocessing.

pub mod classes;
pub mod columns;
pub mod datum;
mod features;
pub mod groups;
mod labels;
pub mod record;

use crate::pg::error::raise;
use crate::pipeline::{
    FeatureLayout, GroupsFound, HeldOutRows, LabelKind, Mode, PipelineConfig, PreprocessSpec,
    RowId, ValidationSplit,
};
use classes::ClassDictionary;
use columns::{Encoder, Nulls};
use corgipile_ml::arena::TupleArena;
use corgipile_ml::drift::Counter;
use corgipile_ml::preprocess::profile::LabelSketch;
use corgipile_ml::preprocess::{EncodedRow, PreprocessError, Preprocessor, StatsPart};
use corgipile_ml::standardize::Standardizer;
use datum::{format_tid, with_float_array, with_int4_array};
use features::decode_features;
use pgrx::{pg_sys, PgSqlErrorCode};
use std::sync::Arc;

/// Where a decoded row goes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Train,
    Validation,
}

/// Why a row is not decoded.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// A NULL label or features (or a column list's NULL with `"impute": "skip"`): counted in
    /// the epoch's skipped rows.
    Counted,
    /// A validation row already collected, or one that cannot be encoded yet (the statistics
    /// pass is still learning the preprocessing).
    Uncounted,
}

pub struct RowDecoder {
    config: PipelineConfig,
    /// Dense: the feature dimension, fixed by the first row. Sparse: unused.
    n_features: Option<usize>,
    /// Training: the model shape (features, classes) already checked against
    /// corgipile.max_model_memory; a row that needs more is checked before the trainer or the
    /// statistics pass allocate. (Other modes score or collect rows: no model grows.)
    checked_features: usize,
    checked_classes: usize,
    /// Label values → class indices (softmax, text labels); pre-filled for evaluation.
    classes: ClassDictionary,
    /// Held-out validation rows, collected during the first pass over the table.
    validation: Option<TupleArena>,
    first_pass_done: bool,
    /// Column lists: the preprocessing (being learned, then ready), and reusable row scratch.
    encoder: Option<Encoder>,
    /// How each of the query's columns holds a number (column lists read boolean, integer and
    /// float columns as stored; numeric is cast to float8 in the query).
    number_kinds: Vec<LabelKind>,
    encoded: EncodedRow,
    array_scratch: Vec<f64>,
    /// `"group_by"`: the rows' groups.
    groups: Option<groups::Groups>,
    /// The first pass's training rows: how many, and the sum of their labels' squares (a
    /// regression's zero model, see `exec::sgd::divergence`).
    first_pass_labels: (u64, f64),
    /// A gated training (`"deploy": "if_better"`): the rows kept as held-out rows (a training's
    /// validation rows; every row collected from a validation relation), recorded when asked.
    held_out: Option<Vec<RowId>>,
    /// A gate's evaluation: only these rows are scored; the others are passed over uncounted.
    only_rows: Option<Arc<HeldOutRows>>,
    /// The row `target` just sent to `decode`, while held-out rows are recorded and it is one
    /// (a validation row; any row collected from a validation relation).
    held_out_row: Option<RowId>,
    /// Column lists: the drift profile's label, learned with the statistics pass.
    label_sketch: Option<LabelSketch>,
    /// `corgipile_drift`: each input column's rows counted as they are decoded.
    drift: Option<Vec<Counter>>,
}

impl RowDecoder {
    /// A decoder for the rows of `config`'s query, whose output columns hold numbers as
    /// `number_kinds` says.
    pub fn new(config: PipelineConfig, number_kinds: Vec<LabelKind>) -> RowDecoder {
        // An n_features param sizes the model from the start (checked up front, see
        // `request::prepare`).
        let declared_features = match (config.layout, &config.preprocess) {
            (
                FeatureLayout::Sparse {
                    n_features: Some(n),
                    ..
                },
                _,
            ) => n as usize,
            // A preprocessing learned before (checked against the limit when it was learned).
            (FeatureLayout::Tabular, Some(PreprocessSpec::Fixed(p))) => p.n_features,
            _ => 0,
        };
        let classes = if config.mode == Mode::Evaluate {
            ClassDictionary::frozen(&config.known_classes)
        } else {
            ClassDictionary::with_classes(&config.known_classes)
        };
        let encoder = config
            .preprocess
            .as_ref()
            .map(|spec| Encoder::new(spec, config.max_buffer_bytes, config.max_model_bytes));
        let groups = config
            .groups
            .as_ref()
            .map(|g| groups::Groups::new(g.first, &g.types, g.known.as_deref()));
        RowDecoder {
            groups,
            first_pass_labels: (0, 0.0),
            held_out: None,
            only_rows: None,
            held_out_row: None,
            label_sketch: None,
            drift: None,
            encoder,
            number_kinds,
            encoded: EncodedRow::default(),
            array_scratch: Vec::new(),
            classes,
            validation: None,
            first_pass_done: false,
            n_features: None,
            checked_features: declared_features,
            checked_classes: 1,
            config,
        }
    }

    pub fn config(&self) -> &PipelineConfig {
        &self.config
    }

    /// `corgipile_drift`: count each input column of the rows decoded from now on in
    /// `counters` (one per column of the column list, in its order).
    pub fn count_columns(&mut self, counters: Vec<Counter>) {
        self.drift = Some(counters);
    }

    /// The counters given to [`count_columns`](Self::count_columns), with the rows since.
    pub fn take_column_counts(&mut self) -> Option<Vec<Counter>> {
        self.drift.take()
    }

    /// A label as decoded, named as the drift profile names classes: the class's value (a
    /// label numbered as a class), or the label's value; "(other)" for a class the model does
    /// not know.
    pub fn label_name(&self, label: f64) -> String {
        if self.config.label.uses_classes() {
            let i = label as usize;
            match self.classes.classes.get(i) {
                Some(c) if label >= 0.0 && label < u32::MAX as f64 => c.to_text(),
                _ => "(other)".into(),
            }
        } else {
            self.config.label.value_text(label)
        }
    }

    /// The class dictionary: the classes seen (or given), in order of first appearance.
    pub fn classes(&self) -> &ClassDictionary {
        &self.classes
    }

    /// The held-out validation rows, once the first pass collected them.
    pub fn validation(&self) -> Option<&TupleArena> {
        self.validation.as_ref()
    }

    /// Records, from now on, which rows are kept as held-out rows (see `take_held_out`).
    pub fn record_held_out(&mut self) {
        self.held_out = Some(Vec::new());
    }

    /// The held-out rows recorded since `record_held_out` (None if it was not called).
    pub fn take_held_out(&mut self) -> Option<HeldOutRows> {
        self.held_out.take().map(HeldOutRows::new)
    }

    /// The memory the recorded held-out rows take.
    pub fn held_out_bytes(&self) -> usize {
        self.held_out
            .as_ref()
            .map_or(0, |v| v.capacity() * std::mem::size_of::<RowId>())
    }

    /// Scores only `rows` from now on (a gate's evaluation); every other row is passed over.
    pub fn score_only(&mut self, rows: Arc<HeldOutRows>) {
        self.only_rows = Some(rows);
    }

    /// The end of a pass over the table: validation rows are collected once.
    pub fn end_of_pass(&mut self) {
        self.first_pass_done = true;
    }

    /// The validation rows were collected by an earlier call (a shard's first epoch): they
    /// are skipped, uncounted, from the start.
    pub fn validation_collected(&mut self) {
        self.first_pass_done = true;
    }

    /// The held-out validation rows collected so far, taken (a shard keeps each round's).
    pub fn take_validation(&mut self) -> Option<TupleArena> {
        self.validation.take()
    }

    /// Where a row goes, and its label as the trainer sees it; or why it is skipped.
    ///
    /// # Safety
    /// `values`/`nulls` hold the query's columns (label, features..., validation column);
    /// `tid` is the row's, `table` its leaf table (None for the scanned table itself).
    pub unsafe fn target(
        &mut self,
        values: *mut pg_sys::Datum,
        nulls: *mut bool,
        tid: &pg_sys::ItemPointerData,
        table: Option<pg_sys::Oid>,
    ) -> Result<(Target, f64), Skip> {
        if let Some(only) = &self.only_rows {
            if !only.contains(RowId::of(tid, table)) {
                return Err(Skip::Uncounted);
            }
        }
        let target = match self.config.validation_split {
            ValidationSplit::None => Target::Train,
            ValidationSplit::Column(c) => {
                if !*nulls.add(c) && (*values.add(c)).value() & 0xff != 0 {
                    Target::Validation
                } else {
                    Target::Train
                }
            }
            ValidationSplit::Fraction(f) => {
                if tid_fraction(tid, table) < f {
                    Target::Validation
                } else {
                    Target::Train
                }
            }
        };
        if target == Target::Validation && self.first_pass_done {
            return Err(Skip::Uncounted); // collected during the first pass already
        }
        if target == Target::Validation && self.is_learning() {
            return Err(Skip::Uncounted); // encoded once the statistics pass has learned how
        }
        let feature_nulls = match self.config.layout {
            FeatureLayout::Dense { .. } => *nulls.add(1),
            FeatureLayout::Sparse { .. } => *nulls.add(1) || *nulls.add(2),
            FeatureLayout::Tabular => {
                !*nulls.add(0) && matches!(self.column_nulls(nulls, tid), Nulls::Skip)
            }
        };
        if *nulls.add(0) || feature_nulls {
            return Err(Skip::Counted);
        }
        let label = self.decode_label(*values.add(0), tid);
        if target == Target::Train {
            self.count_label(label);
        }
        let held_out = target == Target::Validation || self.config.mode == Mode::Collect;
        if self.held_out.is_some() && held_out {
            self.held_out_row = Some(RowId::of(tid, table));
        }
        Ok((target, label))
    }

    /// Counts a training row's label while the first pass reads.
    #[inline]
    fn count_label(&mut self, label: f64) {
        if !self.first_pass_done {
            self.first_pass_labels.0 += 1;
            self.first_pass_labels.1 += label * label;
        }
    }

    /// The mean square of the labels (as the trainer sees them) of the training rows the first
    /// pass read; None before any.
    pub fn label_square_mean(&self) -> Option<f64> {
        let (rows, squares) = self.first_pass_labels;
        (rows > 0).then(|| squares / rows as f64)
    }

    /// Decodes a row [`target`](Self::target) sent to training into `arena`, or to validation
    /// into the held-out rows. False when the row is skipped after all (empty dense features,
    /// or a column list's NULL): count it as skipped.
    ///
    /// # Safety
    /// As for [`target`](Self::target), with the same row.
    pub unsafe fn decode(
        &mut self,
        target: Target,
        label: f64,
        arena: Option<&mut TupleArena>,
        values: *mut pg_sys::Datum,
        nulls: *mut bool,
        tid: &pg_sys::ItemPointerData,
    ) -> bool {
        // The row `target` sent here, if it is to be recorded as held out.
        let held_out_row = self.held_out_row.take();
        let tabular = self.config.layout == FeatureLayout::Tabular;
        let mut arena = arena;
        if let (Some(groups), Some(a), Target::Train) = (&mut self.groups, &mut arena, target) {
            if a.set_grouped().is_err() {
                raise(
                    PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
                    "out of memory for the rows' groups of a buffer",
                    None,
                );
            }
            a.set_next_group(groups.of_row(values, nulls));
        }
        let pushed = match (target, arena) {
            (Target::Train, Some(a)) if tabular => {
                self.decode_columns(a, label, values, nulls, tid);
                true
            }
            (Target::Train, Some(a)) => decode_features(
                &self.config.layout,
                &mut self.n_features,
                a,
                label,
                values,
                tid,
            ),
            (Target::Train, None) => unreachable!("a training row needs an arena"),
            (Target::Validation, _) => {
                let mut v = self.validation.take().unwrap_or_else(|| self.empty_arena());
                let pushed = if tabular {
                    self.decode_columns(&mut v, label, values, nulls, tid);
                    true
                } else {
                    decode_features(
                        &self.config.layout,
                        &mut self.n_features,
                        &mut v,
                        label,
                        values,
                        tid,
                    )
                };
                self.validation = Some(v);
                self.check_validation_memory();
                pushed
            }
        };
        if !pushed {
            return false;
        }
        if let (Some(rows), Some(row)) = (&mut self.held_out, held_out_row) {
            if rows.try_reserve(1).is_err() {
                raise(
                    PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
                    "out of memory recording the held-out rows",
                    None,
                );
            }
            rows.push(row);
        }
        let dimension = match (self.config.layout, target) {
            (FeatureLayout::Dense { .. }, _) => self.n_features.unwrap_or(0),
            // Checked when the statistics pass fixes the preprocessing.
            (FeatureLayout::Tabular, _) => 0,
            (FeatureLayout::Sparse { .. }, Target::Train) => 0,
            (FeatureLayout::Sparse { .. }, Target::Validation) => {
                self.validation.as_ref().map_or(0, |a| a.n_features())
            }
        };
        self.check_dimension(dimension, tid);
        true
    }

    /// Whether every row goes to training as dense features with nothing decided per row
    /// besides its values (no validation split, no groups, no held-out row recorded or
    /// picked out): then [`push_dense_row`](Self::push_dense_row) does what `target` and
    /// `decode` would.
    pub fn dense_rows_only(&self) -> bool {
        matches!(self.config.layout, FeatureLayout::Dense { .. })
            && matches!(self.config.validation_split, ValidationSplit::None)
            && self.groups.is_none()
            && self.held_out.is_none()
            && self.only_rows.is_none()
    }

    /// A row of a [`dense_rows_only`](Self::dense_rows_only) query (label, features) decoded
    /// into `arena`, exactly as `target` then `decode` would; false when it is skipped (a NULL
    /// or empty array: count it as skipped).
    ///
    /// # Safety
    /// As for [`target`](Self::target); `values`/`nulls` hold the query's two columns.
    #[inline]
    pub unsafe fn push_dense_row(
        &mut self,
        arena: &mut TupleArena,
        values: &[pg_sys::Datum],
        nulls: &[bool],
        tid: &pg_sys::ItemPointerData,
    ) -> bool {
        if nulls[0] || nulls[1] {
            return false;
        }
        let label = self.decode_label(values[0], tid);
        self.count_label(label);
        let row = values.as_ptr().cast_mut();
        if !decode_features(
            &self.config.layout,
            &mut self.n_features,
            arena,
            label,
            row,
            tid,
        ) {
            return false;
        }
        self.check_dimension(self.n_features.unwrap_or(0), tid);
        true
    }

    /// A sparse training row made the arena `dimension` wide: the model must fit it.
    pub fn check_dimension(&mut self, dimension: usize, tid: &pg_sys::ItemPointerData) {
        if dimension > self.checked_features && self.config.mode == Mode::Train {
            self.check_model_size(dimension, self.checked_classes, tid);
            self.checked_features = dimension;
        }
    }

    /// An empty arena of the rows' kind (dense of the known width, or sparse).
    pub fn empty_arena(&self) -> TupleArena {
        match self.config.layout {
            FeatureLayout::Dense { .. } => TupleArena::new(self.n_features.unwrap_or(0), 0),
            FeatureLayout::Sparse { .. } | FeatureLayout::Tabular => TupleArena::new_sparse(0, 0),
        }
    }

    /// An arena tuple's bytes for a row like this one (dense: its length; sparse: its number
    /// of non-zeros; a column list: its estimated encoded non-zeros), for sizing buffers.
    ///
    /// # Safety
    /// As for [`target`](Self::target).
    pub unsafe fn bytes_per_tuple(&self, values: *mut pg_sys::Datum, nulls: *mut bool) -> usize {
        match self.config.layout {
            FeatureLayout::Dense { .. } => {
                let n = with_float_array(*values.add(1), |f| f.len()).unwrap_or(0);
                TupleArena::bytes_per_tuple(self.n_features.unwrap_or(n))
            }
            FeatureLayout::Sparse { .. } => {
                let nnz = with_int4_array(*values.add(1), |i| i.len()).unwrap_or(0);
                TupleArena::bytes_per_sparse_tuple(nnz.max(1))
            }
            FeatureLayout::Tabular => {
                let encoder = self.encoder.as_ref().expect("a column list has an encoder");
                TupleArena::bytes_per_sparse_tuple(encoder.estimated_nnz(values, nulls))
            }
        }
    }

    /// Held-out rows stay in memory for the whole training: same bound as the buffers.
    fn check_validation_memory(&self) {
        // A gated training's record of which rows they are counts too.
        let used = self.validation.as_ref().map_or(0, |v| v.bytes_used()) + self.held_out_bytes();
        if used as u64 > self.config.max_buffer_bytes {
            raise(
                PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                format!(
                    "the validation rows of {} do not fit in corgipile.max_buffer_memory",
                    self.config.relation
                ),
                Some(
                    "Hold out a smaller fraction, or evaluate afterwards with corgipile_evaluate()."
                        .into(),
                ),
            );
        }
    }

    /// Raise unless a model of `features` × `classes` fits corgipile.max_model_memory.
    fn check_model_size(&self, features: usize, classes: usize, tid: &pg_sys::ItemPointerData) {
        let source = match self.config.layout {
            _ if classes > self.checked_classes => format!(
                "the classes of the label column, up to the row at ctid {}",
                format_tid(tid)
            ),
            FeatureLayout::Sparse {
                n_features: Some(_),
                ..
            } => "the n_features param".to_string(),
            FeatureLayout::Sparse { .. } => format!(
                "the largest feature index, in the row at ctid {}",
                format_tid(tid)
            ),
            FeatureLayout::Tabular => "the encoded feature columns".to_string(),
            FeatureLayout::Dense { .. } => format!(
                "the length of the features, in the row at ctid {}",
                format_tid(tid)
            ),
        };
        crate::pg::guc::check_model_size(
            features as u64,
            classes as u64,
            self.config.max_model_bytes,
            &source,
        );
    }

    /// `"group_by"`: ends the statistics pass's count of the groups (see `Groups::number`).
    pub fn number_groups(&mut self, min_rows: u64) -> Option<GroupsFound> {
        self.groups.as_mut().map(|g| g.number(min_rows))
    }

    /// The preprocessing, once learned (or given).
    pub fn preprocessor(&self) -> Option<&Preprocessor> {
        match &self.encoder {
            Some(Encoder::Ready(p)) => Some(p),
            _ => None,
        }
    }

    /// What the statistics pass learned of a column list so far, as a shard sends it to its
    /// coordinator (None: no column list being learned); an error without memory for it.
    pub fn statistics_part(&self) -> Option<Result<StatsPart, PreprocessError>> {
        match &self.encoder {
            Some(Encoder::Learning(s)) => Some(s.part()),
            _ => None,
        }
    }

    /// Whether the statistics pass is learning a column list's preprocessing.
    pub fn is_learning(&self) -> bool {
        matches!(self.encoder, Some(Encoder::Learning(_)))
    }

    /// Whether the statistics pass learns a column list's category dictionaries (one-hot
    /// columns: a sample of the rows could miss a category).
    pub fn learns_categories(&self) -> bool {
        match &self.encoder {
            Some(Encoder::Learning(s)) => s.plans().iter().any(|p| p.keeps_categories()),
            _ => false,
        }
    }

    /// The scaling the trainer applies for a ready preprocessing (`center`: false without an
    /// intercept, which centering would bring back).
    pub fn scaling(&self, center: bool) -> Option<Standardizer> {
        Some(self.preprocessor()?.scaling(center))
    }
}

/// A fixed pseudo-random number in [0, 1) per tuple id: which rows a validation fraction holds
/// out is deterministic (same rows in every epoch and every run).
pub fn tid_fraction(tid: &pg_sys::ItemPointerData, table: Option<pg_sys::Oid>) -> f64 {
    let block = (tid.ip_blkid.bi_hi as u64) << 16 | tid.ip_blkid.bi_lo as u64;
    // A row of a partition or child table: the same ctid exists in every leaf, so the leaf is
    // part of the key (a plain table's split is as before).
    let salt = table.map_or(0, |t| {
        (t.to_u32() as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93)
    });
    let x = corgipile_ml::hash::splitmix64((block << 16 | tid.ip_posid as u64) ^ salt);
    (x >> 11) as f64 / (1u64 << 53) as f64
}
