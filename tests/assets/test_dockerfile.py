"""The Dockerfile: hadolint-clean, multi-stage, distroless, numeric non-root user."""

from __future__ import annotations

import re

from tools import REPO, Assets, run


def test_hadolint(assets: Assets) -> None:
    run(assets.tool("hadolint"), "--no-color", REPO / "Dockerfile")


def test_hadolint_refuses_a_bad_dockerfile(assets: Assets) -> None:
    bad = assets.work / "Dockerfile.bad"
    bad.write_text("FROM debian:latest\nRUN apt-get update && apt-get install -y curl\nUSER root\n")
    r = run(assets.tool("hadolint"), "--no-color", bad, ok=False)
    assert r.returncode != 0, "hadolint passed a bad Dockerfile"
    assert "DL3007" in r.stdout + r.stderr, r.stdout + r.stderr


def test_dockerfile_shape() -> None:
    text = (REPO / "Dockerfile").read_text()
    froms = re.findall(r"^FROM .*$", text, re.M)
    assert len(froms) >= 2, "not a multi-stage build"
    assert re.search(r"^FROM rust:1\.95\S* AS build", text, re.M), "no rust:1.95 build stage"
    assert froms[-1].startswith("FROM gcr.io/distroless/cc"), "the runtime stage is not distroless cc"
    users = re.findall(r"^USER .*$", text, re.M)
    assert users and users[-1] == "USER 65532:65532", f"last USER is {users[-1:]}, not numeric 65532:65532"
    assert re.search(r'^ENTRYPOINT \["/usr/local/bin/modelgate"\]', text, re.M), "ENTRYPOINT is not the binary (exec form)"
    runtime = text[text.rindex("FROM gcr.io/distroless") :]
    assert not re.search(r"^(RUN|SHELL)", runtime, re.M), "the runtime stage runs a shell"
