//! Every difference between the PostgreSQL majors that corgipile meets, in one place.
//!
//! The crate builds for each major pgrx 0.18 supports (features `pg13` … `pg18`); 15 and 18 are
//! tested. Each difference is written as the range of majors it covers, as the server changed
//! it: `#[cfg(pg_since = "16")]` is 16 and later (build.rs sets `pg_since` for every major up to
//! the one built for), so the untested majors in between get the right variant too. The rest
//! of the crate calls these helpers and never names a major.

use pgrx::pg_sys;

/// Parses a possibly schema-qualified, possibly quoted name (as regclass input does) into a
/// list of name parts. An invalid name is an ERROR.
///
/// # Safety
/// `name` is a NUL-terminated string that outlives the call; backend thread, in a transaction.
pub unsafe fn qualified_name_list(name: *const std::ffi::c_char) -> *mut pg_sys::List {
    // 16 added a soft-error context; none is passed, so a bad name stays an ERROR.
    #[cfg(not(pg_since = "16"))]
    let list = pg_sys::stringToQualifiedNameList(name);
    #[cfg(pg_since = "16")]
    let list = pg_sys::stringToQualifiedNameList(name, std::ptr::null_mut());
    list
}

/// Parse analysis and rewriting of one raw statement without parameters.
///
/// # Safety
/// `raw` is a raw statement parsed from `sql`, a NUL-terminated string that outlives the call;
/// backend thread, in a transaction with an active snapshot.
pub unsafe fn analyze_and_rewrite(
    raw: *mut pg_sys::RawStmt,
    sql: *const std::ffi::c_char,
) -> *mut pg_sys::List {
    // 15 renamed it (and made the parameter types const).
    #[cfg(not(pg_since = "15"))]
    let list =
        pg_sys::pg_analyze_and_rewrite(raw, sql, std::ptr::null_mut(), 0, std::ptr::null_mut());
    #[cfg(pg_since = "15")]
    let list = pg_sys::pg_analyze_and_rewrite_fixedparams(
        raw,
        sql,
        std::ptr::null(),
        0,
        std::ptr::null_mut(),
    );
    list
}

/// Runs a started plan forward to its end (count 0: all rows), once.
///
/// # Safety
/// `qd` went through `ExecutorStart` and not yet through `ExecutorFinish`; backend thread.
pub unsafe fn executor_run_all(qd: *mut pg_sys::QueryDesc) {
    let forward = pg_sys::ScanDirection::ForwardScanDirection;
    // Until 17 ExecutorRun takes `execute_once`; 18 dropped it (a plan always runs once).
    #[cfg(not(pg_since = "18"))]
    pg_sys::ExecutorRun(qd, forward, 0, true);
    #[cfg(pg_since = "18")]
    pg_sys::ExecutorRun(qd, forward, 0);
}

/// The attributes (columns, dropped ones included) of a tuple descriptor.
///
/// # Safety
/// `desc` is a valid tuple descriptor that outlives the returned slice and is not changed
/// while it is used.
pub unsafe fn tuple_desc_attrs<'a>(desc: pg_sys::TupleDesc) -> &'a [pg_sys::FormData_pg_attribute] {
    let natts = (*desc).natts as usize;
    if natts == 0 {
        return &[];
    }
    // Until 17 the attributes are the descriptor's trailing array; 18 put an array of
    // `CompactAttribute`s there and the full attributes right after it (where TupleDescAttr
    // reads them).
    #[cfg(not(pg_since = "18"))]
    let first: *const pg_sys::FormData_pg_attribute = (*desc).attrs.as_ptr();
    #[cfg(pg_since = "18")]
    let first: *const pg_sys::FormData_pg_attribute =
        (*desc).compact_attrs.as_ptr().add(natts).cast();
    std::slice::from_raw_parts(first, natts)
}

/// Whether a Var reads its relation's row as it is: not nulled by an outer join (16 and later
/// mark such Vars) nor a RETURNING `old`/`new` row (18), either of which may be NULL as a
/// whole.
///
/// # Safety
/// `var` is a valid Var.
pub unsafe fn var_reads_the_row(var: *const pg_sys::Var) -> bool {
    let _ = var;
    #[cfg(pg_since = "16")]
    if !(*var).varnullingrels.is_null() {
        return false;
    }
    #[cfg(pg_since = "18")]
    if (*var).varreturningtype != pg_sys::VarReturningType::VAR_RETURNING_DEFAULT {
        return false;
    }
    true
}

/// The local transaction id of this backend's current transaction.
pub fn local_xid() -> u32 {
    // 17 moved it into the virtual transaction id.
    // SAFETY: MyProc is set in every backend that runs this code (a client backend or a
    // parallel worker, both attached to shared memory), and read on the backend thread.
    #[cfg(not(pg_since = "17"))]
    let lxid = unsafe { (*pg_sys::MyProc).lxid };
    // SAFETY: as above.
    #[cfg(pg_since = "17")]
    let lxid = unsafe { (*pg_sys::MyProc).vxid.lxid };
    lxid
}

/// The characters of a String value node (as `makeString` makes it).
///
/// # Safety
/// `node` is a valid String (before 15: Value of type T_String) node.
pub unsafe fn string_node_chars(node: *mut std::ffi::c_void) -> *const std::ffi::c_char {
    // 15 split the Value node into Integer, Float, String, ... nodes.
    #[cfg(not(pg_since = "15"))]
    let chars = (*node.cast::<pg_sys::Value>()).val.str_;
    #[cfg(pg_since = "15")]
    let chars = (*node.cast::<pg_sys::String>()).sval;
    chars
}

/// Parses SQL into raw statements, as a whole query string.
///
/// # Safety
/// `sql` is a NUL-terminated string that outlives the call; backend thread, in a transaction.
pub unsafe fn raw_parse(sql: *const std::ffi::c_char) -> *mut pg_sys::List {
    // 14 added the parse mode.
    #[cfg(not(pg_since = "14"))]
    let list = pg_sys::raw_parser(sql);
    #[cfg(pg_since = "14")]
    let list = pg_sys::raw_parser(sql, pg_sys::RawParseMode::RAW_PARSE_DEFAULT);
    list
}

/// The flags of a custom path whose plan node projects (computes its target list) itself.
/// 15 made projection support a flag; before, every custom scan was assumed to project.
#[cfg(not(pg_since = "15"))]
pub const CUSTOMPATH_PROJECTS: u32 = 0;
/// The flags of a custom path whose plan node projects (computes its target list) itself.
/// 15 made projection support a flag; before, every custom scan was assumed to project.
#[cfg(pg_since = "15")]
pub const CUSTOMPATH_PROJECTS: u32 = pg_sys::CUSTOMPATH_SUPPORT_PROJECTION;

/// Sets up a scan node's projection for the scan relation `varno` (`scanrelid`).
///
/// # Safety
/// `ss` is the ScanState of a node being initialized, with its scan slot set; backend thread.
pub unsafe fn assign_scan_projection(ss: *mut pg_sys::ScanState, varno: pg_sys::Index) {
    // 15 made the varno an int.
    #[cfg(not(pg_since = "15"))]
    pg_sys::ExecAssignScanProjectionInfoWithVarno(ss, varno);
    #[cfg(pg_since = "15")]
    pg_sys::ExecAssignScanProjectionInfoWithVarno(ss, varno as i32);
}

/// The pages a leaf's page reader will read this epoch, fed to PostgreSQL's read stream (17
/// and later), which keeps the I/O for the next of them in flight — across our blocks, in the
/// epoch's random block order — while the current page is decoded, at the distance
/// `effective_io_concurrency` (or the tablespace's setting) allows, combining adjacent pages
/// into one read. Before 17 there is no read stream: pages are read one by one.
pub struct PageStream {
    #[cfg(pg_since = "17")]
    stream: *mut pg_sys::ReadStream,
    /// Owned (Box::into_raw); the stream's callback reads and advances it. A raw pointer, not a
    /// Box, because the callback mutates it while Rust code is inside read_stream_next_buffer.
    #[cfg(pg_since = "17")]
    pages: *mut StreamPages,
    /// Ranges the reader has begun this epoch (all but the last fully read).
    #[cfg(pg_since = "17")]
    ranges_started: usize,
}

#[cfg(pg_since = "17")]
struct StreamPages {
    ranges: Vec<(u32, u32)>,
    next: usize,
    page: u32,
    end: u32,
    /// The stream fell out of step with the reader (never expected): read directly until the
    /// next epoch.
    broken: bool,
}

impl PageStream {
    pub fn new() -> PageStream {
        PageStream {
            #[cfg(pg_since = "17")]
            stream: std::ptr::null_mut(),
            #[cfg(pg_since = "17")]
            pages: std::ptr::null_mut(),
            #[cfg(pg_since = "17")]
            ranges_started: 0,
        }
    }

    /// The reader begins the next of the ranges given to `start`.
    pub fn range_started(&mut self) {
        #[cfg(pg_since = "17")]
        {
            self.ranges_started += 1;
        }
    }

    /// The reader leaves this leaf for another, at the end of a range: drop the read-ahead
    /// (and its pins) and resume from the next range when the leaf comes back.
    ///
    /// # Safety
    /// The relation of the scan the stream was started on (`start`) is still open (the
    /// stream's reset reads it); to keep the stream in step, call it at a range boundary.
    pub unsafe fn pause(&mut self) {
        #[cfg(pg_since = "17")]
        if !self.stream.is_null() {
            pg_sys::read_stream_reset(self.stream);
            // SAFETY: pages is ours; no stream call is running.
            let pages = &mut *self.pages;
            pages.next = self.ranges_started;
            pages.page = 0;
            pages.end = 0;
        }
    }

    /// Starts (or restarts) the stream for this epoch: `ranges` are the leaf's page ranges
    /// in the order the reader will read them.
    ///
    /// # Safety
    /// `scan` is the leaf's heap scan, begun, and its relation stays open until `end`.
    #[allow(unused_variables)]
    pub unsafe fn start(&mut self, scan: pg_sys::HeapScanDesc, ranges: Vec<(u32, u32)>) {
        #[cfg(pg_since = "17")]
        {
            if self.pages.is_null() {
                self.pages = Box::into_raw(Box::new(StreamPages {
                    ranges: Vec::new(),
                    next: 0,
                    page: 0,
                    end: 0,
                    broken: false,
                }));
            }
            if !self.stream.is_null() {
                // Releases the buffers read ahead for the last epoch (if it ended early).
                pg_sys::read_stream_reset(self.stream);
            }
            self.ranges_started = 0;
            // SAFETY: pages is ours; no stream call is running.
            *self.pages = StreamPages {
                ranges,
                next: 0,
                page: 0,
                end: 0,
                broken: false,
            };
            if self.stream.is_null() {
                // 18: the stream's reads are batched (io_method worker or io_uring), as 18's own
                // sequential scans batch theirs; batching mode requires a callback that does
                // no I/O and takes no lock, and ours only counts page numbers.
                #[cfg(pg_since = "18")]
                let flags = pg_sys::READ_STREAM_DEFAULT | pg_sys::READ_STREAM_USE_BATCHING;
                #[cfg(not(pg_since = "18"))]
                let flags = pg_sys::READ_STREAM_DEFAULT;
                self.stream = pg_sys::read_stream_begin_relation(
                    flags as i32,
                    (*scan).rs_strategy,
                    (*scan).rs_base.rs_rd,
                    pg_sys::ForkNumber::MAIN_FORKNUM,
                    Some(next_stream_page),
                    self.pages.cast(),
                    0,
                );
            }
        }
    }

    /// Ends the stream (releasing what it read ahead).
    ///
    /// # Safety
    /// The relation of the scan the stream was started on (`start`) is still open (the
    /// stream's end releases its buffers).
    pub unsafe fn end(&mut self) {
        #[cfg(pg_since = "17")]
        if !self.stream.is_null() {
            pg_sys::read_stream_end(self.stream);
            self.stream = std::ptr::null_mut();
        }
    }
}

impl Drop for PageStream {
    /// Frees the page list only (Rust memory). The ReadStream itself is palloc'd in the
    /// query's memory context and its buffers are released by the resource owner when a query
    /// fails; `end` releases them when it ends normally.
    fn drop(&mut self) {
        #[cfg(pg_since = "17")]
        if !self.pages.is_null() {
            // SAFETY: made by Box::into_raw in `start`, freed once here.
            drop(unsafe { Box::from_raw(self.pages) });
        }
    }
}

/// ReadStreamBlockNumberCB: the next page of the epoch's ranges, or InvalidBlockNumber at the
/// end. Makes no PostgreSQL call.
#[cfg(pg_since = "17")]
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn next_stream_page(
    _stream: *mut pg_sys::ReadStream,
    private: *mut std::ffi::c_void,
    _per_buffer_data: *mut std::ffi::c_void,
) -> pg_sys::BlockNumber {
    // SAFETY: private is the StreamPages the stream was begun with, alive while it is.
    let pages = &mut *private.cast::<StreamPages>();
    if pages.broken {
        return pg_sys::InvalidBlockNumber;
    }
    while pages.page >= pages.end {
        let Some(&(start, len)) = pages.ranges.get(pages.next) else {
            return pg_sys::InvalidBlockNumber;
        };
        pages.next += 1;
        pages.page = start;
        pages.end = start + len;
    }
    pages.page += 1;
    pages.page - 1
}

/// Reads page `page` of a heap scan in page mode: pins it (unpinning the scan's previous
/// page), prunes it if worthwhile, and lists its tuples visible to the scan's snapshot in
/// `rs_vistuples[..rs_ntuples]`. Returns how many there are. From 17 the page comes from
/// `stream` (read ahead), which must be yielding this leaf's pages in this order.
///
/// # Safety
/// `scan` is a heap scan begun in page mode (SO_ALLOW_PAGEMODE, MVCC snapshot) on a locked
/// relation, `page` < the relation's size; backend thread.
#[allow(unused_variables)]
pub unsafe fn read_heap_page(
    scan: pg_sys::HeapScanDesc,
    page: pg_sys::BlockNumber,
    stream: &mut PageStream,
) -> usize {
    // Until 16 heapgetpage does it all; 17 split it: the caller pins the page, then
    // heap_prepare_pagescan lists the visible tuples.
    #[cfg(not(pg_since = "17"))]
    pg_sys::heapgetpage(scan.cast(), page);
    #[cfg(pg_since = "17")]
    {
        if (*scan).rs_cbuf != pg_sys::InvalidBuffer as pg_sys::Buffer {
            pg_sys::ReleaseBuffer((*scan).rs_cbuf);
            (*scan).rs_cbuf = pg_sys::InvalidBuffer as pg_sys::Buffer;
        }
        let mut buffer = pg_sys::InvalidBuffer as pg_sys::Buffer;
        if !stream.stream.is_null() && !(*stream.pages).broken {
            buffer = pg_sys::read_stream_next_buffer(stream.stream, std::ptr::null_mut());
            if buffer != pg_sys::InvalidBuffer as pg_sys::Buffer
                && pg_sys::BufferGetBlockNumber(buffer) != page
            {
                pg_sys::ReleaseBuffer(buffer);
                buffer = pg_sys::InvalidBuffer as pg_sys::Buffer;
            }
            if buffer == pg_sys::InvalidBuffer as pg_sys::Buffer {
                (*stream.pages).broken = true;
            }
        }
        if buffer == pg_sys::InvalidBuffer as pg_sys::Buffer {
            buffer = pg_sys::ReadBufferExtended(
                (*scan).rs_base.rs_rd,
                pg_sys::ForkNumber::MAIN_FORKNUM,
                page,
                pg_sys::ReadBufferMode::RBM_NORMAL,
                (*scan).rs_strategy,
            );
        }
        (*scan).rs_cbuf = buffer;
        (*scan).rs_cblock = page;
        pg_sys::heap_prepare_pagescan(scan.cast());
    }
    (*scan).rs_ntuples as usize
}

/// Counts `n` tuples as returned by a sequential scan of `rel` (pg_stat_*_tables.seq_tup_read),
/// as heap_getnextslot does one by one.
///
/// # Safety
/// `rel` is an open relation; backend thread.
pub unsafe fn count_tuples_returned(rel: pg_sys::Relation, n: usize) {
    let stats = (*rel).pgstat_info;
    if stats.is_null() {
        return; // not counted (or not yet associated: heap_beginscan associates it)
    }
    // 16 renamed the counters.
    #[cfg(not(pg_since = "16"))]
    {
        (*stats).t_counts.t_tuples_returned += n as pg_sys::PgStat_Counter;
    }
    #[cfg(pg_since = "16")]
    {
        (*stats).counts.tuples_returned += n as pg_sys::PgStat_Counter;
    }
}

/// The range type of multirange type `t` (14 added multiranges); None for another type.
pub fn multirange_range(t: pg_sys::Oid) -> Option<pg_sys::Oid> {
    let _ = t;
    // SAFETY: catalog lookups (FFI) on the backend thread, inside the transaction of the SQL
    // call; an unknown type is an ERROR, not undefined behaviour.
    #[cfg(pg_since = "14")]
    if unsafe { pg_sys::get_typtype(t) } as u8 == pg_sys::TYPTYPE_MULTIRANGE {
        // SAFETY: as above.
        return Some(unsafe { pg_sys::get_multirange_range(t) });
    }
    None
}
