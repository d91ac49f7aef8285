//! The coordinator's side of a training or evaluation over a sharded table: connect to every
//! shard server, run a round on every shard, combine what the shards send back (a training's
//! rounds are `training.rs`'s).

use super::leaves::Leaf;
use super::remote::Remote;
use crate::pg::error::raise;
use crate::pg::progress;
use crate::pipeline::protocol::{
    this_version, EvaluateRequest, Phase, RoundReply, RoundRequest, Versions,
};
use crate::pipeline::PipelineConfig;
use corgipile_ml::model::ModelKind;
use corgipile_ml::params::search::SEARCHABLE;
use corgipile_ml::scoring::Evaluation;
use corgipile_ml::wire::{self, WireError};

use pgrx::{check_for_interrupts, pg_sys, PgSqlErrorCode};
use std::ffi::CString;
use std::time::Instant;

/// A shard during the training.
pub(super) struct Shard {
    /// For messages: the foreign server's name, or the local partition's.
    pub(super) name: String,
    place: Place,
    /// Tuples trained in the current epoch (the NOTICE, EXPLAIN ANALYZE).
    pub(super) tuples: u64,
    /// Time from sending a request until its reply, summed over the training.
    pub(super) seconds: f64,
}

/// What EXPLAIN ANALYZE shows of a sharded training.
pub struct ShardSummary {
    pub shards: Vec<ShardLine>,
    pub rounds_per_epoch: u32,
    /// Bytes to and from the shard servers in the last epoch.
    pub bytes_per_epoch: u64,
    /// What the training read of every shard's table, as the model stores it
    /// (`metrics->'read'`, see `since.rs`); None unless every shard marked its table.
    pub read: Option<serde_json::Value>,
}

pub struct ShardLine {
    pub tuples_last_epoch: u64,
    pub seconds: f64,
}

impl ShardLine {
    pub(super) fn of(shard: &Shard) -> ShardLine {
        ShardLine {
            tuples_last_epoch: shard.tuples,
            seconds: shard.seconds,
        }
    }
}

enum Place {
    Local(pg_sys::Oid),
    /// `call`: the round's SQL, the function qualified with the schema corgipile is installed
    /// in on that server.
    Remote {
        conn: Remote,
        table: String,
        call: CString,
    },
}

/// Where a round stands in the training, for corgipile.progress.
pub(super) struct RoundProgress {
    /// "statistics" or "round r/R".
    pub(super) label: String,
    /// Fraction of the epoch done before this round, and tuples trained so far this epoch.
    pub(super) fraction: f64,
    pub(super) tuples: u64,
}

impl RoundProgress {
    /// Shows the round and each shard's state: done (with its tuples or rows) or running since.
    fn report(&self, shards: &[Shard], replies: &[Option<RoundReply>], sent: Instant, force: bool) {
        progress::shard_rounds(
            self.fraction,
            self.tuples,
            || {
                let states: Vec<String> = shards
                    .iter()
                    .zip(replies)
                    .map(|(shard, reply)| match reply {
                        Some(r) => format!("{} done {} rows", shard.name, r.tuples().max(r.rows)),
                        None => format!(
                            "{} running {:.1} s",
                            shard.name,
                            sent.elapsed().as_secs_f64()
                        ),
                    })
                    .collect();
                format!("{}: {}", self.label, states.join(", "))
            },
            force,
        );
    }
}

/// Runs one request on every shard at once (remote ones first, then the local ones here, while
/// the remote ones work) and returns their replies in shard order.
pub(super) fn round(
    shards: &mut [Shard],
    request: &RoundRequest,
    kind: ModelKind,
    params_json: &str,
    run_local: &dyn Fn(pg_sys::Oid, &RoundRequest) -> RoundReply,
    bytes: &mut u64,
    at: &RoundProgress,
) -> Vec<RoundReply> {
    let each = vec![request; shards.len()];
    round_each(shards, &each, kind, params_json, run_local, bytes, at)
}

/// `round` with a request of each shard's (`requests`, in shard order; a request shared by
/// neighbours is serialized once).
pub(super) fn round_each(
    shards: &mut [Shard],
    requests: &[&RoundRequest],
    kind: ModelKind,
    params_json: &str,
    run_local: &dyn Fn(pg_sys::Oid, &RoundRequest) -> RoundReply,
    bytes: &mut u64,
    at: &RoundProgress,
) -> Vec<RoundReply> {
    assert_eq!(requests.len(), shards.len(), "a request for every shard");
    // SAFETY: FFI calls, and reads of what they return, on the backend thread inside the transaction
    // of the SQL call (every caller is a SQL function); no raw pointer comes from the caller.
    unsafe {
        let sent = Instant::now();
        let mut replies: Vec<Option<RoundReply>> = shards.iter().map(|_| None).collect();
        at.report(shards, &replies, sent, true);
        let mut request_json = String::new();
        for (i, shard) in shards.iter_mut().enumerate() {
            if i == 0 || !std::ptr::eq(requests[i], requests[i - 1]) {
                request_json = serde_json::to_string(requests[i]).expect("request serializes");
            }
            if let Place::Remote { conn, table, call } = &mut shard.place {
                *bytes += request_json.len() as u64;
                conn.send(call, &[table, kind.name(), params_json, &request_json]);
            }
        }
        // A reply is parsed within four times corgipile.max_model_memory (it carries at most one model's
        // worth of numbers) and checked against the request before it is used: it may come from
        // code the shard's role wrote.
        let limit = crate::pg::guc::max_wire_bytes();
        for (i, shard) in shards.iter_mut().enumerate() {
            if let Place::Local(oid) = shard.place {
                let started = Instant::now();
                replies[i] = Some(run_local(oid, requests[i]));
                shard.seconds += started.elapsed().as_secs_f64();
            }
        }
        loop {
            let mut waiting = false;
            for (i, shard) in shards.iter_mut().enumerate() {
                if replies[i].is_some() {
                    continue;
                }
                let Place::Remote { conn, .. } = &mut shard.place else {
                    continue;
                };
                if conn.ready() {
                    shard.seconds += sent.elapsed().as_secs_f64();
                    // A reply that does not parse may be another version's: its versions,
                    // if it says them, make the ERROR.
                    let (len, parsed, versions) = conn
                        .result_with(|text| {
                            let parsed = wire::parse_bounded::<RoundReply>(text, limit);
                            let versions = match &parsed {
                                Err(WireError::Invalid(_)) => {
                                    wire::parse_bounded::<Versions>(text, limit).ok()
                                }
                                _ => None,
                            };
                            (text.len(), parsed, versions)
                        })
                        .unwrap_or((0, Err(WireError::Invalid("no answer".into())), None));
                    *bytes += len as u64;
                    let versions = match &parsed {
                        Ok(r) => Some(Versions {
                            version: r.version.clone(),
                            protocol: r.protocol,
                        }),
                        Err(_) => versions,
                    };
                    // Another version's fields may mean something else: refused before any is
                    // used.
                    if let Some(v) = versions.filter(|v| !v.are_ours()) {
                        raise(
                            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                            format!(
                                "shard server \"{}\" runs {}, this server {}",
                                shard.name,
                                v.theirs(),
                                Versions::ours()
                            ),
                            Some("Install the same corgipile version on every server (ALTER EXTENSION corgipile UPDATE after installing the same build).".into()),
                        );
                    }
                    let reply = parsed.unwrap_or_else(|e| bad_reply(&shard.name, e));
                    if let Err(why) = reply.check(requests[i], kind) {
                        bad_reply(&shard.name, WireError::Invalid(why));
                    }
                    replies[i] = Some(reply);
                } else {
                    waiting = true;
                }
            }
            if !waiting {
                break;
            }
            at.report(shards, &replies, sent, false);
            check_for_interrupts!();
            pg_sys::pg_usleep(1000);
        }
        replies
            .into_iter()
            .map(|r| r.expect("every shard answered"))
            .collect()
    }
}

/// Raises for a shard's reply that could not be read or does not answer the request.
pub(super) fn bad_reply(shard: &str, e: WireError) -> ! {
    match e {
        WireError::TooLarge { .. } => raise(
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!("shard server \"{shard}\" sent an answer too large to read: {e} (corgipile.max_model_memory)"),
            Some("A shard's answer carries its learners' models (a search's configurations, folds) or its statistics: raise corgipile.max_model_memory if they are really that large.".into()),
        ),
        WireError::Invalid(why) => raise(
            PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
            format!("shard server \"{shard}\" sent an answer corgipile cannot use: {why}"),
            Some("The shard must run corgipile's own corgipile_shard_round, of this version.".into()),
        ),
    }
}

/// Connects to every remote shard through its foreign server's user mapping and checks that it
/// runs this corgipile version.
pub(super) fn open_shards(leaves: Vec<Leaf>, version: &str) -> Vec<Shard> {
    let mut shards: Vec<Shard> = Vec::new();
    for leaf in leaves {
        let (name, place) = match leaf {
            Leaf::Local(oid) => (
                format!("local partition {}", crate::pg::names::relation_name(oid)),
                Place::Local(oid),
            ),
            Leaf::Remote { server, table, .. } => {
                let mut conn = Remote::connect(server);
                let theirs = conn.query(
                    c"SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'corgipile'",
                    &[],
                );
                match theirs {
                    None => raise(
                        PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
                        format!("corgipile is not installed on shard server \"{}\"", conn.server),
                        Some(format!("Run CREATE EXTENSION corgipile VERSION '{version}' in the shard's database.")),
                    ),
                    Some(v) if v != version => raise(
                        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                        format!("shard server \"{}\" has corgipile {v}, this server {version}", conn.server),
                        Some("Install the same corgipile version on every server (ALTER EXTENSION corgipile UPDATE).".into()),
                    ),
                    Some(_) => {}
                }
                let schema = conn
                    .query(
                        c"SELECT pg_catalog.quote_ident(n.nspname) FROM pg_catalog.pg_extension e
                          JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
                          WHERE e.extname OPERATOR(pg_catalog.=) 'corgipile'",
                        &[],
                    )
                    .unwrap_or_default();
                let call = CString::new(format!(
                    "SELECT {schema}.corgipile_shard_round($1::pg_catalog.regclass, $2::pg_catalog.text, $3::pg_catalog.jsonb, $4::pg_catalog.text)"
                ))
                .expect("a quoted identifier has no NUL");
                (conn.server.clone(), Place::Remote { conn, table, call })
            }
        };
        shards.push(Shard {
            name,
            place,
            tuples: 0,
            seconds: 0.0,
        });
    }
    shards
}

/// The params a shard runs with: the coordinator's, one process, silently, its own table only
/// (a search's learning params as the user gave them).
pub(super) fn shard_params(params: &corgipile_ml::params::TrainParams) -> String {
    let mut shard_params = params.clone();
    shard_params.verbose = false;
    shard_params.workers = 0;
    shard_params.only = true;
    let mut json = shard_params.to_json();
    if let (Some(search), Some(sent)) = (&params.search, json.as_object_mut()) {
        // Every shard resolves a search's configurations as one server does, from the user's
        // own params (`Search::base`): a default that follows a searched value (the learning
        // rate of a searched optimizer) must not arrive as a value given.
        sent.retain(|k, _| !SEARCHABLE.contains(&k.as_str()) || search.base.contains_key(k));
    }
    serde_json::to_string(&json).expect("params serialize")
}

/// Scores a stored model on every shard of a sharded table (`request`: the model) and merges
/// the shards' metrics into `evaluation` (an [`Evaluation::mergeable`]), and a family's
/// per-group metrics into `per_group` (each group's, then the other rows'); returns the rows
/// the shards' readers skipped. `run_local` runs the request on a local partition in this
/// backend.
pub fn evaluate(
    leaves: Vec<Leaf>,
    config: &PipelineConfig,
    model: EvaluateRequest,
    run_local: &dyn Fn(pg_sys::Oid, &RoundRequest) -> RoundReply,
    evaluation: &mut Evaluation,
    per_group: &mut [Evaluation],
) -> u64 {
    let kind = config.model;
    let _progress = progress::start(&config.relation, kind.name(), 1);
    progress::phase("evaluation");
    let version = this_version().to_string();
    let mut shards = open_shards(leaves, &version);
    let request = RoundRequest {
        n_features: model.model.n_features(),
        evaluate: Some(model),
        ..RoundRequest::new(Phase::Evaluate, 0)
    };
    let at = RoundProgress {
        label: "evaluation".into(),
        fraction: 0.0,
        tuples: 0,
    };
    let mut bytes = 0;
    let replies = round(
        &mut shards,
        &request,
        kind,
        &shard_params(&config.params),
        run_local,
        &mut bytes,
        &at,
    );
    let mut rows_skipped = 0u64;
    for (reply, shard) in replies.iter().zip(&shards) {
        let Some(part) = &reply.evaluation else {
            raise(
                PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
                format!("shard server \"{}\" sent no evaluation", shard.name),
                None,
            )
        };
        evaluation.merge(part);
        // Checked against the request: one part per group and the other rows'.
        for (e, part) in per_group
            .iter_mut()
            .zip(reply.group_evaluations.iter().flatten())
        {
            e.merge(part);
        }
        rows_skipped = rows_skipped.saturating_add(reply.rows_skipped);
    }
    progress::finish();
    rows_skipped
}
