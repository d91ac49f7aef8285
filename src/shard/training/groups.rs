//! Per-group models over a sharded table (`"group_by"`): round 0 brings every shard's groups
//! and their rows (`pipeline::protocol::groups`); the coordinator adds the rows up per key,
//! keeps the groups of at least `min_group_rows` rows and numbers them as one server's
//! statistics pass does, in the order they were met (the shards read one after the other);
//! every training round sends their keys, and each shard numbers its rows' groups by them. A
//! learner per group trains beside the model of every row, as the learners of a search do
//! (`learners.rs`); the family is stored as one server's (`catalog::groups::store_groups`).

use super::learners::ShardLearner;
use crate::decode::groups::{keys_too_large, number_groups, too_many_groups};
use crate::exec::sgd::{check_family_memory, groups_notice, PER_MODEL_BYTES};
use crate::pg::error::{notice, refuse_combination};
use crate::pipeline::protocol::{GroupKey, RoundReply};
use crate::pipeline::{GroupsFound, PipelineConfig, MAX_GROUPS, MAX_KEYS_BYTES, MAX_KEY_BYTES};
use crate::shard::coordinator::{bad_reply, Shard};
use corgipile_ml::capabilities::{used, Use};
use corgipile_ml::limits::model_memory_bytes;
use corgipile_ml::wire::WireError;
use std::collections::HashMap;

/// Refuses, before any work, per-group models a sharded training cannot train as one server
/// does (the capability table says which and why).
pub(in crate::shard) fn check(config: &PipelineConfig) {
    let grouped_network =
        config.params.group_by.is_some() && config.model.family().sized_by_statistics();
    refuse_combination(
        Use::Shards,
        &used(&[(Use::GroupedNetwork, grouped_network)]),
    );
}

/// Round 0's groups: every shard's (each reply checked as it came: keys once, rows it read)
/// added up per key, within one server's bounds (MAX_GROUPS, MAX_KEYS_BYTES: its ERRORs), and
/// numbered as one server numbers them (`min_group_rows`). None without `"group_by"`, where a
/// shard that sends groups sent an answer corgipile cannot use.
pub(in crate::shard) fn merged(
    config: &PipelineConfig,
    replies: &[RoundReply],
    shards: &[Shard],
) -> Option<GroupsFound> {
    if config.params.group_by.is_none() {
        if let Some((_, shard)) = replies
            .iter()
            .zip(shards)
            .find(|(r, _)| !r.groups.is_empty())
        {
            let why = "groups for a training without \"group_by\"";
            bad_reply(&shard.name, WireError::Invalid(why.into()));
        }
        return None;
    }
    let mut index: HashMap<&str, usize> = HashMap::new();
    let mut seen: Vec<(&str, u64)> = Vec::new();
    let mut bytes = 0usize;
    for group in replies.iter().flat_map(|r| &r.groups) {
        let (key, rows) = (group.0 .0.as_str(), group.1);
        if let Some(&i) = index.get(key) {
            seen[i].1 = seen[i].1.saturating_add(rows);
            continue;
        }
        // (Each key was bounded as its reply was read.)
        debug_assert!(key.len() <= MAX_KEY_BYTES);
        bytes += key.len();
        if bytes > MAX_KEYS_BYTES {
            keys_too_large();
        }
        if seen.len() >= MAX_GROUPS {
            too_many_groups();
        }
        index.insert(key, seen.len());
        seen.push((key, rows));
    }
    let min_rows = config.params.min_group_rows.unwrap_or(1);
    Some(number_groups(seen.into_iter(), min_rows).1)
}

/// What a training round sends of `found`: the keys of the groups that have a model, in the
/// order of their numbers.
pub(super) fn keys(found: &GroupsFound) -> Vec<GroupKey> {
    found
        .kept
        .iter()
        .map(|(key, _)| GroupKey(key.clone()))
        .collect()
}

/// Before the learners are made: a verbose training's NOTICE of its groups, and every group's
/// model with the model of every row (each of `n_features` features and `outputs` outputs)
/// within corgipile.max_model_memory: one server's NOTICE and rule.
pub(super) fn announce(config: &PipelineConfig, found: &GroupsFound, shape: (usize, usize)) {
    let min_rows = config.params.min_group_rows.unwrap_or(1);
    if config.params.verbose {
        notice(groups_notice(found, min_rows));
    }
    let each = PER_MODEL_BYTES + model_memory_bytes(shape.0 as u64, shape.1 as u64);
    check_family_memory(found.kept.len() as u64 + 1, each, 0, min_rows);
}

/// Per-group models' learners: after the model of every row (`learners`' one, as one server
/// orders them), one per group of `found`, each starting as it does and training on its
/// group's rows only.
pub(super) fn add_learners(learners: &mut Vec<ShardLearner>, found: &GroupsFound) {
    assert_eq!(
        learners.len(),
        1,
        "per-group models train without search or folds"
    );
    for g in 0..found.kept.len() as u32 {
        let whole = &learners[0];
        let learner = ShardLearner {
            n_weights: whole.n_weights,
            index: whole.index,
            configuration: whole.configuration.clone(),
            fold: None,
            group: Some(g),
            holdout: None,
            params: whole.params.clone(),
            rounds: whole.rounds.clone(),
            going: true,
            set_aside: None,
            controls: None,
        };
        learners.push(learner);
    }
}
