"""`python -m inferbus.services.scheduler` (or `inferbus serve scheduler`): run one scheduler."""

from collections.abc import Sequence

from inferbus.shared import runtime

from .service import SchedulerService, SchedulerSettings


def main(argv: Sequence[str] | None = None) -> None:
    runtime.main(SchedulerService, SchedulerSettings, argv)


if __name__ == "__main__":
    main()
