"""The demo's Durable Streams rule for the protocol's conformance suite and its interoperability
test: anyone may create, append to, close, delete and read any stream. Never a site's rule: the
settings use it only when DEMO_OPEN_DURABLE_STREAMS=1 is set, as those tests do. It is an
``async def`` rule, which the endpoint asks on the event loop."""

from typing import Any


async def allow_everything(request: Any, action: str, path: str, stream: Any) -> bool:
    return True
