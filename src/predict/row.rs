//! Predictions from a whole row: `corgipile_predict('churn', c) FROM customers c`. The row's
//! columns are matched to the model's by name (once per call site and row type), read in
//! place, and encoded by the model's stored preprocessing, as in training. The planner's
//! rewrite of such a call (`simplify`) passes the model's columns alone, as arguments: they
//! are matched, read and encoded by the same code (`with_columns`).

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

/// What a layout reads: a row type, or the call's own arguments (the rewritten call).
enum Shape {
    Row {
        type_id: pg_sys::Oid,
        typmod: i32,
        /// The type cache's identifier of the descriptor the layout was built from.
        tupdesc_id: u64,
        /// A copy of the row type's descriptor, in the call site's memory context.
        desc: pg_sys::TupleDesc,
    },
    Arguments,
}

/// A row type (or a call's column arguments) matched against a model: per model column, its
/// attribute and how to read it.
struct RowLayout {
    model_id: i64,
    shape: Shape,
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

/// One attribute a prediction can read: its name and type (None: a dropped column).
type Attribute<'a> = Option<(&'a [u8], pg_sys::Oid)>;

/// Match the model's columns to the attributes (a row type's, or the column arguments of a
/// rewritten call: `from_row` false), by name; a missing column or an unusable type is an
/// ERROR naming it.
unsafe fn match_columns(
    model: &StoredModel,
    p: &Preprocessor,
    attrs: &[Attribute],
    from_row: bool,
) -> (RecordColumns, Vec<(usize, KeyRead)>) {
    let find = |name: &str| {
        attrs
            .iter()
            .position(|a| matches!(a, Some((n, _)) if *n == name.as_bytes()))
    };
    let passed = || {
        attrs
            .iter()
            .flatten()
            .map(|(n, _)| String::from_utf8_lossy(n))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let missing = |name: &str, what: &str, hint: String| -> ! {
        let message = if from_row {
            format!(
                "the row has no column \"{name}\", which model {} {what}",
                model.id
            )
        } else {
            format!(
                "column \"{name}\", which model {} {what}, is not among the columns passed ({})",
                model.id,
                passed()
            )
        };
        let hint = if from_row {
            hint
        } else {
            format!("{hint} The planner passes the columns of the model it found when it planned the statement: if the name was deployed to another version since, run the statement again.")
        };
        raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN,
            message,
            Some(hint),
        )
    };
    let mut columns = Vec::with_capacity(p.columns.len());
    for c in &p.columns {
        let Some(at) = find(&c.name) else {
            missing(
                &c.name,
                "uses",
                format!(
                    "Model {} reads the columns {}.",
                    model.id,
                    p.column_names().collect::<Vec<_>>().join(", ")
                ),
            )
        };
        let t = attrs[at].expect("found").1;
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
                    "column \"{}\"{} has type {}, but model {} needs {wanted}",
                    c.name,
                    if from_row { " of the row" } else { "" },
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
        let Some(at) = find(name) else {
            missing(
                name,
                "picks a group's model by",
                format!(
                    "Model {} has a model per group of {}.",
                    model.id,
                    model
                        .groups
                        .as_ref()
                        .map(|g| g.columns.join(", "))
                        .unwrap_or_default()
                ),
            )
        };
        let t = attrs[at].expect("found").1;
        group_columns.push((at, KeyRead::for_type(pg_sys::getBaseType(t))));
    }
    (RecordColumns::new(columns, attrs.len()), group_columns)
}

/// Match the model's columns to a row type's attributes.
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
    let attrs: Vec<Attribute> = crate::pg::compat::tuple_desc_attrs(desc)
        .iter()
        .map(|a| {
            (!a.attisdropped).then(|| {
                (
                    CStr::from_ptr(a.attname.data.as_ptr()).to_bytes(),
                    a.atttypid,
                )
            })
        })
        .collect();
    let (record, group_columns) = match_columns(model, p, &attrs, true);
    RowLayout {
        model_id: model.id,
        shape: Shape::Row {
            type_id,
            typmod,
            tupdesc_id,
            desc,
        },
        record,
        group_columns,
        key: String::new(),
    }
}

/// The per-call-site row layout (in `fn_extra`, next to the cached model).
pub struct RowCache(Option<RowLayout>);

impl RowCache {
    pub fn new() -> Self {
        RowCache(None)
    }

    /// Drops the layout (freeing a row type's descriptor copy).
    fn clear(&mut self) {
        if let Some(RowLayout {
            shape: Shape::Row { desc, .. },
            ..
        }) = self.0.take()
        {
            // SAFETY: the copy made by layout_for, in the call site's context, used by no one
            // else.
            unsafe { pg_sys::FreeTupleDesc(desc) };
        }
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
    // SAFETY: the call site's memory context, which outlives the call.
    let mcxt = unsafe { (*(*fcinfo).flinfo).fn_mcxt };
    with_row_in(
        call.model.clone(),
        &mut call.rows,
        mcxt,
        record,
        |m, x, _| f(m, x),
    )
}

/// [`with_row`] with `model`, its row layout cached in `cache` (whose descriptor copy lives in
/// `mcxt`); `f` is also told the row's group (its key, None for a row of no group) when the
/// model has per-group models, and then gets the group's model, or the model of every row for
/// a group without one of its own.
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
    // call). The type cache entry tupdesc_identifier reads is read at once, before anything
    // can invalidate it.
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
        let fresh = !matches!(&cache.0, Some(RowLayout {
            model_id, shape: Shape::Row { type_id: t, typmod: m, tupdesc_id, .. }, ..
        }) if *model_id == model.id && *t == type_id && *m == typmod
            && *tupdesc_id == tupdesc_identifier(type_id));
        if fresh {
            // A statement whose rows change type (a union of records) replaces the layout:
            // free the old descriptor copy, or each change would keep one until the end.
            cache.clear();
            cache.0 = Some(layout_for(&model, p, type_id, typmod, mcxt));
        }
        let layout = cache.0.as_mut().expect("set above");
        let Shape::Row { desc, .. } = layout.shape else {
            unreachable!("a row layout")
        };
        layout.record.deform(header, desc);
        predict_read(&model, p, layout, f)
    }
}

/// The prediction of the row `layout.record` holds: the row's group's model picked (per-group
/// models), the row encoded by `p`, `f` applied; None when a NULL makes the model skip it.
///
/// # Safety
/// The values `layout.record` holds are valid; backend thread.
unsafe fn predict_read<R>(
    model: &StoredModel,
    p: &Preprocessor,
    layout: &mut RowLayout,
    f: impl FnOnce(&StoredModel, Row, Option<&str>) -> R,
) -> Option<R> {
    let (mut group_model, mut key) = (None, None);
    if let Some(groups) = &model.groups {
        let record = &layout.record;
        let columns = &layout.group_columns;
        let reads: Vec<KeyRead> = columns.iter().map(|&(_, r)| r).collect();
        if write_key(&reads, |i| record.value(columns[i].0), &mut layout.key) {
            key = Some(layout.key.as_str());
            if let Some(&id) = groups.models.get(layout.key.as_str()) {
                group_model = Some(load_group_model(model, &layout.key, id));
            }
        }
    }
    let row = layout.record.encode_deformed(p)?;
    Some(f(group_model.as_deref().unwrap_or(model), row, key))
}

/// Apply `f` to the columns a rewritten call passes (see `simplify`): argument `first` on are
/// the values of the columns `names` lists, in that order; they are matched to the model's
/// columns by name and encoded exactly as a row's.
///
/// # Safety
/// `fcinfo` is the current call's; its arguments from `first` on are the column values, and
/// `names` the column names (read once per call site, when the layout is built).
pub unsafe fn with_columns<R>(
    fcinfo: pg_sys::FunctionCallInfo,
    arg: ModelArg,
    first: usize,
    names: impl FnOnce() -> Vec<String>,
    f: fn(&StoredModel, Row) -> R,
) -> Option<R> {
    let call = cached_call(fcinfo, arg);
    let (model, rows) = (&*call.model, &mut call.rows);
    let Some(p) = &model.preprocessing else {
        not_for_rows(model)
    };
    let nargs = (*fcinfo).nargs as usize;
    let fresh = !matches!(&rows.0, Some(RowLayout { model_id, shape: Shape::Arguments, .. })
        if *model_id == model.id);
    if fresh {
        let names = names();
        if names.len() != nargs - first {
            raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!(
                    "{} column names for {} column values",
                    names.len(),
                    nargs - first
                ),
                None,
            );
        }
        let flinfo = (*fcinfo).flinfo;
        let attrs: Vec<Attribute> = names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let t = pg_sys::get_fn_expr_argtype(flinfo, (first + i) as i32);
                if t == pg_sys::InvalidOid {
                    raise(
                        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                        "could not determine the types of the column values",
                        None,
                    );
                }
                Some((n.as_bytes(), t))
            })
            .collect();
        let (record, group_columns) = match_columns(model, p, &attrs, false);
        rows.clear();
        rows.0 = Some(RowLayout {
            model_id: model.id,
            shape: Shape::Arguments,
            record,
            group_columns,
            key: String::new(),
        });
    }
    let layout = rows.0.as_mut().expect("set above");
    let args = std::slice::from_raw_parts((*fcinfo).args.as_ptr(), nargs);
    layout
        .record
        .read_arguments(args[first..].iter().map(|a| (a.value, a.isnull)));
    predict_read(model, p, layout, |m, x, _| f(m, x))
}
