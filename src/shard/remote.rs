//! Connections to shard servers through libpq (as postgres_fdw and dblink make them): the
//! foreign server's and the user mapping's options, the same password rule for non-superusers,
//! queries sent asynchronously so that the backend keeps answering cancel while shards work, and
//! a guard that cancels the remote query and closes the connection on every exit path.

use crate::pg::error::raise;
use pgrx::{check_for_interrupts, pg_sys, PgSqlErrorCode};
use std::ffi::{c_char, c_int, c_void, CStr, CString};

#[allow(non_camel_case_types)]
type PGconn = c_void;
#[allow(non_camel_case_types)]
type PGresult = c_void;
#[allow(non_camel_case_types)]
type PGcancel = c_void;

const CONNECTION_OK: c_int = 0;
const CONNECTION_BAD: c_int = 1;
const PGRES_POLLING_FAILED: c_int = 0;
const PGRES_POLLING_READING: c_int = 1;
const PGRES_POLLING_WRITING: c_int = 2;
const PGRES_POLLING_OK: c_int = 3;
const PGRES_COMMAND_OK: c_int = 1;
const PGRES_TUPLES_OK: c_int = 2;
const PG_DIAG_SQLSTATE: c_int = b'C' as c_int;
const PG_DIAG_MESSAGE_PRIMARY: c_int = b'M' as c_int;
const PG_DIAG_MESSAGE_HINT: c_int = b'H' as c_int;

#[link(name = "pq")]
extern "C" {
    fn PQconnectStartParams(
        keywords: *const *const c_char,
        values: *const *const c_char,
        expand_dbname: c_int,
    ) -> *mut PGconn;
    fn PQconnectPoll(conn: *mut PGconn) -> c_int;
    fn PQsocket(conn: *const PGconn) -> c_int;
    fn PQstatus(conn: *const PGconn) -> c_int;
    fn PQerrorMessage(conn: *const PGconn) -> *const c_char;
    fn PQfinish(conn: *mut PGconn);
    fn PQconnectionUsedPassword(conn: *const PGconn) -> c_int;
    fn PQsendQueryParams(
        conn: *mut PGconn,
        command: *const c_char,
        n_params: c_int,
        param_types: *const pg_sys::Oid,
        param_values: *const *const c_char,
        param_lengths: *const c_int,
        param_formats: *const c_int,
        result_format: c_int,
    ) -> c_int;
    fn PQconsumeInput(conn: *mut PGconn) -> c_int;
    fn PQisBusy(conn: *mut PGconn) -> c_int;
    fn PQgetResult(conn: *mut PGconn) -> *mut PGresult;
    fn PQresultStatus(res: *const PGresult) -> c_int;
    fn PQresultErrorField(res: *const PGresult, fieldcode: c_int) -> *const c_char;
    fn PQntuples(res: *const PGresult) -> c_int;
    fn PQgetisnull(res: *const PGresult, row: c_int, col: c_int) -> c_int;
    fn PQgetvalue(res: *const PGresult, row: c_int, col: c_int) -> *const c_char;
    fn PQgetlength(res: *const PGresult, row: c_int, col: c_int) -> c_int;
    fn PQclear(res: *mut PGresult);
    fn PQgetCancel(conn: *mut PGconn) -> *mut PGcancel;
    fn PQcancel(cancel: *mut PGcancel, errbuf: *mut c_char, errbufsize: c_int) -> c_int;
    fn PQfreeCancel(cancel: *mut PGcancel);
}

/// postgres_fdw options that are not libpq connection options.
const FDW_ONLY_OPTIONS: &[&str] = &[
    "use_remote_estimate",
    "fdw_startup_cost",
    "fdw_tuple_cost",
    "extensions",
    "updatable",
    "truncatable",
    "fetch_size",
    "batch_size",
    "async_capable",
    "parallel_commit",
    "parallel_abort",
    "keep_connections",
    "analyze_sampling",
    "password_required",
    "use_scram_passthrough",
    "schema_name",
    "table_name",
];

/// A connection to one shard server; dropping it cancels a query in progress and closes it.
pub struct Remote {
    conn: *mut PGconn,
    pub server: String,
    busy: bool,
}

/// Most bytes of a remote server's message (or short value) corgipile copies: a hostile
/// server can send anything.
const MAX_REMOTE_TEXT: usize = 8192;

/// A C string from libpq or a catalog, for messages: at most MAX_REMOTE_TEXT bytes of it.
unsafe fn c_text(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        let bytes = CStr::from_ptr(p).to_bytes();
        short_text(bytes)
    }
}

/// `bytes` as text, cut to MAX_REMOTE_TEXT bytes (with "…"), trailing blanks removed.
fn short_text(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(MAX_REMOTE_TEXT)];
    let mut text = String::from_utf8_lossy(cut).trim_end().to_string();
    if cut.len() < bytes.len() {
        text.push('…');
    }
    text
}

/// The DefElems of an options list (a foreign server's or a user mapping's).
///
/// # Safety
/// `list` is NULL or a valid List of DefElem pointers that outlives the iterator.
unsafe fn def_elems(list: *mut pg_sys::List) -> impl Iterator<Item = *mut pg_sys::DefElem> {
    let n = if list.is_null() { 0 } else { (*list).length };
    // SAFETY: i < length; the elements of an options list are DefElem pointers.
    (0..n).map(move |i| unsafe {
        (*(*list).elements.add(i as usize))
            .ptr_value
            .cast::<pg_sys::DefElem>()
    })
}

/// `(name, value)` pairs of a DefElem list of string options, values exactly as given (a
/// password of blanks stays blanks: libpq sends it).
unsafe fn options(list: *mut pg_sys::List) -> Vec<(String, String)> {
    def_elems(list)
        .map(|def| {
            let name = c_text((*def).defname);
            let value = CStr::from_ptr(pg_sys::defGetString(def))
                .to_string_lossy()
                .into_owned();
            (name, value)
        })
        .collect()
}

/// postgres_fdw's `password_required` of a user mapping (only a superuser can set it false).
unsafe fn password_required(list: *mut pg_sys::List) -> bool {
    for def in def_elems(list) {
        if CStr::from_ptr((*def).defname).to_bytes() == b"password_required" {
            // SAFETY: defGetBoolean raises a proper ERROR for a value that is not a boolean.
            return pg_sys::defGetBoolean(def);
        }
    }
    true
}

/// What libpq would read, for a connection without a password of its own, from the server's
/// environment rather than from the user mapping.
const ENVIRONMENT_SECRETS: &[&str] = &["PGPASSWORD", "PGPASSFILE", "PGSERVICE", "PGSERVICEFILE"];

/// A path that names no file, given to libpq as `passfile` on a non-superuser's connection so
/// that it never reads the server OS user's ~/.pgpass.
const NO_PASSFILE: &str = "/nonexistent/corgipile/no-passfile";

fn refuse_credentials(name: &str, message: String, hint: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_S_R_E_PROHIBITED_SQL_STATEMENT_ATTEMPTED,
        format!("{message} (shard server \"{name}\")"),
        Some(hint.into()),
    )
}

impl Remote {
    /// Connects to foreign server `server_oid` as the current user's user mapping says, under
    /// postgres_fdw's rules for non-superusers (its check_conn_params and its check that the
    /// password was used), and stricter: a non-superuser's connection never reads a password
    /// from anywhere but the user mapping (no password file, no service file, no environment),
    /// so that no role can borrow the server's own credentials. Then the remote session is
    /// pinned (search_path = pg_catalog and the settings postgres_fdw pins) before anything
    /// runs there.
    pub fn connect(server_oid: pg_sys::Oid) -> Remote {
        // SAFETY: FFI calls, and reads of what they return, on the backend thread inside the transaction
        // of the SQL call (every caller is a SQL function); no raw pointer comes from the caller.
        unsafe {
            let server = pg_sys::GetForeignServer(server_oid);
            let name = c_text((*server).servername);
            let mapping = pg_sys::GetUserMapping(pg_sys::GetUserId(), server_oid);
            let mut pairs: Vec<(String, String)> = options((*server).options)
                .into_iter()
                .chain(options((*mapping).options))
                .collect();
            pairs.retain(|(k, _)| !FDW_ONLY_OPTIONS.contains(&k.as_str()));
            // As postgres_fdw: the rules apply unless the user mapping's role is a superuser (for a
            // PUBLIC mapping, the current user).
            let superuser = pg_sys::superuser_arg((*mapping).userid);
            if !superuser {
                check_credentials(&name, &pairs, password_required((*mapping).options));
                pairs.push(("passfile".into(), NO_PASSFILE.into()));
            }
            if !pairs.iter().any(|(k, _)| k == "connect_timeout") {
                pairs.push(("connect_timeout".into(), "10".into()));
            }
            pairs.push(("fallback_application_name".into(), "corgipile".into()));
            let keys: Vec<CString> = pairs
                .iter()
                .map(|(k, _)| CString::new(k.as_str()).expect("no NUL in an option"))
                .collect();
            let values: Vec<CString> = pairs
                .iter()
                .map(|(_, v)| CString::new(v.as_str()).expect("no NUL in an option"))
                .collect();
            let mut key_ptrs: Vec<*const c_char> = keys.iter().map(|k| k.as_ptr()).collect();
            let mut value_ptrs: Vec<*const c_char> = values.iter().map(|v| v.as_ptr()).collect();
            key_ptrs.push(std::ptr::null());
            value_ptrs.push(std::ptr::null());
            // libpq's own connect_timeout applies to blocking connects only: this one is
            // non-blocking (so that cancel and statement_timeout stop it), and keeps the timeout
            // itself, with libpq's rules (0 or less: none; at least 2 s).
            let timeout = pairs
                .iter()
                .rev()
                .find(|(k, _)| k == "connect_timeout")
                .and_then(|(_, v)| v.trim().parse::<i64>().ok())
                .filter(|&t| t > 0)
                .map(|t| std::time::Duration::from_secs(t.max(2) as u64));
            let deadline = timeout.map(|t| std::time::Instant::now() + t);
            // SAFETY: null-terminated arrays of C strings that outlive the call.
            let conn = PQconnectStartParams(key_ptrs.as_ptr(), value_ptrs.as_ptr(), 0);
            // Dropped (PQfinish) on every exit from here, ERROR and cancel included.
            let mut remote = Remote {
                conn,
                server: name.clone(),
                busy: false,
            };
            if !conn.is_null() && PQstatus(conn) != CONNECTION_BAD {
                // As libpq's docs say: start as if PQconnectPoll had asked to write.
                let mut polling = PGRES_POLLING_WRITING;
                while polling != PGRES_POLLING_OK && polling != PGRES_POLLING_FAILED {
                    let mut fd = libc::pollfd {
                        fd: PQsocket(conn),
                        events: if polling == PGRES_POLLING_READING {
                            libc::POLLIN
                        } else {
                            libc::POLLOUT
                        },
                        revents: 0,
                    };
                    // SAFETY: one pollfd that outlives the call; 100 ms so that interrupts are
                    // checked ten times a second.
                    let ready = libc::poll(&mut fd, 1, 100);
                    check_for_interrupts!();
                    if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                        raise(
                        PgSqlErrorCode::ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
                        format!("could not connect to shard server \"{name}\": timeout expired after {} s", timeout.map_or(0, |t| t.as_secs())),
                        Some("Check that the server runs, or raise connect_timeout in the foreign server's options.".into()),
                    );
                    }
                    if ready > 0 {
                        polling = PQconnectPoll(conn);
                    }
                }
            }
            if conn.is_null() || PQstatus(conn) != CONNECTION_OK {
                let why = if conn.is_null() {
                    "out of memory".to_string()
                } else {
                    c_text(PQerrorMessage(conn))
                };
                raise(
                PgSqlErrorCode::ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
                format!("could not connect to shard server \"{name}\": {why}"),
                Some("Check that the server runs and that the foreign server and user mapping options are right.".into()),
            );
            }
            if !superuser
                && password_required((*mapping).options)
                && PQconnectionUsedPassword(conn) == 0
            {
                refuse_credentials(
                &name,
                "the shard server did not ask for the user mapping's password".into(),
                "Non-superusers may only connect with password authentication, as for postgres_fdw: change the shard server's authentication method, or have a superuser set password_required 'false' on the user mapping.",
            );
            }
            // Before anything else runs there: the remote session's settings as postgres_fdw pins
            // them, so that nothing the remote role or the server's options chose (a search_path
            // with the role's own functions first) changes what corgipile's calls mean. And if this
            // session is gone (ERROR, FATAL, crash) while a round runs there, the shard notices
            // the closed connection within a second and ends the round.
            remote.query(
                c"SELECT pg_catalog.set_config('search_path', 'pg_catalog', false),
                     pg_catalog.set_config('timezone', 'UTC', false),
                     pg_catalog.set_config('datestyle', 'ISO', false),
                     pg_catalog.set_config('intervalstyle', 'postgres', false),
                     pg_catalog.set_config('extra_float_digits', '3', false),
                     pg_catalog.set_config('client_connection_check_interval', '1000', false)",
                &[],
            );
            // Every round of this training then reads one snapshot of the shard's table, as one
            // server's training reads one of its table (postgres_fdw's remote transactions are
            // repeatable read for the same reason): an epoch sees the rows the first one saw, and
            // the tuple ids a gate's rows were held out by still name them. Nothing is written
            // there, so the transaction ends with the connection.
            remote.query(c"START TRANSACTION ISOLATION LEVEL REPEATABLE READ", &[]);
            remote
        }
    }

    /// Sends `sql` with text parameters; `wait` collects the single-value result.
    pub fn send(&mut self, sql: &CStr, params: &[&str]) {
        // SAFETY: the connection is this Remote's own, open from `connect` until it is dropped; libpq
        // calls on the backend thread, reading only the results libpq returns.
        unsafe {
            let values: Vec<CString> = params
                .iter()
                .map(|p| CString::new(*p).expect("no NUL in a parameter"))
                .collect();
            let ptrs: Vec<*const c_char> = values.iter().map(|v| v.as_ptr()).collect();
            // SAFETY: the connection is open; arrays of params.len() entries outlive the call.
            let sent = PQsendQueryParams(
                self.conn,
                sql.as_ptr(),
                ptrs.len() as c_int,
                std::ptr::null(),
                ptrs.as_ptr(),
                std::ptr::null(),
                std::ptr::null(),
                0,
            );
            if sent == 0 {
                self.fail_connection();
            }
            self.busy = true;
        }
    }

    /// Whether the result has arrived (reads what the socket has, never blocks).
    pub fn ready(&mut self) -> bool {
        // SAFETY: the connection is this Remote's own, open from `connect` until it is dropped; libpq
        // calls on the backend thread, reading only the results libpq returns.
        unsafe {
            if PQconsumeInput(self.conn) == 0 {
                self.fail_connection();
            }
            PQisBusy(self.conn) == 0
        }
    }

    /// The first column of the result's single row (NULL → None); a remote ERROR is raised
    /// here, naming the server, with the remote SQLSTATE. Call once `ready`. For short values
    /// (a version, a schema name): the text is copied.
    pub fn result(&mut self) -> Option<String> {
        self.result_with(short_text)
    }

    /// As `result`, but hands the value's bytes, in libpq's buffer, to `read` (which must not
    /// raise: it returns what to raise) instead of copying them: a reply of any size costs no
    /// memory here beyond what libpq already holds.
    pub fn result_with<T>(&mut self, read: impl FnOnce(&[u8]) -> T) -> Option<T> {
        // SAFETY: the connection is this Remote's own, open from `connect` until it is dropped; libpq
        // calls on the backend thread, reading only the results libpq returns.
        unsafe {
            let mut read = Some(read);
            let mut value = None;
            let mut error: Option<(String, String, Option<String>)> = None;
            loop {
                let res = PQgetResult(self.conn);
                if res.is_null() {
                    break;
                }
                let status = PQresultStatus(res);
                if status == PGRES_TUPLES_OK {
                    if PQntuples(res) == 1 && PQgetisnull(res, 0, 0) == 0 {
                        if let Some(read) = read.take() {
                            let len = PQgetlength(res, 0, 0).max(0) as usize;
                            // SAFETY: libpq's value of `len` bytes, valid until PQclear below.
                            let bytes =
                                std::slice::from_raw_parts(PQgetvalue(res, 0, 0).cast::<u8>(), len);
                            value = Some(read(bytes));
                        }
                    }
                } else if status != PGRES_COMMAND_OK && error.is_none() {
                    let hint = PQresultErrorField(res, PG_DIAG_MESSAGE_HINT);
                    error = Some((
                        c_text(PQresultErrorField(res, PG_DIAG_SQLSTATE)),
                        c_text(PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY)),
                        (!hint.is_null()).then(|| c_text(hint)),
                    ));
                }
                PQclear(res);
            }
            self.busy = false;
            if let Some((sqlstate, message, hint)) = error {
                let message = if message.is_empty() {
                    c_text(PQerrorMessage(self.conn))
                } else {
                    message
                };
                raise_remote(&self.server, &sqlstate, &message, hint);
            }
            value
        }
    }

    /// Sends and waits (answering cancel), for short queries.
    pub fn query(&mut self, sql: &CStr, params: &[&str]) -> Option<String> {
        // SAFETY: the connection is this Remote's own, open from `connect` until it is dropped; libpq
        // calls on the backend thread, reading only the results libpq returns.
        unsafe {
            self.send(sql, params);
            while !self.ready() {
                check_for_interrupts!();
                pg_sys::pg_usleep(1000);
            }
            self.result()
        }
    }

    unsafe fn fail_connection(&mut self) -> ! {
        raise(
            PgSqlErrorCode::ERRCODE_CONNECTION_FAILURE,
            format!(
                "lost the connection to shard server \"{}\": {}",
                self.server,
                c_text(PQerrorMessage(self.conn))
            ),
            None,
        )
    }
}

/// Raises unless a non-superuser's connection options may be used: postgres_fdw's
/// check_conn_params (a non-empty password, unless a superuser set password_required false on
/// the mapping), plus: no passfile or service file the role chose, and no password from the
/// server's environment.
fn check_credentials(name: &str, pairs: &[(String, String)], password_required: bool) {
    if let Some((key, _)) = pairs
        .iter()
        .find(|(k, _)| k == "passfile" || k == "service")
    {
        refuse_credentials(
            name,
            format!("non-superusers may not train through a foreign server or user mapping with a \"{key}\" option"),
            "A password file or service file is the server's, not the role's: give the password in the user mapping, or ask a superuser to remove the option.",
        );
    }
    // Exactly as libpq reads it: an empty password is no password (it then falls back on
    // the password file and the environment); blanks are a password.
    let has_password = pairs.iter().any(|(k, v)| k == "password" && !v.is_empty());
    if has_password {
        return;
    }
    if password_required {
        refuse_credentials(
            name,
            "password is required to train on a shard server".into(),
            "Non-superusers must give a non-empty password in the user mapping, as for postgres_fdw.",
        );
    }
    // password_required 'false' (a superuser's choice): libpq must still not find a password
    // in the server's environment.
    if let Some(var) = ENVIRONMENT_SECRETS
        .iter()
        .find(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()))
    {
        refuse_credentials(
            name,
            format!("the server's environment sets {var}, which a connection without a password would use"),
            "Give the password in the user mapping, or remove the variable from the server's environment.",
        );
    }
}

/// A shard's ERROR, re-raised here with its SQLSTATE and the server's name.
fn raise_remote(server: &str, sqlstate: &str, message: &str, hint: Option<String>) -> ! {
    let code = sqlstate_code(sqlstate).unwrap_or(PgSqlErrorCode::ERRCODE_CONNECTION_EXCEPTION);
    raise(code, format!("shard server \"{server}\": {message}"), hint)
}

/// The error code of a five-character SQLSTATE.
fn sqlstate_code(sqlstate: &str) -> Option<PgSqlErrorCode> {
    let b = sqlstate.as_bytes();
    if b.len() != 5 || !b.iter().all(|c| c.is_ascii_alphanumeric()) {
        return None;
    }
    // MAKE_SQLSTATE: six bits per character, first character lowest.
    let code = b.iter().enumerate().fold(0i32, |acc, (i, &c)| {
        acc | ((((c - b'0') & 0x3F) as i32) << (6 * i))
    });
    Some(PgSqlErrorCode::from(code))
}

impl Drop for Remote {
    fn drop(&mut self) {
        // SAFETY: the connection is ours; PQcancel is safe to call while a query runs.
        unsafe {
            if self.conn.is_null() {
                return;
            }
            if self.busy {
                // A cancel that reaches the shard before its backend has read the query is
                // dropped there, so it is repeated every 100 ms while we wait (at most 0.5 s)
                // for the query to end. Beyond that, client_connection_check_interval (set at
                // connect) ends the remote query within a second of PQfinish.
                let cancel = PQgetCancel(self.conn);
                if !cancel.is_null() {
                    for attempt in 0..50 {
                        if attempt % 10 == 0 {
                            let mut buf = [0 as c_char; 256];
                            PQcancel(cancel, buf.as_mut_ptr(), buf.len() as c_int);
                        }
                        if PQconsumeInput(self.conn) == 0 || PQisBusy(self.conn) == 0 {
                            break;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                    PQfreeCancel(cancel);
                }
            }
            PQfinish(self.conn);
        }
    }
}
