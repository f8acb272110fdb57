"""`python -m inferbus.services.delivery` (or `inferbus serve delivery`): run it."""

from collections.abc import Sequence

from inferbus.shared import runtime

from .service import DeliveryService, DeliverySettings


def main(argv: Sequence[str] | None = None) -> None:
    runtime.main(DeliveryService, DeliverySettings, argv)


if __name__ == "__main__":
    main()
