//! Values printed the same in every session. What a type's output function prints can depend on
//! the session's settings (a date under `DateStyle`, a timestamptz under `TimeZone`, an
//! interval under `IntervalStyle`, bytea under `bytea_output`, a float under
//! `extra_float_digits`, money under `lc_monetary`). A text that is stored and compared later —
//! a group's key — must not: a row dated 2024-02-01 printed under `SQL, DMY` at training and
//! under `SQL, MDY` at prediction would pick another group's model. Such values are printed
//! with those settings fixed at PostgreSQL's defaults (so the keys of models trained under the
//! defaults are unchanged), as postgres_fdw fixes them to send values to another server.

use pgrx::pg_sys;
use std::ffi::CStr;

/// The settings an output function may read, at the values every key is printed with.
const FIXED: [(&CStr, &CStr); 5] = [
    (c"DateStyle", c"ISO, MDY"),
    (c"IntervalStyle", c"postgres"),
    (c"TimeZone", c"UTC"),
    (c"bytea_output", c"hex"),
    (c"extra_float_digits", c"1"),
];

/// Which settings a type's output depends on (see [`Printer::for_type`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Depends {
    /// Prints the same in every session: no setting is fixed (the common case costs nothing).
    Nothing,
    /// [`FIXED`].
    Settings,
    /// [`FIXED`] and `lc_monetary` (a `money` inside; setting it costs a `setlocale`).
    SettingsAndMoney,
}

impl Depends {
    fn and(self, other: Depends) -> Depends {
        match (self, other) {
            (Depends::SettingsAndMoney, _) | (_, Depends::SettingsAndMoney) => {
                Depends::SettingsAndMoney
            }
            (Depends::Settings, _) | (_, Depends::Settings) => Depends::Settings,
            _ => Depends::Nothing,
        }
    }
}

/// The type `money` (its constant is MONEYOID from 15 on, CASHOID before).
const MONEY: pg_sys::Oid = pg_sys::Oid::from_u32(790);

/// Nested types (arrays of composites of ranges …) at most this deep are inspected; deeper
/// ones are taken to depend on the settings.
const MAX_DEPTH: u32 = 16;

/// A type's output function, and the settings it is called with.
#[derive(Clone, Copy)]
pub struct Printer {
    output: pg_sys::Oid,
    depends: Depends,
    /// The type is passed by value: equal datums are equal values, with equal texts.
    pub by_value: bool,
}

impl Printer {
    /// The printer of values of type `t`.
    pub fn for_type(t: pg_sys::Oid) -> Printer {
        let (mut output, mut varlena) = (pg_sys::Oid::INVALID, false);
        // SAFETY: catalog lookups (FFI) on the backend thread, inside the transaction of the
        // SQL call, writing into the two locals; an unknown type is an ERROR.
        unsafe {
            pg_sys::getTypeOutputInfo(t, &mut output, &mut varlena);
            Printer {
                output,
                depends: depends(t, 0),
                by_value: pg_sys::get_typbyval(t),
            }
        }
    }

    /// The datum's text, the same in every session.
    ///
    /// # Safety
    /// `datum` is a valid non-NULL value of the printer's type (for a type passed by
    /// reference, a pointer to a live value that the output function reads).
    pub unsafe fn print(self, datum: pg_sys::Datum, out: &mut String) {
        let mut call = || {
            let text = pg_sys::OidOutputFunctionCall(self.output, datum);
            out.push_str(&CStr::from_ptr(text).to_string_lossy());
            pg_sys::pfree(text.cast());
        };
        if self.depends == Depends::Nothing {
            return call();
        }
        // GUC_ACTION_SAVE: the values last until AtEOXact_GUC below, or, if the output function
        // raises, until the (sub)transaction's abort pops this nest level; allowed in parallel
        // workers too.
        let nest = pg_sys::NewGUCNestLevel();
        for (name, value) in FIXED {
            set(name, value);
        }
        if self.depends == Depends::SettingsAndMoney {
            set(c"lc_monetary", c"C");
        }
        call();
        pg_sys::AtEOXact_GUC(true, nest);
    }
}

unsafe fn set(name: &CStr, value: &CStr) {
    pg_sys::set_config_option(
        name.as_ptr(),
        value.as_ptr(),
        pg_sys::GucContext::PGC_USERSET,
        pg_sys::GucSource::PGC_S_SESSION,
        pg_sys::GucAction::GUC_ACTION_SAVE,
        true,
        pgrx::PgLogLevel::ERROR as i32,
        false,
    );
}

/// Whether values of type `t` print differently under some session setting. Built-in types
/// are known; a type of an extension or a user (`FirstNormalObjectId` on) may read any
/// setting, so it gets them all fixed.
unsafe fn depends(t: pg_sys::Oid, depth: u32) -> Depends {
    if depth > MAX_DEPTH {
        return Depends::SettingsAndMoney;
    }
    let base = pg_sys::getBaseType(t);
    match base {
        pg_sys::DATEOID
        | pg_sys::TIMEOID
        | pg_sys::TIMETZOID
        | pg_sys::TIMESTAMPOID
        | pg_sys::TIMESTAMPTZOID
        | pg_sys::INTERVALOID
        | pg_sys::BYTEAOID
        | pg_sys::FLOAT4OID
        | pg_sys::FLOAT8OID => return Depends::Settings,
        MONEY => return Depends::SettingsAndMoney,
        _ => {}
    }
    if let Some(range) = crate::pg::compat::multirange_range(base) {
        return depends(range, depth + 1);
    }
    let element = pg_sys::get_element_type(base);
    if element != pg_sys::Oid::INVALID {
        return depends(element, depth + 1);
    }
    match pg_sys::get_typtype(base) as u8 {
        pg_sys::TYPTYPE_COMPOSITE => {
            let desc = pg_sys::lookup_rowtype_tupdesc(base, -1);
            let mut all = Depends::Nothing;
            for att in crate::pg::compat::tuple_desc_attrs(desc) {
                if !att.attisdropped {
                    all = all.and(depends(att.atttypid, depth + 1));
                }
            }
            pg_sys::DecrTupleDescRefCount(desc);
            all
        }
        pg_sys::TYPTYPE_RANGE => depends(pg_sys::get_range_subtype(base), depth + 1),
        pg_sys::TYPTYPE_ENUM | pg_sys::TYPTYPE_PSEUDO => Depends::Nothing,
        _ if u32::from(base) >= pg_sys::FirstNormalObjectId => Depends::SettingsAndMoney,
        _ => Depends::Nothing,
    }
}
