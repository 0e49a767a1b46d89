"""`python -m migration.agent [--] COMMAND...` (also `baton-agent`): run one instance's agent.

`baton-agent rehearse [OPTIONS] -- COMMAND...` rehearses an interruption (see rehearse.py).

The configuration comes from the environment (see docs/instance-side.md, "Agent"); the
workload command is given after `--` or as a JSON list in BATON_AGENT_COMMAND.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from migration.agent.config import ConfigError, load_config
from migration.agent.runner import EXIT_CONFIG, Agent

logger = logging.getLogger("migration.agent")

_EPILOG = """\
exit status: 0 finished, 1 failed, 2 bad configuration, 3 restore failed, 75 preempted.
Configuration: the BATON_* environment; see docs/instance-side.md ("Agent").
`baton-agent rehearse --help`: try an interruption of COMMAND before a real one comes."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="baton-agent",
        description="Run a training command on a spot instance: listen for interruption "
        "notices, supervise the command, sync its checkpoints, report to the portal.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, help="the workload command, after `--`"
    )
    return parser


def _setup_logging(level: str, log_file: str | None = None) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file, encoding="utf-8"))
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(level)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `baton-agent`; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "rehearse":
        from migration.agent.rehearse import main as rehearse

        _setup_logging("INFO")
        return rehearse(args[1:])
    if args and args[0] == "--":
        command = args[1:]
    else:
        command = _parser().parse_args(args).command
        if command and command[0] == "--":
            command = command[1:]
    _setup_logging("INFO")
    try:
        config = load_config(argv=command)
    except ConfigError as exc:
        logger.error("configuration error: %s", exc)
        return EXIT_CONFIG
    for variable, folder in (
        ("BATON_AGENT_DIR", config.agent_dir),
        ("BATON_AGENT_LOG_DIR", config.log_dir),
        ("BATON_CHECKPOINT_DIR", config.checkpoint_dir),
    ):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            logger.error("configuration error: %s: cannot create %s (%s)", variable, folder, exc)
            return EXIT_CONFIG
    _setup_logging(config.log_level, str(config.log_dir / f"agent-rank-{config.rank}.log"))
    return Agent(config).run()


if __name__ == "__main__":
    sys.exit(main())
