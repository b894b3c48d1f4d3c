"""The TOP_LIMITED_* settings: how the top limited callers (slidegate.limited, on the debug port's /limited and
/limited/page) show the descriptor values, which can be personal data (a user id, an address)."""

from __future__ import annotations

import dataclasses
import enum
import secrets
from dataclasses import dataclass

from slidegate.setting_parsers import enum_choice, parse_positive_int
from slidegate.setting_spec import setting


class ShownValues(enum.StrEnum):
    """TOP_LIMITED_VALUES: how a caller's descriptor values are shown."""

    PLAIN = "plain"  # as the request sent them
    HASHED = "hashed"  # a keyed hash (BLAKE2b under TOP_LIMITED_HASH_KEY): the same caller, the same hash
    NONE = "none"  # not kept at all: each rule's counts only


@dataclass(frozen=True, slots=True)
class TopLimitedSettings:
    """A section under TOP_LIMITED_."""

    values: ShownValues = setting(  # noqa: RUF009 - setting() is a dataclasses.field
        "VALUES", "plain", enum_choice(ShownValues),
        "the top limited callers on the debug port (/limited): their descriptor values plain, hashed (a keyed "
        "hash, TOP_LIMITED_HASH_KEY) or none (not kept: each rule's decisions and over-limit counts only)")
    hash_key: str = setting(
        "HASH_KEY", "", str,
        "the key of TOP_LIMITED_VALUES=hashed, so that replicas given the same key show a caller alike; empty: a "
        "random key for each start (its workers share it)")
    capacity: int = setting(
        "CAPACITY", "64", parse_positive_int,
        "callers counted per rule, minute and kind (over limit, near it): the memory of the top limited "
        "callers, whatever the number of distinct callers")

    def keyed(self) -> TopLimitedSettings:
        """These settings with a random TOP_LIMITED_HASH_KEY where none is given (drawn once, so that the workers
        given the result hash alike)."""
        return self if self.hash_key else dataclasses.replace(self, hash_key=secrets.token_hex(16))
