"""A transient I/O error in the trainer's loop: read the batch again."""

import daifu


@daifu.on(OSError, where="Trainer.run")
def reread(crash):
    if "transient" not in str(crash.exception) or crash.attempt > 3:
        return None
    return daifu.RETRY
