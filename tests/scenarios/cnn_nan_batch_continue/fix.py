"""A batch with a non-finite loss is skipped: the training loop goes on with
its next batch, as if the guard had said ``continue``."""

import daifu


@daifu.on(FloatingPointError, where="train_epoch")
def skip_nan_batch(crash):
    return daifu.CONTINUE
