"""The site's generated references (scripts/docsref.py) cover everything the code has: every config key, every
action type and parameter, every command and option, every rule key and library rule."""

from __future__ import annotations

import sys
from pathlib import Path

import typer.main
import yaml
from pydantic import BaseModel
from typer import _click

from actions import registry
from gpuevents.cli import app
from gpuevents.config import Config
from rules.lang.model import ActionSpec, RuleSpec
from tests.docs.snippets import REPO

sys.path.insert(0, str(REPO / "scripts"))
import docsref
from docsref_models import rows


def _leaf_keys(model: type[BaseModel]) -> list[str]:
    return [key for key, kind, _, _ in rows(model) if kind != "mapping"]


def test_the_configuration_reference_has_every_key_with_its_default() -> None:
    page = docsref.config_page()
    keys = [k for k in _leaf_keys(Config) if not k.startswith("owner_addresses")]
    assert len(keys) > 150
    missing = [k for k in keys if f"| `{k}` |" not in page]
    assert not missing, missing
    assert "| `engine.tick` | duration | `30s` |" in page
    assert "| `nats.streams.max_bytes` | size (e.g. 3GiB) | `3.0GiB` |" in page


def test_keys_without_a_description_take_the_comment_of_config_example() -> None:
    comments = docsref.example_comments(REPO / "config.example.yaml")
    assert comments["engine.tick"] == "re-evaluate time-based conditions this often"
    # a comment that continues on the lines below its key is read whole
    assert "sm_active" in comments["agent.thresholds.idle_by_model"]
    page = docsref.config_page()
    assert "| `engine.tick` | duration | `30s` | re-evaluate time-based conditions this often |" in page


def test_the_actions_reference_has_every_action_and_parameter() -> None:
    registry.load()
    page = docsref.actions_page()
    for type_, spec in registry._registry.items():
        assert f"\n## {type_}\n" in page, type_
        for name, field in spec.params.model_fields.items():
            if name != "type":
                assert f"| `{field.alias or name}` |" in page, (type_, name)
    assert "- destructive: yes" in page and "- limits count: nodes" in page


def test_the_cli_reference_has_every_command_and_option() -> None:
    page = docsref.cli_page()
    root = typer.main.get_command(app)
    ctx = _click.Context(root, info_name="gpuevents")
    seen = 0
    for path, command in docsref._commands(root, ctx, ["gpuevents"]):
        seen += 1
        assert f"\n## {' '.join(path[1:])}\n" in page, path
        for param in command.params:
            if param.param_type_name == "option" and not getattr(param, "hidden", False):
                assert f"`{param.opts[0]}`" in page, (path, param.opts)
    assert seen >= 20
    assert "\n## rules check\n" in page and "\n## config check\n" in page


def test_the_rules_reference_has_every_rule_key_and_library_rule() -> None:
    page = docsref.rules_page()
    for name, field in [*RuleSpec.model_fields.items(), *ActionSpec.model_fields.items()]:
        if name not in ("limits", "actions", "on_resolve"):
            assert f"| `{field.alias or name}` |" in page, name
    library = REPO / "rules" / "library"
    for path in library.rglob("*.yaml"):
        if not path.name.endswith(".test.yaml"):
            for rule in yaml.safe_load(path.read_text())["rules"]:
                assert f"| `{rule['name']}` |" in page, rule["name"]


def test_the_hooks_add_each_generated_page_to_the_site(tmp_path: Path) -> None:
    import mkdocs_hooks
    from mkdocs.config import load_config
    from mkdocs.structure.files import Files

    config = load_config(str(REPO / "mkdocs.yml"), site_dir=str(tmp_path))
    files = config.plugins.on_files(Files([]), config=config)  # the hooks run as plugins, as in a build
    uris = {f.src_uri for f in files}
    assert uris == set(mkdocs_hooks.PAGES)
    nav = (REPO / "mkdocs.yml").read_text()
    assert all(uri in nav for uri in uris), "a generated page is missing from the nav"
    changelog = next(f for f in files if f.src_uri == "changelog.md")
    assert changelog.content_string.startswith("# Changelog")
    assert "## [Unreleased]" in changelog.content_string


def test_a_cell_shows_angle_brackets_and_pipes_as_text() -> None:
    from docsref_models import cell

    shown = cell("subject gpuevents.evt.<cluster>\n  `<node>` | x")
    assert shown == "subject gpuevents.evt.&lt;cluster&gt; `<node>` \\| x"
