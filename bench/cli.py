"""``coccl-bench``: the command-line entry point and its registry of subcommands.

A subcommand is a function ``run(args) -> exit status`` registered with ``@command``,
which also names a function adding its own arguments to its parser. Subcommands live
in their own modules; a module joins the tool by being listed in ``COMMAND_MODULES``
(one line). Commands marked ``mpi=True`` run on every rank of an MPI job and take
``--np N`` to launch that job themselves (see ``coccl.bench.launch``).

    coccl-bench allreduce --np 4 -b 8 -e 64M -f 4 --algorithm ring,two_shot
    mpiexec -n 4 coccl-bench reduce_scatter -b 1K -e 1M --compressor identity,taco
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import ml_dtypes
import numpy as np

import coccl
from coccl import config

from . import launch

# Modules whose import registers subcommands (each decorates its runners with @command).
COMMAND_MODULES: tuple[str, ...] = (
    "coccl.bench.collective",
    "coccl.bench.exchange",
    "coccl.bench.codec",
    "coccl.bench.fidelity",
    "coccl.bench.tp_step",
)

ArgumentAdder = Callable[[argparse.ArgumentParser], None]
Runner = Callable[[argparse.Namespace], int]
Validator = Callable[[argparse.Namespace], str | None]


@dataclass(frozen=True)
class Command:
    """A registered subcommand.

    Attributes:
        name: the subcommand as typed (``allreduce``).
        help: one line for ``coccl-bench --help``.
        add_arguments: adds the subcommand's options to its parser.
        run: runs it; returns the process exit status.
        mpi: whether it runs on MPI ranks (then it also takes ``--np N``).
        validate: checks the parsed arguments together; returns what is wrong, if
            anything, and ``coccl-bench`` exits with that as a usage error.
    """

    name: str
    help: str
    add_arguments: ArgumentAdder
    run: Runner
    mpi: bool
    validate: Validator | None


COMMANDS: dict[str, Command] = {}


def command(
    name: str,
    *,
    help: str,
    arguments: ArgumentAdder,
    mpi: bool = True,
    validate: Validator | None = None,
) -> Callable[[Runner], Runner]:
    """Register the decorated ``run(args) -> int`` as subcommand ``name``.

    Args:
        name: the subcommand's name.
        help: one-line description.
        arguments: ``arguments(parser)`` adds the subcommand's options.
        mpi: the command runs on MPI ranks and accepts ``--np N`` to launch them.
        validate: ``validate(args)`` returns a message for inconsistent arguments.

    Raises:
        ValueError: ``name`` is registered already.
    """

    def register(run: Runner) -> Runner:
        if name in COMMANDS:
            raise ValueError(f"coccl-bench subcommand {name!r} is registered twice")
        COMMANDS[name] = Command(name, help, arguments, run, mpi, validate)
        return run

    return register


def parse_size(text: str) -> int:
    """argparse type: a byte count with an optional binary suffix, as nccl-tests reads
    it: ``8``, ``1K`` = 1024, ``64M``, ``1G``, also ``4KiB`` / ``2MB`` (binary too);
    the same parser as the ``COCCL_*`` sizes (``coccl.config.parse_size``).

    Raises:
        argparse.ArgumentTypeError: not a non-negative size.
    """
    try:
        return config.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def comma_list(text: str) -> list[str]:
    """argparse type: ``"ring, two_shot"`` -> ``["ring", "two_shot"]`` (repeats dropped)."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"invalid list {text!r}: give comma-separated names")
    return list(dict.fromkeys(items))


# -d takes numpy's names and nccl-tests' (float, half, double, int).
DTYPES = (
    "float32", "float16", "bfloat16", "float64",
    "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
)  # fmt: skip
_DTYPE_ALIASES = {"float": "float32", "half": "float16", "double": "float64", "int": "int32"}


def datatype(text: str) -> np.dtype:
    """argparse type: a dtype name (``float32``, ``bfloat16``, ``half``...)."""
    name = _DTYPE_ALIASES.get(text, text)
    if name not in DTYPES:
        raise argparse.ArgumentTypeError(
            f"invalid datatype {text!r}: choose from {', '.join(DTYPES)}"
        )
    if name == "bfloat16":
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _load_commands() -> None:
    for module in COMMAND_MODULES:
        importlib.import_module(module)


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Help that ends every option's text with its default, written as it would be typed
    (``1K``, ``identity,int8,taco``, ``float32``), unless the text already says
    ``(default...)`` itself (a default that depends on other flags)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        shown = default_text(action.default)
        if shown is None or "(default" in text or not action.option_strings:
            return text
        return f"{text} (default: {shown})".strip()


def default_text(value: object) -> str | None:
    """How a default reads in ``--help``; None when there is nothing to show (no default,
    a flag that is off)."""
    if value is None or value is argparse.SUPPRESS or value is False:
        return None
    if isinstance(value, np.dtype):
        return value.name
    if isinstance(value, (list, tuple)):
        return ",".join(str(item) for item in value)
    return str(value).replace("%", "%%")


def build_parser() -> argparse.ArgumentParser:
    """The ``coccl-bench`` parser with one subparser per registered command."""
    _load_commands()
    parser = argparse.ArgumentParser(
        prog="coccl-bench",
        description="Benchmarks of coccl's collectives and codecs (nccl-tests style).",
        allow_abbrev=False,
    )
    parser.add_argument(
        "--version", action="version", version=f"coccl-bench (coccl {coccl.__version__})"
    )
    sub = parser.add_subparsers(dest="command", metavar="<command>", required=True)
    for cmd in COMMANDS.values():
        p = sub.add_parser(
            cmd.name,
            help=cmd.help,
            description=cmd.help,
            allow_abbrev=False,
            formatter_class=DefaultsHelpFormatter,
        )
        cmd.add_arguments(p)
        p.set_defaults(subparser=p)
        if cmd.mpi:
            p.add_argument(
                "--np",
                type=positive_int,
                metavar="N",
                help="launch N ranks with mpiexec (instead of running under mpiexec)",
            )
            p.add_argument(
                "--mpiexec",
                metavar="CMD",
                help="the launcher --np runs, e.g. 'mpiexec' (the system's, on PATH) or "
                "'srun --mpi=pmix' (default: the mpiexec beside this Python, installed by "
                "the mpich wheel, else the first on PATH)",
            )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``coccl-bench``; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    # Unknown flags are answered with the usage of the subcommand they were given to
    # (argparse's own answer would show the top-level usage, which lists no flags).
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        args.subparser.error(f"unrecognized arguments: {' '.join(unknown)}")
    cmd = COMMANDS[args.command]
    problem = cmd.validate(args) if cmd.validate is not None else None
    if problem:
        args.subparser.error(problem)
    if cmd.mpi and args.mpiexec is not None and args.np is None:
        args.subparser.error("--mpiexec names the launcher of --np N: give --np too")
    if cmd.mpi and args.np is not None:
        if launch.under_mpiexec():
            parser.error("--np starts its own mpiexec; leave it out under mpiexec")
        try:
            return launch.relaunch(args.np, argv, args.mpiexec)
        except (OSError, RuntimeError) as exc:  # no such launcher, or none found
            args.subparser.error(f"--np {args.np}: cannot start the launcher: {exc}")
    args.argv = argv  # what the record calls the command
    if not cmd.mpi:
        return cmd.run(args)
    return _run_on_ranks(cmd, args)


def _run_on_ranks(cmd: Command, args: argparse.Namespace) -> int:
    """Run an MPI command; an exception on one rank aborts the whole job (as
    ``python -m mpi4py`` does), so that the other ranks do not wait for it forever. A
    child of ``--np N`` that is not in a world of N ranks says why and stops."""
    from mpi4py import MPI  # noqa: PLC0415

    problem = launch.world_mismatch(MPI.COMM_WORLD.Get_size())
    if problem:
        print(f"coccl-bench: error: {problem}", file=sys.stderr, flush=True)
        MPI.Finalize()  # so that ``python -m mpi4py`` exits quietly, without MPI_Abort
        return 2
    try:
        return cmd.run(args)
    except Exception:
        from mpi4py import MPI  # noqa: PLC0415

        if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1:
            traceback.print_exc()
            sys.stderr.flush()
            MPI.COMM_WORLD.Abort(1)
        raise


if __name__ == "__main__":
    # Run as a script (``python -m coccl.bench.cli``), this file is ``__main__``, a second
    # copy of the module; commands register into the importable ``coccl.bench.cli``.
    from coccl.bench.cli import main as _main

    sys.exit(_main())
