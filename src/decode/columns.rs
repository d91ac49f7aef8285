//! Column lists: each row's columns (numbers as stored, text or float8[] datums, as the query
//! reads them) go to the statistics pass while the preprocessing is learned, then are encoded into
//! sparse rows by it. Backend thread only (datums are read in place).

use super::RowDecoder;
use crate::decode::datum::{float_array_into, format_tid, with_float_array, with_text_bytes};
use crate::pg::error::raise;
use crate::pipeline::LabelKind;
use crate::pipeline::PreprocessSpec;
use corgipile_ml::arena::TupleArena;
use corgipile_ml::limits::model_memory_bytes;
use corgipile_ml::preprocess::profile::{ColumnProfile, LabelSketch, NumberSketch};
use corgipile_ml::preprocess::{
    ColumnPlan, NullAction, PreprocessError, Preprocessor, Source, StatsBuilder,
};
use corgipile_ml::stats::Standardizer;
use pgrx::{pg_sys, PgSqlErrorCode};

/// The preprocessing of a column list: being learned, or ready to encode.
pub enum Encoder {
    Learning(StatsBuilder),
    Ready(Preprocessor),
}

impl Encoder {
    /// `max_dictionary_bytes`: corgipile.max_buffer_memory; `max_model_bytes`:
    /// corgipile.max_model_memory (which bounds an array column's length).
    pub fn new(spec: &PreprocessSpec, max_dictionary_bytes: u64, max_model_bytes: u64) -> Encoder {
        match spec {
            PreprocessSpec::Learn { plans, .. } => match StatsBuilder::new(
                plans.clone(),
                usize::try_from(max_dictionary_bytes).unwrap_or(usize::MAX),
                usize::try_from(max_model_bytes / model_memory_bytes(1, 1)).unwrap_or(usize::MAX),
            ) {
                Ok(stats) => Encoder::Learning(stats),
                Err(e) => raise(
                    PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                    e.to_string(),
                    Some(SKETCHES_HINT.into()),
                ),
            },
            PreprocessSpec::Fixed(p) => {
                let p = p.clone();
                if p.prepare().is_err() {
                    raise_out_of_memory();
                }
                Encoder::Ready(p)
            }
        }
    }

    fn sources(&self) -> impl Iterator<Item = (Source, NullAction, &str)> {
        let (plans, ready): (&[ColumnPlan], _) = match self {
            Encoder::Learning(s) => (s.plans(), None),
            Encoder::Ready(p) => (&[], Some(p)),
        };
        let learning = plans
            .iter()
            .map(|p| (p.source, p.null_action(), p.name.as_str()));
        let ready = ready.into_iter().flat_map(|p| {
            p.columns
                .iter()
                .enumerate()
                .map(move |(i, c)| (c.source, p.null_action(i), c.name.as_str()))
        });
        learning.chain(ready)
    }

    /// Estimated non-zeros of a row (for sizing buffers): numbers and text columns one each,
    /// arrays their length in this row.
    ///
    /// # Safety
    /// `values`/`nulls` point to the row's arrays of the query's columns (label, then the
    /// column list's columns), valid for this call, each non-NULL datum a valid value of its
    /// column's type.
    pub unsafe fn estimated_nnz(&self, values: *mut pg_sys::Datum, nulls: *mut bool) -> usize {
        self.sources()
            .enumerate()
            .map(|(i, (source, _, _))| match source {
                Source::NumberArray if !*nulls.add(1 + i) => {
                    with_float_array(*values.add(1 + i), |a| a.len()).unwrap_or(0)
                }
                _ => 1,
            })
            .sum::<usize>()
            .max(1)
    }
}

/// What the NULLs of a row ask for.
pub enum Nulls {
    Keep,
    Skip,
}

impl RowDecoder {
    /// The NULL policy on a row's columns: keep it (NULLs imputed), skip it, or an ERROR.
    ///
    /// # Safety
    /// `nulls` points to the row's NULL flags of the query's columns (label, then the column
    /// list's columns), valid for this call.
    pub(super) unsafe fn column_nulls(
        &self,
        nulls: *mut bool,
        tid: &pg_sys::ItemPointerData,
    ) -> Nulls {
        let encoder = self.encoder.as_ref().expect("a column list has an encoder");
        let mut result = Nulls::Keep;
        for (i, (_, action, name)) in encoder.sources().enumerate() {
            if !*nulls.add(1 + i) {
                continue;
            }
            match action {
                NullAction::Encode => {}
                NullAction::Skip => result = Nulls::Skip,
                NullAction::Error => raise(
                    PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
                    format!("row at ctid {}: column \"{name}\" is NULL", format_tid(tid)),
                    Some(format!("The model was told \"impute\": \"error\" for \"{name}\"; use \"mean\", \"zero\" (numbers), \"category\" (text) or \"skip\" to accept NULLs.")),
                ),
            }
        }
        result
    }

    /// Learn from or encode one kept training row into `arena` (learning: the label only, so
    /// that the statistics pass still counts classes).
    ///
    /// # Safety
    /// `values`/`nulls` point to the row's arrays of the query's columns (label, then the
    /// column list's columns), valid for this call, each non-NULL datum a valid value of its
    /// column's type.
    pub(super) unsafe fn decode_columns(
        &mut self,
        arena: &mut TupleArena,
        label: f64,
        values: *mut pg_sys::Datum,
        nulls: *mut bool,
        tid: &pg_sys::ItemPointerData,
    ) {
        let mut row = std::mem::take(&mut self.encoded);
        row.clear();
        let mut scratch = std::mem::take(&mut self.array_scratch);
        let encoder = self.encoder.as_mut().expect("a column list has an encoder");
        let n = match encoder {
            Encoder::Learning(s) => {
                s.begin_row();
                let classifier = self.config.model.is_classifier();
                self.label_sketch
                    .get_or_insert_with(|| {
                        if classifier {
                            LabelSketch::Classes(Default::default())
                        } else {
                            LabelSketch::Number(Default::default(), Box::new(NumberSketch::new()))
                        }
                    })
                    .push(label);
                s.plans().len()
            }
            Encoder::Ready(p) => p.columns.len(),
        };
        // corgipile_drift: the raw values are counted as they are encoded.
        let mut drift = self.drift.take();
        for i in 0..n {
            let (datum, null) = (*values.add(1 + i), *nulls.add(1 + i));
            let source = match encoder {
                Encoder::Learning(s) => s.plans()[i].source,
                Encoder::Ready(p) => p.columns[i].source,
            };
            let result = match source {
                Source::Number => {
                    // SAFETY: a non-NULL value of the column's type, whose kind this is.
                    let kind = self
                        .number_kinds
                        .get(1 + i)
                        .copied()
                        .unwrap_or(LabelKind::Float8);
                    let v = (!null).then(|| kind.to_f64(datum));
                    if let Some(c) = drift.as_mut().and_then(|d| d.get_mut(i)) {
                        c.number(v.filter(|v| v.is_finite()));
                    }
                    match encoder {
                        Encoder::Learning(s) => s.number(i, v),
                        Encoder::Ready(p) => p.number(i, v, &mut row),
                    }
                }
                Source::Time(_) => {
                    // The query reads it as float8 seconds (see query::column_source).
                    let v = (!null).then(|| f64::from_bits(datum.value() as u64));
                    if let Some(c) = drift.as_mut().and_then(|d| d.get_mut(i)) {
                        c.number(v);
                    }
                    match encoder {
                        Encoder::Learning(s) => s.time(i, v),
                        Encoder::Ready(p) => p.time(i, v, &mut row),
                    }
                }
                Source::Text => {
                    let mut count = drift.as_mut().and_then(|d| d.get_mut(i));
                    let mut text = |v: Option<&[u8]>| {
                        if let Some(c) = count.as_mut() {
                            c.text(v);
                        }
                        match encoder {
                            Encoder::Learning(s) => s.text(i, v),
                            Encoder::Ready(p) => {
                                p.text(i, v, &mut row);
                                Ok(())
                            }
                        }
                    };
                    if null {
                        text(None)
                    } else {
                        with_text_bytes(datum, |b| text(Some(b)))
                    }
                }
                Source::NumberArray => {
                    let array = if null {
                        None
                    } else {
                        let read = float_array_into(datum, &mut scratch, |n| match encoder {
                            Encoder::Learning(s) => s.check_array(i, n),
                            Encoder::Ready(p) => p.check_array(i, n),
                        });
                        match read {
                            Ok(Ok(())) => {}
                            Ok(Err(e)) => raise_preprocess_error(e, tid),
                            Err(problem) => raise(
                                PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
                                format!("row at ctid {}: column \"{}\": {problem}", format_tid(tid), column_name(encoder, i)),
                                Some("Array feature columns must be one-dimensional, without NULL elements.".into()),
                            ),
                        }
                        Some(scratch.as_slice())
                    };
                    if let Some(c) = drift.as_mut().and_then(|d| d.get_mut(i)) {
                        c.array(array);
                    }
                    match encoder {
                        Encoder::Learning(s) => s.array(i, array),
                        Encoder::Ready(p) => p.array(i, array, &mut row),
                    }
                }
            };
            if let Err(e) = result {
                raise_preprocess_error(e, tid);
            }
        }
        match encoder {
            Encoder::Learning(_) => arena.push_sparse(label, &[], &[]),
            Encoder::Ready(_) => arena.push_sparse(label, &row.indices, &row.values),
        }
        self.encoded = row;
        self.array_scratch = scratch;
        self.drift = drift;
    }

    /// End of the statistics pass: the preprocessing is fixed, its model size checked, and
    /// the scaling the trainer applies returned (`center`: false without an intercept, which
    /// centering would bring back). The next pass collects held-out rows (the statistics pass
    /// could not encode them yet).
    pub fn finish_statistics(&mut self, classes: usize, center: bool) -> Standardizer {
        let Some(Encoder::Learning(_)) = &self.encoder else {
            unreachable!("statistics are learned once, for a column list")
        };
        let Some(PreprocessSpec::Learn { max_categories, .. }) = &self.config.preprocess else {
            unreachable!("a learning encoder comes from a Learn spec")
        };
        let max_categories = *max_categories as usize;
        let Some(Encoder::Learning(mut stats)) = self.encoder.take() else {
            unreachable!()
        };
        // What corgipile_drift compares today's rows with: the columns' profile and the
        // label's.
        let mut profile = stats
            .profile(max_categories)
            .unwrap_or_else(|_| raise_out_of_memory());
        if let Some(label) = self.label_sketch.take() {
            profile.label = Some(ColumnProfile {
                name: self.config.params.label.clone(),
                summary: label.finish(|v| self.label_name(v)),
            });
        }
        let mut p = stats
            .finish(max_categories)
            .unwrap_or_else(|_| raise_out_of_memory());
        p.profile = Some(Box::new(profile));
        // The kept categories' names and lookup entries count against the model's memory too.
        crate::pg::guc::check_model_and_dictionaries(
            p.n_features as u64,
            classes.max(1) as u64,
            p.category_bytes(),
            self.config.max_model_bytes,
            "the encoded feature columns (numbers, array elements, kept categories and hash buckets)",
        );
        self.checked_features = p.n_features;
        self.encoder = Some(Encoder::Ready(p));
        self.first_pass_done = false;
        self.scaling(center).expect("ready")
    }
}

fn column_name(encoder: &Encoder, i: usize) -> String {
    match encoder {
        Encoder::Learning(s) => s.plans()[i].name.clone(),
        Encoder::Ready(p) => p.columns[i].name.clone(),
    }
}

unsafe fn raise_preprocess_error(e: PreprocessError, tid: &pg_sys::ItemPointerData) -> ! {
    let (code, hint) = code_and_hint(&e);
    raise(
        code,
        format!("row at ctid {}: {e}", format_tid(tid)),
        Some(hint),
    )
}

/// The ERROR of the statistics of a sharded table's feature columns, merged from its shards'
/// (`relation`: the sharded table): what one server's statistics pass over the same rows
/// would raise, without a row to name.
pub fn raise_merged_statistics_error(e: PreprocessError, relation: &str) -> ! {
    let (code, hint) = code_and_hint(&e);
    raise(
        code,
        format!("{relation}, over its shards: {e}"),
        Some(hint),
    )
}

/// A preprocessing error's SQLSTATE and hint.
fn code_and_hint(e: &PreprocessError) -> (PgSqlErrorCode, String) {
    match e {
        PreprocessError::TooManyCategories { column, .. } => (
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!("Hash the column instead: \"preprocess\": {{\"{column}\": {{\"encode\": \"hash\"}}}}, or leave it out."),
        ),
        PreprocessError::ArrayLength { .. } => (
            PgSqlErrorCode::ERRCODE_ARRAY_ELEMENT_ERROR,
            "Every row's array in a feature column must have the same length.".into(),
        ),
        PreprocessError::NotFinite { .. } => (
            PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
            "Feature values must be finite numbers.".into(),
        ),
        PreprocessError::OutOfMemory => raise_out_of_memory(),
        PreprocessError::TooWide { .. } => (
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            "Ask a superuser to raise corgipile.max_model_memory, or leave the column out.".into(),
        ),
        PreprocessError::TooManySketches { .. } => (
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            SKETCHES_HINT.into(),
        ),
    }
}

const SKETCHES_HINT: &str = "Each column encoded \"ple\" needs about 30 kB for its quantiles: encode fewer columns (\"encode\": \"none\"), or ask a superuser to raise corgipile.max_buffer_memory.";

fn raise_out_of_memory() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
        "out of memory for the categories of the feature columns",
        Some("Use a smaller \"max_categories\", hash the columns of many distinct values (\"encode\": \"hash\"), or ask a superuser to lower corgipile.max_buffer_memory / corgipile.max_model_memory to what the server has.".into()),
    )
}
