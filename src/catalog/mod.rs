//! corgipile.models / corgipile.epochs: writing trained models, loading them for prediction.
//!
//! Loaded models are cached per backend for the duration of one statement (keyed by the
//! transaction, statement start and command id, plus the current role), so
//! `SELECT corgipile_predict(id, f) FROM big_table` reads the catalog once, while a later
//! statement never sees a model that has since been deleted.

pub mod deployments;
pub mod grants;
pub mod groups;
pub mod locks;
pub mod plans;
pub mod search;
mod store;
pub mod warm_start;

pub use store::{store_model_with, ModelSource};

use crate::pg::error::raise;
use crate::pipeline::ClassValue;

use corgipile_ml::model::{ModelKind, Predictor};
use corgipile_ml::network::Activation;
use corgipile_ml::preprocess::Preprocessor;
use corgipile_ml::row::Row;
use corgipile_ml::trained::Model;
use corgipile_ml::trained::{ModelParts, PartsError};
use pgrx::prelude::*;
use pgrx::{JsonB, PgSqlErrorCode};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::rc::Rc;

/// The role that called us (models belong to it): its OID and name.
pub fn caller() -> (pg_sys::Oid, String) {
    // SAFETY: plain reads of the session's current role on the backend thread;
    // GetUserNameFromId(noerr = false) returns a palloc'd C string or raises.
    unsafe {
        let role = pg_sys::GetUserId();
        let name = std::ffi::CStr::from_ptr(pg_sys::GetUserNameFromId(role, false))
            .to_string_lossy()
            .into_owned();
        (role, name)
    }
}

/// corgipile.models' OID and its owner (the role that created the extension).
fn catalog_table() -> (pg_sys::Oid, pg_sys::Oid) {
    // SAFETY: catalog lookups on the backend thread inside a transaction; the relation is
    // opened only to read its owner and closed at once.
    unsafe {
        let schema = pg_sys::get_namespace_oid(c"corgipile".as_ptr(), false);
        let relid = pg_sys::get_relname_relid(c"models".as_ptr(), schema);
        if relid == pg_sys::InvalidOid {
            raise(
                PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
                "corgipile.models does not exist",
                Some("CREATE EXTENSION corgipile (or ALTER EXTENSION corgipile UPDATE).".into()),
            );
        }
        let rel = pg_sys::RelationIdGetRelation(relid);
        let owner = (*(*rel).rd_rel).relowner;
        pg_sys::RelationClose(rel);
        (relid, owner)
    }
}

/// Whether the caller may manage every role's models (superusers and the catalog's owner; the
/// same roles that see every row through row-level security).
pub fn caller_manages_all() -> bool {
    // SAFETY: privilege lookup on the backend thread.
    unsafe { pg_sys::has_privs_of_role(pg_sys::GetUserId(), catalog_table().1) }
}

/// Runs `f` (catalog writes) with the privileges of the catalog's owner: PUBLIC may only read
/// corgipile.models / corgipile.epochs, so ids, versions and rows come from these functions
/// alone. As in a SECURITY DEFINER function: a restricted operation, search_path pinned to
/// pg_catalog so the caller's objects cannot be resolved into the statements. Every statement
/// run here filters by the caller's role explicitly (row-level security does not apply to the
/// owner). On ERROR, transaction (or subtransaction) abort restores the role and the setting.
pub fn as_catalog_owner<R>(f: impl FnOnce() -> R) -> R {
    let (_, owner) = catalog_table();
    // SAFETY: backend thread, inside a transaction; the saved role and security context are
    // restored below on success and by (sub)transaction abort on ERROR; the GUC nest level is
    // closed on success and by abort otherwise.
    unsafe {
        let mut saved_role = pg_sys::InvalidOid;
        let mut saved_context: i32 = 0;
        pg_sys::GetUserIdAndSecContext(&mut saved_role, &mut saved_context);
        pg_sys::SetUserIdAndSecContext(
            owner,
            saved_context
                | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32
                | pg_sys::SECURITY_RESTRICTED_OPERATION as i32,
        );
        let nest = pg_sys::NewGUCNestLevel();
        pg_sys::set_config_option(
            c"search_path".as_ptr(),
            c"pg_catalog, pg_temp".as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_SAVE,
            true,
            0,
            false,
        );
        let result = f();
        pg_sys::AtEOXact_GUC(true, nest);
        pg_sys::SetUserIdAndSecContext(saved_role, saved_context);
        result
    }
}

/// Refuse, before any work, a call that must write the catalog where nothing can be written:
/// a READ ONLY transaction or a hot standby. `what` names the function, as "corgipile_train()".
pub fn check_writable(what: &std::ffi::CStr) {
    // SAFETY: both raise a proper ERROR (25006) or return; backend thread.
    unsafe {
        pg_sys::PreventCommandIfReadOnly(what.as_ptr());
        pg_sys::PreventCommandDuringRecovery(what.as_ptr());
    }
}

/// Takes, for the rest of the transaction, the lock that serializes trainings of one model
/// name (of its owner); another session holding it is an ERROR now rather than a wait (or a
/// clash) after the training. The lock lives in a lock space no SQL command reaches, keyed by
/// the owner and a 47-bit hash of the name (`crate::catalog::locks`), so no role can take it to block
/// another, and two different names do not realistically share it.
pub fn lock_model_name(name: &crate::catalog::grants::ModelName) {
    crate::catalog::locks::lock_training(&name.owner, &name.name);
}

pub fn no_such_model(model_id: i64) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
        format!("corgipile model {model_id} does not exist"),
        Some(
            "SELECT id, name, version FROM corgipile.model_summary lists the models you can use."
                .into(),
        ),
    )
}

/// The first column of the first row of a query, if it returns a row. Read-only SPI: it runs
/// in parallel workers too (prediction by name), where a read-write statement, which would
/// assign a transaction id, is an ERROR.
pub fn select_one<T: pgrx::FromDatum + pgrx::IntoDatum>(
    sql: &str,
    args: &[pgrx::datum::DatumWithOid<'_>],
) -> Result<Option<T>, pgrx::spi::Error> {
    Spi::connect(|client| {
        let table = client.select(sql, Some(1), args)?;
        if table.is_empty() {
            return Ok(None);
        }
        table.first().get_one::<T>()
    })
}

/// The id of the deployed version of a model name (the caller's own, or `owner.name` of a role
/// that granted the caller a privilege on that name): the pinned version if one is pinned
/// (corgipile_deploy), else the newest. A name the caller may not use does not exist for it.
pub fn resolve_name(text: &str) -> i64 {
    find_name(text).unwrap_or_else(|| no_such_name(text))
}

fn no_such_name(text: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
        format!("no corgipile model named \"{text}\""),
        Some("SELECT name, version, id, trained_by FROM corgipile.model_summary lists the models you can use (another role's name is written owner.name); train one with corgipile_train(..., '{\"name\": \"...\"}').".into()),
    )
}

/// [`resolve_name`], None where it raises that the name does not exist.
fn find_name(text: &str) -> Option<i64> {
    let n = crate::catalog::grants::model_name(text);
    if !crate::catalog::grants::may_use_name(&n) {
        return None;
    }
    // The pinned version, else the newest: two index lookups (ordering every version by
    // "pinned" read all of a name's versions: 0.4 s a call for a family of 100,000 groups).
    select_one::<i64>(
        "SELECT COALESCE(
             (SELECT id FROM corgipile.models
              WHERE name OPERATOR(pg_catalog.=) $1 AND trained_by OPERATOR(pg_catalog.=) $2::pg_catalog.name
                AND pinned),
             (SELECT id FROM corgipile.models
              WHERE name OPERATOR(pg_catalog.=) $1 AND trained_by OPERATOR(pg_catalog.=) $2::pg_catalog.name
              ORDER BY version DESC LIMIT 1))",
        &[n.name.as_str().into(), n.owner.as_str().into()],
    )
    .unwrap_or_else(|e| raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, format!("could not look up model \"{text}\": {e}"), None))
}

/// Raise unless the extension's SQL objects in this database are the version of this library
/// (after installing a new corgipile, each database needs ALTER EXTENSION corgipile UPDATE).
pub fn check_schema_version() {
    let installed = select_one::<String>("SELECT extversion FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'corgipile'", &[])
    .ok()
    .flatten()
    .unwrap_or_default();
    let library = env!("CARGO_PKG_VERSION");
    if installed != library {
        raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("the corgipile library is version {library} but this database has version {installed} of the extension"),
            Some("Run ALTER EXTENSION corgipile UPDATE; existing models are kept.".into()),
        );
    }
}

/// A model as prediction and evaluation need it.
pub struct StoredModel {
    pub id: i64,
    pub model: Model,
    /// Classifiers: the label values by class index (binary: [negative, positive]).
    pub classes: Vec<ClassValue>,
    pub label_column: String,
    pub features: serde_json::Value,
    pub index_base: i64,
    /// Trained on a boolean label (classes 0 and 1 stand for false and true).
    pub boolean_label: bool,
    /// A column list's preprocessing: predictions take rows, by column name.
    pub preprocessing: Option<Preprocessor>,
    /// The model of every row of a training with `"group_by"`: its groups' models.
    pub groups: Option<Rc<GroupFamily>>,
}

/// The models of a training's groups (see `catalog::groups`).
pub struct GroupFamily {
    /// The group columns.
    pub columns: Vec<String>,
    /// Each group's key and its model's id.
    pub models: std::collections::HashMap<String, i64>,
}

impl StoredModel {
    /// A class as text, as the label column would show it.
    pub fn class_text(&self, index: usize) -> String {
        self.classes[index].name(self.boolean_label)
    }

    pub fn kind(&self) -> ModelKind {
        self.model.kind()
    }
    pub fn n_features(&self) -> usize {
        self.model.n_features()
    }
    /// The class index a prediction stands for (binary: 0 = negative, 1 = positive).
    pub fn class_index(&self, row: Row) -> usize {
        self.model.class_index(row)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct CacheStamp {
    lxid: u32,
    statement_start: i64,
    command_id: u32,
}

fn current_stamp() -> CacheStamp {
    // SAFETY: read-only calls on the backend thread inside a transaction; MyProc is set for
    // every regular backend.
    unsafe {
        CacheStamp {
            lxid: crate::pg::compat::local_xid(),
            statement_start: pg_sys::GetCurrentStatementStartTimestamp(),
            command_id: pg_sys::GetCurrentCommandId(false),
        }
    }
}

/// Values kept for the current statement only (see `CacheStamp`): emptied when another begins.
struct StatementCache<K, V> {
    stamp: Option<CacheStamp>,
    values: HashMap<K, V>,
}

impl<K: Eq + std::hash::Hash, V: Clone> StatementCache<K, V> {
    fn new() -> Self {
        StatementCache {
            stamp: None,
            values: HashMap::new(),
        }
    }

    /// The value of `key` cached in this statement.
    fn get(&mut self, key: &K) -> Option<V> {
        let stamp = current_stamp();
        if self.stamp != Some(stamp) {
            self.stamp = Some(stamp);
            self.values.clear();
        }
        self.values.get(key).cloned()
    }

    fn insert(&mut self, key: K, value: V) {
        self.values.insert(key, value);
    }
}

/// The current role (the caches are per role: row-level security decides what it sees).
fn current_role() -> pg_sys::Oid {
    // SAFETY: plain read of the current role on the backend thread.
    unsafe { pg_sys::GetUserId() }
}

thread_local! {
    /// Models loaded in the current statement, by (model id, role).
    static CACHE: RefCell<StatementCache<(i64, pg_sys::Oid), Rc<StoredModel>>> =
        RefCell::new(StatementCache::new());
    /// Names resolved in the current statement, by (name, role): a set-returning prediction
    /// has no call-site cache, and would resolve its name for every row otherwise.
    static NAMES: RefCell<StatementCache<(String, pg_sys::Oid), i64>> =
        RefCell::new(StatementCache::new());
}

/// The model with this id, from the per-statement cache or the catalog. Row-level security on
/// the catalog applies: a model the current role may not see does not exist for it.
pub fn load_model(model_id: i64) -> Rc<StoredModel> {
    load_visible_model(model_id).unwrap_or_else(|| no_such_model(model_id))
}

/// [`load_model`], None when the caller may not see the model (or it does not exist).
pub fn load_visible_model(model_id: i64) -> Option<Rc<StoredModel>> {
    let key = (model_id, current_role());
    if let Some(model) = CACHE.with(|c| c.borrow_mut().get(&key)) {
        return Some(model);
    }
    let model = Rc::new(read_model(model_id)?);
    CACHE.with(|c| c.borrow_mut().insert(key, model.clone()));
    Some(model)
}

/// A group's model of the family `family` (see `catalog::groups`): an ERROR that says why when
/// the caller may see the family but not the group's model (a grant on one model id covers
/// that model only). The ERROR names the family and the row's group, which the caller knows,
/// never the hidden model's id: a role cannot learn anything of a model it may not use.
pub fn load_group_model(family: &StoredModel, key: &str, model_id: i64) -> Rc<StoredModel> {
    load_visible_model(model_id).unwrap_or_else(|| {
        raise(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("model {} predicts the rows of group {key} with a model of that group, which you may not use", family.id),
            Some("A grant on the model's name covers every group's model: corgipile_grant('name', role, 'use'). A grant on one model id covers that model only.".into()),
        )
    })
}

/// A catalog array as a Vec; running out of memory is an ERROR, not an abort of the server.
fn fallible_copy(array: Option<pgrx::Array<f64>>, model_id: i64) -> Vec<f64> {
    let Some(array) = array else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if out.try_reserve_exact(array.len()).is_err() {
        raise(
            PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
            format!(
                "out of memory loading model {model_id} ({} weights)",
                array.len()
            ),
            None,
        );
    }
    match array.as_slice() {
        Ok(values) => out.extend_from_slice(values),
        Err(_) => {
            for v in array.iter() {
                let Some(v) = v else {
                    raise(
                        PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
                        format!("model {model_id} has NULL weights"),
                        None,
                    )
                };
                out.push(v);
            }
        }
    }
    out
}

/// A column of corgipile.models as the model query reads it: `NULL` of its type in a database
/// that does not have it yet (preprocessing before 0.4.0, layers before 0.5.0: the library is
/// updated before ALTER EXTENSION UPDATE adds the column), so its models keep predicting until
/// the update.
fn catalog_column(name: &'static CStr, null: &'static str) -> &'static str {
    let (relid, _) = catalog_table();
    // SAFETY: a syscache lookup on the backend thread inside a transaction.
    let attnum = unsafe { pg_sys::get_attnum(relid, name.as_ptr()) };
    if attnum > 0 {
        name.to_str().expect("an ASCII column name")
    } else {
        null
    }
}

/// corgipile.models.label_mapping: a classifier's label values by class index (binary:
/// [negative, positive]) and the label column's type, as `{"classes": [...], "label_type": ...}`.
#[derive(Serialize, Deserialize)]
struct LabelMapping {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    classes: Option<Vec<ClassValue>>,
    label_type: String,
}

fn read_model(model_id: i64) -> Option<StoredModel> {
    let row = Spi::connect(|client| {
        let table = client.select(
            &format!(
            "SELECT model_type, n_features, n_outputs, weights, bias, label_mapping, label_column, features,
                    coalesce((params OPERATOR(pg_catalog.->>) 'index_base')::pg_catalog.int8, 1),
                    {preprocessing}, {layers},
                    params OPERATOR(pg_catalog.->>) 'activation',
                    metrics OPERATOR(pg_catalog.->) 'groups'
             FROM corgipile.models WHERE id OPERATOR(pg_catalog.=) $1",
            preprocessing = catalog_column(c"preprocessing", "NULL::pg_catalog.jsonb"),
            layers = catalog_column(c"layers", "NULL::pg_catalog.int4[]"),
        ),
            Some(1),
            &[model_id.into()],
        )?;
        if table.is_empty() {
            return Ok(None);
        }
        let row = table.first();
        Ok::<_, pgrx::spi::Error>(Some((
            row.get::<String>(1)?.unwrap_or_default(),
            row.get::<i32>(2)?.unwrap_or(0),
            row.get::<i32>(3)?.unwrap_or(1),
            fallible_copy(row.get::<pgrx::Array<f64>>(4)?, model_id),
            fallible_copy(row.get::<pgrx::Array<f64>>(5)?, model_id),
            row.get::<JsonB>(6)?.map(|j| j.0).unwrap_or_default(),
            row.get::<String>(7)?.unwrap_or_default(),
            row.get::<JsonB>(8)?.map(|j| j.0).unwrap_or_default(),
            row.get::<i64>(9)?.unwrap_or(1),
            row.get::<JsonB>(10)?.map(|j| j.0).filter(|j| !j.is_null()),
            row.get::<Vec<Option<i32>>>(11)?,
            row.get::<String>(12)?,
            row.get::<JsonB>(13)?.map(|j| j.0),
        )))
    })
    .unwrap_or_else(|e| raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, format!("could not read model {model_id}: {e}"), None));
    let (
        kind,
        n_features,
        n_outputs,
        weights,
        bias,
        mapping,
        label_column,
        features,
        index_base,
        preprocessing,
        layers,
        activation,
        groups,
    ) = row?;
    let kind: ModelKind = kind.parse().unwrap_or_else(|_| {
        raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!(
                "model {model_id} has type \"{kind}\", which this version of corgipile cannot use"
            ),
            None,
        )
    });
    let mapping: LabelMapping = serde_json::from_value(mapping).unwrap_or_else(|_| {
        raise(
            PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
            format!("model {model_id} has an unreadable label mapping"),
            None,
        )
    });
    let classes = mapping.classes.unwrap_or_default();
    let boolean_label = mapping.label_type == "boolean";
    let (n_features, n_outputs) = (n_features.max(0) as usize, n_outputs.max(1) as usize);
    let inconsistent = || -> ! {
        raise(
            PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
            format!("model {model_id} has inconsistent weights"),
            None,
        )
    };
    // Each family checks its own columns (a linear model has no layers, a network's widths
    // give its weights' and biases' lengths).
    let activation = activation
        .as_deref()
        .map(|name| Activation::parse(name).unwrap_or_else(|| inconsistent()));
    let parts = ModelParts {
        kind,
        n_features,
        n_outputs,
        weights,
        bias,
        layers: layers.map(|widths| {
            widths
                .into_iter()
                .map(|n| n.filter(|&n| n > 0).map_or(0, |n| n as usize))
                .collect()
        }),
        activation,
    };
    let model = match kind.family().model_from(parts) {
        Ok(model) => model,
        Err(PartsError::OutOfMemory { bytes }) => raise(
            PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
            format!("out of memory loading model {model_id} ({bytes} bytes)"),
            None,
        ),
        Err(PartsError::BadShape(_)) => inconsistent(),
    };
    let preprocessing = preprocessing.map(|json| {
        let p = Preprocessor::from_json(&json)
            .filter(|p| p.n_features == n_features)
            .unwrap_or_else(|| {
                raise(
                    PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
                    format!("model {model_id} has an unreadable preprocessing"),
                    None,
                )
            });
        if p.prepare().is_err() {
            raise(
                PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
                format!("out of memory for the categories of model {model_id}"),
                None,
            );
        }
        p
    });
    // Per-group models: each group's key and model id.
    let groups = groups.map(|g| {
        let columns: Option<Vec<String>> = serde_json::from_value(g["columns"].clone()).ok();
        let models: Option<std::collections::HashMap<String, i64>> =
            serde_json::from_value(g["models"].clone()).ok();
        match (columns, models) {
            (Some(columns), Some(models)) => Rc::new(GroupFamily { columns, models }),
            _ => raise(
                PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
                format!("model {model_id} has unreadable group models"),
                None,
            ),
        }
    });
    Some(StoredModel {
        id: model_id,
        groups,
        preprocessing,
        model,
        classes,
        label_column,
        features,
        index_base,
        boolean_label,
    })
}

/// The OID of the role `name`, or None if there is no such role.
pub fn role_oid(name: &str) -> Option<pg_sys::Oid> {
    let name = CString::new(name).ok()?;
    // SAFETY: a syscache lookup on the backend thread inside a transaction; missing_ok = true
    // returns InvalidOid instead of raising.
    let oid = unsafe { pg_sys::get_role_oid(name.as_ptr(), true) };
    (oid != pg_sys::InvalidOid).then_some(oid)
}

/// How a SQL call names its model: by id, or by name (the name's deployed version).
#[derive(Clone, Copy)]
pub enum ModelRef<'a> {
    Id(i64),
    Name(&'a str),
}

impl<'a> ModelRef<'a> {
    /// The text argument of a by-name overload. Names are never integers (the name param
    /// refuses them), so an integer here is a model id: `corgipile_predict('7', f)`, or an id
    /// from psql's :'var', means model 7, as it did before names existed.
    pub fn from_text(text: &'a str) -> Self {
        match text.trim().parse::<i64>() {
            Ok(id) => ModelRef::Id(id),
            Err(_) => ModelRef::Name(text),
        }
    }
}

/// The model a reference stands for now (row-level security applies).
pub fn load_model_ref(key: ModelRef) -> Rc<StoredModel> {
    match key {
        ModelRef::Id(id) => load_model(id),
        ModelRef::Name(name) => load_model(resolve_name_in_statement(name)),
    }
}

/// [`resolve_name`], once per statement and role (what a name stands for cannot change
/// within one: the functions that read it are stable).
fn resolve_name_in_statement(name: &str) -> i64 {
    find_name_in_statement(name).unwrap_or_else(|| no_such_name(name))
}

/// [`find_name`], once per statement and role (a name found at plan time is the one the
/// statement's execution uses).
fn find_name_in_statement(name: &str) -> Option<i64> {
    let key = (name.to_owned(), current_role());
    if let Some(id) = NAMES.with(|c| c.borrow_mut().get(&key)) {
        return Some(id);
    }
    let id = find_name(name)?;
    NAMES.with(|c| c.borrow_mut().insert(key, id));
    Some(id)
}
