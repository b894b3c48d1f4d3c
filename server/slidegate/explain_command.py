"""`slidegate explain`: one request explained in this process, against the config and storage of the settings given
(slidegate.explain), as POST /explain answers it."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format

from slidegate.application import build
from slidegate.decider import UNDECIDED, LimitRequest
from slidegate.protos import rls_pb2
from slidegate.request import parse_request
from slidegate.settings import Settings


async def explain_request(settings: Settings, text: str) -> dict[str, Any]:
    """The explanation of the RateLimitRequest in ``text`` (proto-JSON). Raises ValueError for a request that is
    not one, or that the service would refuse, or when the storage does not answer; ConfigError and OSError for
    the config."""
    message = json_format.Parse(text, rls_pb2.RateLimitRequest())  # ParseError is a ValueError
    app = build(settings)
    try:
        domain, descriptors = parse_request(message, app.service.decider.policy)
        explanation = await app.service.decider.explain(LimitRequest(domain, descriptors, message.hits_addend))
    except UNDECIDED as exc:
        raise ValueError(str(exc)) from exc
    finally:
        await app.backend.close()
    return explanation.as_json()
