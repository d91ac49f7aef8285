//! A table's mark: what a training read of one table, named so that any server can tell its
//! own tables from another's — the server's system identifier and database, the table's oid,
//! its file (relfilenode) and its pages up to its last page in use (as `request::since`
//! records them). A sharded training's statistics round brings back every shard table's mark,
//! the model stores them, and a training `"since"` that model sends them back: each shard
//! picks its own by (system, database, table) — two clusters can give tables the same oid.

use serde::{Deserialize, Serialize};

/// The most marks a request carries: one per leaf of a sharded table.
pub const MAX_MARKS: usize = 65_536;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableMark {
    /// `GetSystemIdentifier()` of the table's server (its cluster).
    pub system: u64,
    /// The database's oid.
    pub database: u32,
    pub relid: u32,
    pub filenode: u32,
    /// Pages up to the last one in use when the training began.
    pub pages: u32,
}

impl TableMark {
    /// Whether both name one table (of one database of one cluster), whatever its size or file.
    pub fn same_table(&self, other: &TableMark) -> bool {
        (self.system, self.database, self.relid) == (other.system, other.database, other.relid)
    }

    /// Why this mark (from another server) names no table: a zero oid or file.
    pub fn check(&self) -> Result<(), String> {
        if self.database == 0 || self.relid == 0 || self.filenode == 0 {
            return Err("a table mark with a zero oid".into());
        }
        Ok(())
    }
}

/// A list of marks, at most [`MAX_MARKS`], each checked.
pub fn check_marks(marks: &[TableMark]) -> Result<(), String> {
    if marks.len() > MAX_MARKS {
        return Err(format!("{} table marks", marks.len()));
    }
    marks.iter().try_for_each(TableMark::check)
}

/// A JSON list of marks (or null), bounded as it is read.
pub fn mark_list<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<TableMark>>, D::Error> {
    struct Marks(Vec<TableMark>);
    impl<'de> Deserialize<'de> for Marks {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            corgipile_ml::wire::seq_at_most(d, MAX_MARKS).map(Marks)
        }
    }
    Ok(Option::<Marks>::deserialize(d)?.map(|m| m.0))
}
