"""The agent's configuration: the `BATON_*` environment (DESIGN §5) plus the agent's own knobs.

Every value is read through a small typed helper that fails with a message naming the
variable, so a mistake in the capacity backend's set-up shows up as one clear line and a
non-zero exit instead of a half-working agent.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

MODES = ("sdk", "directory")


class ConfigError(ValueError):
    """A configuration value is missing or invalid; the message names the variable."""

    def __init__(self, variable: str, problem: str) -> None:
        super().__init__(f"{variable}: {problem}")
        self.variable = variable
        self.problem = problem


@dataclass(frozen=True)
class AgentConfig:
    """Everything the agent needs, validated. Built by `load_config`."""

    job_id: str
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    checkpoint_dir: Path
    store_url: str
    s3_endpoint: str
    resume: str
    checkpoint_every_steps: int | None
    checkpoint_every_seconds: float | None
    metadata_url: str
    portal_url: str
    agent_token: str
    mode: str
    command: tuple[str, ...]
    agent_dir: Path
    log_dir: Path
    poll_interval: float = 1.0
    heartbeat_interval: float = 10.0
    final_signal: signal.Signals = signal.SIGTERM
    signal_group: bool = False
    safety_margin: float = 5.0
    grace_period: float = 30.0
    default_window: float = 120.0
    sync_interval: float = 5.0
    step_file: str = ""
    resume_args: tuple[str, ...] = ()
    total_steps: int | None = None
    progress_pattern: re.Pattern[str] = field(
        default_factory=lambda: re.compile(r"\bstep[= ](\d+)")
    )
    listener_max_restarts: int = 5
    listener_restart_window: float = 60.0
    event_buffer: int = 10_000
    log_buffer: int = 10_000
    log_batch: int = 500
    log_flush_interval: float = 1.0
    max_line_chars: int = 4000
    portal_timeout: float = 5.0
    flush_timeout: float = 10.0
    echo_output: bool = False
    log_level: str = "INFO"

    def workload_command(self, resumed: bool = False) -> list[str]:
        """The command (plus the resume arguments when a checkpoint was put in place) with
        `{checkpoint_dir}` replaced by the checkpoint folder."""
        folder = str(self.checkpoint_dir)
        parts = [*self.command, *self.resume_args] if resumed else self.command
        return [part.replace("{checkpoint_dir}", folder) for part in parts]


class _Env:
    """Typed readers over one environment mapping; each error names its variable."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ

    def text(self, name: str, default: str = "") -> str:
        return self.environ.get(name, default).strip() or default

    def required(self, name: str) -> str:
        value = self.text(name)
        if not value:
            raise ConfigError(name, "is required and not set")
        return value

    def integer(
        self, name: str, default: int | None, minimum: int = 0, maximum: int | None = None
    ) -> int | None:
        raw = self.text(name)
        if not raw:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(name, f"must be a whole number, got {raw!r}") from None
        if value < minimum:
            raise ConfigError(name, f"must be at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise ConfigError(name, f"must be at most {maximum}, got {value}")
        return value

    def seconds(self, name: str, default: float | None, positive: bool = False) -> float | None:
        raw = self.text(name)
        if not raw:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(name, f"must be a number of seconds, got {raw!r}") from None
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            bound = "greater than 0" if positive else "0 or more"
            raise ConfigError(name, f"must be {bound}, got {raw!r}")
        return value

    def boolean(self, name: str, default: bool) -> bool:
        raw = self.text(name).lower()
        if not raw:
            return default
        if raw in ("1", "true", "yes", "on"):
            return True
        if raw in ("0", "false", "no", "off"):
            return False
        raise ConfigError(name, f"must be true or false, got {raw!r}")

    def url(self, name: str, default: str = "", schemes: Sequence[str] = ("http", "https")) -> str:
        value = self.text(name, default)
        if not value:
            return ""
        parsed = urlparse(value)
        if parsed.scheme not in schemes or not (parsed.netloc or parsed.scheme == "file"):
            raise ConfigError(
                name, f"must be a URL starting with {' or '.join(s + '://' for s in schemes)}"
            )
        return value.rstrip("/") if parsed.scheme in ("http", "https") else value


def parse_signal(name: str, raw: str) -> signal.Signals:
    """`TERM`, `SIGTERM` or `15` -> signal.SIGTERM; a ConfigError naming `name` otherwise."""
    text = raw.strip().upper()
    try:
        if text.isdigit():
            return signal.Signals(int(text))
        return signal.Signals[text if text.startswith("SIG") else "SIG" + text]
    except (KeyError, ValueError):
        raise ConfigError(name, f"is not a signal name or number: {raw!r}") from None


def _string_list(env: _Env, name: str, empty_ok: bool) -> tuple[str, ...] | None:
    """A JSON list of non-empty strings in variable `name`; None when it is not set."""
    raw = env.text(name)
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(name, f"is not valid JSON ({exc.msg})") from None
    if (
        not isinstance(value, list)
        or not (value or empty_ok)
        or not all(isinstance(part, str) and part for part in value)
    ):
        raise ConfigError(name, f"must be a{'' if empty_ok else ' non-empty'} JSON list of strings")
    return tuple(value)


def _command(env: _Env, argv: Sequence[str]) -> tuple[str, ...]:
    """The workload command: after `--` on the command line, else BATON_AGENT_COMMAND (JSON)."""
    if argv:
        return tuple(argv)
    command = _string_list(env, "BATON_AGENT_COMMAND", empty_ok=False)
    if command is None:
        raise ConfigError(
            "BATON_AGENT_COMMAND",
            "no workload command: give it after `--` or as a JSON list in BATON_AGENT_COMMAND",
        )
    return command


def load_config(environ: Mapping[str, str] | None = None, argv: Sequence[str] = ()) -> AgentConfig:
    """Read and validate the configuration; raise ConfigError naming the first bad variable.

    `argv` is the workload command given after `--` on the agent's command line.
    """
    env = _Env(os.environ if environ is None else environ)
    job_id = env.required("BATON_JOB_ID")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", job_id):
        raise ConfigError("BATON_JOB_ID", "must be letters, digits, '.', '_' or '-'")
    world_size = env.integer("BATON_WORLD_SIZE", 1, minimum=1)
    rank = env.integer("BATON_RANK", 0)
    assert world_size is not None and rank is not None
    if rank >= world_size:
        raise ConfigError("BATON_RANK", f"must be below BATON_WORLD_SIZE ({world_size})")
    mode = env.text("BATON_AGENT_MODE", "directory").lower()
    if mode not in MODES:
        raise ConfigError("BATON_AGENT_MODE", f"must be one of {', '.join(MODES)}, got {mode!r}")

    agent_dir = Path(
        env.text("BATON_AGENT_DIR") or Path.cwd() / ".baton-agent" / f"job-{job_id}-rank-{rank}"
    ).absolute()
    log_dir = Path(env.text("BATON_AGENT_LOG_DIR") or agent_dir / "logs").absolute()
    checkpoint_dir = Path(env.text("BATON_CHECKPOINT_DIR") or agent_dir / "checkpoint").absolute()

    store_url = env.url("BATON_STORE_URL", schemes=("file", "s3"))
    if mode == "directory" and not store_url:
        raise ConfigError("BATON_STORE_URL", "is required in directory mode")
    if store_url.startswith("file:") and not re.match(r"file://(localhost)?/.", store_url):
        raise ConfigError(
            "BATON_STORE_URL",
            f"{store_url!r} is not an absolute folder: use file:///absolute/path "
            "(three slashes; for a folder here, file://$PWD/store)",
        )
    portal_url = env.url("BATON_PORTAL_URL")
    token = env.text("BATON_AGENT_TOKEN")
    if portal_url and not token:
        raise ConfigError("BATON_AGENT_TOKEN", "is required when BATON_PORTAL_URL is set")

    pattern_text = env.text("BATON_AGENT_PROGRESS_PATTERN", r"\bstep[= ](\d+)")
    try:
        pattern = re.compile(pattern_text)
    except re.error as exc:
        raise ConfigError("BATON_AGENT_PROGRESS_PATTERN", f"is not a valid regex ({exc})") from None
    if pattern.groups < 1:
        raise ConfigError("BATON_AGENT_PROGRESS_PATTERN", "needs a group that captures the step")

    log_level = env.text("BATON_AGENT_LOG_LEVEL", "INFO").upper()
    if log_level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError("BATON_AGENT_LOG_LEVEL", "must be DEBUG, INFO, WARNING or ERROR")

    def seconds(name: str, default: float, positive: bool = False) -> float:
        value = env.seconds(name, default, positive=positive)
        assert value is not None
        return value

    def integer(name: str, default: int, minimum: int) -> int:
        value = env.integer(name, default, minimum=minimum)
        assert value is not None
        return value

    return AgentConfig(
        job_id=job_id,
        rank=rank,
        world_size=world_size,
        master_addr=env.text("BATON_MASTER_ADDR", "127.0.0.1"),
        master_port=env.integer("BATON_MASTER_PORT", 29500, minimum=1, maximum=65535) or 29500,
        checkpoint_dir=checkpoint_dir,
        store_url=store_url,
        s3_endpoint=env.url("BATON_S3_ENDPOINT"),
        resume=env.text("BATON_RESUME"),
        checkpoint_every_steps=env.integer("BATON_CHECKPOINT_EVERY_STEPS", None),
        checkpoint_every_seconds=env.seconds("BATON_CHECKPOINT_EVERY_SECONDS", None),
        metadata_url=env.url("BATON_METADATA_URL", "http://169.254.169.254"),
        portal_url=portal_url,
        agent_token=token,
        mode=mode,
        command=_command(env, argv),
        agent_dir=agent_dir,
        log_dir=log_dir,
        poll_interval=seconds("BATON_AGENT_POLL_INTERVAL", 1.0, positive=True),
        heartbeat_interval=seconds("BATON_AGENT_HEARTBEAT_INTERVAL", 10.0, positive=True),
        final_signal=parse_signal(
            "BATON_AGENT_FINAL_SIGNAL", env.text("BATON_AGENT_FINAL_SIGNAL", "SIGTERM")
        ),
        signal_group=env.boolean("BATON_AGENT_SIGNAL_GROUP", False),
        safety_margin=seconds("BATON_AGENT_SAFETY_MARGIN", 5.0),
        grace_period=seconds("BATON_AGENT_GRACE_PERIOD", 30.0),
        default_window=seconds("BATON_AGENT_DEFAULT_WINDOW", 120.0, positive=True),
        sync_interval=seconds("BATON_AGENT_SYNC_INTERVAL", 5.0),
        step_file=env.text("BATON_AGENT_STEP_FILE"),
        resume_args=_string_list(env, "BATON_AGENT_RESUME_ARGS", empty_ok=True) or (),
        total_steps=env.integer("BATON_AGENT_TOTAL_STEPS", None, minimum=1),
        progress_pattern=pattern,
        listener_max_restarts=integer("BATON_AGENT_LISTENER_MAX_RESTARTS", 5, minimum=0),
        listener_restart_window=seconds("BATON_AGENT_LISTENER_RESTART_WINDOW", 60.0, True),
        event_buffer=integer("BATON_AGENT_EVENT_BUFFER", 10_000, minimum=10),
        log_buffer=integer("BATON_AGENT_LOG_BUFFER", 10_000, minimum=1),
        # The portal takes at most 5000 lines in one request.
        log_batch=env.integer("BATON_AGENT_LOG_BATCH", 500, minimum=1, maximum=5000) or 500,
        log_flush_interval=seconds("BATON_AGENT_LOG_FLUSH_INTERVAL", 1.0, positive=True),
        # 4000: what the portal keeps of a line, so the "characters cut" note survives.
        max_line_chars=integer("BATON_AGENT_MAX_LINE", 4000, minimum=80),
        portal_timeout=seconds("BATON_AGENT_PORTAL_TIMEOUT", 5.0, positive=True),
        flush_timeout=seconds("BATON_AGENT_FLUSH_TIMEOUT", 10.0),
        echo_output=env.boolean("BATON_AGENT_ECHO", False),
        log_level=log_level,
    )


def workload_environment(
    config: AgentConfig, agent_url: str, base: Mapping[str, str], resumed: bool = False
) -> dict[str, str]:
    """The environment the workload runs with: `base` plus the BATON_* variables of DESIGN §5."""
    # The token stays with the agent: the workload is user code and needs no portal credential.
    env = {k: v for k, v in base.items() if k not in ("BATON_AGENT_TOKEN", "BATON_AGENT_COMMAND")}
    env.update(
        {
            "BATON_JOB_ID": config.job_id,
            "BATON_RANK": str(config.rank),
            "BATON_WORLD_SIZE": str(config.world_size),
            "BATON_MASTER_ADDR": config.master_addr,
            "BATON_MASTER_PORT": str(config.master_port),
            "BATON_CHECKPOINT_DIR": str(config.checkpoint_dir),
            "BATON_STORE_URL": config.store_url,
            "BATON_S3_ENDPOINT": config.s3_endpoint,
            "BATON_RESUME": config.resume,
            "BATON_AGENT_URL": agent_url,
            "BATON_RESUMED": "1" if resumed else "0",
            # Python workloads otherwise block-buffer a pipe, and the log would lag by kilobytes.
            "PYTHONUNBUFFERED": "1",
        }
    )
    if config.checkpoint_every_steps is not None:
        env["BATON_CHECKPOINT_EVERY_STEPS"] = str(config.checkpoint_every_steps)
    if config.checkpoint_every_seconds is not None:
        env["BATON_CHECKPOINT_EVERY_SECONDS"] = f"{config.checkpoint_every_seconds:g}"
    return env
