"""A transient I/O error: read the batch again."""

import daifu


@daifu.on(OSError, where="train")
def reread(crash):
    if "transient" not in str(crash.exception) or crash.attempt > 3:
        return None
    return daifu.RETRY
