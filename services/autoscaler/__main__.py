"""`python -m inferbus.services.autoscaler` (or `inferbus serve autoscaler`): run the autoscaler."""

from collections.abc import Sequence

from inferbus.shared import runtime

from .service import AutoscalerService, AutoscalerSettings


def main(argv: Sequence[str] | None = None) -> None:
    runtime.main(AutoscalerService, AutoscalerSettings, argv)


if __name__ == "__main__":
    main()
