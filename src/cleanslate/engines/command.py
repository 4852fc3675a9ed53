"""``command``: any server started by an argv template with a ``{port}`` placeholder.

``argv`` is required, for example ``["my-server", "--listen", "0.0.0.0:{port}", "{model}"]``;
in a server or study file it is the ``argv:`` key (``engine: command``). ``{port}`` must appear
(cleanslate has to know where the server listens); ``{model}`` and ``{host}`` are replaced where
they appear. The user's flags are appended after the template. There is no help command to
validate flags against (unless ``help_argv`` is given) and no process signature: teardown of
such a run relies on its recorded PIDs, its cgroup and its ``CLEANSLATE_RUN`` marker; a process
found only by its group or session number must hold the run's port or GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence

from cleanslate.engines._base import EngineAdapter, Leftovers, register_engine
from cleanslate.engines._flags import Flags, flag_args
from cleanslate.errors import InputError


@register_engine
class CommandEngine(EngineAdapter):
    name = "command"
    description = "any server, from an argv template with {port} and {model} placeholders"
    default_port = 8000
    reserved_flags = ()
    leftovers = Leftovers()
    argv_template = True

    def __init__(
        self,
        *,
        argv: Sequence[str] | None = None,
        readiness_path: str | None = None,
        default_port: int | None = None,
        supports_chat: bool = True,
        supports_completions: bool = True,
        help_argv: Sequence[str] | None = None,
    ) -> None:
        if not argv:
            raise InputError(
                "engine command needs an argv template",
                where="argv",
                hint='e.g. argv: ["my-server", "--port", "{port}", "--model", "{model}"]',
            )
        template = [str(part) for part in argv]
        if not any("{port}" in part for part in template):
            raise InputError(
                "engine command: the argv template has no {port} placeholder",
                where="argv",
                hint="cleanslate must know the port the server listens on: put {port} in argv",
            )
        super().__init__(launch=template, readiness_path=readiness_path)
        self.template = tuple(template)
        if default_port is not None:
            self.default_port = default_port  # type: ignore[misc]
        self.supports_chat = supports_chat  # type: ignore[misc]
        self.supports_completions = supports_completions  # type: ignore[misc]
        self._help_argv = list(help_argv) if help_argv else None

    def default_launch(self) -> tuple[str, ...]:
        return self.template

    def build_argv(
        self,
        model: str,
        port: int | None = None,
        flags: Flags | None = None,
        *,
        host: str | None = None,
    ) -> list[str]:
        port = self.default_port if port is None else port
        if not 0 < int(port) < 65536:
            raise InputError(f"engine command: port {port} is out of range 1-65535")
        values = {"{port}": str(int(port)), "{model}": model, "{host}": host or "127.0.0.1"}
        argv = []
        for part in self.template:
            for key, value in values.items():
                part = part.replace(key, value)
            argv.append(part)
        return argv + flag_args(flags)

    def help_argv(self) -> list[str] | None:
        return self._help_argv
