"""`python -m inferbus.services.gateway` (or `inferbus serve gateway`): run one gateway."""

from collections.abc import Sequence

from inferbus.shared import runtime

from .service import GatewayService, GatewaySettings


def main(argv: Sequence[str] | None = None) -> None:
    runtime.main(GatewayService, GatewaySettings, argv)


if __name__ == "__main__":
    main()
