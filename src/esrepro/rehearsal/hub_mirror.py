"""A local HTTP server answering the part of the Hugging Face Hub API that ``huggingface_hub`` uses to fetch
models and dataset files, and plain URLs, from a mirror folder (:mod:`esrepro.rehearsal.mirror_layout`).

Point the clients at it with ``HF_ENDPOINT=<url>`` (``huggingface_hub`` reads it at import) and
``ESREPRO_URL_MIRROR=<url>`` (:func:`esrepro.data.fetch.fetch_url`). Answered:

* ``GET /api/{models,datasets}/<repo>[/revision/<rev>]``: the repository's info (``sha``, ``siblings``, ``gated``);
* ``GET /api/{models,datasets}/<repo>/tree/<rev>[/<path>]``: its files (``oid``, ``size``, ``lfs``), one page;
* ``HEAD|GET /<repo>/resolve/<rev>/<path>`` and ``/datasets/<repo>/resolve/<rev>/<path>``: a file, with
  ``X-Repo-Commit``, ``ETag`` (the git blob id; an LFS file's sha256, also as ``X-Linked-Etag``) and
  ``Content-Length``, no Xet headers;
* ``HEAD|GET /urls/<host>/<path>``: the file of ``https://<host>/<path>``.

A branch name (``main``) or the commit resolves; any other revision is 404 ``RevisionNotFound``. A repository
marked gated answers its files with 401 ``GatedRepo`` unless the request carries ``Authorization: Bearer
<token>`` (its info and file list stay public, as on the hub). An unknown repository is 401 ``RepoNotFound``.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qs, unquote, urlsplit

from esrepro.rehearsal.mirror_layout import read_index, repo_dir, repo_key

#: The date every record carries (the mirror has one commit per repository, written once).
DATE = "2024-01-01T00:00:00.000Z"
CHUNK = 1 << 20


class HubError(Exception):
    """An HTTP error answered the way the hub answers it (status, X-Error-Code, message)."""

    def __init__(self, status: int, code: str, message: str, commit: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


class MirrorHandler(BaseHTTPRequestHandler):
    """One request against the mirror of ``self.server`` (a :class:`MirrorServer`)."""

    server: "MirrorServer"
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._answer(body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(body=False)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        auth = "token" if self.headers.get("Authorization") else "anonymous"
        self.server.log(f"{self.address_string()} {auth} {format % args}")

    # -- dispatch ------------------------------------------------------------------------
    def _answer(self, body: bool) -> None:
        parts = [unquote(p) for p in urlsplit(self.path).path.split("/")[1:]]
        query = parse_qs(urlsplit(self.path).query)
        try:
            if parts[:1] == ["api"] and len(parts) >= 4 and parts[1] in ("models", "datasets"):
                self._api(parts[1][:-1], parts[2:], query, body)
            elif parts[:1] == ["urls"] and len(parts) >= 3:
                self._send_file(self.server.root / "urls" / Path(*parts[1:]), {}, body)
            elif parts[:1] == ["datasets"] and len(parts) >= 6 and parts[3] == "resolve":
                self._resolve("dataset", parts[1:], body)
            elif len(parts) >= 5 and parts[2] == "resolve":
                self._resolve("model", parts, body)
            else:
                raise HubError(404, "", f"not an endpoint of this mirror: {self.path}")
        except HubError as err:
            self._error(err, body)

    def _api(self, kind: str, parts: list[str], query: dict, body: bool) -> None:
        repo = self._repo(kind, "/".join(parts[:2]))
        rest = parts[2:]
        if not rest:
            self._json(self._info(repo, repo["commit"]), body)
        elif rest[0] == "revision" and len(rest) == 2:
            self._json(self._info(repo, self._commit(repo, rest[1])), body)
        elif rest[0] == "tree" and len(rest) >= 2:
            commit = self._commit(repo, rest[1])
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            self._json(tree(repo, "/".join(rest[2:]), recursive), body, commit)
        else:
            raise HubError(404, "", f"not an endpoint of this mirror: {self.path}")

    def _resolve(self, kind: str, parts: list[str], body: bool) -> None:
        repo = self._repo(kind, "/".join(parts[:2]))
        commit = self._commit(repo, parts[3])
        path = "/".join(parts[4:])
        if repo["gated"] and not self.headers.get("Authorization", "").startswith("Bearer "):
            raise HubError(401, "GatedRepo", f"Access to model {repo['id']} is restricted. You must have access to it "
                           "and be authenticated to access it. Please log in.", commit)
        record = repo["files"].get(path)
        if record is None:
            raise HubError(404, "EntryNotFound", f"{path} does not exist on \"{parts[3]}\"", commit)
        etag = record["sha256"] if record["lfs"] else record["oid"]
        headers = {"X-Repo-Commit": commit, "ETag": f'"{etag}"'}
        if record["lfs"]:
            headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(record["size"])})
        self._send_file(repo_dir(self.server.root, kind, repo["id"]) / path, headers, body)

    # -- lookups -------------------------------------------------------------------------
    def _repo(self, kind: str, repo_id: str) -> dict[str, Any]:
        repo = self.server.index["repos"].get(repo_key(kind, repo_id))
        if repo is None:
            raise HubError(401, "RepoNotFound", "Repository not found")
        return repo

    @staticmethod
    def _commit(repo: dict[str, Any], revision: str) -> str:
        if revision == repo["commit"] or revision in repo["branches"]:
            return repo["commit"]
        raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")

    @staticmethod
    def _info(repo: dict[str, Any], commit: str) -> dict[str, Any]:
        author = repo["id"].split("/")[0]
        info = {"_id": commit[:24], "id": repo["id"], "author": author, "sha": commit, "lastModified": DATE,
                "createdAt": DATE, "private": False, "gated": "manual" if repo["gated"] else False,
                "disabled": False, "tags": [], "downloads": 0, "likes": 0,
                "siblings": [{"rfilename": p} for p in sorted(repo["files"])]}
        if repo["type"] == "model":
            info.update({"modelId": repo["id"], "library_name": "transformers", "pipeline_tag": "text-generation"})
        return info

    # -- responses -----------------------------------------------------------------------
    def _json(self, obj: Any, body: bool, commit: str | None = None) -> None:
        data = json.dumps(obj).encode()
        headers = {"Content-Type": "application/json; charset=utf-8", "Content-Length": str(len(data))}
        if commit:
            headers["X-Repo-Commit"] = commit
        self._head(200, headers)
        if body:
            self.wfile.write(data)

    def _send_file(self, path: Path, headers: dict[str, str], body: bool) -> None:
        root = self.server.root.resolve()
        if not path.resolve().is_relative_to(root) or not path.is_file():
            raise HubError(404, "EntryNotFound", f"no such file in the mirror: {self.path}", headers.get("X-Repo-Commit"))
        size = path.stat().st_size
        self._head(200, {"Content-Type": "application/octet-stream", "Content-Length": str(size), **headers})
        if body:
            with open(path, "rb") as fh:
                while chunk := fh.read(CHUNK):
                    self.wfile.write(chunk)

    def _error(self, err: HubError, body: bool) -> None:
        data = json.dumps({"error": err.message}).encode()
        headers = {"Content-Type": "application/json; charset=utf-8", "Content-Length": str(len(data)),
                   "X-Error-Message": err.message}
        if err.code:
            headers["X-Error-Code"] = err.code
        if err.commit:
            headers["X-Repo-Commit"] = err.commit
        self._head(err.status, headers)
        if body:
            self.wfile.write(data)

    def _head(self, status: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()


def tree(repo: dict[str, Any], under: str, recursive: bool) -> list[dict[str, Any]]:
    """The hub's tree listing of ``repo`` below folder ``under``: files and folders, one level or all."""
    prefix = f"{under.strip('/')}/" if under.strip("/") else ""
    entries: dict[str, dict[str, Any]] = {}
    for path, rec in sorted(repo["files"].items()):
        if not path.startswith(prefix):
            continue
        rest = path[len(prefix):].split("/")
        for depth in range(1, len(rest)):
            folder = prefix + "/".join(rest[:depth])
            if recursive or depth == 1:
                entries.setdefault(folder, {"type": "directory", "oid": "0" * 40, "size": 0, "path": folder})
        if recursive or len(rest) == 1:
            entry = {"type": "file", "oid": rec["oid"], "size": rec["size"], "path": path}
            if rec["lfs"]:
                entry["lfs"] = {"oid": rec["sha256"], "size": rec["size"], "pointerSize": 134}
            entries[path] = entry
    return list(entries.values())


class MirrorServer(ThreadingHTTPServer):
    """The mirror at ``root`` served on ``host:port`` (0: any free port); requests are logged to ``log_file``."""

    daemon_threads = True

    def __init__(self, root: str | Path, host: str = "127.0.0.1", port: int = 0,
                 log_file: IO[str] | None = None) -> None:
        self.root = Path(root)
        self.index = read_index(self.root)
        self._log_file = log_file if log_file is not None else sys.stderr
        self._lock = threading.Lock()
        super().__init__((host, port), MirrorHandler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def log(self, line: str) -> None:
        with self._lock:
            print(line, file=self._log_file, flush=True)

    def start(self) -> threading.Thread:
        """Serve in a daemon thread (stop with ``shutdown()``); the thread."""
        thread = threading.Thread(target=self.serve_forever, name="hub-mirror", daemon=True)
        thread.start()
        return thread
