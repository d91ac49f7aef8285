//! Rows given to a prediction (`corgipile_predict('churn', c) FROM customers c`): the model's
//! columns of the row's type, read in place and encoded by the model's stored preprocessing,
//! as the training rows were (see `columns`).

use super::datum::{array_len, float_array_into, numeric_to_f64, with_text_bytes, ArrayProblem};
use crate::pg::error::raise;
use crate::pipeline::LabelKind;
use corgipile_ml::preprocess::{EncodedRow, NullAction, Preprocessor, Source};
use corgipile_ml::row::Row;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;
use std::ffi::CStr;

/// How a row column's datum is read.
#[derive(Clone, Copy)]
pub enum Read {
    /// boolean, integers, float4, float8: the datum itself.
    Number(LabelKind),
    Numeric,
    /// text, varchar (and domains over them): the bytes in place.
    Text,
    /// char(n): the bytes without trailing blanks, as `::text` gives them in training.
    Bpchar,
    /// name, enums: the type's output function.
    Output(pg_sys::Oid),
    /// float8[] / float4[].
    FloatArray,
    /// Other numeric arrays (int2/int4/int8/numeric elements), converted element by element.
    NumberArray(pg_sys::Oid),
    /// date, timestamp, timestamptz, time, interval (the base type): seconds, by the functions
    /// the training query called (see `time_seconds`).
    Time(pg_sys::Oid),
}

/// How a column of `source`'s kind and of type `base` (a base type) is read; None if it cannot
/// be.
pub fn read_for(source: Source, base: pg_sys::Oid) -> Option<Read> {
    match (source, base) {
        (Source::Number, pg_sys::NUMERICOID) => Some(Read::Numeric),
        (Source::Number, b) => LabelKind::from_type(b).map(Read::Number),
        (Source::Text, pg_sys::TEXTOID | pg_sys::VARCHAROID) => Some(Read::Text),
        (Source::Text, pg_sys::BPCHAROID) => Some(Read::Bpchar),
        // SAFETY: a catalog lookup (FFI) on the backend thread, inside the transaction of the
        // SQL call.
        (Source::Text, b) if b == pg_sys::NAMEOID || unsafe { pg_sys::type_is_enum(b) } => {
            let (mut output, mut varlena) = (pg_sys::Oid::INVALID, false);
            // SAFETY: as above, writing into the two locals.
            unsafe { pg_sys::getTypeOutputInfo(b, &mut output, &mut varlena) };
            Some(Read::Output(output))
        }
        (Source::NumberArray, pg_sys::FLOAT8ARRAYOID | pg_sys::FLOAT4ARRAYOID) => {
            Some(Read::FloatArray)
        }
        (Source::Time(kind), b) => {
            use corgipile_ml::preprocess::TimeKind;
            let fits = match kind {
                TimeKind::Date => b == pg_sys::DATEOID,
                TimeKind::Timestamp => b == pg_sys::TIMESTAMPOID || b == pg_sys::TIMESTAMPTZOID,
                TimeKind::Time => b == pg_sys::TIMEOID,
                TimeKind::Interval => b == pg_sys::INTERVALOID,
            };
            fits.then_some(Read::Time(b))
        }
        // SAFETY: as above.
        (Source::NumberArray, b) => match unsafe { pg_sys::get_element_type(b) } {
            e @ (pg_sys::INT2OID | pg_sys::INT4OID | pg_sys::INT8OID | pg_sys::NUMERICOID) => {
                Some(Read::NumberArray(e))
            }
            _ => None,
        },
        _ => None,
    }
}

/// The model's columns of a row type, read from a row and encoded by the model's
/// preprocessing: per model column, its attribute and how to read it, and reusable scratch.
pub struct RecordColumns {
    columns: Vec<(usize, Read)>,
    values: Vec<pg_sys::Datum>,
    nulls: Vec<bool>,
    encoded: EncodedRow,
    scratch: Vec<f64>,
    numeric_text: String,
}

impl RecordColumns {
    pub fn new(columns: Vec<(usize, Read)>, natts: usize) -> RecordColumns {
        RecordColumns {
            columns,
            values: vec![pg_sys::Datum::from(0usize); natts],
            nulls: vec![true; natts],
            encoded: EncodedRow::default(),
            scratch: Vec::new(),
            numeric_text: String::new(),
        }
    }

    /// Reads every attribute of a row (`header`, of the type `desc` describes), to be encoded
    /// by [`encode_deformed`](Self::encode_deformed) and read by [`value`](Self::value).
    ///
    /// # Safety
    /// `header` is a row of the type `desc` describes (a valid tuple descriptor), both valid
    /// for this call.
    pub unsafe fn deform(&mut self, header: pg_sys::HeapTupleHeader, desc: pg_sys::TupleDesc) {
        let mut tuple = pg_sys::HeapTupleData {
            // The 4-byte varlena header of a (detoasted) composite datum holds its length.
            t_len: (*header).t_choice.t_datum.datum_len_ as u32 >> 2,
            t_self: pg_sys::ItemPointerData::default(),
            t_tableOid: pg_sys::Oid::INVALID,
            t_data: header,
        };
        pg_sys::heap_deform_tuple(
            &mut tuple,
            desc,
            self.values.as_mut_ptr(),
            self.nulls.as_mut_ptr(),
        );
    }

    /// Takes the row's attributes from `values` (datum, is NULL), in attribute order: the
    /// column arguments of a rewritten prediction call, in place of a row to deform.
    pub fn read_arguments(&mut self, values: impl Iterator<Item = (pg_sys::Datum, bool)>) {
        for ((value, null), (v, n)) in self
            .values
            .iter_mut()
            .zip(self.nulls.iter_mut())
            .zip(values)
        {
            *value = v;
            *null = n;
        }
    }

    /// Attribute `at` of the row read last (None: NULL).
    pub fn value(&self, at: usize) -> Option<pg_sys::Datum> {
        (!self.nulls[at]).then(|| self.values[at])
    }

    /// The row read last ([`deform`](Self::deform)) encoded by the model's preprocessing `p`;
    /// None when a NULL makes the model skip such rows.
    ///
    /// # Safety
    /// The row [`deform`](Self::deform) read is still valid (its by-reference datums point
    /// into it).
    pub unsafe fn encode_deformed(&mut self, p: &Preprocessor) -> Option<Row<'_>> {
        let row = &mut self.encoded;
        row.clear();
        for (i, &(at, read)) in self.columns.iter().enumerate() {
            let (datum, null) = (self.values[at], self.nulls[at]);
            if null {
                match p.null_action(i) {
                    NullAction::Encode => {}
                    NullAction::Skip => return None,
                    NullAction::Error => raise(
                        PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
                        format!("column \"{}\" is NULL", p.columns[i].name),
                        Some(
                            "The model was trained with \"impute\": \"error\" for this column."
                                .into(),
                        ),
                    ),
                }
            }
            let result = match read {
                Read::Text | Read::Bpchar | Read::Output(_) => {
                    if null {
                        p.text(i, None, row);
                    } else {
                        match read {
                            Read::Output(f) => {
                                let text = pg_sys::OidOutputFunctionCall(f, datum);
                                p.text(i, Some(CStr::from_ptr(text).to_bytes()), row);
                                pg_sys::pfree(text.cast());
                            }
                            Read::Bpchar => with_text_bytes(datum, |b| {
                                let end = b.iter().rposition(|&c| c != b' ').map_or(0, |e| e + 1);
                                p.text(i, Some(&b[..end]), row)
                            }),
                            _ => with_text_bytes(datum, |b| p.text(i, Some(b), row)),
                        }
                    }
                    Ok(())
                }
                Read::Time(base) => {
                    let v = (!null).then(|| time_seconds(datum, base, p.zone(i)));
                    p.time(i, v, row)
                }
                Read::FloatArray | Read::NumberArray(_) => {
                    let values = if null {
                        None
                    } else {
                        // Shape first: an array of another length is refused before its
                        // elements are converted (an int2[] grows 4× as f64).
                        let bad = |problem: String| -> ! {
                            raise(
                                PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
                                format!("column \"{}\": {problem}", p.columns[i].name),
                                None,
                            )
                        };
                        let expected = p.array_len(i);
                        let wrong_len = |n: usize| -> ! {
                            if n == 0 {
                                bad(format!("the array is empty, expected {expected} elements"))
                            }
                            bad(format!("the array has {n} elements, expected {expected}"))
                        };
                        let accept = |n: usize| if n == expected { Ok(()) } else { Err(n) };
                        match read {
                            Read::NumberArray(element) => {
                                match array_len(datum) {
                                    Ok(n) => accept(n).unwrap_or_else(|n| wrong_len(n)),
                                    Err(ArrayProblem::Empty) => {
                                        accept(0).unwrap_or_else(|n| wrong_len(n))
                                    }
                                    Err(problem) => bad(problem.to_string()),
                                }
                                self.scratch.clear();
                                if !number_array(datum, element, &mut self.scratch) {
                                    bad("the array contains NULL elements".into());
                                }
                            }
                            _ => match float_array_into(datum, &mut self.scratch, accept) {
                                Ok(Ok(())) => {}
                                Ok(Err(n)) => wrong_len(n),
                                Err(problem) => bad(problem.to_string()),
                            },
                        }
                        Some(self.scratch.as_slice())
                    };
                    p.array(i, values, row)
                }
                number => {
                    let v = (!null).then(|| match number {
                        Read::Number(kind) => kind.to_f64(datum),
                        _ => numeric_to_f64(datum, &mut self.numeric_text).unwrap_or_else(|| {
                            pgrx::direct_function_call::<f64>(
                                pg_sys::numeric_float8,
                                &[Some(datum)],
                            )
                            .unwrap_or(f64::NAN)
                        }),
                    });
                    p.number(i, v, row)
                }
            };
            if let Err(e) = result {
                raise(PgSqlErrorCode::ERRCODE_DATA_EXCEPTION, e.to_string(), None);
            }
        }
        Some(Row::Sparse {
            indices: &self.encoded.indices,
            values: &self.encoded.values,
        })
    }
}

/// A date/time datum of type `base` as the training query read it: `date_part('epoch', ...)`
/// of the value (a timestamptz on the wall clock of `zone`; a date as its days since
/// 1970-01-01 times 86,400, which date_part gives its timestamp).
///
/// # Safety
/// Backend thread; `datum` is a non-NULL value of `base`.
unsafe fn time_seconds(datum: pg_sys::Datum, base: pg_sys::Oid, zone: Option<&str>) -> f64 {
    let epoch = "epoch".into_datum();
    let part =
        |f, value| pgrx::direct_function_call::<f64>(f, &[epoch, Some(value)]).unwrap_or(f64::NAN);
    let timestamp = |value| {
        pgrx::direct_function_call::<pg_sys::Datum>(
            pg_sys::timestamptz_zone,
            &[zone.unwrap_or("UTC").into_datum(), Some(value)],
        )
        .unwrap_or(value)
    };
    match base {
        // As the training query reads a date (see `query::column_source`): its days since
        // 1970-01-01 times 86,400, without the cast to timestamp (which fails after 294276
        // AD); an infinite date is ±Infinity, as date_part gives it.
        pg_sys::DATEOID => match datum.value() as i32 {
            i32::MIN => f64::NEG_INFINITY,
            i32::MAX => f64::INFINITY,
            days => (f64::from(days) + 10_957.0) * 86_400.0,
        },
        pg_sys::TIMESTAMPTZOID => part(pg_sys::timestamp_part, timestamp(datum)),
        pg_sys::TIMEOID => part(pg_sys::time_part, datum),
        pg_sys::INTERVALOID => part(pg_sys::interval_part, datum),
        _ => part(pg_sys::timestamp_part, datum),
    }
}

/// The elements of an int2/int4/int8/numeric array as f64 into `out`; false if one is NULL.
unsafe fn number_array(datum: pg_sys::Datum, element: pg_sys::Oid, out: &mut Vec<f64>) -> bool {
    use pgrx::{AnyNumeric, Array, FromDatum};
    let t = pg_sys::get_array_type(element);
    macro_rules! take {
        ($ty:ty, $to_f64:expr) => {{
            let Some(a) = Array::<$ty>::from_polymorphic_datum(datum, false, t) else {
                return true;
            };
            for v in a.iter() {
                match v {
                    Some(v) => out.push($to_f64(v)),
                    None => return false,
                }
            }
            true
        }};
    }
    match element {
        pg_sys::INT2OID => take!(i16, |v: i16| v as f64),
        pg_sys::INT4OID => take!(i32, |v: i32| v as f64),
        pg_sys::INT8OID => take!(i64, |v: i64| v as f64),
        _ => take!(AnyNumeric, |v: AnyNumeric| f64::try_from(v)
            .unwrap_or(f64::NAN)),
    }
}
