//! What one call holds in the host through `wasi:http` before its requests
//! leave, counted live against `limits.http_request_total_kib`, in front of
//! wasmtime-wasi-http's own functions.
//!
//! wasmtime-wasi-http bounds each piece a guest makes — a `fields` by
//! `limits.http_field_kib`, a body's buffer by the chunks the outbound hooks
//! allow ([`super::outbound`]: two of 64 KiB) — and the resource table bounds
//! how many pieces there are, but nothing bounds their sum. Any Tool (no
//! grant needed: `wasi:http` is linked into every component) could make
//! thousands of requests, each with its body buffer full and never sent, or
//! thousands of full header fields: gigabytes outside its memory limit, in
//! every instance. The outbound policy never sees them: it runs when a
//! request is sent.
//!
//! One budget per call counts, live:
//! - every `fields` the guest builds (from `from-list`, `set`, `append`,
//!   `clone`), its bytes as wasmtime-wasi-http counts them;
//! - every outgoing request and response, from the fields it took: its
//!   headers, method, authority and path; a request handed to `handle`
//!   counts until the guest drops its `future-incoming-response` (it may wait
//!   for an in-flight slot holding all of it);
//! - trailers handed to a body, until the call ends;
//! - every byte written to a body, until the HTTP client takes it or it is
//!   dropped with its request: the bytes carry their charge ([`Charged`]),
//!   wherever they wait, and the outbound hook hands the client a copy.
//!
//! What the guest drops frees its place. Past the budget a body write fails
//! with an `error-code` naming the setting (the stream's own error, which a
//! guest can handle); a header or target change traps ([`OverBudget`]), as
//! wasmtime-wasi-http itself does past `limits.http_field_kib`; the host
//! records how many were refused.
//!
//! It never widens what wasmtime-wasi-http allows: every operation it lets
//! through is wasmtime-wasi-http's own, on the same handles; it only counts,
//! and refuses.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource, ResourceType};
use wasmtime_wasi::p2::{DynOutputStream, OutputStream, Pollable, StreamError, StreamResult};
use wasmtime_wasi_http::p2::bindings::http::{outgoing_handler, types as wit};
use wasmtime_wasi_http::p2::body::HostOutgoingBody;
use wasmtime_wasi_http::p2::types::{HostFutureIncomingResponse, HostOutgoingRequest, HostOutgoingResponse};
use wasmtime_wasi_http::{FieldMap, RequestOptions, WasiHttpCtxView};

use crate::config::Limits;

/// A call's state, as these checks need it.
pub(super) trait HttpCall: Send + 'static {
    /// The call's `wasi:http` view and what the call holds through it.
    fn http_and_held(&mut self) -> (WasiHttpCtxView<'_>, &mut HttpHeld);
}

/// The setting this module enforces, as records and errors name it.
const SETTING: &str = "limits.http_request_total_kib";

/// What one call holds through `wasi:http` before its requests leave.
#[derive(Debug)]
pub(super) struct HttpHeld {
    limit_kib: u64,
    /// Bytes each `fields`, outgoing request or response, or future response
    /// holds, by handle (what holds none is not here).
    by_handle: HashMap<u32, usize>,
    /// Made at the first use (most calls never use `wasi:http`); shared with
    /// the call's body streams and the bytes written to them.
    budget: Option<Arc<Budget>>,
}

#[derive(Debug)]
struct Budget {
    limit: usize,
    /// The sum of `by_handle`, and trailers handed to a body.
    handles: AtomicUsize,
    /// Bytes written to bodies, alive until the HTTP client takes them or
    /// they are dropped.
    bodies: AtomicUsize,
    /// Writes and changes refused.
    refused: AtomicU64,
}

impl Budget {
    fn left(&self) -> usize {
        self.limit.saturating_sub(self.handles.load(Relaxed).saturating_add(self.bodies.load(Relaxed)))
    }

    /// Whether `more` bytes fit; a refusal is counted.
    fn admit(&self, more: usize) -> bool {
        let fits = more <= self.left();
        if !fits {
            self.refused.fetch_add(1, Relaxed);
        }
        fits
    }

    /// The error a body write past the budget gets: a `wasi:http` error code
    /// the guest can read (`http-error-code`), naming the setting.
    fn exceeded(&self) -> StreamError {
        let code = wit::ErrorCode::InternalError(Some(format!(
            "the call already holds its {SETTING} ({} KiB) of outbound requests not yet sent",
            self.limit >> 10
        )));
        StreamError::LastOperationFailed(wasmtime::Error::new(code))
    }
}

/// A header or target change past the budget: the call traps with this.
#[derive(Debug)]
pub(super) struct OverBudget(u64);

impl std::fmt::Display for OverBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the host stopped it: its outbound requests not yet sent (header fields, targets, body bytes) would have \
             held more than `{SETTING}` ({} KiB)",
            self.0
        )
    }
}

impl std::error::Error for OverBudget {}

impl HttpHeld {
    /// Nothing held; the budget of `limits`.
    pub(super) fn new(limits: &Limits) -> Self {
        HttpHeld { limit_kib: limits.http_request_total_kib, by_handle: HashMap::new(), budget: None }
    }

    fn budget(&mut self) -> &Arc<Budget> {
        let limit = usize::try_from(self.limit_kib.saturating_mul(1024)).unwrap_or(usize::MAX);
        self.budget.get_or_insert_with(|| {
            Arc::new(Budget {
                limit,
                handles: AtomicUsize::new(0),
                bodies: AtomicUsize::new(0),
                refused: AtomicU64::new(0),
            })
        })
    }

    /// `Ok` if `more` bytes fit; else the trap that stops the call.
    fn admit(&mut self, more: usize) -> wasmtime::Result<()> {
        if more == 0 || self.budget().admit(more) {
            Ok(())
        } else {
            Err(wasmtime::Error::new(OverBudget(self.limit_kib)))
        }
    }

    /// The handle `rep` now holds `size` bytes.
    fn hold(&mut self, rep: u32, size: usize) {
        let old = if size == 0 { self.by_handle.remove(&rep) } else { self.by_handle.insert(rep, size) };
        let old = old.unwrap_or(0);
        if old != size {
            let handles = &self.budget().handles;
            handles.fetch_add(size, Relaxed);
            handles.fetch_sub(old, Relaxed);
        }
    }

    /// The handle `rep` is gone (dropped, or moved into another): what it held.
    fn release(&mut self, rep: u32) -> usize {
        let old = self.by_handle.remove(&rep).unwrap_or(0);
        if old > 0 {
            self.budget().handles.fetch_sub(old, Relaxed);
        }
        old
    }

    /// `size` bytes held until the call ends (trailers inside a body).
    fn keep(&mut self, size: usize) {
        if size > 0 {
            self.budget().handles.fetch_add(size, Relaxed);
        }
    }

    /// The host's record of the call's refusals, if any.
    pub(super) fn record(&self) -> Option<String> {
        let refused = self.budget.as_ref()?.refused.load(Relaxed);
        let refused = match refused {
            0 => return None,
            1 => "1 write or header change was".to_owned(),
            n => format!("{n} writes or header changes were"),
        };
        Some(format!(
            "{refused} refused: the call held {} KiB of outbound requests not yet sent (header fields, targets, \
             body bytes the HTTP client had not taken), its `{SETTING}`; raise it in [limits] if the Tool needs more",
            self.limit_kib
        ))
    }

    #[cfg(test)]
    fn held(&self) -> usize {
        self.budget.as_ref().map_or(0, |b| b.handles.load(Relaxed) + b.bodies.load(Relaxed))
    }
}

/// Bytes of header fields as wasmtime-wasi-http counts them against
/// `limits.http_field_kib`: each name and value with the size of its
/// in-memory representation.
fn fields_size(map: &HeaderMap) -> usize {
    map.keys().map(|k| k.as_str().len() + size_of::<HeaderName>()).sum::<usize>()
        + map.values().map(|v| v.len() + size_of::<HeaderValue>()).sum::<usize>()
}

/// The most a header `name: value` (`value_len` bytes) adds to a fields.
fn entry(name_len: usize, value_len: usize) -> usize {
    name_len + size_of::<HeaderName>() + value_len + size_of::<HeaderValue>()
}

/// Bytes a request holds of the guest's: headers, method, authority, path.
/// (Its scheme is at most 64 bytes, `http`'s own bound.)
fn request_size(r: &HostOutgoingRequest) -> usize {
    fields_size(&r.headers)
        + method_len(&r.method)
        + r.authority.as_ref().map_or(0, String::len)
        + r.path_with_query.as_ref().map_or(0, String::len)
}

fn method_len(m: &wit::Method) -> usize {
    match m {
        wit::Method::Other(s) => s.len(),
        _ => 0,
    }
}

/// Body bytes, counted against their call's budget for as long as they
/// live: in the body's buffer, in a request waiting for a slot, or dropped
/// with a request that was never sent.
struct Charged {
    bytes: Bytes,
    budget: Arc<Budget>,
}

impl Charged {
    fn wrap(bytes: Bytes, budget: Arc<Budget>) -> Bytes {
        budget.bodies.fetch_add(bytes.len(), Relaxed);
        Bytes::from_owner(Charged { bytes, budget })
    }
}

impl AsRef<[u8]> for Charged {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for Charged {
    fn drop(&mut self) {
        self.budget.bodies.fetch_sub(self.bytes.len(), Relaxed);
    }
}

/// A request or response body's stream, its writes counted.
struct CountedBody {
    inner: DynOutputStream,
    budget: Arc<Budget>,
}

#[async_trait::async_trait]
impl Pollable for CountedBody {
    async fn ready(&mut self) {
        self.inner.ready().await;
    }
}

#[async_trait::async_trait]
impl OutputStream for CountedBody {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        if bytes.is_empty() {
            return self.inner.write(bytes);
        }
        if !self.budget.admit(bytes.len()) {
            return Err(self.budget.exceeded());
        }
        self.inner.write(Charged::wrap(bytes, self.budget.clone()))
    }

    fn flush(&mut self) -> StreamResult<()> {
        self.inner.flush()
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        let permit = self.inner.check_write()?;
        if permit == 0 {
            return Ok(0);
        }
        match self.budget.left() {
            0 => {
                self.budget.refused.fetch_add(1, Relaxed);
                Err(self.budget.exceeded())
            }
            left => Ok(permit.min(left)),
        }
    }

    async fn cancel(&mut self) {
        self.inner.cancel().await;
    }
}

type HeaderResult = wasmtime::Result<(Result<(), wit::HeaderError>,)>;

/// A change to the fields `fields` that adds at most `bound` bytes, made by
/// `op` if they fit; the fields then counted at their size.
fn change<S: HttpCall>(
    mut store: StoreContextMut<'_, S>,
    fields: Resource<FieldMap>,
    bound: usize,
    op: impl FnOnce(&mut WasiHttpCtxView<'_>, Resource<FieldMap>) -> wasmtime_wasi_http::p2::HeaderResult<()>,
) -> HeaderResult {
    let (mut view, held) = store.data_mut().http_and_held();
    let rep = fields.rep();
    held.admit(bound)?;
    match op(&mut view, fields) {
        Ok(()) => {
            let size = fields_size(view.table.get(&Resource::<FieldMap>::new_borrow(rep))?);
            held.hold(rep, size);
            Ok((Ok(()),))
        }
        Err(e) => Ok((Err(e.downcast()?),)),
    }
}

/// A change to the request `request` that adds at most `bound` bytes, made
/// by `op` if they fit; the request then counted at its size.
fn retarget<S: HttpCall>(
    mut store: StoreContextMut<'_, S>,
    request: Resource<HostOutgoingRequest>,
    bound: usize,
    op: impl FnOnce(&mut WasiHttpCtxView<'_>, Resource<HostOutgoingRequest>) -> wasmtime::Result<Result<(), ()>>,
) -> wasmtime::Result<(Result<(), ()>,)> {
    let (mut view, held) = store.data_mut().http_and_held();
    let rep = request.rep();
    held.admit(bound)?;
    let result = op(&mut view, request)?;
    let size = request_size(view.table.get(&Resource::<HostOutgoingRequest>::new_borrow(rep))?);
    held.hold(rep, size);
    Ok((result,))
}

/// Put the count in front of wasmtime-wasi-http's functions that make,
/// grow, move and drop what a request holds before it leaves, in `linker`
/// (which already holds wasmtime-wasi-http).
pub(super) fn add_to_linker<S: HttpCall>(linker: &mut Linker<S>) -> wasmtime::Result<()> {
    use wit::HostFields;
    type Request = HostOutgoingRequest;
    linker.allow_shadowing(true);
    let mut types = linker.instance("wasi:http/types@0.2.12")?;
    // Fields: counted as they grow. (`fields()` is empty: not counted.)
    types.func_wrap("[static]fields.from-list", |mut store, (entries,): (Vec<(String, Vec<u8>)>,)| {
        let (mut view, held) = store.data_mut().http_and_held();
        held.admit(entries.iter().fold(0usize, |sum, (n, v)| sum.saturating_add(entry(n.len(), v.len()))))?;
        match HostFields::from_list(&mut view, entries) {
            Ok(fields) => {
                let size = fields_size(view.table.get(&fields)?);
                held.hold(fields.rep(), size);
                Ok((Ok(fields),))
            }
            Err(e) => Ok((Err(e.downcast()?),)),
        }
    })?;
    types.func_wrap(
        "[method]fields.set",
        |store, (fields, name, values): (Resource<FieldMap>, String, Vec<Vec<u8>>)| {
            let bound = values.iter().fold(0usize, |sum, v| sum.saturating_add(entry(name.len(), v.len())));
            change(store, fields, bound, |view, f| HostFields::set(view, f, name, values))
        },
    )?;
    types.func_wrap(
        "[method]fields.append",
        |store, (fields, name, value): (Resource<FieldMap>, String, Vec<u8>)| {
            let bound = entry(name.len(), value.len());
            change(store, fields, bound, |view, f| HostFields::append(view, f, name, value))
        },
    )?;
    types.func_wrap("[method]fields.delete", |store, (fields, name): (Resource<FieldMap>, String)| {
        change(store, fields, 0, |view, f| HostFields::delete(view, f, name))
    })?;
    types.func_wrap("[method]fields.clone", |mut store, (fields,): (Resource<FieldMap>,)| {
        let (mut view, held) = store.data_mut().http_and_held();
        // A copy shares its map until changed; counted as a map of its own.
        let size = fields_size(view.table.get(&fields)?);
        held.admit(size)?;
        let copy = HostFields::clone(&mut view, fields)?;
        held.hold(copy.rep(), size);
        Ok((copy,))
    })?;
    types.resource("fields", ResourceType::host::<FieldMap>(), |mut store, rep| {
        let (mut view, held) = store.data_mut().http_and_held();
        held.release(rep);
        HostFields::drop(&mut view, Resource::new_own(rep))
    })?;
    // Requests: each holds the fields it took, then its method and target.
    types.func_wrap("[constructor]outgoing-request", |mut store, (headers,): (Resource<FieldMap>,)| {
        let (mut view, held) = store.data_mut().http_and_held();
        held.release(headers.rep());
        let request = wit::HostOutgoingRequest::new(&mut view, headers)?;
        let size = request_size(view.table.get(&request)?);
        held.hold(request.rep(), size);
        Ok((request,))
    })?;
    types.func_wrap(
        "[method]outgoing-request.set-method",
        |store, (request, method): (Resource<Request>, wit::Method)| {
            let bound = method_len(&method);
            retarget(store, request, bound, |view, r| wit::HostOutgoingRequest::set_method(view, r, method))
        },
    )?;
    types.func_wrap(
        "[method]outgoing-request.set-path-with-query",
        |store, (request, path): (Resource<Request>, Option<String>)| {
            let bound = path.as_ref().map_or(0, String::len);
            retarget(store, request, bound, |view, r| wit::HostOutgoingRequest::set_path_with_query(view, r, path))
        },
    )?;
    types.func_wrap(
        "[method]outgoing-request.set-authority",
        |store, (request, authority): (Resource<Request>, Option<String>)| {
            let bound = authority.as_ref().map_or(0, String::len);
            retarget(store, request, bound, |view, r| wit::HostOutgoingRequest::set_authority(view, r, authority))
        },
    )?;
    types.resource("outgoing-request", ResourceType::host::<Request>(), |mut store, rep| {
        let (mut view, held) = store.data_mut().http_and_held();
        held.release(rep);
        wit::HostOutgoingRequest::drop(&mut view, Resource::new_own(rep))
    })?;
    // Responses (a guest can make one, though it has nowhere to send it).
    types.func_wrap("[constructor]outgoing-response", |mut store, (headers,): (Resource<FieldMap>,)| {
        let (mut view, held) = store.data_mut().http_and_held();
        held.release(headers.rep());
        let response = wit::HostOutgoingResponse::new(&mut view, headers)?;
        let size = fields_size(&view.table.get(&response)?.headers);
        held.hold(response.rep(), size);
        Ok((response,))
    })?;
    types.resource("outgoing-response", ResourceType::host::<HostOutgoingResponse>(), |mut store, rep| {
        let (mut view, held) = store.data_mut().http_and_held();
        held.release(rep);
        wit::HostOutgoingResponse::drop(&mut view, Resource::new_own(rep))
    })?;
    // Bodies: every byte written is counted while it lives.
    types.func_wrap("[method]outgoing-body.write", |mut store, (body,): (Resource<HostOutgoingBody>,)| {
        let (view, held) = store.data_mut().http_and_held();
        let budget = held.budget().clone();
        // As wasmtime-wasi-http's own, with the stream counted.
        let Some(inner) = view.table.get_mut(&body)?.take_output_stream() else { return Ok((Err(()),)) };
        let stream: DynOutputStream = Box::new(CountedBody { inner, budget });
        Ok((Ok(view.table.push_child(stream, &body)?),))
    })?;
    types.func_wrap(
        "[static]outgoing-body.finish",
        |mut store, (body, trailers): (Resource<HostOutgoingBody>, Option<Resource<FieldMap>>)| {
            let (mut view, held) = store.data_mut().http_and_held();
            if let Some(t) = &trailers {
                // Inside the body now, where no handle names them.
                let size = held.release(t.rep());
                held.keep(size);
            }
            match wit::HostOutgoingBody::finish(&mut view, body, trailers) {
                Ok(()) => Ok((Ok(()),)),
                Err(e) => Ok((Err(e.downcast()?),)),
            }
        },
    )?;
    // A sent request is held by its future (it may wait for a slot) until the guest drops that.
    types.resource(
        "future-incoming-response",
        ResourceType::host::<HostFutureIncomingResponse>(),
        |mut store, rep| {
            let (mut view, held) = store.data_mut().http_and_held();
            held.release(rep);
            wit::HostFutureIncomingResponse::drop(&mut view, Resource::new_own(rep))
        },
    )?;
    linker.instance("wasi:http/outgoing-handler@0.2.12")?.func_wrap(
        "handle",
        |mut store, (request, options): (Resource<Request>, Option<Resource<RequestOptions>>)| {
            let (mut view, held) = store.data_mut().http_and_held();
            let size = held.release(request.rep());
            match outgoing_handler::Host::handle(&mut view, request, options) {
                Ok(future) => {
                    held.hold(future.rep(), size);
                    Ok((Ok(future),))
                }
                Err(e) => Ok((Err(e.downcast()?),)),
            }
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An output stream that keeps what it is given, as a body's channel does.
    #[derive(Default, Clone)]
    struct Keep(Arc<std::sync::Mutex<Vec<Bytes>>>);

    #[async_trait::async_trait]
    impl Pollable for Keep {
        async fn ready(&mut self) {}
    }

    #[async_trait::async_trait]
    impl OutputStream for Keep {
        fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
            self.0.lock().expect("not poisoned").push(bytes);
            Ok(())
        }
        fn flush(&mut self) -> StreamResult<()> {
            Ok(())
        }
        fn check_write(&mut self) -> StreamResult<usize> {
            Ok(super::super::outbound::BODY_CHUNK_BYTES)
        }
    }

    #[test]
    fn body_bytes_count_while_they_live_and_past_the_budget_a_write_gets_an_error_code() {
        let mut held = HttpHeld::new(&Limits { http_request_total_kib: 1, ..Limits::default() });
        let keep = Keep::default();
        let mut stream = CountedBody { inner: Box::new(keep.clone()), budget: held.budget().clone() };
        // The permit is what is left of the budget.
        assert_eq!(stream.check_write().ok(), Some(1024));
        stream.write(Bytes::from(vec![b'x'; 600])).expect("fits");
        assert_eq!(stream.check_write().ok(), Some(424));
        assert_eq!(held.held(), 600);
        // A copy (what the HTTP client gets) keeps nothing counted; the bytes themselves do, wherever they are.
        let copy = Bytes::copy_from_slice(&keep.0.lock().expect("not poisoned")[0]);
        assert_eq!(held.held(), 600);
        match stream.write(Bytes::from(vec![b'x'; 600])) {
            Err(StreamError::LastOperationFailed(e)) => match e.downcast_ref::<wit::ErrorCode>() {
                Some(wit::ErrorCode::InternalError(Some(m))) => assert!(m.contains(SETTING), "{m}"),
                other => panic!("{other:?}"),
            },
            other => panic!("{:?}", other.map_err(|e| e.to_string())),
        }
        keep.0.lock().expect("not poisoned").clear();
        assert_eq!(held.held(), 0, "taken or dropped, its place is free");
        drop(copy);
        assert_eq!(stream.check_write().ok(), Some(1024));
        stream.write(Bytes::from(vec![b'x'; 1024])).expect("fits again");
        assert!(matches!(stream.check_write(), Err(StreamError::LastOperationFailed(_))), "nothing left");
        let record = held.record().expect("refusals are recorded");
        assert!(record.starts_with("2 writes or header changes were refused") && record.contains(SETTING), "{record}");
    }

    #[test]
    fn handles_count_what_they_hold_until_released_and_a_change_past_the_budget_traps() {
        let mut held = HttpHeld::new(&Limits { http_request_total_kib: 1, ..Limits::default() });
        assert!(held.record().is_none() && held.budget.is_none(), "nothing made before the first use");
        held.admit(700).expect("fits");
        held.hold(3, 700);
        held.hold(3, 500);
        assert_eq!(held.held(), 500, "a handle counts at its size now");
        held.admit(524).expect("fits exactly");
        let trap = held.admit(525).expect_err("past the budget");
        assert!(trap.downcast_ref::<OverBudget>().is_some() && trap.to_string().contains(SETTING), "{trap}");
        assert_eq!(held.release(3), 500);
        assert_eq!(held.held(), 0);
        held.keep(100);
        assert_eq!(held.held(), 100, "trailers inside a body count until the call ends");
        assert!(held.record().is_some_and(|r| r.starts_with("1 write or header change was refused")));
    }

    #[test]
    fn fields_are_counted_as_wasmtime_wasi_http_counts_them_against_its_own_limit() {
        let entries = [("a", "1"), ("content-type", "application/json"), ("x-pad", "yyyyyyyyyyyyyyyyyyyyyyyyyyyy")];
        let size: usize = entries.iter().map(|(n, v)| entry(n.len(), v.len())).sum();
        for (limit, fits) in [(size, true), (size - 1, false)] {
            let mut map = FieldMap::new_mutable(limit);
            let all = entries.iter().all(|(n, v)| {
                map.append(wasmtime_wasi_http::default_hooks(), (*n).into(), v.as_bytes().to_vec()).is_ok()
            });
            assert_eq!(all, fits, "limit {limit}");
            if fits {
                assert_eq!(fields_size(&map), size);
            }
        }
    }
}
