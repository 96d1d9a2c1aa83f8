"""The JSON Schema of the wire, generated from the msgspec types in ``messages``.

``protocol/execbox-runner.schema.json`` is this module's output; a test keeps
the two in sync. Regenerate with ``python -m execbox_runner.protocol.schema > protocol/execbox-runner.schema.json``.
Rules that JSON Schema cannot express (unique provider names, ``error``
required when ``ok`` is false) are stated in the descriptions.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from .messages import ERROR_CODES, HostMessage, RunnerMessage


def protocol_schema() -> dict[str, Any]:
    (host, runner), components = msgspec.json.schema_components(
        [HostMessage, RunnerMessage], ref_template="#/$defs/{name}"
    )
    host["description"] = "A message from the host to the runner (one JSON text frame)."
    runner["description"] = "A message from the runner to the host (one JSON text frame)."
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "execbox runner protocol",
        "description": f"Messages of the execbox runner protocol. Stable error codes: {', '.join(sorted(ERROR_CODES))}.",
        "anyOf": [{"$ref": "#/$defs/HostMessage"}, {"$ref": "#/$defs/RunnerMessage"}],
        "$defs": {"HostMessage": host, "RunnerMessage": runner, **components},
    }


def render() -> str:
    return json.dumps(protocol_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(render(), end="")
