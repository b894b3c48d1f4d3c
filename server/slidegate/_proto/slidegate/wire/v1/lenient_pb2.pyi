from google.protobuf import wrappers_pb2 as _wrappers_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LenientRateLimitRequest(_message.Message):
    __slots__ = ("domain", "descriptors", "hits_addend")
    class Descriptor(_message.Message):
        __slots__ = ("entries", "limit", "hits_addend", "is_negative_hits")
        class Entry(_message.Message):
            __slots__ = ("key", "value")
            KEY_FIELD_NUMBER: _ClassVar[int]
            VALUE_FIELD_NUMBER: _ClassVar[int]
            key: bytes
            value: bytes
            def __init__(self, key: _Optional[bytes] = ..., value: _Optional[bytes] = ...) -> None: ...
        class Override(_message.Message):
            __slots__ = ("requests_per_unit", "unit", "unit_multiplier")
            REQUESTS_PER_UNIT_FIELD_NUMBER: _ClassVar[int]
            UNIT_FIELD_NUMBER: _ClassVar[int]
            UNIT_MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
            requests_per_unit: int
            unit: int
            unit_multiplier: _wrappers_pb2.UInt32Value
            def __init__(self, requests_per_unit: _Optional[int] = ..., unit: _Optional[int] = ..., unit_multiplier: _Optional[_Union[_wrappers_pb2.UInt32Value, _Mapping]] = ...) -> None: ...
        ENTRIES_FIELD_NUMBER: _ClassVar[int]
        LIMIT_FIELD_NUMBER: _ClassVar[int]
        HITS_ADDEND_FIELD_NUMBER: _ClassVar[int]
        IS_NEGATIVE_HITS_FIELD_NUMBER: _ClassVar[int]
        entries: _containers.RepeatedCompositeFieldContainer[LenientRateLimitRequest.Descriptor.Entry]
        limit: LenientRateLimitRequest.Descriptor.Override
        hits_addend: _wrappers_pb2.UInt64Value
        is_negative_hits: bool
        def __init__(self, entries: _Optional[_Iterable[_Union[LenientRateLimitRequest.Descriptor.Entry, _Mapping]]] = ..., limit: _Optional[_Union[LenientRateLimitRequest.Descriptor.Override, _Mapping]] = ..., hits_addend: _Optional[_Union[_wrappers_pb2.UInt64Value, _Mapping]] = ..., is_negative_hits: _Optional[bool] = ...) -> None: ...
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    HITS_ADDEND_FIELD_NUMBER: _ClassVar[int]
    domain: bytes
    descriptors: _containers.RepeatedCompositeFieldContainer[LenientRateLimitRequest.Descriptor]
    hits_addend: int
    def __init__(self, domain: _Optional[bytes] = ..., descriptors: _Optional[_Iterable[_Union[LenientRateLimitRequest.Descriptor, _Mapping]]] = ..., hits_addend: _Optional[int] = ...) -> None: ...
