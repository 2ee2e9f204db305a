"""The device is busy for a moment: back off and try again."""

import time

import daifu


@daifu.on(RuntimeError, where="train")
def wait_for_device(crash):
    if "device busy" not in str(crash.exception) or crash.attempt > 4:
        return None
    time.sleep(0.1 * 2 ** (crash.attempt - 1))  # 0.1, 0.2, 0.4, 0.8 s
    return daifu.RETRY
