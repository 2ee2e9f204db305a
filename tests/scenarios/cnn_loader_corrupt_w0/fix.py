"""A sample that cannot be loaded: the batch that holds the corrupt record is
dropped (``CONTINUE`` at the failing ``for`` header: the same DataLoader
iterator goes on with its next batch) and the epoch goes on.  With worker
processes the iterator survives the error too: the worker that failed to
decode the record goes on with its next batch.  (``RETRY`` would fetch the
same batch again -- see cnn_loader_repair_w0.)"""

import daifu


@daifu.on(ValueError, where="train_epoch")
def skip_corrupt_batch(crash):
    if crash.kind != "loop-header" or "corrupt sample" not in str(crash.exception):
        return None
    return daifu.CONTINUE
