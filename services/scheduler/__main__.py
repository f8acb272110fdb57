from inferbus.shared.runtime import main

from .service import SchedulerService, SchedulerSettings

if __name__ == "__main__":
    main(SchedulerService, SchedulerSettings)
