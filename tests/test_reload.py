"""Never half a config: `slidegate serve` is probed on a limited descriptor every few milliseconds while its
config is rewritten in the ways operators and their tools write files (in two parts with a pause, written
elsewhere and renamed into place, two files one after the other); no probe may be admitted, since both the old
and the new config limit it."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import OK, OVER_LIMIT, descriptor, request
from tests.served import Served, wait_for

HEAD = "domain: w\ndescriptors:\n"
RULE = "  - key: {}\n    rate_limit: {{unit: hour, requests_per_unit: 0}}\n"
OLD = HEAD + RULE.format("a") + RULE.format("b")
# valid YAML after its first rule alone, a config without b: what a reload must never serve
NEW_FIRST, NEW_REST = HEAD + RULE.format("a"), RULE.format("c") + RULE.format("b")


def two_parts(directory: Path, pause: float) -> None:
    with (directory / "limits.yaml").open("w") as file:  # as an editor or `cat > file` writes: in place
        file.write(NEW_FIRST)
        file.flush()
        time.sleep(pause)
        file.write(NEW_REST)


def renamed(directory: Path, _: float) -> None:
    staged = directory / ".limits.yaml.tmp"  # hidden: not a config file while it is written
    staged.write_text(NEW_FIRST)
    time.sleep(0.3)
    with staged.open("a") as file:
        file.write(NEW_REST)
    os.replace(staged, directory / "limits.yaml")


def two_files(directory: Path, pause: float) -> None:
    # one domain over two files (MERGE_DOMAIN_CONFIG): b moves from the first file to the second
    (directory / "limits.yaml").write_text(NEW_FIRST)
    time.sleep(pause)
    (directory / "more.yaml").write_text(HEAD + NEW_REST)


class Prober:
    """Asks for descriptor ``b`` every 2 ms in a thread, counting the answers admitted."""

    def __init__(self, served: Served) -> None:
        self.stub, self.asked, self.admitted = served.stub(), 0, 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def run(self) -> None:
        while not self.done.is_set():
            reply = self.stub.ShouldRateLimit(request("w", descriptor(("b", "x"))), timeout=5)
            self.asked += 1
            self.admitted += reply.overall_code == OK
            time.sleep(0.002)

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


@pytest.mark.parametrize(("write", "pause"), [(two_parts, 0.05), (two_parts, 0.3), (renamed, 0), (two_files, 0.3)],
                         ids=["in-place-50ms-pause", "in-place-300ms-pause", "renamed-into-place", "two-files"])
def test_a_config_being_written_is_never_half_loaded(
        serve: Callable[..., Served], write_config: Callable[..., Path],
        write: Callable[[Path, float], None], pause: float) -> None:
    directory = write_config(OLD, "limits.yaml")
    served = serve(directory, "--merge-domain-config", "true")
    stub = served.stub()
    prober = Prober(served)
    try:
        write(directory, pause)
        assert wait_for(lambda: stub.ShouldRateLimit(request("w", descriptor(("c", "x")))).overall_code == OVER_LIMIT)
        time.sleep(0.1)  # and a while after the new config is in force
    finally:
        prober.stop()
    assert prober.asked > 100
    assert prober.admitted == 0
