from inferbus.shared.runtime import main

from .service import GatewayService, GatewaySettings

if __name__ == "__main__":
    main(GatewayService, GatewaySettings)
