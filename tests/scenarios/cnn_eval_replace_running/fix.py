"""The helper that raised is given the code of a corrected version while it
runs; the retry re-executes its call in evaluate() (a running call keeps its
old code), and later epochs call the corrected helper too."""

import daifu


def predict(model, images):
    """The corrected predict(): the CNN takes the images as they are."""
    return model(images)


@daifu.on(RuntimeError, where="predict")
def fix_predict(crash):
    if "conv2d" not in str(crash.exception):
        return None
    daifu.replace(crash.globals["predict"], predict)
    return daifu.RETRY
