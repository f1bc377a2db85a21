"""Schemathesis against the real server's /openapi.json: no 5xx, every response as documented."""

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from loadtest.serverproc import running_server

pytestmark = pytest.mark.slow


def test_every_operation_conforms_to_the_schema(model_path):
    # Small bounds keep each generated request cheap: the fuzzer may ask for m=16 on the long path.
    env = {"EGRM_MODEL": str(model_path), "EGRM_LONG_MAX_TOKENS": "4", "EGRM_MAX_ITEMS": "4"}
    with running_server(env) as url:
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert {op.path for op in operations} >= {"/v1/rewards", "/healthz", "/readyz", "/metrics"}
        for operation in operations:

            @given(case=operation.as_strategy())
            @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
            def conforms(case):
                # Schema-valid but refused on purpose (422/413): m vs len(temperatures), pairwise
                # without response_b, item and prompt-token limits. Everything else is checked.
                case.call_and_validate(excluded_checks=[schemathesis.checks.positive_data_acceptance])

            conforms()
