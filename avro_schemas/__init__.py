"""Avro schemas from avro_schemas/*.avsc, loaded and parsed once."""
from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

import fastavro


@cache
def schema(name: str) -> Any:
    """The parsed schema `avro_schemas/<name>.avsc`."""
    text = resources.files("avro_schemas").joinpath(f"{name}.avsc").read_text()
    return fastavro.parse_schema(json.loads(text))
