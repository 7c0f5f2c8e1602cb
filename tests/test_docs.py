"""Documentation generated from the code stays in step with it; every CLI option has help text."""

from __future__ import annotations

import json

import pytest

from conftest import REPO
from esrepro.cli import OPTIONS, VERBS, build_parser, parameters
from esrepro.settings.base import fields_help
from esrepro.settings.docs import BLOCKS, block_text, markdown, schemas


def test_config_readme_is_generated_from_the_settings_classes():
    assert (REPO / "config" / "README.md").read_text() == markdown(), \
        "config/README.md is stale: run `esrepro options --markdown > config/README.md`"


def test_json_schemas_are_generated_from_the_settings_classes():
    for name, schema in schemas().items():
        on_disk = json.loads((REPO / "workflow" / "schemas" / name).read_text())
        assert on_disk == json.loads(json.dumps(schema)), \
            f"workflow/schemas/{name} is stale: run `esrepro options --schema-dir workflow/schemas`"


@pytest.mark.parametrize("block", [b[0] for b in BLOCKS])
def test_every_option_has_help(block):
    cls = next(b[1] for b in BLOCKS if b[0] == block)
    missing = [f["name"] for f in fields_help(cls) if not f["help"].strip()]
    assert not missing, f"{block}: options without a description: {missing}"
    assert block in block_text(block)


def test_every_cli_option_of_every_verb_has_help():
    parser, params = build_parser()
    sub = next(a for a in parser._actions if a.dest == "verb")
    for verb, p in sub.choices.items():
        assert VERBS[verb].help
        for action in p._actions:
            if action.dest in ("help",):
                continue
            assert action.help, f"esrepro {verb} {action.option_strings or action.dest}: no help text"
    used = {name for verb in VERBS.values() for name in parameters(verb.function())}
    assert not set(OPTIONS) - used, f"options no verb takes: {sorted(set(OPTIONS) - used)}"


def test_each_cli_spelling_has_one_meaning():
    """No flag is spelled as another option (the positional config files of validate are not the RO-crate's
    --config-files)."""
    from collections import Counter

    spellings = Counter(flag.lstrip("-").replace("-", "_") for flag, _ in OPTIONS.values())
    assert not [s for s, n in spellings.items() if n > 1], spellings
    parser, _ = build_parser("ro-crate")
    args = parser.parse_args(["ro-crate", "--out", "c", "--workflow", "Snakefile",
                              "--config-files", "a.yaml", "b.yaml"])
    assert args.config_files == ["a.yaml", "b.yaml"]


def test_readme_tiny_results_are_written_from_the_golden_tables():
    from esrepro.provenance.golden import README_BEGIN, README_END, readme_results

    text = (REPO / "README.md").read_text()
    block = text.split(README_BEGIN, 1)[1].split(README_END, 1)[0]
    assert block == "\n" + readme_results(REPO / "golden" / "tiny"), \
        "README.md's tiny results are stale: run `make golden` (or esrepro.provenance.golden.write_readme)"
