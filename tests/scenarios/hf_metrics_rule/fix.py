"""Complete the label map, then retry the failing statement: the evaluation
goes on with the same predictions."""

import daifu


@daifu.on(KeyError, where="compute_metrics")
def complete_labels(crash):
    crash.globals["LABELS"][2] = "neutral"
    return daifu.RETRY
