"""The DP master's KV publisher picks the RTC events of a delivery by exact type (a set look-up,
kv_publish.py `_RTC_TYPES`), which equals `isinstance` against `_RTC_EVENTS` only while none of
those event classes is subclassed: a subclass would silently publish nothing."""

from __future__ import annotations

import deepserve.actors  # noqa: F401  (every actor module loaded: their subclasses would exist)
from deepserve.actors.flowserve.master.kv_publish import _RTC_EVENTS, _RTC_TYPES
from deepserve.cluster import assembly  # noqa: F401  (the platform's modules)


def test_the_type_set_is_the_isinstance_test() -> None:
    assert _RTC_TYPES == frozenset(_RTC_EVENTS)
    for cls in _RTC_EVENTS:
        assert cls.__subclasses__() == [], f"{cls.__name__} is subclassed: publish by isinstance again"
