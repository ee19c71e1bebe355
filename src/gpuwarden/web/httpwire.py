"""HTTP/1.x as the exporter and the web page speak it: requests, replies, their bytes.

Pure functions and records only (no sockets), so the parsing of what any client
may send is tested on bytes; `httpserver` does the I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Optional, Protocol

REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    414: "URI Too Long",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}
TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True)
class HttpRequest:
    method: str  # GET or HEAD
    path: str  # without the query
    headers: Mapping[str, str]  # names lower-cased


class Stream(Protocol):
    """An answer that goes on: what is new since the last `poll()` (b"" for nothing)."""

    keepalive: float  # seconds of quiet after which `ping` is sent

    ping: bytes

    def poll(self) -> bytes: ...


@dataclass(frozen=True)
class HttpReply:
    status: int
    body: bytes = b""
    content_type: str = TEXT
    headers: Mapping[str, str] = field(default_factory=dict)
    close: bool = False  # close the connection after this answer
    stream: Optional[Stream] = None  # no length: the connection carries the stream


Handler = Callable[[HttpRequest], HttpReply]


def parse_head(head: bytes) -> Optional[tuple[str, str, str, dict[str, str]]]:
    """(method, path without query, version, lower-cased headers), None when malformed."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        return None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        return None
    method, target, version = parts
    if not method.isalpha() or not _is_version(version) or not target:
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            return None
        headers[name.lower()] = value.strip()
    return method, target.split("?", 1)[0], version, headers


def _is_version(text: str) -> bool:
    major, dot, minor = text.removeprefix("HTTP/").partition(".")
    return text.startswith("HTTP/") and bool(dot) and major.isdigit() and minor.isdigit()


def wants_close(version: str, headers: dict[str, str]) -> bool:
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    if version == "HTTP/1.0":
        return "keep-alive" not in tokens
    return "close" in tokens


def has_body(headers: dict[str, str]) -> bool:
    """A body we will not read: answer, then close, so it is never taken for a request."""
    return "transfer-encoding" in headers or headers.get("content-length", "0") not in ("", "0")


def encode(reply: HttpReply, close: bool, head_only: bool = False) -> bytes:
    lines = [
        f"HTTP/1.1 {reply.status} {REASONS.get(reply.status, 'Unknown')}",
        f"Content-Type: {reply.content_type}",
    ]
    if reply.stream is None:
        lines.append(f"Content-Length: {len(reply.body)}")
    lines += [f"{k}: {v}" for k, v in reply.headers.items()]
    if close or reply.stream is not None:
        lines.append("Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only or reply.stream is not None else head + reply.body
