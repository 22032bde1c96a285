import os, sys  # noqa
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # noqa
"""backend.proto carries the host's field numbers and types exactly."""

import backend_pb2
import pytest
from google.protobuf.descriptor import FieldDescriptor as FD

from contract_fields import CONTRACT

SCALARS = {
    FD.TYPE_STRING: "string", FD.TYPE_BYTES: "bytes", FD.TYPE_INT32: "int32",
    FD.TYPE_FLOAT: "float", FD.TYPE_DOUBLE: "double", FD.TYPE_BOOL: "bool",
    FD.TYPE_UINT64: "uint64", FD.TYPE_UINT32: "uint32", FD.TYPE_INT64: "int64",
}
# Declared by the contract, not needed by this backend (proto3 ignores them).
UNDECLARED = {("ModelOptions", "Proxy")}


def type_name(f) -> str:
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        k, v = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
        return f"map<{type_name(k)}, {type_name(v)}>"
    if f.type == FD.TYPE_MESSAGE:
        base = f.message_type.name
    elif f.type == FD.TYPE_ENUM:
        base = f.enum_type.name
    else:
        base = SCALARS[f.type]
    repeated = f.is_repeated and not (f.message_type and f.message_type.GetOptions().map_entry)
    return f"repeated {base}" if repeated else base


@pytest.mark.parametrize("message", sorted(CONTRACT))
def test_message_fields_match_contract(message):
    desc = backend_pb2.DESCRIPTOR.message_types_by_name.get(message) or \
        backend_pb2.StatusResponse.DESCRIPTOR.nested_types_by_name.get(message)
    assert desc is not None, f"{message} is not declared"
    ours = {f.name: (f.number, type_name(f)) for f in desc.fields}
    for name, (number, typ) in CONTRACT[message].items():
        if (message, name) in UNDECLARED:
            assert name not in ours
            continue
        assert name in ours, f"{message}.{name} is missing"
        assert ours[name] == (number, typ), f"{message}.{name}: ours {ours[name]}, contract {(number, typ)}"
    extra = set(ours) - set(CONTRACT[message])
    assert not extra, f"{message} declares fields the contract does not have: {extra}"


def test_package_service_and_enums():
    assert backend_pb2.DESCRIPTOR.package == "backend"
    svc = backend_pb2.DESCRIPTOR.services_by_name["Backend"]
    rpcs = {m.name: (m.input_type.name, m.output_type.name, m.server_streaming) for m in svc.methods}
    assert rpcs["PredictStream"] == ("PredictOptions", "Reply", True)
    assert rpcs["Predict"] == ("PredictOptions", "Reply", False)
    assert rpcs["Embedding"] == ("PredictOptions", "EmbeddingResult", False)
    assert rpcs["Score"] == ("ScoreRequest", "ScoreResponse", False)
    assert rpcs["Rerank"] == ("RerankRequest", "RerankResult", False)
    # The audio RPCs as LocalAI's backend.proto declares them.
    assert rpcs["AudioTranscription"] == ("TranscriptRequest", "TranscriptResult", False)
    assert rpcs["AudioTranscriptionStream"] == ("TranscriptRequest", "TranscriptStreamResponse", True)
    assert rpcs["TTS"] == ("TTSRequest", "Result", False)
    assert rpcs["TTSStream"] == ("TTSRequest", "Reply", True)
    assert rpcs["VAD"] == ("VADRequest", "VADResponse", False)
    for name in ("Health", "Free", "LoadModel", "Embedding", "TokenizeString", "Detokenize",
                 "Status", "Score", "Rerank", "GetMetrics", "ModelMetadata"):
        assert name in rpcs
    state = backend_pb2.StatusResponse.State
    assert (state.UNINITIALIZED, state.BUSY, state.READY, state.ERROR) == (0, 1, 2, -1)
    layout = backend_pb2.EmbeddingLayout
    assert [v.number for v in layout.DESCRIPTOR.values] == [0, 1, 2]


def test_reserved_numbers_unused():
    numbers = {f.number for f in backend_pb2.PredictOptions.DESCRIPTOR.fields}
    assert 24 not in numbers
    numbers = {f.number for f in backend_pb2.ToolFormatMarkers.DESCRIPTOR.fields}
    assert 19 not in numbers
