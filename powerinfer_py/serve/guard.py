"""Who may use the server: the Host and Origin checks, the JSON-only bodies and the optional API key.

A web page the user visits can send requests to a server on 127.0.0.1: a "simple" cross-origin POST (a form
type such as text/plain, no preflight) runs without the browser asking anyone, and with DNS rebinding (an
attacker's name that turns into 127.0.0.1) the page can even read the answers. Four checks close that:

- Host: a rebinding page reaches us under the attacker's name, so the Host header must be a name or address
  of this server: localhost, 127.0.0.1, [::1], the address it is bound to (and the name it was given);
  when bound to every interface (0.0.0.0, ::), any IP address too, since an address literal cannot be
  rebound. --allow-host adds names ("*": any), and with an API key any Host is accepted (a page cannot
  know the key). A request without a Host header (HTTP/1.0 tools) is not a browser's and passes.
- Origin: browsers name the page that sent a request; it must be this server itself (same scheme-less
  host and port as the Host header). "null" (a sandboxed frame, a file:// page) is refused too.
- Content-Type: POST bodies must be application/json. Browsers cannot send that cross-origin without a
  CORS preflight (OPTIONS), which this server answers with 405, so the request never comes.
- API key: with one set, every request but GET /health needs `Authorization: Bearer KEY` (what OpenAI's
  clients send), compared in constant time.

Each refusal is an ApiError, answered as the usual OpenAI-style JSON error.
"""
from __future__ import annotations

import hmac
import ipaddress
from urllib.parse import urlsplit

from .api import ApiError

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARDS = frozenset({"", "0.0.0.0", "::"})
MAX_SHOWN = 80  # characters of a header value quoted in an error message


def is_loopback(address: str) -> bool:
    """True for localhost and loopback addresses (127.0.0.0/8, ::1), whose clients are this machine's."""
    if address.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def check_api_key(key: str | None) -> str | None:
    """The key a user gave, checked: None (no key), else non-empty printable ASCII without spaces (what a
    Bearer token can carry; an empty key is refused, being more likely an unset variable than a choice).
    Raises ValueError naming the problem."""
    if key is None:
        return None
    if not key:
        raise ValueError("the API key is empty")
    if not all(33 <= ord(c) <= 126 for c in key):
        raise ValueError("the API key must be printable ASCII without spaces")
    return key


def _shown(value: str) -> str:
    return repr(value if len(value) <= MAX_SHOWN else value[:MAX_SHOWN] + "...")


def split_host(value: str) -> tuple[str, int | None] | None:
    """A Host header (or an Origin's netloc) as (lower-case name without a final dot, port or None); None
    when it is not of the form name[:port] or [v6-address][:port]."""
    value = value.strip().lower()
    if value.startswith("["):  # [v6-address] or [v6-address]:port
        name, sep, rest = value[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            return None
        port = rest[1:] if rest else None
    elif value.count(":") > 1:  # a bare IPv6 address is not a valid Host
        return None
    else:
        name, sep, port = value.partition(":")
        port = port if sep else None
    if port is not None and not (port.isdigit() and len(port) <= 5):
        return None
    name = name.rstrip(".")
    if not name:
        return None
    return name, int(port) if port is not None else None


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


class Access:
    """The checks for one server: bound to `bound` (the address it listens on; `given` is the host the user
    named, e.g. a host name), with extra allowed Host names and an optional API key."""

    def __init__(self, bound: str, given: str | None = None, allow_hosts=(), api_key: str | None = None):
        self.api_key = check_api_key(api_key)
        extra = {h.strip().lower().rstrip(".") for h in allow_hosts if h.strip()}
        self.any_host = "*" in extra or self.api_key is not None
        self.any_ip = bound in WILDCARDS
        names = set(LOOPBACK_NAMES) | extra
        for h in (bound, given or ""):
            if h not in WILDCARDS:
                names.add(h.strip("[]").lower().rstrip("."))
        self.names = frozenset(names)

    # -- the checks, in the order the handler applies them -------------------------------------------------

    def check_host(self, host: str | None) -> None:
        if host is None or self.any_host:
            return
        parts = split_host(host)
        if parts is None:
            raise ApiError(400, f"malformed Host header {_shown(host)}", "invalid_host")
        name = parts[0]
        if name in self.names or (self.any_ip and _is_ip(name)):
            return
        raise ApiError(403, f"the Host header {_shown(host)} is not a name of this server (it answers to "
                       "localhost and its own addresses); start it with --allow-host NAME to accept that name",
                       "host_not_allowed")

    def check_origin(self, origin: str | None, host: str | None) -> None:
        """A browser's Origin must be this server: the same host and port as the Host header."""
        if origin is None:
            return
        try:
            parts = urlsplit(origin.strip())
            ok = (parts.scheme in ("http", "https") and not parts.path.strip("/") and parts.netloc != ""
                  and host is not None)
            if ok:
                default = 443 if parts.scheme == "https" else 80
                mine, theirs = split_host(host), split_host(parts.netloc)
                ok = (mine is not None and theirs is not None and mine[0] == theirs[0]
                      and (mine[1] or default) == (theirs[1] or default))
        except ValueError:  # urlsplit: a malformed bracketed address or port
            ok = False
        if not ok:
            raise ApiError(403, f"cross-origin requests are refused (Origin {_shown(origin)}); this server only "
                           "answers pages it serves itself and non-browser clients", "origin_not_allowed")

    def check_key(self, authorization: str | None) -> None:
        if self.api_key is None:
            return
        if not authorization:
            raise ApiError(401, "this server needs an API key: send the header 'Authorization: Bearer KEY'",
                           "invalid_api_key")
        scheme, _, token = authorization.strip().partition(" ")
        given = token.strip().encode("utf-8", "replace")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given, self.api_key.encode("ascii")):
            raise ApiError(401, "incorrect API key (sent in 'Authorization: Bearer KEY')", "invalid_api_key")


def check_json_body(content_type: str | None) -> None:
    """POST bodies must say they are JSON (parameters such as charset=utf-8 are fine)."""
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    if kind != "application/json":
        got = f"Content-Type {_shown(content_type)}" if content_type else "no Content-Type"
        raise ApiError(415, f"the request body must be JSON sent with 'Content-Type: application/json' "
                       f"(got {got})", "unsupported_media_type")
