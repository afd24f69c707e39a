"""A secret of the sink's configuration in no error fanout raises and no log line, with
the secrets the sink declares (:meth:`fanout.Sink.secret_values`) masked as ``fanout
run`` masks them.

The contract: docs/architecture.md §8. That a sink not opened names its secrets
(:meth:`fanout.Sink.secret_values` before ``open()``) is checked in
:mod:`~fanout.testing.conformance.read_only`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from fanout.errors import FanoutError
from fanout.fan_out import FanOut
from fanout.observe.logs import RedactFilter, known_secrets, secrets_apart
from fanout.testing.conformance.case import NAME, SinkUnderTest
from fanout.testing.conformance.kit import Kit, _modules


class SecretChecks(Kit):
    """A secret never shown (module docstring)."""

    def test_a_secret_never_appears_in_errors_or_logs(
        self,
        spark: Any,
        under_test: SinkUnderTest,
        tmp_path: Path,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        if under_test.secret is None or under_test.failing_config is None:
            pytest.skip("no secret in this sink's configuration")
        caplog.set_level(logging.DEBUG)
        config = {**under_test.failing_config, "name": NAME}
        texts: dict[str, str] = {}
        # the log as a real run's handler writes it (`fanout run` installs RedactFilter),
        # masked of this pipeline's secrets only
        redacting = RedactFilter()
        caplog.handler.addFilter(redacting)
        try:
            with secrets_apart():
                failed = self._fail_with_secret(spark, config, under_test, tmp_path, texts)
                declared = under_test.secret in known_secrets()
        finally:
            caplog.handler.removeFilter(redacting)
        if not failed:
            pytest.fail(
                "the failing configuration did not fail: SinkUnderTest.failing_config must "
                "make FanOut(...) or the batch's write raise (a wrong secret, an unreachable "
                "server)"
            )
        texts["the log"] = caplog.text
        found = [where for where, text in texts.items() if under_test.secret in text]
        what = (
            "The sink declares it (secret_values()), but logged it before fanout knew it (in "
            "its constructor, before the FanOut registers its sinks' secrets), or spelled so "
            "that fanout's masking does not find it: do not log it"
            if found == ["the log"] and declared
            else "Return it from the sink's secret_values() (fanout then masks it in every "
            "error it raises or records and every log line), and keep it out of texts your "
            "sink builds itself"
        )
        assert not found, (
            f"the secret of failing_config appears in {', '.join(found)}: "
            f"{_around(texts[found[0]], under_test.secret)!r}. {what}"
        )

    def _fail_with_secret(
        self,
        spark: Any,
        config: dict[str, Any],
        under_test: SinkUnderTest,
        tmp_path: Path,
        texts: dict[str, str],
    ) -> bool:
        """Build a FanOut of ``config`` and write a batch; whether it failed (the error's
        texts into ``texts``)."""
        try:
            fan = FanOut(self.pipeline, str(tmp_path / "ledger"), [config], retries=0,
                         plugins=_modules(under_test.plugins))  # fmt: skip
            fan.process(self._batch(spark, [(1, "a")]), self._info(0))
        except FanoutError as error:
            texts["the error raised"] = str(error)
            texts["its repr"] = repr(error)
            texts["its cause"] = str(error.__cause__ or "")
            return True
        return False


def _around(text: str, secret: str) -> str:
    """The line of ``text`` holding ``secret``, the secret shown as ``<secret>``."""
    line = next(line for line in text.splitlines() if secret in line)
    return line.replace(secret, "<secret>")[:300]
