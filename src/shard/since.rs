//! `"since"` over a sharded table. Every sharded training's statistics round brings back each
//! shard table's mark (`pipeline::mark`: its server's system identifier and database, the
//! table's oid, file and pages in use, taken before the scan); the model stores them in
//! `metrics->'read'` (`{"relid": the sharded table, "leaves": [mark with its "leaf", ...]}`).
//! A training `"since"` that model sends every mark it recorded with each round; each shard
//! picks its own by (system, database, table) and reads what one server's rule says
//! (`request::since::Change`): the pages from its last page read on, plus the `replay` sample
//! of its older blocks; a table no mark names (dropped and created again, or a partition added
//! since) is read whole. The coordinator says one server's NOTICEs for each shard, from the
//! mark it recorded and the one the shard sends back.

use super::coordinator::{bad_reply, Shard};
use crate::pg::error::raise;
use crate::pipeline::mark::TableMark;
use crate::pipeline::protocol::RoundRequest;
use crate::pipeline::{PipelineConfig, ReadFrom};
use crate::request::since::{since_model, Change, TableRead};
use corgipile_ml::wire::WireError;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

/// The model a training `"since"` continues, and the marks it recorded of its shards' tables.
pub struct SinceMarks {
    pub model: i64,
    pub marks: Vec<TableMark>,
}

impl SinceMarks {
    /// What EXPLAIN says a training `"since"` reads (`replay`: the params').
    pub fn describe(&self, replay: Option<f64>) -> String {
        format!(
            "model {}: on each shard, the pages added since its table's mark ({} marks) and {} of its older blocks per epoch",
            self.model,
            self.marks.len(),
            replay.unwrap_or(corgipile_ml::params::DEFAULT_REPLAY)
        )
    }
}

/// The marks model `"since"` recorded of the sharded table `relid` (`relation` for messages);
/// None without `"since"`. ERROR 22023 if it was trained on another table or recorded none.
pub fn load(config: &PipelineConfig, relid: pg_sys::Oid) -> Option<SinceMarks> {
    let key = config.params.since.as_ref()?;
    let model = since_model(key);
    let relation = &config.relation;
    let read = Spi::get_one_with_args::<pgrx::JsonB>(
        "SELECT metrics->'read' FROM corgipile.models WHERE id = $1",
        &[model.into()],
    )
    .ok()
    .flatten()
    .map(|j| j.0)
    .unwrap_or_default();
    let trained_on = read.get("relid").and_then(|v| v.as_u64());
    if trained_on.is_some_and(|r| r != u64::from(relid.to_u32())) {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("\"since\": model {model} was trained on another table than {relation}"),
            Some("An incremental training reads what was added to the table its model read; use \"warm_start\" to continue a model on another table.".into()),
        );
    }
    let marks: Option<Vec<TableMark>> = read
        .get("leaves")
        .and_then(|l| serde_json::from_value(l.clone()).ok());
    let Some(marks) = marks.filter(|_| trained_on.is_some()) else {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("\"since\": model {model} does not record the tables of {relation}'s shards"),
            Some("Models trained by corgipile 0.5.0 or later on a sharded table whose shards are tables record them (metrics->'read'); train once without \"since\" first.".into()),
        );
    };
    Some(SinceMarks { model, marks })
}

/// After the statistics round of a training over the shards `leaves` (this server's oid of
/// each, and how EXPLAIN names it): each shard's mark (`marks`, by shard), checked; with
/// `since`, one server's NOTICEs for each shard. Returns what the model stores in
/// `metrics->'read'` (None unless every shard sent a mark).
pub(super) fn after_statistics(
    since: Option<&SinceMarks>,
    parent: pg_sys::Oid,
    leaves: &[(pg_sys::Oid, String)],
    shards: &[Shard],
    marks: &[Option<TableMark>],
) -> Option<serde_json::Value> {
    if let Some(since) = since {
        for ((mark, shard), (_, what)) in marks.iter().zip(shards).zip(leaves) {
            // A shard of a "since" training that cannot mark its table refuses the round.
            let Some(now) = mark else {
                bad_reply(
                    &shard.name,
                    WireError::Invalid("no table mark in a \"since\" training".into()),
                )
            };
            match since.marks.iter().find(|m| m.same_table(now)) {
                Some(then) => Change::between(TableRead::of_mark(then), TableRead::of_mark(now))
                    .notice(what, since.model),
                None => crate::pg::error::notice(format!(
                    "corgipile: model {} read no table of {what} as it is now (a partition added since, or a table dropped and created again): reading all of it",
                    since.model
                )),
            }
        }
    }
    let entries = marks
        .iter()
        .zip(leaves)
        .map(|(mark, (leaf, _))| {
            let mut entry = serde_json::to_value(mark.as_ref()?).expect("a mark serializes");
            entry["leaf"] = leaf.to_u32().into();
            Some(entry)
        })
        .collect::<Option<Vec<_>>>()?;
    Some(serde_json::json!({"relid": parent.to_u32(), "leaves": entries}))
}

/// On a shard (or for a local partition, in the coordinator's backend), in a statistics or
/// training round: the mark of `table`, taken before the round reads it; with a `"since"`
/// training's marks, the share of it the round reads (`config.read_from`, by one server's
/// rule from the mark of this table, or all of it when no mark names it).
pub(super) fn mark_here(
    table: pg_sys::Oid,
    request: &RoundRequest,
    config: &mut PipelineConfig,
) -> Option<TableMark> {
    let now = TableRead::now(table);
    if let Some(marks) = &request.marks {
        let Some(now) = now else {
            raise(
                PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                format!("\"since\" reads the pages added to each shard's table, and {} has inheritance children on this shard", config.relation),
                Some("Make each shard's table a table without children, or train without \"since\" (\"warm_start\" continues a model on every row).".into()),
            );
        };
        let here = now.mark();
        let pages = marks
            .iter()
            .find(|m| m.same_table(&here))
            .map_or(0, |then| {
                Change::between(TableRead::of_mark(then), now).first_page()
            });
        config.read_from = Some(ReadFrom {
            pages,
            replay: config
                .params
                .replay
                .unwrap_or(corgipile_ml::params::DEFAULT_REPLAY),
        });
    }
    now.map(TableRead::mark)
}
