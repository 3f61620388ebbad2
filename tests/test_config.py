"""coccl/config.py: sizes with suffixes, warnings on unknown COCCL_* names, and the
host:pid:rank prefix of the coccl logger's lines."""

from __future__ import annotations

import io
import logging
import os
import re
import socket
import warnings
from pathlib import Path

import pytest

from coccl import config
from coccl.bench import cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No COCCL_* variable and no launcher's rank variable set."""
    for name in list(os.environ):
        if name.startswith("COCCL_") or name in config._LAUNCHER_RANKS:
            monkeypatch.delenv(name)
    return monkeypatch


# ------------------------------------------------------------------------ sizes
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4096", 4096),
        ("4K", 4096),
        ("4k", 4096),
        ("4M", 4 << 20),
        ("1G", 1 << 30),
        ("2KiB", 2048),
        ("16MB", 16 << 20),
        ("1.5M", 3 << 19),
        (" 8M ", 8 << 20),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert config.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "M", "4X", "-1", "1.3", "1e3", "4MM", "lots"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        config.parse_size(text)


@pytest.mark.parametrize("text", ["4M", "1.5K", "16MB", "8"])
def test_bench_flags_read_sizes_as_the_settings_do(text: str) -> None:
    """One meaning of ``4M``: coccl-bench -b/-e and COCCL_* sizes share the parser."""
    assert cli.parse_size(text) == config.parse_size(text)


@pytest.mark.parametrize(
    ("name", "field"),
    [
        ("COCCL_CHUNK_BYTES", "chunk_bytes"),
        ("COCCL_STAGING_LIMIT_BYTES", "staging_limit_bytes"),
        ("COCCL_PLAN_CACHE_BYTES", "plan_cache_bytes"),
    ],
)
@pytest.mark.parametrize(("text", "expected"), [("4M", 4 << 20), ("2G", 2 << 30)])
def test_size_settings_take_suffixes(
    clean_env: pytest.MonkeyPatch, name: str, field: str, text: str, expected: int
) -> None:
    assert name in config.SIZE_VARIABLES
    clean_env.setenv(name, text)
    assert getattr(config.settings(), field) == expected


@pytest.mark.parametrize("name", config.SIZE_VARIABLES)
@pytest.mark.parametrize("text", ["4X", "1.3", "-4M"])
def test_a_malformed_size_names_its_variable(
    clean_env: pytest.MonkeyPatch, name: str, text: str
) -> None:
    clean_env.setenv(name, text)
    with pytest.raises(ValueError, match=f"^{name}='{re.escape(text)}': invalid size"):
        config.settings()


def test_a_size_below_its_minimum_names_its_variable(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("COCCL_STAGING_LIMIT_BYTES", "512K")
    with pytest.raises(ValueError, match="COCCL_STAGING_LIMIT_BYTES='512K' must be >= 1048576"):
        config.settings()
    clean_env.setenv("COCCL_STAGING_LIMIT_BYTES", "1M")
    assert config.settings().staging_limit_bytes == 1 << 20


def test_pipeline_depth_is_bounded(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("COCCL_PIPELINE_DEPTH", str(config.MAX_PIPELINE_DEPTH + 1))
    with pytest.raises(
        ValueError, match=f"COCCL_PIPELINE_DEPTH=.* must be <= {config.MAX_PIPELINE_DEPTH}"
    ):
        config.settings()
    clean_env.setenv("COCCL_PIPELINE_DEPTH", str(config.MAX_PIPELINE_DEPTH))
    assert config.settings().pipeline_depth == config.MAX_PIPELINE_DEPTH


def test_chunk_bytes_set_only_when_given(clean_env: pytest.MonkeyPatch) -> None:
    assert not config.settings().chunk_bytes_set
    clean_env.setenv("COCCL_CHUNK_BYTES", "1M")
    env = config.settings()
    assert env.chunk_bytes_set and env.chunk_bytes == 1 << 20


# --------------------------------------------------------------- unknown names
@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("COCCL_CHUNKBYTES", "COCCL_CHUNK_BYTES"),
        ("COCCL_TIMEOUT", "COCCL_TIMEOUT_S"),
        ("COCCL_GRAPH", "COCCL_GRAPHS"),
        ("COCCL_PIPELINE_DEPT", "COCCL_PIPELINE_DEPTH"),
    ],
)
def test_an_unknown_name_warns_naming_the_closest(
    clean_env: pytest.MonkeyPatch, typo: str, meant: str
) -> None:
    clean_env.setenv(typo, "1")
    with pytest.warns(UserWarning, match=f"{typo} is not a coccl setting.*did you mean {meant}"):
        config.settings()


def test_an_unknown_name_far_from_every_setting_still_warns(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("COCCL_XYZZY", "1")
    with pytest.warns(UserWarning, match="COCCL_XYZZY is not a coccl setting"):
        config.settings()


def test_each_unknown_name_warns_once_per_reading(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("COCCL_CHUNKBYTES", "1")
    clean_env.setenv("COCCL_LOGG", "debug")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config.settings()
    messages = sorted(str(w.message) for w in caught)
    assert len(messages) == 2
    assert messages[0].startswith("COCCL_CHUNKBYTES") and "COCCL_CHUNK_BYTES" in messages[0]
    assert messages[1].startswith("COCCL_LOGG") and "COCCL_LOG?" in messages[1]


def own_names() -> set[str]:
    """Every COCCL_* name written in the repository's Python files (tests, bench, tools,
    examples), except the ones tests/test_config.py makes up."""
    names: set[str] = set()
    for path in ROOT.rglob("*.py"):
        if ".venv" in path.parts or path.name == "test_config.py":
            continue
        names |= set(re.findall(r"\bCOCCL_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    return names


def test_our_own_names_do_not_warn(clean_env: pytest.MonkeyPatch) -> None:
    """The settings, and what coccl's tests, bench and launchers set for their children
    (COCCL_UNDER_MPIEXEC, COCCL_SOAK_CALLS, COCCL_BENCH_*), are no typos."""
    names = own_names()
    assert {"COCCL_UNDER_MPIEXEC", "COCCL_BENCH_COMMAND", "COCCL_CHUNK_BYTES"} <= names
    assert config.unknown_variables(dict.fromkeys(names, "")) == []
    for name in config.SIZE_VARIABLES:
        clean_env.setenv(name, "4M")
    clean_env.setenv("COCCL_UNDER_MPIEXEC", "1")
    clean_env.setenv("COCCL_BENCH_NP", "2")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config.settings()


def test_other_prefixes_are_not_ours() -> None:
    assert config.unknown_variables({"COCCLX": "1", "NCCL_DEBUG": "INFO", "coccl_x": ""}) == []


# ------------------------------------------------------------------ log lines
@pytest.fixture
def coccl_log(clean_env: pytest.MonkeyPatch):
    """The coccl logger configured as COCCL_LOG=debug does, restored afterwards."""
    logger = logging.getLogger("coccl")
    saved_handlers, saved_level = list(logger.handlers), logger.level
    logger.handlers = [h for h in logger.handlers if not getattr(h, "coccl_handler", False)]
    config.set_log_rank(None)
    config.configure_logging("debug")
    (handler,) = [h for h in logger.handlers if getattr(h, "coccl_handler", False)]
    yield handler
    config.set_log_rank(None)
    logger.handlers, logger.level = saved_handlers, saved_level


def format_line(handler: logging.Handler, logger_name: str = "coccl.communicator") -> str:
    """What the handler writes for a debug record of ``logger_name``."""
    record = logging.getLogger(logger_name).makeRecord(
        logger_name, logging.DEBUG, __file__, 1, "a path was taken", (), None
    )
    assert handler.filter(record)
    return handler.format(record)


def test_log_lines_name_host_pid_and_rank(
    coccl_log: logging.Handler, clean_env: pytest.MonkeyPatch
) -> None:
    host = socket.gethostname().split(".")[0]
    assert format_line(coccl_log) == (
        f"{host}:{os.getpid()}:- coccl DEBUG coccl.communicator: a path was taken"
    )
    config.set_log_rank(3)
    assert format_line(coccl_log).startswith(f"{host}:{os.getpid()}:3 coccl DEBUG ")
    config.set_log_rank(None)
    assert format_line(coccl_log).startswith(f"{host}:{os.getpid()}:- ")


@pytest.mark.parametrize("variable", ["RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"])
def test_the_launchers_rank_is_the_processs_rank(
    coccl_log: logging.Handler, clean_env: pytest.MonkeyPatch, variable: str
) -> None:
    """Under torchrun or mpiexec a line names the world rank, also before (and beside)
    any communicator of a subgroup: the same on every line of one process."""
    clean_env.setenv(variable, "5")
    config.set_log_rank(1)
    assert format_line(coccl_log).split(" ")[0].endswith(":5")
    assert config.log_rank() == "5"


def test_every_coccl_logger_gets_the_prefix(coccl_log: logging.StreamHandler) -> None:
    """The filter sits on the handler: records of child loggers (coccl.plans, ...) pass
    through it too, not only the 'coccl' logger's own."""
    stream = io.StringIO()
    coccl_log.setStream(stream)
    config.set_log_rank(2)
    logging.getLogger("coccl.plans").debug("a plan was built")
    err = stream.getvalue().strip().splitlines()[-1]
    assert re.fullmatch(r"\S+:\d+:2 coccl DEBUG coccl\.plans: a plan was built", err), err


def test_configure_logging_adds_one_handler(coccl_log: logging.Handler) -> None:
    config.configure_logging("info")
    ours = [h for h in logging.getLogger("coccl").handlers if getattr(h, "coccl_handler", 0)]
    assert ours == [coccl_log] and logging.getLogger("coccl").level == logging.INFO
