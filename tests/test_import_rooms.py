"""The three rooms never blur: checked in fresh interpreters."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import sys, importlib
for name in {imports!r}:
    importlib.import_module(name)
{extra}
print(",".join(sorted(m for m in ("torch", "textual") if m in sys.modules)))
"""


def python_prints(code: str, timeout: float = 60) -> str:
    """What ``code`` prints in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=timeout
    ).stdout


def loaded_after(imports: list[str], extra: str = "") -> set[str]:
    out = python_prints(CHECK.format(imports=imports, extra=extra))
    return set(filter(None, out.strip().split(",")))


@pytest.mark.parametrize(
    "module",
    [
        "tuiwatch",
        "tuiwatch.ledger",
        "tuiwatch.wire.protocol",
        "tuiwatch.wire.discovery",
        "tuiwatch.cli.main",
        "tuiwatch.errors",
    ],
)
def test_pure_rooms_load_neither_torch_nor_textual(module: str):
    assert loaded_after([module]) == set()


def test_public_names_resolve_lazily():
    assert loaded_after(["tuiwatch"], "import tuiwatch; tuiwatch.read_ledger; tuiwatch.NonFiniteError") == set()


def test_the_publisher_loads_torch_but_never_textual():
    assert loaded_after(["tuiwatch.publisher.watch"]) == {"torch"}
    assert loaded_after(["tuiwatch.publisher.background.nvml", "tuiwatch.cli.doctor"]) == set()
    assert loaded_after(["tuiwatch.publisher.dumps", "tuiwatch.microscope.first_nonfinite"]) == {"torch"}
    assert loaded_after(["tuiwatch.integrations.script"]) == {"torch"}
    assert loaded_after(["tuiwatch.hf"]) == {"torch"}  # and transformers, never Textual
    assert loaded_after(["tuiwatch.lightning"]) == {"torch"}  # and Lightning, never Textual


def test_an_integration_loads_its_framework_only_when_named():
    frameworks = "print(sorted(m for m in ('transformers', 'pytorch_lightning') if m in sys.modules))"
    steps = ["tuiwatch.Watch", "tuiwatch.hf", "tuiwatch.lightning"]
    code = "import sys, tuiwatch\n" + "\n".join(f"{step}\n{frameworks}" for step in steps)
    out = python_prints(code, timeout=120)
    assert out.splitlines() == ["[]", "['transformers']", "['pytorch_lightning', 'transformers']"]


def test_run_help_does_not_import_torch():
    extra = """
from tuiwatch.cli.main import main
try:
    main(["run", "--help"])
except SystemExit:
    pass
"""
    assert "torch" not in loaded_after(["tuiwatch.cli.main"], extra)


def test_ls_help_does_not_import_torch():
    assert loaded_after(["tuiwatch.cli.main"], "from tuiwatch.cli.main import build_parser; build_parser()") == set()


def test_the_viewer_loads_textual_but_never_torch():
    assert loaded_after(["tuiwatch.viewer.app", "tuiwatch.cli.attach", "tuiwatch.viewer.screens.run_picker"]) == {
        "textual"
    }


def test_attach_help_does_not_import_torch():
    extra = """
from tuiwatch.cli.main import main
try:
    main(["attach", "--help"])
except SystemExit:
    pass
"""
    assert "torch" not in loaded_after(["tuiwatch.cli.main"], extra)


def test_the_pure_viewer_parts_load_neither():
    assert loaded_after(["tuiwatch.viewer.state", "tuiwatch.viewer.render.chart", "tuiwatch.analysis.report"]) == set()


@pytest.mark.parametrize(
    ("name", "frameworks", "says"),
    [
        ("hf", ["transformers"], "tuiwatch.hf needs transformers 5"),
        ("lightning", ["lightning", "lightning.pytorch", "pytorch_lightning"], "tuiwatch.lightning needs Lightning 2"),
    ],
)
def test_an_integration_without_its_framework_says_what_to_install(name: str, frameworks: list[str], says: str):
    hide = "; ".join(f"sys.modules[{m!r}] = None" for m in frameworks)  # as if not installed
    code = f"import sys; {hide}; import tuiwatch\ntry:\n    tuiwatch.{name}\nexcept ImportError as e:\n    print(e)"
    out = python_prints(code)
    assert out.startswith(says)
    assert f"pip install 'tuiwatch[{name}]'" in out
