"""Schemathesis against the daemon's own OpenAPI document: for every operation, generated requests
(valid and not) get a response the document declares — its status, content type and body schema
(success bodies and OpenAI's error object alike) — and never an undeclared 5xx.

A live daemon (a real process on a loopback socket, as the other daemon tests); its
`max_tokens_limit` is 8 so a generated completion takes a few emulated milliseconds. Bounded:
a few examples an operation, well under 30 s on a quiet machine."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from daemonproc import start_daemon, stop_daemon
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from deepserve.daemon.api import REFUSED

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
EXAMPLES = 12  # an operation and strategy
MODEL = "llama3-8b"


@pytest.fixture(scope="module")
def small_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    run_dir: Path = tmp_path_factory.mktemp("schemathesis") / "run"
    proc, info = start_daemon(run_dir, "--set", "daemon.max_tokens_limit=8")
    yield info
    stop_daemon(proc)


def _served(model: str) -> Any:
    """Most generated bodies name a model that is not served (a 404) or ask for a refused field
    (a 400): point them at the served model and drop refused fields, so 200s are checked too."""

    def fix(case: Any) -> Any:
        if case.path_parameters and "model_id" in case.path_parameters:
            case.path_parameters["model_id"] = model
        if isinstance(case.body, dict) and "model" in case.body:
            case.body["model"] = model
            for field in REFUSED:
                case.body.pop(field, None)
        return case

    return fix


def _run(strategy: Any, url: str, seen: Counter[int]) -> None:
    @given(case=strategy)
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    def check(case: Any) -> None:
        seen[case.call_and_validate(base_url=url, checks=CHECKS, timeout=30).status_code] += 1

    check()


def test_every_response_is_the_one_the_document_declares(small_daemon: dict[str, Any]) -> None:
    """Each operation in turn (schemathesis's pytest plugin does not load under pytest 9): its
    documented example, generated requests as they come, and generated requests for the served
    model without refused fields."""
    url = small_daemon["url"]
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    statuses: dict[str, Counter[int]] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        seen = statuses[operation.label] = Counter()
        raw = operation.as_strategy()
        for strategy in (*operation.get_strategies_from_examples(), raw, raw.map(_served(MODEL))):
            _run(strategy, url, seen)
    # every route was exercised, answering 200 at least once (the utility endpoints too)
    for label in ("POST /v1/chat/completions", "POST /v1/completions", "GET /v1/models/{model_id}", "GET /metrics",
                  "POST /tokenize", "POST /detokenize", "GET /version", "GET /ping", "POST /ping"):  # fmt: skip
        assert statuses[label][200] > 0, (label, statuses)
    assert statuses["GET /v1/models/{model_id}"][404] > 0, statuses
