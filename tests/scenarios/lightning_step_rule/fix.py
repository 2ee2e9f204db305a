"""Extend the loss-weight schedule to the steps the run takes, then retry
the failing statement: the step goes on with the same batch."""

import daifu


@daifu.on(IndexError, where="Classifier.training_step")
def extend_schedule(crash):
    model = crash.vars["self"]
    weights = model.weights
    weights.extend(1.0 - 0.02 * i for i in range(len(weights), 16))
    return daifu.RETRY
