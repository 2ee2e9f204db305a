"""The developer's edit, applied to the running job's source, then reload:
the batch's loss computation and check are wrapped in ``try``/``except
FloatingPointError: continue`` (the corrected program), and the running
training loop continues inside the new ``try``, at the failing ``raise``."""

import daifu

BUG = """\
        loss = F.cross_entropy(model(x), y)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite loss {loss.item()} at epoch {epoch} step {step}")
"""
FIX = """\
        try:
            loss = F.cross_entropy(model(x), y)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite loss {loss.item()} at epoch {epoch} "
                                         f"step {step}")
        except FloatingPointError as err:
            print(f"skipped a batch: {err}")
            continue
"""


@daifu.on(FloatingPointError, where="train_epoch")
def wrap_in_try_and_reload(crash):
    with open(crash.filename) as fh:
        source = fh.read()
    if BUG not in source:
        return None  # already edited: the new code's own handler takes it
    with open(crash.filename, "w") as fh:
        fh.write(source.replace(BUG, FIX))
    return daifu.RELOAD
