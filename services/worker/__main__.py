"""`python -m inferbus.services.worker` (or `inferbus serve worker`): run one worker."""

from collections.abc import Sequence

from inferbus.shared import runtime

from .service import WorkerService, WorkerSettings


def main(argv: Sequence[str] | None = None) -> None:
    runtime.main(WorkerService, WorkerSettings, argv)


if __name__ == "__main__":
    main()
