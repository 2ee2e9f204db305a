"""A sample that cannot be loaded: the failing ``for`` header asks the same
DataLoader iterator for its next batch, so the batch that holds the corrupt
record is skipped and the epoch goes on.  With worker processes the
iterator survives the error too: the worker that failed to decode the record
goes on with its next batch."""

import daifu


@daifu.on(ValueError, where="train_epoch")
def skip_corrupt_batch(crash):
    if crash.kind != "loop-header" or "corrupt sample" not in str(crash.exception):
        return None
    return daifu.RETRY
