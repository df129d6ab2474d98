"""The install and operations docs exist and every repository path they name exists."""

import pytest

import checks
from tools import REPO

DOCS = ["docs/install.md", "docs/openshift.md", "docs/pod-security.md", "docs/operations.md"]


@pytest.mark.parametrize("doc", DOCS)
def test_doc_names_only_existing_paths(doc: str) -> None:
    assert (REPO / doc).stat().st_size > 0, f"{doc} is empty"
    checks.docs_paths(REPO, doc)
