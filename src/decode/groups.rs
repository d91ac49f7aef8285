//! Per-group models (`"group_by"`): the group of a row is the text of its group columns' values
//! (one column: the value as PostgreSQL prints it under the default settings, whatever the
//! session's — see `crate::pg::fixed_output`; several: a JSON array of those texts). The
//! statistics pass finds the groups and counts their rows; the groups with enough rows then get
//! a model, numbered 0 … k-1, and every later row carries its group's number (or `NO_GROUP`:
//! a small group, one seen only after the statistics pass, or a NULL in a group column).
//! Predictions from a row compute the same key (`crate::predict::row`).

use crate::pg::error::raise;
use crate::pg::fixed_output::Printer;
use corgipile_ml::arena::NO_GROUP;
use corgipile_ml::hash::MapHasher;
use pgrx::{pg_sys, PgSqlErrorCode};
use std::collections::HashMap;
use std::fmt::Write;

use super::datum::with_text_bytes;
use crate::pipeline::{GroupsFound, LabelKind};

pub use crate::pipeline::{MAX_GROUPS, MAX_KEYS_BYTES, MAX_KEY_BYTES};

/// How a group column's datum becomes text.
#[derive(Clone, Copy)]
pub enum KeyRead {
    /// Integers and boolean: printed as their output functions print them.
    Number(LabelKind),
    /// text, varchar: the bytes.
    Text,
    /// Any other type: its output function, with the settings it reads fixed (a key must not
    /// depend on the session that computes it).
    Output(Printer),
}

impl KeyRead {
    /// How a column of type `t` is read.
    pub fn for_type(t: pg_sys::Oid) -> KeyRead {
        match t {
            pg_sys::TEXTOID | pg_sys::VARCHAROID => KeyRead::Text,
            pg_sys::BOOLOID | pg_sys::INT2OID | pg_sys::INT4OID | pg_sys::INT8OID => {
                KeyRead::Number(LabelKind::from_type(t).expect("a number type"))
            }
            _ => KeyRead::Output(Printer::for_type(t)),
        }
    }

    /// An integer or boolean column's value as a number (bool: 0 or 1).
    fn number(kind: LabelKind, datum: pg_sys::Datum) -> i64 {
        kind.to_f64(datum) as i64
    }

    /// Appends the datum's text to `out`.
    unsafe fn write(self, datum: pg_sys::Datum, out: &mut String) {
        match self {
            KeyRead::Number(LabelKind::Bool) => {
                out.push(if datum.value() & 0xff != 0 { 't' } else { 'f' })
            }
            KeyRead::Number(kind) => {
                let _ = write!(out, "{}", kind.to_f64(datum) as i64);
            }
            KeyRead::Text => with_text_bytes(datum, |b| out.push_str(&String::from_utf8_lossy(b))),
            KeyRead::Output(printer) => printer.print(datum, out),
        }
    }
}

/// The key of a row's group columns (`datum(i)`: the i-th group column's value, None for NULL)
/// into `out`; false when one is NULL (the row is in no group).
///
/// # Safety
/// Each datum `datum` gives is a valid non-NULL value of the type its read was made for (for a
/// type passed by reference, a pointer to a live value).
pub unsafe fn write_key(
    reads: &[KeyRead],
    datum: impl Fn(usize) -> Option<pg_sys::Datum>,
    out: &mut String,
) -> bool {
    out.clear();
    if let [read] = reads {
        let Some(d) = datum(0) else { return false };
        read.write(d, out);
        return true;
    }
    let mut parts = Vec::with_capacity(reads.len());
    let mut part = String::new();
    for (i, read) in reads.iter().enumerate() {
        let Some(d) = datum(i) else { return false };
        part.clear();
        read.write(d, &mut part);
        parts.push(serde_json::Value::String(part.clone()));
    }
    out.push_str(&serde_json::Value::Array(parts).to_string());
    true
}

/// The groups of a training's rows: found and counted by the statistics pass, then numbered.
pub struct Groups {
    /// The group columns' positions in the query's output, and how each is read.
    first: usize,
    reads: Vec<KeyRead>,
    /// Every group seen by the statistics pass: its number there, and its key and rows (the
    /// keys of one integer or boolean column also by value: no text per row; those of one
    /// other column passed by value, such as a date, by datum once seen, as printing a key
    /// with the settings fixed costs about a microsecond).
    index: HashMap<String, u32, MapHasher>,
    by_number: HashMap<i64, u32, MapHasher>,
    seen: Vec<(String, u64)>,
    /// Once numbered: per group seen, its model's number or NO_GROUP.
    numbers: Option<Vec<u32>>,
    key: String,
    /// The bytes of every key seen.
    key_bytes: usize,
}

impl Groups {
    /// The group columns are the query's columns from `first` on, of types `types`. `known`:
    /// the groups are these keys, numbered in order (evaluating a stored family), rather than
    /// found by a statistics pass.
    pub fn new(first: usize, types: &[u32], known: Option<&[String]>) -> Groups {
        let mut groups = Groups {
            first,
            reads: types
                .iter()
                .map(|&t| KeyRead::for_type(pg_sys::Oid::from(t)))
                .collect(),
            index: HashMap::default(),
            by_number: HashMap::default(),
            seen: Vec::new(),
            numbers: None,
            key: String::new(),
            key_bytes: 0,
        };
        if let Some(keys) = known {
            for key in keys {
                groups.remember(key.clone());
            }
            groups.numbers = Some((0..keys.len() as u32).collect());
        }
        groups
    }

    /// The row's group: while the statistics pass runs, counted (its number there is not a
    /// model's: NO_GROUP); afterwards its model's number, or NO_GROUP.
    ///
    /// # Safety
    /// `values`/`nulls` point to the row's arrays of the query's columns (at least `first`
    /// plus the group columns), valid for this call; the group columns' non-NULL datums are
    /// valid values of the types `new` was given.
    pub unsafe fn of_row(&mut self, values: *mut pg_sys::Datum, nulls: *mut bool) -> u32 {
        let first = self.first;
        if let [KeyRead::Number(kind)] = self.reads[..] {
            // One integer or boolean column: looked up by value.
            if *nulls.add(first) {
                return NO_GROUP;
            }
            let v = KeyRead::number(kind, *values.add(first));
            if let Some(&i) = self.by_number.get(&v) {
                return self.seen_again(i);
            }
        }
        // One column passed by value (a date, a timestamp): its datum is the value.
        let by_datum = match self.reads[..] {
            [KeyRead::Output(printer)] if printer.by_value && !*nulls.add(first) => {
                let v = (*values.add(first)).value() as i64;
                if let Some(&i) = self.by_number.get(&v) {
                    return self.seen_again(i);
                }
                Some(v)
            }
            _ => None,
        };
        let datum = |i: usize| (!*nulls.add(first + i)).then(|| *values.add(first + i));
        if !write_key(&self.reads, datum, &mut self.key) {
            return NO_GROUP;
        }
        if let Some(&i) = self.index.get(self.key.as_str()) {
            if let Some(v) = by_datum {
                self.by_number.insert(v, i);
            }
            return self.seen_again(i);
        }
        if self.numbers.is_some() {
            return NO_GROUP; // a group the statistics pass did not see
        }
        if self.key.len() > MAX_KEY_BYTES {
            raise(
                PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                format!("a group of \"group_by\" has a key of {} bytes; corgipile allows at most {MAX_KEY_BYTES}", self.key.len()),
                Some("Group by shorter values (e.g. an id instead of a description).".into()),
            );
        }
        if self.key_bytes + self.key.len() > MAX_KEYS_BYTES {
            keys_too_large();
        }
        if self.seen.len() >= MAX_GROUPS {
            too_many_groups();
        }
        let i = self.remember(self.key.clone());
        if let Some(v) = by_datum {
            self.by_number.insert(v, i);
        }
        self.seen_again(i)
    }

    /// A group seen again: counted while the statistics pass runs (NO_GROUP), afterwards its
    /// model's number.
    fn seen_again(&mut self, i: u32) -> u32 {
        match &self.numbers {
            Some(numbers) => numbers[i as usize],
            None => {
                self.seen[i as usize].1 += 1;
                NO_GROUP
            }
        }
    }

    /// A new group, with no rows yet; its number in `seen`.
    fn remember(&mut self, key: String) -> u32 {
        let i = self.seen.len() as u32;
        if let [KeyRead::Number(kind)] = self.reads[..] {
            let value = match kind {
                LabelKind::Bool => Some(i64::from(key == "t")),
                _ => key.parse().ok(),
            };
            if let Some(v) = value {
                self.by_number.insert(v, i);
            }
        }
        self.key_bytes += key.len();
        self.index.insert(key.clone(), i);
        self.seen.push((key, 0));
        i
    }

    /// Ends the statistics pass: the groups of at least `min_rows` rows get models, numbered in
    /// the order they were first seen.
    pub fn number(&mut self, min_rows: u64) -> GroupsFound {
        let (numbers, found) =
            number_groups(self.seen.iter().map(|(k, r)| (k.as_str(), *r)), min_rows);
        self.numbers = Some(numbers);
        found
    }
}

/// The groups `seen` (each key once, with its rows, in the order first seen) numbered: those
/// of at least `min_rows` rows get models, numbered in that order. Returns each one's number
/// (or NO_GROUP) and what was found.
pub fn number_groups<'a>(
    seen: impl Iterator<Item = (&'a str, u64)>,
    min_rows: u64,
) -> (Vec<u32>, GroupsFound) {
    let mut numbers = Vec::new();
    let mut kept = Vec::new();
    let (mut small, mut small_rows) = (0u64, 0u64);
    for (key, rows) in seen {
        if rows >= min_rows {
            numbers.push(kept.len() as u32);
            kept.push((key.to_owned(), rows));
        } else {
            numbers.push(NO_GROUP);
            small += 1;
            small_rows = small_rows.saturating_add(rows);
        }
    }
    let found = GroupsFound {
        kept,
        small,
        small_rows,
    };
    (numbers, found)
}

/// The ERROR of more than MAX_GROUPS groups (on one server, or over a sharded table's shards).
pub fn too_many_groups() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
        format!("\"group_by\" finds more than {MAX_GROUPS} groups"),
        Some("Group by fewer or coarser columns: every group is a model.".into()),
    )
}

/// The ERROR of keys of more than MAX_KEYS_BYTES in all.
pub fn keys_too_large() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
        format!(
            "the keys of the groups of \"group_by\" take more than {} MB",
            MAX_KEYS_BYTES >> 20
        ),
        Some(
            "Group by shorter values (e.g. an id instead of a description), or by fewer columns."
                .into(),
        ),
    )
}
