"""The policy defaults of SPEC.md §2, read from the contract itself: the one place they are
written. A flag whose default is not one literal (`--exempt-namespace`) has none here."""

from __future__ import annotations

import os
import re
from pathlib import Path

from k8s import expect
from tools import REPO

ROW = re.compile(r"^\|\s*`(--[a-z-]+)[^`]*`\s*\|\s*`([^`]+)`\s*\|")


def spec_path() -> Path:
    """MODELGATE_SPEC, else SPEC.md as scripts/inputs.sh resolves it ($MODELGATE_INPUTS_DIR/spec, default .inputs/spec)."""
    inputs = REPO / os.environ.get("MODELGATE_INPUTS_DIR", ".inputs")
    return Path(os.environ.get("MODELGATE_SPEC", inputs / "spec" / "SPEC.md"))


def section(text: str, number: int) -> str:
    m = re.search(rf"^## {number}\. .*?(?=^## \d+\. |\Z)", text, re.M | re.S)
    expect(m, f"SPEC.md has no section {number}")
    return m.group(0)


def policy_defaults(text: str) -> dict[str, str]:
    """`--flag` -> default, from the rows of §2's table whose default is a single literal."""
    out = {}
    for line in section(text, 2).splitlines():
        m = ROW.match(line)
        if m and "`" not in line.split("|")[2].strip().strip("`"):
            out[m.group(1)] = m.group(2)
    return out


def read_policy_defaults() -> dict[str, str]:
    path = spec_path()
    expect(path.is_file(), f"SPEC.md not found at {path} (scripts/inputs.sh resolves it; or set MODELGATE_SPEC)")
    defaults = policy_defaults(path.read_text())
    expect(len(defaults) >= 9, f"only {len(defaults)} literal defaults found in §2 of {path}: {defaults}")
    return defaults
