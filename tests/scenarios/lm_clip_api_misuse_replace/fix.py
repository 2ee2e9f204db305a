"""Give the helper the corrected code and clip again: the loop itself is fine."""

import torch

import daifu


def clip(model):
    """The corrected clip(): clip_grad_norm_ takes the parameters."""
    return torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)  # noqa: F821 (script global)


@daifu.on(TypeError, where="train")
def fix_clip(crash):
    if "not iterable" not in str(crash.exception) or "clip(" not in crash.statement:
        return None
    daifu.replace(crash.globals["clip"], clip)
    return daifu.RETRY
