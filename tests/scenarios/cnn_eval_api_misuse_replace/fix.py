"""The helper is fixed by giving it the code of a corrected version; the
evaluation loop retries the failing call and goes on (later epochs call the
corrected helper too)."""

import daifu


def predict(model, images):
    """The corrected predict(): the CNN takes the images as they are."""
    return model(images)


@daifu.on(RuntimeError, where="evaluate")
def fix_predict(crash):
    if "conv2d" not in str(crash.exception):
        return None
    daifu.replace(crash.globals["predict"], predict)
    return daifu.RETRY
