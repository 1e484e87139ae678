"""The Open Inference Protocol's gRPC messages, made at first use from ``oip_v2.proto``'s
descriptor (``oip_v2.desc``, written by protoc: the ``.proto`` says how) in a descriptor pool
of their own — not protoc's generated Python, which ties the package to one protobuf major
version, and not the default pool, where a client library's copy of the same messages may
already be."""

from __future__ import annotations

import functools
from importlib import resources
from types import SimpleNamespace
from typing import Any

__all__ = ["messages"]

DESCRIPTOR_FILE = "oip_v2.desc"
PROTO = "oip_v2.proto"


@functools.cache
def messages() -> Any:
    """Every message class of the protocol by name (``messages().ModelInferRequest``)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    data = resources.files(__package__).joinpath(DESCRIPTOR_FILE).read_bytes()
    pool = descriptor_pool.DescriptorPool()
    for proto in descriptor_pb2.FileDescriptorSet.FromString(data).file:
        pool.Add(proto)
    found = pool.FindFileByName(PROTO)
    return SimpleNamespace(**{name: message_factory.GetMessageClass(d)
                              for name, d in found.message_types_by_name.items()})
