//! The label of a row as the trainer sees it (a value, or a class index from the class
//! dictionary), and the checks a new class or a wider row triggers: at most MAX_CLASSES
//! classes, a binary classifier's third class, and corgipile.max_model_memory.

use super::RowDecoder;
use crate::decode::classes::UNKNOWN_CLASS;
use crate::decode::datum::format_tid;
use crate::pg::error::raise;
use crate::pipeline::{LabelCoding, LabelKind, Mode};

use corgipile_ml::trainer::MAX_CLASSES;
use pgrx::{pg_sys, FromDatum, PgSqlErrorCode};

/// 2^53: every integer up to it is exactly one float8.
const EXACT_LABEL_LIMIT: f64 = 9_007_199_254_740_992.0;

impl RowDecoder {
    /// The f64 the trainer sees for this label datum (a value or a class index).
    ///
    /// # Safety
    /// `datum` is the row's non-NULL label, of the type the label coding was made for (text
    /// for a class of text: a pointer to a live text value), valid for this call.
    pub(super) unsafe fn decode_label(
        &mut self,
        datum: pg_sys::Datum,
        tid: &pg_sys::ItemPointerData,
    ) -> f64 {
        let finite = |v: f64| -> f64 {
            if !v.is_finite() {
                raise(
                    PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
                    format!("row at ctid {}: label is {}", format_tid(tid), v),
                    Some("Labels must be finite numbers. Train on a copy without such rows, e.g. CREATE TABLE t2 AS SELECT * FROM t WHERE label NOT IN ('NaN', 'Infinity', '-Infinity').".into()),
                );
            }
            v
        };
        // A classifier's labels are told apart as float8: two bigint or numeric labels beyond
        // 2^53 can be the same float8 and would silently become one class.
        let class_value = |kind: LabelKind, v: f64| -> f64 {
            if matches!(kind, LabelKind::Int8 | LabelKind::Float8) && v.abs() >= EXACT_LABEL_LIMIT {
                raise(
                    PgSqlErrorCode::ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
                    format!("row at ctid {}: label {v} is at or beyond 2^53, where different numbers can become the same float8", format_tid(tid)),
                    Some("Classifier labels are classes: give them as integers of magnitude below 2^53, or as text (e.g. train on a view or copy with label::text).".into()),
                );
            }
            v
        };
        let class = match self.config.label {
            LabelCoding::Value(kind) if self.config.model.is_classifier() => {
                return class_value(kind, finite(kind.to_f64(datum)))
            }
            LabelCoding::Value(kind) => return finite(kind.to_f64(datum)),
            LabelCoding::ClassOfValue(kind) => self
                .classes
                .index_of_number(class_value(kind, finite(kind.to_f64(datum)))),
            LabelCoding::ClassOfText => {
                // SAFETY: the label column was cast to text in the query; the datum is non-NULL.
                let text = <&str as FromDatum>::from_datum(datum, false).unwrap_or("");
                self.classes.index_of_text(text.as_bytes())
            }
        };
        if class == UNKNOWN_CLASS {
            return class as f64; // evaluation: a label the model does not know
        }
        // A binary classifier over text labels: a third class is an error now, before the
        // dictionary grows with every distinct label of the table.
        if self.config.model.is_binary() && class >= 2 && self.config.mode == Mode::Train {
            let c = &self.classes.classes;
            raise(
                PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
                format!(
                    "the label column has more than two distinct values (saw {}, {} and {})",
                    c[0].to_text(), c[1].to_text(), c[class as usize].to_text()
                ),
                Some("svm and logistic are binary classifiers: the label must have exactly two distinct values (softmax handles more).".into()),
            );
        }
        if class as usize >= MAX_CLASSES {
            raise(
                PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                format!("the label column of {} has more than {MAX_CLASSES} distinct values (row at ctid {})", self.config.relation, format_tid(tid)),
                Some(format!("softmax supports at most {MAX_CLASSES} classes.")),
            );
        }
        // Softmax has one output per class: check each new class before the trainer grows.
        if self.config.model.has_class_outputs()
            && class as usize >= self.checked_classes
            && self.config.mode == Mode::Train
        {
            let classes = class as usize + 1;
            self.check_model_size(self.checked_features, classes, tid);
            self.checked_classes = classes;
        }
        class as f64
    }
}
