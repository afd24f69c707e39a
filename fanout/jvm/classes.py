"""Compile fanout's Java sources with the Janino that Spark ships, once per machine.

The classes are written to ``~/.cache/fanout/jvm/classes-<key>`` (``$XDG_CACHE_HOME`` when
set), where ``<key>`` hashes the sources and the jars they compile against: a new fanout or a
new pyspark compiles again, the same ones reuse the directory. When the cache cannot be
written, a private temporary directory serves the one session. Compiling takes ~0.6 s (one
``java`` process); anything that keeps it from working (no ``java``, no Janino jar, a compile
error) is logged and returns ``None``: the session then starts without the classes.

Sessions put :func:`classes_jar` on their class path: the same classes zipped into
``classes-<key>.jar`` beside the folder (written once, atomically). A jar, not a folder,
because a JVM with a non-empty folder on its class path can neither dump nor use a
class-data-sharing archive (``-XX:ArchiveClassesAtExit``/``-XX:SharedArchiveFile``), which
the tests use to start their Spark drivers faster (conftest.py).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

SOURCES = Path(__file__).parent
# Janino's command-line compiler (a javac work-alike), in the commons-compiler jar
COMPILER = "org.codehaus.commons.compiler.samples.CompilerDemo"
COMPILE_TIMEOUT_S = 120
# What the sources are compiled with and against: jar name prefixes in Spark's jars folder
TOOL_JARS = ("janino-", "commons-compiler-")
API_JARS = ("hadoop-client-api-", "slf4j-api-")


def spark_jars() -> Path | None:
    """The ``jars`` folder of the Spark that pyspark runs (``SPARK_HOME``'s, else the
    pyspark package's own)."""
    try:
        from pyspark.find_spark_home import _find_spark_home
    except ImportError:
        return None
    jars = Path(_find_spark_home()) / "jars"
    return jars if jars.is_dir() else None


def _jar(jars: Path, prefix: str) -> Path | None:
    # "commons-compiler-3.1.9.jar", not "commons-compiler-jdk-..." nor a "-tests" jar
    found = sorted(
        p for p in jars.glob(f"{prefix}*.jar") if p.name[len(prefix) : len(prefix) + 1].isdigit()
    )
    return found[-1] if found else None


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fanout" / "jvm"


def compiled_classes(cache: Path | None = None) -> Path | None:
    """The folder holding fanout's compiled JVM classes (a class path entry), compiling them
    into ``cache`` (default: the user's cache, see the module docstring) when it has none of
    these sources yet; ``None`` when they cannot be compiled here."""
    sources = sorted(SOURCES.glob("*.java"))
    jars = spark_jars()
    java = _java()
    if not sources or jars is None or java is None:
        found = {"java": java, "Spark's jars": jars, "Java sources": sources}
        lacking = [name for name, value in found.items() if not value]
        log.info("fanout's JVM classes not compiled: no %s", " and no ".join(lacking))
        return None
    tools = [_jar(jars, p) for p in TOOL_JARS]
    apis = [_jar(jars, p) for p in API_JARS]
    if None in tools or None in apis:
        log.info("fanout's JVM classes not compiled: %s lacks Janino or Hadoop's API", jars)
        return None
    digest = hashlib.sha256()
    for path in sources:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    for jar in (*tools, *apis):
        digest.update(jar.name.encode() if jar else b"")  # a jar's name carries its version
    root = cache if cache is not None else _cache_root()
    target = root / f"classes-{digest.hexdigest()[:16]}"
    if _complete(target, sources):
        return target
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        work = Path(tempfile.mkdtemp(prefix=".compiling-", dir=root))
    except OSError:
        # an unwritable cache: a private folder for this session (mkdtemp makes it 0700)
        work = Path(tempfile.mkdtemp(prefix="fanout-jvm-"))
        target = work
    command = [
        java, "-cp", os.pathsep.join(str(j) for j in tools), COMPILER,
        "-d", str(work), "-classpath", os.pathsep.join(str(j) for j in apis),
        *(str(s) for s in sources),
    ]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("fanout's JVM classes not compiled: %s", exc)
        shutil.rmtree(work, ignore_errors=True)
        return None
    if done.returncode != 0 or not _complete(work, sources):
        log.warning(
            "fanout's JVM classes not compiled (exit %s): %s",
            done.returncode,
            (done.stderr or done.stdout).strip()[-2000:],
        )
        shutil.rmtree(work, ignore_errors=True)
        return None
    if work != target:
        try:
            work.rename(target)
        except OSError:  # another process compiled the same classes first: use theirs
            shutil.rmtree(work, ignore_errors=True)
    return target if _complete(target, sources) else None


def _complete(folder: Path, sources: list[Path]) -> bool:
    """Whether ``folder`` holds a class file for every source (package ``fanout.hadoop``)."""
    classes = folder / "fanout" / "hadoop"
    return all((classes / f"{s.stem}.class").is_file() for s in sources)


def classes_jar(cache: Path | None = None) -> Path | None:
    """fanout's compiled JVM classes as a class path entry: the jar :func:`jarred` makes of
    :func:`compiled_classes`'s folder, or that folder itself when the jar cannot be written
    (logged); ``None`` when the classes cannot be compiled here."""
    folder = compiled_classes(cache)
    if folder is None:
        return None
    try:
        return jarred(folder)
    except OSError as exc:
        log.info("fanout's JVM classes not jarred, the folder serves: %s", exc)
        return folder


def jarred(folder: Path) -> Path:
    """The jar ``<folder>.jar`` holding every file under ``folder`` (its class files, by
    their paths relative to it), written when missing: into a temporary file beside it,
    renamed into place, so a process never reads half of one; one already there is reused
    when it names the same files. Raises :class:`OSError` when it cannot be written."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    names = [p.relative_to(folder).as_posix() for p in files]
    jar = folder.with_name(f"{folder.name}.jar")
    try:
        with zipfile.ZipFile(jar) as existing:
            if sorted(existing.namelist()) == names:
                return jar
    except (OSError, zipfile.BadZipFile):
        pass
    handle, temporary = tempfile.mkstemp(prefix=f".{jar.name}-", dir=folder.parent)
    try:
        with os.fdopen(handle, "wb") as out, zipfile.ZipFile(out, "w") as archive:
            for path, name in zip(files, names, strict=True):
                archive.write(path, name)
        os.replace(temporary, jar)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return jar
