"""Reading what comes back from a sandboxed program (esrepro.tasks.sandbox.parse_result) without the sandbox: any
bytes give a status, never an exception; the depth count is not fooled by strings and never recurses."""

from __future__ import annotations

import json
import sys

import pytest

from esrepro.tasks.sandbox import Limits, json_depth, parse_result


@pytest.mark.parametrize(("text", "depth"), [
    (b"1", 0), (b"[]", 1), (b"[[1], {\"a\": [2]}]", 3), (b'["[[[", "]]"]', 1), (b'["\\"[[[", "\\\\"]', 1),
    (b'{"k": "\\\\"}', 1), (b"[" * 200000, 200000), (b'"[[[', 3), (b"]]]", 0), (b"]]][[", 2), (b"[1]]]]]]]]]]][[[", 3),
])
def test_json_depth(text: bytes, depth: int) -> None:
    assert json_depth(text) == depth


def test_depth_agrees_with_json_on_valid_documents() -> None:
    doc = {"ok": True, "value": [[1, "]]"], [{"a": ["[{", [3]]}]], "e": "\\\"[{"}
    text = json.dumps(doc).encode()
    assert json_depth(text) == 6 and parse_result(text) == ("ok", doc["value"], "")


@pytest.mark.parametrize("data", [
    b"[" * 200000, b"{" * 200000, b'{"ok": true, "value": ' + b"[" * 100000 + b"]" * 100000 + b"}",
    b"\xff\xfe\x00", b"\x00" * 100, b"", b'{"ok": true, "value": ' + b"9" * 100000 + b"}",
    b'{"ok": false, "error": "\\udc80"}', b'{"ok": false, "error": {"a": 1}}', b'{"ok": 1}', b"null",
    b'{"ok": true, "value": [1, 2' , b"[" * ((1 << 20) + 1),
])
def test_any_bytes_give_a_status(data: bytes) -> None:
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)  # a shallow stack, as in a worker thread deep in a call chain
    try:
        status, value, error = parse_result(data)
    finally:
        sys.setrecursionlimit(limit)
    assert status in {"bad_output", "output_limit", "error"} and value is None and error.isascii()


def test_depth_bound_is_the_limit() -> None:
    at = b'{"ok": true, "value": ' + b"[" * 9 + b"]" * 9 + b"}"
    assert parse_result(at, Limits(output_depth=10))[0] == "ok"
    assert parse_result(at, Limits(output_depth=9))[0] == "bad_output"
