"""What the study controller reports as it goes; the CLI renders it with rich."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cleanslate.store import TrialRecord
    from cleanslate.tune.study import StudySpec


class TuneView:
    """Hooks called by :func:`cleanslate.tune.controller.run_study`; the default does nothing."""

    def study_started(self, spec: StudySpec, total: int, done: int) -> None: ...

    def trial_started(self, index: int, total: int, number: int,
                      params: dict[str, Any]) -> None: ...

    def phase(self, message: str) -> None: ...

    def trial_finished(self, record: TrialRecord, best: TrialRecord | None) -> None: ...
