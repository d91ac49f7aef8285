//! Models shared between roles: corgipile_grant / corgipile_revoke, and how a role names and
//! may act on another role's models.
//!
//! A model belongs to the role that trained it (`trained_by`, its owner), and names are per
//! owner. The owner, or a role holding `manage`, grants `use` or `manage` on a name (every
//! version, present and future) or on one model id, to a role or to PUBLIC
//! (corgipile.model_grants). Row-level security on corgipile.models makes the models a role may
//! use visible to it; `manage` is checked here, as the caller, before anything is written (as
//! the catalog's owner). Another owner's name is written `owner.name`.

use crate::catalog::ModelRef;
use crate::catalog::{
    as_catalog_owner, caller, caller_manages_all, check_writable, role_oid, select_one,
};
use crate::pg::error::{raise, required};
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

/// A model name with its owner.
pub struct ModelName {
    pub owner: String,
    pub name: String,
}

impl ModelName {
    pub fn is_own(&self) -> bool {
        self.owner == caller().1
    }
}

/// Splits `owner.name` (the owner double-quoted, with `""` for a quote, when it contains a
/// dot or a quote); None when `text` has no owner part.
fn split_owner(text: &str) -> Option<(String, &str)> {
    let Some(quoted) = text.strip_prefix('"') else {
        let (owner, name) = text.split_once('.')?;
        return Some((owner.to_owned(), name));
    };
    let mut owner = String::new();
    let mut rest = quoted;
    loop {
        let end = rest.find('"')?;
        owner.push_str(&rest[..end]);
        rest = &rest[end + 1..];
        match rest.strip_prefix('"') {
            Some(after) => {
                owner.push('"');
                rest = after;
            }
            None => return rest.strip_prefix('.').map(|name| (owner, name)),
        }
    }
}

/// How `text` names a model: the caller's own name `text`, unless the caller has no model of
/// that exact name and `text` is `owner.name` for an existing role (the caller's own
/// `me.churn` is its `churn`, as another role would write it).
pub fn model_name(text: &str) -> ModelName {
    let (_, me) = caller();
    let own = ModelName {
        owner: me.clone(),
        name: text.to_owned(),
    };
    let Some((owner, name)) = split_owner(text) else {
        return own;
    };
    if name.is_empty() || role_oid(&owner).is_none() {
        return own;
    }
    let has_own = select_one::<bool>(
        "SELECT true FROM corgipile.models
         WHERE name OPERATOR(pg_catalog.=) $1 AND trained_by OPERATOR(pg_catalog.=) CURRENT_USER LIMIT 1",
        &[text.into()],
    )
    .unwrap_or_else(|e| spi_failed("look up the model name", e))
    .is_some();
    if has_own {
        return own;
    }
    ModelName {
        owner,
        name: name.to_owned(),
    }
}

fn spi_failed(what: &str, e: pgrx::spi::Error) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        format!("could not {what}: {e}"),
        None,
    )
}

/// Whether a grant of `privilege` (or of `manage`, which includes `use`) on the owner's name
/// or on model `id` reaches the caller (directly, through a role it inherits from, or PUBLIC).
/// Read as the caller: row-level security shows it only the grants that reach it.
fn granted(owner: &str, name: Option<&str>, id: Option<i64>, privilege: &str) -> bool {
    select_one::<bool>(
        "SELECT true FROM corgipile.model_grants g
         WHERE g.owner OPERATOR(pg_catalog.=) $1::pg_catalog.name
           AND (g.model_name OPERATOR(pg_catalog.=) $2 OR g.model_id OPERATOR(pg_catalog.=) $3)
           AND (g.privilege OPERATOR(pg_catalog.=) 'manage' OR g.privilege OPERATOR(pg_catalog.=) $4)
           AND (g.grantee::pg_catalog.oid OPERATOR(pg_catalog.=) 0
                OR pg_catalog.pg_has_role(CURRENT_USER, g.grantee::pg_catalog.oid, 'USAGE'))
         LIMIT 1",
        &[owner.into(), name.into(), id.into(), privilege.into()],
    )
    .unwrap_or_else(|e| spi_failed("read the model grants", e))
    .is_some()
}

/// Whether the caller may use every version of the owner's name (and address it by name).
pub fn may_use_name(n: &ModelName) -> bool {
    n.is_own() || caller_manages_all() || granted(&n.owner, Some(&n.name), None, "use")
}

/// Whether the caller may deploy, drop, retrain and grant the owner's name, or model `id`.
pub fn may_manage(owner: &str, name: Option<&str>, id: Option<i64>) -> bool {
    owner == caller().1 || caller_manages_all() || granted(owner, name, id, "manage")
}

fn permission_denied(what: String, owner: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
        format!("permission denied to {what}"),
        Some(format!(
            "It belongs to role {owner}: its owner, or a role holding \"manage\" on it, can run corgipile_grant(model, your_role, 'manage')."
        )),
    )
}

/// The name a training's `name` param makes a new version of; another owner's name needs
/// `manage` on it. Checked before the training starts.
pub fn training_name(text: &str) -> ModelName {
    let n = model_name(text);
    if !n.is_own() && !may_manage(&n.owner, Some(&n.name), None) {
        permission_denied(format!("train a new version of model \"{text}\""), &n.owner);
    }
    n
}

/// Raises unless the caller may manage `n` (which it can see).
pub fn check_manage_name(n: &ModelName, text: &str, what: &str) {
    if !may_manage(&n.owner, Some(&n.name), None) {
        permission_denied(format!("{what} model \"{text}\""), &n.owner);
    }
}

/// The owner and name of model `id`, if the caller can see it.
pub fn model_owner(id: i64) -> Option<(String, Option<String>)> {
    Spi::connect(|client| {
        let table = client.select(
            "SELECT trained_by::pg_catalog.text, name FROM corgipile.models WHERE id OPERATOR(pg_catalog.=) $1",
            Some(1),
            &[id.into()],
        )?;
        if table.is_empty() {
            return Ok(None);
        }
        let row = table.first();
        Ok(row.get::<String>(1)?.map(|owner| (owner, row.get::<String>(2).ok().flatten())))
    })
    .unwrap_or_else(|e: pgrx::spi::Error| spi_failed("read the model", e))
}

/// Raises unless the caller may manage model `id` (ownership, `manage` on the id or its name).
pub fn check_manage_id(id: i64, what: &str) {
    let Some((owner, name)) = model_owner(id) else {
        crate::catalog::no_such_model(id)
    };
    if !may_manage(&owner, name.as_deref(), Some(id)) {
        permission_denied(format!("{what} model {id}"), &owner);
    }
}

/// What a grant covers: the owner's name, or one model id.
struct Target {
    owner: String,
    name: Option<String>,
    id: Option<i64>,
    /// The name whose grants (on it, and on its versions' ids) can depend on this target's:
    /// `manage` on a name covers its versions. None for an unnamed model (its id stands alone).
    scope: Option<String>,
}

/// The target of a grant or revoke; the caller must own it or hold `manage` on it.
fn grant_target(model: ModelRef, what: &str) -> Target {
    match model {
        ModelRef::Id(id) => {
            check_manage_id(id, what);
            let (owner, scope) =
                model_owner(id).unwrap_or_else(|| crate::catalog::no_such_model(id));
            Target {
                owner,
                name: None,
                id: Some(id),
                scope,
            }
        }
        ModelRef::Name(text) => {
            // Raises (as for a name that does not exist) unless the caller may use the name.
            crate::catalog::resolve_name(text);
            let n = model_name(text);
            check_manage_name(&n, text, what);
            Target {
                owner: n.owner,
                scope: Some(n.name.clone()),
                name: Some(n.name),
                id: None,
            }
        }
    }
}

/// The grantee's OID (as an integer: an invalid Oid would become SQL NULL): a role, or PUBLIC
/// (any case) as 0.
fn grantee(role: &str) -> i64 {
    // "public" itself can never be a role name; another spelling is PUBLIC only when no role
    // has exactly that name (a role "Public" gets its own grants, not everybody).
    let role_named = role_oid(role);
    if role_named.is_none() && role.eq_ignore_ascii_case("public") {
        return 0;
    }
    let oid = role_named.unwrap_or_else(|| {
        raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            format!("role \"{role}\" does not exist"),
            Some("Give a role name (as in pg_roles.rolname) or PUBLIC.".into()),
        )
    });
    u32::from(oid) as i64
}

fn privilege(text: &str) -> &'static str {
    match text.to_ascii_lowercase().as_str() {
        "use" => "use",
        "manage" => "manage",
        _ => raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("unknown model privilege \"{text}\""),
            Some("\"use\" (predict, evaluate, coefficients, see it) or \"manage\" (also deploy, drop, retrain, grant).".into()),
        ),
    }
}

/// Deletes the owner's grants to roles that no longer exist (they are dead already:
/// pg_has_role is false for them, row-level security hides them, pg_dump skips them). Rows
/// another transaction holds are skipped, not waited for: no role can block this.
fn purge_dropped_grantees(owner: &str) {
    Spi::run_with_args(
        "DELETE FROM corgipile.model_grants WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY(
             SELECT g.ctid FROM corgipile.model_grants g
             WHERE g.owner OPERATOR(pg_catalog.=) $1::pg_catalog.name
               AND g.grantee::pg_catalog.oid OPERATOR(pg_catalog.<>) 0
               AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r
                               WHERE r.oid OPERATOR(pg_catalog.=) g.grantee::pg_catalog.oid)
             FOR UPDATE SKIP LOCKED))",
        &[owner.into()],
    )
    .unwrap_or_else(|e| spi_failed("delete the grants of dropped roles", e));
}

/// The target of a grant or revoke, with its scope's grants lock held: grants and revokes on
/// one name (and its versions' ids), or on one unnamed model, run one at a time, so a revoke's
/// dependent grants are computed with none being added meanwhile (as PostgreSQL's GRANT and
/// REVOKE on one object wait for each other). The caller's right is checked before the lock
/// (only a role that may grant on the target ever waits for it, or holds it) and again after.
fn locked_grant_target(model: ModelRef, what: &str) -> Target {
    use crate::catalog::locks::{wait_for, Purpose};
    let target = grant_target(model, what);
    match (&target.scope, target.id) {
        (Some(name), _) => wait_for(Purpose::Grants, &target.owner, name),
        (None, Some(id)) => wait_for(Purpose::GrantsOfUnnamed, &target.owner, &id.to_string()),
        (None, None) => {}
    }
    grant_target(model, what)
}

fn grant(model: ModelRef, role: &str, privilege_text: &str) {
    check_writable(c"corgipile_grant()");
    let privilege = privilege(privilege_text);
    let grantee = grantee(role);
    let target = locked_grant_target(model, "grant privileges on");
    let (_, me) = caller();
    as_catalog_owner(|| {
        purge_dropped_grantees(&target.owner);
        Spi::run_with_args(
            "INSERT INTO corgipile.model_grants (owner, model_name, model_id, grantee, privilege, granted_by)
             VALUES ($1::pg_catalog.name, $2, $3, $4::pg_catalog.int8::pg_catalog.oid::pg_catalog.regrole, $5, $6::pg_catalog.name)
             ON CONFLICT ON CONSTRAINT model_grants_key DO NOTHING",
            &[
                target.owner.as_str().into(),
                target.name.into(),
                target.id.into(),
                grantee.into(),
                privilege.into(),
                me.as_str().into(),
            ],
        )
        .unwrap_or_else(|e| spi_failed("store the grant", e));
    });
}

/// The owner's grants that nothing supports: those whose grantor (granted_by) is not a root
/// (the owner, or a role with the privileges of the catalog's owner, superusers included) and
/// holds no `manage` covering the grant's target through a supported grant (a grant on the
/// same name, on the same id, or on the name of the id's model; to PUBLIC or to a role whose
/// privileges the grantor has). Supported grants are the least fixpoint from the roots, so
/// grants that only support each other in a cycle are unsupported too. $1: the owner; only the
/// grants of one scope are read, those a revoke on it can affect and its lock keeps still (a
/// grant is supported only by grants of its own scope): $3, a name (grants on it and on its
/// versions' ids), or when $3 is NULL, the unnamed model $4. Columns: ctid, and a description of the grant for messages.
const UNSUPPORTED_GRANTS: &str = "
    WITH RECURSIVE g AS (
        SELECT g.ctid AS tid, g.model_name, g.model_id, g.grantee::pg_catalog.oid AS grantee,
               g.privilege, g.granted_by, r.oid AS granter,
               COALESCE(g.model_name, m.name) AS covered_name,
               (r.oid IS NOT NULL AND (g.granted_by OPERATOR(pg_catalog.=) g.owner
                    OR pg_catalog.pg_has_role(r.oid, (SELECT c.relowner FROM pg_catalog.pg_class c
                         WHERE c.oid OPERATOR(pg_catalog.=) 'corgipile.models'::pg_catalog.regclass), 'USAGE'))) AS root
        FROM corgipile.model_grants g
        LEFT JOIN pg_catalog.pg_roles r ON r.rolname OPERATOR(pg_catalog.=) g.granted_by
        LEFT JOIN corgipile.models m ON m.id OPERATOR(pg_catalog.=) g.model_id
        WHERE g.owner OPERATOR(pg_catalog.=) $1::pg_catalog.name
          AND CASE WHEN $3::pg_catalog.text IS NOT NULL
                   THEN COALESCE(g.model_name, m.name) OPERATOR(pg_catalog.=) $3
                   ELSE g.model_id OPERATOR(pg_catalog.=) $4 END
    ), supported AS (
        SELECT g.tid, g.model_name, g.model_id, g.grantee, g.privilege FROM g WHERE g.root
        UNION
        SELECT g.tid, g.model_name, g.model_id, g.grantee, g.privilege
        FROM g JOIN supported s
          ON s.privilege OPERATOR(pg_catalog.=) 'manage'
         AND (s.model_name OPERATOR(pg_catalog.=) g.covered_name OR s.model_id OPERATOR(pg_catalog.=) g.model_id)
         AND (s.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid
              OR pg_catalog.pg_has_role(g.granter, s.grantee, 'USAGE'))
        WHERE g.granter IS NOT NULL
    )
    SELECT g.tid,
           pg_catalog.format('%s granted %s on %s to %s', g.granted_by, g.privilege,
               COALESCE('model ' OPERATOR(pg_catalog.||) g.model_id::pg_catalog.text,
                        pg_catalog.quote_literal(g.model_name)),
               CASE WHEN g.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN 'PUBLIC'
                    ELSE g.grantee::pg_catalog.regrole::pg_catalog.text END) AS description
    FROM g WHERE NOT EXISTS (SELECT 1 FROM supported s WHERE s.tid OPERATOR(pg_catalog.=) g.tid)";

/// The unsupported grants (UNSUPPORTED_GRANTS) of the target's scope other than `except` (a
/// tid[] literal), as a tid[] literal and their descriptions. Runs as the catalog's owner.
fn unsupported_grants(target: &Target, except: &str) -> (String, Vec<String>) {
    let sql = format!(
        "SELECT COALESCE(pg_catalog.array_agg(u.tid ORDER BY u.tid), '{{}}')::pg_catalog.text,
                COALESCE(pg_catalog.array_agg(u.description ORDER BY u.tid), '{{}}')
         FROM ({UNSUPPORTED_GRANTS}) u
         WHERE u.tid OPERATOR(pg_catalog.<>) ALL ($2::pg_catalog.text::pg_catalog.tid[])"
    );
    let (tids, grants) = Spi::get_two_with_args::<String, Vec<String>>(
        &sql,
        &[
            target.owner.as_str().into(),
            except.into(),
            target.scope.as_deref().into(),
            target.id.into(),
        ],
    )
    .unwrap_or_else(|e| spi_failed("check the grants that depend on it", e));
    (
        tids.unwrap_or_else(|| "{}".into()),
        grants.unwrap_or_default(),
    )
}

/// Revokes a grant; with `cascade`, also the grants that depended on it (made by roles that
/// held `manage` only through it, recursively). Without, such grants are an ERROR (2B000, as
/// PostgreSQL's REVOKE) and nothing changes.
fn revoke(model: ModelRef, role: &str, privilege_text: &str, cascade: bool) {
    check_writable(c"corgipile_revoke()");
    let privilege = privilege(privilege_text);
    let grantee = grantee(role);
    let target = locked_grant_target(model, "revoke privileges on");
    // Who calls (as_catalog_owner switches the current user): the owner and roles that manage
    // every model may see every grant; a manager learns only how many grants depend.
    let own = target.owner == caller().1;
    let sees_all_grants = own || caller_manages_all();
    as_catalog_owner(|| {
        purge_dropped_grantees(&target.owner);
        // Grants unsupported already (a grantor dropped, or out of a role since) are not this
        // revoke's dependents; only `manage` supports other grants.
        let before = if privilege == "manage" {
            unsupported_grants(&target, "{}").0
        } else {
            String::new()
        };
        let revoked = Spi::get_one_with_args::<i64>(
            "WITH d AS (DELETE FROM corgipile.model_grants
                        WHERE owner OPERATOR(pg_catalog.=) $1::pg_catalog.name
                          AND model_name IS NOT DISTINCT FROM $2 AND model_id IS NOT DISTINCT FROM $3
                          AND grantee::pg_catalog.oid OPERATOR(pg_catalog.=) $4::pg_catalog.int8::pg_catalog.oid
                          AND privilege OPERATOR(pg_catalog.=) $5 RETURNING 1)
             SELECT pg_catalog.count(*) FROM d",
            &[
                target.owner.as_str().into(),
                target.name.clone().into(),
                target.id.into(),
                grantee.into(),
                privilege.into(),
            ],
        )
        .unwrap_or_else(|e| spi_failed("revoke the grant", e))
        .unwrap_or(0);
        if revoked == 0 {
            pgrx::notice!(
                "role {role} held no \"{privilege}\" privilege on that model to revoke (grants on a model name and on a model id are separate)"
            );
            return;
        }
        if privilege != "manage" {
            return;
        }
        let (dependents, described) = unsupported_grants(&target, &before);
        if described.is_empty() {
            return;
        }
        if !cascade {
            let detail = if sees_all_grants {
                let shown = described
                    .iter()
                    .take(5)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ");
                let more = match described.len() {
                    n if n > 5 => format!("; and {} more", n - 5),
                    _ => String::new(),
                };
                format!("Granted through the \"manage\" being revoked: {shown}{more}.")
            } else {
                format!(
                    "{} grant{} made through the \"manage\" being revoked.",
                    described.len(),
                    if described.len() == 1 { "" } else { "s" }
                )
            };
            let model_arg = match (&target.name, target.id) {
                (Some(name), _) => pgrx::spi::quote_literal(&if own {
                    name.clone()
                } else {
                    format!("{}.{name}", quote_owner(&target.owner))
                }),
                (None, Some(id)) => id.to_string(),
                (None, None) => String::new(),
            };
            raise_with_detail(
                PgSqlErrorCode::ERRCODE_DEPENDENT_PRIVILEGE_DESCRIPTORS_STILL_EXIST,
                "dependent privileges exist".into(),
                detail,
                format!(
                    "Revoke them too with corgipile_revoke({model_arg}, {}, 'manage', cascade => true).",
                    pgrx::spi::quote_literal(role)
                ),
            );
        }
        let deleted = Spi::get_one_with_args::<i64>(
            "WITH d AS (DELETE FROM corgipile.model_grants
                        WHERE ctid OPERATOR(pg_catalog.=) ANY ($1::pg_catalog.text::pg_catalog.tid[]) RETURNING 1)
             SELECT pg_catalog.count(*) FROM d",
            &[dependents.as_str().into()],
        )
        .unwrap_or_else(|e| spi_failed("revoke the dependent grants", e))
        .unwrap_or(0);
        pgrx::notice!(
            "revoked {deleted} dependent grant{} too",
            if deleted == 1 { "" } else { "s" }
        );
    });
}

/// An owner as the first part of `owner.name`: double-quoted when it has a dot or a quote.
pub(crate) fn quote_owner(owner: &str) -> String {
    if owner.contains('.') || owner.contains('"') {
        format!("\"{}\"", owner.replace('"', "\"\""))
    } else {
        owner.to_owned()
    }
}

fn raise_with_detail(code: PgSqlErrorCode, message: String, detail: String, hint: String) -> ! {
    pgrx::pg_sys::panic::ErrorReport::new(code, message, "corgipile")
        .set_detail(detail)
        .set_hint(hint)
        .report(pgrx::PgLogLevel::ERROR);
    unreachable!("ereport(ERROR) returned")
}

const GRANT_USAGE: &str =
    "corgipile_grant(model_name text | model_id bigint, role text, privilege text)";
const REVOKE_USAGE: &str =
    "corgipile_revoke(model_name text | model_id bigint, role text, privilege text, cascade boolean DEFAULT false)";

/// Grants `privilege` ('use' or 'manage') on a model name (every version, present and future;
/// another owner's as 'owner.name') to `role` (or PUBLIC). A NULL argument is an ERROR (22004).
#[pg_extern(volatile, parallel_unsafe)]
fn corgipile_grant(model_name: Option<&str>, role: Option<&str>, privilege: Option<&str>) {
    let model = required(model_name, "model_name", GRANT_USAGE);
    grant(
        ModelRef::from_text(model),
        required(role, "role", GRANT_USAGE),
        required(privilege, "privilege", GRANT_USAGE),
    )
}

/// Grants `privilege` on one model to `role` (or PUBLIC).
#[pg_extern(volatile, parallel_unsafe, name = "corgipile_grant")]
fn corgipile_grant_id(model_id: Option<i64>, role: Option<&str>, privilege: Option<&str>) {
    grant(
        ModelRef::Id(required(model_id, "model_id", GRANT_USAGE)),
        required(role, "role", GRANT_USAGE),
        required(privilege, "privilege", GRANT_USAGE),
    )
}

/// Revokes a privilege granted with corgipile_grant on the same name or id; `cascade` also
/// revokes the grants that depended on a revoked `manage` (else they are an ERROR, 2B000).
#[pg_extern(volatile, parallel_unsafe)]
fn corgipile_revoke(
    model_name: Option<&str>,
    role: Option<&str>,
    privilege: Option<&str>,
    cascade: default!(Option<bool>, false),
) {
    let model = required(model_name, "model_name", REVOKE_USAGE);
    revoke(
        ModelRef::from_text(model),
        required(role, "role", REVOKE_USAGE),
        required(privilege, "privilege", REVOKE_USAGE),
        required(cascade, "cascade", REVOKE_USAGE),
    )
}

#[pg_extern(volatile, parallel_unsafe, name = "corgipile_revoke")]
fn corgipile_revoke_id(
    model_id: Option<i64>,
    role: Option<&str>,
    privilege: Option<&str>,
    cascade: default!(Option<bool>, false),
) {
    revoke(
        ModelRef::Id(required(model_id, "model_id", REVOKE_USAGE)),
        required(role, "role", REVOKE_USAGE),
        required(privilege, "privilege", REVOKE_USAGE),
        required(cascade, "cascade", REVOKE_USAGE),
    )
}
