"""A class-data-sharing archive for the Spark drivers the tests start (test infrastructure).

A Spark driver loads ~15,000 classes at its start. Java's dynamic AppCDS archive
(``-XX:ArchiveClassesAtExit`` once, ``-XX:SharedArchiveFile`` after) maps them parsed and
linked instead: a ``fanout run``-like driver took 5.0-5.3 CPU s against 8.2-8.3 (three runs
each, alternated), 6.4-9.0 s of wall time against 9.8-14.4 on a loaded machine.

:func:`archive_options` (conftest.py's ``pytest_configure``, in the controller before the
xdist workers start) dumps the archive once per key by a short representative Spark run
(this module run as a script) and gives the Java options that use it. The key hashes what
the archive must match: the Java installation, Spark's jars, fanout's classes jar (its
name carries the sources' hash) and the JVM options. A JVM whose class path or Java does
not match the archive (a local-cluster executor, a stale archive) says nothing
(``-Xlog:cds=off``) and starts with the JDK's default archive, as without this one; a
missing file would turn the default one off too, so the options are given only when the
file exists. The archive is written under a temporary name and renamed into place after
its JVM exited, under a file lock: no JVM ever maps half of one, and two runs dump it
once. A dump failing (no ``java``, a timeout, a crash) is reported on stderr and the tests
run as before. Each run touches the archive it uses; a dump removes the other archives
not used for :data:`STALE_AFTER_S` (each key's is 173 MB: a Java, pyspark or fanout
classes change, or another virtualenv, makes a new one).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import MutableMapping
from pathlib import Path

DUMP_TIMEOUT_S = 240
ARCHIVE_PREFIX = "tests-cds-"
STALE_AFTER_S = 14 * 24 * 3600
"""An archive no run used for this long is removed by the next dump."""


def with_archive(env: MutableMapping[str, str], base: str, args: list[str]) -> None:
    """Give the Spark drivers started with ``env`` (``SPARK_SUBMIT_OPTS``) the archive for
    the Java options ``base``: dumped when missing unless ``args`` (pytest's) name only
    unit tests. Nothing changes when ``SPARK_SUBMIT_OPTS`` is not ``base`` (set by the user,
    or already given the archive by a parent pytest) or there is no archive; anything
    going wrong is reported on stderr, and the tests run as before."""
    if env.get("SPARK_SUBMIT_OPTS") != base:
        return
    unit_only = bool(args) and all("unit" in Path(arg.split("::")[0]).parts for arg in args)
    try:
        extra = archive_options(base, dump=not unit_only)
    except Exception as exc:  # test infrastructure: the tests run as before
        print(f"fanout tests: no class-data-sharing archive ({exc!r})", file=sys.stderr)
        return
    if extra:
        env["SPARK_SUBMIT_OPTS"] = f"{base} {extra}"


def use_options(archive: Path) -> str:
    """The Java options that start a JVM from ``archive``, silently ignoring it on a
    mismatch (the JDK's default archive then serves, as without it)."""
    return f"-XX:SharedArchiveFile={archive} -Xlog:cds=off -Xlog:cds+dynamic=off"


def archive_path(options: str) -> Path | None:
    """Where the archive for drivers started with the Java ``options`` goes (in fanout's
    JVM cache, beside its classes jar); ``None`` when there is no ``java``, Spark or
    classes jar here."""
    from fanout.jvm.classes import _java, classes_jar, spark_jars

    java, jars = _java(), spark_jars()
    if java is None or jars is None:
        return None
    classes = classes_jar()
    if classes is None or classes.is_dir():  # a folder on the class path: no archive
        return None
    real_java = Path(java).resolve()
    digest = hashlib.sha256()
    for part in (str(real_java), str(jars.resolve()), str(classes), options):
        digest.update(part.encode() + b"\0")
    for path in (real_java, real_java.parent.parent / "lib" / "server" / "libjvm.so"):
        if path.is_file():  # a Java update replaces them
            stat = path.stat()
            digest.update(f"{stat.st_size}:{stat.st_mtime_ns}\0".encode())
    for jar in sorted(jars.glob("*.jar")):
        digest.update(jar.name.encode() + b"\0")
    for name in ("SPARK_HOME", "SPARK_CONF_DIR"):
        digest.update(os.environ.get(name, "").encode() + b"\0")
    return classes.parent / f"{ARCHIVE_PREFIX}{digest.hexdigest()[:16]}.jsa"


def archive_options(options: str, *, dump: bool) -> str:
    """The Java options to add to ``options`` for the archive: empty when there is none
    (and ``dump`` is false, or dumping it failed: reported on stderr)."""
    archive = archive_path(options)
    if archive is None:
        return ""
    if not archive.is_file() and dump:
        started = time.monotonic()
        problem = dumped(archive, options)
        if problem:
            print(f"fanout tests: no class-data-sharing archive ({problem})", file=sys.stderr)
        else:
            took = time.monotonic() - started
            print(
                f"fanout tests: class-data-sharing archive dumped in {took:.0f} s", file=sys.stderr
            )
            remove_stale(archive)
    if not archive.is_file():
        return ""
    try:
        os.utime(archive)  # in use: not stale
    except OSError:  # not ours to touch: used all the same
        pass
    return use_options(archive)


def remove_stale(kept: Path, now: float | None = None) -> list[Path]:
    """Remove the archives beside ``kept`` (and their lock files) that no run used for
    :data:`STALE_AFTER_S`; returns those removed. Best effort: one in use by a JVM stays
    mapped after its file is removed."""
    limit = (time.time() if now is None else now) - STALE_AFTER_S
    removed = []
    for archive in kept.parent.glob(f"{ARCHIVE_PREFIX}*.jsa"):
        try:
            if archive != kept and archive.stat().st_mtime < limit:
                archive.unlink()
                archive.with_name(f"{archive.name}.lock").unlink(missing_ok=True)
                removed.append(archive)
        except OSError:
            continue
    return sorted(removed)


def dumped(archive: Path, options: str, timeout: float = DUMP_TIMEOUT_S) -> str:
    """Dump ``archive`` unless another process did (under a lock on ``<archive>.lock``):
    a representative Spark run of this module with ``-XX:ArchiveClassesAtExit`` into a
    temporary file, renamed to ``archive`` once its JVM exited. Returns what went wrong,
    or an empty string."""
    temporary = archive.with_name(f".{archive.name}.{os.getpid()}.tmp")
    try:
        with open(archive.with_name(f"{archive.name}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if archive.is_file():
                return ""
            return _dump(archive, temporary, options, timeout)
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        temporary.unlink(missing_ok=True)


def _dump(archive: Path, temporary: Path, options: str, timeout: float) -> str:
    env = dict(os.environ, SPARK_SUBMIT_OPTS=f"{options} -XX:ArchiveClassesAtExit={temporary}")
    root = Path(__file__).parent.parent
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(root), env.get("PYTHONPATH"))))
    command = [sys.executable, "-m", "tests.cds", str(temporary)]
    process = subprocess.Popen(
        command,
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its JVM too is killed on a timeout
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return f"the dump run took over {timeout:.0f} s"
    if process.returncode != 0 or not temporary.is_file() or temporary.stat().st_size == 0:
        tail = "\n".join(output.strip().splitlines()[-5:])
        return f"the dump run exited {process.returncode}: {tail}"
    os.replace(temporary, archive)
    return ""


def _representative_run(temporary: Path) -> None:
    """What a ``fanout run`` driver loads: a local session with fanout's settings, a
    file-sourced streaming query, ``foreachBatch`` writing Parquet, a batch read. Waits for
    the JVM to exit, which is when it writes the archive."""
    import tempfile

    from pyspark import SparkContext

    from fanout.spark import local_session

    spark = local_session("fanout-tests-cds")
    with tempfile.TemporaryDirectory(prefix="fanout-cds-") as work:
        folder = Path(work)
        (folder / "in").mkdir()
        (folder / "in" / "a.json").write_text('{"id": 1, "v": "a"}\n{"id": 2, "v": "b"}\n')

        def each(frame: object, batch_id: int) -> None:
            frame.write.mode("append").parquet(str(folder / "out"))  # type: ignore[attr-defined]

        query = (
            spark.readStream.schema("id long, v string")
            .json(str(folder / "in"))
            .writeStream.foreachBatch(each)
            .option("checkpointLocation", str(folder / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        rows = spark.read.parquet(str(folder / "out")).count()
        if rows != 2:
            raise SystemExit(f"the dump run wrote {rows} rows, not 2")
    gateway = SparkContext._gateway
    spark.stop()
    assert gateway is not None
    jvm = gateway.proc  # type: ignore[attr-defined]
    gateway.shutdown()
    jvm.stdin.close()  # the JVM exits when its stdin closes, and dumps the archive
    if jvm.wait(timeout=DUMP_TIMEOUT_S) != 0 or not temporary.is_file():
        raise SystemExit(f"the JVM exited {jvm.returncode} without writing {temporary}")


if __name__ == "__main__":
    _representative_run(Path(sys.argv[1]))
