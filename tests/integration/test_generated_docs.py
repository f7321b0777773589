"""The generated files are current: docs/CONFIG.md and the Config/ConfigPatch
schemas of openapi/streamfeed.yaml from the option table, docs/LAYERS.md from
the layer-kind registry (run `make docs`)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("STREAMFEED_BIN", str(ROOT / "build" / "streamfeed"))


def test_config_markdown_is_generated_from_the_current_option_table():
    out = subprocess.run([BIN, "--help-markdown"], check=True, capture_output=True, text=True).stdout
    assert (ROOT / "docs" / "CONFIG.md").read_text() == out, "docs/CONFIG.md is stale: run make docs"


def test_layer_kinds_markdown_is_generated_from_the_current_registry():
    out = subprocess.run([BIN, "--help-layers"], check=True, capture_output=True, text=True).stdout
    assert (ROOT / "docs" / "LAYERS.md").read_text() == out, "docs/LAYERS.md is stale: run make docs"
    for kind in ("conv2d", "layer_scale", "stochastic_depth", "concat"):
        assert f"| `{kind}` |" in out


def test_openapi_config_schemas_are_generated_from_the_current_option_table():
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_openapi_config.py"), BIN,
                        str(ROOT / "openapi" / "streamfeed.yaml"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_every_option_of_the_table_is_in_the_config_schema():
    import yaml
    spec = yaml.safe_load((ROOT / "openapi" / "streamfeed.yaml").read_text())
    schema = spec["components"]["schemas"]["Config"]["properties"]
    md = (ROOT / "docs" / "CONFIG.md").read_text()
    # Option rows only: the preset recipes' table also starts its rows with a backtick.
    names = [line.split("`")[1] for line in md.splitlines() if line.startswith("| `") and "." in line.split("`")[1]]
    assert names, "no options found in docs/CONFIG.md"
    for name in names:
        sec, key = name.split(".", 1)
        assert key in schema[sec]["properties"], name
