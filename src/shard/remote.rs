//! Connections to shard servers through libpq (as postgres_fdw and dblink make them): the
//! foreign server's and the user mapping's options, the same password rule for non-superusers,
//! queries sent asynchronously so that the backend keeps answering cancel while shards work, and
//! a guard that cancels the remote query and closes the connection on every exit path.

use crate::error::raise;
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
    "schema_name",
    "table_name",
];

/// A connection to one shard server; dropping it cancels a query in progress and closes it.
pub struct Remote {
    conn: *mut PGconn,
    pub server: String,
    busy: bool,
}

unsafe fn c_text(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().trim_end().to_string()
    }
}

/// `(name, value)` pairs of a DefElem list of string options.
unsafe fn options(list: *mut pg_sys::List) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if list.is_null() {
        return out;
    }
    for i in 0..(*list).length {
        let def = (*(*list).elements.add(i as usize))
            .ptr_value
            .cast::<pg_sys::DefElem>();
        let name = c_text((*def).defname);
        let value = c_text(pg_sys::defGetString(def));
        out.push((name, value));
    }
    out
}

impl Remote {
    /// Connects to foreign server `server_oid` as the current user's user mapping says.
    /// Non-superusers must connect with a password (as postgres_fdw requires), so that no role
    /// can borrow the server's own credentials.
    ///
    /// # Safety
    /// Backend thread, inside a transaction.
    pub unsafe fn connect(server_oid: pg_sys::Oid) -> Remote {
        let server = pg_sys::GetForeignServer(server_oid);
        let name = c_text((*server).servername);
        let user = pg_sys::GetUserId();
        let mapping = pg_sys::GetUserMapping(user, server_oid);
        let mut pairs: Vec<(String, String)> = options((*server).options)
            .into_iter()
            .chain(options((*mapping).options))
            .collect();
        let password_required = !pairs
            .iter()
            .any(|(k, v)| k == "password_required" && v == "false");
        pairs.retain(|(k, _)| !FDW_ONLY_OPTIONS.contains(&k.as_str()));
        if !pairs.iter().any(|(k, _)| k == "connect_timeout") {
            pairs.push(("connect_timeout".into(), "10".into()));
        }
        pairs.push(("fallback_application_name".into(), "corgipile".into()));
        let superuser = pg_sys::superuser();
        if !superuser && password_required && !pairs.iter().any(|(k, _)| k == "password") {
            raise(
                PgSqlErrorCode::ERRCODE_S_R_E_PROHIBITED_SQL_STATEMENT_ATTEMPTED,
                format!("password is required to train on shard server \"{name}\""),
                Some(
                    "Non-superusers must give a password in the user mapping, as for postgres_fdw."
                        .into(),
                ),
            );
        }
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
        if !superuser && password_required && PQconnectionUsedPassword(conn) == 0 {
            raise(
                PgSqlErrorCode::ERRCODE_S_R_E_PROHIBITED_SQL_STATEMENT_ATTEMPTED,
                format!("shard server \"{name}\" did not ask for the user mapping's password"),
                Some("Non-superusers may only connect with password authentication, as for postgres_fdw.".into()),
            );
        }
        // If this session is gone (ERROR, FATAL, crash) while a round runs there, the shard
        // notices the closed connection within a second and ends the round.
        remote.query(
            c"SELECT pg_catalog.set_config('client_connection_check_interval', '1000', false)",
            &[],
        );
        remote
    }

    /// Sends `sql` with text parameters; `wait` collects the single-value result.
    pub unsafe fn send(&mut self, sql: &CStr, params: &[&str]) {
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

    /// Whether the result has arrived (reads what the socket has, never blocks).
    pub unsafe fn ready(&mut self) -> bool {
        if PQconsumeInput(self.conn) == 0 {
            self.fail_connection();
        }
        PQisBusy(self.conn) == 0
    }

    /// The first column of the result's single row (NULL → None); a remote ERROR is raised
    /// here, naming the server, with the remote SQLSTATE. Call once `ready`.
    pub unsafe fn result(&mut self) -> Option<String> {
        let mut value = None;
        let mut error: Option<(String, String, Option<String>)> = None;
        loop {
            let res = PQgetResult(self.conn);
            if res.is_null() {
                break;
            }
            if PQresultStatus(res) == PGRES_TUPLES_OK {
                if PQntuples(res) == 1 && PQgetisnull(res, 0, 0) == 0 {
                    value = Some(c_text(PQgetvalue(res, 0, 0)));
                }
            } else if error.is_none() {
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

    /// Sends and waits (answering cancel), for short queries.
    pub unsafe fn query(&mut self, sql: &CStr, params: &[&str]) -> Option<String> {
        self.send(sql, params);
        while !self.ready() {
            check_for_interrupts!();
            pg_sys::pg_usleep(1000);
        }
        self.result()
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
