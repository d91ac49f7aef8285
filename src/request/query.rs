//! Which columns a training (or evaluation) reads, how their values are decoded, and the one
//! SELECT that reads them. Column names come from params and are resolved as identifiers
//! (attnum, then quoted): a name is never spliced into SQL as text. Casts name their pg_catalog
//! types, so objects on the caller's search_path cannot change what the query does.

use super::predicate::{checked_predicate, Predicate};
use crate::pg::error::raise;
use crate::pg::names::{qualified_name, relation_name};
use crate::pipeline::LabelKind;
use crate::pipeline::{FeatureLayout, LabelCoding, PreprocessSpec};
use corgipile_ml::capabilities::Use;
use corgipile_ml::model::{Labels, ModelKind};
use corgipile_ml::preprocess::{
    ColumnOptions, ColumnPlan, Encode, PreprocessOptions, Preprocessor, Source, TimeKind,
    EVERY_COLUMN,
};
use pgrx::spi::quote_identifier;
use pgrx::{pg_sys, PgSqlErrorCode};
use std::ffi::{CStr, CString};

/// The features param, as the user wrote it.
#[derive(Clone, Debug, PartialEq)]
pub enum FeatureColumns {
    /// One array column (float8[], float4[], integer or numeric arrays).
    Array(String),
    /// Columns of any encodable type, preprocessed one by one (MADlib/PostgresML style).
    Columns(Vec<String>),
    /// Every column but the label and the excluded ones.
    All { exclude: Vec<String> },
    /// An index array and a value array (LIBSVM/criteo style).
    Sparse { indices: String, values: String },
}

/// The resolved read of one relation.
pub struct Input {
    pub sql: CString,
    pub layout: FeatureLayout,
    pub label: LabelCoding,
    /// Column position (0-based) of the validation flag, if any.
    pub validation_column: Option<usize>,
    pub label_is_bool: bool,
    /// Column lists: how the columns become features.
    pub preprocess: Option<PreprocessSpec>,
    /// Column lists: the columns read, in order (stored as the model's `features`).
    pub columns: Vec<String>,
    /// `"group_by"`: the group columns, the query's last ones.
    pub groups: Option<crate::pipeline::GroupColumns>,
}

/// How a column list is preprocessed: by params, for a training, or as a stored model says.
pub enum Tabular<'a> {
    Train {
        options: &'a PreprocessOptions,
        /// How number columns are encoded where their options (and `"*"`'s) set neither
        /// `encode` nor `scale`: the kind's default.
        numbers: Encode,
        normalize: bool,
        max_categories: u32,
        /// The training's share of corgipile.max_model_memory (see `guc::model_bytes_for`).
        max_model_bytes: u64,
    },
    Stored(&'a Preprocessor),
}

unsafe fn type_name(oid: pg_sys::Oid) -> String {
    CStr::from_ptr(pg_sys::format_type_be(oid))
        .to_string_lossy()
        .into_owned()
}

/// Only heap tables (and materialized views) have pages we can shuffle, and partitioned
/// tables are trees of them (their leaves are checked when the scan opens them); a simple view
/// is read through its base table's pages (see `view`). A table Citus distributes, or one
/// read through a view or in its tree, is refused first (see `citus`). Returns the table whose
/// pages are read: the one place every block scan's relation is resolved.
pub fn check_relation(relid: pg_sys::Oid, relname: &str, only: bool) -> pg_sys::Oid {
    // SAFETY: FFI calls, and reads of what they return, on the backend thread inside the transaction
    // of the SQL call (every caller is a SQL function); no raw pointer comes from the caller.
    let is_view = unsafe { pg_sys::get_rel_relkind(relid) as u8 == pg_sys::RELKIND_VIEW };
    if is_view {
        // SAFETY: `relid` is a view (its relkind was just read).
        let base = unsafe { super::view::base_table(relid, relname) };
        super::citus::refuse_distributed(relid, relname, base, only, "read");
        // A sharded table's rows are read by its shards, which know nothing of the view: a
        // training rewrites a simple one into the table's terms first (`sharded_view`).
        if has_foreign_partitions(base) {
            crate::pg::error::raise_combination_because(
                Use::Shards,
                Use::View,
                format!("Only a training reads view {relname} on the shards of {}; the functions of a stored model read the sharded table itself.", relation_name(base)),
            );
        }
        return check_table(base, &relation_name(base), only);
    }
    super::citus::refuse_distributed(relid, relname, relid, only, "read");
    check_table(relid, relname, only)
}

/// A partitioned table with a foreign table among its partitions: a sharded table (see
/// `crate::shard::sharded_leaves`, which the training of one resolves), or a tree no block scan
/// reads.
pub(super) fn has_foreign_partitions(relid: pg_sys::Oid) -> bool {
    // SAFETY: FFI calls on the backend thread inside the SQL call's transaction; all_inheritors
    // locks the tree as a SELECT of the table will.
    unsafe {
        pg_sys::get_rel_relkind(relid) as u8 == pg_sys::RELKIND_PARTITIONED_TABLE
            && crate::exec::block_shuffle::all_inheritors(
                relid,
                pg_sys::AccessShareLock as pg_sys::LOCKMODE,
            )
            .into_iter()
            .any(|oid| pg_sys::get_rel_relkind(oid) as u8 == pg_sys::RELKIND_FOREIGN_TABLE)
    }
}

/// `check_relation` of a relation that is not a view.
fn check_table(relid: pg_sys::Oid, relname: &str, only: bool) -> pg_sys::Oid {
    // SAFETY: FFI calls, and reads of what they return, on the backend thread inside the transaction
    // of the SQL call (every caller is a SQL function); no raw pointer comes from the caller.
    unsafe {
        let kind = pg_sys::get_rel_relkind(relid) as u8;
        if kind == pg_sys::RELKIND_PARTITIONED_TABLE {
            if only {
                raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("cannot read only {relname}: it is a partitioned table, which has no rows of its own"),
                Some("Leave out \"only\" to read all its partitions, or name one partition.".into()),
            );
            }
            return relid;
        }
        let what = match kind {
            pg_sys::RELKIND_RELATION | pg_sys::RELKIND_MATVIEW => None,
            pg_sys::RELKIND_FOREIGN_TABLE => Some("a foreign table"),
            pg_sys::RELKIND_SEQUENCE => Some("a sequence"),
            pg_sys::RELKIND_INDEX | pg_sys::RELKIND_PARTITIONED_INDEX => Some("an index"),
            _ => Some("not a table"),
        };
        if let Some(what) = what {
            raise(
            PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE,
            format!("corgipile cannot read {relname}: it is {what}"),
            Some("corgipile reads the pages of a plain table: CREATE TABLE ... AS SELECT from it first.".into()),
        );
        }
        let rel = pg_sys::RelationIdGetRelation(relid);
        let am = (*(*rel).rd_rel).relam;
        pg_sys::RelationClose(rel);
        if am != pg_sys::HEAP_TABLE_AM_OID {
            raise(
                PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                format!("corgipile cannot read {relname}: it does not use the heap access method"),
                None,
            );
        }
        relid
    }
}

/// The type of a user column named by a param; a missing column is an ERROR, never a default.
unsafe fn column_type(relid: pg_sys::Oid, relname: &str, column: &str, param: &str) -> pg_sys::Oid {
    let cname = CString::new(column).unwrap_or_else(|_| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("\"{param}\" contains a NUL byte"),
            None,
        )
    });
    let attnum = pg_sys::get_attnum(relid, cname.as_ptr());
    if attnum <= 0 {
        raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN,
            format!("column \"{column}\" of {relname} does not exist"),
            Some(if param == "label" {
                "Name the label column with the \"label\" param, e.g. '{\"label\": \"my_column\"}'."
                    .into()
            } else if param == "model" {
                "The model reads its feature columns by name: the relation must have every column it was trained on.".into()
            } else if param == "exclude" {
                "\"exclude\" names columns of the table to leave out of \"features\": \"*\".".into()
            } else {
                "Name the features with the \"features\" param: a column, a list of columns, or {\"indices\": .., \"values\": ..}.".into()
            }),
        );
    }
    pg_sys::get_atttype(relid, attnum)
}

fn is_number(t: pg_sys::Oid) -> bool {
    matches!(
        t,
        pg_sys::INT2OID
            | pg_sys::INT4OID
            | pg_sys::INT8OID
            | pg_sys::FLOAT4OID
            | pg_sys::FLOAT8OID
            | pg_sys::NUMERICOID
    )
}

fn is_text(t: pg_sys::Oid) -> bool {
    matches!(
        t,
        pg_sys::TEXTOID | pg_sys::VARCHAROID | pg_sys::BPCHAROID | pg_sys::NAMEOID
    )
}

unsafe fn element_type(array_type: pg_sys::Oid) -> pg_sys::Oid {
    pg_sys::get_element_type(array_type)
}

fn type_error(relname: &str, what: &str, column: &str, found: String, hint: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
        format!("{what} column \"{column}\" of {relname} has type {found}"),
        Some(hint.into()),
    )
}

/// corgipile_trace returns each row's label as a float8: its label column must be numeric.
/// (Checked before `resolve`, whose hints speak of the model kinds that train.)
pub fn check_trace_label(relid: pg_sys::Oid, relname: &str, label: &str) {
    // SAFETY: FFI calls, and reads of what they return, on the backend thread inside the transaction
    // of the SQL call (every caller is a SQL function); no raw pointer comes from the caller.
    unsafe {
        let t = column_type(relid, relname, label, "label");
        if !is_number(t) {
            type_error(
            relname,
            "label",
            label,
            type_name(t),
            "corgipile_trace returns each row's label as a float8, so it needs a numeric label column: name one with {\"label\": ...}.",
        );
        }
    }
}

/// A float8[]/float4[] expression for an array column of any numeric element type.
unsafe fn dense_array_expr(relid: pg_sys::Oid, relname: &str, column: &str) -> String {
    let t = column_type(relid, relname, column, "features");
    let elem = element_type(t);
    if t == pg_sys::FLOAT8ARRAYOID || t == pg_sys::FLOAT4ARRAYOID {
        quote_identifier(column)
    } else if is_number(elem) {
        format!("{}::pg_catalog.float8[]", quote_identifier(column))
    } else {
        type_error(relname, "features", column, type_name(t),
            "The features column must be an array of numbers (float8[], float4[], integer[], numeric[]), a list of numeric columns, or {\"indices\": ..., \"values\": ...}.")
    }
}

/// Resolve the columns and build the SELECT. `validation_predicate` is SQL the user wrote; it
/// is checked to be one boolean expression over the relation (see `checked_predicate`).
#[allow(clippy::too_many_arguments)]
pub fn resolve(
    relid: pg_sys::Oid,
    relname: &str,
    model: ModelKind,
    features: &FeatureColumns,
    label: &str,
    index_base: i64,
    n_features: Option<u32>,
    validation_predicate: Option<&str>,
    filter: Option<&str>,
    tabular: Tabular,
    only: bool,
    group_by: Option<&[String]>,
) -> Input {
    // SAFETY: FFI calls, and reads of what they return, on the backend thread inside the transaction
    // of the SQL call (every caller is a SQL function); no raw pointer comes from the caller.
    unsafe {
        let label_type = column_type(relid, relname, label, "label");
        let label_is_bool = label_type == pg_sys::BOOLOID;
        let (label_expr, coding) = match model.labels() {
            Labels::Number => {
                if !is_number(label_type) {
                    type_error(
                        relname,
                        "label",
                        label,
                        type_name(label_type),
                        "linear regression needs a numeric label.",
                    );
                }
                (
                    numeric_label_expr(label, label_type),
                    LabelCoding::Value(label_kind(label_type)),
                )
            }
            Labels::TwoClasses | Labels::Classes => {
                if is_text(label_type) {
                    (
                        format!("{}::pg_catalog.text", quote_identifier(label)),
                        LabelCoding::ClassOfText,
                    )
                } else if is_number(label_type) || label_is_bool {
                    let kind = label_kind(label_type);
                    let coding = if model.has_class_outputs() {
                        LabelCoding::ClassOfValue(kind)
                    } else {
                        LabelCoding::Value(kind)
                    };
                    (numeric_label_expr(label, label_type), coding)
                } else {
                    type_error(
                        relname,
                        "label",
                        label,
                        type_name(label_type),
                        "The label must be boolean, a number type or text.",
                    )
                }
            }
        };
        let mut preprocess = None;
        let mut tabular_names = Vec::new();
        let (feature_exprs, layout) = match features {
            FeatureColumns::Array(column) => (
                vec![dense_array_expr(relid, relname, column)],
                FeatureLayout::Dense { columns: false },
            ),
            FeatureColumns::Columns(_) | FeatureColumns::All { .. } => {
                let names = match features {
                    FeatureColumns::Columns(c) => c.clone(),
                    FeatureColumns::All { exclude } => every_column(relid, relname, label, exclude),
                    _ => unreachable!(),
                };
                let (exprs, spec) = tabular_columns(relid, relname, label, &names, tabular);
                preprocess = Some(spec);
                tabular_names = names;
                (exprs, FeatureLayout::Tabular)
            }
            FeatureColumns::Sparse { indices, values } => {
                let ti = column_type(relid, relname, indices, "features");
                if !matches!(
                    element_type(ti),
                    pg_sys::INT2OID | pg_sys::INT4OID | pg_sys::INT8OID
                ) {
                    type_error(
                        relname,
                        "feature indices",
                        indices,
                        type_name(ti),
                        "Sparse feature indices must be an integer array (int4[]).",
                    );
                }
                let index_expr = if ti == pg_sys::INT4ARRAYOID {
                    quote_identifier(indices)
                } else {
                    format!("{}::pg_catalog.int4[]", quote_identifier(indices))
                };
                (
                    vec![index_expr, dense_array_expr(relid, relname, values)],
                    FeatureLayout::Sparse {
                        index_base,
                        n_features,
                    },
                )
            }
        };
        let mut columns = vec![label_expr];
        columns.extend(feature_exprs);
        let validation_column = validation_predicate.map(|p| {
            let checked = checked_predicate(relid, relname, p, Predicate::Validation);
            columns.push(format!("COALESCE(({checked}), false)"));
            columns.len() - 1
        });
        // Read as stored (plain columns keep the page reader); their text is the group's key.
        let groups = group_by.map(|names| {
            let first = columns.len();
            let mut types = Vec::with_capacity(names.len());
            for name in names {
                if name == label {
                    raise(
                        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                        format!("column \"{name}\" is both the label and a \"group_by\" column"),
                        None,
                    );
                }
                types.push(column_type(relid, relname, name, "group_by").to_u32());
                columns.push(quote_identifier(name));
            }
            crate::pipeline::GroupColumns {
                first,
                types,
                known: None,
            }
        });
        // "where": a qual of the BlockShuffle scan, beside row-level security's.
        let filter = filter
            .map(|f| {
                format!(
                    " WHERE {}",
                    checked_predicate(relid, relname, f, Predicate::Where)
                )
            })
            .unwrap_or_default();
        // As SELECT reads it: with its partitions or inheritance children, unless "only" is set.
        let sql = format!(
            "SELECT {} FROM {}{}{filter}",
            columns.join(", "),
            if only { "ONLY " } else { "" },
            qualified_name(relid)
        );
        Input {
            sql: CString::new(sql).unwrap_or_else(|_| {
                raise(
                    PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                    "the validation predicate or the \"where\" filter contains a NUL byte",
                    None,
                )
            }),
            layout,
            label: coding,
            validation_column,
            label_is_bool,
            preprocess,
            columns: tabular_names,
            groups,
        }
    }
}

/// How a column of type `t` is read as a feature, and the SQL expression that reads it;
/// None for a type we cannot encode.
unsafe fn column_source(column: &str, t: pg_sys::Oid, zone: &str) -> Option<(Source, String)> {
    let base = pg_sys::getBaseType(t);
    let col = quote_identifier(column);
    // Dates and times as float8 seconds by PostgreSQL's own date_part (prediction from a row
    // computes the same, see `decode::record`); a timestamptz on the wall clock of `zone`.
    let epoch = |kind, of: String| {
        Some((
            Source::Time(kind),
            format!("pg_catalog.date_part('epoch', {of})"),
        ))
    };
    match base {
        // A date: its days since 1970-01-01 times 86,400, which is exactly what date_part gives
        // its timestamp, without the cast to timestamp, which fails for a valid date after
        // 294276 AD (22008, naming neither the column nor the row). Infinite dates as before:
        // ±Infinity (an ERROR naming the column).
        pg_sys::DATEOID => {
            return Some((
                Source::Time(TimeKind::Date),
                format!(
                    "CASE WHEN pg_catalog.isfinite({col}) \
                     THEN ({col} OPERATOR(pg_catalog.-) '1970-01-01'::pg_catalog.date)::pg_catalog.float8 \
                          OPERATOR(pg_catalog.*) 86400::pg_catalog.float8 \
                     ELSE pg_catalog.date_part('epoch', {col}::pg_catalog.timestamp) END"
                ),
            ))
        }
        pg_sys::TIMESTAMPOID => return epoch(TimeKind::Timestamp, col),
        pg_sys::TIMESTAMPTZOID => {
            let zone = pgrx::spi::quote_literal(zone);
            return epoch(
                TimeKind::Timestamp,
                format!("pg_catalog.timezone({zone}, {col})"),
            );
        }
        pg_sys::TIMEOID => return epoch(TimeKind::Time, col),
        pg_sys::INTERVALOID => return epoch(TimeKind::Interval, col),
        _ => {}
    }
    if LabelKind::from_type(base).is_some() && base != pg_sys::NUMERICOID {
        // Read as stored (boolean, integers, floats: converted to f64 as the casts would),
        // so the query stays plain columns and can take the page reader.
        Some((Source::Number, col))
    } else if is_number(base) {
        Some((Source::Number, format!("{col}::pg_catalog.float8")))
    } else if is_text(base) || pg_sys::type_is_enum(base) {
        Some((Source::Text, format!("{col}::pg_catalog.text")))
    } else if is_number(element_type(base)) {
        Some((Source::NumberArray, format!("{col}::pg_catalog.float8[]")))
    } else {
        None
    }
}

/// The session's TimeZone setting (what a timestamptz is shown in).
unsafe fn session_time_zone() -> String {
    let zone = pg_sys::GetConfigOption(c"TimeZone".as_ptr(), false, false);
    if zone.is_null() {
        return "UTC".into();
    }
    CStr::from_ptr(zone).to_string_lossy().into_owned()
}

fn unsupported_type(relname: &str, column: &str, found: String) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
        format!("feature column \"{column}\" of {relname} has type {found}, which corgipile cannot encode"),
        Some("Feature columns may be numbers, boolean, text-like (text, varchar, char, enums), dates and times (date, timestamp, timestamptz, time, interval) or numeric arrays; leave this one out (\"exclude\" with \"*\"), or compute a supported column from it.".into()),
    )
}

/// `"features": "*"`: every user column of the relation, in table order, but the label and
/// the excluded ones (which must exist).
unsafe fn every_column(
    relid: pg_sys::Oid,
    relname: &str,
    label: &str,
    exclude: &[String],
) -> Vec<String> {
    for column in exclude {
        column_type(relid, relname, column, "exclude");
    }
    let rel = pg_sys::RelationIdGetRelation(relid);
    let desc = (*rel).rd_att;
    let mut names = Vec::new();
    for i in 0..(*desc).natts as usize {
        let att = &crate::pg::compat::tuple_desc_attrs(desc)[i];
        if att.attisdropped {
            continue;
        }
        let name = CStr::from_ptr(att.attname.data.as_ptr())
            .to_string_lossy()
            .into_owned();
        if name != label && !exclude.contains(&name) {
            names.push(name);
        }
    }
    pg_sys::RelationClose(rel);
    if names.is_empty() {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{relname} has no columns left to use as features"),
            Some(
                "\"features\": \"*\" uses every column but the label and the \"exclude\" list."
                    .into(),
            ),
        );
    }
    names
}

/// The SELECT expressions of a column list and how its columns are preprocessed: per-column
/// options resolved for a training (each option naming a listed column), or the stored
/// model's preprocessing, whose columns must still have their types.
unsafe fn tabular_columns(
    relid: pg_sys::Oid,
    relname: &str,
    label: &str,
    names: &[String],
    tabular: Tabular,
) -> (Vec<String>, PreprocessSpec) {
    let mut exprs = Vec::with_capacity(names.len());
    let mut plans = Vec::with_capacity(names.len());
    let session_zone = session_time_zone();
    for (i, name) in names.iter().enumerate() {
        if name == label {
            raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("column \"{name}\" is both the label and a feature"),
                None,
            );
        }
        let param = match tabular {
            Tabular::Stored(_) => "model",
            Tabular::Train { .. } => "features",
        };
        let t = column_type(relid, relname, name, param);
        // A timestamptz is read in the session's time zone at training, in the model's after.
        let zone = match &tabular {
            Tabular::Train { .. } => session_zone.clone(),
            Tabular::Stored(p) => p.zone(i).unwrap_or("UTC").to_owned(),
        };
        let Some((source, expr)) = column_source(name, t, &zone) else {
            unsupported_type(relname, name, type_name(t))
        };
        exprs.push(expr);
        match &tabular {
            Tabular::Train {
                options,
                normalize,
                numbers,
                ..
            } => {
                let mut own = ColumnOptions::with_default(
                    options.get(name),
                    options.get(EVERY_COLUMN),
                    source,
                );
                if source == Source::Number && own.encode.is_none() && own.scale.is_none() {
                    own.encode = Some(*numbers);
                }
                let mut plan = ColumnPlan::resolve(name, source, Some(&own), *normalize)
                    .unwrap_or_else(|problem| {
                        raise(
                            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                            format!("invalid value for parameter \"preprocess\": column \"{name}\": {problem}"),
                            None,
                        )
                    });
                if pg_sys::getBaseType(t) == pg_sys::TIMESTAMPTZOID {
                    plan.zone = Some(zone);
                }
                plans.push(plan);
            }
            Tabular::Stored(p) => {
                let wanted = p.columns[i].source;
                if wanted != source {
                    let what = |s: Source| match s {
                        Source::Number => "a number or boolean",
                        Source::Text => "text",
                        Source::NumberArray => "a numeric array",
                        Source::Time(kind) => kind.name(),
                    };
                    raise(
                        PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
                        format!(
                            "column \"{name}\" of {relname} has type {}, but the model was trained on {}",
                            type_name(t),
                            what(wanted)
                        ),
                        None,
                    );
                }
            }
        }
    }
    let spec = match tabular {
        Tabular::Train {
            options,
            max_categories,
            max_model_bytes,
            ..
        } => {
            if let Some(unknown) = options
                .keys()
                .find(|k| *k != EVERY_COLUMN && !names.contains(k))
            {
                raise(
                    PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                    format!("invalid value for parameter \"preprocess\": \"{unknown}\" is not a feature column"),
                    Some(format!("The feature columns are: {}.", names.join(", "))),
                );
            }
            // Numbers and hash buckets are features whatever the data: checked before a row is read.
            crate::pg::guc::check_model_size(
                ColumnPlan::fixed_width(&plans) as u64,
                1,
                max_model_bytes,
                "the feature columns (one per number, and the buckets of hashed columns)",
            );
            PreprocessSpec::Learn {
                plans,
                max_categories,
            }
        }
        Tabular::Stored(p) => PreprocessSpec::Fixed(p.clone()),
    };
    (exprs, spec)
}

fn numeric_label_expr(label: &str, t: pg_sys::Oid) -> String {
    if t == pg_sys::NUMERICOID {
        format!("{}::pg_catalog.float8", quote_identifier(label))
    } else {
        quote_identifier(label)
    }
}

fn label_kind(t: pg_sys::Oid) -> LabelKind {
    LabelKind::from_type(t).expect("checked numeric or boolean label type")
}
