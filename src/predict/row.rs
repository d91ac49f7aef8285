//! Predictions from a whole row: `corgipile_predict('churn', c) FROM customers c`. The row's
//! columns are matched to the model's by name (once per call site and row type), read in
//! place, and encoded by the model's stored preprocessing, as in training.

use super::{cached_call, ModelArg};
use crate::catalog::StoredModel;
use crate::pg::error::raise;
use crate::pipeline::decode::{
    array_len, float_array_into, is_plain_4b, numeric_to_f64, with_text_bytes, ArrayProblem,
    LabelKind, RecordArg,
};
use corgipile_ml::preprocess::{EncodedRow, NullAction, Preprocessor, Source};
use corgipile_ml::row::Row;
use pgrx::prelude::*;
use pgrx::{PgMemoryContexts, PgSqlErrorCode};
use std::ffi::CStr;

/// How a row column's datum is read.
#[derive(Clone, Copy)]
enum Read {
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
}

/// A row type matched against a model: per model column, its attribute and how to read it.
struct RowLayout {
    model_id: i64,
    type_id: pg_sys::Oid,
    typmod: i32,
    /// The type cache's identifier of the descriptor the layout was built from.
    tupdesc_id: u64,
    /// A copy of the row type's descriptor, in the call site's memory context.
    desc: pg_sys::TupleDesc,
    columns: Vec<(usize, Read)>,
    values: Vec<pg_sys::Datum>,
    nulls: Vec<bool>,
    encoded: EncodedRow,
    scratch: Vec<f64>,
    numeric_text: String,
}

fn not_for_rows(model: &StoredModel) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE,
        format!(
            "model {} was trained on an array of features, not on named columns",
            model.id
        ),
        Some("Pass its features as an array (or an indices/values pair); a row works for models trained with \"features\": [column, ...] or \"*\".".into()),
    )
}

/// The descriptor of a composite datum's row type, and its type id and typmod.
unsafe fn row_type(header: pg_sys::HeapTupleHeader) -> (pg_sys::Oid, i32) {
    let fields = (*header).t_choice.t_datum;
    (fields.datum_typeid, fields.datum_typmod)
}

unsafe fn type_name(oid: pg_sys::Oid) -> String {
    CStr::from_ptr(pg_sys::format_type_be(oid))
        .to_string_lossy()
        .into_owned()
}

/// The type cache's identifier of a row type's current descriptor: it changes whenever the
/// type is altered (and this backend has read the invalidation), also in the middle of a
/// statement. A blessed anonymous record type (RECORD with a typmod) never changes: 0.
unsafe fn tupdesc_identifier(type_id: pg_sys::Oid) -> u64 {
    if type_id == pg_sys::RECORDOID {
        return 0;
    }
    let entry = pg_sys::lookup_type_cache(type_id, pg_sys::TYPECACHE_TUPDESC as i32);
    (*entry).tupDesc_identifier
}

/// Match the model's columns to the row type's attributes, by name; a missing column or an
/// unusable type is an ERROR naming it.
unsafe fn layout_for(
    model: &StoredModel,
    p: &Preprocessor,
    type_id: pg_sys::Oid,
    typmod: i32,
    mcxt: pg_sys::MemoryContext,
) -> RowLayout {
    // Read first: an invalidation between here and the lookup below only makes the next call
    // rebuild the layout once more.
    let tupdesc_id = tupdesc_identifier(type_id);
    let cached = pg_sys::lookup_rowtype_tupdesc(type_id, typmod);
    let desc = PgMemoryContexts::For(mcxt).switch_to(|_| pg_sys::CreateTupleDescCopy(cached));
    // ReleaseTupleDesc: only reference-counted descriptors are released (a transient record
    // type's shared descriptor is not counted).
    if (*cached).tdrefcount >= 0 {
        pg_sys::DecrTupleDescRefCount(cached);
    }
    let attrs = crate::pg::compat::tuple_desc_attrs(desc);
    let natts = attrs.len();
    let mut columns = Vec::with_capacity(p.columns.len());
    for c in &p.columns {
        let found = attrs.iter().position(|a| {
            !a.attisdropped
                && CStr::from_ptr(a.attname.data.as_ptr()).to_bytes() == c.name.as_bytes()
        });
        let Some(at) = found else {
            raise(
                PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN,
                format!(
                    "the row has no column \"{}\", which model {} uses",
                    c.name, model.id
                ),
                Some(format!(
                    "Model {} reads the columns {}.",
                    model.id,
                    p.column_names().collect::<Vec<_>>().join(", ")
                )),
            );
        };
        let t = attrs[at].atttypid;
        let base = pg_sys::getBaseType(t);
        let read = match (c.source, base) {
            (Source::Number, pg_sys::NUMERICOID) => Some(Read::Numeric),
            (Source::Number, b) => LabelKind::from_type(b).map(Read::Number),
            (Source::Text, pg_sys::TEXTOID | pg_sys::VARCHAROID) => Some(Read::Text),
            (Source::Text, pg_sys::BPCHAROID) => Some(Read::Bpchar),
            (Source::Text, b) if b == pg_sys::NAMEOID || pg_sys::type_is_enum(b) => {
                let (mut output, mut varlena) = (pg_sys::Oid::INVALID, false);
                pg_sys::getTypeOutputInfo(b, &mut output, &mut varlena);
                Some(Read::Output(output))
            }
            (Source::NumberArray, pg_sys::FLOAT8ARRAYOID | pg_sys::FLOAT4ARRAYOID) => {
                Some(Read::FloatArray)
            }
            (Source::NumberArray, b) => match pg_sys::get_element_type(b) {
                e @ (pg_sys::INT2OID | pg_sys::INT4OID | pg_sys::INT8OID | pg_sys::NUMERICOID) => {
                    Some(Read::NumberArray(e))
                }
                _ => None,
            },
            _ => None,
        };
        let Some(read) = read else {
            let wanted = match c.source {
                Source::Number => "a number or boolean",
                Source::Text => "text (text, varchar, char, name or an enum)",
                Source::NumberArray => "a numeric array",
            };
            raise(
                PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
                format!(
                    "column \"{}\" of the row has type {}, but model {} needs {wanted}",
                    c.name,
                    type_name(t),
                    model.id
                ),
                None,
            );
        };
        columns.push((at, read));
    }
    RowLayout {
        model_id: model.id,
        type_id,
        typmod,
        tupdesc_id,
        desc,
        columns,
        values: vec![pg_sys::Datum::from(0usize); natts],
        nulls: vec![true; natts],
        encoded: EncodedRow::default(),
        scratch: Vec::new(),
        numeric_text: String::new(),
    }
}

impl RowLayout {
    /// Encode the row into `self.encoded`; false when a NULL makes the model skip such rows.
    unsafe fn encode(&mut self, header: pg_sys::HeapTupleHeader, p: &Preprocessor) -> bool {
        let mut tuple = pg_sys::HeapTupleData {
            // The 4-byte varlena header of a (detoasted) composite datum holds its length.
            t_len: (*header).t_choice.t_datum.datum_len_ as u32 >> 2,
            t_self: pg_sys::ItemPointerData::default(),
            t_tableOid: pg_sys::Oid::INVALID,
            t_data: header,
        };
        pg_sys::heap_deform_tuple(
            &mut tuple,
            self.desc,
            self.values.as_mut_ptr(),
            self.nulls.as_mut_ptr(),
        );
        let row = &mut self.encoded;
        row.clear();
        for (i, &(at, read)) in self.columns.iter().enumerate() {
            let (datum, null) = (self.values[at], self.nulls[at]);
            if null {
                match p.null_action(i) {
                    NullAction::Encode => {}
                    NullAction::Skip => return false,
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
        true
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

/// The per-call-site row layout (in `fn_extra`, next to the cached model).
pub struct RowCache(Option<RowLayout>);

impl RowCache {
    pub fn new() -> Self {
        RowCache(None)
    }
}

impl Default for RowCache {
    fn default() -> Self {
        Self::new()
    }
}

/// Apply `f` to a whole row encoded by the model's preprocessing; None (SQL NULL) when the
/// row has a NULL in a column the model skips rows for.
pub fn with_row<R>(
    fcinfo: pg_sys::FunctionCallInfo,
    arg: ModelArg,
    record: RecordArg,
    f: fn(&StoredModel, Row) -> R,
) -> Option<R> {
    let call = cached_call(fcinfo, arg);
    let model = call.model.clone();
    let cache = &mut call.rows;
    let Some(p) = &model.preprocessing else {
        not_for_rows(&model)
    };
    // SAFETY: a non-NULL composite argument of this call (the functions are strict);
    // pg_detoast_datum returns the header in place or a palloc'd copy, valid for the call.
    // `cache` lives in fn_extra (fn_mcxt), which outlives the call. The type cache entry
    // tupdesc_identifier reads is read at once, before anything can invalidate it.
    unsafe {
        let raw = record.0.cast_mut_ptr::<pg_sys::varlena>();
        let header = if is_plain_4b(raw) {
            raw
        } else {
            pg_sys::pg_detoast_datum(raw)
        }
        .cast::<pg_sys::HeapTupleHeaderData>();
        let (type_id, typmod) = row_type(header);
        // A row type altered by another session since the layout was built (its descriptor
        // has a new identifier) must not be read with the old descriptor.
        let fresh = !matches!(&cache.0, Some(l) if l.model_id == model.id && l.type_id == type_id
            && l.typmod == typmod && l.tupdesc_id == tupdesc_identifier(type_id));
        if fresh {
            // A statement whose rows change type (a union of records) replaces the layout:
            // free the old descriptor copy, or each change would keep one until the end.
            if let Some(old) = cache.0.take() {
                pg_sys::FreeTupleDesc(old.desc);
            }
            cache.0 = Some(layout_for(
                &model,
                p,
                type_id,
                typmod,
                (*(*fcinfo).flinfo).fn_mcxt,
            ));
        }
        let layout = cache.0.as_mut().expect("set above");
        if !layout.encode(header, p) {
            return None;
        }
        let row = Row::Sparse {
            indices: &layout.encoded.indices,
            values: &layout.encoded.values,
        };
        Some(f(&model, row))
    }
}
