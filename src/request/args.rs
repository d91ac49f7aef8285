//! The SQL functions' argument types that corgipile reads itself: the params jsonb (bounded,
//! with clear errors), a relation (a regclass that names nothing is 42P01), and arrays, text
//! and rows kept as datums to be read in place.

use pgrx::pg_sys;

/// The `params jsonb` argument. pgrx's JsonB turns a number outside the float8 range into an
/// internal error; this one reports it as a bad parameter.
pub struct ParamsArg(pub serde_json::Value);

/// Most bytes of JSON text a params argument may have (1 MiB: thousands of column names).
pub const MAX_PARAMS_TEXT: usize = 1 << 20;

impl pgrx::FromDatum for ParamsArg {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<Self> {
        if is_null {
            return None;
        }
        // SAFETY: a non-NULL jsonb datum; jsonb_out returns a palloc'd C string.
        let text = pgrx::direct_function_call::<&std::ffi::CStr>(pg_sys::jsonb_out, &[Some(datum)])
            .expect("jsonb_out returns text");
        // A serde_json::Value takes up to ~50 times its text: bound the text first, so that a
        // huge params document is an ERROR rather than an allocation that aborts the server.
        let len = text.to_bytes().len();
        if len > MAX_PARAMS_TEXT {
            crate::pg::error::raise(
                pgrx::PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                format!("params are {len} bytes of JSON; corgipile reads at most {MAX_PARAMS_TEXT}"),
                Some("Params hold settings, not data: list fewer columns, or give the training a table.".into()),
            );
        }
        match serde_json::from_str(&text.to_string_lossy()) {
            Ok(value) => Some(ParamsArg(value)),
            Err(e) => crate::pg::error::raise(
                pgrx::PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("params could not be read: {e}"),
                Some("Numbers in params must fit in double precision.".into()),
            ),
        }
    }
}

/// A float8[] argument kept as its datum, read in place by `with_float_array`. pgrx's `Array`
/// argument costs a type-cache lookup and a guarded detoast on every call, which is most of a
/// per-row prediction's overhead over a plain scan.
pub struct Float8ArrayArg(pub pg_sys::Datum);

/// An int4[] argument kept as its datum (see `Float8ArrayArg`), read by `with_int4_array`.
pub struct Int4ArrayArg(pub pg_sys::Datum);

/// A composite (row) argument kept as its datum, read by `predict::row`.
pub struct RecordArg(pub pg_sys::Datum);

impl pgrx::FromDatum for RecordArg {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<Self> {
        (!is_null).then_some(RecordArg(datum))
    }
}

/// A text argument kept as its datum (see `Float8ArrayArg`), read by `with_text_bytes`.
pub struct TextArg(pub pg_sys::Datum);

impl pgrx::FromDatum for TextArg {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<Self> {
        (!is_null).then_some(TextArg(datum))
    }
}

/// A regclass argument, opened with AccessShareLock. Unlike pgrx's `PgRelation` argument, an
/// OID that names no relation (`0::oid::regclass`, a dropped table's OID) is a clean ERROR
/// 42P01, not an internal error from relation_open.
pub struct RelationArg(pub pgrx::PgRelation);

impl RelationArg {
    pub fn oid(&self) -> pg_sys::Oid {
        self.0.oid()
    }
}

impl pgrx::FromDatum for RelationArg {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<Self> {
        if is_null {
            return None;
        }
        let oid = pg_sys::Oid::from(datum.value() as u32);
        // Lock first (a lock on an OID that names nothing is harmless), then look: a table
        // dropped between the two cannot reach relation_open.
        pg_sys::LockRelationOid(oid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        if pg_sys::get_rel_name(oid).is_null() {
            pg_sys::UnlockRelationOid(oid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
            crate::pg::error::raise(
                pgrx::PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
                format!("relation with OID {} does not exist", u32::from(oid)),
                Some("Name the relation, as in 'my_table' or 'my_schema.my_table'.".into()),
            );
        }
        // SAFETY: the relation exists and is locked (the lock is kept to the transaction's end).
        Some(RelationArg(pgrx::PgRelation::with_lock(
            oid,
            pg_sys::AccessShareLock as pg_sys::LOCKMODE,
        )))
    }
}

impl pgrx::FromDatum for Float8ArrayArg {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<Self> {
        (!is_null).then_some(Float8ArrayArg(datum))
    }
}

impl pgrx::FromDatum for Int4ArrayArg {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<Self> {
        (!is_null).then_some(Int4ArrayArg(datum))
    }
}

/// Argument unboxing for our FromDatum-based argument types, as pgrx does for its own.
macro_rules! from_datum_arg {
    ($($t:ty => $sql:literal),*) => {$(
        // SAFETY: unboxed exactly like pgrx's own FromDatum-based argument types.
        unsafe impl<'fcx> pgrx::callconv::ArgAbi<'fcx> for $t {
            unsafe fn unbox_arg_unchecked(arg: pgrx::callconv::Arg<'_, 'fcx>) -> Self {
                let index = arg.index();
                arg.unbox_arg_using_from_datum().unwrap_or_else(|| panic!("argument {index} must not be null"))
            }
            unsafe fn unbox_nullable_arg(arg: pgrx::callconv::Arg<'_, 'fcx>) -> pgrx::nullable::Nullable<Self> {
                arg.unbox_arg_using_from_datum().into()
            }
        }
        pgrx::impl_sql_translatable!($t, arg_only = $sql);
    )*};
}

from_datum_arg!(
    ParamsArg => "jsonb",
    Float8ArrayArg => "double precision[]",
    Int4ArrayArg => "integer[]",
    TextArg => "TEXT",
    RecordArg => "record",
    RelationArg => "regclass"
);
