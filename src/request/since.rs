//! `"since"`: incremental training on an append-mostly table. Every training of a single heap
//! table records what it read in the model's `metrics->'read'` (the table, its size in pages
//! before the scan began up to its last page in use, its file); a training `since` that model
//! reads only the pages added after them (from the last page it read, whose free space new rows
//! may have filled), plus a `replay` sample of the older blocks, and continues from it.
//!
//! What this means for rows that change: a row inserted into free space of an old page (after
//! a DELETE, an UPDATE, a VACUUM) is not read again unless the replay sample holds its block;
//! an UPDATEd row whose new version lands on a new page is read again; a DELETEd row is no
//! longer read, but the model it continues has learned from it. A table rewritten since (VACUUM
//! FULL, CLUSTER, TRUNCATE, ALTER TABLE that rewrites), or that shrank, has no "added pages":
//! the whole table is read (a NOTICE says so), still starting from the model.

use crate::pg::error::{notice, raise};
use crate::pipeline::mark::TableMark;
use crate::pipeline::ReadFrom;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

/// What a training read of its table.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TableRead {
    pub relid: u32,
    pub pages: u32,
    pub filenode: u32,
}

impl TableRead {
    /// `table`'s identity and size now; None unless it is one heap table (or materialized
    /// view) without inheritance children, whose page numbers say what was added.
    pub fn now(table: pg_sys::Oid) -> Option<TableRead> {
        // SAFETY: FFI calls, and reads of what they return, on the backend thread inside the transaction
        // of the SQL call (every caller is a SQL function); no raw pointer comes from the caller.
        // pages_in_use gets the relation open and locked, as it requires.
        unsafe {
            let kind = pg_sys::get_rel_relkind(table) as u8;
            if kind != pg_sys::RELKIND_RELATION && kind != pg_sys::RELKIND_MATVIEW {
                return None;
            }
            // SAFETY: the training reads the table: it takes this lock anyway.
            let rel = pg_sys::relation_open(table, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
            let read = (!(*(*rel).rd_rel).relhassubclass).then(|| TableRead {
                relid: table.to_u32(),
                pages: pages_in_use(rel),
                filenode: (*(*rel).rd_rel).relfilenode.to_u32(),
            });
            pg_sys::relation_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
            read
        }
    }

    /// This read named for any server: this cluster's system identifier and database.
    pub fn mark(self) -> TableMark {
        TableMark {
            // SAFETY: reads of values set at backend start (the control file's identifier,
            // the database connected to), on the backend thread.
            system: unsafe { pg_sys::GetSystemIdentifier() },
            database: unsafe { pg_sys::MyDatabaseId }.to_u32(),
            relid: self.relid,
            filenode: self.filenode,
            pages: self.pages,
        }
    }

    /// What a mark says was read (of the table it names).
    pub fn of_mark(mark: &TableMark) -> TableRead {
        TableRead {
            relid: mark.relid,
            pages: mark.pages,
            filenode: mark.filenode,
        }
    }

    pub fn to_json(self) -> serde_json::Value {
        serde_json::json!({"relid": self.relid, "pages": self.pages, "filenode": self.filenode})
    }

    /// What model `id` (one the caller may see) recorded, if anything.
    fn of_model(id: i64) -> Option<TableRead> {
        let json = Spi::get_one_with_args::<pgrx::JsonB>(
            "SELECT metrics->'read' FROM corgipile.models WHERE id = $1",
            &[id.into()],
        )
        .ok()
        .flatten()?
        .0;
        let field = |k: &str| json.get(k)?.as_u64().and_then(|v| u32::try_from(v).ok());
        Some(TableRead {
            relid: field("relid")?,
            pages: field("pages")?,
            filenode: field("filenode")?,
        })
    }
}

/// The table's pages up to its last page that has a line pointer in use: the empty pages after
/// it do not count. PostgreSQL 16+ extends a table by up to 64 pages at once for a bulk insert
/// (COPY, CREATE TABLE AS) and leaves the pages it did not fill empty at the end; a VACUUM then
/// enters them in the free space map, and may truncate them (when it skips the table's other
/// pages by the visibility map, it does: seen as a training of 2,728 pages where the
/// table had had 2,752 a moment before). Rows appended later go into those pages first, so a
/// size that counted them made `"since"` take appended rows for old ones. These are exactly
/// the pages a VACUUM may truncate (its `count_nondeletable_pages` reads them alike).
///
/// # Safety
/// `rel` is an open relation, locked at least AccessShareLock; backend thread.
unsafe fn pages_in_use(rel: pg_sys::Relation) -> u32 {
    let mut end = pg_sys::RelationGetNumberOfBlocksInFork(rel, pg_sys::ForkNumber::MAIN_FORKNUM);
    // Another access method's pages are not heap pages (and such a table is refused later).
    if end == 0 || (*(*rel).rd_rel).relam != pg_sys::HEAP_TABLE_AM_OID {
        return end;
    }
    let strategy = pg_sys::GetAccessStrategy(pg_sys::BufferAccessStrategyType::BAS_BULKREAD);
    while end > 0 {
        pgrx::check_for_interrupts!();
        // SAFETY: `end - 1` < the relation's size, and the relation cannot shrink while we
        // hold our lock (truncation needs an AccessExclusiveLock). The page is pinned and
        // share-locked while its header and line pointers are read, and released before the
        // next call that can raise an ERROR.
        let buffer = pg_sys::ReadBufferExtended(
            rel,
            pg_sys::ForkNumber::MAIN_FORKNUM,
            end - 1,
            pg_sys::ReadBufferMode::RBM_NORMAL,
            strategy,
        );
        pg_sys::LockBuffer(buffer, pg_sys::BUFFER_LOCK_SHARE as i32);
        let in_use = page_has_items(pg_sys::BufferGetPage(buffer));
        pg_sys::UnlockReleaseBuffer(buffer);
        if in_use {
            break;
        }
        end -= 1;
    }
    pg_sys::FreeAccessStrategy(strategy);
    end
}

/// Whether a heap page has a line pointer in use (a tuple, a dead or a redirect pointer): not
/// a new (all-zero) page, nor one whose line pointers are all unused.
///
/// # Safety
/// `page` is a pinned, share-locked buffer's page.
unsafe fn page_has_items(page: pg_sys::Page) -> bool {
    let header = page.cast::<pg_sys::PageHeaderData>();
    // A new page: all zeros (PageIsNew).
    if (*header).pd_upper == 0 {
        return false;
    }
    let linp = std::mem::offset_of!(pg_sys::PageHeaderData, pd_linp);
    let lower = ((*header).pd_lower as usize).min(pg_sys::BLCKSZ as usize);
    let n = lower.saturating_sub(linp) / std::mem::size_of::<pg_sys::ItemIdData>();
    // SAFETY: the line pointer array of a valid page: `n` entries below pd_lower, within the
    // page (pd_lower clamped to the block size).
    (0..n).any(|i| (*(*header).pd_linp.as_ptr().add(i)).lp_flags() != pg_sys::LP_UNUSED)
}

/// How a table changed since a training read it (`then`), and so what a training `"since"`
/// reads of it: from [`Change::first_page`] on, plus the replay sample of the older blocks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Change {
    /// Another file (VACUUM FULL, CLUSTER, TRUNCATE, ALTER TABLE that rewrites): read whole.
    Rewritten,
    /// Fewer pages in use than were read: read whole.
    Shrank { now: u32, then: u32 },
    /// No page added: the last page read, and the replay sample.
    NothingAdded { last: u32 },
    /// Pages added after the last one read.
    Added { last: u32 },
}

impl Change {
    /// One server's page rule, which a shard applies to its own table too: what changed
    /// between `then` (what a model read) and `now` (of the same table).
    pub fn between(then: TableRead, now: TableRead) -> Change {
        // From the last page it read: rows appended since may have filled its free space.
        let last = then.pages.saturating_sub(1);
        if then.filenode != now.filenode {
            Change::Rewritten
        } else if now.pages < then.pages {
            Change::Shrank {
                now: now.pages,
                then: then.pages,
            }
        } else if now.pages == then.pages {
            Change::NothingAdded { last }
        } else {
            Change::Added { last }
        }
    }

    /// The first page a training `"since"` reads (the older ones only in the replay sample).
    pub fn first_page(self) -> u32 {
        match self {
            Change::Rewritten | Change::Shrank { .. } => 0,
            Change::NothingAdded { last } | Change::Added { last } => last,
        }
    }

    /// One server's NOTICE of a change that is not plain growth: `what` is the table ("t", or
    /// a shard's table), `since_id` the model.
    pub fn notice(self, what: &str, since_id: i64) {
        match self {
            Change::Rewritten => notice(format!(
                "corgipile: {what} was rewritten since model {since_id} was trained (VACUUM FULL, CLUSTER, TRUNCATE or ALTER TABLE): reading all of it"
            )),
            Change::Shrank { now, then } => notice(format!(
                "corgipile: {what} has {now} pages in use, fewer than the {then} model {since_id} read: reading all of it"
            )),
            Change::NothingAdded { .. } => notice(format!(
                "corgipile: no page was added to {what} since model {since_id} was trained: reading its last page and the replay sample of the older blocks"
            )),
            Change::Added { .. } => {}
        }
    }
}

/// The share of `table` a training since model `since_id` reads.
pub fn read_from(since_id: i64, table: pg_sys::Oid, relname: &str, replay: f64) -> ReadFrom {
    let Some(now) = TableRead::now(table) else {
        raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("\"since\" reads the pages added to one table, and {relname} is partitioned or has inheritance children"),
            Some("Train each partition with its own model, or train without \"since\" (\"warm_start\" continues a model on every row).".into()),
        );
    };
    let then = recorded(since_id);
    if then.relid != now.relid {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("\"since\": model {since_id} was trained on another table than {relname}"),
            Some("An incremental training reads what was added to the table its model read; use \"warm_start\" to continue a model on another table.".into()),
        );
    }
    let change = Change::between(then, now);
    change.notice(relname, since_id);
    ReadFrom {
        pages: change.first_page(),
        replay,
    }
}

/// What model `since_id` recorded of its one table: ERROR 22023 if nothing.
fn recorded(since_id: i64) -> TableRead {
    TableRead::of_model(since_id).unwrap_or_else(|| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("\"since\": model {since_id} does not record the table it read"),
            Some("Models trained by corgipile 0.5.0 or later on one table record it (metrics->'read'); train once without \"since\" first.".into()),
        )
    })
}

/// The model `"since"` names (one the caller may see), by id.
pub fn since_model(key: &corgipile_ml::params::ModelKey) -> i64 {
    crate::catalog::load_model_ref(match key {
        corgipile_ml::params::ModelKey::Id(id) => crate::catalog::ModelRef::Id(*id),
        corgipile_ml::params::ModelKey::Name(name) => crate::catalog::ModelRef::Name(name),
    })
    .id
}

/// With `"since"`: the share of the table `prepared` reads (a training or its EXPLAIN).
pub(crate) fn apply(prepared: &mut super::Prepared) {
    let params = &prepared.config.params;
    let Some(key) = &params.since else {
        return;
    };
    let since_id = since_model(key);
    let replay = params
        .replay
        .unwrap_or(corgipile_ml::params::DEFAULT_REPLAY);
    prepared.config.read_from = Some(read_from(
        since_id,
        prepared.table,
        &prepared.config.relation,
        replay,
    ));
}
