"""A load's pause (load_directory's ``pause``, where a reload's thread rests): called all through the parse and the
build, and a paused load gives the same config, and the same errors, as one that is not."""

from __future__ import annotations

from pathlib import Path

import pytest

from slidegate.config import ConfigError, load_directory

RULES = 200


def text(count: int) -> str:
    return "domain: d\ndescriptors:\n" + "".join(
        f"  - key: k\n    value: v{i}\n    rate_limit: {{unit: hour, requests_per_unit: {i}}}\n" for i in range(count))


def test_a_load_pauses_at_every_descriptor_and_piece_of_text(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(text(RULES))
    pauses: list[None] = []
    paused = load_directory(tmp_path, pause=lambda: pauses.append(None))
    pieces = len(text(RULES)) // 2048
    assert len(pauses) >= RULES + pieces
    assert paused.domains["d"].limits() == load_directory(tmp_path).domains["d"].limits()


def test_a_paused_load_reports_the_same_error(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(text(RULES) + "  - key: k\n    value: v7\n")
    with pytest.raises(ConfigError) as plain:
        load_directory(tmp_path)
    with pytest.raises(ConfigError) as paused:
        load_directory(tmp_path, pause=lambda: None)
    assert str(paused.value) == str(plain.value)
    assert "a.yaml:" in str(paused.value) and "duplicate descriptor composite key 'd.k_v7'" in str(paused.value)
