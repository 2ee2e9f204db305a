"""A record that cannot be read is restored from its replica, then the
failing ``for`` header is retried: RETRY at a DataLoader loop header fetches
**the same batch** again (the same indices), so no data is lost and the run
equals the corrected one -- through tqdm's generator, which died with the
exception (the loop goes on over the DataLoader iterator it was reading)."""

import re

import daifu


@daifu.on(ValueError, where="train_epoch")
def restore_and_retry(crash):
    # (from a worker process, the message quotes the worker's traceback)
    found = re.search(r"truncated record (\d+)", str(crash.exception))
    if crash.kind != "loop-header" or found is None:
        return None
    crash.vars["loader"].dataset.restore_from_replica(int(found.group(1)))
    return daifu.RETRY
