"""The developer's edit of evaluate() -- the caller of the frame that
raised -- then reload: evaluate() re-executes the failing call in its new
code, with the same batch and running totals."""

import daifu

BUG = "            output = predict(model, x.flatten(1))  # BUG: the CNN wants (N, 1, 28, 28)\n"
FIX = "            output = predict(model, x)\n"


@daifu.on(RuntimeError, where="predict")
def edit_the_caller_and_reload(crash):
    if "conv2d" not in str(crash.exception):
        return None
    with open(crash.filename) as fh:
        source = fh.read()
    if BUG not in source:
        return None
    with open(crash.filename, "w") as fh:
        fh.write(source.replace(BUG, FIX))
    return daifu.RELOAD
