//! Per-group models on a sharded table (shard protocol 7): the statistics round's reply carries
//! the shard's groups (each key once, with its rows, in the order the shard met them); a
//! training round carries the groups the coordinator numbered (their keys, in the order of
//! their numbers), each learner the group whose rows alone it trains on (None: every row), and
//! each learner's reply names its group again. Keys and lists are bounded as one server bounds
//! its statistics pass's (`MAX_GROUPS`, `MAX_KEY_BYTES`, `MAX_KEYS_BYTES`), as they are read.

use super::{LearnerReply, LearnerRound, Phase, RoundReply, RoundRequest};
use crate::pipeline::{MAX_GROUPS, MAX_KEYS_BYTES, MAX_KEY_BYTES};
use serde::de::{Error, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use std::collections::HashSet;
use std::fmt;

/// A group's key (as `decode::groups` prints the group columns), at most MAX_KEY_BYTES long:
/// a longer one is refused as it is read, before it is copied.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct GroupKey(pub String);

impl<'de> Deserialize<'de> for GroupKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<GroupKey, D::Error> {
        struct Bounded;
        impl Visitor<'_> for Bounded {
            type Value = GroupKey;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a group key of at most {MAX_KEY_BYTES} bytes")
            }
            fn visit_str<E: Error>(self, v: &str) -> Result<GroupKey, E> {
                if v.len() > MAX_KEY_BYTES {
                    return Err(E::custom(format!("a group key of {} bytes", v.len())));
                }
                Ok(GroupKey(v.to_owned()))
            }
        }
        d.deserialize_str(Bounded)
    }
}

/// A shard's group and the rows its statistics round counted in it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GroupRows(pub GroupKey, pub u64);

pub(super) fn group_rows<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<GroupRows>, D::Error> {
    corgipile_ml::wire::seq_at_most(d, MAX_GROUPS)
}

pub(super) fn group_keys<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<GroupKey>, D::Error> {
    corgipile_ml::wire::seq_at_most(d, MAX_GROUPS)
}

/// Why `keys` are not one list of groups: a key twice, more bytes than one server keeps.
fn check_keys<'a>(keys: impl Iterator<Item = &'a GroupKey>) -> Result<(), String> {
    let mut seen = HashSet::new();
    let mut bytes = 0usize;
    for key in keys {
        bytes = bytes.saturating_add(key.0.len());
        if bytes > MAX_KEYS_BYTES {
            return Err(format!(
                "group keys of more than {} MB",
                MAX_KEYS_BYTES >> 20
            ));
        }
        if !seen.insert(key.0.as_str()) {
            return Err("a group listed twice".into());
        }
    }
    Ok(())
}

/// Why the groups of `request` are not what a coordinator sends: groups in a round that trains
/// nothing, a key twice, a learner of a group the round does not number.
pub fn check_request(request: &RoundRequest) -> Result<(), String> {
    if request.phase != Phase::Train && !request.groups.is_empty() {
        return Err("groups in a round that trains nothing".into());
    }
    check_keys(request.groups.iter())?;
    let numbered = request.groups.len();
    if request
        .learners
        .iter()
        .any(|l| l.group.is_some_and(|g| g as usize >= numbered))
    {
        return Err("a learner of a group the round does not number".into());
    }
    Ok(())
}

/// Why a shard's groups (`reply.groups`) do not answer `request`: groups outside a statistics
/// round, a group of no rows, groups of more rows than the shard read, a key twice, more
/// bytes of keys than one server keeps.
pub fn check_reply(reply: &RoundReply, request: &RoundRequest) -> Result<(), String> {
    if reply.groups.is_empty() {
        return Ok(());
    }
    if request.phase != Phase::Statistics {
        return Err("groups where no statistics were asked for".into());
    }
    let mut rows = 0u64;
    for GroupRows(_, n) in &reply.groups {
        rows = match rows.checked_add(*n) {
            Some(r) if *n > 0 && r <= reply.rows => r,
            _ => return Err("groups of no rows, or of more rows than the shard read".into()),
        };
    }
    check_keys(reply.groups.iter().map(|g| &g.0))
}

/// Why a learner's answer is not of the group it was sent for.
pub fn check_learner(reply: &LearnerReply, sent: &LearnerRound) -> Result<(), String> {
    if reply.group != sent.group {
        return Err("a learner's answer for another group than it was sent for".into());
    }
    Ok(())
}
