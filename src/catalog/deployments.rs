//! corgipile.deployments: which version of a name is deployed, and the history of every decision
//! that chose it. A name means its pinned version, else its newest (`find_name`); what changes
//! that is a decision, and each is one row, written in the transaction that makes it (as the
//! catalog's owner: PUBLIC only reads), so the row exists exactly when the decision does:
//!
//! - `manual`, `latest`, `best`, `previous`: corgipile_deploy pinned a version, unpinned, pinned
//!   the best validation score, rolled back (a row even when the deployed version stays);
//! - `train`: a training stored a version that became the deployed one (the newest, nothing
//!   pinned; a training under a pinned name changes nothing and writes nothing);
//! - `gated`: a training with `"deploy": "if_better"` — its verdict, both scores, whether the
//!   new version was deployed or the old one kept (src/sql/gate.rs);
//! - `drop`: corgipile_drop_model dropped the deployed version (the name means another, or none).
//!
//! `'previous'` walks the history back, one decision a call: it undoes the latest decision not
//! yet undone (see [`previous`]). Rows are never updated; dropping a name keeps its history.

use super::grants::ModelName;
use super::{as_catalog_owner, caller, select_one};
use crate::pg::error::raise;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

fn spi_failed(what: &str, e: pgrx::spi::Error) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        format!("could not {what}: {e}"),
        None,
    )
}

/// What made a decision (corgipile.deployments.how).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    Train,
    Gated,
    Manual,
    Latest,
    Best,
    Previous,
    Drop,
}

impl How {
    pub fn name(self) -> &'static str {
        match self {
            How::Train => "train",
            How::Gated => "gated",
            How::Manual => "manual",
            How::Latest => "latest",
            How::Best => "best",
            How::Previous => "previous",
            How::Drop => "drop",
        }
    }
}

/// The version a name means now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deployed {
    pub id: i64,
    pub version: i32,
    pub pinned: bool,
}

/// The version the name `n` means now (its pinned version, else its newest), whoever may see
/// it: read as the catalog's owner (the caller may manage the name, checked before).
pub fn deployed(n: &ModelName) -> Option<Deployed> {
    as_catalog_owner(|| {
        // Two index lookups, as `find_name` (ordering every version by "pinned" would read all
        // of a family's versions).
        Spi::connect(|client| {
            let table = client.select(
                "SELECT id, version, pinned FROM (
                    (SELECT id, version, pinned, 0 AS o FROM corgipile.models
                     WHERE name OPERATOR(pg_catalog.=) $1 AND trained_by OPERATOR(pg_catalog.=) $2::pg_catalog.name
                       AND pinned)
                    UNION ALL
                    (SELECT id, version, pinned, 1 AS o FROM corgipile.models
                     WHERE name OPERATOR(pg_catalog.=) $1 AND trained_by OPERATOR(pg_catalog.=) $2::pg_catalog.name
                     ORDER BY version DESC LIMIT 1)) d
                 ORDER BY o LIMIT 1",
                Some(1),
                &[n.name.as_str().into(), n.owner.as_str().into()],
            )?;
            if table.is_empty() {
                return Ok(None);
            }
            let row = table.first();
            Ok::<_, pgrx::spi::Error>(Some(Deployed {
                id: row.get::<i64>(1)?.unwrap_or_default(),
                version: row.get::<i32>(2)?.unwrap_or_default(),
                pinned: row.get::<bool>(3)?.unwrap_or_default(),
            }))
        })
        .unwrap_or_else(|e| spi_failed("read the deployed version", e))
    })
}

/// The version of model `id` of the name `n`, if it is one (and still exists).
pub fn version_of(n: &ModelName, id: i64) -> Option<i32> {
    as_catalog_owner(|| {
        select_one::<i32>(
            "SELECT version FROM corgipile.models
             WHERE id OPERATOR(pg_catalog.=) $1 AND name OPERATOR(pg_catalog.=) $2
               AND trained_by OPERATOR(pg_catalog.=) $3::pg_catalog.name",
            &[id.into(), n.name.as_str().into(), n.owner.as_str().into()],
        )
        .unwrap_or_else(|e| spi_failed("read the version", e))
    })
}

/// The validation score stored with model `id` (accuracy for classifiers, R² for regression),
/// as corgipile_deploy(name, 'best') ranks versions by, with the metric's name.
pub fn stored_score(id: i64) -> Option<(&'static str, f64)> {
    let (accuracy, r2) = as_catalog_owner(|| {
        Spi::connect(|client| {
            let table = client.select(
                "SELECT (metrics OPERATOR(pg_catalog.#>>) '{validation,accuracy}')::pg_catalog.float8,
                        (metrics OPERATOR(pg_catalog.#>>) '{validation,r2}')::pg_catalog.float8
                 FROM corgipile.models WHERE id OPERATOR(pg_catalog.=) $1",
                Some(1),
                &[id.into()],
            )?;
            if table.is_empty() {
                return Ok((None, None));
            }
            let row = table.first();
            Ok::<_, pgrx::spi::Error>((row.get::<f64>(1)?, row.get::<f64>(2)?))
        })
        .unwrap_or_else(|e| spi_failed("read the validation score", e))
    });
    accuracy.map(|a| ("accuracy", a)).or(r2.map(|r| ("r2", r)))
}

/// Pins `model_id` as the deployed version of the name `n` (the caller may manage it and holds
/// its deploy lock), or with None unpins.
pub fn pin(n: &ModelName, model_id: Option<i64>) {
    as_catalog_owner(|| {
        // Unpin first, then pin: one UPDATE doing both could trip the one-pinned-per-name index.
        Spi::run_with_args(
            "UPDATE corgipile.models SET pinned = false
             WHERE pinned AND name OPERATOR(pg_catalog.=) $1 AND trained_by OPERATOR(pg_catalog.=) $2::pg_catalog.name",
            &[n.name.as_str().into(), n.owner.as_str().into()],
        )
        .unwrap_or_else(|e| spi_failed("unpin the deployed version", e));
        if let Some(id) = model_id {
            Spi::run_with_args(
                "UPDATE corgipile.models SET pinned = true
                 WHERE id OPERATOR(pg_catalog.=) $1 AND trained_by OPERATOR(pg_catalog.=) $2::pg_catalog.name",
                &[id.into(), n.owner.as_str().into()],
            )
            .unwrap_or_else(|e| spi_failed("pin the version", e));
        }
    });
    // The name stands for another version: plans that resolved it are planned again.
    crate::catalog::plans::models_changed();
}

/// A gate's scores (or the stored validation scores 'best' ranked by).
#[derive(Clone, Copy, Debug, Default)]
pub struct Scores {
    /// "accuracy" or "r2".
    pub metric: Option<&'static str>,
    /// The candidate's (the new or chosen version's) and the version deployed before.
    pub new: Option<f64>,
    pub old: Option<f64>,
    pub margin: Option<f64>,
    /// The held-out rows both were scored on.
    pub rows: Option<i64>,
}

/// One decision, as its row says it.
pub struct Decision<'a> {
    pub name: &'a ModelName,
    pub how: How,
    /// The version deployed before and after (None: none).
    pub from: Option<i64>,
    pub to: Option<i64>,
    /// A gated training's new version (deployed or not).
    pub candidate: Option<i64>,
    pub scores: Scores,
    pub reason: String,
}

/// Whether this database has the history (a database of an older version of the extension
/// has it after ALTER EXTENSION corgipile UPDATE; until then decisions are not recorded).
fn has_history() -> bool {
    select_one::<bool>(
        "SELECT pg_catalog.to_regclass('corgipile.deployments') IS NOT NULL",
        &[],
    )
    .ok()
    .flatten()
    .unwrap_or(false)
}

/// Writes the decision's row, in the caller's transaction (an ERROR later rolls it back with
/// the decision itself). `deployed_by` is the calling role.
pub fn record(d: &Decision) {
    if !has_history() {
        return;
    }
    let by = caller().1;
    as_catalog_owner(|| {
        Spi::run_with_args(
            "INSERT INTO corgipile.deployments
                (owner, name, from_model, to_model, candidate, how, metric, new_score, old_score,
                 margin, held_out_rows, reason, deployed_by)
             VALUES ($1::pg_catalog.name, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13::pg_catalog.name)",
            &[
                d.name.owner.as_str().into(),
                d.name.name.as_str().into(),
                d.from.into(),
                d.to.into(),
                d.candidate.into(),
                d.how.name().into(),
                d.scores.metric.into(),
                d.scores.new.into(),
                d.scores.old.into(),
                d.scores.margin.into(),
                d.scores.rows.into(),
                d.reason.as_str().into(),
                by.as_str().into(),
            ],
        )
        .unwrap_or_else(|e| spi_failed("record the deployment", e))
    });
}

/// The version deployed before `current` came in, per the history: the history's changes
/// (rows whose `to_model` differs from their `from_model`) are a stack of decisions, each
/// rollback (`previous`) taking the latest one not yet undone off it; the one on top now
/// replaced `from_model` by `current`. So repeated rollbacks undo one decision each, further and
/// further back. None: the history does not say (nothing on the stack, or what is on top did
/// not deploy `current`); Some(None): `current` was the first version deployed.
pub fn previous(n: &ModelName, current: i64) -> Option<Option<i64>> {
    if !has_history() {
        return None;
    }
    let changes: Vec<(String, Option<i64>, Option<i64>)> = as_catalog_owner(|| {
        Spi::connect(|client| {
            let table = client.select(
                "SELECT how, from_model, to_model FROM corgipile.deployments
                 WHERE owner OPERATOR(pg_catalog.=) $1::pg_catalog.name AND name OPERATOR(pg_catalog.=) $2
                   AND from_model IS DISTINCT FROM to_model
                 ORDER BY id",
                None,
                &[n.owner.as_str().into(), n.name.as_str().into()],
            )?;
            table
                .map(|row| {
                    Ok((
                        row.get::<String>(1)?.unwrap_or_default(),
                        row.get::<i64>(2)?,
                        row.get::<i64>(3)?,
                    ))
                })
                .collect::<Result<Vec<_>, pgrx::spi::Error>>()
        })
        .unwrap_or_else(|e| spi_failed("read the deployment history", e))
    });
    let mut stack: Vec<(Option<i64>, Option<i64>)> = Vec::new();
    for (how, from, to) in changes {
        if how == How::Previous.name() {
            stack.pop();
        } else {
            stack.push((from, to));
        }
    }
    let (from, to) = stack.pop()?;
    (to == Some(current)).then_some(from)
}

/// A version as the reasons name it: "version 3 (model 17)".
pub fn describe(d: Option<Deployed>) -> String {
    match d {
        Some(d) => format!("version {} (model {})", d.version, d.id),
        None => "no version".into(),
    }
}
