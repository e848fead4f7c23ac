"""Outbound HTTP for Python Tools, through the host's ``wasi:http`` boundary.

A Tool may reach only the destinations it declared and the host granted.
Credentials are attached **by reference** (``Request.get(url).credential("api")``):
the Tool names a credential, the host writes the secret into the request as it
leaves, and only for a destination bound to that credential. The Tool never
sees the secret. The host does not follow redirects.

Only usable inside a component. The ``wasi:http`` bindings are imported when
this module is (componentize-py keeps only what is imported while it builds),
and their absence is tolerated so native tests can import it.
"""

from __future__ import annotations

import json as _json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from . import Failed

try:
    from componentize_py_types import Err
    from wit_world.imports import outgoing_handler
    from wit_world.imports import wasi_http_types as t
except ImportError:  # outside a component: native tests
    outgoing_handler = None

#: The request header that carries a credential reference to the host.
CREDENTIAL_HEADER = "toolgate-credential"


class HttpError(Failed):
    """A request failed; the message says whether the host denied it."""


@dataclass
class Response:
    """A response, fully read."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        try:
            return _json.loads(self.body)
        except ValueError as e:
            raise HttpError(f"response is not JSON: {e}") from None

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


@dataclass
class Request:
    """An outgoing request: ``Request.get(url).credential("api").send()``."""

    method: str
    url: str
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    body: bytes | None = None

    @classmethod
    def get(cls, url: str) -> Request:
        return cls("GET", url)

    @classmethod
    def post(cls, url: str) -> Request:
        return cls("POST", url)

    @classmethod
    def delete(cls, url: str) -> Request:
        return cls("DELETE", url)

    def header(self, name: str, value: str) -> Request:
        self.headers.append((name, value.encode()))
        return self

    def credential(self, name: str) -> Request:
        """Ask the host to apply the credential ``name`` (a reference, never a value)."""
        return self.header(CREDENTIAL_HEADER, name)

    def json(self, value: Any) -> Request:
        self.body = _json.dumps(value).encode()
        return self.header("content-type", "application/json")

    def send(self) -> Response:
        if outgoing_handler is None:
            raise HttpError("HTTP needs the host: Request.send works only inside a component")
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise HttpError(f"invalid URL `{self.url}`")
        methods = {"GET": t.Method_Get(), "POST": t.Method_Post(), "DELETE": t.Method_Delete(),
                   "PUT": t.Method_Put(), "PATCH": t.Method_Patch(), "HEAD": t.Method_Head()}
        try:
            fields = t.Fields.from_list(self.headers)
        except Err as e:
            raise HttpError(f"bad request header: {e.value}") from None
        request = t.OutgoingRequest(fields)
        try:
            request.set_method(methods.get(self.method, t.Method_Other(self.method)))
            request.set_scheme(t.Scheme_Https() if parts.scheme == "https" else t.Scheme_Http())
            request.set_authority(parts.netloc)
            request.set_path_with_query((parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
        except Err:
            raise HttpError(f"invalid URL `{self.url}`") from None
        body = request.body()
        try:
            future = outgoing_handler.handle(request, None)
        except Err as e:
            raise self._error(e.value) from None
        if self.body:
            stream = body.write()
            for i in range(0, len(self.body), 4096):
                stream.blocking_write_and_flush(self.body[i : i + 4096])
            stream.__exit__(None, None, None)
        try:
            t.OutgoingBody.finish(body, None)
        except Err as e:
            raise self._error(e.value) from None
        future.subscribe().block()
        result = future.get()
        if result is None or isinstance(result, Err):
            raise HttpError("HTTP request failed: no response")
        inner = result.value
        if isinstance(inner, Err):
            raise self._error(inner.value)
        response = inner.value
        status = response.status()
        headers = [(k, v.decode("utf-8", errors="replace")) for k, v in response.headers().entries()]
        incoming = response.consume()
        stream = incoming.stream()
        chunks = []
        while True:
            try:
                chunks.append(stream.blocking_read(65536))
            except Err:
                break  # closed: the whole body was read
        return Response(status, headers, b"".join(chunks))

    def _error(self, code: Any) -> HttpError:
        name = type(code).__name__.removeprefix("ErrorCode_")
        if name == "HttpRequestDenied":
            return HttpError(
                f"the host denied the request to {self.url}: the destination (or the credential for it) "
                "is not granted to this Tool"
            )
        detail = getattr(code, "value", None)
        return HttpError(f"HTTP request to {self.url} failed: {name}{f' ({detail})' if detail else ''}")
