//! Transaction-level locks on one owner's model name (its trainings, deploys, grants) that no SQL
//! command can take, so no role can hold them to block another's work.
//!
//! The key: an advisory-type LOCKTAG (USER_LOCKMETHOD, released at the end of the transaction
//! or subtransaction that took it, seen by the deadlock detector and `lock_timeout`) with
//! field1 = the database, field2 = the owner's role OID, and field3 plus the low 15 bits of
//! field4 = 47 bits of a hash of (purpose, name). field4's top bit is always set: SQL's
//! pg_advisory_* functions only ever build tags with field4 = 1 (one bigint key) or 2 (two
//! int4 keys), so none of them can reach these locks, whatever keys they are given.
//!
//! Why a hash and not the name: a LOCKTAG holds 112 bits, and names are any text. 47 bits make
//! a false clash of two names of one owner about one chance in 10^14 per pair (a million names
//! of one owner: one in 300 that any two clash at all). Only the owner and roles holding
//! `manage` on a name take its locks (their privileges are checked first), so a clash, however
//! unlikely, can only delay that owner's own work, never let another role block it.

use crate::pg::error::raise;
use corgipile_ml::hash;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

/// What a lock serialises.
#[derive(Clone, Copy)]
pub enum Purpose {
    /// Trainings of a name (their versions are numbered at the end): held from before the
    /// training to its commit; a second training fails fast rather than waiting.
    Training,
    /// corgipile_deploy and corgipile_drop_model of a name: they wait for each other.
    Deploy,
    /// corgipile_grant and corgipile_revoke on a name and its versions' ids: a revoke's
    /// dependent grants are computed with no grant being added meanwhile.
    Grants,
    /// The same on one unnamed model (`name`: its id).
    GrantsOfUnnamed,
}

impl Purpose {
    fn marker(self) -> u8 {
        match self {
            Purpose::Training => 1,
            Purpose::Deploy => 2,
            Purpose::Grants => 3,
            Purpose::GrantsOfUnnamed => 4,
        }
    }
}

/// FNV-1a over (purpose, 0xff, name bytes), then the splitmix64 finalizer so every output bit
/// depends on every input bit. 0xff never occurs in UTF-8, so the purposes are separate key
/// spaces. Written out (not std's Hasher, whose output may change between Rust releases):
/// every backend must compute the same key, whatever build of the library it loaded.
fn name_hash(purpose: Purpose, name: &str) -> u64 {
    let h = hash::fnv1a([purpose.marker(), 0xff].into_iter().chain(name.bytes()));
    hash::splitmix64_mix(h)
}

fn locktag(purpose: Purpose, owner: pg_sys::Oid, name: &str) -> pg_sys::LOCKTAG {
    let h = name_hash(purpose, name);
    pg_sys::LOCKTAG {
        // SAFETY: MyDatabaseId is set once at backend start, before any SQL function runs,
        // and only read here, on the backend thread.
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.into(),
        locktag_field2: owner.into(),
        locktag_field3: h as u32,
        // Top bit set: never the 1 or 2 of pg_advisory_*.
        locktag_field4: 0x8000 | ((h >> 32) as u16 & 0x7fff),
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    }
}

fn owner_oid(owner: &str) -> pg_sys::Oid {
    // A dropped owner's models still have a name; InvalidOid keys them all together.
    crate::catalog::role_oid(owner).unwrap_or(pg_sys::InvalidOid)
}

/// Takes the lock for the rest of the (sub)transaction; with `wait` false, returns false at
/// once when another session holds it. Waiting honours lock_timeout, statement_timeout,
/// cancel and the deadlock detector, as any lock wait.
fn acquire(purpose: Purpose, owner: &str, name: &str, wait: bool) -> bool {
    let tag = locktag(purpose, owner_oid(owner), name);
    // SAFETY: backend thread, inside a transaction; `tag` outlives the call; a transaction
    // lock (sessionLock = false) is released by the lock manager at (sub)transaction end.
    let got = unsafe {
        pg_sys::LockAcquire(&tag, pg_sys::ExclusiveLock as i32, false, !wait)
            != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL
    };
    if got && wait {
        // The statements after a wait must see what the holder committed. Read-only SPI
        // statements reuse the calling statement's snapshot (taken before the wait) until
        // the transaction has an id; with one, each takes a new snapshot (READ COMMITTED).
        // SAFETY: backend thread, inside a transaction; assigns an id or raises.
        unsafe {
            pg_sys::GetCurrentTransactionId();
        }
    }
    got
}

/// Serialises trainings of one name: ERROR 55P03 at once when another session holds it.
pub fn lock_training(owner: &str, name: &str) {
    if !acquire(Purpose::Training, owner, name, false) {
        raise(
            PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE,
            format!("model name \"{name}\" is being trained by another session"),
            Some(
                "Wait until that training's transaction ends, or train under another name.".into(),
            ),
        );
    }
}

/// Waits until no other deploy or drop of this name is in progress (or `Grants`: no other
/// grant or revoke on it), then holds it until the transaction ends.
pub fn wait_for(purpose: Purpose, owner: &str, name: &str) {
    acquire(purpose, owner, name, true);
}
