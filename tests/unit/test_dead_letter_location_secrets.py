"""A ``dead_letter``'s location is one of the pipeline's locations: the password of a
``user:password@`` in it is a secret wherever the option is written ``<kind>:<location>``
(``delta:s3://KEY:SECRET@bucket/dl``), and fanout's own texts naming the target mask it.

Before, :func:`fanout.observe.secrets.location_secrets` read a password only where the URL
began the text, so a ``kind:``-prefixed ``dead_letter`` gave none (the pipeline file's
loader, the Delta sink's ``secret_values``, and so ``fanout validate``'s output, left it
as written); :class:`fanout.FanOut` gathered no dead-letter location at all (a PostgreSQL
or Kafka sink declares its URL's or producer's secrets only); the refusal of an unknown
kind reached a Python caller with the password; and a Delta target described itself
with it (the refusals of a moved ``dead_letter``, Kafka's journal-gone texts)."""

from __future__ import annotations

import pytest

from fanout import FanOut
from fanout.deadletters.delta import DeltaDeadLetters
from fanout.errors import ConfigurationError
from fanout.ledger.memory import MemoryLedger
from fanout.observe.logs import known_secrets, secrets_apart
from fanout.observe.secrets import location_secrets
from fanout.testing import RecordingSink

SECRET = "Dl-secret-9931"


class _Lettered(RecordingSink):
    """A sink with a ``dead_letter`` option that declares no secret of its own."""

    def __init__(self, name: str, dead_letter: str) -> None:
        super().__init__(name)
        self.dead_letter = dead_letter


def test_location_secrets_reads_the_password_of_a_url_after_a_kind() -> None:
    assert location_secrets(f"delta:s3://KEY:{SECRET}@bucket/dl") == [SECRET]
    assert location_secrets({"dead_letter": f"detla:az://u:p%40{SECRET}@c/dl"}) == [
        f"p%40{SECRET}",
        f"p@{SECRET}",
    ]
    assert location_secrets(f"s3://KEY:{SECRET}@bucket/dl") == [SECRET]
    assert location_secrets("kafka:letters") == []


def test_an_unknown_dead_letter_kind_is_refused_with_its_password_masked() -> None:
    sink = _Lettered("a", f"detla:s3://KEY:{SECRET}@bucket/dl")
    with secrets_apart(), pytest.raises(ConfigurationError) as refused:
        FanOut("p", MemoryLedger(), [sink])
    assert str(refused.value) == (
        "sink 'a': dead_letter 'detla:s3://KEY:***@bucket/dl' is a detla target, but no "
        "installed plugin provides that kind (kinds: delta, kafka, postgres)"
    )
    assert refused.value.__cause__ is None and refused.value.__suppress_context__


def test_a_pipeline_s_secrets_hold_its_sinks_dead_letter_passwords() -> None:
    """What the pipeline masks in the ledger, its errors and the dead letters' reasons."""
    with secrets_apart():
        fan = FanOut("p", MemoryLedger(), [_Lettered("a", f"delta:nofs://KEY:{SECRET}@b/dl")])
        assert SECRET in fan.secrets
        assert SECRET in known_secrets()  # the log handlers' and the CLI's
    assert fan.dead_letters["a"] is not None
    assert fan.dead_letters["a"].describe() == "Delta table nofs://KEY:***@b/dl"


def test_a_delta_target_names_its_location_masked() -> None:
    target = DeltaDeadLetters(f"s3://KEY:{SECRET}@bucket/dl")
    assert target.describe() == "Delta table s3://KEY:***@bucket/dl"
    assert repr(target) == "<DeltaDeadLetters 's3://KEY:***@bucket/dl'>"
