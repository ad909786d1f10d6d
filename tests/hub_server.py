"""A Hugging Face Hub look-alike for tests: the real huggingface_hub client talks to it through HF_ENDPOINT.

It implements only what huggingface_hub 2.4 requests for a model repository (found by logging its requests):

  GET  /api/models/{repo}[/revision/{rev}]          repo info (JSON: id, sha, gated, siblings; with
                                                    ?blobs=true each sibling has size, blobId, lfs)
  GET  /api/models/{repo}/tree/{rev}[/{dir}]        file listing (JSON list; ?recursive=true walks folders)
  HEAD /{repo}/resolve/{rev}/{path}                 file metadata: X-Repo-Commit, ETag, Content-Length;
                                                    for LFS files a 302 to the CDN listener with
                                                    X-Linked-Etag (sha256) and X-Linked-Size
  GET  /{repo}/resolve/{rev}/{path}                 the bytes (small files) or the same 302 (LFS files)
  GET  /blobs/{sha256}   (CDN listener)             LFS bytes, honouring "Range: bytes=N-[M]" with 206

The CDN is a second listener on another loopback port, so it is a different origin exactly as on the real
Hub (the client then stops following redirects at HEAD time and drops the Authorization header).
Errors carry the X-Error-Code header the client maps to its exception classes: RepoNotFound (404),
GatedRepo (401 unless the request carries the repo's token), RevisionNotFound, EntryNotFound.

Loopback only, port 0, daemon threads; `stop()` (or leaving the `with` block) shuts both listeners down, and a
watchdog stops them anyway after `max_lifetime_s`. `drop_once(path, n_bytes)` makes the next full GET of that
file send n_bytes of the body and then close the connection (to test resume).
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = (".gguf", ".pt", ".bin", ".safetensors", ".model")
MAX_REQUESTS = 2000  # a runaway client loop fails the test instead of spinning forever


@dataclass
class FakeRepo:
    """One model repository held in memory: path -> bytes at a single commit."""
    repo_id: str
    files: dict[str, bytes]
    gated_token: str | None = None  # set: the repo is gated and only this bearer token may read it
    commit: str = field(default="")
    _sha256: dict[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.commit:
            digest = hashlib.sha1("\n".join([self.repo_id, *sorted(self.files)]).encode()).hexdigest()
            self.commit = digest  # 40 hex digits, like a git commit id

    def is_lfs(self, path: str) -> bool:
        return path.endswith(LFS_SUFFIXES)

    def sha256(self, path: str) -> str:
        if path not in self._sha256:  # hashed once: files of 10+ MiB are served many times
            self._sha256[path] = hashlib.sha256(self.files[path]).hexdigest()
        return self._sha256[path]

    def git_oid(self, path: str) -> str:
        data = self.files[path]
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class LoggedRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names


class HubServer:
    """The hub listener and the CDN listener, sharing one set of repositories and one request log."""

    def __init__(self, repos: list[FakeRepo], *, max_lifetime_s: float = 120.0):
        self.repos = {r.repo_id: r for r in repos}
        self.requests: list[LoggedRequest] = []
        self._drops: dict[str, int] = {}  # sha256 -> bytes to send before dropping (once)
        self._lock = threading.Lock()
        self._hub = _Server(("127.0.0.1", 0), _Handler, self, cdn=False)
        self._cdn = _Server(("127.0.0.1", 0), _Handler, self, cdn=True)
        self.url = f"http://127.0.0.1:{self._hub.server_address[1]}"
        self.cdn_url = f"http://127.0.0.1:{self._cdn.server_address[1]}"
        self._threads = [threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
                         for s in (self._hub, self._cdn)]
        self._watchdog = threading.Timer(max_lifetime_s, self.stop)
        self._watchdog.daemon = True
        self._stopped = False

    def start(self) -> "HubServer":
        for t in self._threads:
            t.start()
        self._watchdog.start()
        return self

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._watchdog.cancel()
        for s in (self._hub, self._cdn):
            s.shutdown()
            s.server_close()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=5)

    def __enter__(self) -> "HubServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def drop_once(self, repo_id: str, path: str, n_bytes: int) -> None:
        """The next GET of this file's bytes without a Range header sends n_bytes, then closes the socket."""
        self._drops[self.repos[repo_id].sha256(path)] = n_bytes

    def log(self, method: str | None = None, contains: str = "") -> list[LoggedRequest]:
        with self._lock:
            return [r for r in self.requests if (method is None or r.method == method) and contains in r.path]

    def _record(self, req: LoggedRequest) -> bool:
        with self._lock:
            self.requests.append(req)
            return len(self.requests) <= MAX_REQUESTS


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr, handler, hub: HubServer, *, cdn: bool):
        super().__init__(addr, handler)
        self.hub = hub
        self.cdn = cdn


_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/(?P<kind>revision|tree)/(?P<rev>[^/]+)(?:/(?P<sub>.*))?)?$")
_BLOB = re.compile(r"^/blobs/(?P<sha>[0-9a-f]{64})$")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the client's connection pool expects
    server: _Server

    def log_message(self, format, *args) -> None:  # the request log replaces stderr noise
        pass

    # ---- dispatch -------------------------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self._dispatch(head=True)

    def do_GET(self) -> None:
        self._dispatch(head=False)

    def _dispatch(self, *, head: bool) -> None:
        hub = self.server.hub
        url = urlsplit(self.path)
        path = unquote(url.path)
        ok = hub._record(LoggedRequest(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
        if not ok:
            return self._error(429, "TooManyRequests", "request limit of the test server reached", head)
        if self.server.cdn:
            m = _BLOB.match(path)
            return self._blob(m["sha"], head) if m else self._error(404, None, "no such blob", head)
        m = _API.match(path)
        if m and not head:
            return self._api(m, parse_qs(url.query))
        m = _RESOLVE.match(path)
        if m:
            return self._resolve(m["repo"], m["rev"], m["path"], head)
        self._error(404, None, f"unknown route {path}", head)

    # ---- helpers --------------------------------------------------------------------------------------------
    def _error(self, status: int, code: str | None, message: str, head: bool, commit: str | None = None) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        if commit:
            self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, obj) -> None:
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _repo(self, repo_id: str, rev: str | None, head: bool) -> FakeRepo | None:
        """The repository if this request may read it at `rev`; otherwise sends the error and returns None."""
        repo = self.server.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", f"Repository not found: {repo_id}", head)
            return None
        if repo.gated_token is not None:
            auth = self.headers.get("Authorization", "")
            if auth != f"Bearer {repo.gated_token}":
                msg = f"Access to model {repo_id} is restricted. You must be authenticated to access it."
                self._error(401, "GatedRepo", msg, head)
                return None
        if rev is not None and rev not in ("main", repo.commit):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
            return None
        return repo

    # ---- endpoints ------------------------------------------------------------------------------------------
    def _api(self, m: re.Match, query: dict) -> None:
        rev = unquote(m["rev"]) if m["rev"] else None
        repo = self._repo(m["repo"], rev, head=False)
        if repo is None:
            return
        if m["kind"] != "tree":
            blobs = query.get("blobs", ["false"])[0].lower() == "true"  # files_metadata=True: sizes, oids, lfs
            return self._json({"id": repo.repo_id, "sha": repo.commit, "private": False,
                               "gated": "manual" if repo.gated_token else False,
                               "siblings": [_sibling(repo, p, blobs) for p in sorted(repo.files)]})
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        self._json(_tree(repo, (m["sub"] or "").strip("/"), recursive))

    def _resolve(self, repo_id: str, rev: str, path: str, head: bool) -> None:
        repo = self._repo(repo_id, rev, head)
        if repo is None:
            return
        if path not in repo.files:
            return self._error(404, "EntryNotFound", f"{path} does not exist on {rev}", head, commit=repo.commit)
        data = repo.files[path]
        if repo.is_lfs(path):
            # Like the Hub: LFS content lives on another origin; the metadata travels on the redirect itself.
            self.send_response(302)
            self.send_header("Location", f"{self.server.hub.cdn_url}/blobs/{repo.sha256(path)}")
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("X-Linked-Etag", f'"{repo.sha256(path)}"')
            self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("ETag", f'"{repo.git_oid(path)}"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("ETag", f'"{repo.git_oid(path)}"')
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if not head:
            self.wfile.write(data)

    def _blob(self, sha: str, head: bool) -> None:
        hub = self.server.hub
        found = next(((r.files[p], p) for r in hub.repos.values() for p in r.files if r.sha256(p) == sha), None)
        if found is None:
            return self._error(404, None, "no such blob", head)
        data, name = found
        start, end = 0, len(data) - 1
        rng = self.headers.get("Range")
        m = _RANGE.match(rng or "")
        if m:
            start = int(m[1])
            end = int(m[2]) if m[2] else end
            if start >= len(data):
                return self._error(416, None, "range not satisfiable", head)
        body = data[start:end + 1]
        self.send_response(206 if m else 200)
        if m:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Disposition", f'inline; filename="{name.rsplit("/", 1)[-1]}";')
        self.send_header("ETag", f'"{sha}"')
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if head:
            return
        cut = None
        with hub._lock:
            if not m and sha in hub._drops:
                cut = hub._drops.pop(sha)
        if cut is None:
            self.wfile.write(body)
            return
        # Send part of the body, then vanish: the client sees a truncated response.
        self.wfile.write(body[:cut])
        self.wfile.flush()
        self.close_connection = True
        self.connection.shutdown(2)


def _sibling(repo: FakeRepo, path: str, blobs: bool) -> dict:
    if not blobs:
        return {"rfilename": path}
    entry = {"rfilename": path, "size": len(repo.files[path]), "blobId": repo.git_oid(path)}
    if repo.is_lfs(path):
        entry["lfs"] = {"sha256": repo.sha256(path), "size": len(repo.files[path]), "pointerSize": 134}
    return entry


def _tree(repo: FakeRepo, sub: str, recursive: bool) -> list[dict]:
    """Listing entries in the Hub's JSON shape: files with size/oid (and lfs), folders with type directory."""
    prefix = f"{sub}/" if sub else ""
    out: list[dict] = []
    folders: set[str] = set()
    for path in sorted(repo.files):
        if not path.startswith(prefix):
            continue
        rest = path[len(prefix):]
        parts = rest.split("/")
        for i in range(1, len(parts)):  # every folder on the way down
            folder = prefix + "/".join(parts[:i])
            if folder not in folders and (recursive or i == 1):
                folders.add(folder)
                out.append({"type": "directory", "oid": hashlib.sha1(folder.encode()).hexdigest(), "size": 0,
                            "path": folder})
        if len(parts) > 1 and not recursive:
            continue
        entry = {"type": "file", "oid": repo.git_oid(path), "size": len(repo.files[path]), "path": path}
        if repo.is_lfs(path):
            entry["lfs"] = {"oid": repo.sha256(path), "size": len(repo.files[path]), "pointerSize": 134}
        out.append(entry)
    return out
