"""The policy defaults as the command-line reference writes them (docs/cli.md, "Policy flags"):
the one place they are written for users. tests/reference_docs.rs keeps that table equal to
the binary's --help; here it is held against what the install assets pass. A flag whose
default is not one literal (`--exempt-namespace`, `none`) has none here."""

from __future__ import annotations

import re

from k8s import expect
from tools import REPO

ROW = re.compile(r"^\|\s*`(--[a-z-]+)[^`]*`\s*\|[^|]*\|\s*`([^`]+)`\s*\|")


def policy_defaults(text: str) -> dict[str, str]:
    """`--flag` -> default, from the rows of the "Policy flags" table whose default is one literal."""
    m = re.search(r"^## Policy flags$.*?(?=^## |\Z)", text, re.M | re.S)
    expect(m, "docs/cli.md has no '## Policy flags' section")
    out = {}
    for line in m.group(0).splitlines():
        row = ROW.match(line)
        if row:
            out[row.group(1)] = row.group(2)
    return out


def read_policy_defaults() -> dict[str, str]:
    path = REPO / "docs" / "cli.md"
    defaults = policy_defaults(path.read_text())
    expect(len(defaults) >= 9, f"only {len(defaults)} literal defaults found in {path}: {defaults}")
    return defaults
