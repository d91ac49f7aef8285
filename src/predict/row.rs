//! Predictions from a whole row: `corgipile_predict('churn', c) FROM customers c`. The row's
//! columns are matched to the model's by name (once per call site and row type), read in
//! place, and encoded by the model's stored preprocessing, as in training.

use super::{cached_call, ModelArg};
use crate::catalog::load_group_model;
use crate::catalog::StoredModel;
use crate::decode::datum::is_plain_4b;
use crate::decode::groups::{write_key, KeyRead};
use crate::decode::record::{read_for, RecordColumns};
use crate::pg::error::raise;
use crate::request::args::RecordArg;
use corgipile_ml::preprocess::{Preprocessor, Source};
use corgipile_ml::row::Row;
use pgrx::prelude::*;
use pgrx::{PgMemoryContexts, PgSqlErrorCode};
use std::ffi::CStr;

/// A row type matched against a model: per model column, its attribute and how to read it.
struct RowLayout {
    model_id: i64,
    type_id: pg_sys::Oid,
    typmod: i32,
    /// The type cache's identifier of the descriptor the layout was built from.
    tupdesc_id: u64,
    /// A copy of the row type's descriptor, in the call site's memory context.
    desc: pg_sys::TupleDesc,
    /// Per model column, its attribute and how to read it; and the row's scratch.
    record: RecordColumns,
    /// Per-group models: each group column's attribute and how it is read, and the key's
    /// scratch.
    group_columns: Vec<(usize, KeyRead)>,
    key: String,
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
        let read = read_for(c.source, base);
        let Some(read) = read else {
            let wanted = match c.source {
                Source::Number => "a number or boolean",
                Source::Text => "text (text, varchar, char, name or an enum)",
                Source::NumberArray => "a numeric array",
                Source::Time(kind) => kind.name(),
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
    let mut group_columns = Vec::new();
    for name in model.groups.iter().flat_map(|g| &g.columns) {
        let found = attrs.iter().position(|a| {
            !a.attisdropped && CStr::from_ptr(a.attname.data.as_ptr()).to_bytes() == name.as_bytes()
        });
        let Some(at) = found else {
            raise(
                PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN,
                format!(
                    "the row has no column \"{name}\", which model {} picks a group's model by",
                    model.id
                ),
                Some(format!(
                    "Model {} has a model per group of {}.",
                    model.id,
                    model
                        .groups
                        .as_ref()
                        .map(|g| g.columns.join(", "))
                        .unwrap_or_default()
                )),
            );
        };
        group_columns.push((
            at,
            KeyRead::for_type(pg_sys::getBaseType(attrs[at].atttypid)),
        ));
    }
    RowLayout {
        group_columns,
        key: String::new(),
        model_id: model.id,
        type_id,
        typmod,
        tupdesc_id,
        desc,
        record: RecordColumns::new(columns, natts),
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
    with_row_of_group(fcinfo, arg, record, |model, row, _| f(model, row))
}

/// [`with_row`], `f` also told the row's group (its key, None for a row of no group) when the
/// model has per-group models: `f` then gets the group's model, or the model of every row for
/// a group without one of its own.
pub fn with_row_of_group<R>(
    fcinfo: pg_sys::FunctionCallInfo,
    arg: ModelArg,
    record: RecordArg,
    f: impl FnOnce(&StoredModel, Row, Option<&str>) -> R,
) -> Option<R> {
    let call = cached_call(fcinfo, arg);
    // SAFETY: the call site's memory context, which outlives the call.
    let mcxt = unsafe { (*(*fcinfo).flinfo).fn_mcxt };
    with_row_in(call.model.clone(), &mut call.rows, mcxt, record, f)
}

/// [`with_row_of_group`] with `model`, its row layout cached in `cache` (whose descriptor copy
/// lives in `mcxt`).
pub fn with_row_in<R>(
    model: std::rc::Rc<StoredModel>,
    cache: &mut RowCache,
    mcxt: pg_sys::MemoryContext,
    record: RecordArg,
    f: impl FnOnce(&StoredModel, Row, Option<&str>) -> R,
) -> Option<R> {
    let Some(p) = &model.preprocessing else {
        not_for_rows(&model)
    };
    // SAFETY: a non-NULL composite argument of this call (the functions are strict);
    // pg_detoast_datum returns the header in place or a palloc'd copy, valid for the call.
    // `cache` and `mcxt` outlive the call (fn_extra and fn_mcxt, or the caller's for one
    // call). The type cache entry
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
            cache.0 = Some(layout_for(&model, p, type_id, typmod, mcxt));
        }
        let layout = cache.0.as_mut().expect("set above");
        layout.record.deform(header, layout.desc);
        let (mut used, mut key) = (model.clone(), None);
        if let Some(groups) = &model.groups {
            let record = &layout.record;
            let columns = &layout.group_columns;
            let reads: Vec<KeyRead> = columns.iter().map(|&(_, r)| r).collect();
            if write_key(&reads, |i| record.value(columns[i].0), &mut layout.key) {
                key = Some(layout.key.as_str());
                if let Some(&id) = groups.models.get(layout.key.as_str()) {
                    used = load_group_model(&model, &layout.key, id);
                }
            }
        }
        let row = layout.record.encode_deformed(p)?;
        Some(f(&used, row, key))
    }
}
